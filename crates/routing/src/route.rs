//! The route table: from a key to a pool.
use memroute_config::Config;

use crate::{Placement, RoutingError};

/// Built once per config (re)load and shared read-only by every worker.
#[derive(Debug, Clone)]
pub struct RouteTable {
    /// Pool names, index = pool id. Same order as `Config::pools` (sorted by name).
    pub pool_names: Vec<String>,
    pub placements: Vec<Placement>,
}

impl RouteTable {
    pub fn build(config: &Config) -> Result<RouteTable, RoutingError> {
        let _ = config;
        todo!("routing helper implements")
    }
    /// The pool id that serves `key`.
    pub fn pool_for(&self, key: &[u8]) -> usize {
        let _ = key;
        todo!("routing helper implements")
    }
    /// The pool that keyless commands (flush_all) go to: the root's pool, or the root
    /// route's default, followed down to a pool.
    pub fn default_pool(&self) -> usize {
        todo!("routing helper implements")
    }
}
