//! Where does a key go: the route path and server of each target a request for a key
//! reaches from one listener, for `memroute route --config F [--listen A] KEY...` and the
//! admin `GET /route?key=K&listener=A`.
//!
//! Sans-I/O: a walk of the route table from the listener's root, as the executor would walk it, but
//! visiting every child a policy route may use (each with its role) rather than running it.
//! Ejection (down servers taken out of an ejecting pool's ring) is not applied: the
//! answer is the configured placement.
use memroute_config::{Config, Operation};
use memroute_routing::{Node, NodeId, RouteTable};

use memroute_proxy::generation::Generation;
use memroute_proxy::read_order;
use memroute_proxy::routing_prefix::Resolved;
use memroute_proxy::stats::Metrics;
use memroute_proxy::ProxyError;
use memroute_routing::routing_prefix::prefix_len;

use crate::route_reads::{read_roles, Measured};

/// One place a request for the key reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTarget {
    /// Route and pool names from the listener's root down to this target.
    pub path: Vec<String>,
    /// What the target is for: primary, shadow, replica, failover N, cold, warm, ...
    pub role: String,
    /// The pool and the server (its address) that own the key; `None` for null and error
    /// routes and for a pool without servers.
    pub pool: Option<String>,
    pub server: Option<String>,
    /// During the pool's resize window, for a key whose owner changed: the server that
    /// owned it before the pool's servers changed (its copy is looked for there).
    pub previous: Option<String>,
}

impl std::fmt::Display for RouteTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = self.server.as_deref().unwrap_or("-");
        write!(f, "{} => {server} ({})", self.path.join(" -> "), self.role)?;
        match &self.previous {
            Some(previous) => write!(f, " [resize window: old owner {previous}]"),
            None => Ok(()),
        }
    }
}

/// The operation named `name` (`get`, `set`, `delete`, ... as in operation routes).
pub fn operation_named(name: &str) -> Option<Operation> {
    Operation::ALL.into_iter().find(|op| op.as_str() == name)
}

/// The place in `proxy.listen` of the listener written `address` there (`host:port` or
/// `unix:/path`).
pub fn listener_named(config: &Config, address: &str) -> Option<usize> {
    config
        .proxy
        .listen
        .iter()
        .position(|listen| listen.to_string() == address)
}

/// The listeners of `config` as written, for messages that name the choices.
pub fn listener_list(config: &Config) -> String {
    let names: Vec<String> = config.proxy.listen.iter().map(|l| l.to_string()).collect();
    names.join(", ")
}

/// Every target `operation` on `key` reaches under `config` (built into a route table) for
/// a client of the `listener`-th listener.
pub fn route_key(
    config: &Config,
    listener: usize,
    operation: Operation,
    key: &[u8],
) -> Result<Vec<RouteTarget>, ProxyError> {
    let routes = RouteTable::build(&config.routing_spec())?;
    Ok(route_key_in(
        config, &routes, listener, operation, key, None,
    ))
}

/// [`route_key`] with a route table already built from `config`.
pub(crate) fn route_key_in(
    config: &Config,
    routes: &RouteTable,
    listener: usize,
    operation: Operation,
    key: &[u8],
    measured: Option<Measured>,
) -> Vec<RouteTarget> {
    let mut walk = Walk {
        config,
        routes,
        operation,
        key,
        measured,
        targets: Vec::new(),
    };
    let root = routes.root_of(listener);
    if !memroute_proxy::routing_prefix::may_carry(routes, key) {
        walk.visit(root, Vec::new(), "primary".to_string());
        return walk.targets;
    }
    match memroute_proxy::routing_prefix::resolve(routes, listener, key) {
        Resolved::Plain => walk.visit(root, Vec::new(), "primary".to_string()),
        Resolved::NoRoute | Resolved::OnlyPrefix => {
            let prefix = String::from_utf8_lossy(&key[..prefix_len(key).unwrap_or(0)]);
            let answer = match prefix.len() == key.len() {
                true => "the key is only a routing prefix: answered CLIENT_ERROR bad command line format",
                false => "no route: answered SERVER_ERROR RootRoute: No rh found",
            };
            walk.targets.push(RouteTarget {
                path: vec![format!("routing prefix {prefix}")],
                role: answer.to_string(),
                pool: None,
                server: None,
                previous: None,
            });
        }
        Resolved::Routes { len, targets } => {
            let prefix = String::from_utf8_lossy(&key[..len]).into_owned();
            for (n, target) in targets.iter().enumerate() {
                // The servers get (and placement hashes) the key with the prefix cut,
                // unless the route's pools keep it.
                walk.key = if target.strip { &key[len..] } else { key };
                let role = match n {
                    0 => "primary".to_string(),
                    _ => "sent in the background (wildcard routing prefix)".to_string(),
                };
                let path = vec![format!("routing prefix {prefix}")];
                walk.visit(target.node, path, role);
            }
        }
    }
    walk.targets
}

