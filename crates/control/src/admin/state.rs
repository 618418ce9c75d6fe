//! `GET /state`: everything the panel shows, as one JSON document (scripts may use it too;
//! docs/operations.md describes its fields). Rates and latency percentiles are over the
//! time since the previous `/state` (at least [`MIN_RATE_WINDOW`]), so a panel refreshing
//! every second or two shows what is happening now, not since the process started.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memroute_config::{gutter_description, Config, RouteConfig};
use prometheus::proto::{Metric, MetricFamily};
use serde_json::{json, Value};

use memroute_backend::ServerHealth;
use memroute_proxy::generation::Generation;
use memroute_proxy::stats::Metrics;

/// Rates are computed over at least this long; a faster poll reuses the last window.
const MIN_RATE_WINDOW: Duration = Duration::from_millis(500);

/// One server's cumulative counts at one moment.
#[derive(Debug, Clone, Default)]
struct ServerCounts {
    requests: u64,
    /// Cumulative histogram bucket counts (upper bound in seconds, count).
    buckets: Vec<(f64, u64)>,
}

/// Counts per (pool, server address).
type PerServer = HashMap<(String, String), ServerCounts>;

/// What the last `/state` saw, to turn cumulative counts into rates.
#[derive(Debug, Default)]
pub(crate) struct RateMemory {
    last: Mutex<Option<(Instant, PerServer)>>,
    /// The window last answered: (length, per-server deltas), reused by a faster poll.
    window: Mutex<Option<(Duration, PerServer)>>,
}

/// The whole state document: the running `generation`, what the workers counted
/// (`metrics`, `families`), and why memroute is not `ready` (empty when it is).
pub(crate) fn state(
    metrics: &Metrics,
    generation: &Generation,
    rates: &RateMemory,
    ready: Vec<String>,
    families: &[MetricFamily],
) -> Value {
    let config = &generation.config;
    let by_name: HashMap<&str, &MetricFamily> =
        families.iter().map(|f| (f.get_name(), f)).collect();
    let family = |name: &str| by_name.get(name).copied();
    let counts = by_labels(
        family("memroute_backend_round_trip_seconds"),
        pool_and_server,
        histogram_counts,
    );
    let (window, deltas) = rates.window(counts.clone(), metrics.started.elapsed());
    let seen = Seen {
        errors: by_labels(
            family("memroute_backend_errors_total"),
            pool_and_server,
            counter,
        ),
        timeouts: by_labels(
            family("memroute_backend_timeouts_total"),
            pool_and_server,
            counter,
        ),
        counts,
        deltas,
        window,
    };
    let failovers = by_labels(
        family("memroute_route_failovers_total"),
        |metric| label(metric, "route"),
        counter,
    );
    let mut pools = Vec::new();
    for (id, name) in generation.routes.pool_names.iter().enumerate() {
        let Some(pool) = config.pools.get(name) else {
            continue;
        };
        let healths = generation.health.get(id).map_or(&[][..], |h| &h[..]);
        pools.push(json!({
            "name": name,
            "zone": pool.zone,
            "distribution": pool.distribution.as_str(),
            "hash": pool.hash.as_str(),
            "eject": pool.eject,
            "servers": servers(name, pool.eject, healths, &seen),
        }));
    }
    json!({
        "version": memroute_proxy::VERSION,
        "now": unix_seconds(SystemTime::now()),
        "uptime_seconds": metrics.started.elapsed().as_secs(),
        "workers": metrics.workers,
        "zone": config.proxy.zone.as_ref().map(|zone| zone.name.clone()),
        "window_seconds": window.as_secs_f64(),
        "ready": ready,
        "listeners": listeners(config, &failovers),
        "routing_prefixes": routing_prefixes(config, &failovers),
        "pools": pools,
        "hot_keys": super::hot_keys::report(metrics, 5),
        "reloads": reloads(metrics),
    })
}

/// What the servers' counters say: since start (`counts`, `errors`, `timeouts`) and over
/// the rate window (`deltas` over `window`).
struct Seen {
    counts: PerServer,
    deltas: PerServer,
    window: Duration,
    errors: HashMap<(String, String), u64>,
    timeouts: HashMap<(String, String), u64>,
}

