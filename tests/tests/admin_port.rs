//! The admin port faces a network: whoever reaches it must not be able to crowd out the
//! probes or change memroute's state, and the admin settings follow the config file.
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use memroute_tests::*;
use socket2::{Domain, Socket, Type};

fn config(listen: &str, admin: &str, server: &str, admin_extra: &str) -> String {
    format!(
        "[proxy]\nlisten = [\"{listen}\"]\nworkers = 1\nroute = \"main\"\n\n\
         [pools.main]\nservers = [\"{server}\"]\n\n[admin]\nlisten = \"{admin}\"\n{admin_extra}"
    )
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8 is all on lo),
/// so one test can play several peers.
fn connect_from(from: [u8; 4], to: &str) -> Option<TcpStream> {
    let to: SocketAddr = to.parse().expect("admin address");
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    socket.bind(&SocketAddr::from((from, 0)).into()).ok()?;
    socket.connect(&to.into()).ok()?;
    Some(socket.into())
}

/// `POST /reload` carrying `Authorization: Bearer TOKEN`.
fn reload_with(admin: &str, token: &str) -> (u16, String) {
    let bearer = format!("Bearer {token}");
    admin_request(admin, "POST", "/reload", &[("Authorization", &bearer)])
}

fn refusals(admin: &str, reason: &str) -> u64 {
    let (_, text) = admin_http(admin, "GET", "/metrics");
    let series = format!("memroute_admin_refusals_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

/// `memroute_admin_evictions_total{limit}`: idle connections closed to admit a new one.
fn evictions(admin: &str, limit: &str) -> u64 {
    let (_, text) = admin_http(admin, "GET", "/metrics");
    let series = format!("memroute_admin_evictions_total{{limit=\"{limit}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

/// `GET path` sent at once from the loopback address `from`; the status code.
fn get_from(from: [u8; 4], admin: &str, path: &str) -> u16 {
    let mut s = connect_from(from, admin).expect("connect to the admin port");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .expect("send the request");
    let mut response = String::new();
    s.read_to_string(&mut response)
        .unwrap_or_else(|e| panic!("GET {path} from {from:?}: {e} after {response:?}"));
    response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("GET {path} from {from:?}: no status line in {response:?}"))
}

/// How a connection that is sent nothing more ended, waiting at most `within`.
#[derive(Debug, PartialEq)]
enum Ended {
    /// The server closed it (EOF, or a reset); `received` is what it sent before.
    Closed { received: Vec<u8> },
    /// Still open when `within` was over.
    Open,
}

/// Reads until the server closes `stream`, for at most `within` (bounded: never a sleep).
fn await_close(stream: &mut TcpStream, within: Duration) -> Ended {
    let deadline = Instant::now() + within;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ended::Open;
        }
        stream.set_read_timeout(Some(left)).expect("read timeout");
        match stream.read(&mut buf) {
            Ok(0) => return Ended::Closed { received },
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ended::Closed { received },
            Err(e) => panic!("reading an admin connection: {e}"),
        }
    }
}

#[test]
fn probes_from_any_address_answer_while_idle_connections_fill_the_port() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &admin, &server.addr(), ""));
    let mut client = proxy.connect();
    client.set("beside-the-crowd", b"before");

    // 200 idle connections from the probe's own address (the node's, in Kubernetes), then
    // one from each of 200 other addresses: past the per-peer share and past the port's
    // total (128), each newcomer closes the connection idle longest.
    let same_address: Vec<TcpStream> = (0..200)
        .filter_map(|_| connect_from([127, 0, 0, 1], &admin))
        .collect();
    assert_eq!(
        same_address.len(),
        200,
        "the kernel accepts every connection"
    );
    let crowd: Vec<TcpStream> = (0..200u8)
        .filter_map(|i| connect_from([127, 0, 1, i], &admin))
        .collect();
    assert_eq!(crowd.len(), 200);
    // The admin thread accepts in order: each probe below is admitted after all of them.
    for probe in 0..30u8 {
        let (code, body) = admin_http(&admin, "GET", "/healthz");
        assert_eq!(
            (code, body.as_str()),
            (200, "ok\n"),
            "probe {probe} from 127.0.0.1"
        );
        assert_eq!(
            get_from([127, 0, 1, probe], &admin, "/ready"),
            200,
            "readiness probe {probe} from an address of the crowd"
        );
        // The proxy's clients never notice.
        let value = format!("v{probe}");
        client.set("beside-the-crowd", value.as_bytes());
        assert_eq!(
            proxy.connect().get("beside-the-crowd").as_deref(),
            Some(value.as_bytes())
        );
    }
    // Both limits were reached, and made room rather than refusing.
    assert!(evictions(&admin, "per_peer") > 0, "no per-peer eviction");
    assert!(
        evictions(&admin, "total") > 0,
        "no eviction at the port's total"
    );
    assert_eq!(refusals(&admin, "per_peer") + refusals(&admin, "total"), 0);
    drop(same_address);
    drop(crowd);
}

