//! A failover route to a gutter pool (mcrouter's FailoverWithExptimeRoute): with its first
//! pool's server killed, writes land in the gutter with their exptime capped at
//! `failover_exptime` (read back with memcached's own `mg KEY t` on the gutter server),
//! reads find them there, only the errors named in `failover_errors` move it on, and
//! each failover is counted for the route in `stats` and on the panel.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test, with its message

use std::time::{Duration, Instant};

use memroute_tests::{admin_http, free_port, pool_section, Conn, Memcached, Memroute};

/// The remaining TTL memcached reports for `key` on `server` (`mg KEY t`): -1 for an item
/// that never expires; `None` when the server does not have it.
fn ttl_on(server: &Memcached, key: &str) -> Option<i64> {
    let mut c = server.connect();
    let line = String::from_utf8(c.roundtrip_line(format!("mg {key} t\r\n").as_bytes())).unwrap();
    match line.trim_end().strip_prefix("HD t") {
        Some(ttl) => Some(ttl.parse().expect("a ttl")),
        None => {
            assert_eq!(line, "EN\r\n", "mg {key} t");
            None
        }
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The config: pool `main` (`first`), its gutter pool (`gutter`), and route `wan`, failing
/// over from main to the gutter on `errors` with `failover_exptime = cap`.
fn gutter_config(first: &Memcached, gutter: &Memcached, errors: &str, cap: &str) -> String {
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    format!(
        "[proxy]\nlisten = [\"{listen}\"]\nworkers = 1\nroute = \"wan\"\n\n\
         [admin]\nlisten = \"{admin}\"\n\n{}{}\
         [routes.wan]\ntype = \"failover\"\nchildren = [\"main\", \"main-failover\"]\n\
         failover_errors = {errors}\nfailover_exptime = {cap}\n\n",
        pool_section("main", &[first.addr()], ""),
        pool_section("main-failover", &[gutter.addr()], ""),
    )
}

/// Sets `key` through `c` until the proxy stores it (the first pool's server is dead and
/// the route fails over once memroute has marked it down, `tko`), or fails at a deadline.
fn set_until_stored(c: &mut Conn, key: &str, exptime: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = c.roundtrip_line(format!("set {key} 0 {exptime} 3\r\nabc\r\n").as_bytes());
        if reply == b"STORED\r\n" {
            return;
        }
        assert!(
            reply.starts_with(b"SERVER_ERROR"),
            "set {key}: {}",
            String::from_utf8_lossy(&reply)
        );
        assert!(Instant::now() < deadline, "set {key} never failed over");
    }
}

fn stat(c: &mut Conn, name: &str) -> Option<u64> {
    c.stats()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.parse().unwrap())
}

