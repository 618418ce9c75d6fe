//! The read order of a replicated route reading `nearest`: its children in the order a read tries them,
//! kept per worker and per snapshot. A read goes to the first child and, on a failure, to
//! the others in order, as a failover route reads (`failover::first_pool`, `failover::run`).
//!
//! The order: children every server of which is down last (their reads would fail fast);
//! before them, children in the proxy's zone first, then the others; within each group,
//! by measured latency (lowest first), then children not measured yet, in config order. A child's zone is its pool's; a child
//! that is a route has the zone every pool beneath it shares, else none.
//!
//! Latency is the mean round trip of the child's servers over the last interval, smoothed
//! across intervals. It is read from the process-wide round-trip histograms every worker
//! already feeds (`memroute_backend_round_trip_seconds`): nothing is written per request
//! for it, and replicated writes, which reach every child, measure the children a read
//! seldom tries. The order is recomputed at most every [`REORDER_INTERVAL`], when a read
//! starts after it has passed: between two reorders a read costs what a failover read
//! costs.
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memroute_backend::ServerHealth;
use memroute_config::{Config, ReadPolicy};
use memroute_routing::{Node, NodeId, RouteTable};
use smallvec::SmallVec;

/// How often at most a route's read order is recomputed. The round-trip histograms it
/// reads are flushed by every worker once a second (`stats::FLUSH_INTERVAL`): reordering
/// more often would see the same totals.
pub(crate) const REORDER_INTERVAL: Duration = Duration::from_secs(1);

/// Weight of the newest interval's mean round trip in a child's latency: a zone that slows
/// down moves back within a few intervals, one slow interval does not reorder alone.
const SMOOTHING: f64 = 0.5;

/// Children of one route, in the order a read tries them (a few: on the stack).
pub(crate) type ChildOrder = SmallVec<[NodeId; 4]>;

/// The read orders of one snapshot's nearest-reading replicated routes (none for most
/// configs: looking a node up is then one comparison).
#[derive(Debug, Default)]
pub(crate) struct NearestRoutes {
    routes: Vec<(NodeId, ReadOrder)>,
}

/// One route's children and their read order.
#[derive(Debug)]
pub(crate) struct ReadOrder {
    /// In config order.
    children: Vec<Child>,
    /// Children in the order a read tries them.
    order: RefCell<ChildOrder>,
    /// `order[0]`, for the fast path, without a borrow.
    first: Cell<NodeId>,
    /// When the order is recomputed next.
    reorder_at: Cell<Instant>,
}

#[derive(Debug)]
struct Child {
    node: NodeId,
    /// In the proxy's zone.
    local: bool,
    /// Every server beneath the child: its health and its process-wide round trips.
    servers: ChildServers,
    /// The round trips' (sum of seconds, count) when last read.
    seen: Cell<(f64, u64)>,
    /// Smoothed mean round trip in seconds; `None` until a round trip was seen.
    latency: Cell<Option<f64>>,
}

/// A child's servers: their health and process-wide round trips.
pub(crate) type ChildServers = Vec<(Arc<ServerHealth>, prometheus::Histogram)>;

/// Every server of a child is down (health fails its requests fast); a child without
/// servers is not.
pub fn all_down(servers: &ChildServers) -> bool {
    !servers.is_empty() && servers.iter().all(|(health, _)| health.is_down())
}

/// What a child's read order position rests on: every server beneath it down, it is in the
/// proxy's zone, its measured latency (seconds; `None` until measured).
pub type Standing = (bool, bool, Option<f64>);

/// The read order rule: `children` (in config order) by their standing; returns their
/// config indexes in the order a read tries them. Down children last; before them the
/// proxy's zone first; within each, measured ones by latency (lowest first), then the
/// unmeasured ones; ties in config order.
pub fn rank(children: &[Standing]) -> SmallVec<[usize; 4]> {
    let mut ranked: SmallVec<[usize; 4]> = (0..children.len()).collect();
    ranked.sort_by(|&a, &b| {
        let key = |(down, local, latency): Standing| (down, !local, latency.is_none());
        key(children[a])
            .cmp(&key(children[b]))
            .then_with(|| {
                let (a, b) = (children[a].2, children[b].2);
                a.unwrap_or(0.0).total_cmp(&b.unwrap_or(0.0))
            })
            .then(a.cmp(&b))
    });
    ranked
}

