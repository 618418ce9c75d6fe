//! A write refused as too large drops the key's old value, as memcached does, so a client
//! that failed to write never reads the value it meant to replace (memcached's t/getset.t:
//! `set foo_N MOO`, then a set over the item size, then a get misses).
//!
//! memcached unlinks the key when it refuses a text `set`, a binary set or setq, or an `ms`
//! in any mode as too large; add, replace, append, prepend and cas leave the old value.
//! memroute refuses a value over `max_value_size` itself (the data never reaches a server)
//! and sends the key's delete where the write would have gone instead.
//!
//! ```text
//!   same bytes ──> memcached A                       (the reference)
//!              └─> memroute ──pool──> memcached B    (must answer A's bytes)
//!   routes: memroute ──prefix──> replicated (a, b) | shadow (a -> b) | failover (a, b)
//!                              | operation (set -> a, delete -> b, default c)
//! ```
use std::time::Duration;

use memroute_tests::scripts::{compare, Script, Side};
use memroute_tests::*;

/// One byte over memroute's default `max_value_size` (1 MiB, memcached's default `-I`):
/// refused by memroute before it reaches a server.
const OVER_PROXY_LIMIT: usize = 1024 * 1024 + 1;
/// Exactly `max_value_size`: memroute passes it on and memcached refuses it (its item
/// header counts against the limit too), unlinking the key itself.
const OVER_ITEM_LIMIT: usize = 1024 * 1024;

/// The steps of memcached's t/getset.t refusal, for one storage line: store `MOO`, send
/// `line` with `len` bytes of data, read the key back.
fn refusal(key: &str, line: &str, len: usize) -> Vec<Vec<u8>> {
    let mut big = line.replace("{LEN}", &len.to_string()).into_bytes();
    big.extend_from_slice(b"\r\n");
    big.extend(std::iter::repeat_n(b'x', len));
    big.extend_from_slice(b"\r\n");
    vec![
        format!("set {key} 0 0 3\r\nMOO\r\n").into_bytes(),
        big,
        format!("get {key}\r\n").into_bytes(),
        format!("mg {key} v\r\n").into_bytes(),
    ]
}

