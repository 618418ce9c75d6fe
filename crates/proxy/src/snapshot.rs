//! One generation as one worker serves it: the route table, this worker's connections to
//! every server (pools x servers x `connections`), the ejecting pools' reduced rings, the
//! shadow routes' in-flight counts and the counters requests bump.
//!
//! ```text
//!   Generation (shared, from control) --RouteSnapshot::build(old)--> Rc<RouteSnapshot>
//!        connections to servers whose settings did not change are taken over from `old`
//! ```
//!
//! Every request takes one `Rc` of the snapshot current when it was read and keeps it until
//! it is answered, so a reload never changes a request's routing half-way, and a removed
//! server's connections close once the last request holding them is answered.
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memroute_backend::{
    spawn_connection, BackendError, BackendHandle, ConnectionSettings, ServerHealth,
};
use memroute_config::PoolConfig;
use memroute_net::Connector;
use memroute_protocol::auth::Authfile;
use memroute_protocol::Limits;
use memroute_routing::{NodeId, Placement, RouteTable};

use crate::counters::{RouteStats, ServerStats, ShadowStats};
use crate::generation::Generation;
use crate::hot_keys::WorkerHotKeys;
use crate::key_turns::KeyTurns;
use crate::pool_settings::max_ejected;
use crate::read_order::NearestRoutes;
use crate::resize_window::Window;
use crate::stats::{round_trip_observer, RouteMetrics, WorkerMetrics};

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
    /// `ConnectionSettings::coalesce_keys`.
    coalesce_keys: usize,
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

    /// The same connections, for a resize window's previous placement.
    fn share(&self) -> ServerConnections {
        ServerConnections {
            connections: self.connections.clone(),
            stats: self.stats.clone(),
            health: self.health.clone(),
            key: self.key.clone(),
        }
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
    /// Gets collapsed onto an identical one in flight (`collapse`); `None` when the pool
    /// has `collapse_gets = false`.
    pub collapsed: Option<prometheus::IntCounter>,
    /// Gets of hot keys answered from a copy (`hot_cache`); `None` without `hot_cache`.
    pub hot_cache: Option<crate::hot_cache::HotCache>,
    /// Set for pools with `eject = true`: the ring without the down servers.
    ejection: Option<Ejection>,
    /// While a resize window runs: the placement before the server list changed.
    pub previous: Option<Box<Previous>>,
}

/// A pool's placement before its server list changed, as one worker serves it during the
/// resize window (`route::resize`).
#[derive(Debug)]
pub(crate) struct Previous {
    pub window: Arc<Window>,
    /// Indexed like the window's servers.
    pub servers: Vec<ServerConnections>,
    /// Per previous server: its index in the pool now, when it stays.
    pub stays: Vec<Option<usize>>,
    /// Requests on a key whose owner changed run one after another (`key_turns`).
    pub turns: KeyTurns,
}

impl Previous {
    fn build<'o>(
        window: &Arc<Window>,
        now: &PoolConnections,
        reusable: &mut HashMap<&'o ConnectionKey, Vec<&'o ServerConnections>>,
        limits: Limits,
        metrics: &WorkerMetrics,
    ) -> Previous {
        let stays: Vec<Option<usize>> = window
            .config
            .servers
            .iter()
            .map(|old| {
                now.servers
                    .iter()
                    .position(|s| s.key.address == old.address)
            })
            .collect();
        let servers = window
            .config
            .servers
            .iter()
            .zip(&window.servers)
            .zip(&stays)
            .map(|((server, old), stays)| match stays {
                Some(index) => now.servers[*index].share(),
                None => ServerOf {
                    pool_name: &now.name,
                    pool: &window.config,
                    address: &server.address,
                    health: old.health.clone(),
                    connector: old.connector.clone(),
                    stats: old.stats.clone(),
                }
                .connections(reusable, limits, metrics),
            })
            .collect();
        Previous {
            window: window.clone(),
            servers,
            stays,
            turns: KeyTurns::default(),
        }
    }

    /// The previous owner of `key` and, when it is still in the pool, its index there.
    #[inline]
    pub(crate) fn owner(&self, key: &[u8]) -> (usize, Option<usize>) {
        let old = self.window.placement.server_for(key);
        (old, self.stays.get(old).copied().flatten())
    }
}

