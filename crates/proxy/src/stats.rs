//! Every number memroute reports comes from one `prometheus::Registry`: `/metrics` encodes
//! it in the text exposition format, and the `stats` command renders the same gathered
//! families as memcached's `STAT name value` lines, so the two cannot drift apart.
//!
//! ```text
//!  worker (hot path, no atomics): Cell<u64> counters + LocalHistogram per route / server
//!     | flush: every FLUSH_INTERVAL, and on demand (a scrape or `stats` asks every worker)
//!     v
//!  Metrics.registry  <- shared IntCounter / Histogram families (atomics, touched on flush)
//!                    <- StateCollector: health, policy routes, shadows, DNS, pools (read on gather)
//!     | gather()
//!     +--> admin `/metrics` (TextEncoder: label values escaped)
//!     +--> `stats` (render_stats: legacy STAT names for memcached tools)
//! ```
//!
//! Metric names follow `memroute_<component>_<event>_<unit>`.
//!
//! The plain shared counters (`ServerStats`, `RouteStats`, `ShadowStats`, `ReplyBudget`,
//! `ReloadCounts`) are in `counters`, which this module reads on gather; this module
//! imports nothing of the request path (see docs/architecture.md, "Modules of
//! memroute-proxy").
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memroute_backend::ServerHealth;
use memroute_config::Config;
use memroute_protocol::Command;
use memroute_routing::{NodeId, RouteTable};
use prometheus::core::{Collector, Desc};
use prometheus::local::LocalHistogram;
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use tokio::sync::{watch, Notify};

use crate::counters::{
    ReloadCounts, ReplyBudget, RouteStats, ServerStats, ServerStatsTable, ShadowStats,
};
use crate::hot_keys::{HotKeyRegistry, Report, WorkerHotKeys};
use crate::request_watch::{WatchCounters, WatchHub};

/// How often a worker moves its local counts into the shared registry on its own.
/// Scrapes and `stats` do not wait for it: they ask every worker to flush first.
pub(crate) const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// How long a scrape or `stats` waits for busy workers to flush before it answers anyway.
pub(crate) const FLUSH_WAIT: Duration = Duration::from_millis(200);

/// Latency buckets in seconds: 25 µs .. 2.5 s, a 1-2.5-5 ladder (proxy overhead is tens of
/// microseconds, a backend timeout hundreds of milliseconds).
const LATENCY_BUCKETS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5,
];

/// The `route` label of requests memroute answers itself (version, stats, errors, ...).
pub(crate) const LOCAL_ROUTE: &str = "(proxy)";

/// Every command's label, indexed by [`command_index`].
const COMMAND_NAMES: [&str; 26] = [
    "get",
    "gets",
    "gat",
    "gats",
    "set",
    "add",
    "replace",
    "append",
    "prepend",
    "cas",
    "delete",
    "incr",
    "decr",
    "touch",
    "flush_all",
    "version",
    "verbosity",
    "stats",
    "quit",
    "shutdown",
    "mg",
    "ms",
    "md",
    "ma",
    "mn",
    "me",
];

/// The position of `command`'s label in [`COMMAND_NAMES`].
#[inline]
pub(crate) fn command_index(command: Command) -> usize {
    match command {
        Command::Get => 0,
        Command::Gets => 1,
        Command::Gat => 2,
        Command::Gats => 3,
        Command::Set => 4,
        Command::Add => 5,
        Command::Replace => 6,
        Command::Append => 7,
        Command::Prepend => 8,
        Command::Cas => 9,
        Command::Delete => 10,
        Command::Incr => 11,
        Command::Decr => 12,
        Command::Touch => 13,
        Command::FlushAll => 14,
        Command::Version => 15,
        Command::Verbosity => 16,
        Command::Stats => 17,
        Command::Quit => 18,
        Command::Shutdown => 19,
        Command::MetaGet => 20,
        Command::MetaSet => 21,
        Command::MetaDelete => 22,
        Command::MetaArithmetic => 23,
        Command::MetaNoop => 24,
        Command::MetaDebug => 25,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shared side of the metrics: the registry and the families workers flush into.
#[derive(Debug)]
pub(crate) struct Metrics {
    pub started: Instant,
    pub workers: usize,
    /// Every worker's hot-key sketches (`/hotkeys`, `stats`, the top key's share).
    pub hot_keys: Arc<HotKeyRegistry>,
    /// The live watches of requests (`GET /watch`), which every worker looks at.
    pub watch: Arc<WatchHub>,
    pub registry: Registry,
    pub connections_current: IntGauge,
    /// Open client connections, for admission against `max_connections`: one atomic
    /// add both counts and checks a connection, so workers accepting at once cannot
    /// together pass the limit (the gauge above only reports it).
    open_connections: AtomicUsize,
    pub connections_total: IntCounter,
    pub connections_rejected: IntCounter,
    get_keys: IntCounter,
    set_requests: IntCounter,
    touch_keys: IntCounter,
    flush_requests: IntCounter,
    get_hits: IntCounter,
    get_misses: IntCounter,
    client_errors: IntCounter,
    oversized_values: IntCounter,
    framing_closes: IntCounter,
    binary_connections: IntCounter,
    auth_cmds: IntCounter,
    auth_errors: IntCounter,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    backend_round_trip: HistogramVec,
    /// Reads of replicated routes reading `nearest`, by route and locality.
    zone_reads: IntCounterVec,
    backend_errors: IntCounterVec,
    backend_timeouts: IntCounterVec,
    /// Gets that waited for an identical get in flight instead of being sent (`collapse`).
    collapsed_gets: IntCounterVec,
    hot_cache_hits: IntCounterVec,
    hot_cache_misses: IntCounterVec,
    hot_cache_bytes: IntGaugeVec,
    // Per-listener families (label `listener`: the bound address, one per `proxy.listen`
    // entry): events, requests and open connections; the route each serves and its TLS
    // handshakes are read from `State` on gather.
    listener_events: IntCounterVec,
    listener_requests: IntCounterVec,
    listener_connections: IntGaugeVec,
    config_info: IntGaugeVec,
    config_reload_time: IntGauge,
    admin_refusals: IntCounterVec,
    admin_evictions: IntCounterVec,
    /// The config-dependent state the collector reads at gather time.
    state: Arc<Mutex<State>>,
    /// Label sets currently exported per family (so a reload can drop servers that left).
    exported_servers: Mutex<Vec<(String, String)>>,
    exported_routes: Mutex<Vec<String>>,
    pub flush: FlushBarrier,
    /// Reply bytes held for clients, process-wide (`max_buffered_replies`).
    pub replies: Arc<ReplyBudget>,
}

/// What the collector reads on every gather; replaced piecewise on reload.
#[derive(Debug, Default)]
struct State {
    /// (pool, servers now, most servers out of the ring at once when the pool ejects).
    pools: Vec<(String, usize, Option<usize>)>,
    health: Vec<Arc<ServerHealth>>,
    routes: Vec<(String, Arc<RouteStats>)>,
    shadows: Vec<(String, Arc<ShadowStats>)>,
    /// Resize window counters per pool.
    resize: Vec<(String, Arc<crate::counters::ResizeStats>)>,
    /// DNS lookups per pool: (succeeded, failed).
    lookups: std::collections::BTreeMap<String, (u64, u64)>,
    /// Reloads from the config file (kept by `reload.rs`, the one reload path).
    reloads: Option<Arc<ReloadCounts>>,
    /// Every listener's bound address, in `proxy.listen` order (set once at start).
    listener_names: Vec<String>,
    /// The root target each listener serves now, in the same order (set by every reload).
    listener_routes: Vec<String>,
    /// TLS listeners (bound address, handshake counters) and backend connectors (pool).
    tls_listeners: Vec<(String, Arc<memroute_net::ServerTls>)>,
    connectors: Vec<(String, Arc<memroute_net::Connector>)>,
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let counter = IntCounter::new(name, help).unwrap_or_else(|e| unreachable_metric(name, e));
    register(registry, counter.clone(), name);
    counter
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let vec = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| unreachable_metric(name, e));
    register(registry, vec.clone(), name);
    vec
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let vec = IntGaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| unreachable_metric(name, e));
    register(registry, vec.clone(), name);
    vec
}

