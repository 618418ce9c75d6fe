//! One worker thread: its own current-thread runtime, listeners, sessions and
//! backend connections. Workers share only the route table and the stats shards.
//!
//! A reload arrives as a new [`Generation`] on a watch channel. The worker builds a new
//! [`Routing`] off to the side (keeping the connections of servers whose connection
//! settings did not change) and swaps it in; every request takes one `Rc` snapshot of
//! the routing current when it was read, so requests in flight finish on the routing
//! they started with, and a removed server's connections close once the last request
//! holding them is answered.
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use memroute_backend::{
    spawn_connection, BackendError, BackendHandle, ConnectionSettings, ServerHealth,
};
use memroute_config::{Config, PoolConfig};
use memroute_protocol::Limits;
use memroute_routing::{NodeId, Placement, RouteTable};
use tokio::sync::{mpsc, watch};

use crate::execute::{RouteStats, ShadowState, ShadowStats};
use crate::stats::{
    round_trip_observer, RouteMetrics, ServerStats, ServerStatsTable, SharedStats, WorkerMetrics,
};
use memroute_net::{BoundListener, Connector, Listener};

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
    /// Each worker sends its index once it serves new requests with this generation.
    pub applied: std::sync::mpsc::Sender<usize>,
}

/// Everything a worker needs, handed over from the main thread.
pub(crate) struct Worker {
    pub index: usize,
    pub generation: watch::Receiver<Arc<Generation>>,
    pub listeners: Vec<BoundListener>,
    pub shared: Arc<SharedStats>,
    pub shutdown: watch::Receiver<bool>,
}

/// What makes two configs' connections to a server interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ConnectionKey {
    /// The health object the connections report to (a new one means new connections).
    health: usize,
    /// The connector they connect through (new TLS settings mean new connections).
    connector: usize,
    pool: String,
    address: String,
    timeout: Duration,
    connect_timeout: Duration,
    connections: usize,
    limits: (usize, usize, usize),
}

/// The connections of one server, owned by one worker.
#[derive(Debug)]
pub(crate) struct ServerConnections {
    connections: Vec<BackendHandle>,
    /// This server's error and timeout counters (touched only when a request fails).
    pub stats: ServerStats,
    pub health: Arc<ServerHealth>,
    key: ConnectionKey,
}

impl ServerConnections {
    /// The connection client session `slot` uses. One session always uses the same
    /// connection to a server: memcached serves its connections on different threads, so
    /// a pipelined `set` and the `get` behind it sent on two connections could run in
    /// either order.
    #[inline]
    pub(crate) fn pick(&self, slot: usize) -> &BackendHandle {
        &self.connections[slot % self.connections.len()]
    }

    /// Counts a failed request against this server's error or timeout counter.
    pub(crate) fn count_failure(&self, error: &BackendError) {
        let counter = if error.is_timeout() {
            &self.stats.timeouts
        } else {
            &self.stats.errors
        };
        counter.inc();
    }
}

#[derive(Debug)]
pub(crate) struct PoolConnections {
    pub name: Arc<str>,
    pub servers: Vec<ServerConnections>,
    pub max_keys_per_request: usize,
    /// Set for pools with `eject = true`: the ring without the down servers.
    ejection: Option<Ejection>,
}

/// A pool that takes down servers out of its ring. Each worker keeps its own copy of the
/// reduced ring and rebuilds it when the pool's epoch moves (a server went down or up), so
/// the request path costs one relaxed load while nothing changes.
#[derive(Debug)]
struct Ejection {
    config: PoolConfig,
    epoch: Arc<std::sync::atomic::AtomicU64>,
    max_ejected: usize,
    /// (epoch it was built for, the reduced placement or None when nothing is ejected).
    live: RefCell<(u64, Option<Rc<Placement>>)>,
}

/// One config as a worker serves it: the route table and this worker's connections.
#[derive(Debug)]
pub(crate) struct Routing {
    pub routes: Arc<RouteTable>,
    /// Indexed by pool id (the route table's order).
    pub pools: Vec<PoolConnections>,
    pub limits: Limits,
    pub max_client_pending: usize,
    pub max_connections: usize,
    pub shutdown_timeout: Duration,
    pub reply_budget: crate::budget::BudgetSettings,
    /// Per route node id (pools included): policy counters.
    route_stats: Vec<Arc<RouteStats>>,
    /// Per shadow index: this worker's copies in flight and the shared counters.
    pub shadows: Vec<ShadowState>,
    /// This worker's request counts and latencies by route node, for this config.
    pub metrics: Rc<RouteMetrics>,
}