/// The servers at or beneath route `node`: `health(pool, server)` and `round_trips(pool,
/// address)` give each one's health and process-wide round trips.
pub fn servers_beneath(
    config: &Config,
    routes: &RouteTable,
    node: NodeId,
    health: &impl Fn(usize, usize) -> Option<Arc<ServerHealth>>,
    round_trips: &impl Fn(&str, &str) -> prometheus::Histogram,
) -> ChildServers {
    let mut servers = Vec::new();
    for pool in pools_beneath(routes, node) {
        let name = &routes.pool_names[pool];
        let Some(pool_config) = config.pools.get(name) else {
            continue;
        };
        for (index, server) in pool_config.servers.iter().enumerate() {
            if let Some(health) = health(pool, index) {
                servers.push((health, round_trips(name, &server.address)));
            }
        }
    }
    servers
}

impl Child {
    /// Every server beneath is down (health fails its requests fast).
    fn down(&self) -> bool {
        all_down(&self.servers)
    }

    /// Takes in the round trips since the last look.
    fn measure(&self) {
        let (sum, count) = self
            .servers
            .iter()
            .map(|(_, histogram)| (histogram.get_sample_sum(), histogram.get_sample_count()))
            .fold((0.0, 0), |(s, c), (sum, count)| (s + sum, c + count));
        let (seen_sum, seen_count) = self.seen.replace((sum, count));
        // A histogram removed and made again (a server left and came back) restarts lower.
        if count <= seen_count || sum < seen_sum {
            return;
        }
        let mean = (sum - seen_sum) / (count - seen_count) as f64;
        let latency = match self.latency.get() {
            Some(previous) => previous + SMOOTHING * (mean - previous),
            None => mean,
        };
        self.latency.set(Some(latency));
    }
}

impl NearestRoutes {
    /// The read orders of `routes`' nearest-reading replicated routes. `health(pool,
    /// server)` and `round_trips(pool, address)` give a server's health and process-wide
    /// round trips; `known(route, child)` the latency the previous snapshot measured for a
    /// child of the same names (a reload keeps what was learned). Children not measured go
    /// after the measured ones of their group, in config order.
    pub(crate) fn build(
        config: &Config,
        routes: &RouteTable,
        health: impl Fn(usize, usize) -> Option<Arc<ServerHealth>>,
        round_trips: impl Fn(&str, &str) -> prometheus::Histogram,
        known: impl Fn(&str, &str) -> Option<f64>,
        now: Instant,
    ) -> NearestRoutes {
        let proxy_zone = config.proxy.zone.as_ref().map(|zone| zone.name.as_str());
        let mut nearest = Vec::new();
        for node in 0..routes.node_count() as NodeId {
            let Node::Replicated {
                children,
                reads: ReadPolicy::Nearest,
                ..
            } = routes.node(node)
            else {
                continue;
            };
            let children: Vec<Child> = children
                .iter()
                .map(|&child| {
                    let zone = config.zone_of(routes.node_name(child));
                    let servers = servers_beneath(config, routes, child, &health, &round_trips);
                    let child = Child {
                        node: child,
                        local: zone.is_some() && zone == proxy_zone,
                        servers,
                        seen: Cell::new((0.0, 0)),
                        latency: Cell::new(None),
                    };
                    // Round trips before this snapshot are not this interval's: they are
                    // in the latency carried over, if any.
                    child.measure();
                    let route_name = routes.node_name(node);
                    child
                        .latency
                        .set(known(route_name, routes.node_name(child.node)));
                    child
                })
                .collect();
            let order = ReadOrder {
                first: Cell::new(children.first().map_or(node, |c| c.node)),
                children,
                order: RefCell::new(ChildOrder::new()),
                reorder_at: Cell::new(now + REORDER_INTERVAL),
            };
            order.sort();
            nearest.push((node, order));
        }
        NearestRoutes { routes: nearest }
    }

