//! What an operator watches and how clients reach memroute: the admin endpoint (`GET /metrics`
//! in Prometheus text, `GET /healthz`), exact `stats` counters, a `unix:` listen address, and
//! `max_connections` closing connections past the limit.
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use memroute_tests::*;

/// `[proxy]` (one worker) with `extra_proxy_lines`, pool `main` over `servers`, and
/// `[admin] listen = admin` when given.
fn config(
    listen: &[String],
    extra_proxy_lines: &str,
    servers: &[String],
    admin: Option<&str>,
) -> String {
    let listen: Vec<String> = listen.iter().map(|l| format!("{l:?}")).collect();
    let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
    let admin = admin
        .map(|a| format!("\n[admin]\nlisten = \"{a}\"\n"))
        .unwrap_or_default();
    format!(
        "[proxy]\nlisten = [{}]\nworkers = 1\nroute = \"main\"\n{extra_proxy_lines}\n\
         [pools.main]\nservers = [{}]\ndistribution = \"ketama\"\nhash = \"md5\"\ntimeout = \"500ms\"\n{admin}",
        listen.join(", "),
        servers.join(", ")
    )
}

/// The value of one Prometheus sample line `name{labels} value` (or `name value`).
fn sample(metrics: &str, series: &str) -> Option<u64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
}

fn stat(stats: &[(String, String)], name: &str) -> u64 {
    stats
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in stats: {stats:?}"))
        .1
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn admin_endpoint_serves_metrics_and_healthz() {
    let mut servers = [Memcached::start(), Memcached::start()];
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&[listen], "", &addrs, Some(&admin)));

    let (status, body) = admin_http(&admin, "GET", "/healthz");
    assert_eq!(status, 200, "/healthz");
    assert_eq!(body.trim(), "ok", "/healthz body");

    // Some traffic, and a failure on server 1 (killed) to see per-server errors move.
    let mut c = proxy.connect();
    let keys: Vec<String> = (0..40).map(|i| format!("adm{i}")).collect();
    for k in &keys {
        c.set(k, b"v");
    }
    let on_1: Vec<&String> = keys
        .iter()
        .filter(|k| servers[1].connect().get(k).is_some())
        .collect();
    assert!(
        !on_1.is_empty() && on_1.len() < keys.len(),
        "keys on both servers"
    );
    c.send(format!("get {} {}\r\n", keys[0], keys[1]).as_bytes());
    c.read_get_reply();
    servers[1].kill();
    let reply = c.roundtrip_line(format!("get {}\r\n", on_1[0]).as_bytes());
    assert!(
        reply.starts_with(b"SERVER_ERROR "),
        "get on a killed server: {}",
        show(&reply)
    );

    let (status, metrics) = admin_http(&admin, "GET", "/metrics");
    assert_eq!(status, 200, "/metrics");
    for needle in [
        "# TYPE memroute_client_get_keys_total counter",
        "# TYPE memroute_backend_errors_total counter",
        "# TYPE memroute_backend_timeouts_total counter",
        "memroute_client_connections_current",
    ] {
        assert!(
            metrics.contains(needle),
            "/metrics lacks {needle:?}:\n{metrics}"
        );
    }
    assert_eq!(
        sample(&metrics, "memroute_client_get_keys_total"),
        Some(3),
        "a 2-key get and a 1-key get:\n{metrics}"
    );
    assert_eq!(
        sample(&metrics, "memroute_client_set_requests_total"),
        Some(40),
        "{metrics}"
    );
    let errors_0 = sample(
        &metrics,
        &format!(
            "memroute_backend_errors_total{{pool=\"main\",server=\"{}\"}}",
            addrs[0]
        ),
    );
    let errors_1 = sample(
        &metrics,
        &format!(
            "memroute_backend_errors_total{{pool=\"main\",server=\"{}\"}}",
            addrs[1]
        ),
    );
    assert_eq!(
        errors_0,
        Some(0),
        "no errors for the live server:\n{metrics}"
    );
    assert!(
        errors_1.is_some_and(|n| n >= 1),
        "errors for the killed server {}: {errors_1:?}\n{metrics}",
        addrs[1]
    );
    for addr in &addrs {
        let series = format!("memroute_backend_timeouts_total{{pool=\"main\",server=\"{addr}\"}}");
        assert!(
            sample(&metrics, &series).is_some(),
            "{series} missing:\n{metrics}"
        );
    }

    let (status, _) = admin_http(&admin, "GET", "/nothing-here");
    assert_eq!(status, 404, "unknown path");
}

