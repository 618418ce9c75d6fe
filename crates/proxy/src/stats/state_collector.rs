//! Reads the config-dependent state at gather time (health, pools, policy routes, shadows,
//! DNS lookups, TLS handshakes, resize windows, hot keys) where the proxy already keeps it,
//! and hands it to the registry as families: the panel and `/metrics` read these, and
//! `stats` shows them as STAT lines.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use memroute_backend::ServerHealth;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};

use super::families::{lock, unreachable_metric};
use crate::counters::{ReloadCounts, ReplyBudget, ResizeStats, RouteStats, ShadowStats};
use crate::hot_keys::{HotKeyRegistry, Report};

/// What the collector reads on every gather; replaced piecewise on reload.
#[derive(Debug, Default)]
pub(super) struct State {
    /// (pool, servers now, most servers out of the ring at once when the pool ejects).
    pub(super) pools: Vec<(String, usize, Option<usize>)>,
    pub(super) health: Vec<Arc<ServerHealth>>,
    pub(super) routes: Vec<(String, Arc<RouteStats>)>,
    pub(super) shadows: Vec<(String, Arc<ShadowStats>)>,
    /// Resize window counters per pool.
    pub(super) resize: Vec<(String, Arc<ResizeStats>)>,
    /// DNS lookups per pool: (succeeded, failed).
    pub(super) lookups: BTreeMap<String, (u64, u64)>,
    /// Reloads from the config file (kept by memroute-control's `reload.rs`, the one reload path).
    pub(super) reloads: Option<Arc<ReloadCounts>>,
    /// Every listener's bound address, in `proxy.listen` order (set once at start).
    pub(super) listener_names: Vec<String>,
    /// The root target each listener serves now, in the same order (set by every reload).
    pub(super) listener_routes: Vec<String>,
    /// TLS listeners (bound address, handshake counters) and backend connectors (pool).
    pub(super) tls_listeners: Vec<(String, Arc<memroute_net::ServerTls>)>,
    pub(super) connectors: Vec<(String, Arc<memroute_net::Connector>)>,
}

/// Reads the config-dependent state at gather time: health, pools, policy routes, shadow
/// routes and DNS lookups are kept where the proxy already keeps them (atomics shared by
/// workers, off the request path), not copied into the registry.
#[derive(Debug)]
pub(super) struct StateCollector {
    state: Arc<Mutex<State>>,
    started: Instant,
    workers: usize,
    replies: Arc<ReplyBudget>,
    hot_keys: Arc<HotKeyRegistry>,
    descs: Vec<Desc>,
}

/// The top key's share per pool: a fraction, shown by `stats` as hot_key lines instead.
pub(super) const HOT_KEY_FAMILY: &str = "memroute_hot_key_share";

/// The info family naming each listener's root target.
pub(super) const LISTENER_ROUTE_FAMILY: &str = "memroute_listener_route_info";

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
    pub(super) fn new(
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
        let health = |value: fn(&ServerHealth) -> f64| state.health_rows(value);
        let routes = |value: fn(&RouteStats) -> &AtomicU64| state.route_rows(value);
        let resize = |value: fn(&ResizeStats) -> u64| state.resize_rows(value);
        let one = |value: f64| vec![(vec![], value)];
        vec![
            family(0, one(self.started.elapsed().as_secs() as f64)),
            family(1, one(self.workers as f64)),
            family(2, state.pool_rows()),
            family(3, state.ejected_rows()),
            family(4, health(|h| f64::from(u8::from(h.is_down())))),
            family(5, health(|h| h.marked_down_total() as f64)),
            family(6, health(|h| h.marked_up_total() as f64)),
            family(7, routes(|c| &c.failovers)),
            family(8, routes(|c| &c.write_failures)),
            family(9, routes(|c| &c.fills)),
            family(10, state.shadow_rows()),
            family(11, state.lookup_rows()),
            family(12, health(|h| h.open_connections() as f64)),
            family(13, state.reload_rows()),
            family(14, one(self.replies.used() as f64)),
            family(15, one(self.replies.paused_total.load(Relaxed) as f64)),
            family(16, one(self.replies.slow_closed_total.load(Relaxed) as f64)),
            family(17, state.listener_tls_rows()),
            family(18, state.backend_tls_rows()),
            family(19, state.listener_route_rows()),
            family(20, self.hot_key_rows()),
            family(21, resize(|s| u64::from(s.active.load(Relaxed)))),
            family(22, resize(|s| s.fallback_reads.load(Relaxed))),
            family(23, resize(|s| s.keys_moved.load(Relaxed))),
            family(24, resize(|s| s.errors.load(Relaxed))),
            family(25, health(|h| h.login_failures_total() as f64)),
        ]
    }
}