/// One server to build connections for (`ServerOf::connections`).
struct ServerOf<'a> {
    pool_name: &'a str,
    pool: &'a PoolConfig,
    address: &'a str,
    health: Arc<ServerHealth>,
    connector: Arc<Connector>,
    stats: ServerStats,
}

impl ServerOf<'_> {
    /// This server's connections: taken over from the previous snapshot when one there
    /// has the same `ConnectionKey`, else new.
    fn connections(
        self,
        reusable: &mut HashMap<&ConnectionKey, Vec<&ServerConnections>>,
        limits: Limits,
        metrics: &WorkerMetrics,
    ) -> ServerConnections {
        let ServerOf {
            pool_name: name,
            pool,
            address,
            health,
            connector,
            stats,
        } = self;
        let key = ConnectionKey {
            health: Arc::as_ptr(&health) as usize,
            connector: Arc::as_ptr(&connector) as usize,
            pool: name.to_string(),
            address: address.to_string(),
            timeout: pool.timeout,
            connect_timeout: pool.connect_timeout,
            connections: pool.connections.max(1),
            limits: (
                limits.max_key_len,
                limits.max_line_len,
                limits.max_value_len,
            ),
            coalesce_keys: match pool.coalesce_gets {
                true => pool.max_keys_per_request,
                false => 0,
            },
        };
        let connections = match reusable.get_mut(&key).and_then(Vec::pop) {
            Some(kept) => kept.connections.clone(),
            None => {
                let settings = ConnectionSettings {
                    address: Arc::from(address),
                    connector,
                    timeout: pool.timeout,
                    connect_timeout: pool.connect_timeout,
                    backoff_min: memroute_backend::RECONNECT_BACKOFF_MIN,
                    backoff_max: memroute_backend::RECONNECT_BACKOFF_MAX,
                    limits,
                    health: health.clone(),
                    round_trips: Some(round_trip_observer(metrics.round_trip(name, address))),
                    coalesce_keys: key.coalesce_keys,
                };
                (0..key.connections)
                    .map(|_| spawn_connection(settings.clone()))
                    .collect()
            }
        };
        ServerConnections {
            connections,
            stats,
            health,
            key,
        }
    }
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
pub(crate) struct RouteSnapshot {
    pub routes: Arc<RouteTable>,
    /// Indexed by pool id (the route table's order).
    pub pools: Vec<PoolConnections>,
    /// Whether any pool has a resize window: requests then take the general walk, where
    /// `route::resize` looks for moved keys on their old owners.
    pub resizing: bool,
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
    /// This worker's sampler of the keys placed (`server_for`, `servers_for`).
    hot_keys: Rc<WorkerHotKeys>,
    /// The read order of each replicated route reading `nearest`.
    pub nearest: NearestRoutes,
    /// Per entry of `proxy.listen`: the authfile its clients log in against, if it wants
    /// a login.
    client_logins: Vec<Option<Arc<Authfile>>>,
}

impl RouteSnapshot {
    /// The authfile the clients of the `listener`-th entry of `proxy.listen` must log in
    /// against; `None` when its clients need no login.
    pub(crate) fn login_of(&self, listener: usize) -> Option<&Authfile> {
        self.client_logins.get(listener)?.as_deref()
    }

    /// The root route of the `listener`-th entry of `proxy.listen`.
    #[inline]
    pub(crate) fn root_of(&self, listener: usize) -> NodeId {
        self.routes.root_of(listener)
    }

    /// The server of `pool` that serves `key`, with down servers of an ejecting pool left
    /// out of the ring. `None` when the pool has no servers (a DNS pool not resolved yet).
    /// A query: nothing is counted or sampled (`sent_to` does that for a request sent).
    #[inline]
    pub(crate) fn server_for(&self, pool: usize, key: &[u8]) -> Option<usize> {
        if self.pools[pool].servers.is_empty() {
            return None;
        }
        Some(self.placing(pool, |placement| placement.server_for(key)))
    }

