//! The data plane's intake: memroute-control decides what a config serves (a [`Plan`]:
//! routes, health, connectors, resize windows, logins) and hands it to the [`Publisher`],
//! which adds the counters the workers bump (kept across generations by name), tells the
//! metrics registry what the new generation serves, and sends it to every worker over one
//! watch channel.
//!
//! ```text
//!   memroute-control's Controller --Plan--> Publisher::publish --watch--> workers
//!                                               |                          (RouteSnapshot)
//!                                               +--> Metrics (servers, routes, pools)
//! ```
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use memroute_backend::ServerHealth;
use memroute_config::Config;
use memroute_net::Connector;
use memroute_protocol::auth::Authfile;
use memroute_routing::{Node, NodeId, RouteTable};
use tokio::sync::watch;

use crate::counters::{ResizeStats, RouteStats, ShadowStats};
use crate::error::ProxyError;
use crate::generation::Generation;
use crate::resize_window::{OldServer, Window};
use crate::stats::Metrics;

/// What the control plane decides one generation serves. Tables are indexed like
/// `routes.pool_names` (pool id), then by server index; a missing entry is filled in by
/// each worker's snapshot (a standalone health object, a plain connector).
#[derive(Debug)]
pub struct Plan {
    /// The config with every pool's servers (DNS pools as last discovered).
    pub config: Arc<Config>,
    pub routes: Arc<RouteTable>,
    /// Health of each server, shared by every worker.
    pub health: Vec<Vec<Arc<ServerHealth>>>,
    /// How to reach each server (TLS, session store, TFO, login).
    pub connectors: Vec<Vec<Arc<Connector>>>,
    /// Per pool id: bumped whenever one of its servers goes down or up.
    pub pool_epochs: Vec<Arc<AtomicU64>>,
    /// Per pool id: the previous placement kept while its resize window runs.
    pub windows: Vec<Option<Arc<Window>>>,
    /// Per entry of `proxy.listen`: the authfile its clients log in against.
    pub client_logins: Vec<Option<Arc<Authfile>>>,
}

impl Plan {
    /// A plan of `config` alone: its route table, and no health, connectors, windows or
    /// logins (each worker's snapshot fills in standalone health and plain connectors).
    /// The controller fills in the rest; tests and the fuzz harness serve it as it is.
    pub fn bare(config: Config) -> Result<Plan, ProxyError> {
        Ok(Plan {
            routes: Arc::new(RouteTable::build(&config.routing_spec())?),
            config: Arc::new(config),
            health: Vec::new(),
            connectors: Vec::new(),
            pool_epochs: Vec::new(),
            windows: Vec::new(),
            client_logins: Vec::new(),
        })
    }
}

/// Hands generations to the workers, and keeps the counters that outlive one generation
/// (per policy route, per shadow route, per pool's resize windows) by name.
#[derive(Debug)]
pub struct Publisher {
    sender: watch::Sender<Arc<Generation>>,
    shared: Arc<Metrics>,
    kept: Mutex<KeptCounters>,
}

/// Counters kept across generations by the name of what they count.
#[derive(Debug, Default)]
struct KeptCounters {
    routes: HashMap<String, Arc<RouteStats>>,
    shadows: HashMap<String, Arc<ShadowStats>>,
    /// Per pool name: its resize counters, kept across windows.
    resize: HashMap<String, Arc<ResizeStats>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Counters by name: nothing a panic could leave half-written in a way that matters.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Publisher {
    /// A publisher whose receiver starts on `first`, unpublished: no worker acknowledges it
    /// and the metrics registry is not told of it (it is what the first `publish` replaces).
    pub fn new(shared: Arc<Metrics>, first: Plan) -> (Publisher, watch::Receiver<Arc<Generation>>) {
        let first = Arc::new(with_counters(first, Vec::new(), Vec::new(), Vec::new()).0);
        let (sender, receiver) = watch::channel(first);
        let publisher = Publisher {
            sender,
            shared,
            kept: Mutex::default(),
        };
        (publisher, receiver)
    }

    /// The generation published last.
    pub fn current(&self) -> Arc<Generation> {
        self.sender.borrow().clone()
    }

    /// The registry the workers count into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared
    }

