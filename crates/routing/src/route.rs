//! The route tree: from (operation, key) to a pool, or to a route node the proxy executes.
//!
//! Routes refer to pools or to other routes by name. [`RouteTable::build`] resolves every
//! name once into an arena of [`Node`]s (a route used from two places is one node, so the
//! tree is really a DAG), with a node per pool as well. Lookups are walks over node ids:
//! no name lookups and no allocation.
//!
//! ```text
//!   proxy.route = "by_prefix"
//!   by_prefix: Prefix { "feed:" -> feed_shadowed, default -> by_op }
//!   by_op:     Operation { delete -> Pool(main), flush_all -> Pool(main), * -> Pool(main_ro) }
//!   feed_shadowed: Shadow { primary -> Pool(feed), shadow -> Pool(feed_new), keys in [0, 0.1) }
//!
//!   select(root, op, key) follows Prefix and Operation nodes and stops at the first other
//!   node: a Pool (placement picks the server) or a policy node the proxy executes,
//!   calling select again from each child it decides to use.
//! ```
//!
//! Every child is resolved before its parent is pushed, so a child's id is always smaller
//! than its parent's: walks cannot loop, whatever a future change to `select` does.
//! Unknown names, cycles and pools without servers are build errors; a config that fails
//! here is never swapped in.
use std::collections::HashMap;

use crate::spec::{
    FailoverOn, Operation, ReadPolicy, RouteSpec, RoutingSpec, ShadowSelect, WritePolicy,
};

use crate::routing_prefix::{RoutingPrefixes, Target};
use crate::{FailoverErrors, Placement, RoutingError};

/// Index of a [`Node`] in its [`RouteTable`]. Pool `i`'s node is `i`.
pub type NodeId = u32;

/// One resolved route. Targets are node ids of the same table.
#[derive(Debug, Clone)]
pub enum Node {
    /// A pool, by pool id (index into `RouteTable::pool_names` and `placements`).
    Pool(usize),
    /// Prefixes sorted longest first, so the first match is the longest match.
    Prefix {
        prefixes: Vec<(Vec<u8>, NodeId)>,
        default: NodeId,
    },
    /// Indexed by [`Operation::index`]; operations the config did not name hold the default.
    Operation {
        table: [NodeId; Operation::COUNT],
    },
    /// The client is answered by `primary`; keys in `range` are also sent to `shadow`.
    Shadow {
        primary: NodeId,
        shadow: NodeId,
        range: KeyRange,
        max_in_flight: usize,
        /// Index into `RouteTable::shadow_names` (one per shadow route, for metrics and
        /// per-route in-flight counters).
        shadow_index: usize,
    },
    Replicated {
        children: Vec<NodeId>,
        writes: WritePolicy,
        reads: ReadPolicy,
    },
    Failover {
        children: Vec<NodeId>,
        on: FailoverOn,
        errors: FailoverErrors,
        exptime_cap: Option<u32>,
    },
    WarmUp {
        cold: NodeId,
        warm: NodeId,
        ttl: u32,
    },
    Random {
        children: Vec<NodeId>,
    },
    Null,
    Error {
        message: String,
    },
}

impl Node {
    /// The node's direct targets, in config order (allocates: for building and tooling,
    /// not for the request path).
    pub fn children(&self) -> Vec<NodeId> {
        match self {
            Node::Pool(_) | Node::Null | Node::Error { .. } => Vec::new(),
            Node::Prefix { prefixes, default } => prefixes
                .iter()
                .map(|&(_, target)| target)
                .chain(std::iter::once(*default))
                .collect(),
            Node::Operation { table } => table.to_vec(),
            Node::Shadow {
                primary, shadow, ..
            } => vec![*primary, *shadow],
            Node::Replicated { children, .. }
            | Node::Failover { children, .. }
            | Node::Random { children } => children.clone(),
            Node::WarmUp { cold, warm, .. } => vec![*cold, *warm],
        }
    }
}

/// A sub-range of the 64-bit space of `xxh3_64(key)`, chosen by a shadow route.
///
/// `start` is inclusive and `end` exclusive, except that `end == u64::MAX` stands for the
/// end of the space and includes `u64::MAX` itself (so `[0, 1]` selects every key, and
/// `[0, 0]` none). A config fraction `f` maps to `f * 2^64`, so shares are exact to
/// about 2^-53.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRange {
    pub start: u64,
    pub end: u64,
}

impl KeyRange {
    /// Every key.
    pub const ALL: KeyRange = KeyRange {
        start: 0,
        end: u64::MAX,
    };