/// Every target `operation` on `key` reaches in the running `generation`, for a client of
/// the `listener`-th listener: `nearest` routes ordered by what the workers measured
/// (`metrics`), and each moved key's owner before its pool's resize window (`ProxyHandle::route`
/// and `GET /route`).
pub(crate) fn route_running(
    generation: &Generation,
    metrics: &Metrics,
    listener: usize,
    operation: Operation,
    key: &[u8],
) -> Vec<RouteTarget> {
    let round_trips = |pool: &str, address: &str| metrics.round_trip_totals(pool, address);
    let measured = |node| measured(generation, &round_trips, node);
    let mut targets = route_key_in(
        &generation.config,
        &generation.routes,
        listener,
        operation,
        key,
        Some(&measured),
    );
    add_previous_owners(generation, &mut targets, key);
    targets
}

/// Fills in, for each target in a pool with a running resize window whose key moved,
/// the key's owner under the window's previous placement (`/route?key=` shows both).
fn add_previous_owners(generation: &Generation, targets: &mut [RouteTarget], key: &[u8]) {
    for target in targets {
        let Some(pool) = &target.pool else { continue };
        let id = generation.routes.pool_names.iter().position(|n| n == pool);
        let Some(Some(window)) = id.and_then(|id| generation.windows.get(id)) else {
            continue;
        };
        let index = window.placement.server_for(key);
        let previous = window.config.servers.get(index).map(|s| s.address.clone());
        // Only a key that moved has an old owner worth naming.
        if previous != target.server {
            target.previous = previous;
        }
    }
}

/// What this generation's servers beneath route `node` show now: all of them down, and
/// their mean round trip since start in seconds (`None` before any), from the
/// process-wide round trips `round_trips(pool, address)` (what `/route` orders a
/// `nearest` route's children by).
fn measured(
    generation: &Generation,
    round_trips: &impl Fn(&str, &str) -> prometheus::Histogram,
    node: NodeId,
) -> (bool, Option<f64>) {
    let health = |pool: usize, server: usize| generation.health.get(pool)?.get(server).cloned();
    let servers = read_order::servers_beneath(
        &generation.config,
        &generation.routes,
        node,
        &health,
        round_trips,
    );
    let (sum, count) = servers
        .iter()
        .fold((0.0, 0), |(sum, count), (_, histogram)| {
            (
                sum + histogram.get_sample_sum(),
                count + histogram.get_sample_count(),
            )
        });
    (
        read_order::all_down(&servers),
        (count > 0).then(|| sum / count as f64),
    )
}

struct Walk<'a> {
    config: &'a Config,
    routes: &'a RouteTable,
    operation: Operation,
    key: &'a [u8],
    /// What a running proxy measured (the read order of `nearest` routes); `None` offline.
    measured: Option<Measured<'a>>,
    targets: Vec<RouteTarget>,
}