impl StateCollector {
    /// The top key's share of each pool.
    fn hot_key_rows(&self) -> Vec<Row> {
        let report = self.hot_keys.report(1);
        report
            .pools
            .iter()
            .map(|pool| {
                let share = pool.keys.first().map_or(0.0, |k| Report::share(pool, k));
                (vec![pool.pool.clone()], share)
            })
            .collect()
    }
}

/// The rows of each family read from [`State`], one function per kind of thing counted.
impl State {
    /// One row per server, labelled (pool, server).
    fn health_rows(&self, value: fn(&ServerHealth) -> f64) -> Vec<Row> {
        self.health
            .iter()
            .map(|h| {
                (
                    vec![h.pool().to_string(), h.address().to_string()],
                    value(h),
                )
            })
            .collect()
    }

    fn route_rows(&self, counter: fn(&RouteStats) -> &AtomicU64) -> Vec<Row> {
        self.routes
            .iter()
            .map(|(route, c)| (vec![route.clone()], counter(c).load(Relaxed) as f64))
            .collect()
    }

    fn resize_rows(&self, value: fn(&ResizeStats) -> u64) -> Vec<Row> {
        self.resize
            .iter()
            .map(|(pool, stats)| (vec![pool.clone()], value(stats) as f64))
            .collect()
    }

    fn pool_rows(&self) -> Vec<Row> {
        self.pools
            .iter()
            .map(|(pool, n, _)| (vec![pool.clone()], *n as f64))
            .collect()
    }

    /// Servers out of the ring of each ejecting pool: those down, at most its maximum.
    fn ejected_rows(&self) -> Vec<Row> {
        let ejected = |pool: &str, max: usize| {
            let down = self
                .health
                .iter()
                .filter(|h| &**h.pool() == pool && h.is_down())
                .count();
            down.min(max) as f64
        };
        self.pools
            .iter()
            .filter_map(|(pool, _, max)| Some((vec![pool.clone()], ejected(pool, (*max)?))))
            .collect()
    }

    fn shadow_rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        for (route, c) in &self.shadows {
            for (outcome, counter) in [
                ("sent", &c.sent),
                ("completed", &c.completed),
                ("error", &c.errors),
                ("dropped", &c.dropped),
            ] {
                rows.push((
                    vec![route.clone(), outcome.to_string()],
                    counter.load(Relaxed) as f64,
                ));
            }
        }
        rows
    }

    fn lookup_rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        for (pool, (ok, failed)) in &self.lookups {
            rows.push((vec![pool.clone(), "ok".to_string()], *ok as f64));
            rows.push((vec![pool.clone(), "error".to_string()], *failed as f64));
        }
        rows
    }

    fn reload_rows(&self) -> Vec<Row> {
        match &self.reloads {
            Some(counts) => vec![
                (vec!["ok".to_string()], counts.ok() as f64),
                (vec!["failed".to_string()], counts.failed() as f64),
            ],
            None => Vec::new(),
        }
    }

    fn listener_tls_rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        for (name, tls) in &self.tls_listeners {
            for (kind, value) in crate::transport::handshake_counts(&tls.counters) {
                rows.push((vec![name.clone(), kind.to_string()], value as f64));
            }
        }
        rows
    }

    fn backend_tls_rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        for (pool, connector) in self.connectors.iter().filter(|(_, c)| c.is_tls()) {
            let address = connector.address().to_string();
            // Backend connects have no handshake timeout of their own (connect_timeout).
            for (kind, value) in crate::transport::handshake_counts(&connector.counters)
                .into_iter()
                .take(3)
            {
                rows.push((
                    vec![pool.clone(), address.clone(), kind.to_string()],
                    value as f64,
                ));
            }
        }
        rows
    }

    fn listener_route_rows(&self) -> Vec<Row> {
        self.listener_names
            .iter()
            .zip(&self.listener_routes)
            .map(|(listener, route)| (vec![listener.clone(), route.clone()], 1.0))
            .collect()
    }
}