    /// `Fraction(f)` is `[0, f)`, `KeyRange(a, b)` is `[a, b)`; 1.0 (or more) is the top
    /// of the space, inclusive. Out-of-range and NaN bounds are clamped (validation rejects
    /// them; this only keeps the arithmetic total).
    pub fn from_select(select: ShadowSelect) -> KeyRange {
        match select {
            ShadowSelect::Fraction(f) => KeyRange {
                start: 0,
                end: point_of(f),
            },
            ShadowSelect::KeyRange(a, b) => KeyRange {
                start: point_of(a),
                end: point_of(b),
            },
        }
    }

    /// Whether a key hash falls in the range.
    #[inline]
    pub fn contains(&self, hash: u64) -> bool {
        hash >= self.start && (hash < self.end || self.end == u64::MAX)
    }

    /// Whether `key` (its xxh3_64, independent of any pool's hash) falls in the range.
    #[inline]
    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.contains(xxhash_rust::xxh3::xxh3_64(key))
    }
}

/// `f` in [0, 1] as a point of the 64-bit space; 1.0 is `u64::MAX` (the inclusive top).
fn point_of(f: f64) -> u64 {
    if f.is_nan() || f <= 0.0 {
        0
    } else if f >= 1.0 {
        u64::MAX
    } else {
        // Exact: f < 1 has at most 53 significant bits, so f * 2^64 < 2^64 - 2^10.
        (f * 18_446_744_073_709_551_616.0) as u64
    }
}

/// Built once per config (re)load and shared read-only by every worker.
#[derive(Debug, Clone)]
pub struct RouteTable {
    /// Pool names, index = pool id. Same order as `Config::pools` (sorted by name).
    pub pool_names: Vec<String>,
    pub placements: Vec<Placement>,
    /// The route name of each shadow node, by its `shadow_index`.
    pub shadow_names: Vec<String>,
    /// The arena; pools first (node `i` is pool `i`), then routes, children before parents.
    nodes: Vec<Node>,
    /// The pool or route name of each node.
    node_names: Vec<String>,
    /// The node of `proxy.route`, the default root.
    root: NodeId,
    /// The root node of each listener, in listener order.
    listener_roots: Vec<NodeId>,
    /// mcrouter's routing prefixes (empty when the config declares none).
    routing_prefixes: RoutingPrefixes,
    /// Each listener's default routing prefix, in listener order (wildcards send to its
    /// route first).
    listener_prefixes: Vec<Option<Box<[u8]>>>,
}

impl RouteTable {
    /// Resolves `spec.root`, each listener's root and everything they refer to, and builds every pool's
    /// placement. A pool without servers is an error unless it is found by DNS (it may
    /// start empty; its placement then has no servers).
    pub fn build(config: &RoutingSpec) -> Result<RouteTable, RoutingError> {
        let mut pool_names = Vec::with_capacity(config.pools.len());
        let mut placements = Vec::with_capacity(config.pools.len());
        let mut nodes = Vec::with_capacity(config.pools.len() + config.routes.len());
        let mut node_names = Vec::with_capacity(nodes.capacity());
        for (id, (name, pool)) in config.pools.iter().enumerate() {
            if pool.servers.is_empty() && !pool.discovered {
                return Err(RoutingError::EmptyPool(name.clone()));
            }
            pool_names.push(name.clone());
            placements.push(Placement::new(pool));
            nodes.push(Node::Pool(id));
            node_names.push(name.clone());
        }
        let mut resolver = Resolver {
            config,
            pool_names: &pool_names,
            nodes,
            node_names,
            shadow_names: Vec::new(),
            resolved: HashMap::new(),
            path: Vec::new(),
        };
        let root = resolver.resolve(&config.root)?;
        let listener_roots = config
            .listener_roots
            .iter()
            .map(|name| resolver.resolve(name))
            .collect::<Result<Vec<_>, _>>()?;
        let mut prefixes = Vec::with_capacity(config.routing_prefixes.len());
        for (prefix, target) in &config.routing_prefixes {
            let node = resolver.resolve(target)?;
            prefixes.push((prefix.as_bytes().to_vec(), node));
        }
        let Resolver {
            nodes,
            node_names,
            shadow_names,
            ..
        } = resolver;
        let keeps = |pool: usize| config.keep_routing_prefix.contains(&pool_names[pool]);
        let routing_prefixes = RoutingPrefixes::new(
            prefixes
                .into_iter()
                .map(|(prefix, node)| {
                    let strip = !pools_reached(&nodes, node).into_iter().all(keeps);
                    (prefix, Target { node, strip })
                })
                .collect(),
        );
        let listener_prefixes = config
            .listener_prefixes
            .iter()
            .map(|prefix| prefix.as_ref().map(|p| p.as_bytes().into()))
            .collect();
        Ok(RouteTable {
            pool_names,
            placements,
            shadow_names,
            nodes,
            node_names,
            root,
            listener_roots,
            routing_prefixes,
            listener_prefixes,
        })
    }