    /// A resize window for `pool`: the placement and servers the generation published last
    /// gives it, kept until `ends`. `None` when that generation has no such pool.
    pub fn keep_placement(&self, pool: &str, ends: Instant) -> Option<Window> {
        let before = self.current();
        let id = before.routes.pool_names.iter().position(|n| n == pool)?;
        let config = before.config.pools.get(pool)?.clone();
        let servers = (0..config.servers.len())
            .map(|index| {
                Some(OldServer {
                    health: before.health.get(id)?.get(index)?.clone(),
                    connector: before.connectors.get(id)?.get(index)?.clone(),
                    stats: before.server_stats.get(id)?.get(index)?.clone(),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let stats = lock(&self.kept)
            .resize
            .entry(pool.to_string())
            .or_default()
            .clone();
        Some(Window {
            placement: before.routes.placements.get(id)?.clone(),
            config,
            servers,
            ends,
            stats,
        })
    }

    /// Serves `plan` from now on: its counters (kept by name from the generations before),
    /// the registry told what it serves, the generation sent to every worker. Returns it,
    /// and the receiver of the workers' acknowledgements.
    pub fn publish(&self, plan: Plan) -> (Arc<Generation>, std::sync::mpsc::Receiver<usize>) {
        let mut kept = lock(&self.kept);
        let server_stats = self.shared.for_config(&plan.config, &plan.routes);
        self.shared.set_connectors(
            plan.routes
                .pool_names
                .iter()
                .zip(&plan.connectors)
                .flat_map(|(pool, servers)| servers.iter().map(|c| (pool.clone(), c.clone())))
                .collect(),
        );
        self.shared
            .set_health(plan.health.iter().flatten().cloned().collect());
        let (route_stats, shadow_stats) = self.policy_stats(&mut kept, &plan.routes);
        self.shared.set_listener_routes(
            plan.config
                .proxy
                .listener_roots()
                .map(|(_, root)| root.to_string())
                .collect(),
        );
        kept.resize
            .retain(|name, _| plan.config.pools.contains_key(name));
        self.shared.set_resize_stats(
            kept.resize
                .iter()
                .map(|(name, stats)| (name.clone(), stats.clone()))
                .collect(),
        );
        let (generation, acks) = with_counters(plan, server_stats, route_stats, shadow_stats);
        let generation = Arc::new(generation);
        self.sender.send_replace(generation.clone());
        // After the send, never before: a worker may still route with the old set until then.
        self.shared.set_pools(&generation.config);
        for (name, stats) in &kept.resize {
            let windowed = generation
                .routes
                .pool_names
                .iter()
                .zip(&generation.windows)
                .any(|(pool, window)| pool == name && window.is_some());
            stats.active.store(windowed, Relaxed);
        }
        (generation, acks)
    }

    /// Counters per policy route node and per shadow route of `routes`, kept across
    /// generations by name; the registry exports those of failover, replicated and warm-up
    /// routes.
    fn policy_stats(
        &self,
        kept: &mut KeptCounters,
        routes: &RouteTable,
    ) -> (Vec<Arc<RouteStats>>, Vec<Arc<ShadowStats>>) {
        let route_stats: Vec<Arc<RouteStats>> = (0..routes.node_count())
            .map(|id| {
                let name = routes.node_name(id as NodeId);
                kept.routes.entry(name.to_string()).or_default().clone()
            })
            .collect();
        let shadow_stats: Vec<Arc<ShadowStats>> = routes
            .shadow_names
            .iter()
            .map(|name| kept.shadows.entry(name.clone()).or_default().clone())
            .collect();
        let mut listed: Vec<(String, Arc<RouteStats>)> = Vec::new();
        for (id, stats) in route_stats.iter().enumerate() {
            let node = id as NodeId;
            if matches!(
                routes.node(node),
                Node::Failover { .. } | Node::Replicated { .. } | Node::WarmUp { .. }
            ) {
                listed.push((routes.node_name(node).to_string(), stats.clone()));
            }
        }
        let shadow_list = routes
            .shadow_names
            .iter()
            .cloned()
            .zip(shadow_stats.iter().cloned())
            .collect();
        self.shared.set_policy_stats(listed, shadow_list);
        (route_stats, shadow_stats)
    }
}

/// `plan` with its counters, as the workers receive it, and the receiver of their
/// acknowledgements.
fn with_counters(
    plan: Plan,
    server_stats: crate::counters::ServerStatsTable,
    route_stats: Vec<Arc<RouteStats>>,
    shadow_stats: Vec<Arc<ShadowStats>>,
) -> (Generation, std::sync::mpsc::Receiver<usize>) {
    let (applied, acks) = std::sync::mpsc::channel();
    let generation = Generation {
        config: plan.config,
        routes: plan.routes,
        server_stats,
        health: plan.health,
        connectors: plan.connectors,
        pool_epochs: plan.pool_epochs,
        route_stats,
        shadow_stats,
        windows: plan.windows,
        client_logins: plan.client_logins,
        applied,
    };
    (generation, acks)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use memroute_routing::NodeId;

    use super::{Plan, Publisher};
    use crate::counters::RouteStats;
    use crate::generation::Generation;
    use crate::stats::Metrics;

    fn config(route: &str) -> memroute_config::Config {
        let toml = format!(
            "[proxy]\nlisten = [\"127.0.0.1:1\"]\nworkers = 1\nroute = \"{route}\"\n\
             [pools.main]\nservers = [\"127.0.0.1:1\"]\n\
             [pools.standby]\nservers = [\"127.0.0.1:2\"]\n\
             [routes.main_then_standby]\ntype = \"failover\"\nchildren = [\"main\", \"standby\"]\n"
        );
        memroute_config::parse(&toml).expect("test config")
    }

    fn plan(route: &str) -> Plan {
        Plan::bare(config(route)).expect("routes")
    }

    /// The counters `generation` carries for the route node called `name`.
    fn counters_of(generation: &Generation, name: &str) -> Arc<RouteStats> {
        let routes = &generation.routes;
        let id = (0..routes.node_count())
            .position(|id| routes.node_name(id as NodeId) == name)
            .expect("a node of that name");
        generation.route_stats[id].clone()
    }

    /// A policy route keeps its counters across generations (a reload does not reset its
    /// failovers), a generation carries a counter row per pool, and a generation no worker
    /// has switched to is not acknowledged.
    #[test]
    fn counters_outlive_a_generation_by_name() {
        let shared = Arc::new(Metrics::new(1));
        let (publisher, _workers) = Publisher::new(shared, plan("main"));
        assert!(
            publisher.current().route_stats.is_empty(),
            "the first is bare"
        );

        let (first, _) = publisher.publish(plan("main_then_standby"));
        let counted = counters_of(&first, "main_then_standby");
        assert_eq!(first.server_stats.len(), 2, "a row per pool");
        assert!(Arc::ptr_eq(&publisher.current(), &first));

        let (second, acks) = publisher.publish(plan("main_then_standby"));
        let kept = counters_of(&second, "main_then_standby");
        assert!(Arc::ptr_eq(&kept, &counted));
        assert!(acks.try_recv().is_err(), "no worker has switched yet");
    }
}