#[test]
fn slow_and_idle_connections_are_closed_at_the_header_deadline() {
    // The deadline (crates/control/src/admin/mod.rs, HEADER_TIMEOUT).
    const DEADLINE: Duration = Duration::from_secs(5);
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &admin, &server.addr(), ""));

    // A keep-alive client that asks once and then says nothing, beside the slow one.
    let idle = {
        let admin = admin.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&admin).expect("connect");
            s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {admin}\r\n\r\n").as_bytes())
                .expect("send");
            let asked = Instant::now();
            let ended = await_close(&mut s, DEADLINE * 3);
            (ended, asked.elapsed())
        })
    };

    // A request head sent one byte a second: each read below waits a second for an
    // answer that must not come, and paces the next byte.
    let request = format!(
        "GET /healthz HTTP/1.1\r\nHost: {admin}\r\nX-Padding: {}\r\n\r\n",
        "p".repeat(64)
    );
    let mut slow = TcpStream::connect(&admin).expect("connect");
    let connected = Instant::now();
    let mut sent = 0;
    let ended = loop {
        if slow.write_all(&request.as_bytes()[sent..sent + 1]).is_err() {
            // Closed while writing (a reset): it is over.
            break Ended::Closed {
                received: Vec::new(),
            };
        }
        sent += 1;
        match await_close(&mut slow, Duration::from_secs(1)) {
            Ended::Open => {}
            closed => break closed,
        }
        assert!(
            connected.elapsed() < DEADLINE * 3,
            "still open after {sent} bytes"
        );
    };
    let took = connected.elapsed();
    assert_eq!(
        ended,
        Ended::Closed {
            received: Vec::new()
        },
        "closed unanswered"
    );
    assert!(
        sent < request.len(),
        "the whole head was sent ({sent} bytes)"
    );
    // Bytes kept arriving: the deadline counts from accept, not from the last byte.
    assert!(
        took >= DEADLINE - Duration::from_millis(500) && took < DEADLINE * 2,
        "closed after {took:?}"
    );

    let (ended, idle_for) = idle.join().expect("the idle client");
    let Ended::Closed { received } = ended else {
        panic!("an idle keep-alive connection still open after {idle_for:?}");
    };
    let answer = String::from_utf8_lossy(&received);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("\r\n\r\nok\n"),
        "{answer:?}"
    );
    assert!(
        idle_for >= DEADLINE - Duration::from_millis(500) && idle_for < DEADLINE * 2,
        "idle keep-alive closed after {idle_for:?}"
    );

    // Meanwhile the proxy served as ever, and the admin port answers.
    let mut c = proxy.connect();
    c.set("after-the-slow-client", b"v");
    assert_eq!(c.get("after-the-slow-client").as_deref(), Some(&b"v"[..]));
    assert_eq!(admin_http(&admin, "GET", "/healthz").0, 200);
}