#[test]
fn writes_to_the_gutter_are_capped_at_failover_exptime_and_reads_find_them() {
    let mut first = Memcached::start();
    let gutter = Memcached::start();
    let proxy = Memroute::start(&gutter_config(&first, &gutter, "[\"tko\"]", "60"));
    let mut c = proxy.connect();

    // Healthy: writes go to main with their own exptime; the gutter is not written.
    c.set("healthy", b"one");
    assert_eq!(
        ttl_on(&first, "healthy"),
        Some(-1),
        "no cap on the first child"
    );
    assert_eq!(ttl_on(&gutter, "healthy"), None);
    assert_eq!(stat(&mut c, "route:wan:failovers").unwrap_or(0), 0);

    first.kill();
    // exptime 0 (never) becomes the cap.
    set_until_stored(&mut c, "never", 0);
    let ttl = ttl_on(&gutter, "never").expect("the write failed over to the gutter");
    assert!(
        (1..=60).contains(&ttl),
        "exptime 0 capped at 60 s: ttl {ttl}"
    );
    assert_eq!(
        c.get("never").as_deref(),
        Some(&b"abc"[..]),
        "read after failover"
    );

    // Longer than the cap: the cap. Shorter: its own.
    set_until_stored(&mut c, "long", 3600);
    let ttl = ttl_on(&gutter, "long").unwrap();
    assert!((1..=60).contains(&ttl), "3600 s capped at 60 s: ttl {ttl}");
    set_until_stored(&mut c, "short", 10);
    let ttl = ttl_on(&gutter, "short").unwrap();
    assert!((1..=10).contains(&ttl), "10 s kept: ttl {ttl}");

    // An absolute time (a day ahead) is above the cap as a number: the cap, as in mcrouter.
    set_until_stored(&mut c, "absolute", unix_now() + 86_400);
    let ttl = ttl_on(&gutter, "absolute").unwrap();
    assert!(
        (1..=60).contains(&ttl),
        "absolute time capped at 60 s: ttl {ttl}"
    );

    // Negative: sent as it is, so memcached takes it as already expired.
    set_until_stored(&mut c, "negative", -1);
    assert_eq!(ttl_on(&gutter, "negative"), None);
    assert_eq!(c.get("negative"), None);

    // Meta: an ms without T never expires, so it gets the cap; touch is capped too.
    let reply = c.roundtrip_line(b"ms meta 3\r\nxyz\r\n");
    assert_eq!(reply, b"HD\r\n");
    let ttl = ttl_on(&gutter, "meta").unwrap();
    assert!((1..=60).contains(&ttl), "ms without T capped: ttl {ttl}");
    // Binary: a set (opcode 0x01, extras flags + exptime 0) reaches servers as meta: capped.
    let mut set = vec![0x80, 0x01, 0, 3, 8, 0, 0, 0, 0, 0, 0, 14, 0, 0, 0, 0];
    set.extend_from_slice(&[0; 8]); // cas
    set.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]); // flags, exptime 0
    set.extend_from_slice(b"binxyz");
    // A connection speaks binary from its first byte: a new one.
    let mut b = proxy.connect();
    b.send(&set);
    let header = b.read_for(24);
    assert_eq!((header[0], header[1]), (0x81, 0x01), "{header:?}");
    assert_eq!(&header[6..8], &[0, 0], "binary set stored: {header:?}");
    let ttl = ttl_on(&gutter, "bin").unwrap();
    assert!(
        (1..=60).contains(&ttl),
        "binary set with exptime 0 capped: ttl {ttl}"
    );
    assert_eq!(c.roundtrip_line(b"touch short 0\r\n"), b"TOUCHED\r\n");
    let ttl = ttl_on(&gutter, "short").unwrap();
    assert!(
        (50..=60).contains(&ttl),
        "touch 0 capped at 60 s: ttl {ttl}"
    );

    // gat of one key touches: capped too (0 would otherwise make it never expire).
    set_until_stored(&mut c, "gat", 10);
    let reply = c.roundtrip_lines(b"gat 0 gat\r\n", 3);
    assert_eq!(reply, b"VALUE gat 0 3\r\nabc\r\nEND\r\n");
    let ttl = ttl_on(&gutter, "gat").unwrap();
    assert!((50..=60).contains(&ttl), "gat 0 capped at 60 s: ttl {ttl}");
    // Of several keys: each key's touch capped the same way.
    set_until_stored(&mut c, "gat2", 10);
    multi_touch_is_capped(&mut c, &gutter);

    // Every write above went over once (and the read of each too): counted for the route.
    let failovers = stat(&mut c, "route:wan:failovers").expect("route:wan:failovers in stats");
    assert!(failovers >= 8, "failovers counted: {failovers}");
}

/// A `gat 0` and a `gats 3600` of keys `gat` and `gat2` (both in the gutter, their TTLs
/// at most 10 s) through the route, its first child down: both hit, and each key's TTL
/// in the gutter is the 60 s cap, not never (0) nor an hour.
fn multi_touch_is_capped(c: &mut Conn, gutter: &Memcached) {
    let reply = c.roundtrip_lines(b"gat 0 gat gat2\r\n", 5);
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "VALUE gat 0 3\r\nabc\r\nVALUE gat2 0 3\r\nabc\r\nEND\r\n"
    );
    for key in ["gat", "gat2"] {
        let ttl = ttl_on(gutter, key).unwrap();
        assert!(
            (50..=60).contains(&ttl),
            "gat 0 of two keys: {key} ttl {ttl}"
        );
    }
    // Lower the TTLs again so that an uncapped gats would show.
    for key in ["gat", "gat2"] {
        assert_eq!(
            c.roundtrip_line(format!("touch {key} 5\r\n").as_bytes()),
            b"TOUCHED\r\n"
        );
    }
    let reply = c.roundtrip_lines(b"gats 3600 gat gat2\r\n", 5);
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.starts_with("VALUE gat 0 3 ") && text.ends_with("END\r\n"),
        "{text}"
    );
    for key in ["gat", "gat2"] {
        let ttl = ttl_on(gutter, key).unwrap();
        assert!(
            (50..=60).contains(&ttl),
            "gats 3600 of two keys: {key} ttl {ttl}"
        );
    }
}

/// Without `failover_errors` (every error moves on) a multi-get is planned over the first
/// pool as a plain pool's keys, and a failed batch's keys go on (`rest_multi`): a
/// multi-key gat is capped on that path too.
#[test]
fn a_multi_key_touch_planned_over_the_first_pool_is_capped_on_failover() {
    let mut first = Memcached::start();
    let gutter = Memcached::start();
    let config = gutter_config(&first, &gutter, "[\"tko\"]", "60")
        .replace("failover_errors = [\"tko\"]\n", "");
    assert!(!config.contains("failover_errors"), "{config}");
    let proxy = Memroute::start(&config);
    let mut c = proxy.connect();
    first.kill();
    set_until_stored(&mut c, "gat", 10);
    set_until_stored(&mut c, "gat2", 10);
    multi_touch_is_capped(&mut c, &gutter);
}