fn histogram_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    let vec = HistogramVec::new(opts, labels).unwrap_or_else(|e| unreachable_metric(name, e));
    register(registry, vec.clone(), name);
    vec
}

fn register<C: Collector + 'static>(registry: &Registry, collector: C, name: &str) {
    if let Err(error) = registry.register(Box::new(collector)) {
        unreachable_metric(name, error);
    }
}

/// Metric names and label names are constants of this file: a bad one is a bug that the
/// first unit test shows, never something input can cause.
#[allow(clippy::panic)]
fn unreachable_metric(name: &str, error: prometheus::Error) -> ! {
    panic!("metric {name} cannot be defined: {error}")
}

/// The live watch's hub with its families: watchers open, requests looked at, lines.
fn watch_hub(r: &Registry) -> WatchHub {
    let watchers = IntGauge::new(
        "memroute_watch_watchers",
        "Live watches of requests open now (GET /watch, memroute watch).",
    )
    .unwrap_or_else(|e| unreachable_metric("watch_watchers", e));
    register(r, watchers.clone(), "watch_watchers");
    let lines_dropped = counter_vec(
        r,
        "memroute_watch_lines_dropped_total",
        "Request lines a watcher wanted but did not get, by reason: rate_cap (over its rate= per second) or slow_watcher (its queue was full; the watcher is dropped).",
        &["reason"],
    );
    for reason in ["rate_cap", "slow_watcher"] {
        lines_dropped.with_label_values(&[reason]);
    }
    WatchHub::new(WatchCounters {
        watchers,
        examined: counter(
            r,
            "memroute_watch_requests_examined_total",
            "Requests checked against the open watches' filters (only while a watch is open).",
        ),
        lines_sent: counter(
            r,
            "memroute_watch_lines_sent_total",
            "Request lines handed to watchers.",
        ),
        lines_dropped,
        slow_watchers: counter(
            r,
            "memroute_watch_slow_watchers_dropped_total",
            "Watchers dropped because they read their lines more slowly than they came.",
        ),
    })
}

impl Metrics {
    /// The process-wide round trips of `pool`'s server `address`, as of the workers' last
    /// flush (read by the read order and by `/route`, never per request).
    pub(crate) fn round_trip_totals(&self, pool: &str, address: &str) -> prometheus::Histogram {
        self.backend_round_trip.with_label_values(&[pool, address])
    }

    /// Counts a new client connection, or refuses it (counted as rejected) when
    /// `max_connections` (0: no limit) are open already.
    pub fn admit_connection(&self, max_connections: usize) -> bool {
        let open = self.open_connections.fetch_add(1, Ordering::Relaxed);
        if max_connections > 0 && open >= max_connections {
            self.open_connections.fetch_sub(1, Ordering::Relaxed);
            self.connections_rejected.inc();
            return false;
        }
        self.connections_current.inc();
        self.connections_total.inc();
        true
    }

    /// A connection counted by [`Metrics::admit_connection`] closed.
    pub fn connection_closed(&self) {
        self.open_connections.fetch_sub(1, Ordering::Relaxed);
        self.connections_current.dec();
    }

    pub(crate) fn new(workers: usize) -> Metrics {
        let registry = Registry::new();
        let r = &registry;
        let state = Arc::new(Mutex::new(State::default()));
        let started = Instant::now();
        let replies = Arc::new(ReplyBudget::default());
        let hot_keys = Arc::new(HotKeyRegistry::default());
        register(
            r,
            StateCollector::new(
                state.clone(),
                started,
                workers,
                replies.clone(),
                hot_keys.clone(),
            ),
            "state",
        );
        let connections_current = IntGauge::new(
            "memroute_client_connections_current",
            "Open client connections.",
        )
        .unwrap_or_else(|e| unreachable_metric("connections_current", e));
        register(r, connections_current.clone(), "connections_current");
        let config_reload_time = IntGauge::new(
            "memroute_config_last_reload_timestamp_seconds",
            "Unix time the running config was applied.",
        )
        .unwrap_or_else(|e| unreachable_metric("config_reload_time", e));
        register(r, config_reload_time.clone(), "config_reload_time");
        let config_info = IntGaugeVec::new(
            Opts::new(
                "memroute_config_info",
                "1 for the hash of the running config (as GET /config shows it).",
            ),
            &["hash"],
        )
        .unwrap_or_else(|e| unreachable_metric("config_info", e));
        register(r, config_info.clone(), "config_info");
        Metrics {
            started,
            workers,
            hot_keys,
            watch: Arc::new(watch_hub(r)),
            connections_current,
            open_connections: AtomicUsize::new(0),
            connections_total: counter(
                r,
                "memroute_client_connections_total",
                "Client connections accepted.",
            ),
            connections_rejected: counter(
                r,
                "memroute_client_connections_rejected_total",
                "Client connections closed at max_connections.",
            ),
            get_keys: counter(
                r,
                "memroute_client_get_keys_total",
                "Keys asked for by retrieval commands (memcached's cmd_get).",
            ),
            set_requests: counter(
                r,
                "memroute_client_set_requests_total",
                "Storage commands (memcached's cmd_set).",
            ),
            touch_keys: counter(
                r,
                "memroute_client_touch_keys_total",
                "Keys touched by touch, gat and gats (memcached's cmd_touch).",
            ),
            flush_requests: counter(
                r,
                "memroute_client_flush_requests_total",
                "flush_all commands (memcached's cmd_flush).",
            ),
            get_hits: counter(r, "memroute_client_get_hits_total", "Keys found."),
            get_misses: counter(r, "memroute_client_get_misses_total", "Keys not found."),
            client_errors: counter(
                r,
                "memroute_client_errors_total",
                "Requests rejected as bad input.",
            ),
            oversized_values: counter(
                r,
                "memroute_client_oversized_values_total",
                "Storage requests refused for a value over max_value_size (text and binary).",
            ),
            framing_closes: counter(
                r,
                "memroute_client_framing_closes_total",
                "Client connections closed because their input could not be framed.",
            ),
            binary_connections: counter(
                r,
                "memroute_client_binary_connections_total",
                "Client connections that spoke the binary protocol (first byte 0x80).",
            ),
            auth_cmds: counter(
                r,
                "memroute_client_auth_commands_total",
                "Logins tried on listeners that want one (text login sets and SASL PLAIN).",
            ),
            auth_errors: counter(
                r,
                "memroute_client_auth_errors_total",
                "Logins refused: a user or password the listener's authfile does not hold.",
            ),
            requests: counter_vec(
                r,
                "memroute_client_requests_total",
                "Requests by command and by the pool or policy route they reached after prefix and operation routes (one per key for multi-key retrievals; (proxy) for requests memroute answers itself).",
                &["command", "route"],
            ),
            request_duration: histogram_vec(
                r,
                "memroute_client_request_duration_seconds",
                "Time from a request being read to its reply being ready, by the pool or policy route it reached: the latency a client sees through memroute.",
                &["route"],
            ),
            backend_round_trip: histogram_vec(
                r,
                "memroute_backend_round_trip_seconds",
                "Time from writing a request to a server until its reply was read.",
                &["pool", "server"],
            ),
            zone_reads: counter_vec(
                r,
                "memroute_route_zone_reads_total",
                "Reads a replicated route reading `nearest` sent to a child, by locality: local (a child in the proxy's zone) or cross_zone (any other child: another zone, no zone, or a proxy without a zone). A read that fails over counts once per child asked.",
                &["route", "locality"],
            ),
            backend_errors: counter_vec(
                r,
                "memroute_backend_errors_total",
                "Requests that got no reply from a server.",
                &["pool", "server"],
            ),
            backend_timeouts: counter_vec(
                r,
                "memroute_backend_timeouts_total",
                "Requests that timed out.",
                &["pool", "server"],
            ),
            collapsed_gets: counter_vec(
                r,
                COLLAPSED_GETS_FAMILY,
                "Gets that waited for the reply of an identical get already in flight on the same server connection instead of being sent.",
                &["pool"],
            ),
            hot_cache_hits: counter_vec(
                r,
                "memroute_hot_cache_hits_total",
                "Gets answered from the pool's hot-key cache (hot_cache) without a server.",
                &["pool"],
            ),
            hot_cache_misses: counter_vec(
                r,
                "memroute_hot_cache_misses_total",
                "Gets the pool's hot-key cache could have answered by their form but had no fresh copy for, sent to the server.",
                &["pool"],
            ),
            hot_cache_bytes: gauge_vec(
                r,
                "memroute_hot_cache_bytes",
                "Reply bytes held by the pool's hot-key cache, over all workers.",
                &["pool"],
            ),
            listener_events: counter_vec(
                r,
                "memroute_listener_events_total",
                "Events per listen address: accepted (client connections accepted there).",
                &["listener", "event"],
            ),
            admin_refusals: counter_vec(
                r,
                "memroute_admin_refusals_total",
                "Admin requests and connections refused, by reason: per_peer and total (connection limits reached with every connection busy), not_loopback, cross_site, bad_token, token_file (POST /reload).",
                &["reason"],
            ),
            admin_evictions: counter_vec(
                r,
                "memroute_admin_evictions_total",
                "Idle admin connections closed to admit a new one, by the limit that was full: per_peer or total.",
                &["limit"],
            ),
            listener_requests: counter_vec(
                r,
                "memroute_listener_requests_total",
                "Requests (commands, a multi-get counts once) read from the clients of a listen address.",
                &["listener"],
            ),
            listener_connections: gauge_vec(
                r,
                "memroute_listener_connections_current",
                "Client connections open now on a listen address.",
                &["listener"],
            ),
            config_info,
            config_reload_time,
            registry,
            state,
            exported_servers: Mutex::new(Vec::new()),
            exported_routes: Mutex::new(Vec::new()),
            flush: FlushBarrier::new(workers),
            replies,
        }
    }