#[test]
fn reload_needs_loopback_or_the_token_and_no_other_site() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());

    // Without a token: a loopback peer may reload, a page on another site may not.
    let proxy = Memroute::start(&config(&listen, &admin, &server.addr(), ""));
    let (code, body) = admin_http(&admin, "POST", "/reload");
    assert_eq!(code, 200, "{body}");
    let (code, body) = admin_request(
        &admin,
        "POST",
        "/reload",
        &[
            ("Origin", "https://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
        ],
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("another site"), "{body}");
    assert_eq!(refusals(&admin, "cross_site"), 1);
    drop(proxy);

    // With a token file: only a request carrying it, and the file is read each time.
    let dir = TempDir::new("admin-token");
    let token_file = dir.write("token", "first-secret\n");
    let extra = format!("token_file = {:?}\n", token_file.display().to_string());
    let proxy = Memroute::start(&config(&listen, &admin, &server.addr(), &extra));
    let (code, body) = admin_http(&admin, "POST", "/reload");
    assert_eq!(code, 401, "{body}");
    let (code, body) = reload_with(&admin, "wrong-secret");
    assert_eq!(code, 401, "{body}");
    let (code, body) = reload_with(&admin, "first-secret");
    assert_eq!(code, 200, "{body}");
    std::fs::write(&token_file, "second-secret\n").expect("rotate token");
    let (code, _) = reload_with(&admin, "first-secret");
    assert_eq!(code, 401, "a rotated token file applies without a reload");
    let (code, body) = reload_with(&admin, "second-secret");
    assert_eq!(code, 200, "{body}");
    assert_eq!(refusals(&admin, "bad_token"), 3);
    // Reading stays open to everyone, and /config never shows a token.
    assert_eq!(admin_http(&admin, "GET", "/healthz").0, 200);
    drop(proxy);
    let extra = "token = \"inline-secret\"\n";
    let proxy = Memroute::start(&config(&listen, &admin, &server.addr(), extra));
    let (code, config) = admin_http(&admin, "GET", "/config");
    assert_eq!(code, 200);
    assert!(!config.contains("inline-secret"), "{config}");
    assert!(config.contains("<redacted>"), "{config}");
    let (code, body) = reload_with(&admin, "inline-secret");
    assert_eq!(code, 200, "{body}");
    drop(proxy);
}

/// Rewrites the config file and waits (bounded) for the file watch's `config reloaded`.
fn edit_config(proxy: &Memroute, toml: &str) {
    let before = proxy.log_count("config reloaded");
    proxy.rewrite_config(toml);
    assert!(
        proxy.wait_log_count("config reloaded", before + 1, Duration::from_secs(10)),
        "no `config reloaded` after an edit\n{}",
        proxy.log_text()
    );
}