#[test]
fn errors_not_named_in_failover_errors_do_not_move_on() {
    let mut first = Memcached::start();
    let gutter = Memcached::start();
    // Only data timeouts move this route on: a dead server (refused, then tko) does not.
    let config = gutter_config(&first, &gutter, "[\"timeout\"]", "\"60s\"");
    let proxy = Memroute::start(&config);
    let mut c = proxy.connect();
    first.kill();
    for i in 0..20 {
        let reply = c.roundtrip_line(format!("set k{i} 0 0 1\r\nx\r\n").as_bytes());
        assert!(
            reply.starts_with(b"SERVER_ERROR"),
            "set k{i}: {}",
            String::from_utf8_lossy(&reply)
        );
        assert_eq!(
            ttl_on(&gutter, &format!("k{i}")),
            None,
            "k{i} not in the gutter"
        );
        let read = c.roundtrip_line(format!("get k{i}\r\n").as_bytes());
        assert!(
            read.starts_with(b"SERVER_ERROR"),
            "get k{i}: {}",
            String::from_utf8_lossy(&read)
        );
    }
    assert_eq!(stat(&mut c, "route:wan:failovers").unwrap_or(0), 0);
}

#[test]
fn the_panel_shows_the_routes_failovers_and_its_gutter_settings() {
    let mut first = Memcached::start();
    let gutter = Memcached::start();
    let config = gutter_config(&first, &gutter, "[\"tko\", \"connect_error\"]", "\"10m\"");
    let admin = config
        .lines()
        .find_map(|l| l.strip_prefix("listen = \"127.0.0.1:"))
        .map(|port| format!("127.0.0.1:{}", port.trim_end_matches('"')))
        .unwrap();
    let proxy = Memroute::start(&config);
    let mut c = proxy.connect();
    first.kill();
    set_until_stored(&mut c, "k", 0);
    let ttl = ttl_on(&gutter, "k").unwrap();
    assert!((1..=600).contains(&ttl), "capped at 10m: {ttl}");
    let (status, body) = admin_http(&admin, "GET", "/state");
    assert_eq!(status, 200);
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tree = &state["listeners"][0]["tree"];
    assert_eq!(tree["name"], "wan");
    assert_eq!(
        tree["detail"],
        "in order, failover_errors [connect_error, tko], failover_exptime 600s"
    );
    assert!(tree["failovers"].as_u64().unwrap() >= 1, "{tree}");
}

/// An mcrouter config with a gutter (FailoverWithExptimeRoute on `["tko"]`, 600 s, servers
/// written `host:port:ascii:plain`, a comment and a trailing comma), imported with
/// `memroute import-mcrouter` and served as imported (with a listen address added, which
/// mcrouter takes from its command line): a killed server's writes go to the gutter pool
/// capped at 600 s, and reads find them.
#[test]
fn an_imported_failover_with_exptime_route_writes_capped_copies_to_the_gutter() {
    let mut first = Memcached::start();
    let gutter = Memcached::start();
    let json = format!(
        r#"{{
  // the wan pool and its gutter
  "pools": {{
    "wan": {{ "servers": ["{}:ascii:plain"] }},
    "wan-failover": {{ "servers": ["{}:ascii:plain"], }},
  }},
  "route": {{
    "type": "FailoverWithExptimeRoute",
    "normal": "PoolRoute|wan",
    "failover": ["PoolRoute|wan-failover"],
    "failover_errors": ["tko"],
    "failover_exptime": 600,
  }},
}}"#,
        first.addr(),
        gutter.addr()
    );
    let dir = memroute_tests::TempDir::new("gutter-import");
    let file = dir.write("mcrouter.json", &json);
    let out = memroute_tests::run_memroute_cli(
        &[std::ffi::OsStr::new("import-mcrouter"), file.as_os_str()],
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "import failed: {}", out.stderr);
    assert!(
        out.stdout.contains("failover_exptime = 600"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("failover_errors = [\"tko\"]"),
        "{}",
        out.stdout
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = out.stdout.replacen(
        "[proxy]\n",
        &format!("[proxy]\nlisten = [\"{listen}\"]\nworkers = 1\n"),
        1,
    );
    let proxy = Memroute::start(&toml);
    let mut c = proxy.connect();
    c.set("before", b"x");
    assert_eq!(ttl_on(&first, "before"), Some(-1));
    first.kill();
    set_until_stored(&mut c, "after", 0);
    let ttl = ttl_on(&gutter, "after").expect("in the gutter");
    assert!((1..=600).contains(&ttl), "capped at 600 s: ttl {ttl}");
    assert_eq!(c.get("after").as_deref(), Some(&b"abc"[..]));
}
