//! Binary-protocol clients are served by the same session as text ones, against real
//! memcached: an idle binary connection holds no buffers (what an idle text one costs), and
//! a graceful drain answers every binary request already sent before it closes.
//!
//! ```text
//!   1,000 binary clients, one GET each, then idle ──> memroute: RSS per connection
//!   SIGTERM with 50 pipelined binary GETs waiting on a stopped memcached ──> all answered, EOF
//!   get / getk of 100 KB values, pipelined ──> each value, flags and key exact
//! ```
use std::time::{Duration, Instant};

use memroute_tests::*;

#[path = "common/binary_client.rs"]
mod binary_client;

const DEADLINE: Duration = Duration::from_secs(20);
const IDLE_CONNECTIONS: usize = 1000;
/// RSS per idle connection, text or binary, measured here (debug build): 1.3 KiB. A binary
/// session that kept its own read and write buffers while idle measured 11.3 KiB.
const IDLE_KIB_PER_CONNECTION: f64 = 4.0;

/// RSS of `pid`, once two samples 100 ms apart agree (freed pages leave in a moment).
fn settled_rss_kib(pid: u32) -> u64 {
    let mut last = rss_kib(pid);
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = rss_kib(pid);
        if now == last || started.elapsed() > DEADLINE {
            return now;
        }
        last = now;
    }
}

#[test]
fn an_idle_binary_connection_holds_no_buffers() {
    let server = Memcached::start();
    let proxy = Memroute::start_pool(&[server.addr()]);
    let mut text = proxy.connect();
    text.set("k", &[b'v'; 100]);
    // Warm up: the worker's pools hold what one busy session borrows.
    assert_eq!(
        binary_client::get(&mut proxy.connect(), "k").map(|v| v.len()),
        Some(100)
    );
    let before = settled_rss_kib(proxy.pid());

    let idle: Vec<Conn> = (0..IDLE_CONNECTIONS)
        .map(|_| {
            let mut conn = proxy.connect();
            assert_eq!(
                binary_client::get(&mut conn, "k").map(|v| v.len()),
                Some(100)
            );
            conn
        })
        .collect();
    let after = settled_rss_kib(proxy.pid());
    let per_connection = after.saturating_sub(before) as f64 / IDLE_CONNECTIONS as f64;
    println!(
        "{IDLE_CONNECTIONS} idle binary connections: {per_connection:.2} KiB each (RSS {before} -> {after} KiB)"
    );
    assert!(
        per_connection <= IDLE_KIB_PER_CONNECTION,
        "{per_connection:.2} KiB per idle binary connection (RSS {before} -> {after} KiB)"
    );
    let binary_connections = stat_u64(&text.stats(), "binary_connections");
    assert_eq!(binary_connections, Some(IDLE_CONNECTIONS as u64 + 1));
    // Still served after their idle spell.
    let mut last = idle.into_iter().last().expect("a connection");
    assert_eq!(
        binary_client::get(&mut last, "k").map(|v| v.len()),
        Some(100)
    );
}

#[test]
fn a_drain_answers_pipelined_binary_requests_then_closes() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = simple_config(&listen, &[server.addr()], "").replace(
        "route = \"main\"\n",
        "route = \"main\"\ndrain_delay = \"0s\"\n",
    );
    let mut proxy = Memroute::start(&toml);
    proxy.connect().set("k", b"v");
    let mut client = proxy.connect();
    assert_eq!(
        binary_client::get(&mut client, "k").as_deref(),
        Some(&b"v"[..])
    );
    // Requests sent before the stop are all answered before the close.
    let frozen = server.stop();
    client.send(&binary_client::get_request("k").repeat(50));
    proxy.signal("TERM");
    assert!(
        proxy.wait_log("drain delay over", DEADLINE),
        "{}",
        proxy.log_text()
    );
    frozen.resume();
    for i in 0..50 {
        assert_eq!(
            binary_client::read_response(&mut client),
            (0, b"v".to_vec()),
            "response {i}"
        );
    }
    assert!(client.expect_eof());
    let status = proxy.wait_exit(DEADLINE);
    assert!(status.success(), "exit {status}\n{}", proxy.log_text());
}

/// A get's response is rendered where the backend's reply lands, its value moved to follow
/// the binary header: both directions of that move (a header longer than the meta line it
/// replaces, with a getk's long key, and one shorter, with large flags and CAS) keep every
/// byte of the value, in pipelined responses that follow one another in one write.
#[test]
fn pipelined_gets_of_large_values_answer_every_byte_with_flags_and_key() {
    let server = Memcached::start();
    let proxy = Memroute::start_pool(&[server.addr()]);
    let mut text = proxy.connect();
    let long_key = "k".repeat(240);
    let values: Vec<Vec<u8>> = (0..4u8)
        .map(|i| (0..100 * 1024).map(|at| (at % 251) as u8 ^ i).collect())
        .collect();
    for (i, value) in values.iter().enumerate() {
        let flags = if i % 2 == 0 { u32::MAX } else { 7 };
        let mut set = format!("set {long_key}{i} {flags} 0 {}\r\n", value.len()).into_bytes();
        set.extend_from_slice(value);
        set.extend_from_slice(b"\r\n");
        assert_eq!(text.roundtrip_line(&set), b"STORED\r\n");
    }
    let mut client = proxy.connect();
    let mut run = Vec::new();
    for i in 0..values.len() {
        run.extend_from_slice(&binary_client::request(
            binary_client::GETK,
            &format!("{long_key}{i}"),
        ));
        run.extend_from_slice(&binary_client::get_request(&format!("{long_key}{i}")));
    }
    client.send(&run);
    for (i, value) in values.iter().enumerate() {
        let flags = if i % 2 == 0 { u32::MAX } else { 7 };
        let key = format!("{long_key}{i}").into_bytes();
        for echoed in [key.clone(), Vec::new()] {
            let response = binary_client::read_whole_response(&mut client);
            assert_eq!(response.status, 0, "{i}");
            assert_eq!(response.extras, flags.to_be_bytes(), "{i}");
            assert_eq!(response.key, echoed, "{i}");
            assert!(response.value == *value, "value {i} differs");
        }
    }
    // A miss, after the hits, on the same connection.
    assert_eq!(binary_client::get(&mut client, "missing"), None);
}