    /// [`RouteSnapshot::server_for`] of each of `keys`, into `servers` (as long as `keys`),
    /// placed together (`Placement::servers_for`: a multi-get's keys hashed four at a
    /// time). False when the pool has no servers.
    pub(crate) fn servers_for(&self, pool: usize, keys: &[&[u8]], servers: &mut [u32]) -> bool {
        if self.pools[pool].servers.is_empty() {
            return false;
        }
        self.placing(pool, |placement| placement.servers_for(keys, servers));
        true
    }

    /// `place` with the placement `pool`'s keys go by now: its ring, or, in an ejecting
    /// pool with servers down, the ring of its live servers (rebuilt when the pool's
    /// epoch moved since it was built).
    #[inline]
    fn placing<R>(&self, pool: usize, place: impl FnOnce(&Placement) -> R) -> R {
        let connections = &self.pools[pool];
        let placement = &self.routes.placements[pool];
        let Some(ejection) = &connections.ejection else {
            return place(placement);
        };
        let epoch = ejection.epoch.load(std::sync::atomic::Ordering::Acquire);
        if ejection.live.borrow().0 != epoch {
            let reduced = reduced_placement(ejection, &connections.servers);
            *ejection.live.borrow_mut() = (epoch, reduced);
        }
        match &ejection.live.borrow().1 {
            Some(reduced) => place(reduced),
            None => place(placement),
        }
    }

    /// Whether the key of hash `key_hash` (`hot_keys::hash`) is hot on this worker now
    /// (`hot_cache`, a multi-get's key that may lead: `collapse`).
    pub(crate) fn is_hot(&self, key_hash: u64, now: Instant) -> bool {
        self.hot_keys.is_hot(key_hash, now)
    }

    /// This worker's hot-key sampler: which keys it found hot (`collapse::MultiGetKeys`).
    #[inline]
    pub(crate) fn hot_keys(&self) -> &WorkerHotKeys {
        &self.hot_keys
    }

    /// A client's request for `key` was sent to `server` of `pool`: the hot-key sampler
    /// sees it (about one in `admin.hot_keys_sample`). Called where requests are sent, so
    /// lookups (`/route`, `__mcrouter__.route`) and a resize window's own moves are not
    /// traffic.
    #[inline]
    pub(crate) fn sent_to(&self, pool: usize, key: &[u8], server: usize) {
        self.hot_keys.observe(&self.pools[pool].name, key, server);
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
    pub(crate) fn build(
        generation: &Generation,
        old: Option<&RouteSnapshot>,
        metrics: &WorkerMetrics,
    ) -> RouteSnapshot {
        let config = &generation.config;
        let limits = Limits {
            max_key_len: memroute_protocol::MAX_KEY_LEN,
            max_line_len: config.proxy.max_line_size,
            max_value_len: config.proxy.max_value_size,
        };
        let mut reusable = reusable_connections(old);
        // Pool ids follow the route table's pool order (Config::pools is a BTreeMap, sorted).
        let mut pools = generation
            .routes
            .pool_names
            .iter()
            .enumerate()
            .filter_map(|(id, name)| Some((id, name, config.pools.get(name)?)))
            .map(|(id, name, pool)| {
                pool_connections(generation, id, name, pool, &mut reusable, limits, metrics)
            })
            .collect::<Vec<_>>();
        // Resize windows: the previous placement's servers, sharing the connections of
        // servers that stay and keeping those of servers that left.
        for (id, window) in generation.windows.iter().enumerate() {
            let (Some(window), Some(connections)) = (window, pools.get_mut(id)) else {
                continue;
            };
            let previous = Previous::build(window, connections, &mut reusable, limits, metrics);
            connections.previous = Some(Box::new(previous));
        }
        let resizing = pools.iter().any(|p| p.previous.is_some());
        let nearest = NearestRoutes::build(
            config,
            &generation.routes,
            |pool, server| {
                let pool: &PoolConnections = pools.get(pool)?;
                Some(pool.servers.get(server)?.health.clone())
            },
            |pool, address| metrics.round_trip_totals(pool, address),
            |route, child| {
                let old = old?;
                old.nearest.latency_named(&old.routes, route, child)
            },
            std::time::Instant::now(),
        );
        let shadows = shadow_states(generation, old);
        RouteSnapshot {
            routes: generation.routes.clone(),
            pools,
            resizing,
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
            nearest,
            client_logins: generation.client_logins.clone(),
            metrics: metrics.for_routes(&generation.routes),
            hot_keys: {
                crate::hot_cache::set_enabled(config.pools.values().any(|p| p.hot_cache.is_some()));
                let settings = crate::hot_keys::Settings::of(config);
                metrics.shared.hot_keys.set_settings(settings);
                metrics.hot_keys.configure(settings);
                metrics.hot_keys.clone()
            },
        }
    }
}

/// Every server connection of `old` (its pools' servers and their windows' previous
/// ones), by what must be unchanged for a new snapshot to take it over.
fn reusable_connections(old: Option<&RouteSnapshot>) -> Reusable<'_> {
    let mut reusable: Reusable<'_> = HashMap::new();
    let old_servers = old.iter().flat_map(|o| &o.pools).flat_map(|p| {
        let previous = p.previous.iter().flat_map(|w| &w.servers);
        p.servers.iter().chain(previous)
    });
    for server in old_servers {
        reusable.entry(&server.key).or_default().push(server);
    }
    reusable
}