/// Reads `the-hot-key` 50 times through `c`, then answers the first key of pool `main` in
/// /hotkeys and the report's `sample_every`. (Read again at each check: a report spans
/// only the last one to two `hot_keys_interval`.)
fn hottest(c: &mut Conn, admin: &str) -> (String, u64) {
    for _ in 0..50 {
        assert_eq!(c.get("the-hot-key"), None);
    }
    let (code, body) = admin_http(admin, "GET", "/hotkeys");
    assert_eq!(code, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let key = report["pools"][0]["keys"][0]["key"]
        .as_str()
        .unwrap_or_else(|| panic!("a hot key in {body}"))
        .to_string();
    let sample_every = report["sample_every"].as_u64().expect("sample_every");
    (key, sample_every)
}

#[test]
fn admin_settings_follow_edits_of_the_config_file() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let with = |extra: &str| config(&listen, &admin, &server.addr(), extra);
    let proxy = Memroute::start(&with("hot_keys_sample = 1\n"));
    let mut c = proxy.connect();
    assert_eq!(hottest(&mut c, &admin), ("the-hot-key".to_string(), 1));

    // A token added by an edit is required from then on, from loopback too.
    edit_config(&proxy, &with("hot_keys_sample = 1\ntoken = \"first\"\n"));
    let (code, body) = admin_http(&admin, "POST", "/reload");
    assert_eq!(code, 401, "{body}");
    let (code, body) = reload_with(&admin, "first");
    assert_eq!(code, 200, "{body}");
    // Changed: the old one no longer works.
    edit_config(&proxy, &with("hot_keys_sample = 1\ntoken = \"second\"\n"));
    assert_eq!(reload_with(&admin, "first").0, 401);
    let (code, body) = reload_with(&admin, "second");
    assert_eq!(code, 200, "{body}");
    // Removed: loopback may again, without one.
    edit_config(&proxy, &with("hot_keys_sample = 1\n"));
    let (code, body) = admin_http(&admin, "POST", "/reload");
    assert_eq!(code, 200, "{body}");
    assert_eq!(refusals(&admin, "bad_token"), 2);

    // show_keys and hot_keys_sample apply too.
    edit_config(&proxy, &with("hot_keys_sample = 8\nshow_keys = false\n"));
    let (key, sample_every) = hottest(&mut c, &admin);
    assert_eq!((key.as_str(), sample_every), ("<hidden>", 8));
    let (_, state) = admin_http(&admin, "GET", "/state");
    assert!(!state.contains("the-hot-key"), "{state}");
    let stats = proxy.connect().stats();
    assert!(
        stats.iter().all(|(_, v)| !v.contains("the-hot-key")),
        "{stats:?}"
    );
    edit_config(&proxy, &with("hot_keys_sample = 1\n"));
    assert_eq!(hottest(&mut c, &admin), ("the-hot-key".to_string(), 1));

    // The address needs a restart: named, kept, and the rest of [admin] still applies.
    let moved = format!("127.0.0.1:{}", free_port());
    let edited = with("hot_keys_sample = 1\ntoken = \"third\"\n").replace(&admin, &moved);
    edit_config(&proxy, &edited);
    let (_, state) = admin_http(&admin, "GET", "/state");
    let state: serde_json::Value = serde_json::from_str(&state).expect("JSON");
    let detail = state["reloads"][0]["detail"]
        .as_str()
        .expect("a reload's detail");
    assert!(
        detail.contains("kept (needs a restart): admin.listen"),
        "{detail}"
    );
    assert!(
        TcpStream::connect(&moved).is_err(),
        "{moved} was bound by a reload"
    );
    assert_eq!(admin_http(&admin, "POST", "/reload").0, 401);
    let (code, body) = reload_with(&admin, "third");
    assert_eq!(code, 200, "{body}");
    assert_eq!(c.get("the-hot-key"), None, "the proxy serves throughout");
}

#[test]
fn removing_the_admin_table_keeps_the_running_endpoint_and_its_token() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let with_token = config(&listen, &admin, &server.addr(), "token = \"kept\"\n");
    let proxy = Memroute::start(&with_token);
    let (without_admin, _) = with_token
        .split_once("\n[admin]")
        .expect("an [admin] table");
    edit_config(&proxy, &format!("{without_admin}\n"));
    // The endpoint still serves until a restart; it must not lose its token meanwhile.
    let (_, state) = admin_http(&admin, "GET", "/state");
    let state: serde_json::Value = serde_json::from_str(&state).expect("JSON");
    let detail = state["reloads"][0]["detail"]
        .as_str()
        .expect("a reload's detail");
    assert!(
        detail.contains("kept (needs a restart): admin: removing [admin] needs a restart"),
        "{detail}"
    );
    assert_eq!(admin_http(&admin, "POST", "/reload").0, 401);
    let (code, body) = reload_with(&admin, "kept");
    assert_eq!(code, 200, "{body}");
    let mut c = proxy.connect();
    c.set("served", b"v");
    assert_eq!(c.get("served").as_deref(), Some(&b"v"[..]));
}