    /// Every listener's bound address, in `proxy.listen` order.
    pub(crate) fn set_listener_names(&self, names: Vec<String>) {
        lock(&self.state).listener_names = names;
    }

    /// The place in `proxy.listen` of the listener bound at `name` (`127.0.0.1:40123`).
    pub(crate) fn listener_index(&self, name: &str) -> Option<usize> {
        lock(&self.state)
            .listener_names
            .iter()
            .position(|bound| bound == name)
    }

    /// The root target each listener serves from now on, in `proxy.listen` order.
    pub(crate) fn set_listener_routes(&self, routes: Vec<String>) {
        lock(&self.state).listener_routes = routes;
    }

    pub(crate) fn set_tls_listeners(&self, listeners: Vec<(String, Arc<memroute_net::ServerTls>)>) {
        lock(&self.state).tls_listeners = listeners;
    }

    pub(crate) fn set_connectors(&self, connectors: Vec<(String, Arc<memroute_net::Connector>)>) {
        lock(&self.state).connectors = connectors;
    }

    pub(crate) fn set_health(&self, health: Vec<Arc<ServerHealth>>) {
        lock(&self.state).health = health;
    }

    pub(crate) fn set_policy_stats(
        &self,
        routes: Vec<(String, Arc<RouteStats>)>,
        shadows: Vec<(String, Arc<ShadowStats>)>,
    ) {
        let mut state = lock(&self.state);
        state.routes = routes;
        state.shadows = shadows;
    }

    pub(crate) fn set_resize_stats(
        &self,
        resize: Vec<(String, Arc<crate::counters::ResizeStats>)>,
    ) {
        lock(&self.state).resize = resize;
    }

    pub(crate) fn count_lookup(&self, pool: &str, succeeded: bool) {
        let mut state = lock(&self.state);
        let entry = state.lookups.entry(pool.to_string()).or_default();
        match succeeded {
            true => entry.0 += 1,
            false => entry.1 += 1,
        }
    }

    /// The counters of `pool`'s server `address`.
    pub(crate) fn server_stats(&self, pool: &str, address: &str) -> ServerStats {
        let labels = [pool, address];
        ServerStats {
            errors: self.backend_errors.with_label_values(&labels),
            timeouts: self.backend_timeouts.with_label_values(&labels),
        }
    }

    /// The collapsed gets counter of `pool` (resolved once per snapshot, then `inc()`).
    pub(crate) fn collapsed_gets(&self, pool: &str) -> IntCounter {
        self.collapsed_gets.with_label_values(&[pool])
    }

    /// Gets of `pool` collapsed so far (the panel shows them beside its hot keys).
    pub(crate) fn collapsed_gets_of(&self, pool: &str) -> u64 {
        self.collapsed_gets
            .get_metric_with_label_values(&[pool])
            .map_or(0, |counter| counter.get())
    }

    /// The hot-key cache's hits and misses counters and bytes gauge of `pool` (resolved
    /// once per snapshot).
    pub(crate) fn hot_cache(&self, pool: &str) -> (IntCounter, IntCounter, IntGauge) {
        (
            self.hot_cache_hits.with_label_values(&[pool]),
            self.hot_cache_misses.with_label_values(&[pool]),
            self.hot_cache_bytes.with_label_values(&[pool]),
        )
    }

    /// `pool`'s hot-key cache hits and misses so far (the panel shows the hit share).
    pub(crate) fn hot_cache_of(&self, pool: &str) -> (u64, u64) {
        let count = |vec: &IntCounterVec| {
            vec.get_metric_with_label_values(&[pool])
                .map_or(0, |counter| counter.get())
        };
        (count(&self.hot_cache_hits), count(&self.hot_cache_misses))
    }

    /// The counter of `event` on `listener` (resolve once per listener, then `inc()`).
    pub(crate) fn listener_event(&self, listener: &str, event: &str) -> IntCounter {
        self.listener_events.with_label_values(&[listener, event])
    }

    /// Counts an admin connection or request refused for `reason`.
    pub(crate) fn count_admin_refusal(&self, reason: &str) {
        self.admin_refusals.with_label_values(&[reason]).inc();
    }

    /// Counts an idle admin connection closed to admit a new one past `limit`.
    pub(crate) fn count_admin_eviction(&self, limit: &str) {
        self.admin_evictions.with_label_values(&[limit]).inc();
    }

    /// The open-connections gauge of `listener` (resolve once per listener).
    pub(crate) fn listener_connections(&self, listener: &str) -> IntGauge {
        self.listener_connections.with_label_values(&[listener])
    }

    /// Where reloads from the config file are counted (exported as
    /// `memroute_config_reloads_total`).
    pub(crate) fn set_reload_counts(&self, counts: Arc<ReloadCounts>) {
        lock(&self.state).reloads = Some(counts);
    }

    /// The reloads counted so far, when a config file is being watched.
    pub(crate) fn reload_counts(&self) -> Option<Arc<ReloadCounts>> {
        lock(&self.state).reloads.clone()
    }

    /// Records the hash of the config now running.
    pub(crate) fn set_config_hash(&self, hash: &str) {
        self.config_info.reset();
        self.config_info.with_label_values(&[hash]).set(1);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.config_reload_time.set(now as i64);
    }

    /// The counters for `config`'s servers, indexed [pool id][server index]. A server
    /// (same pool name, same address) keeps its counters across reloads; servers and routes
    /// no longer configured stop being exported.
    pub(crate) fn for_config(&self, config: &Config, routes: &RouteTable) -> ServerStatsTable {
        let mut table = Vec::with_capacity(config.pools.len());
        let mut servers = Vec::new();
        for (pool, p) in &config.pools {
            let row = p
                .servers
                .iter()
                .map(|s| {
                    servers.push((pool.clone(), s.address.clone()));
                    self.server_stats(pool, &s.address)
                })
                .collect();
            table.push(row);
        }
        let mut exported = lock(&self.exported_servers);
        for (pool, address) in exported.iter() {
            if !servers.contains(&(pool.clone(), address.clone())) {
                let labels = [pool.as_str(), address.as_str()];
                let _ = self.backend_errors.remove_label_values(&labels);
                let _ = self.backend_timeouts.remove_label_values(&labels);
                let _ = self.backend_round_trip.remove_label_values(&labels);
            }
        }
        *exported = servers;
        let names: Vec<String> = (0..routes.node_count())
            .map(|id| routes.node_name(id as memroute_routing::NodeId).to_string())
            .collect();
        let mut exported = lock(&self.exported_routes);
        for name in exported.iter() {
            if !names.contains(name) {
                let _ = self.request_duration.remove_label_values(&[name]);
                for locality in ZONE_LOCALITIES {
                    let _ = self.zone_reads.remove_label_values(&[name, locality]);
                }
                for command in COMMAND_NAMES {
                    let _ = self.requests.remove_label_values(&[command, name]);
                }
            }
        }
        *exported = names;
        table
    }