fn text_and_meta_scripts() -> Vec<Script> {
    let cases: &[(&'static str, &str)] = &[
        ("set", "set foo 0 0 {LEN}"),
        ("set noreply", "set foo 0 0 {LEN} noreply"),
        // memcached unlinks for set only: these keep MOO.
        ("add", "add foo 0 0 {LEN}"),
        ("replace", "replace foo 0 0 {LEN}"),
        ("append", "append foo 0 0 {LEN}"),
        ("prepend", "prepend foo 0 0 {LEN} noreply"),
        ("cas", "cas foo 0 0 {LEN} 1"),
        // ms unlinks in every mode, and `q` does not hide its error.
        ("ms", "ms foo {LEN} T0"),
        ("ms q", "ms foo {LEN} q"),
        ("ms append mode", "ms foo {LEN} MA"),
        ("ms add mode", "ms foo {LEN} ME"),
        // `Zm9v` is `foo` in base64.
        ("ms base64 key", "ms Zm9v {LEN} b"),
        // memcached checks an ms's flags before its size: a flag error is the answer and
        // the old value stays (the first error found, as memcached finds it).
        ("ms unknown flag", "ms foo {LEN} T1 Z"),
        ("ms duplicate flag", "ms foo {LEN} T1 T2"),
        ("ms bad token", "ms foo {LEN} Tx Cx"),
        ("ms bad client flags", "ms foo {LEN} Fx MZ"),
        ("ms bad mode", "ms foo {LEN} MZ"),
        ("ms long mode", "ms foo {LEN} MSS"),
        ("ms bad initial", "ms foo {LEN} Jx"),
        ("ms bad delta", "ms foo {LEN} Dx"),
        (
            "ms long opaque",
            "ms foo {LEN} O123456789012345678901234567890123",
        ),
        (
            "ms long opaque and bad mode",
            "ms foo {LEN} O123456789012345678901234567890123 MZ",
        ),
        ("ms key not base64", "ms foo {LEN} b"),
        ("ms flags that pass", "ms foo {LEN} T1 I k O1 F5 C0 MS"),
    ];
    let mut scripts = Vec::new();
    for &(name, line) in cases {
        for len in [OVER_PROXY_LIMIT, OVER_ITEM_LIMIT] {
            scripts.push(Script {
                name,
                steps: refusal("foo", line, len),
            });
        }
    }
    // The connection goes on after the refusal: the next requests, pipelined behind the
    // refused data in one write, are answered in order.
    let mut pipelined = refusal("bar", "set bar 0 0 {LEN}", OVER_PROXY_LIMIT).concat();
    pipelined.extend_from_slice(b"set bar 0 0 3\r\nNEW\r\nget bar\r\n");
    scripts.push(Script {
        name: "pipelined behind a refusal",
        steps: vec![pipelined],
    });
    scripts
}

/// Text and meta: the same bytes to memcached and through memroute (a one-server pool)
/// get the same bytes back, refusal, miss (or old value) and all.
#[test]
fn a_refused_text_or_meta_write_answers_and_unlinks_as_memcached_does() {
    let mut failures = Vec::new();
    for script in text_and_meta_scripts() {
        let reference = Memcached::start();
        let backend = Memcached::start();
        let proxy = Memroute::start_pool(&[backend.addr()]);
        let mut want = Side::new(reference.connect());
        let mut got = Side::new(proxy.connect());
        if let Err(e) = compare(&script, &mut want, &mut got) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

const SET: u8 = 0x01;
const ADD: u8 = 0x02;
const GET: u8 = 0x00;
const NOOP: u8 = 0x0a;
const SETQ: u8 = 0x11;

/// One binary request frame (a set's extras: flags 0, no expiry).
fn frame(opcode: u8, key: &[u8], value_len: usize, opaque: u32) -> Vec<u8> {
    let extras: &[u8] = match opcode {
        SET | SETQ | ADD => &[0; 8],
        _ => &[],
    };
    let body = extras.len() + key.len() + value_len;
    let mut bytes = vec![0x80, opcode];
    bytes.extend_from_slice(&(key.len() as u16).to_be_bytes());
    bytes.extend_from_slice(&[extras.len() as u8, 0, 0, 0]);
    bytes.extend_from_slice(&(body as u32).to_be_bytes());
    bytes.extend_from_slice(&opaque.to_be_bytes());
    bytes.extend_from_slice(&[0; 8]);
    bytes.extend_from_slice(extras);
    bytes.extend_from_slice(key);
    bytes.extend(std::iter::repeat_n(b'x', value_len));
    bytes
}

/// One whole binary response, as its bytes.
fn read_binary(conn: &mut Conn) -> Vec<u8> {
    let mut response = conn.read_for(24);
    let body = u32::from_be_bytes([response[8], response[9], response[10], response[11]]);
    response.extend(conn.read_for(body as usize));
    response
}

/// Sends `requests` in one write and reads every response up to the NOOP's (opaque 99)
/// that ends them.
fn binary_exchange(conn: &mut Conn, requests: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut bytes = requests.concat();
    bytes.extend(frame(NOOP, b"", 0, 99));
    conn.send(&bytes);
    let mut responses = Vec::new();
    loop {
        let response = read_binary(conn);
        let fence = response[1] == NOOP && response[12..16] == 99u32.to_be_bytes();
        responses.push(response);
        if fence {
            return responses;
        }
    }
}

/// The binary protocol: a set or setq refused as too large answers status 3 `Too large.`
/// and unlinks; an add refused so keeps the old value. Byte for byte as memcached, for a
/// value memroute refuses once the frame is in, one refused from its header alone (the
/// body over `max_value_size` + 64 KiB), and one memcached refuses itself.
#[test]
fn a_refused_binary_set_answers_and_unlinks_as_memcached_does() {
    let mut failures = Vec::new();
    let refused_by_memroute = [OVER_PROXY_LIMIT, 1024 * 1024 + 100 * 1024];
    // A binary add memcached itself refuses is left out: memroute sends it on as an `ms`
    // in add mode, which memcached unlinks for (see docs/operations.md, Protocols).
    let cases = [
        (
            SET,
            &[OVER_PROXY_LIMIT, 1024 * 1024 + 100 * 1024, OVER_ITEM_LIMIT][..],
        ),
        (
            SETQ,
            &[OVER_PROXY_LIMIT, 1024 * 1024 + 100 * 1024, OVER_ITEM_LIMIT][..],
        ),
        (ADD, &refused_by_memroute[..]),
    ];
    for (opcode, lens) in cases {
        for &len in lens {
            let requests = vec![
                frame(SET, b"foo", 3, 1),
                frame(opcode, b"foo", len, 2),
                frame(GET, b"foo", 0, 3),
                frame(SET, b"foo", 3, 4),
                frame(GET, b"foo", 0, 5),
            ];
            let reference = Memcached::start();
            let backend = Memcached::start();
            let proxy = Memroute::start_pool(&[backend.addr()]);
            let want = binary_exchange(&mut reference.connect(), &requests);
            let got = binary_exchange(&mut proxy.connect(), &requests);
            if want != got {
                failures.push(format!(
                    "opcode {opcode:#04x}, {len} bytes:\n--- memcached:\n{}\n--- memroute:\n{}",
                    show(&want.concat()),
                    show(&got.concat())
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn pool(name: &str, server: &str) -> String {
    pool_section(name, &[server.to_string()], "timeout = \"10s\"")
}

/// A value memroute refuses, as a text set line and its data.
fn big_set(key: &str, noreply: bool) -> Vec<u8> {
    let noreply = if noreply { " noreply" } else { "" };
    let mut bytes = format!("set {key} 0 0 {OVER_PROXY_LIMIT}{noreply}\r\n").into_bytes();
    bytes.extend(std::iter::repeat_n(b'x', OVER_PROXY_LIMIT));
    bytes.extend_from_slice(b"\r\n");
    bytes
}

fn big_ms(key: &str) -> Vec<u8> {
    let mut bytes = format!("ms {key} {OVER_PROXY_LIMIT} q\r\n").into_bytes();
    bytes.extend(std::iter::repeat_n(b'x', OVER_PROXY_LIMIT));
    bytes.extend_from_slice(b"\r\n");
    bytes
}

const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";

/// Whether `server` holds `key`, asked directly.
fn holds(server: &Memcached, key: &str) -> bool {
    server.connect().get(key).is_some()
}

/// Through every route kind that writes: the key's old value is gone from every server
/// the write would have reached (both replicas, the primary and the shadow, the failover's
/// first child, the operation route's `set` target rather than its `delete` one), for a
/// text set, a noreply set, a quiet ms and a binary set.
#[test]
fn a_refused_write_unlinks_the_key_wherever_the_write_would_have_gone() {
    let a = Memcached::start();
    let b = Memcached::start();
    let c = Memcached::start();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("a", &a.addr()),
            pool("b", &b.addr()),
            pool("c", &c.addr()),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"r:\" = \"replicas\", \"s:\" = \"shadowed\", \"f:\" = \"failover\", \"o:\" = \"by_command\" }\ndefault = \"a\"\n\n".to_string(),
            "[routes.replicas]\ntype = \"replicated\"\nchildren = [\"a\", \"b\"]\nwrites = \"all-sync\"\n\n".to_string(),
            "[routes.shadowed]\ntype = \"shadow\"\nprimary = \"a\"\nshadow = \"b\"\nfraction = 1.0\n\n".to_string(),
            "[routes.failover]\ntype = \"failover\"\nchildren = [\"a\", \"b\"]\n\n".to_string(),
            "[routes.by_command]\ntype = \"operation\"\nset = \"a\"\ndelete = \"b\"\ndefault = \"c\"\n\n".to_string(),
        ],
    );
    let mut client = proxy.connect();
    let store = |client: &mut Conn, key: &str| {
        let reply = client.roundtrip_line(format!("set {key} 0 0 3\r\nMOO\r\n").as_bytes());
        assert_eq!(show(&reply), show(b"STORED\r\n"), "{key}");
    };
    // (key prefix, the servers a write reaches, whether one of them is written on a task
    // of its own: the shadow's copy is not waited for by the client's reply)
    let routes: [(&str, Vec<&Memcached>, bool); 5] = [
        ("plain", vec![&a], false),
        ("r:", vec![&a, &b], false),
        ("s:", vec![&a, &b], true),
        ("f:", vec![&a], false),
        ("o:", vec![&a], false),
    ];
    type Refusal = fn(&str) -> Vec<u8>;
    let refusals: [(&str, Refusal, &[u8]); 3] = [
        ("set", |key| big_set(key, false), TOO_LARGE),
        ("set noreply", |key| big_set(key, true), b""),
        ("ms q", big_ms, TOO_LARGE),
    ];
    for (prefix, servers, async_copy) in &routes {
        for (what, request, answer) in &refusals {
            let key = format!(
                "{}{}",
                prefix.trim_start_matches("plain"),
                what.replace(' ', "_")
            );
            store(&mut client, &key);
            let reached = |server: &Memcached| holds(server, &key);
            for server in servers {
                assert!(
                    poll_until(Duration::from_secs(5), || reached(server)),
                    "{key}: MOO never reached {}",
                    server.addr()
                );
            }
            let request = request(&key);
            let reply = client
                .roundtrip_fenced(&request)
                .unwrap_or_else(|e| panic!("{key} ({what}): {e}"));
            assert_eq!(show(&reply), show(answer), "{key} ({what})");
            for server in servers {
                let gone = || !holds(server, &key);
                // The client's reply waits for every write but the shadow's copy.
                let gone = if *async_copy {
                    poll_until(Duration::from_secs(5), gone)
                } else {
                    gone()
                };
                assert!(gone, "{key} ({what}): still on {}", server.addr());
            }
            assert_eq!(client.get(&key), None, "{key} ({what}) read back");
        }
    }
    // The operation route's delete target is not where sets go: it never held the key, and
    // a value it holds under that key is left alone.
    b.connect().set("o:set", b"B's own");
    store(&mut client, "o:set");
    let reply = client
        .roundtrip_fenced(&big_set("o:set", false))
        .expect("o:set");
    assert_eq!(show(&reply), show(TOO_LARGE));
    assert!(!holds(&a, "o:set"));
    assert_eq!(b.connect().get("o:set").as_deref(), Some(&b"B's own"[..]));

    // A binary set through the replicated route: gone from both replicas.
    let mut binary = proxy.connect();
    let key = b"r:binary";
    store(&mut client, "r:binary");
    let responses = binary_exchange(&mut binary, &[frame(SET, key, OVER_PROXY_LIMIT, 7)]);
    assert_eq!(responses.len(), 2, "the refusal, then the fence");
    assert_eq!(&responses[0][6..8], &[0, 3], "status Too large");
    assert_eq!(&responses[0][24..], b"Too large.");
    assert!(!holds(&a, "r:binary") && !holds(&b, "r:binary"));
}
