//! The shared side of the metrics: one `prometheus::Registry`, the families workers flush
//! into, and the config-dependent state its collector reads on gather.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use memroute_backend::ServerHealth;
use memroute_config::Config;
use memroute_protocol::Command;
use memroute_routing::RouteTable;
use prometheus::proto::MetricFamily;
use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::families::{counter, counter_vec, gauge, gauge_vec, histogram_vec, lock, register};
use super::flush_barrier::{FlushBarrier, FLUSH_WAIT};
use super::state_collector::{State, StateCollector};
use crate::counters::{
    ReloadCounts, ReplyBudget, ResizeStats, RouteStats, ServerStats, ServerStatsTable, ShadowStats,
};
use crate::hot_keys::HotKeyRegistry;
use crate::request_watch::{WatchCounters, WatchHub};

/// The `route` label of requests memroute answers itself (version, stats, errors, ...).
pub(super) const LOCAL_ROUTE: &str = "(proxy)";

/// Every command's label, indexed by [`command_index`].
pub(super) const COMMAND_NAMES: [&str; 26] = [
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
pub(super) fn command_index(command: Command) -> usize {
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

pub(super) const COMMANDS: usize = COMMAND_NAMES.len();

/// The `locality` label values of `memroute_route_zone_reads_total`, in
/// `RouteMetrics::zone_reads` order.
pub(super) const ZONE_LOCALITIES: [&str; 2] = ["local", "cross_zone"];

/// Gets collapsed per pool (`collapse`): `stats` shows them as `pool:NAME:collapsed_gets`.
pub(super) const COLLAPSED_GETS_FAMILY: &str = "memroute_collapsed_gets_total";

/// The shared side of the metrics: the registry and the families workers flush into.
#[derive(Debug)]
pub struct Metrics {
    pub started: Instant,
    pub workers: usize,
    /// Every worker's hot-key sketches (`/hotkeys`, `stats`, the top key's share).
    pub hot_keys: Arc<HotKeyRegistry>,
    /// The live watches of requests (`GET /watch`), which every worker looks at.
    pub watch: Arc<WatchHub>,
    pub registry: Registry,
    pub(crate) connections_current: IntGauge,
    /// Open client connections, for admission against `max_connections`: one atomic
    /// add both counts and checks a connection, so workers accepting at once cannot
    /// together pass the limit (the gauge above only reports it).
    pub(super) open_connections: AtomicUsize,
    pub(crate) connections_total: IntCounter,
    pub(crate) connections_rejected: IntCounter,
    pub(super) get_keys: IntCounter,
    pub(super) set_requests: IntCounter,
    pub(super) touch_keys: IntCounter,
    pub(super) flush_requests: IntCounter,
    pub(super) get_hits: IntCounter,
    pub(super) get_misses: IntCounter,
    pub(super) client_errors: IntCounter,
    pub(super) oversized_values: IntCounter,
    pub(super) framing_closes: IntCounter,
    pub(super) binary_connections: IntCounter,
    pub(super) auth_cmds: IntCounter,
    pub(super) auth_errors: IntCounter,
    pub(super) requests: IntCounterVec,
    pub(super) request_duration: HistogramVec,
    pub(super) backend_round_trip: HistogramVec,
    /// Reads of replicated routes reading `nearest`, by route and locality.
    pub(super) zone_reads: IntCounterVec,
    pub(super) backend_errors: IntCounterVec,
    pub(super) backend_timeouts: IntCounterVec,
    /// Gets that waited for an identical get in flight instead of being sent (`collapse`).
    pub(super) collapsed_gets: IntCounterVec,
    pub(super) hot_cache_hits: IntCounterVec,
    pub(super) hot_cache_misses: IntCounterVec,
    pub(super) hot_cache_bytes: IntGaugeVec,
    // Per-listener families (label `listener`: the bound address, one per `proxy.listen`
    // entry): events, requests and open connections; the route each serves and its TLS
    // handshakes are read from `State` on gather.
    pub(super) listener_events: IntCounterVec,
    pub(super) listener_requests: IntCounterVec,
    pub(super) listener_connections: IntGaugeVec,
    pub(super) config_info: IntGaugeVec,
    pub(super) config_reload_time: IntGauge,
    pub(super) admin_refusals: IntCounterVec,
    pub(super) admin_evictions: IntCounterVec,
    /// The config-dependent state the collector reads at gather time.
    pub(super) state: Arc<Mutex<State>>,
    /// Label sets currently exported per family (so a reload can drop servers that left).
    pub(super) exported_servers: Mutex<Vec<(String, String)>>,
    pub(super) exported_routes: Mutex<Vec<String>>,
    pub(crate) flush: FlushBarrier,
    /// Reply bytes held for clients, process-wide (`max_buffered_replies`).
    pub(crate) replies: Arc<ReplyBudget>,
}

/// The live watch's hub with its families: watchers open, requests looked at, lines.
fn watch_hub(r: &Registry) -> WatchHub {
    let watchers = gauge(
        r,
        "memroute_watch_watchers",
        "Live watches of requests open now (GET /watch, memroute watch).",
    );
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
    pub fn round_trip_totals(&self, pool: &str, address: &str) -> prometheus::Histogram {
        self.backend_round_trip.with_label_values(&[pool, address])
    }

    /// Counts a new client connection, or refuses it (counted as rejected) when
    /// `max_connections` (0: no limit) are open already.
    pub(crate) fn admit_connection(&self, max_connections: usize) -> bool {
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
    pub(crate) fn connection_closed(&self) {
        self.open_connections.fetch_sub(1, Ordering::Relaxed);
        self.connections_current.dec();
    }

    pub fn new(workers: usize) -> Metrics {
        let registry = Registry::new();
        let r = &registry;
        let state = Arc::new(Mutex::new(State::default()));
        let started = Instant::now();
        let replies = Arc::new(ReplyBudget::default());
        let hot_keys = Arc::new(HotKeyRegistry::default());
        let collector = StateCollector::new(
            state.clone(),
            started,
            workers,
            replies.clone(),
            hot_keys.clone(),
        );
        register(r, collector, "state");
        let [connections_total, connections_rejected, get_keys, set_requests, touch_keys, flush_requests, get_hits, get_misses, client_errors, oversized_values, framing_closes, binary_connections, auth_cmds, auth_errors] =
            CLIENT_COUNTERS.map(|(name, help)| counter(r, name, help));
        let [connections_current, config_reload_time] =
            GAUGES.map(|(name, help)| gauge(r, name, help));
        let [requests, zone_reads, backend_errors, backend_timeouts, collapsed_gets, hot_cache_hits, hot_cache_misses, listener_events, listener_requests, admin_refusals, admin_evictions] =
            LABELLED_COUNTERS.map(|(name, help, labels)| counter_vec(r, name, help, labels));
        let [hot_cache_bytes, listener_connections, config_info] =
            LABELLED_GAUGES.map(|(name, help, labels)| gauge_vec(r, name, help, labels));
        let [request_duration, backend_round_trip] =
            LATENCY_HISTOGRAMS.map(|(name, help, labels)| histogram_vec(r, name, help, labels));
        Metrics {
            started,
            workers,
            hot_keys,
            watch: Arc::new(watch_hub(r)),
            open_connections: AtomicUsize::new(0),
            connections_current,
            connections_total,
            connections_rejected,
            get_keys,
            set_requests,
            touch_keys,
            flush_requests,
            get_hits,
            get_misses,
            client_errors,
            oversized_values,
            framing_closes,
            binary_connections,
            auth_cmds,
            auth_errors,
            requests,
            request_duration,
            backend_round_trip,
            zone_reads,
            backend_errors,
            backend_timeouts,
            collapsed_gets,
            hot_cache_hits,
            hot_cache_misses,
            hot_cache_bytes,
            listener_events,
            listener_requests,
            listener_connections,
            config_info,
            config_reload_time,
            admin_refusals,
            admin_evictions,
            registry,
            state,
            exported_servers: Mutex::new(Vec::new()),
            exported_routes: Mutex::new(Vec::new()),
            flush: FlushBarrier::new(workers),
            replies,
        }
    }

    /// Every listener's bound address, in `proxy.listen` order.
    pub fn set_listener_names(&self, names: Vec<String>) {
        lock(&self.state).listener_names = names;
    }

    /// The place in `proxy.listen` of the listener bound at `name` (`127.0.0.1:40123`).
    pub fn listener_index(&self, name: &str) -> Option<usize> {
        lock(&self.state)
            .listener_names
            .iter()
            .position(|bound| bound == name)
    }

    /// The root target each listener serves from now on, in `proxy.listen` order.
    pub(crate) fn set_listener_routes(&self, routes: Vec<String>) {
        lock(&self.state).listener_routes = routes;
    }

    pub fn set_tls_listeners(&self, listeners: Vec<(String, Arc<memroute_net::ServerTls>)>) {
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

    pub(crate) fn set_resize_stats(&self, resize: Vec<(String, Arc<ResizeStats>)>) {
        lock(&self.state).resize = resize;
    }

    pub fn count_lookup(&self, pool: &str, succeeded: bool) {
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
    pub fn collapsed_gets_of(&self, pool: &str) -> u64 {
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
    pub fn hot_cache_of(&self, pool: &str) -> (u64, u64) {
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
    pub fn count_admin_refusal(&self, reason: &str) {
        self.admin_refusals.with_label_values(&[reason]).inc();
    }

    /// Counts an idle admin connection closed to admit a new one past `limit`.
    pub fn count_admin_eviction(&self, limit: &str) {
        self.admin_evictions.with_label_values(&[limit]).inc();
    }

    /// The open-connections gauge of `listener` (resolve once per listener).
    pub(crate) fn listener_connections(&self, listener: &str) -> IntGauge {
        self.listener_connections.with_label_values(&[listener])
    }

    /// Where reloads from the config file are counted (exported as
    /// `memroute_config_reloads_total`).
    pub fn set_reload_counts(&self, counts: Arc<ReloadCounts>) {
        lock(&self.state).reloads = Some(counts);
    }

    /// The reloads counted so far, when a config file is being watched.
    pub fn reload_counts(&self) -> Option<Arc<ReloadCounts>> {
        lock(&self.state).reloads.clone()
    }

    /// Records the hash of the config now running.
    pub fn set_config_hash(&self, hash: &str) {
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
    pub async fn gather_fresh(&self) -> Vec<MetricFamily> {
        self.flush.flush_all(FLUSH_WAIT).await;
        self.registry.gather()
    }

    /// The registry in Prometheus' text exposition format.
    pub fn encode(families: &[MetricFamily]) -> String {
        use prometheus::Encoder as _;
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(error) = prometheus::TextEncoder::new().encode(families, &mut out) {
            tracing::warn!(%error, "cannot encode metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// The names of the running config's pools, in its order.
    pub fn pool_names(&self) -> Vec<String> {
        lock(&self.state)
            .pools
            .iter()
            .map(|(name, ..)| name.clone())
            .collect()
    }

    /// The address of the `index`-th server of `pool` in the running config.
    pub fn server_address(&self, pool: &str, index: usize) -> Option<String> {
        lock(&self.state)
            .health
            .iter()
            .filter(|h| &**h.pool() == pool)
            .nth(index)
            .map(|h| h.address().to_string())
    }
}

/// (name, help) of the client counters, in the order [`Metrics::new`] takes them.
const CLIENT_COUNTERS: [(&str, &str); 14] = [
    (
        "memroute_client_connections_total",
        "Client connections accepted.",
    ),
    (
        "memroute_client_connections_rejected_total",
        "Client connections closed at max_connections.",
    ),
    (
        "memroute_client_get_keys_total",
        "Keys asked for by retrieval commands (memcached's cmd_get).",
    ),
    (
        "memroute_client_set_requests_total",
        "Storage commands (memcached's cmd_set).",
    ),
    (
        "memroute_client_touch_keys_total",
        "Keys touched by touch, gat and gats (memcached's cmd_touch).",
    ),
    (
        "memroute_client_flush_requests_total",
        "flush_all commands (memcached's cmd_flush).",
    ),
    ("memroute_client_get_hits_total", "Keys found."),
    ("memroute_client_get_misses_total", "Keys not found."),
    (
        "memroute_client_errors_total",
        "Requests rejected as bad input.",
    ),
    (
        "memroute_client_oversized_values_total",
        "Storage requests refused for a value over max_value_size (text and binary).",
    ),
    (
        "memroute_client_framing_closes_total",
        "Client connections closed because their input could not be framed.",
    ),
    (
        "memroute_client_binary_connections_total",
        "Client connections that spoke the binary protocol (first byte 0x80).",
    ),
    (
        "memroute_client_auth_commands_total",
        "Logins tried on listeners that want one (text login sets and SASL PLAIN).",
    ),
    (
        "memroute_client_auth_errors_total",
        "Logins refused: a user or password the listener's authfile does not hold.",
    ),
];

/// (name, help) of the unlabelled gauges, in the order [`Metrics::new`] takes them.
const GAUGES: [(&str, &str); 2] = [
    (
        "memroute_client_connections_current",
        "Open client connections.",
    ),
    (
        "memroute_config_last_reload_timestamp_seconds",
        "Unix time the running config was applied.",
    ),
];

/// (name, help, labels) of the labelled counters, in the order [`Metrics::new`] takes them.
const LABELLED_COUNTERS: [(&str, &str, &[&str]); 11] = [
    (
        "memroute_client_requests_total",
        "Requests by command and by the pool or policy route they reached after prefix and operation routes (one per key for multi-key retrievals; (proxy) for requests memroute answers itself).",
        &["command", "route"],
    ),
    (
        "memroute_route_zone_reads_total",
        "Reads a replicated route reading `nearest` sent to a child, by locality: local (a child in the proxy's zone) or cross_zone (any other child: another zone, no zone, or a proxy without a zone). A read that fails over counts once per child asked.",
        &["route", "locality"],
    ),
    (
        "memroute_backend_errors_total",
        "Requests that got no reply from a server.",
        &["pool", "server"],
    ),
    (
        "memroute_backend_timeouts_total",
        "Requests that timed out.",
        &["pool", "server"],
    ),
    (
        COLLAPSED_GETS_FAMILY,
        "Gets that waited for the reply of an identical get already in flight on the same server connection instead of being sent.",
        &["pool"],
    ),
    (
        "memroute_hot_cache_hits_total",
        "Gets answered from the pool's hot-key cache (hot_cache) without a server.",
        &["pool"],
    ),
    (
        "memroute_hot_cache_misses_total",
        "Gets the pool's hot-key cache could have answered by their form but had no fresh copy for, sent to the server.",
        &["pool"],
    ),
    (
        "memroute_listener_events_total",
        "Events per listen address: accepted (client connections accepted there).",
        &["listener", "event"],
    ),
    (
        "memroute_listener_requests_total",
        "Requests (commands, a multi-get counts once) read from the clients of a listen address.",
        &["listener"],
    ),
    (
        "memroute_admin_refusals_total",
        "Admin requests and connections refused, by reason: per_peer and total (connection limits reached with every connection busy), not_loopback, cross_site, bad_token, token_file (POST /reload).",
        &["reason"],
    ),
    (
        "memroute_admin_evictions_total",
        "Idle admin connections closed to admit a new one, by the limit that was full: per_peer or total.",
        &["limit"],
    ),
];

/// (name, help, labels) of the labelled gauges, in the order [`Metrics::new`] takes them.
const LABELLED_GAUGES: [(&str, &str, &[&str]); 3] = [
    (
        "memroute_hot_cache_bytes",
        "Reply bytes held by the pool's hot-key cache, over all workers.",
        &["pool"],
    ),
    (
        "memroute_listener_connections_current",
        "Client connections open now on a listen address.",
        &["listener"],
    ),
    (
        "memroute_config_info",
        "1 for the hash of the running config (as GET /config shows it).",
        &["hash"],
    ),
];

/// (name, help, labels) of the latency histograms, in the order [`Metrics::new`] takes them.
const LATENCY_HISTOGRAMS: [(&str, &str, &[&str]); 2] = [
    (
        "memroute_client_request_duration_seconds",
        "Time from a request being read to its reply being ready, by the pool or policy route it reached: the latency a client sees through memroute.",
        &["route"],
    ),
    (
        "memroute_backend_round_trip_seconds",
        "Time from writing a request to a server until its reply was read.",
        &["pool", "server"],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

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
}
