//! The binary protocol through memroute, checked with real clients: libmemcached's
//! `memccapable -b` (its 27 binary tests) and pylibmc with `binary=True`, each run against
//! memcached directly and through memroute; then every bad-input case on raw frames, the
//! getkq batching, and the error counters.
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use memroute_tests::*;

const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// The `binary ...` lines of `memccapable -b` against `host:port`, as (test, verdict).
fn memccapable(addr: &str) -> Vec<(String, String)> {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let out = run_program("memccapable", &["-b", "-h", host, "-p", port], TOOL_TIMEOUT);
    let results: Vec<(String, String)> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("binary "))
        .filter_map(|l| {
            let (name, verdict) = l.rsplit_once(' ')?;
            Some((name.trim().to_string(), verdict.to_string()))
        })
        .collect();
    assert!(
        !results.is_empty(),
        "memccapable printed no binary results against {addr}: {:?}\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    results
}

fn assert_all_pass(results: &[(String, String)], what: &str) {
    let failed: Vec<_> = results.iter().filter(|(_, v)| v != "[pass]").collect();
    assert!(failed.is_empty(), "{what}: {failed:?}");
}

#[test]
fn memccapable_binary_passes_direct_and_through_memroute() {
    let direct = Memcached::start();
    let reference = memccapable(&direct.addr());
    assert_eq!(
        reference.len(),
        27,
        "memccapable's binary suite: {reference:?}"
    );
    assert_all_pass(&reference, "direct");

    let one = Memcached::start();
    let proxy = Memroute::start_pool(&[one.addr()]);
    let through_one = memccapable(&proxy.listen);
    assert_eq!(through_one, reference, "through memroute, one server");

    let pool: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = pool.iter().map(Memcached::addr).collect();
    let proxy = Memroute::start_pool(&addrs);
    let through_three = memccapable(&proxy.listen);
    assert_eq!(through_three, reference, "through memroute, three servers");
}

fn pylibmc_steps(addr: &str) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/pylibmc_steps.py");
    let found = Command::new("python3")
        .args(["-c", "import pylibmc"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        found,
        "pylibmc is not installed: run scripts/test (it installs it) or `pip install pylibmc`"
    );
    let script = script.to_str().expect("utf-8 path");
    let out = run_program("python3", &[script, addr], TOOL_TIMEOUT);
    assert!(
        out.status.success(),
        "pylibmc steps against {addr}: {:?}\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    out.stdout
}

#[test]
fn pylibmc_binary_gets_the_same_results_through_memroute() {
    let direct = Memcached::start();
    let want = pylibmc_steps(&direct.addr());
    // The steps cover hits, misses, multi-get, add/replace/append/cas/incr errors, too large.
    assert!(want.contains("get hit: 'v1'"), "{want}");
    assert!(want.contains("large value: 'error TooBig'"), "{want}");
    let backend = Memcached::start();
    let proxy = Memroute::start_pool(&[backend.addr()]);
    let got = pylibmc_steps(&proxy.listen);
    assert_eq!(got, want);
}

// ---- raw frames -------------------------------------------------------------------------

fn frame(opcode: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    let body = (key.len() + extras.len() + value.len()) as u32;
    let mut f = vec![0x80, opcode];
    f.extend_from_slice(&(key.len() as u16).to_be_bytes());
    f.push(extras.len() as u8);
    f.push(0);
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&body.to_be_bytes());
    f.extend_from_slice(&opaque.to_be_bytes());
    f.extend_from_slice(&0u64.to_be_bytes());
    f.extend_from_slice(extras);
    f.extend_from_slice(key);
    f.extend_from_slice(value);
    f
}

/// One response: (opcode, status, opaque, key, value).
#[derive(Debug, PartialEq)]
struct Response {
    opcode: u8,
    status: u16,
    opaque: u32,
    key: Vec<u8>,
    value: Vec<u8>,
}

fn read_response(conn: &mut Conn) -> Response {
    let header = conn.read_for(24);
    assert_eq!(header[0], 0x81, "response magic: {header:?}");
    let key_len = usize::from(u16::from_be_bytes([header[2], header[3]]));
    let extras = usize::from(header[4]);
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let body = if body > 0 {
        conn.read_for(body)
    } else {
        Vec::new()
    };
    Response {
        opcode: header[1],
        status: u16::from_be_bytes([header[6], header[7]]),
        opaque: u32::from_be_bytes([header[12], header[13], header[14], header[15]]),
        key: body[extras..extras + key_len].to_vec(),
        value: body[extras + key_len..].to_vec(),
    }
}

const NOOP: u8 = 0x0a;
const SET: u8 = 0x01;
const GET: u8 = 0x00;
const GETKQ: u8 = 0x0d;