    /// Publishes `config`'s pools (server counts, how many may be ejected). Called once the
    /// generation serving `config` is sent: a worker picks a sent generation up before its
    /// next batch of requests, so a request sent after these counts were read is routed by
    /// the servers they count.
    pub(crate) fn set_pools(&self, config: &Config) {
        lock(&self.state).pools = config
            .pools
            .iter()
            .map(|(name, pool)| {
                let ejecting = pool.eject.then(|| crate::pool_settings::max_ejected(pool));
                (name.clone(), pool.servers.len(), ejecting)
            })
            .collect();
    }

    /// Everything gathered, after asking every worker to flush (bounded wait).
    pub(crate) async fn gather_fresh(&self) -> Vec<MetricFamily> {
        self.flush.flush_all(FLUSH_WAIT).await;
        self.registry.gather()
    }

    /// The registry in Prometheus' text exposition format.
    pub(crate) fn encode(families: &[MetricFamily]) -> String {
        use prometheus::Encoder as _;
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(error) = prometheus::TextEncoder::new().encode(families, &mut out) {
            tracing::warn!(%error, "cannot encode metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// The reply to `stats`, in memcached's `STAT name value` format, from the same
    /// gathered families `/metrics` shows (histograms are on `/metrics` only).
    pub(crate) fn render_stats(&self, families: &[MetricFamily]) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut out = String::with_capacity(2048);
        let mut stat = |name: &str, value: &dyn std::fmt::Display| {
            use std::fmt::Write as _;
            let _ = write!(out, "STAT {name} {value}\r\n");
        };
        stat("pid", &std::process::id());
        stat("uptime", &self.started.elapsed().as_secs());
        stat("time", &now);
        // A numeric version first: libmemcached and PHP parse `version` as major.minor.micro.
        stat("version", &crate::version::MEMCACHED_COMPAT_VERSION);
        stat("memroute_version", &crate::version::VERSION);
        stat("threads", &self.workers);
        let by_name: HashMap<&str, &MetricFamily> =
            families.iter().map(|f| (f.get_name(), f)).collect();
        // memcached's own names first, in memcached's order.
        for (stat_name, family) in CLASSIC_STATS {
            let total: f64 = by_name
                .get(family)
                .map(|f| f.get_metric().iter().map(sample_value).sum())
                .unwrap_or(0.0);
            stat(stat_name, &(total as u64));
        }
        for family in families {
            let name = family.get_name();
            if CLASSIC_STATS.iter().any(|(_, f)| *f == name)
                || HEADER_FAMILIES.contains(&name)
                || name == HOT_KEY_FAMILY
                || family.get_field_type() == MetricType::HISTOGRAM
            {
                continue;
            }
            for metric in family.get_metric() {
                let labels: Vec<&str> = metric.get_label().iter().map(|l| l.get_value()).collect();
                match (name, &labels[..]) {
                    // An info family: the value is in the label.
                    (LISTENER_ROUTE_FAMILY, [listener, route]) => {
                        stat(&format!("listener:{listener}:route"), route)
                    }
                    _ => stat(&stat_name(name, &labels), &(sample_value(metric) as u64)),
                }
            }
        }
        self.render_hot_keys(&mut out);
        out.push_str("END\r\n");
        out
    }

    /// The names of the running config's pools, in its order.
    pub(crate) fn pool_names(&self) -> Vec<String> {
        lock(&self.state)
            .pools
            .iter()
            .map(|(name, ..)| name.clone())
            .collect()
    }

    /// The address of the `index`-th server of `pool` in the running config.
    pub(crate) fn server_address(&self, pool: &str, index: usize) -> Option<String> {
        lock(&self.state)
            .health
            .iter()
            .filter(|h| &**h.pool() == pool)
            .nth(index)
            .map(|h| h.address().to_string())
    }

    /// `STAT hot_key:POOL:RANK KEY share=S rate=R/s server=ADDRESS`, the five hottest
    /// keys of each pool, as `GET /hotkeys` shows them.
    fn render_hot_keys(&self, out: &mut String) {
        use std::fmt::Write as _;
        let report = self.hot_keys.report(5);
        let state = lock(&self.state);
        for pool in &report.pools {
            let servers: Vec<&Arc<ServerHealth>> = state
                .health
                .iter()
                .filter(|h| **h.pool() == pool.pool)
                .collect();
            for (rank, key) in pool.keys.iter().enumerate() {
                let server = servers
                    .get(key.server as usize)
                    .map_or("?", |h| h.address());
                let _ = write!(
                    out,
                    "STAT hot_key:{}:{} {} share={:.3} rate={:.0}/s server={server}\r\n",
                    pool.pool,
                    rank + 1,
                    report.key_text(key),
                    Report::share(pool, key),
                    report.rate(key),
                );
            }
        }
    }
}

/// `stats` names memcached tools know, and the family each one is summed from.
const CLASSIC_STATS: [(&str, &str); 18] = [
    ("curr_connections", "memroute_client_connections_current"),
    ("total_connections", "memroute_client_connections_total"),
    (
        "rejected_connections",
        "memroute_client_connections_rejected_total",
    ),
    ("cmd_get", "memroute_client_get_keys_total"),
    ("cmd_set", "memroute_client_set_requests_total"),
    ("cmd_flush", "memroute_client_flush_requests_total"),
    ("cmd_touch", "memroute_client_touch_keys_total"),
    ("get_hits", "memroute_client_get_hits_total"),
    ("get_misses", "memroute_client_get_misses_total"),
    ("client_errors", "memroute_client_errors_total"),
    ("oversized_values", "memroute_client_oversized_values_total"),
    ("framing_closes", "memroute_client_framing_closes_total"),
    (
        "binary_connections",
        "memroute_client_binary_connections_total",
    ),
    ("auth_cmds", "memroute_client_auth_commands_total"),
    ("auth_errors", "memroute_client_auth_errors_total"),
    (
        "buffered_reply_bytes",
        "memroute_client_buffered_reply_bytes",
    ),
    ("reads_paused", "memroute_client_reads_paused_total"),
    ("slow_clients_closed", "memroute_client_slow_closed_total"),
];

/// Gets collapsed per pool (`collapse`): `stats` shows them as `pool:NAME:collapsed_gets`.
const COLLAPSED_GETS_FAMILY: &str = "memroute_collapsed_gets_total";

/// Families `stats` already shows in its header lines.
const HEADER_FAMILIES: [&str; 2] = ["memroute_process_uptime_seconds", "memroute_proxy_workers"];

fn sample_value(metric: &proto::Metric) -> f64 {
    // Each family here is one kind; the others read as 0.
    metric.get_counter().get_value() + metric.get_gauge().get_value()
}

/// The `stats` name of one labelled sample: the names memroute used before the registry
/// (`server:<pool>:<address>:errors`, ...) where there was one, else
/// `<family without memroute_>:<label values>`.
fn stat_name(family: &str, labels: &[&str]) -> String {
    let joined = labels.join(":");
    let legacy = |prefix: &str, suffix: &str| format!("{prefix}:{joined}:{suffix}");
    match family {
        "memroute_backend_errors_total" => legacy("server", "errors"),
        "memroute_backend_timeouts_total" => legacy("server", "timeouts"),
        "memroute_backend_down" => legacy("server", "down"),
        "memroute_backend_marked_down_total" => legacy("server", "marked_down"),
        "memroute_backend_marked_up_total" => legacy("server", "marked_up"),
        "memroute_backend_login_failures_total" => legacy("server", "login_failures"),
        "memroute_pool_servers" => legacy("pool", "servers"),
        "memroute_route_failovers_total" => legacy("route", "failovers"),
        "memroute_route_write_failures_total" => legacy("route", "write_failures"),
        "memroute_route_fills_total" => legacy("route", "fills"),
        "memroute_resize_window_active" => legacy("pool", "resize_window_active"),
        "memroute_resize_fallback_reads_total" => legacy("pool", "resize_fallback_reads"),
        "memroute_resize_keys_moved_total" => legacy("pool", "resize_keys_moved"),
        "memroute_resize_errors_total" => legacy("pool", "resize_errors"),
        COLLAPSED_GETS_FAMILY => legacy("pool", "collapsed_gets"),
        "memroute_hot_cache_hits_total" => legacy("pool", "hot_cache_hits"),
        "memroute_hot_cache_misses_total" => legacy("pool", "hot_cache_misses"),
        "memroute_hot_cache_bytes" => legacy("pool", "hot_cache_bytes"),
        // (locality, route) -> route:NAME:reads_LOCALITY
        "memroute_route_zone_reads_total" => match labels {
            [locality, route] => format!("route:{route}:reads_{locality}"),
            _ => format!("route:{joined}:reads"),
        },
        // Label pairs of a vec come sorted by name: (event, listener) -> listener:ADDR:EVENT
        "memroute_listener_events_total" => match labels {
            [event, listener] => format!("listener:{listener}:{event}"),
            _ => format!("listener:{joined}"),
        },
        "memroute_listener_requests_total" => legacy("listener", "requests"),
        "memroute_listener_connections_current" => legacy("listener", "connections"),
        // (listener, kind) -> listener:ADDR:tls_handshakes_KIND
        "memroute_listener_tls_handshakes_total" => match labels {
            [listener, kind] => format!("listener:{listener}:tls_handshakes_{kind}"),
            _ => format!("listener:{joined}:tls_handshakes"),
        },
        // (pool, server, kind) -> server:POOL:ADDR:tls_handshakes_KIND
        "memroute_backend_tls_handshakes_total" => match labels {
            [pool, server, kind] => format!("server:{pool}:{server}:tls_handshakes_{kind}"),
            _ => format!("server:{joined}:tls_handshakes"),
        },
        // (route, outcome): sent, completed, error -> errors, dropped.
        "memroute_shadow_requests_total" => match labels {
            [route, "error"] => format!("shadow:{route}:errors"),
            [route, outcome] => format!("shadow:{route}:{outcome}"),
            _ => format!("shadow:{joined}"),
        },
        // (pool, outcome): ok -> dns_lookups, error -> dns_failures.
        "memroute_discovery_lookups_total" => match labels {
            [pool, "ok"] => format!("pool:{pool}:dns_lookups"),
            [pool, _] => format!("pool:{pool}:dns_failures"),
            _ => format!("pool:{joined}:dns"),
        },
        _ => {
            let short = family.strip_prefix("memroute_").unwrap_or(family);
            match joined.is_empty() {
                true => short.to_string(),
                false => format!("{short}:{joined}"),
            }
        }
    }
}

/// Lets a scrape (or `stats`) have every worker flush its local counts first.
///
/// Each worker's flush task waits on its own `Notify` (a permit is kept if it is busy);
/// after flushing it records the highest request it served and bumps `flushed`.
#[derive(Debug)]
pub(crate) struct FlushBarrier {
    requested: AtomicU64,
    wake: Vec<Notify>,
    done: Vec<AtomicU64>,
    flushed: watch::Sender<u64>,
}

impl FlushBarrier {
    fn new(workers: usize) -> FlushBarrier {
        FlushBarrier {
            requested: AtomicU64::new(0),
            wake: (0..workers).map(|_| Notify::new()).collect(),
            done: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            flushed: watch::channel(0).0,
        }
    }

    /// Asks every worker to flush; returns the request number to wait for.
    pub(crate) fn request(&self) -> u64 {
        let ticket = self.requested.fetch_add(1, Relaxed) + 1;
        for wake in &self.wake {
            wake.notify_one();
        }
        ticket
    }

    /// True once every worker flushed after request `ticket` was made.
    pub(crate) fn reached(&self, ticket: u64) -> bool {
        self.done.iter().all(|d| d.load(Relaxed) >= ticket)
    }

    /// Waits until `ticket` is reached or `deadline` passes.
    pub(crate) async fn wait(&self, ticket: u64, deadline: Instant) {
        let mut flushed = self.flushed.subscribe();
        while !self.reached(ticket) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, flushed.changed()).await.is_err() {
                return;
            }
        }
    }