    /// The config's routing prefixes (`RoutingPrefixes::is_empty` when it has none).
    #[inline]
    pub fn routing_prefixes(&self) -> &RoutingPrefixes {
        &self.routing_prefixes
    }

    /// The default routing prefix of the `listener`-th listener, if it has one.
    pub fn default_prefix(&self, listener: usize) -> Option<&[u8]> {
        self.listener_prefixes.get(listener)?.as_deref()
    }

    /// The node of `proxy.route`: the default root.
    #[inline]
    pub fn root(&self) -> NodeId {
        self.root
    }

    /// The root node of the `listener`-th listener (the default root for a listener the
    /// spec did not list). One indexed load: it runs for every request.
    #[inline]
    pub fn root_of(&self, listener: usize) -> NodeId {
        match self.listener_roots.get(listener) {
            Some(&root) => root,
            None => self.root,
        }
    }

    /// The node `id` (an id handed out by this table; others panic).
    #[inline]
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    /// The pool or route name the node was built from.
    pub fn node_name(&self, id: NodeId) -> &str {
        &self.node_names[id as usize]
    }

    /// How many nodes the table holds (ids are `0..node_count()`).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Follows Prefix and Operation nodes from `from` to the first node of another kind.
    #[inline]
    pub fn select(&self, from: NodeId, operation: Operation, key: &[u8]) -> NodeId {
        let mut id = from;
        loop {
            match &self.nodes[id as usize] {
                Node::Prefix { prefixes, default } => {
                    id = prefixes
                        .iter()
                        .find(|(prefix, _)| key.starts_with(prefix))
                        .map_or(*default, |&(_, target)| target);
                }
                Node::Operation { table } => id = table[operation.index()],
                _ => return id,
            }
        }
    }

    /// The id of the pool called `name`, if there is one.
    pub fn pool_index(&self, name: &str) -> Option<usize> {
        self.pool_names
            .binary_search_by(|n| n.as_str().cmp(name))
            .ok()
    }
}

/// Every pool reachable from `node` (for whether its routing prefix is kept).
fn pools_reached(nodes: &[Node], node: NodeId) -> Vec<usize> {
    let mut pools = Vec::new();
    let mut stack = vec![node];
    let mut seen = vec![false; nodes.len()];
    while let Some(id) = stack.pop() {
        if std::mem::replace(&mut seen[id as usize], true) {
            continue;
        }
        match &nodes[id as usize] {
            Node::Pool(pool) => pools.push(*pool),
            other => stack.extend(other.children()),
        }
    }
    pools
}

/// Resolves names into nodes, remembering the chain of routes being resolved so a route
/// that (directly or not) refers to itself is reported instead of recursing forever, and
/// the routes already resolved so a route used twice becomes one node.
struct Resolver<'a> {
    config: &'a RoutingSpec,
    pool_names: &'a [String],
    nodes: Vec<Node>,
    node_names: Vec<String>,
    shadow_names: Vec<String>,
    resolved: HashMap<&'a str, NodeId>,
    path: Vec<&'a str>,
}

impl<'a> Resolver<'a> {
    /// A name is a pool if a pool has it, else a route; config validation keeps the two
    /// namespaces apart.
    fn resolve(&mut self, name: &'a str) -> Result<NodeId, RoutingError> {
        if let Ok(pool) = self.pool_names.binary_search_by(|n| n.as_str().cmp(name)) {
            // Pool nodes were pushed first, in pool order.
            return Ok(pool as NodeId);
        }
        if let Some(&id) = self.resolved.get(name) {
            return Ok(id);
        }
        let Some(route) = self.config.routes.get(name) else {
            return Err(RoutingError::UnknownTarget(name.to_string()));
        };
        if self.path.contains(&name) {
            return Err(RoutingError::Cycle(name.to_string()));
        }
        self.path.push(name);
        let node = self.route_node(name, route)?;
        self.path.pop();
        let id = self.nodes.len() as NodeId;
        self.nodes.push(node);
        self.node_names.push(name.to_string());
        self.resolved.insert(name, id);
        Ok(id)
    }

    fn resolve_all(&mut self, names: &'a [String]) -> Result<Vec<NodeId>, RoutingError> {
        names.iter().map(|n| self.resolve(n)).collect()
    }

    /// Children that must not be empty: a route with none could answer nothing.
    fn resolve_children(
        &mut self,
        route: &str,
        names: &'a [String],
    ) -> Result<Vec<NodeId>, RoutingError> {
        if names.is_empty() {
            return Err(RoutingError::NoChildren(route.to_string()));
        }
        self.resolve_all(names)
    }