impl Routing {
    /// The server of `pool` that serves `key`, with down servers of an ejecting pool left
    /// out of the ring. `None` when the pool has no servers (a DNS pool not resolved yet).
    #[inline]
    pub(crate) fn server_for(&self, pool: usize, key: &[u8]) -> Option<usize> {
        let connections = &self.pools[pool];
        if connections.servers.is_empty() {
            return None;
        }
        let placement = &self.routes.placements[pool];
        let Some(ejection) = &connections.ejection else {
            return Some(placement.server_for(key));
        };
        let epoch = ejection.epoch.load(std::sync::atomic::Ordering::Acquire);
        if ejection.live.borrow().0 != epoch {
            let reduced = reduced_placement(ejection, &connections.servers);
            *ejection.live.borrow_mut() = (epoch, reduced);
        }
        let live = ejection.live.borrow();
        Some(match &live.1 {
            Some(reduced) => reduced.server_for(key),
            None => placement.server_for(key),
        })
    }

    /// The error for a request to a pool without servers.
    pub(crate) fn no_servers(&self, pool: usize) -> BackendError {
        let name = &self.pools[pool].name;
        BackendError::Unavailable {
            server: name.clone(),
            reason: Arc::from("pool has no servers (DNS discovery found none yet)"),
        }
    }

    /// The counters of route node `node` (a spare set for a node built without any).
    pub(crate) fn route_stats(&self, node: NodeId) -> &RouteStats {
        static UNCOUNTED: std::sync::OnceLock<RouteStats> = std::sync::OnceLock::new();
        self.route_stats
            .get(node as usize)
            .map(|s| &**s)
            .unwrap_or_else(|| UNCOUNTED.get_or_init(RouteStats::default))
    }

    /// Builds the routing for `generation`, reusing `old`'s connections to every server
    /// whose pool, address and connection settings are unchanged.
    fn build(generation: &Generation, old: Option<&Routing>, metrics: &WorkerMetrics) -> Routing {
        let config = &generation.config;
        let limits = Limits {
            max_key_len: 250,
            max_line_len: config.proxy.max_line_size,
            max_value_len: config.proxy.max_value_size,
        };
        let mut reusable: HashMap<&ConnectionKey, Vec<&ServerConnections>> = HashMap::new();
        for server in old.iter().flat_map(|o| &o.pools).flat_map(|p| &p.servers) {
            reusable.entry(&server.key).or_default().push(server);
        }
        // Pool ids follow the route table's pool order (Config::pools is a BTreeMap, sorted).
        let pools = generation
            .routes
            .pool_names
            .iter()
            .enumerate()
            .filter_map(|(id, name)| Some((id, name, config.pools.get(name)?)))
            .map(|(id, name, pool)| PoolConnections {
                servers: pool
                    .servers
                    .iter()
                    .enumerate()
                    .map(|(index, server)| {
                        let health = generation
                            .health
                            .get(id)
                            .and_then(|p| p.get(index))
                            .cloned()
                            .unwrap_or_else(|| standalone_health(name, pool, &server.address));
                        let connector = generation
                            .connectors
                            .get(id)
                            .and_then(|p| p.get(index))
                            .cloned()
                            .unwrap_or_else(|| Arc::new(Connector::plain(&server.address)));
                        let key = ConnectionKey {
                            health: Arc::as_ptr(&health) as usize,
                            connector: Arc::as_ptr(&connector) as usize,
                            pool: name.clone(),
                            address: server.address.clone(),
                            timeout: pool.timeout,
                            connect_timeout: pool.connect_timeout,
                            connections: pool.connections.max(1),
                            limits: (
                                limits.max_key_len,
                                limits.max_line_len,
                                limits.max_value_len,
                            ),
                        };
                        let connections = match reusable.get_mut(&key).and_then(Vec::pop) {
                            Some(kept) => kept.connections.clone(),
                            None => {
                                let settings = ConnectionSettings {
                                    address: Arc::from(server.address.as_str()),
                                    connector,
                                    timeout: pool.timeout,
                                    connect_timeout: pool.connect_timeout,
                                    backoff_min: memroute_backend::RECONNECT_BACKOFF_MIN,
                                    backoff_max: memroute_backend::RECONNECT_BACKOFF_MAX,
                                    limits,
                                    health: health.clone(),
                                    round_trips: Some(round_trip_observer(
                                        metrics.round_trip(name, &server.address),
                                    )),
                                };
                                (0..key.connections)
                                    .map(|_| spawn_connection(settings.clone()))
                                    .collect()
                            }
                        };
                        let stats = generation
                            .server_stats
                            .get(id)
                            .and_then(|p| p.get(index))
                            .cloned()
                            .unwrap_or_else(|| metrics.shared.server_stats(name, &server.address));
                        ServerConnections {
                            connections,
                            stats,
                            health,
                            key,
                        }
                    })
                    .collect(),
                max_keys_per_request: pool.max_keys_per_request.max(1),
                name: Arc::from(name.as_str()),
                ejection: (pool.eject && !pool.servers.is_empty()).then(|| Ejection {
                    config: pool.clone(),
                    epoch: generation.pool_epochs.get(id).cloned().unwrap_or_default(),
                    max_ejected: max_ejected(pool),
                    live: RefCell::new((u64::MAX, None)),
                }),
            })
            .collect();
        let shadows = generation
            .shadow_stats
            .iter()
            .zip(&generation.routes.shadow_names)
            .map(|(stats, name)| ShadowState {
                name: name.clone(),
                in_flight: old
                    .and_then(|o| o.shadows.iter().find(|s| &s.name == name))
                    .map(|s| s.in_flight.clone())
                    .unwrap_or_default(),
                stats: stats.clone(),
            })
            .collect();
        Routing {
            routes: generation.routes.clone(),
            pools,
            limits,
            max_client_pending: config.proxy.max_client_pending.max(1),
            max_connections: config.proxy.max_connections,
            shutdown_timeout: config.proxy.shutdown_timeout,
            reply_budget: crate::budget::BudgetSettings {
                max_buffered_replies: config.proxy.max_buffered_replies,
                slow_client_timeout: config.proxy.slow_client_timeout,
            },
            route_stats: generation.route_stats.clone(),
            shadows,
            metrics: metrics.for_routes(&generation.routes),
        }
    }
}