impl Walk<'_> {
    /// Routes form a tree without cycles (config validation rejects circles), so the
    /// recursion ends; its depth is the config's nesting depth.
    fn visit(&mut self, node: NodeId, mut path: Vec<String>, role: String) {
        path.push(self.routes.node_name(node).to_string());
        let target = |path: Vec<String>, role: String| RouteTarget {
            path,
            role,
            pool: None,
            server: None,
            previous: None,
        };
        match self.routes.node(node) {
            Node::Prefix { .. } | Node::Operation { .. } => {
                let next = match self.routes.node(node) {
                    Node::Prefix { prefixes, default } => prefixes
                        .iter()
                        .find(|(prefix, _)| self.key.starts_with(prefix))
                        .map_or(*default, |&(_, t)| t),
                    Node::Operation { table } => table[self.operation.index()],
                    _ => return,
                };
                self.visit(next, path, role);
            }
            Node::Pool(pool) => self.pool_target(*pool, path, role),
            Node::Shadow {
                primary,
                shadow,
                range,
                ..
            } => {
                let (primary, shadow) = (*primary, *shadow);
                let shadowed =
                    self.operation != Operation::FlushAll && range.contains_key(self.key);
                self.visit(primary, path.clone(), role.clone());
                if shadowed {
                    self.visit(shadow, path, format!("{role}, shadow copy"));
                }
            }
            Node::Replicated {
                children,
                writes,
                reads,
            } => {
                if !self.operation.is_write() {
                    let reads =
                        read_roles(self.config, self.routes, children, *reads, self.measured);
                    for (child, read) in reads {
                        self.visit(child, path.clone(), format!("{role}, {read}"));
                    }
                    return;
                }
                let policy = format!("replica, writes {}", writes.as_str());
                for (i, child) in children.clone().into_iter().enumerate() {
                    let role = format!("{role}, {policy} {}/{}", i + 1, children.len());
                    self.visit(child, path.clone(), role);
                }
            }
            Node::Failover { children, .. } => {
                for (i, child) in children.clone().into_iter().enumerate() {
                    let step = match i {
                        0 => role.clone(),
                        n => format!("{role}, failover {n}"),
                    };
                    self.visit(child, path.clone(), step);
                }
            }
            Node::WarmUp { cold, warm, .. } => self.visit_warm_up(*cold, *warm, path, role),
            Node::Random { children } => {
                for child in children.clone() {
                    self.visit(child, path.clone(), format!("{role}, random choice"));
                }
            }
            Node::Null => self
                .targets
                .push(target(path, format!("{role}, null route"))),
            Node::Error { message } => {
                let message = message.clone();
                self.targets
                    .push(target(path, format!("{role}, error route: {message}")));
            }
        }
    }

    /// The server of pool `pool` that owns the key.
    fn pool_target(&mut self, pool: usize, path: Vec<String>, role: String) {
        let name = &self.routes.pool_names[pool];
        let servers = self.config.pools.get(name).map(|p| &p.servers[..]);
        let server = match servers {
            Some(servers) if !servers.is_empty() => {
                let index = self.routes.placements[pool].server_for(self.key);
                servers.get(index).map(|s| s.address.clone())
            }
            _ => None,
        };
        self.targets.push(RouteTarget {
            path,
            role,
            pool: Some(name.clone()),
            server,
            previous: None,
        });
    }

    fn visit_warm_up(&mut self, cold: NodeId, warm: NodeId, path: Vec<String>, role: String) {
        // Only reads go on to warm (route::warm_up::warms_up); everything else,
        // writes included, is cold's alone.
        let warms_up = matches!(
            self.operation,
            Operation::Get | Operation::Gets | Operation::Gat | Operation::Gats
        );
        match warms_up {
            true => {
                self.visit(cold, path.clone(), format!("{role}, cold"));
                self.visit(warm, path, format!("{role}, warm (on a cold miss)"));
            }
            false => self.visit(cold, path, format!("{role}, cold")),
        }
    }
}