    fn route_node(&mut self, name: &'a str, route: &'a RouteSpec) -> Result<Node, RoutingError> {
        Ok(match route {
            RouteSpec::Prefix { prefixes, default } => {
                let mut resolved = Vec::with_capacity(prefixes.len());
                for (prefix, target) in prefixes {
                    resolved.push((prefix.as_bytes().to_vec(), self.resolve(target)?));
                }
                // Longest first (stable, so equal lengths keep config order; equal lengths
                // cannot both match a key unless they are the same prefix).
                resolved.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
                Node::Prefix {
                    prefixes: resolved,
                    default: self.resolve(default)?,
                }
            }
            RouteSpec::Operation {
                operations,
                default,
            } => {
                let mut table = [self.resolve(default)?; Operation::COUNT];
                for (operation, target) in operations {
                    table[operation.index()] = self.resolve(target)?;
                }
                Node::Operation { table }
            }
            RouteSpec::Shadow {
                primary,
                shadow,
                select,
                max_in_flight,
            } => {
                let primary = self.resolve(primary)?;
                let shadow = self.resolve(shadow)?;
                let shadow_index = self.shadow_names.len();
                self.shadow_names.push(name.to_string());
                Node::Shadow {
                    primary,
                    shadow,
                    range: KeyRange::from_select(*select),
                    max_in_flight: *max_in_flight,
                    shadow_index,
                }
            }
            RouteSpec::Replicated {
                children,
                writes,
                reads,
            } => Node::Replicated {
                children: self.resolve_children(name, children)?,
                writes: *writes,
                reads: *reads,
            },
            RouteSpec::Failover {
                children,
                on,
                errors,
                exptime_cap,
            } => Node::Failover {
                children: self.resolve_children(name, children)?,
                on: *on,
                errors: *errors,
                exptime_cap: *exptime_cap,
            },
            RouteSpec::WarmUp { cold, warm, ttl } => Node::WarmUp {
                cold: self.resolve(cold)?,
                warm: self.resolve(warm)?,
                ttl: *ttl,
            },
            RouteSpec::Random { children } => Node::Random {
                children: self.resolve_children(name, children)?,
            },
            RouteSpec::Null => Node::Null,
            RouteSpec::Error { message } => Node::Error {
                message: message.clone(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool a request reaches from the default root through Prefix/Operation nodes,
    /// `None` when the walk stops at a policy node.
    fn pool_reached(table: &RouteTable, operation: Operation, key: &[u8]) -> Option<usize> {
        match table.node(table.select(table.root(), operation, key)) {
            Node::Pool(pool) => Some(*pool),
            _ => None,
        }
    }
    use crate::spec::{PoolSpec, ServerSpec};
    use std::collections::BTreeMap;

    fn pool(port: u16) -> PoolSpec {
        PoolSpec::new(vec![ServerSpec {
            address: format!("127.0.0.1:{port}"),
            weight: 1,
            name: None,
        }])
    }

    fn names(targets: &[&str]) -> Vec<String> {
        targets.iter().map(|t| t.to_string()).collect()
    }

    fn prefix(prefixes: &[(&str, &str)], default: &str) -> RouteSpec {
        RouteSpec::Prefix {
            prefixes: prefixes
                .iter()
                .map(|(p, t)| (p.to_string(), t.to_string()))
                .collect(),
            default: default.to_string(),
        }
    }

    fn by_operation(operations: &[(Operation, &str)], default: &str) -> RouteSpec {
        RouteSpec::Operation {
            operations: operations
                .iter()
                .map(|(o, t)| (*o, t.to_string()))
                .collect(),
            default: default.to_string(),
        }
    }

    fn shadow(primary: &str, shadow: &str, fraction: f64) -> RouteSpec {
        RouteSpec::Shadow {
            primary: primary.to_string(),
            shadow: shadow.to_string(),
            select: ShadowSelect::Fraction(fraction),
            max_in_flight: 1000,
        }
    }

    fn replicated(children: &[&str]) -> RouteSpec {
        RouteSpec::Replicated {
            children: names(children),
            writes: WritePolicy::AllMajority,
            reads: ReadPolicy::Failover,
        }
    }

    /// Pools `feed`, `main`, `sessions` (ids 0, 1, 2) and the given routes.
    fn config(root: &str, routes: Vec<(&str, RouteSpec)>) -> RoutingSpec {
        let pools: BTreeMap<String, PoolSpec> = [("main", 1), ("sessions", 2), ("feed", 3)]
            .iter()
            .map(|(n, p)| (n.to_string(), pool(*p)))
            .collect();
        RoutingSpec {
            root: root.to_string(),
            listener_roots: Vec::new(),
            routing_prefixes: Vec::new(),
            keep_routing_prefix: Vec::new(),
            listener_prefixes: Vec::new(),
            pools,
            routes: routes
                .into_iter()
                .map(|(n, r)| (n.to_string(), r))
                .collect(),
        }
    }

    fn build(root: &str, routes: Vec<(&str, RouteSpec)>) -> RouteTable {
        RouteTable::build(&config(root, routes)).expect("valid config")
    }

    /// The node id of a pool (pool `i` is node `i`).
    fn pool_node(table: &RouteTable, name: &str) -> NodeId {
        table.pool_index(name).expect("pool") as NodeId
    }

    #[test]
    fn pool_ids_follow_sorted_pool_names() {
        let table = build("main", vec![]);
        assert_eq!(table.pool_names, ["feed", "main", "sessions"]);
        assert_eq!(table.pool_index("main"), Some(1));
        assert_eq!(table.pool_index("nope"), None);
        assert_eq!(table.root(), 1);
        assert!(matches!(table.node(table.root()), Node::Pool(1)));
        assert_eq!(table.node_name(table.root()), "main");
        assert_eq!(pool_reached(&table, Operation::Set, b"anything"), Some(1));
    }

    #[test]
    fn longest_prefix_wins_and_default_catches_the_rest() {
        let table = build(
            "root",
            vec![(
                "root",
                prefix(
                    &[("s", "feed"), ("session:", "sessions"), ("sess", "main")],
                    "main",
                ),
            )],
        );
        let id = |n: &str| table.pool_index(n);
        let get = |key: &[u8]| pool_reached(&table, Operation::Get, key);
        assert_eq!(get(b"session:1"), id("sessions"));
        assert_eq!(get(b"sess1"), id("main"));
        assert_eq!(get(b"s1"), id("feed"));
        assert_eq!(get(b"other"), id("main"));
        assert_eq!(table.node_name(table.root()), "root");
        let Node::Prefix { prefixes, .. } = table.node(table.root()) else {
            panic!("not a prefix node");
        };
        let lengths: Vec<usize> = prefixes.iter().map(|(p, _)| p.len()).collect();
        assert_eq!(lengths, [8, 4, 1]);
    }

    #[test]
    fn operation_routes_use_the_default_for_unnamed_operations() {
        let table = build(
            "ops",
            vec![(
                "ops",
                by_operation(
                    &[
                        (Operation::Delete, "sessions"),
                        (Operation::FlushAll, "feed"),
                    ],
                    "main",
                ),
            )],
        );
        let Node::Operation { table: ops } = table.node(table.root()) else {
            panic!("not an operation node");
        };
        for operation in Operation::ALL {
            let expected = match operation {
                Operation::Delete => pool_node(&table, "sessions"),
                Operation::FlushAll => pool_node(&table, "feed"),
                _ => pool_node(&table, "main"),
            };
            assert_eq!(ops[operation.index()], expected, "{operation:?}");
            assert_eq!(
                pool_reached(&table, operation, b"k"),
                Some(expected as usize),
                "{operation:?}"
            );
        }
    }

    #[test]
    fn select_walks_nested_prefix_and_operation_routes() {
        let table = build(
            "root",
            vec![
                ("root", prefix(&[("feed:", "feeds")], "inner")),
                ("feeds", prefix(&[], "feed")),
                ("inner", prefix(&[("session:", "session_ops")], "main")),
                (
                    "session_ops",
                    by_operation(&[(Operation::Get, "sessions")], "by_key"),
                ),
                ("by_key", prefix(&[("session:x", "feed")], "main")),
            ],
        );
        let id = |n: &str| table.pool_index(n);
        let root = table.root();
        let pool_of = |node: NodeId| match table.node(node) {
            Node::Pool(p) => Some(*p),
            _ => None,
        };
        assert_eq!(
            pool_of(table.select(root, Operation::Get, b"feed:9")),
            id("feed")
        );
        assert_eq!(
            pool_of(table.select(root, Operation::Get, b"x")),
            id("main")
        );
        assert_eq!(
            pool_of(table.select(root, Operation::Get, b"session:x1")),
            id("sessions")
        );
        // A set of the same key falls through the operation route to `by_key`.
        assert_eq!(
            pool_of(table.select(root, Operation::Set, b"session:x1")),
            id("feed")
        );
        assert_eq!(
            pool_of(table.select(root, Operation::Set, b"session:y")),
            id("main")
        );
        // select from an inner node works the same, and a pool node selects itself.
        let main = pool_node(&table, "main");
        assert_eq!(table.select(main, Operation::Get, b"feed:1"), main);
    }

    #[test]
    fn shadow_nodes_are_built_and_stop_the_fast_path() {
        let table = build(
            "root",
            vec![
                ("root", prefix(&[("feed:", "feed_shadowed")], "main")),
                ("feed_shadowed", shadow("feed", "sessions", 0.25)),
            ],
        );
        assert_eq!(pool_reached(&table, Operation::Get, b"feed:1"), None);
        assert_eq!(
            pool_reached(&table, Operation::Get, b"other"),
            table.pool_index("main")
        );
        let node = table.select(table.root(), Operation::Get, b"feed:1");
        assert_eq!(table.node_name(node), "feed_shadowed");
        let Node::Shadow {
            primary,
            shadow,
            range,
            max_in_flight,
            shadow_index,
        } = table.node(node)
        else {
            panic!("not a shadow node");
        };
        assert_eq!(*primary, pool_node(&table, "feed"));
        assert_eq!(*shadow, pool_node(&table, "sessions"));
        assert_eq!(*range, KeyRange::from_select(ShadowSelect::Fraction(0.25)));
        assert_eq!(range.end, 1 << 62);
        assert_eq!(*max_in_flight, 1000);
        assert_eq!(table.shadow_names[*shadow_index], "feed_shadowed");
    }

    #[test]
    fn every_policy_node_is_built_from_its_config() {
        let table = build(
            "root",
            vec![
                (
                    "root",
                    prefix(
                        &[
                            ("r:", "rep"),
                            ("f:", "fail"),
                            ("w:", "warm"),
                            ("x:", "rand"),
                            ("n:", "null"),
                            ("e:", "err"),
                        ],
                        "main",
                    ),
                ),
                ("rep", replicated(&["main", "sessions", "feed"])),
                (
                    "fail",
                    RouteSpec::Failover {
                        children: names(&["sessions", "rep"]),
                        on: FailoverOn::ErrorOrMiss,
                        errors: FailoverErrors::ALL,
                        exptime_cap: None,
                    },
                ),
                (
                    "warm",
                    RouteSpec::WarmUp {
                        cold: "sessions".into(),
                        warm: "main".into(),
                        ttl: 60,
                    },
                ),
                (
                    "rand",
                    RouteSpec::Random {
                        children: names(&["feed", "main"]),
                    },
                ),
                ("null", RouteSpec::Null),
                (
                    "err",
                    RouteSpec::Error {
                        message: "gone".into(),
                    },
                ),
            ],
        );
        let p = |n: &str| pool_node(&table, n);
        let at = |key: &[u8]| {
            let id = table.select(table.root(), Operation::Get, key);
            (table.node_name(id).to_string(), table.node(id).clone())
        };
        let rep_id = table.select(table.root(), Operation::Get, b"r:1");

        let (name, node) = at(b"r:1");
        assert_eq!(name, "rep");
        let Node::Replicated {
            children,
            writes,
            reads,
        } = node
        else {
            panic!("not replicated");
        };
        assert_eq!(children, [p("main"), p("sessions"), p("feed")]);
        assert_eq!(
            (writes, reads),
            (WritePolicy::AllMajority, ReadPolicy::Failover)
        );

        let (name, node) = at(b"f:1");
        assert_eq!(name, "fail");
        let Node::Failover { children, on, .. } = node else {
            panic!("not failover");
        };
        // A route used twice is one node.
        assert_eq!(children, [p("sessions"), rep_id]);
        assert_eq!(on, FailoverOn::ErrorOrMiss);

        let (name, node) = at(b"w:1");
        assert_eq!(name, "warm");
        let Node::WarmUp { cold, warm, ttl } = node else {
            panic!("not warm-up");
        };
        assert_eq!((cold, warm, ttl), (p("sessions"), p("main"), 60));

        let (name, node) = at(b"x:1");
        assert_eq!(name, "rand");
        let Node::Random { children } = node else {
            panic!("not random");
        };
        assert_eq!(children, [p("feed"), p("main")]);

        assert!(matches!(at(b"n:1"), (name, Node::Null) if name == "null"));
        assert!(
            matches!(at(b"e:1"), (name, Node::Error { message }) if name == "err" && message == "gone")
        );

        for key in [&b"r:1"[..], b"f:1", b"w:1", b"x:1", b"n:1", b"e:1"] {
            assert_eq!(pool_reached(&table, Operation::Set, key), None);
        }
        assert!(table.shadow_names.is_empty());
        // Every child id is smaller than its parent's (the walk-termination invariant).
        for id in 0..table.node_count() as NodeId {
            for child in table.node(id).children() {
                assert!(child < id, "{} -> {}", table.node_name(id), child);
            }
        }
    }

    #[test]
    fn select_stops_at_the_first_policy_node() {
        // A policy node reachable only through an operation entry stops that operation.
        let table = build(
            "root",
            vec![
                ("root", by_operation(&[(Operation::Touch, "null")], "main")),
                ("null", RouteSpec::Null),
            ],
        );
        assert_eq!(
            pool_reached(&table, Operation::Get, b"k"),
            table.pool_index("main")
        );
        assert_eq!(pool_reached(&table, Operation::Touch, b"k"), None);
        // And a policy node as the root.
        let table = build("rep", vec![("rep", replicated(&["main", "feed"]))]);
        assert_eq!(pool_reached(&table, Operation::Get, b"k"), None);
    }

    #[test]
    fn unknown_targets_cycles_and_empty_routes_are_errors() {
        let err = |root: &str, routes| RouteTable::build(&config(root, routes)).err();
        assert_eq!(
            err("root", vec![("root", prefix(&[("a:", "missing")], "main"))]),
            Some(RoutingError::UnknownTarget("missing".into()))
        );
        assert_eq!(
            err("nowhere", vec![]),
            Some(RoutingError::UnknownTarget("nowhere".into()))
        );
        assert_eq!(
            err(
                "a",
                vec![
                    ("a", prefix(&[("x", "b")], "main")),
                    ("b", prefix(&[], "a")),
                ]
            ),
            Some(RoutingError::Cycle("a".into()))
        );
        // Cycles through every kind of target are found, not recursed into.
        assert_eq!(
            err("a", vec![("a", replicated(&["main", "a"]))]),
            Some(RoutingError::Cycle("a".into()))
        );
        assert_eq!(
            err(
                "a",
                vec![
                    ("a", by_operation(&[(Operation::Get, "b")], "main")),
                    ("b", shadow("main", "c", 0.5)),
                    (
                        "c",
                        RouteSpec::WarmUp {
                            cold: "main".into(),
                            warm: "b".into(),
                            ttl: 0
                        }
                    ),
                ]
            ),
            Some(RoutingError::Cycle("b".into()))
        );
        assert_eq!(
            err("r", vec![("r", RouteSpec::Random { children: vec![] })]),
            Some(RoutingError::NoChildren("r".into()))
        );
        assert_eq!(
            err("r", vec![("r", replicated(&[]))]),
            Some(RoutingError::NoChildren("r".into()))
        );
        // The same route used twice without a cycle is fine, and is one node.
        let table = build(
            "a",
            vec![
                ("a", prefix(&[("x", "b"), ("y", "b")], "b")),
                ("b", prefix(&[], "main")),
            ],
        );
        assert_eq!(table.node_count(), 3 + 2);
    }

    #[test]
    fn each_listener_has_its_root() {
        let mut spec = config(
            "main",
            vec![
                ("by_prefix", prefix(&[("s:", "sessions")], "feed")),
                ("mirror", shadow("main", "feed", 1.0)),
            ],
        );
        spec.listener_roots = names(&["by_prefix", "main", "sessions"]);
        let table = RouteTable::build(&spec).expect("valid config");
        let pool = |name| table.pool_index(name).expect("pool") as NodeId;
        assert_eq!(table.root(), pool("main"));
        assert_eq!(table.node_name(table.root_of(0)), "by_prefix");
        assert_eq!(table.root_of(1), pool("main"));
        assert_eq!(table.root_of(2), pool("sessions"));
        // A listener the spec does not list serves the default root.
        assert_eq!(table.root_of(3), table.root());
        let reached = |listener, key: &[u8]| match table.node(table.select(
            table.root_of(listener),
            Operation::Get,
            key,
        )) {
            Node::Pool(pool) => table.pool_names[*pool].clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(reached(0, b"s:1"), "sessions");
        assert_eq!(reached(0, b"x"), "feed");
        assert_eq!(reached(1, b"s:1"), "main");
        // The shadow route is reachable from no root.
        assert!(!table.shadow_names.contains(&"mirror".to_string()));

        // A policy route that only a listener reaches is built.
        spec.listener_roots = names(&["main", "mirror"]);
        let table = RouteTable::build(&spec).expect("valid config");
        assert_eq!(table.node_name(table.root_of(1)), "mirror");
        assert_eq!(table.shadow_names, ["mirror"]);

        // An unknown listener root is an error like an unknown default root.
        spec.listener_roots = names(&["main", "missing"]);
        assert_eq!(
            RouteTable::build(&spec).err(),
            Some(RoutingError::UnknownTarget("missing".into()))
        );
    }

    #[test]
    fn empty_pools_are_errors_unless_found_by_dns() {
        let mut cfg = config("main", vec![]);
        if let Some(p) = cfg.pools.get_mut("feed") {
            p.servers.clear();
        }
        assert_eq!(
            RouteTable::build(&cfg).err(),
            Some(RoutingError::EmptyPool("feed".into()))
        );
        if let Some(p) = cfg.pools.get_mut("feed") {
            p.discovered = true;
        }
        cfg.root = "feed".into();
        let table = RouteTable::build(&cfg).expect("a DNS pool may start empty");
        let feed = table.pool_index("feed").expect("pool");
        assert_eq!(table.placements[feed].server_count(), 0);
        assert_eq!(pool_reached(&table, Operation::Get, b"k"), Some(feed));
        assert_eq!(table.placements[feed].server_for(b"k"), 0);
    }

    #[test]
    fn key_range_fraction_is_accurate() {
        let keys: Vec<Vec<u8>> = (0..100_000)
            .map(|i| format!("user:{i}:profile").into_bytes())
            .collect();
        let share = |range: KeyRange| {
            keys.iter().filter(|k| range.contains_key(k)).count() as f64 / keys.len() as f64
        };
        let tenth = KeyRange::from_select(ShadowSelect::Fraction(0.1));
        assert!((share(tenth) - 0.1).abs() < 0.01, "{}", share(tenth));
        let band = KeyRange::from_select(ShadowSelect::KeyRange(0.3, 0.5));
        assert!((share(band) - 0.2).abs() < 0.01, "{}", share(band));
        // Adjacent ranges do not overlap: [0, 0.3) and [0.3, 0.5) share no key.
        let below = KeyRange::from_select(ShadowSelect::Fraction(0.3));
        assert!(keys
            .iter()
            .all(|k| !(below.contains_key(k) && band.contains_key(k))));
        assert_eq!(
            share(KeyRange::from_select(ShadowSelect::KeyRange(0.0, 1.0))),
            1.0
        );
        assert_eq!(
            share(KeyRange::from_select(ShadowSelect::Fraction(1.0))),
            1.0
        );
        assert_eq!(
            share(KeyRange::from_select(ShadowSelect::KeyRange(0.0, 0.0))),
            0.0
        );
        assert_eq!(
            share(KeyRange::from_select(ShadowSelect::Fraction(0.0))),
            0.0
        );
    }

    #[test]
    fn key_range_edges() {
        let all = KeyRange::from_select(ShadowSelect::KeyRange(0.0, 1.0));
        assert_eq!(all, KeyRange::ALL);
        assert!(all.contains(0) && all.contains(u64::MAX));
        let none = KeyRange::from_select(ShadowSelect::Fraction(0.0));
        assert!(!none.contains(0) && !none.contains(u64::MAX));
        let half = KeyRange::from_select(ShadowSelect::Fraction(0.5));
        assert_eq!(half.end, 1 << 63);
        assert!(half.contains((1 << 63) - 1) && !half.contains(1 << 63));
        let top = KeyRange::from_select(ShadowSelect::KeyRange(0.5, 1.0));
        assert!(top.contains(1 << 63) && top.contains(u64::MAX) && !top.contains(0));
        // Nonsense bounds clamp instead of wrapping.
        let clamped = KeyRange::from_select(ShadowSelect::KeyRange(f64::NAN, 7.0));
        assert_eq!(clamped, KeyRange::ALL);
        assert_eq!(KeyRange::from_select(ShadowSelect::Fraction(-1.0)).end, 0);
    }

    /// A micro check of the fast path (no timing): many keys through a nested tree agree
    /// with a naive walk that compares every prefix and picks the longest.
    #[test]
    fn fast_path_agrees_with_a_naive_walk() {
        let table = build(
            "root",
            vec![
                (
                    "root",
                    prefix(&[("a", "ab"), ("abc", "feed"), ("z", "sessions")], "main"),
                ),
                ("ab", by_operation(&[(Operation::Set, "sessions")], "feed")),
            ],
        );
        let naive = |operation: Operation, key: &[u8]| -> &str {
            let longest = [("abc", "feed"), ("a", "ab"), ("z", "sessions")]
                .into_iter()
                .filter(|(p, _)| key.starts_with(p.as_bytes()))
                .max_by_key(|(p, _)| p.len())
                .map_or("main", |(_, t)| t);
            match (longest, operation) {
                ("ab", Operation::Set) => "sessions",
                ("ab", _) => "feed",
                (other, _) => other,
            }
        };
        let alphabet = b"abcz:";
        for i in 0..100_000usize {
            let key: Vec<u8> = (0..1 + i % 5)
                .map(|d| alphabet[(i / 5usize.pow(d as u32)) % alphabet.len()])
                .collect();
            let operation = Operation::ALL[i % Operation::COUNT];
            let pool = pool_reached(&table, operation, &key)
                .expect("a tree of prefix and operation routes over pools");
            assert_eq!(table.pool_names[pool], naive(operation, &key), "{key:?}");
        }
    }
}