/// How many of `pool`'s servers may be out of its ring at once.
pub(crate) fn max_ejected(pool: &PoolConfig) -> usize {
    let fraction = pool.max_ejected_fraction.clamp(0.0, 1.0);
    // Never all of them: a pool with every server ejected would have no ring at all.
    ((pool.servers.len() as f64 * fraction).floor() as usize)
        .min(pool.servers.len().saturating_sub(1))
}

/// The ring of an ejecting pool without its down servers (at most `max_ejected` of them,
/// first in config order; the others stay in and fail fast). `None` when none is out.
fn reduced_placement(ejection: &Ejection, servers: &[ServerConnections]) -> Option<Rc<Placement>> {
    let mut ejected = 0;
    let live: Vec<bool> = servers
        .iter()
        .map(|s| {
            if s.health.is_down() && ejected < ejection.max_ejected {
                ejected += 1;
                false
            } else {
                true
            }
        })
        .collect();
    (ejected > 0).then(|| {
        Rc::new(Placement::with_live(
            &ejection.config.placement_spec(),
            &live,
        ))
    })
}

/// A health object for a server the generation has none for (never the case for
/// generations built by the controller; keeps `Routing::build` total).
fn standalone_health(pool: &str, config: &PoolConfig, address: &str) -> Arc<ServerHealth> {
    ServerHealth::new(
        Arc::from(pool),
        Arc::from(address),
        crate::control::health_settings(config),
        Default::default(),
    )
}

/// Per-worker state every session of the worker reads.
#[derive(Debug)]
pub(crate) struct WorkerContext {
    pub index: usize,
    /// The routing new requests use; replaced (never mutated) on reload.
    routing: RefCell<Rc<Routing>>,
    /// The slot the next client session gets (which of `connections` it uses).
    next_slot: Cell<usize>,
    pub metrics: Rc<WorkerMetrics>,
    /// The worker's client sessions, for shutdown to reach the idle ones.
    pub sessions: crate::session::Sessions,
}

impl WorkerContext {
    /// A context serving `generation` from the start, outside a `Worker` (the session
    /// fuzzing harness builds one per case).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn for_generation(
        index: usize,
        generation: &Generation,
        shared: Arc<SharedStats>,
    ) -> WorkerContext {
        let metrics = Rc::new(WorkerMetrics::new(index, shared));
        WorkerContext {
            index,
            routing: RefCell::new(Rc::new(Routing::build(generation, None, &metrics))),
            next_slot: Cell::new(0),
            metrics,
            sessions: Default::default(),
        }
    }

    pub(crate) fn stats(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// A connection slot for a new client session: sessions take turns.
    pub(crate) fn session_slot(&self) -> usize {
        let slot = self.next_slot.get();
        self.next_slot.set(slot.wrapping_add(1));
        slot
    }

    /// A snapshot of the current routing. Do not hold it across an idle wait: a snapshot
    /// keeps the connections of servers a reload removed open.
    pub(crate) fn routing(&self) -> Rc<Routing> {
        self.routing.borrow().clone()
    }
}