/// The text both the CLI and the admin endpoint print for one key: one line per target.
pub fn describe_routes(key: &str, targets: &[RouteTarget]) -> String {
    let mut out = String::new();
    for target in targets {
        out.push_str(key);
        out.push_str(": ");
        out.push_str(&target.to_string());
        out.push('\n');
    }
    if targets.is_empty() {
        out.push_str(key);
        out.push_str(": no target\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_and_shadow_routes_name_every_target() {
        let config = memroute_config::parse(
            r#"
[proxy]
listen = ["127.0.0.1:11211"]
route = "split"
[pools.a]
servers = ["127.0.0.1:1"]
[pools.b]
servers = ["127.0.0.1:2", "127.0.0.1:3"]
[routes.split]
type = "prefix"
prefixes = { "s:" = "mirror" }
default = "a"
[routes.mirror]
type = "shadow"
primary = "b"
shadow = "a"
fraction = 1.0
"#,
        )
        .expect("config");
        let plain = route_key(&config, 0, Operation::Get, b"x").expect("route");
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].path, ["split", "a"]);
        assert_eq!(plain[0].server.as_deref(), Some("127.0.0.1:1"));
        let shadowed = route_key(&config, 0, Operation::Set, b"s:1").expect("route");
        assert_eq!(shadowed.len(), 2, "{shadowed:?}");
        assert_eq!(shadowed[0].path, ["split", "mirror", "b"]);
        assert_eq!(shadowed[1].role, "primary, shadow copy");
        assert_eq!(shadowed[1].server.as_deref(), Some("127.0.0.1:1"));
        assert_eq!(operation_named("delete"), Some(Operation::Delete));
    }

    #[test]
    fn warm_up_writes_go_to_cold_and_policies_print_as_configured() {
        let config = memroute_config::parse(
            r#"
[proxy]
listen = ["127.0.0.1:11211"]
route = "warm"
[pools.a]
servers = ["127.0.0.1:1"]
[pools.b]
servers = ["127.0.0.1:2"]
[routes.warm]
type = "warm-up"
cold = "a"
warm = "both"
[routes.both]
type = "replicated"
children = ["a", "b"]
"#,
        )
        .expect("config");
        let set = route_key(&config, 0, Operation::Set, b"k").expect("route");
        assert_eq!(set.len(), 1, "{set:?}");
        assert_eq!(set[0].pool.as_deref(), Some("a"));
        assert_eq!(set[0].role, "primary, cold");
        let get = route_key(&config, 0, Operation::Get, b"k").expect("route");
        assert_eq!(get.len(), 3, "{get:?}");
        assert_eq!(
            get[1].role,
            "primary, warm (on a cold miss), replica, reads failover 1/2"
        );
        let mut replicated = config.clone();
        replicated.proxy.route = "both".to_string();
        let set = route_key(&replicated, 0, Operation::Set, b"k").expect("route");
        assert_eq!(set[1].role, "primary, replica, writes all-sync 2/2");
    }

    #[test]
    fn each_listener_is_answered_from_its_own_root() {
        let config = memroute_config::parse(
            r#"
[proxy]
listen = [{ address = "127.0.0.1:22121", route = "b" }, "127.0.0.1:22122", "unix:/run/m.sock"]
route = "a"
[pools.a]
servers = ["127.0.0.1:1"]
[pools.b]
servers = ["127.0.0.1:2"]
"#,
        )
        .expect("config");
        assert_eq!(listener_named(&config, "127.0.0.1:22122"), Some(1));
        assert_eq!(listener_named(&config, "unix:/run/m.sock"), Some(2));
        assert_eq!(listener_named(&config, "127.0.0.1:1"), None);
        assert_eq!(
            listener_list(&config),
            "127.0.0.1:22121, 127.0.0.1:22122, unix:/run/m.sock"
        );
        let first = route_key(&config, 0, Operation::Get, b"k").expect("route");
        assert_eq!(first[0].path, ["b"]);
        assert_eq!(first[0].server.as_deref(), Some("127.0.0.1:2"));
        let second = route_key(&config, 1, Operation::Get, b"k").expect("route");
        assert_eq!(second[0].path, ["a"]);
        assert_eq!(second[0].server.as_deref(), Some("127.0.0.1:1"));
    }
}