fn set_extras() -> Vec<u8> {
    [7u32.to_be_bytes(), 0u32.to_be_bytes()].concat()
}

fn single() -> (Memcached, Memroute) {
    let backend = Memcached::start();
    let proxy = Memroute::start_pool(&[backend.addr()]);
    (backend, proxy)
}

/// The proxy still serves a new client normally (binary and text).
fn still_serves(proxy: &Memroute) {
    let mut other = proxy.connect();
    other.send(&frame(NOOP, b"", b"", b"", 77));
    assert_eq!(read_response(&mut other).opaque, 77);
    let mut text = proxy.connect();
    assert!(text.roundtrip_line(b"version\r\n").starts_with(b"VERSION "));
}

#[test]
fn bad_magic_after_a_binary_frame_closes_without_a_reply() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    let mut bytes = frame(NOOP, b"", b"", b"", 1);
    bytes.extend_from_slice(&[0x81; 24]);
    c.send(&bytes);
    assert_eq!(read_response(&mut c).opcode, NOOP);
    assert!(
        c.expect_eof(),
        "connection not closed after a bad magic byte"
    );
    still_serves(&proxy);
    assert!(proxy.wait_log("bad magic byte", Duration::from_secs(5)));
}

#[test]
fn oversized_storage_body_answers_too_large_and_the_connection_goes_on() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    let value = vec![b'x'; 2 * 1024 * 1024];
    let mut bytes = frame(SET, b"big", &set_extras(), &value, 5);
    bytes.extend_from_slice(&frame(NOOP, b"", b"", b"", 6));
    c.send(&bytes);
    let refused = read_response(&mut c);
    assert_eq!((refused.status, refused.opaque), (0x03, 5), "{refused:?}");
    assert_eq!(refused.value, b"Too large.");
    assert_eq!(
        read_response(&mut c).opaque,
        6,
        "noop after the swallowed value"
    );
}

#[test]
fn oversized_body_of_a_non_storage_request_answers_invalid_arguments_and_closes() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    let mut header = frame(GET, b"k", b"", b"", 9);
    header[8..12].copy_from_slice(&(200u32 * 1024 * 1024).to_be_bytes());
    c.send(&header);
    let refused = read_response(&mut c);
    // A get's body must be its key: memcached's protocol error, whatever the length.
    assert_eq!((refused.status, refused.opaque), (0x04, 9), "{refused:?}");
    assert!(
        c.expect_eof(),
        "not closed after an unframeable body length"
    );
    still_serves(&proxy);
}

#[test]
fn key_length_beyond_the_body_answers_unknown_command_and_closes() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    let mut bytes = frame(GET, b"abc", b"", b"", 3);
    bytes[2..4].copy_from_slice(&100u16.to_be_bytes());
    // The answer comes once the 100 bytes the key length claims are in, as memcached's.
    bytes.extend_from_slice(&[0; 97]);
    c.send(&bytes);
    let refused = read_response(&mut c);
    assert_eq!((refused.status, refused.opaque), (0x81, 3), "{refused:?}");
    assert!(c.expect_eof(), "not closed after key length > body length");
    still_serves(&proxy);
}

#[test]
fn header_cut_short_at_stream_end_closes_without_a_reply() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    c.send(&frame(GET, b"abc", b"", b"", 3)[..10]);
    c.shutdown_write();
    assert!(
        c.expect_eof(),
        "a cut-short header left the connection open"
    );
    still_serves(&proxy);
}

#[test]
fn getkq_run_and_noop_is_one_backend_request_per_server() {
    let pool: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = pool.iter().map(Memcached::addr).collect();
    let proxy = Memroute::start_pool(&addrs);
    // Counted below: each server's bytes_read, which memroute's greetings must not reach.
    proxy.wait_greeted();
    let keys: Vec<String> = (0..20).map(|i| format!("batch-key-{i:02}")).collect();
    let mut c = proxy.connect();
    // Store half of them (through memroute), so the run has hits and misses.
    for (i, key) in keys.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        c.send(&frame(SET, key.as_bytes(), &set_extras(), b"v", i as u32));
        assert_eq!(read_response(&mut c).status, 0);
    }
    let before: Vec<u64> = pool.iter().map(|m| m.stat("bytes_read")).collect();
    let mut run = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        run.extend_from_slice(&frame(GETKQ, key.as_bytes(), b"", b"", 1000 + i as u32));
    }
    run.extend_from_slice(&frame(NOOP, b"", b"", b"", 9999));
    c.send(&run);
    let mut hits = Vec::new();
    loop {
        let r = read_response(&mut c);
        if r.opcode == NOOP {
            assert_eq!(r.opaque, 9999);
            break;
        }
        assert_eq!((r.opcode, r.status), (GETKQ, 0), "{r:?}");
        assert_eq!(r.value, b"v");
        hits.push((r.opaque, String::from_utf8_lossy(&r.key).into_owned()));
    }
    let expected: Vec<(u32, String)> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(i, k)| (1000 + i as u32, k.clone()))
        .collect();
    assert_eq!(hits, expected, "hits only, in order, with their opaques");
    // Each server read exactly one `gets k1 k2 ...\r\n` line (plus the `stats\r\n` asking).
    let after: Vec<u64> = pool.iter().map(|m| m.stat("bytes_read")).collect();
    let mut servers_used = 0;
    let mut total = 0;
    for (b, a) in before.iter().zip(&after) {
        let delta = a - b - "stats\r\n".len() as u64;
        if delta > 0 {
            servers_used += 1;
        }
        total += delta;
    }
    let keys_bytes: u64 = keys.iter().map(|k| k.len() as u64 + 1).sum();
    // Per server: "gets" + " key" per key + "\r\n" = 4 + sum(1 + len) + 2.
    assert_eq!(
        total,
        keys_bytes + 6 * servers_used,
        "one gets line per server ({servers_used} servers used)"
    );
}