    async fn flush_all(&self, wait: Duration) {
        let ticket = self.request();
        self.wait(ticket, Instant::now() + wait).await;
    }

    /// Worker `index` waits for a flush request (or nothing: its timer flushes anyway).
    async fn requested_for(&self, index: usize) {
        match self.wake.get(index) {
            Some(wake) => wake.notified().await,
            None => std::future::pending().await,
        }
    }

    /// Worker `index` has flushed everything counted before `seen` was read.
    fn flushed(&self, index: usize, seen: u64) {
        if let Some(done) = self.done.get(index) {
            done.fetch_max(seen, Relaxed);
        }
        self.flushed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// One worker's counts, kept in plain cells (no atomics, no sharing) and moved into the
/// registry by [`WorkerMetrics::flush`].
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    index: usize,
    pub shared: Arc<Metrics>,
    pub get_keys: Cell<u64>,
    pub set_requests: Cell<u64>,
    pub touch_keys: Cell<u64>,
    pub flush_requests: Cell<u64>,
    pub get_hits: Cell<u64>,
    pub get_misses: Cell<u64>,
    pub client_errors: Cell<u64>,
    /// Storage requests refused for a value over `max_value_size` (text and binary).
    pub oversized_values: Cell<u64>,
    /// Connections closed because their input could no longer be framed.
    pub framing_closes: Cell<u64>,
    /// Connections that spoke the binary protocol (first byte 0x80).
    pub binary_connections: Cell<u64>,
    /// Logins tried, and refused, on listeners that want one.
    pub auth_cmds: Cell<u64>,
    pub auth_errors: Cell<u64>,
    /// This worker's hot-key sampler (each routing it builds places keys through it).
    pub hot_keys: Rc<WorkerHotKeys>,
    /// The per-route tables of every routing this worker still serves requests with.
    routes: RefCell<Vec<Rc<RouteMetrics>>>,
    /// Backend round trips per (pool, address), shared with that server's connections.
    round_trips: RefCell<HashMap<(String, String), Rc<LocalHistogram>>>,
    /// The time this worker last woke a session: one clock read per batch of requests,
    /// not per request (see [`WorkerMetrics::tick`]). Shared with the route tables.
    clock: Rc<Cell<Instant>>,
}

/// Request counts and latency by route node for one routing (one config) of one worker.
#[derive(Debug)]
pub(crate) struct RouteMetrics {
    /// [node * COMMANDS + command]; the last row is [`LOCAL_ROUTE`].
    counts: Vec<Cell<u64>>,
    counters: Vec<IntCounter>,
    /// Per node; plus [`LOCAL_ROUTE`] last.
    latency: Vec<LocalHistogram>,
    /// Requests per listener, by its place in `proxy.listen`.
    listener_counts: Vec<Cell<u64>>,
    listener_counters: Vec<IntCounter>,
    nodes: usize,
    clock: Rc<Cell<Instant>>,
    /// Per route node reading `nearest` (few): its reads by locality, [local, cross_zone].
    zone_reads: Vec<(NodeId, [Cell<u64>; 2], [IntCounter; 2])>,
}

/// The `locality` label values of `memroute_route_zone_reads_total`, in
/// `RouteMetrics::zone_reads` order.
const ZONE_LOCALITIES: [&str; 2] = ["local", "cross_zone"];

const COMMANDS: usize = COMMAND_NAMES.len();

impl RouteMetrics {
    /// The worker's clock as of the last [`WorkerMetrics::tick`].
    #[inline]
    pub(crate) fn now(&self) -> Instant {
        self.clock.get()
    }

