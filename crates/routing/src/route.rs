//! The route table: from a key to a pool.
//!
//! Routes refer to pools or to other routes by name. At build time every name is resolved
//! into a small tree of [`Node`]s whose leaves are pool ids, so a lookup is a walk over
//! a few prefix comparisons with no name lookups and no allocation:
//!
//! ```text
//!   proxy.route = "by_prefix"
//!   by_prefix: prefix { "session:" -> Pool(sessions), "feed:" -> prefix{..}, default -> Pool(main) }
//! ```
//!
//! Unknown names and cycles are build errors; a config that fails here is never swapped in.
use memroute_config::{Config, RouteConfig};

use crate::{Placement, RoutingError};

/// Built once per config (re)load and shared read-only by every worker.
#[derive(Debug, Clone)]
pub struct RouteTable {
    /// Pool names, index = pool id. Same order as `Config::pools` (sorted by name).
    pub pool_names: Vec<String>,
    pub placements: Vec<Placement>,
    /// The resolved route tree, rooted at `proxy.route`.
    root: Node,
}

/// A resolved route.
#[derive(Debug, Clone)]
enum Node {
    Pool(usize),
    /// Prefixes sorted longest first, so the first match is the longest match.
    Prefix {
        prefixes: Vec<(Vec<u8>, Node)>,
        default: Box<Node>,
    },
}

impl RouteTable {
    pub fn build(config: &Config) -> Result<RouteTable, RoutingError> {
        let mut pool_names = Vec::with_capacity(config.pools.len());
        let mut placements = Vec::with_capacity(config.pools.len());
        for (name, pool) in &config.pools {
            if pool.servers.is_empty() {
                return Err(RoutingError::EmptyPool(name.clone()));
            }
            pool_names.push(name.clone());
            placements.push(Placement::new(pool));
        }
        let mut resolver = Resolver {
            config,
            pool_names: &pool_names,
            path: Vec::new(),
        };
        let root = resolver.resolve(&config.proxy.route)?;
        Ok(RouteTable {
            pool_names,
            placements,
            root,
        })
    }

    /// The pool id that serves `key`.
    #[inline]
    pub fn pool_for(&self, key: &[u8]) -> usize {
        let mut node = &self.root;
        loop {
            match node {
                Node::Pool(id) => return *id,
                Node::Prefix { prefixes, default } => {
                    node = prefixes
                        .iter()
                        .find(|(prefix, _)| key.starts_with(prefix))
                        .map_or(&**default, |(_, target)| target);
                }
            }
        }
    }

    /// The pool that keyless commands (flush_all) go to: the root's pool, or the root
    /// route's default, followed down to a pool.
    pub fn default_pool(&self) -> usize {
        let mut node = &self.root;
        loop {
            match node {
                Node::Pool(id) => return *id,
                Node::Prefix { default, .. } => node = default,
            }
        }
    }

    /// The id of the pool called `name`, if there is one.
    pub fn pool_index(&self, name: &str) -> Option<usize> {
        self.pool_names
            .binary_search_by(|n| n.as_str().cmp(name))
            .ok()
    }

    /// Pool id and server index (in the pool's config order) that own `key`.
    #[inline]
    pub fn server_for(&self, key: &[u8]) -> (usize, usize) {
        let pool = self.pool_for(key);
        (pool, self.placements[pool].server_for(key))
    }
}

/// Resolves names into nodes, remembering the chain of routes being resolved so a route
/// that (directly or not) refers to itself is reported instead of recursing forever.
struct Resolver<'a> {
    config: &'a Config,
    pool_names: &'a [String],
    path: Vec<&'a str>,
}

