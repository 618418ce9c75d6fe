//! A backend that dies: its keys get `SERVER_ERROR ...` promptly (the reply arrives within the
//! client's read timeout, no hang), other keys keep working, and the keys work again once the
//! server is back on the same port. Also: SIGTERM shuts memroute down with exit status 0.
use std::time::Duration;

use memroute_tests::*;

#[test]
fn killed_backend_fails_fast_and_recovers_after_restart() {
    let mut servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    // md5, not the default fnv1a_64: 32-bit FNV-1a can put all 60 short sequential keys on one
    // of three servers, and this test needs keys on the dead server and on the live ones.
    let listen = format!("127.0.0.1:{}", free_port());
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let proxy = Memroute::start(&pool_config(&listen, &addrs, "ketama", "md5", ""));
    let mut c = proxy.connect();

    let keys: Vec<String> = (0..60).map(|i| format!("bf{i}")).collect();
    for k in &keys {
        c.set(k, b"v");
    }
    let victim = holder(&servers, &keys[0]);
    let (dead_keys, live_keys): (Vec<&String>, Vec<&String>) =
        keys.iter().partition(|k| holder(&servers, k) == victim);
    assert!(!live_keys.is_empty(), "all keys landed on one server");

    servers[victim].kill();

    // Every request for a dead key gets SERVER_ERROR (read_line panics if nothing comes within
    // the read timeout), and the connection stays usable for the live keys in between.
    for (dead, live) in dead_keys.iter().zip(live_keys.iter().cycle()) {
        for request in [
            format!("get {dead}\r\n"),
            format!("set {dead} 0 0 1\r\nx\r\n"),
        ] {
            let reply = c.roundtrip_line(request.as_bytes());
            assert!(
                reply.starts_with(b"SERVER_ERROR "),
                "{} for a dead server's key got {}",
                show(request.as_bytes()),
                show(&reply)
            );
        }
        assert_eq!(
            c.get(live).as_deref(),
            Some(&b"v"[..]),
            "live key {live} while a server is down"
        );
    }
    // A multi-get touching the dead server answers (an error or the live values), never hangs.
    c.send(format!("get {} {}\r\n", live_keys[0], dead_keys[0]).as_bytes());
    let reply = c.read_get_reply();
    assert!(
        reply.ends_with(b"\r\n"),
        "multi-get across a dead server: {}",
        show(&reply)
    );
    assert_eq!(c.get(live_keys[0]).as_deref(), Some(&b"v"[..]));

    servers[victim].restart();

    // memroute reconnects with backoff; retry (bounded) until the dead key's server answers.
    let key = dead_keys[0];
    set_until_stored(&mut c, key, Duration::from_secs(10), || proxy.log_text());
    assert_eq!(c.get(key).as_deref(), Some(&b"again"[..]));
    assert_eq!(
        servers[victim].connect().get(key).as_deref(),
        Some(&b"again"[..]),
        "the key went back to its own server"
    );
    for k in &dead_keys[1..] {
        assert_eq!(c.get(k), None, "{k}: the restarted server is empty");
    }
}

#[test]
fn sigterm_exits_zero() {
    let backend = Memcached::start();
    // No drain delay: drain.rs tests the drain; this test waits for the exit only.
    let listen = format!("127.0.0.1:{}", memroute_tests::free_port());
    let config = memroute_tests::simple_config(&listen, &[backend.addr()], "").replacen(
        "[proxy]\n",
        "[proxy]\ndrain_delay = \"0s\"\n",
        1,
    );
    let mut proxy = Memroute::start(&config);
    let mut c = proxy.connect();
    c.set("k", b"v");
    proxy.signal("TERM");
    let status = proxy.wait_exit(Duration::from_secs(20));
    assert!(
        status.success(),
        "memroute exited with {status} on SIGTERM\n{}",
        proxy.log_text()
    );
    assert!(
        std::net::TcpStream::connect(&proxy.listen).is_err(),
        "memroute still accepts after exiting"
    );
}

#[test]
fn sigint_exits_zero() {
    let backend = Memcached::start();
    let mut proxy = Memroute::start_pool(&[backend.addr()]);
    proxy.signal("INT");
    let status = proxy.wait_exit(Duration::from_secs(10));
    assert!(
        status.success(),
        "memroute exited with {status} on SIGINT\n{}",
        proxy.log_text()
    );
}