/// Connections a new snapshot may take over (`reusable_connections`).
type Reusable<'o> = HashMap<&'o ConnectionKey, Vec<&'o ServerConnections>>;

/// Pool `id` (`name`, `pool`) of `generation`: its servers' connections (taken over from
/// `reusable` where unchanged), with the generation's health, connector and counters of
/// each (standalone ones for a generation built without them), and its per-pool settings.
fn pool_connections(
    generation: &Generation,
    id: usize,
    name: &String,
    pool: &PoolConfig,
    reusable: &mut Reusable<'_>,
    limits: Limits,
    metrics: &WorkerMetrics,
) -> PoolConnections {
    PoolConnections {
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
                let stats = generation
                    .server_stats
                    .get(id)
                    .and_then(|p| p.get(index))
                    .cloned()
                    .unwrap_or_else(|| metrics.shared.server_stats(name, &server.address));
                let server = ServerOf {
                    pool_name: name,
                    pool,
                    address: &server.address,
                    health,
                    connector,
                    stats,
                };
                server.connections(reusable, limits, metrics)
            })
            .collect(),
        max_keys_per_request: pool.max_keys_per_request.max(1),
        collapsed: pool
            .collapse_gets
            .then(|| metrics.shared.collapsed_gets(name)),
        hot_cache: pool.hot_cache.map(|settings| {
            crate::hot_cache::HotCache::new(settings, metrics.shared.hot_cache(name))
        }),
        name: Arc::from(name.as_str()),
        ejection: (pool.eject && !pool.servers.is_empty()).then(|| Ejection {
            config: pool.clone(),
            epoch: generation.pool_epochs.get(id).cloned().unwrap_or_default(),
            max_ejected: max_ejected(pool),
            live: RefCell::new((u64::MAX, None)),
        }),
        previous: None,
    }
}

/// Per shadow route of `generation`: its counters, and the copies in flight it shares
/// with `old`'s state of the same route (copies sent before a reload still count against
/// `max_in_flight` after it).
fn shadow_states(generation: &Generation, old: Option<&RouteSnapshot>) -> Vec<ShadowState> {
    generation
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
        .collect()
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
/// generations the controller plans; keeps `RouteSnapshot::build` total).
fn standalone_health(pool: &str, config: &PoolConfig, address: &str) -> Arc<ServerHealth> {
    ServerHealth::new(
        Arc::from(pool),
        Arc::from(address),
        memroute_backend::HealthSettings::of_pool(config),
        Default::default(),
    )
}

/// One worker's view of a shadow route: its copies in flight and the shared counters.
#[derive(Debug)]
pub(crate) struct ShadowState {
    pub name: String,
    /// Shared with the next generation's state of the same route: copies sent before a
    /// reload still count against `max_in_flight` after it.
    pub in_flight: Rc<std::cell::Cell<usize>>,
    pub stats: Arc<ShadowStats>,
}