    /// The latency measured for child `child` of route `route` (by name, in `routes`, the
    /// table these orders were built for), if any.
    pub(crate) fn latency_named(
        &self,
        routes: &RouteTable,
        route: &str,
        child: &str,
    ) -> Option<f64> {
        let (_, order) = self
            .routes
            .iter()
            .find(|(node, _)| routes.node_name(*node) == route)?;
        let child = order
            .children
            .iter()
            .find(|c| routes.node_name(c.node) == child)?;
        child.latency.get()
    }

    /// Route `node`'s read order, if it reads `nearest`.
    #[inline]
    pub(crate) fn of(&self, node: NodeId) -> Option<&ReadOrder> {
        self.routes
            .iter()
            .find(|(at, _)| *at == node)
            .map(|(_, order)| order)
    }
}

impl ReadOrder {
    /// The child a read tries first.
    #[inline]
    pub(crate) fn first(&self) -> NodeId {
        self.first.get()
    }

    /// Every child, in the order a read tries them.
    pub(crate) fn order(&self) -> ChildOrder {
        self.order.borrow().clone()
    }

    /// The children after `tried` (the child a read tried first), in order.
    pub(crate) fn after(&self, tried: NodeId) -> ChildOrder {
        let order = self.order.borrow();
        let mut rest = ChildOrder::new();
        let mut skipped = false;
        for &child in order.iter() {
            if child == tried && !skipped {
                skipped = true;
                continue;
            }
            rest.push(child);
        }
        rest
    }

    /// Whether `child` is in the proxy's zone.
    #[inline]
    pub(crate) fn is_local(&self, child: NodeId) -> bool {
        self.children.iter().any(|c| c.node == child && c.local)
    }

    /// A child's smoothed round trip, once measured.
    #[cfg(test)]
    fn latency_of(&self, child: NodeId) -> Option<Duration> {
        let child = self.children.iter().find(|c| c.node == child)?;
        child.latency.get().map(Duration::from_secs_f64)
    }

    /// Recomputes the order when [`REORDER_INTERVAL`] has passed since the last time.
    #[inline]
    pub(crate) fn refresh(&self, now: Instant) {
        if now < self.reorder_at.get() {
            return;
        }
        self.reorder_at.set(now + REORDER_INTERVAL);
        for child in &self.children {
            child.measure();
        }
        self.sort();
    }

    fn sort(&self) {
        let standings: SmallVec<[Standing; 4]> = self
            .children
            .iter()
            .map(|c| (c.down(), c.local, c.latency.get()))
            .collect();
        let order: ChildOrder = rank(&standings)
            .iter()
            .map(|&i| self.children[i].node)
            .collect();
        if let Some(&first) = order.first() {
            self.first.set(first);
        }
        *self.order.borrow_mut() = order;
    }

    /// Sets child `node`'s latency (for tests of the order).
    #[cfg(test)]
    fn set_latency(&self, node: NodeId, seconds: f64) {
        if let Some(child) = self.children.iter().find(|c| c.node == node) {
            child.latency.set(Some(seconds));
        }
    }
}

