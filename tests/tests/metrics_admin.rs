//! Metrics an operator can trust and the admin endpoint:
//! `/metrics` parses under a strict reading of the Prometheus text format (escaped label
//! values included) and carries latency histograms after traffic; `stats` and `/metrics`
//! agree; `/ready` follows the backends; `/config` shows the running file and its md5;
//! `POST /reload` applies or rejects; `/route` and `memroute route` say where keys go; silent,
//! malformed and flooding admin clients hold up neither scrapes nor the proxy.
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use memroute_tests::*;

/// One sample of the exposition: metric name, labels in order, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn is_name(s: &str, colons: bool) -> bool {
    let mut chars = s.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':'));
    first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
}

/// A strict reading of the Prometheus text format 0.0.4: every line is a HELP, a TYPE or
/// a sample; names and label names are valid; label values are quoted with only `\\`,
/// `\"` and `\n` escapes; every sample belongs to the family of the TYPE line before it
/// (histograms: `_bucket` with `le`, `_sum`, `_count`). Panics with the line on any fault.
fn parse_exposition(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            assert!(is_name(name, true), "bad HELP name: {line:?}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("{line:?}"));
            assert!(is_name(name, true), "bad TYPE name: {line:?}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "bad type: {line:?}"
            );
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "TYPE twice: {line:?}"
            );
            current = Some((name.to_string(), kind.to_string()));
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "stray line {line:?}"
        );
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("no value: {line:?}"));
        let name = &line[..name_end];
        assert!(is_name(name, true), "bad metric name in {line:?}");
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(after) = rest.strip_prefix('{') {
            let mut chars = after.char_indices().peekable();
            let end = loop {
                // label name
                let start = match chars.peek() {
                    Some(&(_, '}')) => break chars.next().map(|(i, _)| i),
                    Some(&(i, _)) => i,
                    None => panic!("unterminated labels: {line:?}"),
                };
                let mut eq = None;
                for (i, c) in chars.by_ref() {
                    if c == '=' {
                        eq = Some(i);
                        break;
                    }
                }
                let eq = eq.unwrap_or_else(|| panic!("label without '=': {line:?}"));
                let label = &after[start..eq];
                assert!(is_name(label, false), "bad label name {label:?}: {line:?}");
                assert_eq!(
                    chars.next().map(|(_, c)| c),
                    Some('"'),
                    "unquoted label value: {line:?}"
                );
                let mut value = String::new();
                loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\')) => value.push('\\'),
                            Some((_, '"')) => value.push('"'),
                            Some((_, 'n')) => value.push('\n'),
                            other => panic!("bad escape {other:?}: {line:?}"),
                        },
                        Some((_, '"')) => break,
                        Some((_, '\n')) | None => panic!("unterminated value: {line:?}"),
                        Some((_, c)) => value.push(c),
                    }
                }
                labels.push((label.to_string(), value));
                match chars.next() {
                    Some((_, ',')) => {}
                    Some((i, '}')) => break Some(i),
                    other => panic!("expected ',' or '}}', got {other:?}: {line:?}"),
                }
            };
            let end = end.unwrap_or_else(|| panic!("{line:?}"));
            rest = &after[end + 1..];
        }
        let value_text = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no space before value: {line:?}"));
        let mut parts = value_text.split(' ');
        let value: f64 = match parts.next() {
            Some("+Inf") => f64::INFINITY,
            Some("-Inf") => f64::NEG_INFINITY,
            Some(v) => v
                .parse()
                .unwrap_or_else(|e| panic!("bad value {v:?} ({e}): {line:?}")),
            None => panic!("no value: {line:?}"),
        };
        if let Some(ts) = parts.next() {
            ts.parse::<i64>()
                .unwrap_or_else(|e| panic!("bad timestamp ({e}): {line:?}"));
        }
        assert!(parts.next().is_none(), "trailing text: {line:?}");
        let (family, kind) = current
            .as_ref()
            .unwrap_or_else(|| panic!("sample before any TYPE: {line:?}"));
        let belongs = match kind.as_str() {
            "histogram" => {
                (name == format!("{family}_bucket") && labels.iter().any(|(n, _)| n == "le"))
                    || name == format!("{family}_sum")
                    || name == format!("{family}_count")
            }
            _ => name == family,
        };
        assert!(belongs, "sample outside its family {family}: {line:?}");
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    (types, samples)
}

