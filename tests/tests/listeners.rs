//! A root per listener: each `proxy.listen` entry may name the pool or route its clients
//! are served by, the others serve `proxy.route`. Keys set through one port land only on
//! that port's pool (checked on the real memcached servers), and a reload that changes a
//! listener's route takes effect for the next request on connections already open.
use std::io::{Read, Write};
use std::time::Duration;

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

/// The value of the first `/metrics` sample line that starts with `series` (name and labels).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Polls `/metrics` (bounded) until every `(series, value)` holds; panics with the last
/// scrape otherwise.
fn wait_metrics(admin: &str, expected: &[(String, f64)]) {
    let mut last = String::new();
    let reached = poll_until(Duration::from_secs(10), || {
        last = admin_http(admin, "GET", "/metrics").1;
        expected
            .iter()
            .all(|(series, value)| sample(&last, series) == Some(*value))
    });
    assert!(reached, "expected {expected:?} in /metrics:\n{last}");
}

/// Two listeners over pools `a` and `b` (the first without a route, so on `proxy.route`),
/// with an admin endpoint: (config, plain listener, routed listener, admin address).
fn routed_config(a: &Memcached, b: &Memcached) -> (String, String, String, String) {
    let plain = format!("127.0.0.1:{}", free_port());
    let routed = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        "[proxy]\n\
         listen = [\"{plain}\", {{ address = \"{routed}\", route = \"b\" }}]\n\
         workers = 2\nroute = \"a\"\n\n\
         [admin]\nlisten = \"{admin}\"\n\n{}",
        two_pools(a, b)
    );
    (toml, plain, routed, admin)
}

#[test]
fn stats_and_metrics_show_each_listeners_route_connections_and_requests() {
    let (a, b) = (Memcached::start(), Memcached::start());
    let (toml, plain, routed, admin) = routed_config(&a, &b);
    let proxy = Memroute::start(&toml);
    let mut routed_conns: Vec<Conn> = (0..3).map(|_| Conn::connect(&routed)).collect();
    for i in 0..10 {
        routed_conns[i % 3].set(&format!("r{i}"), b"v");
    }
    let mut plain_conn = Conn::connect(&plain);
    for i in 0..4 {
        plain_conn.set(&format!("p{i}"), b"v");
    }
    let series = |name: &str, listener: &str| format!("{name}{{listener=\"{listener}\"}}");
    let requests = "memroute_listener_requests_total";
    let connections = "memroute_listener_connections_current";
    wait_metrics(
        &admin,
        &[
            (series(requests, &routed), 10.0),
            (series(requests, &plain), 4.0),
            (series(connections, &routed), 3.0),
            (series(connections, &plain), 1.0),
            (
                format!("memroute_listener_route_info{{listener=\"{routed}\",route=\"b\"}}"),
                1.0,
            ),
            (
                format!("memroute_listener_route_info{{listener=\"{plain}\",route=\"a\"}}"),
                1.0,
            ),
        ],
    );

    // Closed connections leave the count; `stats` has the same numbers, a line each.
    drop(routed_conns);
    wait_metrics(&admin, &[(series(connections, &routed), 0.0)]);
    let stats = proxy.wait_stats("per-listener stats", Duration::from_secs(10), |stats| {
        let value = |name: String| stats.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
        value(format!("listener:{routed}:route")).is_some_and(|v| v == "b")
            && value(format!("listener:{plain}:route")).is_some_and(|v| v == "a")
            && value(format!("listener:{routed}:requests")).is_some_and(|v| v == "10")
            && value(format!("listener:{routed}:connections")).is_some_and(|v| v == "0")
    });
    let plain_requests = stat_u64(&stats, &format!("listener:{plain}:requests"));
    // The 4 sets, the `stats` requests the wait sent through the first listener.
    assert!(
        plain_requests.is_some_and(|n| n >= 5),
        "{plain_requests:?} in {stats:?}"
    );
    drop(plain_conn);
}

