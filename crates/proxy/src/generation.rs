//! A generation: one config as the workers receive it, decided by memroute-control's
//! controller (a `publisher::Plan`) and handed to every worker over a watch channel by the
//! `publisher`, which adds the counters. Shared, read-only, `Send`: each worker turns it
//! into its own `RouteSnapshot` (`snapshot.rs`) with connections of its own. The control
//! plane reads it for route lookups, the panel and probers (memroute-control).
use std::sync::Arc;

use memroute_backend::ServerHealth;
use memroute_config::Config;
use memroute_net::Connector;
use memroute_protocol::auth::Authfile;
use memroute_routing::RouteTable;

use crate::counters::{RouteStats, ServerStatsTable, ShadowStats};

/// One config as the workers receive it (built by `publisher::Publisher::publish`).
#[derive(Debug)]
pub struct Generation {
    pub config: Arc<Config>,
    pub routes: Arc<RouteTable>,
    /// Counters for `config`'s servers, indexed [pool id][server index].
    pub(crate) server_stats: ServerStatsTable,
    /// Health of `config`'s servers, indexed [pool id][server index]; shared by every
    /// worker and kept across reloads for servers that stay.
    pub health: Vec<Vec<Arc<ServerHealth>>>,
    /// How to reach each of `config`'s servers (TLS, session store, TFO), indexed like
    /// `health`; shared by every worker and kept across reloads while unchanged.
    pub connectors: Vec<Vec<Arc<Connector>>>,
    /// Per pool id: bumped whenever one of its servers goes down or up.
    pub(crate) pool_epochs: Vec<Arc<std::sync::atomic::AtomicU64>>,
    /// Per route node id: the counters of policy routes.
    pub(crate) route_stats: Vec<Arc<RouteStats>>,
    /// Per shadow index: the shadow route's counters.
    pub(crate) shadow_stats: Vec<Arc<ShadowStats>>,
    /// Per pool id: the placement the pool had before its server list changed, while its
    /// resize window runs.
    pub windows: Vec<Option<Arc<crate::resize_window::Window>>>,
    /// Per entry of `proxy.listen`: the authfile its clients log in against (read when
    /// this generation was built), or `None` when they need no login.
    pub client_logins: Vec<Option<Arc<Authfile>>>,
    /// Each worker sends its index once it serves new requests with this generation.
    pub(crate) applied: std::sync::mpsc::Sender<usize>,
}
