//! Multi-gets as large as memcached serves: 10,000 keys on one line (79 KB, past the default
//! `max_line_size` of 64 KiB) answered the way memcached itself and twemproxy answer it,
//! while a line that long which is not a retrieval is still refused and closed.
//!
//! ```text
//!   client --get key0 .. key9999 (79 KB)--> memcached   \
//!                                       --> nutcracker  -> same reply bytes
//!                                       --> memroute    /   (memroute: 100 batches of 100)
//! ```
use memroute_tests::*;

const KEYS: usize = 10_000;

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("key{i}")).collect()
}

/// Sends `request` and reads the whole retrieval reply.
fn ask(conn: &mut Conn, request: &[u8]) -> Vec<u8> {
    conn.send(request);
    conn.read_get_reply()
}

#[test]
fn ten_thousand_key_gets_match_memcached_and_twemproxy() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&simple_config(&listen, &[server.addr()], ""));
    let nc_listen = format!("127.0.0.1:{}", free_port());
    let nutcracker = Nutcracker::start(&format!(
        "pool:\n  listen: {nc_listen}\n  hash: fnv1a_64\n  distribution: ketama\n  timeout: 2000\n  servers:\n   - {}:1\n",
        server.addr()
    ));
    let keys = keys();
    // Every other key is a hit, so the reply interleaves hits and misses.
    let hits: Vec<String> = keys.iter().step_by(2).cloned().collect();
    server
        .connect()
        .set_many(&hits, |k| format!("value-of-{k}"));

    let mut direct = server.connect();
    let mut via_memroute = proxy.connect();
    let mut via_twemproxy = nutcracker.connect();
    for command in ["get", "gets"] {
        let line = format!("{command} {}\r\n", keys.join(" "));
        assert!(line.len() > 64 * 1024, "{} bytes", line.len());
        let expected = ask(&mut direct, line.as_bytes());
        let values = parse_values(&expected).expect("memcached's reply parses");
        assert_eq!(values.len(), hits.len(), "{command}: memcached's hits");
        let from_memroute = ask(&mut via_memroute, line.as_bytes());
        assert!(
            from_memroute == expected,
            "{command} through memroute differs from memcached: {}",
            show(&from_memroute[..from_memroute.len().min(200)])
        );
        let from_twemproxy = ask(&mut via_twemproxy, line.as_bytes());
        assert!(
            from_twemproxy == expected,
            "{command} through twemproxy differs from memcached: {}",
            show(&from_twemproxy[..from_twemproxy.len().min(200)])
        );
        println!(
            "large multi-get: {command} of {KEYS} keys ({} byte line): memcached, twemproxy and memroute return the same {} bytes",
            line.len(),
            expected.len()
        );
    }
    // gat/gats: memcached resets a connection holding a gat line this long (it allows
    // long lines for get/gets only) and twemproxy does not know gat; memroute serves them,
    // each hit as memcached's get/gets reports it (a touch changes neither flags nor cas).
    for (command, same_as) in [("gat 0", "get"), ("gats 0", "gets")] {
        let expected = ask(
            &mut direct,
            format!("{same_as} {}\r\n", keys.join(" ")).as_bytes(),
        );
        let line = format!("{command} {}\r\n", keys.join(" "));
        let from_memroute = ask(&mut via_memroute, line.as_bytes());
        assert!(
            from_memroute == expected,
            "{command} through memroute differs from memcached's {same_as}: {}",
            show(&from_memroute[..from_memroute.len().min(200)])
        );
    }
    // The connection carries on.
    assert_eq!(
        via_memroute.get("key0").as_deref(),
        Some(&b"value-of-key0"[..])
    );
    let stats = via_memroute.stats();
    assert_eq!(stat_u64(&stats, "cmd_get"), Some(4 * KEYS as u64 + 1));
}

