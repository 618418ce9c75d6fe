//! The admin endpoint: `GET /metrics` (Prometheus text format), `GET /healthz` (alive) and
//! `GET /ready` (not ready while draining).
//!
//! Served by one plain thread with blocking sockets: it is scraped a few times a
//! minute and must never compete with the workers' runtimes.
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use crate::stats::{SharedStats, WorkerStats};
use crate::ProxyError;

/// Binds the admin address and serves it on its own thread until the process exits.
/// `/ready` answers 503 once `draining` is set (SIGTERM), so a load balancer stops
/// sending new clients while memroute still serves them; `/healthz` stays 200.
pub(crate) fn start(
    address: &str,
    stats: Arc<SharedStats>,
    draining: Arc<AtomicBool>,
) -> Result<String, ProxyError> {
    let listener = TcpListener::bind(address).map_err(|source| ProxyError::Listen {
        address: address.to_string(),
        source,
    })?;
    let bound = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| address.to_string());
    std::thread::Builder::new()
        .name("memroute-admin".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(error) = answer(stream, &stats, &draining) {
                    tracing::debug!(%error, "admin request failed");
                }
            }
        })
        .map_err(ProxyError::Thread)?;
    Ok(bound)
}

fn answer(
    mut stream: TcpStream,
    stats: &SharedStats,
    draining: &AtomicBool,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut request = [0u8; 2048];
    let mut len = 0;
    // Read until the end of the request head (or the buffer is full: we only need the first line).
    while len < request.len() {
        let n = stream.read(&mut request[len..])?;
        if n == 0 {
            break;
        }
        len += n;
        if request[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let first_line = request[..len]
        .split(|&b| b == b'\n')
        .next()
        .unwrap_or_default();
    let (status, content_type, body) = if first_line.starts_with(b"GET /metrics") {
        ("200 OK", "text/plain; version=0.0.4", prometheus(stats))
    } else if first_line.starts_with(b"GET /healthz") {
        // Alive: the process answers. Draining does not change it (a liveness probe
        // failing during a drain could restart the pod mid-drain).
        ("200 OK", "text/plain", "ok\n".to_string())
    } else if first_line.starts_with(b"GET /ready") {
        // Minimal readiness: not ready once draining. (The metrics work extends /ready
        // with pool checks; the draining flag is the hook it keeps.)
        match draining.load(Relaxed) {
            true => (
                "503 Service Unavailable",
                "text/plain",
                "draining\n".to_string(),
            ),
            false => ("200 OK", "text/plain", "ready\n".to_string()),
        }
    } else {
        (
            "404 Not Found",
            "text/plain",
            "try /metrics, /healthz or /ready\n".to_string(),
        )
    };
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())
}

/// Metric names follow `memroute_<component>_<event>_<unit>`.
pub(crate) fn prometheus(stats: &SharedStats) -> String {
    let mut out = String::with_capacity(4096);
    let sum = |f: fn(&WorkerStats) -> &std::sync::atomic::AtomicU64| stats.total(f);
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        );
    };
    metric(
        "memroute_process_uptime_seconds",
        "gauge",
        "Seconds since memroute started.",
        stats.started.elapsed().as_secs(),
    );
    metric(
        "memroute_client_connections_current",
        "gauge",
        "Open client connections.",
        sum(|w| &w.curr_connections),
    );
    metric(
        "memroute_client_connections_total",
        "counter",
        "Client connections accepted.",
        sum(|w| &w.total_connections),
    );
    metric(
        "memroute_client_connections_rejected_total",
        "counter",
        "Client connections closed at max_connections.",
        sum(|w| &w.rejected_connections),
    );
    metric(
        "memroute_client_get_keys_total",
        "counter",
        "Keys asked for by retrieval commands.",
        sum(|w| &w.cmd_get),
    );
    metric(
        "memroute_client_set_requests_total",
        "counter",
        "Storage commands.",
        sum(|w| &w.cmd_set),
    );
    metric(
        "memroute_client_get_hits_total",
        "counter",
        "Keys found.",
        sum(|w| &w.get_hits),
    );
    metric(
        "memroute_client_get_misses_total",
        "counter",
        "Keys not found.",
        sum(|w| &w.get_misses),
    );
    metric(
        "memroute_client_errors_total",
        "counter",
        "Requests rejected as bad input.",
        sum(|w| &w.client_errors),
    );
    let _ = write!(
        out,
        "# HELP memroute_backend_errors_total Requests that got no reply from a server.\n# TYPE memroute_backend_errors_total counter\n"
    );
    for server in stats.servers().iter() {
        let _ = writeln!(
            out,
            "memroute_backend_errors_total{{pool=\"{}\",server=\"{}\"}} {}",
            server.pool,
            server.address,
            server.errors.load(Relaxed)
        );
    }
    let _ = write!(out, "# HELP memroute_backend_timeouts_total Requests that timed out.\n# TYPE memroute_backend_timeouts_total counter\n");
    for server in stats.servers().iter() {
        let _ = writeln!(
            out,
            "memroute_backend_timeouts_total{{pool=\"{}\",server=\"{}\"}} {}",
            server.pool,
            server.address,
            server.timeouts.load(Relaxed)
        );
    }
    policy_metrics(stats, &mut out);
    out
}

