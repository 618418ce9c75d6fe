//! The checked config as memroute-routing's spec: only what placement and route
//! selection read (routing never sees TOML or connection settings).
use memroute_routing::spec::{PoolSpec, RoutingSpec};

use crate::{Config, PoolConfig};

impl Config {
    /// The pools, routes and roots (the default one and each listener's) the route
    /// table is built from.
    pub fn routing_spec(&self) -> RoutingSpec {
        RoutingSpec {
            pools: self
                .pools
                .iter()
                .map(|(name, pool)| (name.clone(), pool.placement_spec()))
                .collect(),
            routes: self.routes.clone(),
            root: self.proxy.route.clone(),
            listener_roots: self
                .proxy
                .listener_roots()
                .map(|(_, root)| root.to_string())
                .collect(),
            routing_prefixes: self
                .routing_prefixes
                .prefixes
                .iter()
                .map(|(prefix, target)| (prefix.clone(), target.clone()))
                .collect(),
            keep_routing_prefix: self.routing_prefixes.keep.iter().cloned().collect(),
            listener_prefixes: self
                .proxy
                .listen
                .iter()
                .map(|address| self.routing_prefixes.of_listener(address).map(String::from))
                .collect(),
        }
    }
}

impl PoolConfig {
    /// What placement needs of this pool.
    pub fn placement_spec(&self) -> PoolSpec {
        self.placement.clone()
    }
}