#[test]
fn a_line_that_long_which_is_not_a_retrieval_is_still_refused() {
    let server = Memcached::start();
    let proxy = Memroute::start_pool(&[server.addr()]);
    let line = format!("delete {}\r\n", keys().join(" "));
    assert!(line.len() > 64 * 1024);
    // Past 2 KB without its newline, a line that is not a multi-get is closed the way
    // memcached closes it (silently); if the whole line is read at once, it is answered
    // `CLIENT_ERROR line too long` first. Either way, nothing else and then end of stream.
    for target in [proxy.listen.clone(), server.addr()] {
        let mut c = Conn::connect(&target);
        let _ = c.try_send(line.as_bytes());
        let started = std::time::Instant::now();
        let answer = match c.read_until_with(|_| None) {
            Ok(_) => unreachable!("read_until_with(None) only ends on EOF or error"),
            Err(error) => error.partial,
        };
        // Closed (EOF or reset), not a read that timed out on an open connection.
        assert!(
            started.elapsed() < IO_TIMEOUT,
            "{target} kept the connection open"
        );
        println!(
            "large multi-get: {target} on a {} byte delete line answered {:?} and closed",
            line.len(),
            String::from_utf8_lossy(&answer)
        );
        if target == proxy.listen {
            assert!(
                answer.is_empty() || answer == b"CLIENT_ERROR line too long\r\n",
                "{}",
                show(&answer)
            );
        }
    }
    // Other clients are unaffected.
    let mut other = proxy.connect();
    other.set("after", b"ok");
    assert_eq!(other.get("after").as_deref(), Some(&b"ok"[..]));
}

/// The reply memcached gives for `keys` when the keys in `hits` hold `value-of-<key>`
/// (flags 0): their values in the client's order, then END.
fn expected_reply(keys: &[String], hits: &std::collections::HashSet<&str>) -> Vec<u8> {
    let mut reply = Vec::new();
    for key in keys.iter().filter(|k| hits.contains(k.as_str())) {
        let value = format!("value-of-{key}");
        reply.extend_from_slice(format!("VALUE {key} 0 {}\r\n{value}\r\n", value.len()).as_bytes());
    }
    reply.extend_from_slice(b"END\r\n");
    reply
}

#[test]
fn ten_thousand_key_get_and_gat_over_four_servers_return_every_value_in_order() {
    let servers: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let addresses: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let listen = format!("127.0.0.1:{}", free_port());
    // md5 spreads short sequential keys over all four servers (fnv1a_64 bunches them).
    let proxy = Memroute::start(&pool_config(&listen, &addresses, "ketama", "md5", ""));
    let keys = keys();
    // Two keys of every three are hits, set through memroute (so they land where it routes).
    let hits: Vec<String> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, k)| k.clone())
        .collect();
    let mut client = proxy.connect();
    client.set_many(&hits, |k| format!("value-of-{k}"));
    let hit_set: std::collections::HashSet<&str> = hits.iter().map(String::as_str).collect();
    // Every server holds some of them: the request really is split four ways.
    for server in &servers {
        assert!(
            server.stat("curr_items") > 0,
            "{} holds no key",
            server.addr()
        );
    }
    let expected = expected_reply(&keys, &hit_set);
    // gat lines are cut at memcached's 2048-byte line limit per server batch, get lines
    // at max_keys_per_request only; both come back whole and in the client's order.
    for command in ["get", "gat 0"] {
        let line = format!("{command} {}\r\n", keys.join(" "));
        let reply = ask(&mut client, line.as_bytes());
        assert!(
            reply == expected,
            "{command} of {KEYS} keys over 4 servers: {} bytes, expected {}; starts {}",
            reply.len(),
            expected.len(),
            show(&reply[..reply.len().min(200)])
        );
        println!(
            "large multi-get: {command} of {KEYS} keys over 4 servers: {} values in order ({} bytes)",
            hits.len(),
            reply.len()
        );
    }
    // The connection carries on.
    assert_eq!(client.get("key1").as_deref(), Some(&b"value-of-key1"[..]));
}