/// Health, policy-route, shadow and discovery metrics: one labelled family each.
fn policy_metrics(stats: &SharedStats, out: &mut String) {
    let snapshot = stats.snapshot();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, u64)>| {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
        for (labels, value) in rows {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    };
    let server = |h: &memroute_backend::ServerHealth| {
        format!("pool=\"{}\",server=\"{}\"", h.pool(), h.address())
    };
    family(
        "memroute_pool_servers",
        "gauge",
        "Servers in a pool (DNS pools change with discovery).",
        snapshot
            .pools
            .iter()
            .map(|(pool, n)| (format!("pool=\"{pool}\""), *n as u64))
            .collect(),
    );
    family(
        "memroute_backend_down",
        "gauge",
        "1 while a server is marked down.",
        snapshot
            .health
            .iter()
            .map(|h| (server(h), u64::from(h.is_down())))
            .collect(),
    );
    family(
        "memroute_backend_marked_down_total",
        "counter",
        "Times a server was marked down.",
        snapshot
            .health
            .iter()
            .map(|h| (server(h), h.marked_down_total()))
            .collect(),
    );
    family(
        "memroute_backend_marked_up_total",
        "counter",
        "Times a probe brought a server back.",
        snapshot
            .health
            .iter()
            .map(|h| (server(h), h.marked_up_total()))
            .collect(),
    );
    let route_rows = |f: fn(&crate::execute::RouteStats) -> &std::sync::atomic::AtomicU64| {
        snapshot
            .routes
            .iter()
            .map(|(route, c)| (format!("route=\"{route}\""), f(c).load(Relaxed)))
            .collect::<Vec<_>>()
    };
    family(
        "memroute_route_failovers_total",
        "counter",
        "Requests moved to the next child of a failover or replicated route.",
        route_rows(|c| &c.failovers),
    );
    family(
        "memroute_route_write_failures_total",
        "counter",
        "Replicated writes whose policy was not met.",
        route_rows(|c| &c.write_failures),
    );
    family(
        "memroute_route_fills_total",
        "counter",
        "Values a warm-up route copied from warm to cold.",
        route_rows(|c| &c.fills),
    );
    let mut shadow_rows = Vec::new();
    for (route, c) in &snapshot.shadows {
        for (outcome, counter) in [
            ("sent", &c.sent),
            ("completed", &c.completed),
            ("error", &c.errors),
            ("dropped", &c.dropped),
        ] {
            shadow_rows.push((
                format!("route=\"{route}\",outcome=\"{outcome}\""),
                counter.load(Relaxed),
            ));
        }
    }
    family(
        "memroute_shadow_requests_total",
        "counter",
        "Requests copied to a shadow target, by outcome.",
        shadow_rows,
    );
    let mut lookup_rows = Vec::new();
    for (pool, (ok, failed)) in &snapshot.lookups {
        lookup_rows.push((format!("pool=\"{pool}\",outcome=\"ok\""), *ok));
        lookup_rows.push((format!("pool=\"{pool}\",outcome=\"error\""), *failed));
    }
    family(
        "memroute_discovery_lookups_total",
        "counter",
        "DNS lookups of discovered pools, by outcome.",
        lookup_rows,
    );
}