    /// Records the latency of a request to `node` started at `started`, as of now.
    #[inline]
    pub(crate) fn observe_since(&self, node: usize, started: Instant) {
        self.observe(node, self.now().saturating_duration_since(started));
    }

    /// Counts one request (or key) of `command` that reached route node `node`.
    #[inline]
    pub(crate) fn count(&self, node: usize, command: Command) {
        let node = node.min(self.nodes);
        if let Some(cell) = self.counts.get(node * COMMANDS + command_index(command)) {
            cell.set(cell.get() + 1);
        }
    }

    /// Counts one request read from a client of the `listener`-th listener.
    #[inline]
    pub(crate) fn count_listener(&self, listener: usize) {
        if let Some(cell) = self.listener_counts.get(listener) {
            cell.set(cell.get() + 1);
        }
    }

    /// Counts `n` reads (keys) nearest-reading replicated route `node` sent to a child in
    /// the proxy's zone (`local`) or to any other child.
    #[inline]
    pub(crate) fn count_zone_reads(&self, node: NodeId, local: bool, n: u64) {
        if let Some((_, counts, _)) = self.zone_reads.iter().find(|(at, ..)| *at == node) {
            let cell = &counts[usize::from(!local)];
            cell.set(cell.get() + n);
        }
    }

    /// Counts one request memroute answered itself.
    #[inline]
    pub(crate) fn count_local(&self, command: Command) {
        self.count(self.nodes, command);
    }

    /// Records the latency of a request that reached route node `node`.
    #[inline]
    pub(crate) fn observe(&self, node: usize, elapsed: Duration) {
        if let Some(histogram) = self.latency.get(node.min(self.nodes)) {
            histogram.observe(elapsed.as_secs_f64());
        }
    }

    fn flush(&self) {
        let counts = self.counts.iter().chain(&self.listener_counts);
        for (cell, counter) in counts.zip(self.counters.iter().chain(&self.listener_counters)) {
            let n = cell.take();
            if n > 0 {
                counter.inc_by(n);
            }
        }
        for histogram in &self.latency {
            histogram.flush();
        }
        for (_, counts, counters) in &self.zone_reads {
            for (cell, counter) in counts.iter().zip(counters) {
                let n = cell.take();
                if n > 0 {
                    counter.inc_by(n);
                }
            }
        }
    }
}

impl WorkerMetrics {
    pub(crate) fn new(index: usize, shared: Arc<Metrics>) -> WorkerMetrics {
        WorkerMetrics {
            index,
            hot_keys: Rc::new(shared.hot_keys.worker(index as u64 + 0x9e37_79b9)),
            shared,
            get_keys: Cell::new(0),
            set_requests: Cell::new(0),
            touch_keys: Cell::new(0),
            flush_requests: Cell::new(0),
            get_hits: Cell::new(0),
            get_misses: Cell::new(0),
            client_errors: Cell::new(0),
            oversized_values: Cell::new(0),
            framing_closes: Cell::new(0),
            binary_connections: Cell::new(0),
            auth_cmds: Cell::new(0),
            auth_errors: Cell::new(0),
            routes: RefCell::new(Vec::new()),
            round_trips: RefCell::new(HashMap::new()),
            clock: Rc::new(Cell::new(Instant::now())),
        }
    }

    /// Reads the clock once for everything a session does until it waits again.
    #[inline]
    pub(crate) fn tick(&self) {
        self.clock.set(Instant::now());
    }

    /// Adds one to a local counter.
    #[inline]
    pub(crate) fn add(cell: &Cell<u64>, n: u64) {
        cell.set(cell.get() + n);
    }

    /// The per-route table for a routing built from `routes`.
    pub(crate) fn for_routes(&self, routes: &RouteTable) -> Rc<RouteMetrics> {
        let nodes = routes.node_count();
        let name = |node: usize| match node == nodes {
            true => LOCAL_ROUTE,
            false => routes.node_name(node as memroute_routing::NodeId),
        };
        let mut counters = Vec::with_capacity((nodes + 1) * COMMANDS);
        for node in 0..=nodes {
            for command in COMMAND_NAMES {
                counters.push(
                    self.shared
                        .requests
                        .with_label_values(&[command, name(node)]),
                );
            }
        }
        let latency = (0..=nodes)
            .map(|node| {
                self.shared
                    .request_duration
                    .with_label_values(&[name(node)])
                    .local()
            })
            .collect();
        let listener_counters: Vec<IntCounter> = lock(&self.shared.state)
            .listener_names
            .iter()
            .map(|name| self.shared.listener_requests.with_label_values(&[name]))
            .collect();
        let zone_reads = (0..nodes as NodeId)
            .filter(|&node| {
                matches!(
                    routes.node(node),
                    memroute_routing::Node::Replicated {
                        reads: memroute_config::ReadPolicy::Nearest,
                        ..
                    }
                )
            })
            .map(|node| {
                let counter = |locality: &str| {
                    self.shared
                        .zone_reads
                        .with_label_values(&[routes.node_name(node), locality])
                };
                (
                    node,
                    [Cell::new(0), Cell::new(0)],
                    ZONE_LOCALITIES.map(counter),
                )
            })
            .collect();
        let table = Rc::new(RouteMetrics {
            zone_reads,
            counts: counters.iter().map(|_| Cell::new(0)).collect(),
            counters,
            latency,
            listener_counts: listener_counters.iter().map(|_| Cell::new(0)).collect(),
            listener_counters,
            nodes,
            clock: self.clock.clone(),
        });
        self.routes.borrow_mut().push(table.clone());
        table
    }

    /// The round-trip histogram of `pool`'s server `address` for this worker's connections.
    pub(crate) fn round_trip(&self, pool: &str, address: &str) -> Rc<LocalHistogram> {
        self.round_trips
            .borrow_mut()
            .entry((pool.to_string(), address.to_string()))
            .or_insert_with(|| {
                Rc::new(
                    self.shared
                        .backend_round_trip
                        .with_label_values(&[pool, address])
                        .local(),
                )
            })
            .clone()
    }

    /// The process-wide round trips of `pool`'s server `address` (every worker's, as of
    /// their last flush): read now and then to learn a server's latency, never per request.
    pub(crate) fn round_trip_totals(&self, pool: &str, address: &str) -> prometheus::Histogram {
        self.shared.round_trip_totals(pool, address)
    }

    /// Moves every local count into the registry; forgets tables nobody uses any more.
    pub(crate) fn flush(&self) {
        let seen = self.shared.flush.requested.load(Relaxed);
        let shared = &self.shared;
        for (cell, counter) in [
            (&self.get_keys, &shared.get_keys),
            (&self.set_requests, &shared.set_requests),
            (&self.touch_keys, &shared.touch_keys),
            (&self.flush_requests, &shared.flush_requests),
            (&self.get_hits, &shared.get_hits),
            (&self.get_misses, &shared.get_misses),
            (&self.client_errors, &shared.client_errors),
            (&self.oversized_values, &shared.oversized_values),
            (&self.framing_closes, &shared.framing_closes),
            (&self.binary_connections, &shared.binary_connections),
            (&self.auth_cmds, &shared.auth_cmds),
            (&self.auth_errors, &shared.auth_errors),
        ] {
            let n = cell.take();
            if n > 0 {
                counter.inc_by(n);
            }
        }
        self.routes.borrow_mut().retain(|table| {
            table.flush();
            // Only this list holds it: its routing is gone and it was just flushed.
            Rc::strong_count(table) > 1
        });
        self.round_trips.borrow_mut().retain(|_, histogram| {
            histogram.flush();
            Rc::strong_count(histogram) > 1
        });
        shared.flush.flushed(self.index, seen);
    }

    /// Flushes every [`FLUSH_INTERVAL`] and whenever a scrape or `stats` asks.
    pub(crate) async fn run_flusher(self: Rc<Self>) {
        let mut interval = tokio::time::interval(FLUSH_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = self.shared.flush.requested_for(self.index) => {}
            }
            self.flush();
        }
    }
}

