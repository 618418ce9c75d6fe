//! A generation: one config as the workers receive it, built and checked on the main
//! thread by the controller (`control`) and handed to every worker over a watch channel.
//! Shared, read-only, `Send`: each worker turns it into its own `RouteSnapshot`
//! (`snapshot.rs`) with connections of its own.
use std::sync::Arc;

use memroute_backend::ServerHealth;
use memroute_config::Config;
use memroute_net::Connector;
use memroute_protocol::auth::Authfile;
use memroute_routing::{NodeId, RouteTable};

use crate::counters::{RouteStats, ServerStatsTable, ShadowStats};
use crate::read_order;

/// One config as the workers receive it: built and checked on the main thread.
#[derive(Debug)]
pub(crate) struct Generation {
    pub config: Arc<Config>,
    pub routes: Arc<RouteTable>,
    /// Counters for `config`'s servers, indexed [pool id][server index].
    pub server_stats: ServerStatsTable,
    /// Health of `config`'s servers, indexed [pool id][server index]; shared by every
    /// worker and kept across reloads for servers that stay.
    pub health: Vec<Vec<Arc<ServerHealth>>>,
    /// How to reach each of `config`'s servers (TLS, session store, TFO), indexed like
    /// `health`; shared by every worker and kept across reloads while unchanged.
    pub connectors: Vec<Vec<Arc<Connector>>>,
    /// Per pool id: bumped whenever one of its servers goes down or up.
    pub pool_epochs: Vec<Arc<std::sync::atomic::AtomicU64>>,
    /// Per route node id: the counters of policy routes.
    pub route_stats: Vec<Arc<RouteStats>>,
    /// Per shadow index: the shadow route's counters.
    pub shadow_stats: Vec<Arc<ShadowStats>>,
    /// Per pool id: the placement the pool had before its server list changed, while its
    /// resize window runs.
    pub windows: Vec<Option<Arc<crate::resize_window::Window>>>,
    /// Per entry of `proxy.listen`: the authfile its clients log in against (read when
    /// this generation was built), or `None` when they need no login.
    pub client_logins: Vec<Option<Arc<Authfile>>>,
    /// Each worker sends its index once it serves new requests with this generation.
    pub applied: std::sync::mpsc::Sender<usize>,
}

impl Generation {
    /// Fills in, for each target in a pool with a running resize window whose key moved,
    /// the key's owner under the window's previous placement (`/route?key=` shows both).
    pub(crate) fn add_previous_owners(
        &self,
        targets: &mut [crate::route_lookup::RouteTarget],
        key: &[u8],
    ) {
        for target in targets {
            let Some(pool) = &target.pool else { continue };
            let id = self.routes.pool_names.iter().position(|n| n == pool);
            let Some(Some(window)) = id.and_then(|id| self.windows.get(id)) else {
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
    pub(crate) fn measured(
        &self,
        round_trips: &impl Fn(&str, &str) -> prometheus::Histogram,
        node: NodeId,
    ) -> (bool, Option<f64>) {
        let health = |pool: usize, server: usize| self.health.get(pool)?.get(server).cloned();
        let servers =
            read_order::servers_beneath(&self.config, &self.routes, node, &health, round_trips);
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
}
