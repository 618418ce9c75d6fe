//! Resize windows, what the data plane runs: when a pool's placement changes (a reload, or
//! DNS discovery finding another server set), the placement in force just before is kept
//! for the pool's `resize_window`, so a key whose owner changed is still found on its old
//! owner (`route::resize` does that per request). A generation carries one optional
//! window per pool (`publisher::Publisher::keep_placement` builds one); whether a window
//! starts, goes on or ends is memroute-control's decision (its `resize_decision`), which
//! publishes a generation without it once it ends.
use std::sync::Arc;
use std::time::Instant;

use memroute_backend::ServerHealth;
use memroute_config::PoolConfig;
use memroute_net::Connector;
use memroute_routing::Placement;

use crate::counters::{ResizeStats, ServerStats};

/// A pool's previous placement and how to reach its servers, until `ends`.
#[derive(Debug)]
pub struct Window {
    /// The pool as it was (its servers, their connection settings).
    pub config: PoolConfig,
    pub placement: Placement,
    /// Indexed like `config.servers`.
    pub servers: Vec<OldServer>,
    pub ends: Instant,
    pub(crate) stats: Arc<ResizeStats>,
}

/// One server of a previous placement.
#[derive(Debug, Clone)]
pub struct OldServer {
    pub health: Arc<ServerHealth>,
    pub connector: Arc<Connector>,
    pub(crate) stats: ServerStats,
}