/// The servers of pool `name` (which ejects when `eject`), with their health and counts.
fn servers(name: &str, eject: bool, healths: &[Arc<ServerHealth>], seen: &Seen) -> Vec<Value> {
    let Seen {
        counts,
        deltas,
        window,
        errors,
        timeouts,
    } = seen;
    let rates: Vec<f64> = healths
        .iter()
        .map(|h| {
            let key = (name.to_string(), h.address().to_string());
            deltas.get(&key).map_or(0.0, |d| d.requests as f64) / window.as_secs_f64()
        })
        .collect();
    let requests: u64 = healths
        .iter()
        .map(|h| {
            let key = (name.to_string(), h.address().to_string());
            deltas.get(&key).map_or(0, |d| d.requests)
        })
        .sum();
    let loads = loads_vs_mean(&rates, requests);
    healths
        .iter()
        .zip(&rates)
        .zip(loads)
        .map(|((health, rate), load_vs_mean)| {
            let key = (name.to_string(), health.address().to_string());
            let recent = deltas.get(&key);
            let state = match (health.is_down(), eject) {
                (false, _) => "up",
                (true, true) => "ejected",
                (true, false) => "down",
            };
            let (last_error, last_error_at) = match health.last_failure() {
                Some((at, reason)) => (Some(reason.to_string()), Some(unix_seconds(at))),
                None => (None, None),
            };
            json!({
                "address": health.address().to_string(),
                "state": state,
                "down_reason": health.is_down().then(|| health.down_reason().to_string()),
                "connections": health.open_connections(),
                "requests_per_second": rate,
                "requests_total": counts.get(&key).map_or(0, |c| c.requests),
                "p50_ms": recent.and_then(|d| quantile(&d.buckets, 0.50)).map(|s| s * 1e3),
                "p99_ms": recent.and_then(|d| quantile(&d.buckets, 0.99)).map(|s| s * 1e3),
                "errors_total": errors.get(&key).copied().unwrap_or(0),
                "timeouts_total": timeouts.get(&key).copied().unwrap_or(0),
                "last_error": last_error,
                "last_error_at": last_error_at,
                // This server's requests against its pool's mean: 1.0 is an even share.
                "load_vs_mean": load_vs_mean,
            })
        })
        .collect()
}

/// Each listener with the route tree it serves.
fn listeners(config: &Config, failovers: &HashMap<String, u64>) -> Vec<Value> {
    config
        .proxy
        .listen
        .iter()
        .map(|listen| {
            let route = config.proxy.route_of(listen);
            json!({
                "address": listen.to_string(),
                "route": route,
                "routing_prefix": config.routing_prefixes.of_listener(listen),
                "tree": tree(config, failovers, route, 0),
            })
        })
        .collect()
}

/// mcrouter's routing prefixes: the route each names, and the key its servers get.
fn routing_prefixes(config: &Config, failovers: &HashMap<String, u64>) -> Vec<Value> {
    config
        .routing_prefixes
        .prefixes
        .iter()
        .map(|(prefix, route)| {
            let kept = config.routing_prefixes.keeps(route, &config.routes);
            json!({
                "prefix": prefix,
                "route": route,
                "key_sent": if kept { "with the prefix" } else { "without the prefix" },
                "tree": tree(config, failovers, route, 0),
            })
        })
        .collect()
}

/// The last few reloads, newest first.
fn reloads(metrics: &Metrics) -> Vec<Value> {
    metrics
        .reload_counts()
        .map(|counts| counts.recent())
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            json!({
                "at": unix_seconds(r.at),
                "trigger": r.trigger,
                "applied": r.applied,
                "detail": r.detail,
            })
        })
        .collect()
}