#[test]
fn route_cli_and_admin_answer_for_the_listener_asked() {
    let (a, b) = (Memcached::start(), Memcached::start());
    let (toml, plain, routed, admin) = routed_config(&a, &b);
    let proxy = Memroute::start(&toml);
    let config = proxy.config_path().as_os_str();
    let route = |listen: Option<&str>| {
        let mut args: Vec<&std::ffi::OsStr> = vec!["route".as_ref(), "--config".as_ref(), config];
        if let Some(listen) = listen {
            args.extend(["--listen", listen].map(std::ffi::OsStr::new));
        }
        args.push("k".as_ref());
        run_memroute_cli(&args, Duration::from_secs(20))
    };
    let on_a = format!("k: a => {} (primary)\n", a.addr());
    let on_b = format!("k: b => {} (primary)\n", b.addr());
    let first = route(None);
    assert_eq!(first.stdout, on_a, "{}", first.stderr);
    let routed_answer = route(Some(&routed));
    assert_eq!(routed_answer.stdout, on_b, "{}", routed_answer.stderr);
    let unknown = route(Some("127.0.0.1:1"));
    assert!(!unknown.status.success());
    assert!(
        unknown.stderr.contains(&format!(
            "no listener \"127.0.0.1:1\" in proxy.listen ({plain}, {routed})"
        )),
        "{}",
        unknown.stderr
    );

    let check = run_memroute_cli(
        &["--check".as_ref(), "--config".as_ref(), config],
        Duration::from_secs(20),
    );
    for line in [
        format!("listener {plain}: route a\n"),
        format!("listener {routed}: route b\n"),
    ] {
        assert!(
            check.stdout.contains(&line),
            "{line:?} in:\n{}",
            check.stdout
        );
    }

    assert_eq!(admin_http(&admin, "GET", "/route?key=k"), (200, on_a));
    assert_eq!(
        admin_http(&admin, "GET", &format!("/route?key=k&listener={routed}")),
        (200, on_b)
    );
    let (status, body) = admin_http(&admin, "GET", "/route?key=k&listener=nowhere");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no listener \"nowhere\""), "{body}");

    // mcrouter's admin query answers for the listener it is sent to.
    for (listener, server) in [(&plain, a.addr()), (&routed, b.addr())] {
        let mut client = Conn::connect(listener);
        client.send(b"get __mcrouter__.route(get,k)\r\n");
        let reply = client.read_get_reply();
        let values = parse_values(&reply).unwrap_or_else(|| panic!("{}", show(&reply)));
        assert_eq!(values.len(), 1, "{}", show(&reply));
        assert_eq!(
            String::from_utf8_lossy(&values[0].2),
            server,
            "via {listener}"
        );
    }
    drop(proxy);
}

#[test]
fn adding_or_removing_a_listener_on_reload_needs_a_restart_and_says_so() {
    let (a, b) = (Memcached::start(), Memcached::start());
    let (toml, plain, routed, _) = routed_config(&a, &b);
    let proxy = Memroute::start(&toml);
    let added = format!("127.0.0.1:{}", free_port());
    let reloaded = toml.replace(
        &format!("{{ address = \"{routed}\", route = \"b\" }}"),
        &format!("{{ address = \"{added}\", route = \"b\" }}"),
    );
    assert_ne!(reloaded, toml);
    assert!(proxy.reload(&reloaded), "{}", proxy.log_text());
    let said = format!(
        "proxy.listen: adding or removing a listener needs a restart; kept the running listeners \
         ({plain}, {routed}); not bound: {added}; still serving, with proxy.route: {routed}"
    );
    assert!(
        proxy.log_text().contains(&said),
        "{said:?} in:\n{}",
        proxy.log_text()
    );
    assert!(
        std::net::TcpStream::connect(&added).is_err(),
        "{added} was bound on reload"
    );
    // The listener the file no longer has still serves, now with proxy.route.
    let mut kept = Conn::connect(&routed);
    kept.set("kept:1", b"v");
    held_only_by(
        &["kept:1".to_string()],
        &a,
        &b,
        "the listener removed from the file",
    );
}