fn total(samples: &[Sample], name: &str, filter: impl Fn(&Sample) -> bool) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && filter(s))
        .map(|s| s.value)
        .sum()
}

fn stat(stats: &[(String, String)], name: &str) -> f64 {
    stats
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in stats: {stats:?}"))
        .1
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Two workers, a pool whose name needs escaping (`a"b`, with a backslash too), an admin
/// endpoint; `extra` goes into `[admin]`.
fn quoted_pool_config(listen: &str, admin: &str, servers: &[String], extra: &str) -> String {
    let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
    format!(
        "[proxy]\nlisten = [\"{listen}\"]\nworkers = 2\nroute = \"a\\\"b\\\\c\"\n\n\
         [pools.\"a\\\"b\\\\c\"]\nservers = [{}]\ntimeout = \"1s\"\n\n[admin]\nlisten = \"{admin}\"\n{extra}",
        servers.join(", ")
    )
}

#[test]
fn metrics_parse_strictly_carry_latency_and_agree_with_stats() {
    let servers = [Memcached::start(), Memcached::start()];
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&quoted_pool_config(&listen, &admin, &addrs, ""));
    let pool = "a\"b\\c";

    // Traffic over several connections (likely spread over both workers).
    let mut clients: Vec<Conn> = (0..4).map(|_| proxy.connect()).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        for k in 0..25 {
            c.set(&format!("k{i}-{k}"), b"value");
        }
        for k in 0..25 {
            assert_eq!(c.get(&format!("k{i}-{k}")).as_deref(), Some(&b"value"[..]));
        }
        c.send(format!("get k{i}-0 k{i}-1 missing{i}\r\n").as_bytes());
        c.read_get_reply();
        assert_eq!(
            c.roundtrip_line(format!("touch k{i}-2 0\r\n").as_bytes()),
            b"TOUCHED\r\n"
        );
        c.send(format!("gat 0 k{i}-3\r\n").as_bytes());
        c.read_get_reply();
    }
    assert_eq!(clients[0].roundtrip_line(b"flush_all\r\n"), b"OK\r\n");

    let stats = clients[1].stats();
    let (code, text) = admin_http(&admin, "GET", "/metrics");
    assert_eq!(code, 200, "{text}");
    let (types, samples) = parse_exposition(&text);

    // The escaped pool name reads back as itself.
    assert_eq!(
        total(&samples, "memroute_pool_servers", |s| s.label("pool")
            == Some(pool)),
        2.0,
        "{text}"
    );
    // stats and /metrics agree on every memcached counter, workers=2 included.
    for (name, family) in [
        ("cmd_get", "memroute_client_get_keys_total"),
        ("cmd_set", "memroute_client_set_requests_total"),
        ("cmd_touch", "memroute_client_touch_keys_total"),
        ("cmd_flush", "memroute_client_flush_requests_total"),
        ("get_hits", "memroute_client_get_hits_total"),
        ("get_misses", "memroute_client_get_misses_total"),
        ("curr_connections", "memroute_client_connections_current"),
    ] {
        assert_eq!(
            stat(&stats, name),
            total(&samples, family, |_| true),
            "{name} vs {family}\nstats: {stats:?}\n{text}"
        );
    }
    // Exact counts: 4 x (25 gets + a 3-key get + a 1-key gat) keys, 100 sets, 4 touches +
    // 4 gat keys, one flush_all.
    assert_eq!(stat(&stats, "cmd_get"), 4.0 * (25.0 + 3.0 + 1.0));
    assert_eq!(stat(&stats, "cmd_set"), 100.0);
    assert_eq!(stat(&stats, "cmd_touch"), 8.0);
    assert_eq!(stat(&stats, "cmd_flush"), 1.0);
    assert_eq!(stat(&stats, "get_misses"), 4.0);
    // Requests by command and route: one per key for retrievals, under the pool's name.
    let requests = |command: &str| {
        total(&samples, "memroute_client_requests_total", |s| {
            s.label("command") == Some(command) && s.label("route") == Some(pool)
        })
    };
    assert_eq!(requests("set"), 100.0, "{text}");
    assert_eq!(requests("get"), 4.0 * 28.0, "{text}");
    assert_eq!(requests("touch"), 4.0, "{text}");
    assert_eq!(requests("flush_all"), 1.0, "{text}");
    assert_eq!(
        stat(&stats, &format!("client_requests_total:set:{pool}")),
        100.0
    );
    // Latency histograms: per route (client-visible, through memroute) and per server
    // (backend round trip), every request observed once.
    assert_eq!(
        types
            .get("memroute_client_request_duration_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    let through_proxy = total(
        &samples,
        "memroute_client_request_duration_seconds_count",
        |s| s.label("route") == Some(pool),
    );
    // One sample per request waiting on a backend: 100 sets, 100 single gets, 4 multi-gets,
    // 4 touches, 4 one-key gats, 1 flush_all.
    assert_eq!(
        through_proxy,
        100.0 + 100.0 + 4.0 + 4.0 + 4.0 + 1.0,
        "{text}"
    );
    let inf_bucket = total(
        &samples,
        "memroute_client_request_duration_seconds_bucket",
        |s| s.label("route") == Some(pool) && s.label("le") == Some("+Inf"),
    );
    assert_eq!(inf_bucket, through_proxy, "{text}");
    for addr in &addrs {
        let round_trips = total(&samples, "memroute_backend_round_trip_seconds_count", |s| {
            s.label("pool") == Some(pool) && s.label("server") == Some(addr)
        });
        assert!(
            round_trips >= 10.0,
            "round trips of {addr}: {round_trips}\n{text}"
        );
        let sum = total(&samples, "memroute_backend_round_trip_seconds_sum", |s| {
            s.label("server") == Some(addr)
        });
        assert!(
            sum > 0.0 && sum < round_trips,
            "{addr}: sum {sum} of {round_trips}"
        );
        assert_eq!(
            total(&samples, "memroute_backend_connections", |s| s
                .label("server")
                == Some(addr)),
            2.0,
            "one connection per worker to {addr}\n{text}"
        );
    }
    assert_eq!(total(&samples, "memroute_proxy_workers", |_| true), 2.0);
    assert_eq!(
        total(&samples, "memroute_listener_events_total", |s| {
            s.label("listener") == Some(listen.as_str()) && s.label("event") == Some("accepted")
        }),
        4.0,
        "{text}"
    );

    // Every family exported is documented, and the Grafana dashboard uses documented
    // families only.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let docs = std::fs::read_to_string(root.join("docs/operations.md")).expect("docs");
    for family in types.keys() {
        assert!(
            docs.contains(&format!("| `{family}` |")),
            "{family} is not in docs/operations.md"
        );
    }
    let dashboard =
        std::fs::read_to_string(root.join("docker/grafana/memroute.json")).expect("dashboard");
    let mut used = 0;
    for (at, _) in dashboard.match_indices("memroute_") {
        let name: String = dashboard[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|f| docs.contains(&format!("| `{f}` | histogram")))
            .unwrap_or(&name);
        assert!(
            docs.contains(&format!("| `{family}` |")),
            "dashboard uses {name}, not a memroute metric"
        );
        used += 1;
    }
    assert!(used > 10, "the dashboard names {used} metrics");
}