/// The route tree under `name`: a pool is a leaf, a route lists its children. A route
/// that has failed over carries how often (`failovers`, by route name).
fn tree(config: &Config, failovers: &HashMap<String, u64>, name: &str, depth: usize) -> Value {
    // Config checking rejects cycles; the bound keeps a panel request finite regardless.
    if depth > 32 {
        return json!({ "name": name, "kind": "..." });
    }
    if let Some(pool) = config.pools.get(name) {
        return json!({ "name": name, "kind": "pool", "detail": match pool.servers.len() { 1 => "1 server".to_string(), n => format!("{n} servers") } });
    }
    let Some(route) = config.routes.get(name) else {
        return json!({ "name": name, "kind": "unknown" });
    };
    let child = |n: &str| tree(config, failovers, n, depth + 1);
    let labelled = |label: String, n: &str| {
        let mut node = child(n);
        node["via"] = Value::String(label);
        node
    };
    let (kind, detail, children): (&str, String, Vec<Value>) = match route {
        RouteConfig::Prefix { prefixes, default } => (
            "prefix",
            String::new(),
            prefixes
                .iter()
                .map(|(p, t)| labelled(format!("{p}*"), t))
                .chain([labelled("default".into(), default)])
                .collect(),
        ),
        RouteConfig::Operation {
            operations,
            default,
        } => (
            "operation",
            String::new(),
            operations
                .iter()
                .map(|(op, t)| labelled(op.as_str().to_string(), t))
                .chain([labelled("default".into(), default)])
                .collect(),
        ),
        RouteConfig::Shadow {
            primary, shadow, ..
        } => (
            "shadow",
            String::new(),
            vec![
                labelled("primary".into(), primary),
                labelled("shadow".into(), shadow),
            ],
        ),
        RouteConfig::Replicated {
            children,
            writes,
            reads,
        } => (
            "replicated",
            format!("writes {}, reads {}", writes.as_str(), reads.as_str()),
            children.iter().map(|c| child(c)).collect(),
        ),
        RouteConfig::Failover {
            children,
            errors,
            exptime_cap,
            ..
        } => (
            "failover",
            format!("in order{}", gutter_description(*errors, *exptime_cap)),
            children.iter().map(|c| child(c)).collect(),
        ),
        RouteConfig::WarmUp { cold, warm, ttl } => (
            "warm-up",
            format!("fill ttl {ttl} s"),
            vec![labelled("cold".into(), cold), labelled("warm".into(), warm)],
        ),
        RouteConfig::Random { children } => (
            "random",
            String::new(),
            children.iter().map(|c| child(c)).collect(),
        ),
        RouteConfig::Null => ("null", "answers misses".to_string(), Vec::new()),
        RouteConfig::Error { message } => ("error", message.clone(), Vec::new()),
    };
    let failed_over = failovers.get(name).copied();
    json!({ "name": name, "kind": kind, "detail": detail, "failovers": failed_over, "children": children })
}

impl RateMemory {
    /// The per-server deltas since the previous call (and the window's length), or the
    /// previous window when that call was less than [`MIN_RATE_WINDOW`] ago.
    fn window(&self, now_counts: PerServer, uptime: Duration) -> (Duration, PerServer) {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some((at, _)), Some(kept)) = (&*last, &*window) {
            if now.duration_since(*at) < MIN_RATE_WINDOW {
                return kept.clone();
            }
        }
        let (length, deltas) = match &*last {
            // The first call: counts since the process started.
            None => (uptime.max(MIN_RATE_WINDOW), now_counts.clone()),
            Some((at, before)) => {
                let deltas = now_counts
                    .iter()
                    .map(|(key, counts)| {
                        let earlier = before.get(key);
                        (key.clone(), counts.since(earlier))
                    })
                    .collect();
                (now.duration_since(*at), deltas)
            }
        };
        *last = Some((now, now_counts));
        *window = Some((length, deltas.clone()));
        (length, deltas)
    }
}

impl ServerCounts {
    fn since(&self, earlier: Option<&ServerCounts>) -> ServerCounts {
        let Some(earlier) = earlier else {
            return self.clone();
        };
        ServerCounts {
            requests: self.requests.saturating_sub(earlier.requests),
            buckets: self
                .buckets
                .iter()
                .zip(
                    earlier
                        .buckets
                        .iter()
                        .map(|b| b.1)
                        .chain(std::iter::repeat(0)),
                )
                .map(|((bound, count), before)| (*bound, count.saturating_sub(before)))
                .collect(),
        }
    }
}