#[test]
fn binary_use_and_errors_are_counted_in_stats() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    let mut bytes = frame(GET, b"abc", b"", b"", 3);
    bytes[2..4].copy_from_slice(&100u16.to_be_bytes());
    bytes.extend_from_slice(&[0; 97]);
    c.send(&bytes);
    read_response(&mut c);
    assert!(c.expect_eof());
    let stats = proxy.connect().stats();
    let value = |name: &str| {
        stats
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in {stats:?}"))
    };
    assert_eq!(value("binary_connections"), "1");
    assert_eq!(value("framing_closes"), "1");
    assert_eq!(value("client_errors"), "1");
    // The same, per listener (memroute_listener_events_total{listener,event}).
    let listener = |event: &str| value(&format!("listener:{}:{event}", proxy.listen));
    assert_eq!(listener("binary_connection"), "1");
    assert_eq!(listener("framing_close"), "1");
    assert_eq!(listener("client_error"), "1");
    // A text client's bad request is counted on its listener too (connection kept).
    let mut text = proxy.connect();
    text.send(b"bogus\r\n");
    assert_eq!(text.read_line(), b"ERROR\r\n");
    let stats = proxy.connect().stats();
    let value = |name: &str| {
        stats
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in {stats:?}"))
    };
    assert_eq!(
        value(&format!("listener:{}:client_error", proxy.listen)),
        "2"
    );
    assert_eq!(value("client_errors"), "2");
    assert!(proxy.wait_log(
        "key and extras longer than the body",
        Duration::from_secs(5)
    ));
    assert!(
        proxy.log_text().contains("peer=\"127.0.0.1:"),
        "{}",
        proxy.log_text()
    );
}

#[test]
fn binary_requests_follow_policy_routes_with_binary_keys() {
    let a = Memcached::start();
    let b = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = [
        proxy_section(&listen, "both"),
        pool_section("a", &[a.addr()], ""),
        pool_section("b", &[b.addr()], ""),
        "[routes.both]\ntype = \"replicated\"\nchildren = [\"a\", \"b\"]\nwrites = \"all-sync\"\nreads = \"failover\"\n\n"
            .to_string(),
    ]
    .concat();
    let proxy = Memroute::start(&toml);
    let mut c = proxy.connect();
    // A key the text protocol cannot carry: it travels base64 in meta commands.
    let key = b"key with space\n";
    c.send(&frame(SET, key, &set_extras(), b"value", 1));
    let stored = read_response(&mut c);
    assert_eq!((stored.status, stored.opaque), (0, 1), "{stored:?}");
    for server in [&a, &b] {
        let mut direct = server.connect();
        // "key with space\n" in base64.
        let reply = direct.roundtrip_line(b"mg a2V5IHdpdGggc3BhY2UK b v f\r\n");
        assert_eq!(reply, b"VA 5 f7\r\n", "replica {}", server.addr());
    }
    // getkq for it and a miss, then noop: the hit alone, with its key and flags.
    let mut run = frame(GETKQ, key, b"", b"", 2);
    run.extend_from_slice(&frame(GETKQ, b"missing", b"", b"", 3));
    run.extend_from_slice(&frame(NOOP, b"", b"", b"", 4));
    c.send(&run);
    let hit = read_response(&mut c);
    assert_eq!(
        (hit.opaque, &hit.key[..], &hit.value[..]),
        (2, &key[..], &b"value"[..])
    );
    assert_eq!(read_response(&mut c).opaque, 4);
}
