//! Differential conformance: the same bytes sent straight to memcached A and through memroute
//! to memcached B (a one-server pool) must get the same reply bytes. Both servers start fresh
//! per script and see the same sequence, so even cas uniques agree.
//! `version`, `verbosity` and `stats` are answered by memroute itself and are tested apart.
use memroute_tests::scripts::{self, compare, Script, Side};
use memroute_tests::*;

/// Runs every script on a fresh (memcached, memroute+memcached) pair; reports all differences.
fn run(scripts: Vec<Script>) {
    let mut failures = Vec::new();
    for script in &scripts {
        let reference = Memcached::start();
        let backend = Memcached::start();
        let proxy = Memroute::start_pool(&[backend.addr()]);
        let mut want = Side::new(reference.connect());
        let mut got = Side::new(proxy.connect());
        if let Err(e) = compare(script, &mut want, &mut got) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scripts differ:\n\n{}",
        failures.len(),
        scripts.len(),
        failures.join("\n\n")
    );
}

#[test]
fn text_protocol_matches_memcached() {
    run(scripts::text_scripts());
}

#[test]
fn meta_protocol_matches_memcached() {
    run(scripts::meta_scripts());
}

#[test]
fn bad_input_matches_memcached() {
    run(scripts::bad_input_scripts());
}

/// One memcached behind one memroute, for the tests that do not need a reference.
fn single() -> (Memcached, Memroute) {
    let backend = Memcached::start();
    let proxy = Memroute::start_pool(&[backend.addr()]);
    (backend, proxy)
}

#[test]
fn version_verbosity_stats_are_answered_by_memroute() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    let version = c.roundtrip_line(b"version\r\n");
    assert!(
        version.starts_with(b"VERSION ") && version.ends_with(b"\r\n"),
        "version: {}",
        show(&version)
    );
    assert_eq!(show(&c.roundtrip_line(b"verbosity 1\r\n")), show(b"OK\r\n"));
    assert_eq!(show(&c.roundtrip_line(b"verbosity 0\r\n")), show(b"OK\r\n"));
    // noreply: nothing comes back, so the next reply is the fence's.
    assert_eq!(
        show(
            &c.roundtrip_fenced(b"verbosity 1 noreply\r\n")
                .expect("verbosity noreply")
        ),
        ""
    );

    // Counters move with traffic: one hit and one miss.
    c.set("s", b"1");
    c.get("s");
    c.get("nope");
    let stats = c.stats();
    let stat = |name: &str| {
        stats
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    for name in ["uptime", "curr_connections", "cmd_get", "get_hits"] {
        assert!(stat(name).is_some(), "stats lacks STAT {name}: {stats:?}");
    }
    let num = |name: &str| {
        stat(name)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("STAT {name} not a number: {stats:?}"))
    };
    assert!(num("cmd_get") >= 2, "cmd_get after two gets: {stats:?}");
    assert!(num("get_hits") >= 1, "get_hits after a hit: {stats:?}");
    assert!(
        num("curr_connections") >= 1,
        "curr_connections with one client: {stats:?}"
    );
    // The connection is still framed after stats (stats() read up to END).
    assert_eq!(c.get("s").as_deref(), Some(&b"1"[..]));
}

#[test]
fn quit_closes_the_connection() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    c.set("q", b"1");
    c.send(b"quit\r\n");
    assert!(c.expect_eof(), "memroute must close the connection on quit");
    assert_eq!(proxy.connect().get("q").as_deref(), Some(&b"1"[..]));
}

/// 100 mixed commands in one write; the replies must come back complete and in order. The
/// same bytes go to a direct memcached for the expected answer.
#[test]
fn pipelined_requests_are_answered_in_order() {
    let reference = Memcached::start();
    let (_backend, proxy) = single();
    let mut batch = Vec::new();
    for i in 0..100 {
        let cmd = match i % 5 {
            0 => format!("set p{i} 0 0 {}\r\nv{i}\r\n", format!("v{i}").len()),
            1 => format!("get p{} nope p{}\r\n", i - 1, i - 1),
            2 => format!("incr p{} 1\r\n", i - 2),
            3 => format!("mg p{} v k O{i}\r\n", i - 3),
            _ => format!("delete p{}\r\n", i - 4),
        };
        batch.extend_from_slice(cmd.as_bytes());
    }
    let want = reference
        .connect()
        .roundtrip_fenced(&batch)
        .expect("batch to memcached");
    let got = proxy
        .connect()
        .roundtrip_fenced(&batch)
        .unwrap_or_else(|e| panic!("pipelined batch through memroute: {e}"));
    assert_eq!(show(&got), show(&want));
}

/// A client that writes one byte at a time must be answered as if it wrote whole requests.
#[test]
fn byte_at_a_time_requests() {
    let reference = Memcached::start();
    let (_backend, proxy) = single();
    let requests: &[u8] = b"set slow 0 0 5\r\nhello\r\nget slow nope slow\r\nmg slow v k\r\nincr slow 1\r\ndelete slow\r\nmn\r\n";
    let want = reference
        .connect()
        .roundtrip_fenced(requests)
        .expect("requests to memcached");
    let mut c = proxy.connect();
    for b in requests {
        c.send(std::slice::from_ref(b));
    }
    // The fence comes after the script's own trailing mn.
    let got = c
        .roundtrip_fenced(b"")
        .unwrap_or_else(|e| panic!("byte-at-a-time through memroute: {e}"));
    assert_eq!(show(&got), show(&want));
}

/// After each recoverable error the same connection keeps working.
#[test]
fn connection_stays_usable_after_recoverable_errors() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    let errors: [&[u8]; 7] = [
        b"bogus\r\n",
        b"\r\n",
        b"set k abc 0 1\r\nx\r\n",
        b"set k 0 0 1\r\nxyz\r\n",
        b"set s 0 0 1\r\na\r\nincr s 1\r\n",
        b"get kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\r\n",
        b"mg\r\n",
    ];
    for (i, bad) in errors.iter().enumerate() {
        let reply = c
            .roundtrip_fenced(bad)
            .unwrap_or_else(|e| panic!("error case {i} {}: {e}", show(bad)));
        assert!(
            !reply.is_empty(),
            "error case {i} {} got no reply",
            show(bad)
        );
        let value = format!("after{i}");
        c.set("alive", value.as_bytes());
        assert_eq!(
            c.get("alive"),
            Some(value.into_bytes()),
            "connection unusable after {}",
            show(bad)
        );
    }
}