impl<'a> Resolver<'a> {
    /// A name is a pool if a pool has it, else a route; config validation keeps the two
    /// namespaces apart.
    fn resolve(&mut self, name: &'a str) -> Result<Node, RoutingError> {
        if let Ok(id) = self.pool_names.binary_search_by(|n| n.as_str().cmp(name)) {
            return Ok(Node::Pool(id));
        }
        let Some(route) = self.config.routes.get(name) else {
            return Err(RoutingError::UnknownTarget(name.to_string()));
        };
        if self.path.contains(&name) {
            return Err(RoutingError::Cycle(name.to_string()));
        }
        self.path.push(name);
        let node = match route {
            RouteConfig::Prefix { prefixes, default } => {
                let mut resolved = Vec::with_capacity(prefixes.len());
                for (prefix, target) in prefixes {
                    resolved.push((prefix.as_bytes().to_vec(), self.resolve(target)?));
                }
                // Longest first (stable, so equal lengths keep config order; equal lengths
                // cannot both match a key unless they are the same prefix).
                resolved.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
                Node::Prefix {
                    prefixes: resolved,
                    default: Box::new(self.resolve(default)?),
                }
            }
            // TODO(issue 3): the other route types (routing helper).
            _ => return Err(RoutingError::UnknownTarget(name.to_string())),
        };
        self.path.pop();
        Ok(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memroute_config::{DistributionName, HashName, PoolConfig, ProxyConfig, ServerConfig};
    use std::collections::BTreeMap;

    fn pool(port: u16) -> PoolConfig {
        PoolConfig {
            servers: vec![ServerConfig {
                address: format!("127.0.0.1:{port}"),
                weight: 1,
                name: None,
            }],
            distribution: DistributionName::Ketama,
            hash: HashName::Fnv1a_64,
            ..PoolConfig::new(Vec::new())
        }
    }

    fn prefix(prefixes: &[(&str, &str)], default: &str) -> RouteConfig {
        RouteConfig::Prefix {
            prefixes: prefixes
                .iter()
                .map(|(p, t)| (p.to_string(), t.to_string()))
                .collect(),
            default: default.to_string(),
        }
    }

    fn config(root: &str, routes: Vec<(&str, RouteConfig)>) -> Config {
        let pools: BTreeMap<String, PoolConfig> = [("main", 1), ("sessions", 2), ("feed", 3)]
            .iter()
            .map(|(n, p)| (n.to_string(), pool(*p)))
            .collect();
        Config {
            proxy: ProxyConfig {
                listen: Vec::new(),
                workers: 1,
                backlog: 128,
                route: root.to_string(),
                max_value_size: 1 << 20,
                max_line_size: 1 << 16,
                max_client_pending: 1024,
                max_connections: 0,
                shutdown_timeout: std::time::Duration::from_secs(10),
            },
            admin: None,
            discovery: Default::default(),
            pools,
            routes: routes
                .into_iter()
                .map(|(n, r)| (n.to_string(), r))
                .collect(),
        }
    }

    #[test]
    fn pool_ids_follow_sorted_pool_names() {
        let table = RouteTable::build(&config("main", vec![])).expect("valid");
        assert_eq!(table.pool_names, ["feed", "main", "sessions"]);
        assert_eq!(table.pool_index("main"), Some(1));
        assert_eq!(table.pool_index("nope"), None);
        assert_eq!(table.pool_for(b"anything"), 1);
        assert_eq!(table.default_pool(), 1);
    }

    #[test]
    fn longest_prefix_wins_and_default_catches_the_rest() {
        let cfg = config(
            "root",
            vec![(
                "root",
                prefix(
                    &[("s", "feed"), ("session:", "sessions"), ("sess", "main")],
                    "main",
                ),
            )],
        );
        let table = RouteTable::build(&cfg).expect("valid");
        let id = |n: &str| table.pool_index(n).expect("pool");
        assert_eq!(table.pool_for(b"session:1"), id("sessions"));
        assert_eq!(table.pool_for(b"sess1"), id("main"));
        assert_eq!(table.pool_for(b"s1"), id("feed"));
        assert_eq!(table.pool_for(b"other"), id("main"));
        assert_eq!(table.default_pool(), id("main"));
    }

    #[test]
    fn routes_nest_and_default_follows_down_to_a_pool() {
        let cfg = config(
            "root",
            vec![
                ("root", prefix(&[("feed:", "feeds")], "inner")),
                ("feeds", prefix(&[], "feed")),
                ("inner", prefix(&[("session:", "sessions")], "main")),
            ],
        );
        let table = RouteTable::build(&cfg).expect("valid");
        let id = |n: &str| table.pool_index(n).expect("pool");
        assert_eq!(table.pool_for(b"feed:9"), id("feed"));
        assert_eq!(table.pool_for(b"session:9"), id("sessions"));
        assert_eq!(table.pool_for(b"x"), id("main"));
        assert_eq!(table.default_pool(), id("main"));
        assert_eq!(table.server_for(b"feed:9"), (id("feed"), 0));
    }

    #[test]
    fn unknown_targets_and_cycles_are_errors() {
        let unknown = config("root", vec![("root", prefix(&[("a:", "missing")], "main"))]);
        assert_eq!(
            RouteTable::build(&unknown).err(),
            Some(RoutingError::UnknownTarget("missing".into()))
        );
        assert_eq!(
            RouteTable::build(&config("nowhere", vec![])).err(),
            Some(RoutingError::UnknownTarget("nowhere".into()))
        );
        let cycle = config(
            "a",
            vec![
                ("a", prefix(&[("x", "b")], "main")),
                ("b", prefix(&[], "a")),
            ],
        );
        assert_eq!(
            RouteTable::build(&cycle).err(),
            Some(RoutingError::Cycle("a".into()))
        );
        // The same route used twice without a cycle is fine.
        let diamond = config(
            "a",
            vec![
                ("a", prefix(&[("x", "b"), ("y", "b")], "b")),
                ("b", prefix(&[], "main")),
            ],
        );
        assert!(RouteTable::build(&diamond).is_ok());
    }

    #[test]
    fn empty_pools_are_errors() {
        let mut cfg = config("main", vec![]);
        if let Some(p) = cfg.pools.get_mut("feed") {
            p.servers.clear();
        }
        assert_eq!(
            RouteTable::build(&cfg).err(),
            Some(RoutingError::EmptyPool("feed".into()))
        );
    }
}