#[test]
fn ready_follows_backends_and_config_reload_route_endpoints() {
    // The second server is not running yet: not ready until it is (ready_fraction = 1).
    let first = Memcached::start();
    let second_port = free_port();
    let second_addr = format!("127.0.0.1:{second_port}");
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let toml = quoted_pool_config(
        &listen,
        &admin,
        &[first.addr(), second_addr.clone()],
        "ready_fraction = 1.0\n",
    );
    // No file watch: POST /reload is the only way this test reloads.
    let proxy = Memroute::start_args(&toml, &["--no-watch"]);
    // Not ready from the start; once the first server's connections are up, the reason is
    // the second one alone.
    let mut last = String::new();
    let first_up = poll_until(Duration::from_secs(10), || {
        let (code, body) = admin_http(&admin, "GET", "/ready");
        assert_eq!(code, 503, "ready with a server missing: {body}");
        last = body;
        last.contains("1 of 2 servers connected, 2 needed")
    });
    assert!(first_up, "{last}");
    assert_eq!(admin_http(&admin, "GET", "/healthz").0, 200);
    let second = Memcached::start_on("127.0.0.1", second_port, 16);
    assert!(
        poll_until(Duration::from_secs(10), || admin_http(
            &admin, "GET", "/ready"
        )
        .0 == 200),
        "/ready after both servers run: {:?}",
        admin_http(&admin, "GET", "/ready")
    );

    // /config: the running file, its md5 as md5sum computes it.
    let md5 = |path: &std::path::Path| {
        let out = std::process::Command::new("md5sum")
            .arg(path)
            .output()
            .expect("md5sum");
        String::from_utf8_lossy(&out.stdout)
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let (code, shown) = admin_http(&admin, "GET", "/config");
    assert_eq!(code, 200, "{shown}");
    let hash = md5(proxy.config_path());
    assert!(shown.starts_with(&format!("# md5 {hash}\n")), "{shown}");
    assert!(shown.contains("ready_fraction = 1.0"), "{shown}");
    assert!(shown.contains(&second_addr), "{shown}");

    // POST /reload: a valid file is applied and its hash exported; a broken one is
    // rejected with its key path and counted, and the running config stays.
    let c_addr = first.addr();
    let smaller = quoted_pool_config(&listen, &admin, std::slice::from_ref(&c_addr), "");
    proxy.rewrite_config(&smaller);
    let (code, body) = admin_http(&admin, "POST", "/reload");
    assert_eq!(body, "reloaded: applied\n");
    assert_eq!(code, 200, "{body}");
    let new_hash = md5(proxy.config_path());
    let (_, shown) = admin_http(&admin, "GET", "/config");
    assert!(shown.starts_with(&format!("# md5 {new_hash}\n")), "{shown}");
    assert!(!shown.contains(&second_addr), "{shown}");
    proxy.rewrite_config(&smaller.replace("timeout = \"1s\"", "timeout = \"-3\""));
    let (code, body) = admin_http(&admin, "POST", "/reload");
    assert_eq!(code, 422, "{body}");
    assert!(body.contains(".timeout"), "the key path: {body}");
    assert_eq!(admin_http(&admin, "GET", "/reload").0, 405);
    let (_, text) = admin_http(&admin, "GET", "/metrics");
    let (_, samples) = parse_exposition(&text);
    let reloads = |outcome: &str| {
        total(&samples, "memroute_config_reloads_total", |s| {
            s.label("outcome") == Some(outcome)
        })
    };
    assert_eq!((reloads("ok"), reloads("failed")), (1.0, 1.0), "{text}");
    assert_eq!(
        total(&samples, "memroute_config_info", |s| s.label("hash")
            == Some(new_hash.as_str())),
        1.0,
        "{text}"
    );
    // Only the server that stays is still exported.
    assert_eq!(
        total(&samples, "memroute_backend_errors_total", |s| s
            .label("server")
            == Some(&second_addr)),
        0.0
    );
    assert!(
        !text.contains(&format!("server=\"{second_addr}\"")),
        "{text}"
    );

    // Where keys go: the endpoint and the CLI say the same, and it is where the key is.
    let mut c = proxy.connect();
    c.set("route-key/1", b"x");
    let (code, endpoint) = admin_http(&admin, "GET", "/route?key=route-key%2F1");
    assert_eq!(code, 200, "{endpoint}");
    // The shrink above started a resize window: a key that was on the server that left also
    // names that old owner.
    let owner = format!("route-key/1: a\"b\\c => {c_addr} (primary)");
    assert!(
        endpoint == format!("{owner}\n")
            || endpoint == format!("{owner} [resize window: old owner {second_addr}]\n"),
        "{endpoint}"
    );
    assert_eq!(admin_http(&admin, "GET", "/route").0, 400);
    drop(second);
}

#[test]
fn route_cli_prints_path_and_server_per_key() {
    let dir = TempDir::new("route-cli");
    let conf = dir.write(
        "memroute.toml",
        "[proxy]\nlisten = [\"127.0.0.1:11211\"]\nroute = \"split\"\n\
         [pools.main]\nservers = [\"127.0.0.1:7001\", \"127.0.0.1:7002\"]\n\
         [pools.sessions]\nservers = [\"127.0.0.1:7003\"]\n\
         [pools.backup]\nservers = [\"127.0.0.1:7004\"]\n\
         [routes.split]\ntype = \"prefix\"\nprefixes = { \"s:\" = \"safe\" }\ndefault = \"main\"\n\
         [routes.safe]\ntype = \"failover\"\nchildren = [\"sessions\", \"backup\"]\n",
    );
    let out = run_memroute_cli(
        &[
            "route".as_ref(),
            "--config".as_ref(),
            conf.as_os_str(),
            "s:1".as_ref(),
            "plain".as_ref(),
        ],
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[..2],
        [
            "s:1: split -> safe -> sessions => 127.0.0.1:7003 (primary)",
            "s:1: split -> safe -> backup => 127.0.0.1:7004 (primary, failover 1)",
        ],
        "{}",
        out.stdout
    );
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    assert!(
        lines[2].starts_with("plain: split -> main => 127.0.0.1:700"),
        "{}",
        out.stdout
    );
    // One note on stderr for the pools the keys reached (each with the default window), not
    // a line per pool.
    assert_eq!(
        out.stderr.trim_end(),
        "pools sessions, backup, main keep a resize window after their servers change: during one, a running proxy's /route?key= also names a key's old owner",
    );
    // No window on the pools reached: nothing to say.
    let no_window = dir.write(
        "no-window.toml",
        "[proxy]\nlisten = [\"127.0.0.1:11211\"]\nroute = \"main\"\n\
         [pools.main]\nservers = [\"127.0.0.1:7001\"]\nresize_window = \"0s\"\n\
         [pools.other]\nservers = [\"127.0.0.1:7002\"]\n",
    );
    let quiet = run_memroute_cli(
        &[
            "route".as_ref(),
            "--config".as_ref(),
            no_window.as_os_str(),
            "k".as_ref(),
        ],
        Duration::from_secs(10),
    );
    assert!(quiet.status.success(), "{}", quiet.stderr);
    assert_eq!(quiet.stderr, "", "{}", quiet.stdout);
    let bad = run_memroute_cli(
        &[
            "route".as_ref(),
            "--config".as_ref(),
            conf.as_os_str(),
            "--operation".as_ref(),
            "frob".as_ref(),
            "k".as_ref(),
        ],
        Duration::from_secs(10),
    );
    assert!(
        !bad.status.success() && bad.stderr.contains("unknown --operation"),
        "{}",
        bad.stderr
    );
}

#[test]
fn silent_malformed_and_flooding_admin_clients_hold_up_nothing() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&quoted_pool_config(&listen, &admin, &[server.addr()], ""));
    let mut c = proxy.connect();

    // Silent clients (connected, nothing sent) and one that sent half a request head.
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&admin).expect("connect"))
        .collect();
    let mut half = TcpStream::connect(&admin).expect("connect");
    half.write_all(b"GET /metr").expect("half a request");
    let (code, text) = admin_http(&admin, "GET", "/metrics");
    assert_eq!(code, 200, "a scrape behind silent clients");
    parse_exposition(&text);

    // Malformed requests: answered 400 or closed, and the endpoint keeps serving.
    for garbage in [
        &b"BLAH\r\n\r\n"[..],
        b"GET / HTTP/9.9\r\n\r\n",
        &[0xff; 300],
    ] {
        let mut s = TcpStream::connect(&admin).expect("connect");
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        s.write_all(garbage).expect("send garbage");
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        assert!(
            answer.is_empty()
                || answer.starts_with(b"HTTP/1.1 400")
                || answer.starts_with(b"HTTP/1.1 505"),
            "{}: {}",
            show(garbage),
            show(&answer)
        );
    }
    // A flood past the connection limit: the proxy serves throughout.
    let flood: Vec<TcpStream> = (0..100)
        .filter_map(|_| TcpStream::connect(&admin).ok())
        .collect();
    for i in 0..50 {
        c.set(&format!("during-flood-{i}"), b"v");
        assert_eq!(
            c.get(&format!("during-flood-{i}")).as_deref(),
            Some(&b"v"[..])
        );
    }
    drop(flood);
    drop(silent);
    drop(half);
    assert!(
        poll_until(Duration::from_secs(10), || {
            std::panic::catch_unwind(|| admin_http(&admin, "GET", "/metrics").0).ok() == Some(200)
        }),
        "/metrics after the flood"
    );
    assert_eq!(admin_http(&admin, "GET", "/healthz").1, "ok\n");
}
