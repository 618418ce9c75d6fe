//! The reply to `stats`: memcached's `STAT name value` lines, rendered from the same
//! gathered families `/metrics` shows, with the names memcached tools know.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use memroute_backend::ServerHealth;
use prometheus::proto::{self, MetricFamily, MetricType};

use super::families::lock;
use super::registry::{Metrics, COLLAPSED_GETS_FAMILY};
use super::state_collector::{HOT_KEY_FAMILY, LISTENER_ROUTE_FAMILY};
use crate::hot_keys::Report;

impl Metrics {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::WorkerMetrics;
    use memroute_routing::RouteTable;

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
