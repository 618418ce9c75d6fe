//! A root per listener: each `proxy.listen` entry may name the pool or route its clients
//! are served by, the others serve `proxy.route`. Keys set through one port land only on
//! that port's pool (checked on the real memcached servers), and a reload that changes a
//! listener's route takes effect for the next request on connections already open.
use std::io::{Read, Write};

use memroute_tests::*;

/// `[pools.a]` over `a` and `[pools.b]` over `b`.
fn two_pools(a: &Memcached, b: &Memcached) -> String {
    pool_section("a", &[a.addr()], "") + &pool_section("b", &[b.addr()], "")
}

/// Sets every key through `connections` fresh connections to `address`, spread evenly.
fn set_through(address: &str, connections: usize, keys: &[String]) {
    let mut conns: Vec<Conn> = (0..connections).map(|_| Conn::connect(address)).collect();
    for (i, key) in keys.iter().enumerate() {
        conns[i % connections].set(key, key.as_bytes());
    }
}

/// Asserts that `holder` has every key and `other` none of them.
fn held_only_by(keys: &[String], holder: &Memcached, other: &Memcached, through: &str) {
    let held = holder.held(keys);
    assert_eq!(
        held.len(),
        keys.len(),
        "keys set through {through} missing on {}",
        holder.addr()
    );
    let strays = other.held(keys);
    assert!(
        strays.is_empty(),
        "keys set through {through} found on {}: {:?}",
        other.addr(),
        strays.keys().collect::<Vec<_>>()
    );
}

/// One `set` over a unix socket, the reply line returned.
fn set_over_unix(path: &std::path::Path, key: &str) -> String {
    let mut stream = std::os::unix::net::UnixStream::connect(path)
        .unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .expect("read timeout");
    let request = format!("set {key} 0 0 {}\r\n{key}\r\n", key.len());
    stream.write_all(request.as_bytes()).expect("write");
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => reply.push(byte[0]),
            other => panic!("reading the reply over {}: {other:?}", path.display()),
        }
    }
    String::from_utf8_lossy(&reply).into_owned()
}

#[test]
fn keys_land_on_the_pool_of_the_listener_they_came_through() {
    let (a, b) = (Memcached::start(), Memcached::start());
    let (plain, routed) = (free_port(), free_port());
    let dir = TempDir::new("listeners");
    let socket = dir.path().join("a.sock");
    // Two workers, and a unix socket (served by the first worker only) between the TCP
    // listeners: the second worker's sockets must still find their own listener's root.
    let toml = format!(
        "[proxy]\n\
         listen = [\"127.0.0.1:{plain}\", {{ address = \"unix:{}\", route = \"a\" }}, \
                   {{ address = \"127.0.0.1:{routed}\", route = \"b\" }}]\n\
         workers = 2\nroute = \"a\"\n\n{}",
        socket.display(),
        two_pools(&a, &b)
    );
    let proxy = Memroute::start(&toml);

    let through_plain = numbered_keys("plain:", 64);
    set_through(&format!("127.0.0.1:{plain}"), 16, &through_plain);
    held_only_by(&through_plain, &a, &b, "the listener without a route");

    // 16 connections: the kernel spreads them over both workers' sockets.
    let through_routed = numbered_keys("routed:", 64);
    set_through(&format!("127.0.0.1:{routed}"), 16, &through_routed);
    held_only_by(&through_routed, &b, &a, "the listener routed to b");

    assert_eq!(set_over_unix(&socket, "unix:1"), "STORED\r\n");
    held_only_by(&["unix:1".to_string()], &a, &b, "the unix listener");
    drop(proxy);
}

#[test]
fn a_reload_that_swaps_a_listeners_route_applies_to_open_connections() {
    let (a, b) = (Memcached::start(), Memcached::start());
    let (plain, routed) = (free_port(), free_port());
    let config = |route: &str| {
        format!(
            "[proxy]\n\
             listen = [\"127.0.0.1:{plain}\", {{ address = \"127.0.0.1:{routed}\", route = \"{route}\" }}]\n\
             workers = 2\nroute = \"a\"\n\n{}",
            two_pools(&a, &b)
        )
    };
    let proxy = Memroute::start(&config("b"));
    let mut open: Vec<Conn> = (0..8)
        .map(|_| Conn::connect(&format!("127.0.0.1:{routed}")))
        .collect();
    let before: Vec<String> = (0..open.len()).map(|i| format!("before:{i}")).collect();
    for (conn, key) in open.iter_mut().zip(&before) {
        conn.set(key, b"1");
    }
    held_only_by(&before, &b, &a, "the listener before the reload");

    assert!(proxy.reload(&config("a")), "{}", proxy.log_text());
    assert!(
        !proxy.log_text().contains("needs a restart"),
        "a listener's route is not a restart-only setting:\n{}",
        proxy.log_text()
    );
    // The same connections, still open, now reach pool a.
    let after: Vec<String> = (0..open.len()).map(|i| format!("after:{i}")).collect();
    for (conn, key) in open.iter_mut().zip(&after) {
        conn.set(key, b"2");
    }
    held_only_by(&after, &a, &b, "the listener after the reload");
    // And the plain listener still serves proxy.route.
    let plain_keys = numbered_keys("plain:", 8);
    set_through(&format!("127.0.0.1:{plain}"), 2, &plain_keys);
    held_only_by(&plain_keys, &a, &b, "the listener without a route");
}