#[test]
fn stats_counters_are_exact() {
    let servers = [Memcached::start(), Memcached::start()];
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&[listen], "", &addrs, None));
    let mut c = proxy.connect();

    let zero = c.stats();
    for name in ["cmd_get", "cmd_set", "get_hits", "get_misses"] {
        assert_eq!(stat(&zero, name), 0, "{name} at start");
    }

    // 3 sets.
    for k in ["st-a", "st-b", "st-c"] {
        c.set(k, k.as_bytes());
    }
    // 5 single-key gets, 2 of them misses.
    for k in ["st-a", "st-b", "st-c"] {
        assert_eq!(c.get(k).as_deref(), Some(k.as_bytes()));
    }
    for k in ["st-x", "st-y"] {
        assert_eq!(c.get(k), None);
    }
    // One 4-key multi-get with 1 miss.
    c.send(b"get st-a st-z st-b st-c\r\n");
    let reply = c.read_get_reply();
    let found: Vec<String> = parse_values(&reply)
        .unwrap_or_else(|| panic!("multi-get: {}", show(&reply)))
        .into_iter()
        .map(|(k, _, _)| k)
        .collect();
    assert_eq!(found, ["st-a", "st-b", "st-c"]);

    let stats = c.stats();
    let got: Vec<(&str, u64)> = ["cmd_get", "cmd_set", "get_hits", "get_misses"]
        .iter()
        .map(|&n| (n, stat(&stats, n)))
        .collect();
    assert_eq!(
        got,
        [
            ("cmd_get", 9),
            ("cmd_set", 3),
            ("get_hits", 6),
            ("get_misses", 3)
        ],
        "cmd_get counts keys (5 + 4); hits 3 + 3; misses 2 + 1"
    );
    assert_eq!(stat(&stats, "curr_connections"), 1);
    assert_eq!(stat(&stats, "total_connections"), 1);
    assert_eq!(stat(&stats, "threads"), 1);
    assert_eq!(stat(&stats, "pid"), u64::from(proxy.pid()));
    for addr in &addrs {
        assert_eq!(stat(&stats, &format!("server:main:{addr}:errors")), 0);
        assert_eq!(stat(&stats, &format!("server:main:{addr}:timeouts")), 0);
    }
    // `stats` itself and `stats <arg>` count nothing.
    assert_eq!(c.roundtrip_line(b"stats items\r\n"), b"ERROR\r\n");
    let again = c.stats();
    for name in ["cmd_get", "cmd_set", "get_hits", "get_misses"] {
        assert_eq!(
            stat(&again, name),
            stat(&stats, name),
            "{name} moved on stats"
        );
    }
}

#[test]
fn unix_socket_listener_serves_clients() {
    let backend = Memcached::start();
    let dir = TempDir::new("unix");
    let sock = dir.path().join("memroute.sock");
    let tcp = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(
        &[tcp, format!("unix:{}", sock.display())],
        "",
        &[backend.addr()],
        None,
    ));
    assert!(sock.exists(), "{} not created", sock.display());

    let mut u =
        UnixStream::connect(&sock).unwrap_or_else(|e| panic!("connect {}: {e}", sock.display()));
    u.set_read_timeout(Some(IO_TIMEOUT))
        .expect("set read timeout");
    u.set_write_timeout(Some(IO_TIMEOUT))
        .expect("set write timeout");
    u.write_all(b"set via-unix 5 0 3\r\nabc\r\nget via-unix\r\nversion\r\n")
        .expect("send request");
    let expected = b"STORED\r\nVALUE via-unix 5 3\r\nabc\r\nEND\r\nVERSION 1.6.0 memroute";
    let mut got = Vec::new();
    let deadline = Instant::now() + IO_TIMEOUT;
    while !(got.len() >= expected.len() && got.ends_with(b"\r\n")) {
        assert!(Instant::now() < deadline, "unix reply: {}", show(&got));
        let mut buf = [0u8; 1024];
        let n = u
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("read unix: {e} after {}", show(&got)));
        assert!(n > 0, "unix socket closed after {}", show(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(expected),
        "over the unix socket: {}",
        show(&got)
    );

    // The same data through TCP and straight from memcached.
    assert_eq!(
        proxy.connect().get("via-unix").as_deref(),
        Some(&b"abc"[..])
    );
    assert_eq!(
        backend.connect().get("via-unix").as_deref(),
        Some(&b"abc"[..])
    );
}

#[test]
fn connections_past_max_connections_are_closed() {
    let backend = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(
        &[listen],
        "max_connections = 2",
        &[backend.addr()],
        None,
    ));

    let mut first = proxy.connect();
    first.set("mc-k", b"1");
    let mut second = proxy.connect();
    assert_eq!(second.get("mc-k").as_deref(), Some(&b"1"[..]));

    // The third is accepted by the kernel, then closed by memroute without a reply. Nothing
    // is sent on it: data unread at close would turn memroute's FIN into a reset.
    let mut third = proxy.connect();
    assert!(
        third.expect_eof(),
        "a third connection past max_connections = 2 was not closed by memroute"
    );

    // The first two still work.
    assert_eq!(first.get("mc-k").as_deref(), Some(&b"1"[..]));
    second.set("mc-k", b"2");
    assert_eq!(first.get("mc-k").as_deref(), Some(&b"2"[..]));
    let stats = first.stats();
    assert_eq!(stat(&stats, "curr_connections"), 2);
    assert_eq!(stat(&stats, "rejected_connections"), 1);

    // Once one closes, a new connection is served again. memroute notices the close
    // asynchronously: poll curr_connections (bounded) before connecting.
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(&first.stats(), "curr_connections") != 1 {
        assert!(
            Instant::now() < deadline,
            "curr_connections never went back to 1"
        );
        // Poll interval; the deadline above bounds the loop.
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut fourth = proxy.connect();
    assert!(fourth
        .roundtrip_line(b"version\r\n")
        .starts_with(b"VERSION "));
    assert_eq!(fourth.get("mc-k").as_deref(), Some(&b"2"[..]));
}