impl Drop for WorkerMetrics {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Observes backend round trips for one server's connections (see `ConnectionSettings`).
pub(crate) fn round_trip_observer(histogram: Rc<LocalHistogram>) -> memroute_backend::RoundTrips {
    memroute_backend::RoundTrips::new(move |elapsed: Duration| {
        histogram.observe(elapsed.as_secs_f64())
    })
}

/// Reads the config-dependent state at gather time: health, pools, policy routes, shadow
/// routes and DNS lookups are kept where the proxy already keeps them (atomics shared by
/// workers, off the request path), not copied into the registry.
#[derive(Debug)]
struct StateCollector {
    state: Arc<Mutex<State>>,
    started: Instant,
    workers: usize,
    replies: Arc<ReplyBudget>,
    hot_keys: Arc<HotKeyRegistry>,
    descs: Vec<Desc>,
}

/// The top key's share per pool: a fraction, shown by `stats` as hot_key lines instead.
const HOT_KEY_FAMILY: &str = "memroute_hot_key_share";

/// The info family naming each listener's root target.
const LISTENER_ROUTE_FAMILY: &str = "memroute_listener_route_info";

/// (name, help, labels) of every family [`StateCollector`] produces.
const STATE_FAMILIES: [(&str, &str, &[&str]); 26] = [
    (
        "memroute_process_uptime_seconds",
        "Seconds since memroute started.",
        &[],
    ),
    ("memroute_proxy_workers", "Worker threads.", &[]),
    (
        "memroute_pool_servers",
        "Servers in a pool (DNS pools change with discovery).",
        &["pool"],
    ),
    (
        "memroute_pool_ejected_servers",
        "Servers an ejecting pool has taken out of its ring now.",
        &["pool"],
    ),
    (
        "memroute_backend_down",
        "1 while a server is marked down.",
        &["pool", "server"],
    ),
    (
        "memroute_backend_marked_down_total",
        "Times a server was marked down (for pools with eject = true: ejected).",
        &["pool", "server"],
    ),
    (
        "memroute_backend_marked_up_total",
        "Times a probe brought a server back.",
        &["pool", "server"],
    ),
    (
        "memroute_route_failovers_total",
        "Requests moved to the next child of a failover or replicated route.",
        &["route"],
    ),
    (
        "memroute_route_write_failures_total",
        "Replicated writes whose policy was not met.",
        &["route"],
    ),
    (
        "memroute_route_fills_total",
        "Values a warm-up route copied from warm to cold.",
        &["route"],
    ),
    (
        "memroute_shadow_requests_total",
        "Requests copied to a shadow target, by outcome (sent, completed, error, dropped).",
        &["route", "outcome"],
    ),
    (
        "memroute_discovery_lookups_total",
        "DNS lookups of discovered pools, by outcome (ok, error).",
        &["pool", "outcome"],
    ),
    (
        "memroute_backend_connections",
        "Connections to a server open now, over every worker.",
        &["pool", "server"],
    ),
    (
        "memroute_config_reloads_total",
        "Reloads of the config file by outcome (ok, failed); unchanged files are not counted.",
        &["outcome"],
    ),
    (
        "memroute_client_buffered_reply_bytes",
        "Reply bytes held for clients that have not read them yet, process-wide.",
        &[],
    ),
    (
        "memroute_client_reads_paused_total",
        "Times a session stopped reading because it held more than its share of max_buffered_replies.",
        &[],
    ),
    (
        "memroute_client_slow_closed_total",
        "Connections closed for holding more than their share of max_buffered_replies past slow_client_timeout.",
        &[],
    ),
    (
        "memroute_listener_tls_handshakes_total",
        "TLS handshakes with clients by outcome (full, resumed, failed, timeout).",
        &["listener", "kind"],
    ),
    (
        "memroute_backend_tls_handshakes_total",
        "TLS handshakes with servers by outcome (full, resumed, failed).",
        &["pool", "server", "kind"],
    ),
    (
        LISTENER_ROUTE_FAMILY,
        "1 for the pool or route a listen address serves now (its own route, or proxy.route).",
        &["listener", "route"],
    ),
    (
        HOT_KEY_FAMILY,
        "The hottest key's fraction of a pool's requests over the last one to two hot_keys_interval (GET /hotkeys names it).",
        &["pool"],
    ),
    (
        "memroute_resize_window_active",
        "1 while a pool keeps its previous placement after its servers changed (resize_window).",
        &["pool"],
    ),
    (
        "memroute_resize_fallback_reads_total",
        "Requests for keys whose owner changed that asked the key's old owner during a resize window.",
        &["pool"],
    ),
    (
        "memroute_resize_keys_moved_total",
        "Keys copied from their old owner to their new one during a resize window.",
        &["pool"],
    ),
    (
        "memroute_resize_errors_total",
        "Failed lookups, copies or deletes on old owners during a resize window (the key reads as a miss).",
        &["pool"],
    ),
    (
        "memroute_backend_login_failures_total",
        "Connections and probes a server would not let in: it wants a login the pool has no auth for, or refused the pool's (the server is marked down).",
        &["pool", "server"],
    ),
];

impl StateCollector {
    fn new(
        state: Arc<Mutex<State>>,
        started: Instant,
        workers: usize,
        replies: Arc<ReplyBudget>,
        hot_keys: Arc<HotKeyRegistry>,
    ) -> StateCollector {
        let descs = STATE_FAMILIES
            .iter()
            .map(|(name, help, labels)| {
                Desc::new(
                    name.to_string(),
                    help.to_string(),
                    labels.iter().map(|l| l.to_string()).collect(),
                    HashMap::new(),
                )
                .unwrap_or_else(|e| unreachable_metric(name, e))
            })
            .collect();
        StateCollector {
            state,
            started,
            workers,
            replies,
            hot_keys,
            descs,
        }
    }
}

/// One sample: its label values (in the family's label order) and value.
type Row = (Vec<String>, f64);

fn family(index: usize, rows: Vec<Row>) -> MetricFamily {
    let (name, help, labels) = STATE_FAMILIES[index];
    let kind = match name.ends_with("_total") {
        true => MetricType::COUNTER,
        false => MetricType::GAUGE,
    };
    let mut family = MetricFamily::default();
    family.set_name(name.to_string());
    family.set_help(help.to_string());
    family.set_field_type(kind);
    let metrics = rows
        .into_iter()
        .map(|(values, value)| {
            let mut metric = proto::Metric::default();
            metric.set_label(
                labels
                    .iter()
                    .zip(values)
                    .map(|(name, value)| {
                        let mut pair = proto::LabelPair::default();
                        pair.set_name(name.to_string());
                        pair.set_value(value);
                        pair
                    })
                    .collect(),
            );
            match kind {
                MetricType::COUNTER => {
                    let mut counter = proto::Counter::default();
                    counter.set_value(value);
                    metric.set_counter(counter);
                }
                _ => {
                    let mut gauge = proto::Gauge::default();
                    gauge.set_value(value);
                    metric.set_gauge(gauge);
                }
            }
            metric
        })
        .collect();
    family.set_metric(metrics);
    family
}

impl Collector for StateCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let state = lock(&self.state);
        let server = |h: &ServerHealth| vec![h.pool().to_string(), h.address().to_string()];
        let route_rows = |f: fn(&RouteStats) -> &AtomicU64| {
            state
                .routes
                .iter()
                .map(|(route, c)| (vec![route.clone()], f(c).load(Relaxed) as f64))
                .collect::<Vec<Row>>()
        };
        let ejected = |pool: &str, max: usize| {
            let down = state
                .health
                .iter()
                .filter(|h| &**h.pool() == pool && h.is_down())
                .count();
            down.min(max) as f64
        };
        let mut shadow_rows = Vec::new();
        for (route, c) in &state.shadows {
            for (outcome, counter) in [
                ("sent", &c.sent),
                ("completed", &c.completed),
                ("error", &c.errors),
                ("dropped", &c.dropped),
            ] {
                shadow_rows.push((
                    vec![route.clone(), outcome.to_string()],
                    counter.load(Relaxed) as f64,
                ));
            }
        }
        let mut listener_tls_rows = Vec::new();
        for (name, tls) in &state.tls_listeners {
            for (kind, value) in crate::transport::handshake_counts(&tls.counters) {
                listener_tls_rows.push((vec![name.clone(), kind.to_string()], value as f64));
            }
        }
        let mut backend_tls_rows = Vec::new();
        for (pool, connector) in state.connectors.iter().filter(|(_, c)| c.is_tls()) {
            let address = connector.address().to_string();
            // Backend connects have no handshake timeout of their own (connect_timeout).
            for (kind, value) in crate::transport::handshake_counts(&connector.counters)
                .into_iter()
                .take(3)
            {
                backend_tls_rows.push((
                    vec![pool.clone(), address.clone(), kind.to_string()],
                    value as f64,
                ));
            }
        }
        let resize_rows = |value: fn(&crate::counters::ResizeStats) -> u64| -> Vec<Row> {
            state
                .resize
                .iter()
                .map(|(pool, stats)| (vec![pool.clone()], value(stats) as f64))
                .collect()
        };
        let mut lookup_rows = Vec::new();
        for (pool, (ok, failed)) in &state.lookups {
            lookup_rows.push((vec![pool.clone(), "ok".to_string()], *ok as f64));
            lookup_rows.push((vec![pool.clone(), "error".to_string()], *failed as f64));
        }
        vec![
            family(0, vec![(vec![], self.started.elapsed().as_secs() as f64)]),
            family(1, vec![(vec![], self.workers as f64)]),
            family(
                2,
                state
                    .pools
                    .iter()
                    .map(|(pool, n, _)| (vec![pool.clone()], *n as f64))
                    .collect(),
            ),
            family(
                3,
                state
                    .pools
                    .iter()
                    .filter_map(|(pool, _, max)| Some((vec![pool.clone()], ejected(pool, (*max)?))))
                    .collect(),
            ),
            family(
                4,
                state
                    .health
                    .iter()
                    .map(|h| (server(h), f64::from(u8::from(h.is_down()))))
                    .collect(),
            ),
            family(
                5,
                state
                    .health
                    .iter()
                    .map(|h| (server(h), h.marked_down_total() as f64))
                    .collect(),
            ),
            family(
                6,
                state
                    .health
                    .iter()
                    .map(|h| (server(h), h.marked_up_total() as f64))
                    .collect(),
            ),
            family(7, route_rows(|c| &c.failovers)),
            family(8, route_rows(|c| &c.write_failures)),
            family(9, route_rows(|c| &c.fills)),
            family(10, shadow_rows),
            family(11, lookup_rows),
            family(
                12,
                state
                    .health
                    .iter()
                    .map(|h| (server(h), h.open_connections() as f64))
                    .collect(),
            ),
            family(
                13,
                match &state.reloads {
                    Some(counts) => vec![
                        (vec!["ok".to_string()], counts.ok() as f64),
                        (vec!["failed".to_string()], counts.failed() as f64),
                    ],
                    None => Vec::new(),
                },
            ),
            family(14, vec![(vec![], self.replies.used() as f64)]),
            family(
                15,
                vec![(vec![], self.replies.paused_total.load(Relaxed) as f64)],
            ),
            family(
                16,
                vec![(vec![], self.replies.slow_closed_total.load(Relaxed) as f64)],
            ),
            family(17, listener_tls_rows),
            family(18, backend_tls_rows),
            family(
                19,
                state
                    .listener_names
                    .iter()
                    .zip(&state.listener_routes)
                    .map(|(listener, route)| (vec![listener.clone(), route.clone()], 1.0))
                    .collect(),
            ),
            family(20, {
                let report = self.hot_keys.report(1);
                report
                    .pools
                    .iter()
                    .map(|pool| {
                        let share = pool.keys.first().map_or(0.0, |k| Report::share(pool, k));
                        (vec![pool.pool.clone()], share)
                    })
                    .collect()
            }),
            family(21, resize_rows(|s| u64::from(s.active.load(Relaxed)))),
            family(22, resize_rows(|s| s.fallback_reads.load(Relaxed))),
            family(23, resize_rows(|s| s.keys_moved.load(Relaxed))),
            family(24, resize_rows(|s| s.errors.load(Relaxed))),
            family(
                25,
                state
                    .health
                    .iter()
                    .map(|h| (server(h), h.login_failures_total() as f64))
                    .collect(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_admitting_at_once_never_pass_max_connections() {
        let metrics = Metrics::new(4);
        let admitted = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        if metrics.admit_connection(100) {
                            admitted.fetch_add(1, Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Relaxed), 100);
        assert_eq!(metrics.connections_current.get(), 100);
        assert_eq!(metrics.connections_rejected.get(), 3900);
        metrics.connection_closed();
        assert!(
            metrics.admit_connection(100),
            "a closed connection frees its place"
        );
        assert!(!metrics.admit_connection(100));
        assert!(metrics.admit_connection(0), "0: no limit");
    }

    #[test]
    fn every_command_has_its_own_label() {
        let mut seen = std::collections::HashSet::new();
        for name in COMMAND_NAMES {
            assert!(seen.insert(name), "{name} twice");
        }
        assert_eq!(command_index(Command::MetaDebug), COMMANDS - 1);
    }

    #[test]
    fn stats_and_metrics_come_from_the_same_families() {
        let metrics = Metrics::new(2);
        metrics.touch_keys.inc_by(3);
        metrics.flush_requests.inc();
        metrics.set_reload_counts(Arc::default());
        let families = metrics.registry.gather();
        let stats = metrics.render_stats(&families);
        assert!(stats.contains("STAT cmd_touch 3\r\n"), "{stats}");
        assert!(stats.contains("STAT cmd_flush 1\r\n"), "{stats}");
        assert!(
            stats.contains("STAT config_reloads_total:ok 0\r\n"),
            "{stats}"
        );
        assert!(stats.contains("STAT threads 2\r\n"), "{stats}");
        let text = Metrics::encode(&families);
        assert!(
            text.contains("memroute_client_touch_keys_total 3\n"),
            "{text}"
        );
        assert!(
            text.contains("memroute_client_flush_requests_total 1\n"),
            "{text}"
        );
        assert!(stats.ends_with("END\r\n"));
    }

    #[test]
    fn each_listener_has_its_route_connections_and_requests_in_stats() {
        let metrics = Arc::new(Metrics::new(1));
        metrics.set_listener_names(vec!["127.0.0.1:1".into(), "unix:/m.sock".into()]);
        metrics.set_listener_routes(vec!["main".into(), "by_prefix".into()]);
        metrics.listener_connections("127.0.0.1:1").inc();
        let config =
            memroute_config::parse("[pools.main]\nservers = [\"127.0.0.1:2\"]\n").expect("config");
        let routes = RouteTable::build(&config.routing_spec()).expect("routes");
        let worker = WorkerMetrics::new(0, metrics.clone());
        let table = worker.for_routes(&routes);
        table.count_listener(1);
        table.count_listener(1);
        table.count_listener(7); // no such listener: not counted, no panic
        worker.flush();
        let stats = metrics.render_stats(&metrics.registry.gather());
        for line in [
            "STAT listener:127.0.0.1:1:route main\r\n",
            "STAT listener:unix:/m.sock:route by_prefix\r\n",
            "STAT listener:127.0.0.1:1:connections 1\r\n",
            "STAT listener:unix:/m.sock:requests 2\r\n",
        ] {
            assert!(stats.contains(line), "{line:?} in {stats}");
        }
        let text = Metrics::encode(&metrics.registry.gather());
        assert!(
            text.contains(
                "memroute_listener_route_info{listener=\"unix:/m.sock\",route=\"by_prefix\"} 1\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn legacy_stat_names_are_kept() {
        assert_eq!(
            stat_name("memroute_backend_errors_total", &["main", "127.0.0.1:1"]),
            "server:main:127.0.0.1:1:errors"
        );
        assert_eq!(
            stat_name("memroute_shadow_requests_total", &["s", "error"]),
            "shadow:s:errors"
        );
        assert_eq!(
            stat_name("memroute_discovery_lookups_total", &["p", "ok"]),
            "pool:p:dns_lookups"
        );
        assert_eq!(
            stat_name("memroute_client_requests_total", &["get", "main"]),
            "client_requests_total:get:main"
        );
    }
}