impl Worker {
    pub(crate) fn run(self) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::error!(worker = self.index, %error, "cannot build the worker runtime");
                return;
            }
        };
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, self.serve());
    }

    async fn serve(mut self) {
        let first = self.generation.borrow_and_update().clone();
        let metrics = Rc::new(WorkerMetrics::new(self.index, self.shared.clone()));
        let context = Rc::new(WorkerContext {
            index: self.index,
            routing: RefCell::new(Rc::new(Routing::build(&first, None, &metrics))),
            next_slot: Cell::new(0),
            metrics: metrics.clone(),
            sessions: Default::default(),
        });
        drop(first);
        let flusher = tokio::task::spawn_local(metrics.run_flusher());
        let reloads =
            tokio::task::spawn_local(apply_reloads(context.clone(), self.generation.clone()));
        // Every session holds a clone of `alive`; when all are dropped, `all_done` yields None.
        let (alive, mut all_done) = mpsc::channel::<()>(1);
        let mut accepts = Vec::new();
        for listener in self.listeners {
            let context = context.clone();
            let shutdown = self.shutdown.clone();
            let alive = alive.clone();
            accepts.push(tokio::task::spawn_local(accept_loop(
                listener, context, shutdown, alive,
            )));
        }
        drop(alive);
        for accept in accepts {
            let _ = accept.await;
        }
        // Every accept loop ended on shutdown: idle sessions close, busy ones once idle.
        context.sessions.drain();
        // Listeners are closed; wait for sessions to finish what they have in flight, but
        // not forever: a client that stopped reading would hold the process hostage.
        let shutdown_timeout = context.routing().shutdown_timeout;
        tokio::select! {
            _ = all_done.recv() => {}
            _ = tokio::time::sleep(shutdown_timeout) => {
                tracing::warn!(worker = self.index, timeout = ?shutdown_timeout, "shutdown_timeout passed; closing connections still in use");
            }
        }
        reloads.abort();
        flusher.abort();
        context.metrics.flush();
        tracing::debug!(worker = self.index, "worker stopped");
    }
}

/// Swaps in each new generation's routing until the sender is gone.
async fn apply_reloads(
    context: Rc<WorkerContext>,
    mut generation: watch::Receiver<Arc<Generation>>,
) {
    while generation.changed().await.is_ok() {
        let next = generation.borrow_and_update().clone();
        let routing = Rc::new(Routing::build(
            &next,
            Some(&context.routing()),
            &context.metrics,
        ));
        // The old routing lives on in the snapshots of requests still in flight.
        *context.routing.borrow_mut() = routing;
        tracing::debug!(worker = context.index, "worker switched to the new config");
        let _ = next.applied.send(context.index);
    }
}

async fn accept_loop(
    listener: BoundListener,
    context: Rc<WorkerContext>,
    mut shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    let name = listener.describe();
    let accepted = context.metrics.shared.listener_event(&name, "accepted");
    let events = Rc::new(crate::client_log::ListenerEvents::new(
        &context.metrics.shared,
        &name,
    ));
    let listener = match Listener::attach(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(listener = %name, %error, "cannot attach listener to the runtime");
            return;
        }
    };
    loop {
        tokio::select! {
            outcome = listener.accept() => match outcome.inspect(|_| accepted.inc()) {
                // The TLS handshake runs in the session's task: a slow or silent client
                // holds up nobody else (bounded by tls_handshake_timeout, counted).
                Ok(incoming) => spawn_session(&context, &alive, &events, incoming),
                Err(error) => accept_error(&name, error).await,
            },
            _ = shutdown.changed() => break,
        }
    }
}

/// Out of file descriptors and similar: log, and pause briefly so a full fd table
/// does not become a busy loop.
async fn accept_error(name: &str, error: std::io::Error) {
    tracing::warn!(listener = %name, %error, "accept failed");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

fn spawn_session<C>(
    context: &Rc<WorkerContext>,
    alive: &mpsc::Sender<()>,
    events: &Rc<crate::client_log::ListenerEvents>,
    connection: C,
) where
    C: crate::session::ClientConnection + 'static,
{
    // Connection counts are shared atomics: touched per connection, never per request.
    let shared = &context.metrics.shared;
    let open = shared.connections_current.get();
    let max_connections = context.routing.borrow().max_connections;
    if max_connections > 0 && open >= max_connections as i64 {
        shared.connections_rejected.inc();
        // Dropping the connection closes it, as memcached does at its limit.
        return;
    }
    shared.connections_current.inc();
    shared.connections_total.inc();
    let open =
        crate::session::OpenSession::new(context.clone(), alive.clone(), Some(events.clone()));
    // The session future is the task itself, built here and stored once: wrapping it in
    // another async block (or capturing it and then awaiting it) stores its arguments or
    // the whole future twice in the task cell.
    tokio::task::spawn_local(crate::session::run(open, connection));
}