/// The pools at or beneath `node` (each once).
pub(crate) fn pools_beneath(routes: &RouteTable, node: NodeId) -> Vec<usize> {
    let mut pools = Vec::new();
    let mut stack = vec![node];
    let mut seen = Vec::new();
    while let Some(at) = stack.pop() {
        if seen.contains(&at) {
            continue;
        }
        seen.push(at);
        match routes.node(at) {
            Node::Pool(pool) => {
                if !pools.contains(pool) {
                    pools.push(*pool);
                }
            }
            other => stack.extend(other.children()),
        }
    }
    pools
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(toml: &str, zone: Option<&str>) -> (RouteTable, NearestRoutes) {
        let mut config = memroute_config::parse(toml).expect("config");
        config.resolve_zone(zone.map(str::to_string));
        let routes = RouteTable::build(&config.routing_spec()).expect("routes");
        let registry = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("round_trip", "test"),
            &["pool", "server"],
        )
        .expect("histogram");
        let nearest = NearestRoutes::build(
            &config,
            &routes,
            |_, _| None,
            |pool, server| registry.with_label_values(&[pool, server]),
            |_, _| None,
            Instant::now(),
        );
        (routes, nearest)
    }

    const THREE_ZONES: &str = r#"
        [proxy]
        route = "r"
        [pools.a]
        servers = ["127.0.0.1:1"]
        zone = "a"
        [pools.b]
        servers = ["127.0.0.1:2"]
        zone = "b"
        [pools.c]
        servers = ["127.0.0.1:3"]
        zone = "c"
        [routes.r]
        type = "replicated"
        children = ["a", "b", "c"]
        reads = "nearest"
    "#;

    fn names(routes: &RouteTable, order: &[NodeId]) -> Vec<String> {
        order
            .iter()
            .map(|&node| routes.node_name(node).to_string())
            .collect()
    }

    fn route(routes: &RouteTable, name: &str) -> NodeId {
        (0..routes.node_count() as NodeId)
            .find(|&node| routes.node_name(node) == name)
            .expect("route")
    }

    #[test]
    fn the_local_child_first_then_config_order_until_measured() {
        let (routes, nearest) = build(THREE_ZONES, Some("b"));
        let order = nearest.of(route(&routes, "r")).expect("nearest");
        assert_eq!(names(&routes, &order.order()), ["b", "a", "c"]);
        assert_eq!(routes.node_name(order.first()), "b");
        assert!(order.is_local(order.first()));
    }

    #[test]
    fn the_others_by_latency_after_the_local_child() {
        let (routes, nearest) = build(THREE_ZONES, Some("b"));
        let order = nearest.of(route(&routes, "r")).expect("nearest");
        let [a, b, c] = ["a", "b", "c"].map(|name| route(&routes, name));
        order.set_latency(a, 0.004);
        order.set_latency(b, 0.009);
        order.set_latency(c, 0.001);
        order.sort();
        assert_eq!(names(&routes, &order.order()), ["b", "c", "a"]);
        assert_eq!(names(&routes, &order.after(b)), ["c", "a"]);
    }

    #[test]
    fn without_a_zone_children_go_by_latency() {
        let (routes, nearest) = build(THREE_ZONES, None);
        let order = nearest.of(route(&routes, "r")).expect("nearest");
        let [a, b, c] = ["a", "b", "c"].map(|name| route(&routes, name));
        assert!(!order.is_local(a) && !order.is_local(b) && !order.is_local(c));
        order.set_latency(a, 0.003);
        order.set_latency(b, 0.002);
        order.sort();
        // c is not measured yet: after the measured children.
        assert_eq!(names(&routes, &order.order()), ["b", "a", "c"]);
    }

    #[test]
    fn round_trips_are_learned_from_the_histograms_at_most_every_interval() {
        let toml = THREE_ZONES
            .replace("zone = \"a\"", "")
            .replace("zone = \"c\"", "");
        let mut config = memroute_config::parse(&toml).expect("config");
        config.resolve_zone(Some("z".to_string()));
        let routes = RouteTable::build(&config.routing_spec()).expect("routes");
        let histograms = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("round_trip", "test"),
            &["pool", "server"],
        )
        .expect("histogram");
        let start = Instant::now();
        let nearest = NearestRoutes::build(
            &config,
            &routes,
            |_, _| None,
            |pool, server| histograms.with_label_values(&[pool, server]),
            |_, _| None,
            start,
        );
        // No health given: no servers to measure. Build again with health for each.
        assert!(nearest.of(route(&routes, "r")).is_some());
        let health = |pool: usize, _index: usize| {
            let name = &routes.pool_names[pool];
            let pool_config = config.pools.get(name)?;
            Some(ServerHealth::new(
                Arc::from(name.as_str()),
                Arc::from("server"),
                memroute_backend::HealthSettings::of_pool(pool_config),
                Default::default(),
            ))
        };
        let nearest = NearestRoutes::build(
            &config,
            &routes,
            health,
            |pool, server| histograms.with_label_values(&[pool, server]),
            |_, _| None,
            start,
        );
        let order = nearest.of(route(&routes, "r")).expect("nearest");
        let [a, b, c] = ["a", "b", "c"].map(|name| route(&routes, name));
        let observe = |pool: &str, port: u16, seconds: f64, times: usize| {
            let histogram = histograms.with_label_values(&[pool, &format!("127.0.0.1:{port}")]);
            for _ in 0..times {
                histogram.observe(seconds);
            }
        };
        observe("a", 1, 0.010, 5);
        observe("b", 2, 0.020, 5);
        observe("c", 3, 0.001, 5);
        // Not yet due: the order stays.
        order.refresh(start);
        assert_eq!(names(&routes, &order.order()), ["a", "b", "c"]);
        order.refresh(start + REORDER_INTERVAL);
        assert_eq!(names(&routes, &order.order()), ["c", "a", "b"]);
        assert_eq!(order.latency_of(c), Some(Duration::from_secs_f64(0.001)));
        // A slower interval moves a child half way (`SMOOTHING`).
        observe("c", 3, 0.041, 5);
        order.refresh(start + 2 * REORDER_INTERVAL);
        assert_eq!(names(&routes, &order.order()), ["a", "b", "c"]);
        // A child whose servers are all down goes last, whatever its latency.
        let child_a = order.children.iter().find(|child| child.node == a);
        let (health, _) = &child_a.expect("child a").servers[0];
        health.mark_down("refused");
        order.refresh(start + 3 * REORDER_INTERVAL);
        assert_eq!(names(&routes, &order.order()), ["b", "c", "a"]);
        let _ = b;
    }

    #[test]
    fn a_new_snapshot_keeps_the_latencies_the_old_one_measured() {
        let (routes, old) = build(THREE_ZONES, None);
        let r = route(&routes, "r");
        let order = old.of(r).expect("nearest");
        let [a, b, c] = ["a", "b", "c"].map(|name| route(&routes, name));
        order.set_latency(a, 0.003);
        order.set_latency(b, 0.001);
        order.set_latency(c, 0.002);
        let mut config = memroute_config::parse(THREE_ZONES).expect("config");
        config.resolve_zone(None);
        let histograms = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("round_trip", "test"),
            &["pool", "server"],
        )
        .expect("histogram");
        let new = NearestRoutes::build(
            &config,
            &routes,
            |_, _| None,
            |pool, server| histograms.with_label_values(&[pool, server]),
            |route, child| old.latency_named(&routes, route, child),
            Instant::now(),
        );
        let order = new.of(r).expect("nearest");
        assert_eq!(names(&routes, &order.order()), ["b", "c", "a"]);
    }

    #[test]
    fn a_route_child_has_the_zone_its_pools_share() {
        let toml = r#"
            [proxy]
            route = "r"
            [pools.a1]
            servers = ["127.0.0.1:1"]
            zone = "a"
            [pools.a2]
            servers = ["127.0.0.1:2"]
            zone = "a"
            [pools.b]
            servers = ["127.0.0.1:3"]
            zone = "b"
            [pools.mixed]
            servers = ["127.0.0.1:4"]
            [routes.in_a]
            type = "failover"
            children = ["a1", "a2"]
            [routes.anywhere]
            type = "failover"
            children = ["b", "mixed"]
            [routes.r]
            type = "replicated"
            children = ["anywhere", "in_a"]
            reads = "nearest"
        "#;
        let (routes, nearest) = build(toml, Some("a"));
        let order = nearest.of(route(&routes, "r")).expect("nearest");
        assert!(order.is_local(route(&routes, "in_a")));
        assert!(!order.is_local(route(&routes, "anywhere")));
        assert_eq!(names(&routes, &order.order()), ["in_a", "anywhere"]);
    }
}