/// The `q` quantile (seconds) of cumulative buckets, interpolated within its bucket as
/// Prometheus' histogram_quantile does; `None` without samples.
fn quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, count) in buckets {
        if count as f64 >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let in_bucket = (count - lower.1) as f64;
            let fraction = match in_bucket {
                n if n > 0.0 => (rank - lower.1 as f64) / n,
                _ => 1.0,
            };
            return Some(lower.0 + (bound - lower.0) * fraction);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

/// The value of `metric`'s label `name`.
fn label(metric: &Metric, name: &str) -> Option<String> {
    metric
        .get_label()
        .iter()
        .find(|l| l.get_name() == name)
        .map(|l| l.get_value().to_string())
}

/// A server's family's key: its `pool` and `server` labels.
fn pool_and_server(metric: &Metric) -> Option<(String, String)> {
    Some((label(metric, "pool")?, label(metric, "server")?))
}

/// A counter's value.
fn counter(metric: &Metric) -> u64 {
    metric.get_counter().get_value() as u64
}

/// A round-trip histogram as `ServerCounts`: its requests and cumulative buckets.
fn histogram_counts(metric: &Metric) -> ServerCounts {
    let histogram = metric.get_histogram();
    let mut buckets: Vec<(f64, u64)> = histogram
        .get_bucket()
        .iter()
        .map(|b| (b.get_upper_bound(), b.get_cumulative_count()))
        .collect();
    buckets.push((f64::INFINITY, histogram.get_sample_count()));
    ServerCounts {
        requests: histogram.get_sample_count(),
        buckets,
    }
}

/// Each metric of `family` (none when it was not gathered), keyed by its labels (`key`;
/// a metric without them is left out) and read by `value`.
fn by_labels<K: std::hash::Hash + Eq, V>(
    family: Option<&MetricFamily>,
    key: impl Fn(&Metric) -> Option<K>,
    value: impl Fn(&Metric) -> V,
) -> HashMap<K, V> {
    family
        .into_iter()
        .flat_map(|family| family.get_metric())
        .filter_map(|metric| Some((key(metric)?, value(metric))))
        .collect()
}

/// A pool's load is compared across its servers only once the window holds this many
/// requests per server: with fewer, chance alone puts one server far from the mean (an
/// idle pool's one request makes its server "2.00x" of two).
const LOAD_MIN_REQUESTS_PER_SERVER: u64 = 20;

/// Each server's request rate against its pool's mean rate (1.0 is an even share), `None`
/// for all while the pool's `requests` in the window are too few to say.
fn loads_vs_mean(rates: &[f64], requests: u64) -> Vec<Option<f64>> {
    let enough = requests >= LOAD_MIN_REQUESTS_PER_SERVER * rates.len() as u64;
    let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    rates
        .iter()
        .map(|rate| (enough && mean > 0.0).then(|| rate / mean))
        .collect()
}

fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        let buckets = [(0.001, 50), (0.002, 90), (0.004, 100), (f64::INFINITY, 100)];
        let p50 = quantile(&buckets, 0.5).expect("samples");
        assert!((p50 - 0.001).abs() < 1e-9, "{p50}");
        let p99 = quantile(&buckets, 0.99).expect("samples");
        assert!(p99 > 0.002 && p99 <= 0.004, "{p99}");
        assert_eq!(quantile(&[(0.001, 0), (f64::INFINITY, 0)], 0.5), None);
    }

    #[test]
    fn load_is_compared_once_the_window_holds_enough_requests() {
        // An idle pool: one request in the window on one of two servers says nothing.
        assert_eq!(loads_vs_mean(&[0.5, 0.0], 1), vec![None, None]);
        assert_eq!(loads_vs_mean(&[0.0, 0.0], 0), vec![None, None]);
        // 20 per server: compared (one server with everything is 2x the mean).
        assert_eq!(loads_vs_mean(&[20.0, 20.0], 40), vec![Some(1.0), Some(1.0)]);
        assert_eq!(loads_vs_mean(&[40.0, 0.0], 40), vec![Some(2.0), Some(0.0)]);
        assert_eq!(loads_vs_mean(&[], 0), Vec::<Option<f64>>::new());
    }

    #[test]
    fn deltas_are_taken_bucket_by_bucket() {
        let before = ServerCounts {
            requests: 10,
            buckets: vec![(0.001, 8), (f64::INFINITY, 10)],
        };
        let after = ServerCounts {
            requests: 30,
            buckets: vec![(0.001, 10), (f64::INFINITY, 30)],
        };
        let delta = after.since(Some(&before));
        assert_eq!(delta.requests, 20);
        assert_eq!(delta.buckets, vec![(0.001, 2), (f64::INFINITY, 20)]);
    }
}
