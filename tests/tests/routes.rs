//! Route types against real memcached: every target names a pool or a route, `proxy.route` is
//! the root. Where a route sends a request is checked by asking each memcached directly.
//!
//! ```text
//!   test ──> memroute ──route tree──> pool a ──> memcached
//!                                 └─> pool b ──> memcached     (test also asks each directly)
//! ```
//!
//! Waits are polls of a condition with a deadline (stats counters, a server's contents);
//! latencies are printed for the report, never asserted.
use std::time::{Duration, Instant};

use memroute_tests::*;

/// How long an asynchronous effect (a shadow copy, a warm-up fill, an async write) may take
/// to show up before the test fails. Generous: the machine is noisy.
const ASYNC_DEADLINE: Duration = Duration::from_secs(5);

/// A pool named `name` over one server.
/// A pool of one server. Its timeout is long: a reply through a debug build on a busy
/// machine can take longer than a few hundred ms, and a dead server here is a refused
/// connection, failed at once whatever the timeout (the stalled-server tests set their own).
fn pool(name: &str, server: &Memcached) -> String {
    pool_section(name, &[server.addr()], "timeout = \"10s\"")
}

fn value_of(key: &str) -> String {
    format!("v-{key}")
}

/// A stat of memroute's that must be present.
fn stat(stats: &[(String, String)], name: &str) -> u64 {
    stat_u64(stats, name).unwrap_or_else(|| panic!("no {name} in memroute's stats: {stats:?}"))
}

/// set `key` through `c`; a missing reply fails with memroute's log (a lost reply is a bug
/// worth its context).
fn set_logged(proxy: &Memroute, c: &mut Conn, key: &str, value: &str) {
    c.send(format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes());
    let reply = c
        .read_until_with(|b| find(b, b"\r\n").map(|i| i + 2))
        .unwrap_or_else(|e| {
            panic!(
                "set {key}: {e}\nstats: {:?}\nlog:\n{}",
                proxy.stats(),
                proxy.log_text()
            )
        });
    assert_eq!(show(&reply), show(b"STORED\r\n"), "set {key}");
}

/// `Conn::set_many` (pipelined, 200 a batch) through `proxy`, failing with memroute's log
/// if a reply never comes.
fn set_many_logged(proxy: &Memroute, c: &mut Conn, keys: &[String]) {
    for (n, chunk) in keys.chunks(200).enumerate() {
        let done = n * 200;
        let mut batch = Vec::new();
        for k in chunk {
            let v = value_of(k);
            batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
        }
        c.send(&batch);
        for (i, k) in chunk.iter().enumerate() {
            let reply = c
                .read_until_with(|b| find(b, b"\r\n").map(|i| i + 2))
                .unwrap_or_else(|e| {
                    panic!(
                        "pipelined set {k} (reply {i} of a batch of {} sets; {done} replies before this batch): {e}\nstats: {:?}\nlog:\n{}",
                        chunk.len(),
                        proxy.stats(),
                        proxy.log_text()
                    )
                });
            assert_eq!(show(&reply), show(b"STORED\r\n"), "set {k}");
        }
    }
}

/// The reply line to `request` through `proxy`, as text.
fn line(c: &mut Conn, request: &str) -> String {
    String::from_utf8_lossy(&c.roundtrip_line(request.as_bytes())).into_owned()
}

#[test]
fn operation_route_sends_reads_to_one_pool_and_writes_to_another() {
    let reads = Memcached::start();
    let writes = Memcached::start();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("r", &reads),
            pool("w", &writes),
            "[routes.root]\ntype = \"operation\"\nget = \"r\"\ngets = \"r\"\ndefault = \"w\"\n"
                .to_string(),
        ],
    );
    let mut c = proxy.connect();

    c.set("k", b"through-proxy");
    assert_eq!(
        writes.connect().get("k").as_deref(),
        Some(&b"through-proxy"[..]),
        "a set goes to the write pool"
    );
    assert_eq!(
        reads.connect().get("k"),
        None,
        "a set reached the read pool"
    );

    reads.connect().set("k", b"from-r");
    assert_eq!(
        c.get("k").as_deref(),
        Some(&b"from-r"[..]),
        "a get is answered by the read pool"
    );
    c.send(b"gets k\r\n");
    let reply = c.read_get_reply();
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.starts_with("VALUE k 0 6 ") && text.contains("\r\nfrom-r\r\nEND\r\n"),
        "gets through the read pool: {}",
        show(&reply)
    );

    // delete is not named: the default (the write pool).
    assert_eq!(line(&mut c, "delete k\r\n"), "DELETED\r\n");
    assert_eq!(writes.connect().get("k"), None);
    assert_eq!(reads.connect().get("k").as_deref(), Some(&b"from-r"[..]));

    // Meta commands count as their classic equivalents: ms is a set, mg a get, md a delete.
    assert_eq!(line(&mut c, "ms mk 2\r\nhi\r\n"), "HD\r\n");
    assert_eq!(writes.connect().get("mk").as_deref(), Some(&b"hi"[..]));
    assert_eq!(reads.connect().get("mk"), None, "ms reached the read pool");
    assert_eq!(
        line(&mut c, "mg mk v\r\n"),
        "EN\r\n",
        "mg went to the write pool"
    );
    reads.connect().set("mk", b"r-mk");
    c.send(b"mg mk v\r\n");
    assert_eq!(show(&c.read_for(12)), show(b"VA 4\r\nr-mk\r\n"));
    assert_eq!(line(&mut c, "md mk\r\n"), "HD\r\n");
    assert_eq!(
        writes.connect().get("mk"),
        None,
        "md did not reach the write pool"
    );
    assert_eq!(reads.connect().get("mk").as_deref(), Some(&b"r-mk"[..]));
}

fn shadow_stats(proxy: &Memroute, route: &str) -> (u64, u64, u64, u64) {
    let s = proxy.stats();
    (
        stat(&s, &format!("shadow:{route}:sent")),
        stat(&s, &format!("shadow:{route}:completed")),
        stat(&s, &format!("shadow:{route}:errors")),
        stat(&s, &format!("shadow:{route}:dropped")),
    )
}

/// Polls until every shadow request sent by `route` has finished (completed or failed).
fn wait_shadow_settled(proxy: &Memroute, route: &str) -> (u64, u64, u64, u64) {
    let sent = format!("shadow:{route}:sent");
    let completed = format!("shadow:{route}:completed");
    let errors = format!("shadow:{route}:errors");
    proxy.wait_stats(
        &format!("shadow route {route}: completed + errors == sent"),
        Duration::from_secs(10),
        |s| match (
            stat_u64(s, &sent),
            stat_u64(s, &completed),
            stat_u64(s, &errors),
        ) {
            (Some(sent), Some(c), Some(e)) => sent > 0 && c + e == sent,
            _ => false,
        },
    );
    shadow_stats(proxy, route)
}

fn shadow_route(name: &str, primary: &str, shadow: &str, select: &str) -> String {
    format!(
        "[routes.{name}]\ntype = \"shadow\"\nprimary = \"{primary}\"\nshadow = \"{shadow}\"\n{select}\n\n"
    )
}

#[test]
fn shadow_copies_the_configured_fraction_of_keys() {
    let primary = Memcached::start();
    let shadow = Memcached::start();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("p", &primary),
            pool("s", &shadow),
            shadow_route("root", "p", "s", "fraction = 0.1"),
        ],
    );
    let keys = numbered_keys("sh", 5000);
    let mut c = proxy.connect();
    let started = Instant::now();
    set_many_logged(&proxy, &mut c, &keys);
    let took = started.elapsed();

    let (sent, completed, errors, dropped) = wait_shadow_settled(&proxy, "root");
    let in_shadow = shadow.stat("curr_items");
    let fraction = in_shadow as f64 / keys.len() as f64;
    println!(
        "shadow: fraction 0.1 configured; {in_shadow} of {} keys reached the shadow ({fraction:.4}); \
         sent {sent}, completed {completed}, errors {errors}, dropped {dropped}; \
         {} pipelined sets took {:.1} ms",
        keys.len(),
        keys.len(),
        took.as_secs_f64() * 1000.0
    );
    assert_eq!(
        primary.stat("curr_items"),
        keys.len() as u64,
        "the primary holds every key"
    );
    assert!(
        (0.08..=0.12).contains(&fraction),
        "shadowed fraction {fraction} is not within 0.1 ± 0.02"
    );
    assert_eq!(errors, 0, "a healthy shadow had errors");
    assert_eq!(
        in_shadow, completed,
        "each completed shadow set stored one distinct key"
    );
    // What reached the shadow is exactly what the client wrote.
    let held = shadow.held(&keys);
    for (k, v) in &held {
        assert_eq!(
            v,
            value_of(k).as_bytes(),
            "{k} in the shadow has another value"
        );
    }
}

#[test]
fn key_range_selects_the_same_keys_as_the_equal_fraction() {
    // root shadows 10% (fraction) to s1; its primary is another shadow route copying
    // key_range [0.0, 0.1] to s2: both select by the same key hash, so s1 and s2 get the same keys.
    let primary = Memcached::start();
    let s1 = Memcached::start();
    let s2 = Memcached::start();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("p", &primary),
            pool("s1", &s1),
            pool("s2", &s2),
            shadow_route("root", "inner", "s1", "fraction = 0.1"),
            shadow_route("inner", "p", "s2", "key_range = [0.0, 0.1]"),
        ],
    );
    let keys = numbered_keys("kr", 1000);
    set_many_logged(&proxy, &mut proxy.connect(), &keys);
    wait_shadow_settled(&proxy, "root");
    wait_shadow_settled(&proxy, "inner");
    let mut in_s1: Vec<String> = s1.held(&keys).into_keys().collect();
    let mut in_s2: Vec<String> = s2.held(&keys).into_keys().collect();
    in_s1.sort();
    in_s2.sort();
    println!(
        "shadow: key_range [0.0, 0.1] and fraction 0.1 each selected {} / {} of 1000 keys",
        in_s2.len(),
        in_s1.len()
    );
    assert!(!in_s1.is_empty(), "nothing was shadowed");
    assert_eq!(in_s1, in_s2, "fraction 0.1 and key_range [0.0, 0.1] differ");
    assert_eq!(primary.stat("curr_items"), 1000);
}

#[test]
fn a_killed_shadow_never_fails_the_client() {
    let primary = Memcached::start();
    let mut shadow = Memcached::start();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("p", &primary),
            pool("s", &shadow),
            shadow_route("root", "p", "s", "fraction = 0.5"),
        ],
    );
    shadow.kill();
    let keys = numbered_keys("ks", 500);
    let mut c = proxy.connect();
    let mut ok = 0;
    let mut latencies = Vec::new();
    for k in &keys {
        let started = Instant::now();
        set_logged(&proxy, &mut c, k, &value_of(k));
        latencies.push(started.elapsed());
        ok += 1;
    }
    for k in &keys {
        assert_eq!(c.get(k).as_deref(), Some(value_of(k).as_bytes()), "{k}");
        ok += 1;
    }
    let (sent, completed, errors, dropped) = wait_shadow_settled(&proxy, "root");
    println!(
        "shadow: with the shadow server killed, {ok} of {ok} client requests succeeded; \
         set latency {}; shadow sent {sent}, completed {completed}, errors {errors}, dropped {dropped}",
        latency_summary(&latencies)
    );
    assert_eq!(primary.stat("curr_items"), keys.len() as u64);
    assert!(
        errors + dropped > 0,
        "a killed shadow counted no errors or drops"
    );
}

#[test]
fn a_stalled_shadow_never_holds_up_the_client_and_sheds_beyond_max_in_flight() {
    let primary = Memcached::start();
    let shadow = Memcached::start();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("p", &primary),
            pool_section("s", &[shadow.addr()], "timeout = \"1s\""),
            shadow_route("root", "p", "s", "fraction = 1.0\nmax_in_flight = 10"),
        ],
    );
    let mut c = proxy.connect();
    // Open memroute's connection to the shadow while it runs.
    c.set("warm", b"x");
    wait_shadow_settled(&proxy, "root");

    let frozen = shadow.stop();
    let keys = numbered_keys("st", 50);
    let started = Instant::now();
    // One write of 50 sets: all of them reach memroute at once, so more than 10 shadow
    // copies would be in flight together.
    set_many_logged(&proxy, &mut c, &keys);
    let took = started.elapsed();
    let (sent, completed, errors, dropped) = shadow_stats(&proxy, "root");
    println!(
        "shadow: 50 pipelined sets answered in {:.1} ms while the shadow is SIGSTOPped \
         (shadow timeout 1 s); max_in_flight 10: sent {sent}, completed {completed}, errors {errors}, dropped {dropped}",
        took.as_secs_f64() * 1000.0
    );
    assert!(
        dropped > 0,
        "50 shadow copies at once with max_in_flight = 10 dropped none (sent {sent})"
    );
    assert_eq!(primary.stat("curr_items"), 51);
    frozen.resume();
    wait_shadow_settled(&proxy, "root");
}

/// `[routes.NAME]` of type replicated over pools a, b, c.
fn replicated(name: &str, writes: &str, reads: &str) -> String {
    format!(
        "[routes.{name}]\ntype = \"replicated\"\nchildren = [\"a\", \"b\", \"c\"]\nwrites = \"{writes}\"\nreads = \"{reads}\"\n\n"
    )
}

#[test]
fn replicated_writes_reach_every_replica_and_reads_fail_over() {
    let mut servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    // Nested: a prefix route in front of two replicated routes over the same pools.
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("a", &servers[0]),
            pool("b", &servers[1]),
            pool("c", &servers[2]),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"maj:\" = \"majority\" }\ndefault = \"sync\"\n\n"
                .to_string(),
            replicated("sync", "all-sync", "failover"),
            replicated("majority", "all-majority", "failover"),
        ],
    );
    let keys = numbered_keys("r", 200);
    let mut c = proxy.connect();
    set_many_logged(&proxy, &mut c, &keys);
    for (i, server) in servers.iter().enumerate() {
        let held = server.held(&keys);
        assert_eq!(held.len(), keys.len(), "replica {i} misses keys");
        for k in &keys {
            assert_eq!(held[k], value_of(k).as_bytes(), "replica {i}, {k}");
        }
    }
    assert_eq!(line(&mut c, "delete r0\r\n"), "DELETED\r\n");
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(server.connect().get("r0"), None, "replica {i} kept r0");
    }
    c.set("r0", value_of("r0").as_bytes());

    // The first replica dies.
    servers[0].kill();
    for attempt in 0..3 {
        let reply = line(&mut c, "set after 0 0 1\r\nx\r\n");
        assert!(
            reply.starts_with("SERVER_ERROR "),
            "all-sync set with a replica dead (attempt {attempt}): {reply:?}"
        );
    }
    // all-majority: two of three is a majority.
    assert_eq!(
        line(&mut c, "set maj:k 0 0 3\r\nyes\r\n"),
        "STORED\r\n",
        "all-majority with one of three replicas dead\n{}",
        proxy.log_text()
    );
    for server in &servers[1..] {
        assert_eq!(server.connect().get("maj:k").as_deref(), Some(&b"yes"[..]));
    }
    // reads = failover: the dead first replica is skipped, every key is still readable.
    let started = Instant::now();
    for k in &keys {
        assert_eq!(
            c.get(k).as_deref(),
            Some(value_of(k).as_bytes()),
            "{k} with the first replica dead"
        );
    }
    println!(
        "replicated: 200 failover reads with the first replica killed took {:.1} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );
}

#[test]
fn replicated_reads_random_spread_and_fastest_does_not_wait_for_a_stalled_replica() {
    let a = Memcached::start();
    let b = Memcached::start();
    // A pool timeout far beyond the test client's read timeout (IO_TIMEOUT): a read that waited for the
    // stalled replica would fail the test by itself, whatever the machine's speed.
    let patient =
        |name: &str, server: &Memcached| pool_section(name, &[server.addr()], "timeout = \"60s\"");
    let proxy = Memroute::start_routes(
        "root",
        &[
            patient("a", &a),
            patient("b", &b),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"f:\" = \"fastest\" }\ndefault = \"random\"\n\n"
                .to_string(),
            "[routes.random]\ntype = \"replicated\"\nchildren = [\"a\", \"b\"]\nreads = \"random\"\n\n"
                .to_string(),
            "[routes.fastest]\ntype = \"replicated\"\nchildren = [\"a\", \"b\"]\nreads = \"fastest\"\n\n"
                .to_string(),
        ],
    );
    // Each replica holds its own value, set directly, so a reply says which replica answered.
    for key in ["k", "f:k"] {
        a.connect().set(key, b"from-a");
        b.connect().set(key, b"from-b");
    }
    let mut c = proxy.connect();

    let (mut from_a, mut from_b) = (0, 0);
    for _ in 0..400 {
        match c.get("k").as_deref() {
            Some(b"from-a") => from_a += 1,
            Some(b"from-b") => from_b += 1,
            other => panic!("reads = random answered {other:?}"),
        }
    }
    println!("replicated reads = random: 400 gets answered {from_a} by a, {from_b} by b");
    // 200 expected each; 100 is ten standard deviations away.
    assert!(
        from_a >= 100 && from_b >= 100,
        "reads = random is not spread: a {from_a}, b {from_b}"
    );

    let both = c.get("f:k");
    assert!(
        matches!(both.as_deref(), Some(b"from-a") | Some(b"from-b")),
        "reads = fastest with both replicas up: {both:?}"
    );
    let frozen = a.stop();
    let mut samples = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        assert_eq!(
            c.get("f:k").as_deref(),
            Some(&b"from-b"[..]),
            "reads = fastest with replica a stalled"
        );
        samples.push(started.elapsed());
    }
    println!(
        "replicated reads = fastest, replica a SIGSTOPped (pool timeout 60 s): {}",
        latency_summary(&samples)
    );
    frozen.resume();
}

#[test]
fn replicated_async_and_initial_writes_reach_every_replica() {
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("a", &servers[0]),
            pool("b", &servers[1]),
            pool("c", &servers[2]),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"i:\" = \"initial\" }\ndefault = \"async\"\n\n"
                .to_string(),
            replicated("async", "all-async", "first"),
            replicated("initial", "all-initial", "first"),
        ],
    );
    let mut c = proxy.connect();
    let everywhere = |key: &str, value: Option<&[u8]>| {
        poll_until(ASYNC_DEADLINE, || {
            servers
                .iter()
                .all(|s| s.connect().get(key).as_deref() == value)
        })
    };
    assert_eq!(line(&mut c, "set x 0 0 1\r\n1\r\n"), "STORED\r\n");
    assert!(
        everywhere("x", Some(b"1")),
        "all-async set did not reach every replica"
    );
    assert_eq!(line(&mut c, "set i:x 0 0 1\r\n2\r\n"), "STORED\r\n");
    assert!(
        everywhere("i:x", Some(b"2")),
        "all-initial set did not reach every replica"
    );
    assert_eq!(line(&mut c, "delete x\r\n"), "DELETED\r\n");
    assert!(
        everywhere("x", None),
        "all-async delete did not reach every replica"
    );
    assert_eq!(line(&mut c, "delete i:x\r\n"), "DELETED\r\n");
    assert!(
        everywhere("i:x", None),
        "all-initial delete did not reach every replica"
    );
    assert_eq!(
        line(&mut c, "delete i:x\r\n"),
        "NOT_FOUND\r\n",
        "all-initial answers the first child's reply"
    );

    // all-async answers touch and flush_all at once too, as memcached would on success.
    assert_eq!(line(&mut c, "set y 0 0 1\r\n3\r\n"), "STORED\r\n");
    assert!(everywhere("y", Some(b"3")), "all-async set of y");
    assert_eq!(line(&mut c, "touch y 1000\r\n"), "TOUCHED\r\n");
    assert!(
        poll_until(ASYNC_DEADLINE, || servers
            .iter()
            .all(|s| meta_get(s, "y").is_some_and(|(ttl, _, _)| ttl > 0))),
        "all-async touch did not give y a TTL on every replica"
    );
    // flush_all reaches both prefix targets, each a replicated route over all three pools.
    assert_eq!(line(&mut c, "set i:y 0 0 1\r\n4\r\n"), "STORED\r\n");
    assert!(everywhere("i:y", Some(b"4")), "all-initial set of i:y");
    assert_eq!(line(&mut c, "flush_all\r\n"), "OK\r\n");
    assert!(
        everywhere("y", None) && everywhere("i:y", None),
        "flush_all through the replicated routes left items behind"
    );
}

#[test]
fn failover_route_uses_the_next_child_on_error_and_on_miss() {
    let mut a = Memcached::start();
    let b = Memcached::start();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("a", &a),
            pool("b", &b),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"m:\" = \"on_miss\" }\ndefault = \"on_error\"\n\n"
                .to_string(),
            "[routes.on_error]\ntype = \"failover\"\nchildren = [\"a\", \"b\"]\non = \"error\"\n\n"
                .to_string(),
            "[routes.on_miss]\ntype = \"failover\"\nchildren = [\"a\", \"b\"]\non = \"error-or-miss\"\n\n"
                .to_string(),
        ],
    );
    let mut c = proxy.connect();
    b.connect().set("m:only-b", b"bee");
    b.connect().set("only-b", b"bee");

    assert_eq!(
        c.get("m:only-b").as_deref(),
        Some(&b"bee"[..]),
        "error-or-miss: a miss in a is looked up in b"
    );
    assert_eq!(c.get("m:nowhere"), None);
    assert_eq!(
        c.get("only-b"),
        None,
        "on = error: a's miss is the answer, b is not asked"
    );

    c.set("k1", b"one");
    assert_eq!(a.connect().get("k1").as_deref(), Some(&b"one"[..]));
    assert_eq!(
        b.connect().get("k1"),
        None,
        "a healthy first child: b not written"
    );

    a.kill();
    for i in 0..20 {
        let key = format!("after{i}");
        c.set(&key, b"two");
        assert_eq!(
            b.connect().get(&key).as_deref(),
            Some(&b"two"[..]),
            "set {key} with a dead: answered by b"
        );
        assert_eq!(c.get(&key).as_deref(), Some(&b"two"[..]));
    }
    assert_eq!(
        c.get("only-b").as_deref(),
        Some(&b"bee"[..]),
        "with a dead, gets are answered by b"
    );
    // Pipelined: every get fails on a first and goes on to b, those behind the head of the
    // queue too; the replies come back whole and in the client's order.
    let pipelined: String = (0..20).map(|i| format!("get after{i}\r\n")).collect();
    c.send(pipelined.as_bytes());
    for i in 0..20 {
        let reply = c.read_get_reply();
        assert_eq!(
            String::from_utf8_lossy(&reply),
            format!("VALUE after{i} 0 3\r\ntwo\r\nEND\r\n"),
            "pipelined get {i} with a dead"
        );
    }
}

/// `mg KEY t v f` on `server` directly: (remaining ttl, flags, value), or None on a miss.
fn meta_get(server: &Memcached, key: &str) -> Option<(i64, u32, Vec<u8>)> {
    let mut c = server.connect();
    c.send(format!("mg {key} t f v\r\n").as_bytes());
    let head = String::from_utf8(c.read_line()).expect("ascii");
    if head == "EN\r\n" {
        return None;
    }
    let mut tokens = head.trim_end().split(' ');
    assert_eq!(tokens.next(), Some("VA"), "mg reply {head:?}");
    let len: usize = tokens.next().and_then(|t| t.parse().ok()).expect("VA size");
    let (mut ttl, mut flags) = (None, None);
    for t in tokens {
        if let Some(v) = t.strip_prefix('t') {
            ttl = v.parse().ok();
        } else if let Some(v) = t.strip_prefix('f') {
            flags = v.parse().ok();
        }
    }
    let mut data = c.read_for(len + 2);
    data.truncate(len);
    Some((ttl.expect("t flag"), flags.expect("f flag"), data))
}

/// memroute with a warm-up root over pools `cold` and `warm` (fills live 1h).
fn warm_up_route(cold: &Memcached, warm: &Memcached) -> Memroute {
    Memroute::start_routes(
        "root",
        &[
            pool("cold", cold),
            pool("warm", warm),
            "[routes.root]\ntype = \"warm-up\"\ncold = \"cold\"\nwarm = \"warm\"\nttl = \"1h\"\n\n"
                .to_string(),
        ],
    )
}

#[test]
fn warm_up_fills_the_cold_pool_from_the_warm_one() {
    let cold = Memcached::start();
    let warm = Memcached::start();
    let proxy = warm_up_route(&cold, &warm);
    let mut c = proxy.connect();
    assert_eq!(
        warm.connect()
            .roundtrip_line(b"set wk 7 0 9\r\nfrom-warm\r\n"),
        b"STORED\r\n"
    );
    c.send(b"get wk\r\n");
    assert_eq!(
        show(&c.read_get_reply()),
        show(b"VALUE wk 7 9\r\nfrom-warm\r\nEND\r\n"),
        "a cold miss is answered with warm's value"
    );
    let started = Instant::now();
    assert!(
        poll_until(ASYNC_DEADLINE, || meta_get(&cold, "wk").is_some()),
        "the cold pool was not filled"
    );
    println!(
        "warm-up: cold filled {:.1} ms after the answer",
        started.elapsed().as_secs_f64() * 1000.0
    );
    let (ttl, flags, value) = meta_get(&cold, "wk").expect("filled");
    assert_eq!(value, b"from-warm");
    assert_eq!(flags, 7, "the fill keeps the item's flags");
    assert!(
        (3500..=3600).contains(&ttl),
        "filled with ttl 1h, remaining {ttl}"
    );

    // A key in both: cold answers.
    cold.connect().set("both", b"c");
    warm.connect().set("both", b"w");
    assert_eq!(c.get("both").as_deref(), Some(&b"c"[..]));
    // A miss in both is a miss.
    assert_eq!(c.get("nowhere"), None);
    // Other commands go to cold.
    c.set("new", b"n");
    assert_eq!(cold.connect().get("new").as_deref(), Some(&b"n"[..]));
    assert_eq!(warm.connect().get("new"), None);
}

/// Single-key reads through a warm-up route, pipelined in one write: cold's hits, warm's
/// answers for cold's misses (a meta get's too) and misses in both come back in the
/// client's order, and warm is asked only for what cold missed.
#[test]
fn warm_up_single_key_reads_pipelined_come_back_in_order() {
    let cold = Memcached::start();
    let warm = Memcached::start();
    let proxy = warm_up_route(&cold, &warm);
    for (server, key) in [
        (&warm, "a"),
        (&warm, "c"),
        (&warm, "m"),
        (&cold, "b"),
        (&cold, "c"),
    ] {
        let tag = if std::ptr::eq(server, &warm) {
            "warm"
        } else {
            "cold"
        };
        server.connect().set(key, format!("{tag}-{key}").as_bytes());
    }
    let warm_gets = warm.stat("cmd_get");
    let mut c = proxy.connect();
    let reply = c.roundtrip_lines(
        b"get a\r\nget b\r\nget c\r\nmg m v\r\nget none\r\nmg none v\r\n",
        3 + 3 + 3 + 2 + 1 + 1,
    );
    assert_eq!(
        show(&reply),
        show(
            b"VALUE a 0 6\r\nwarm-a\r\nEND\r\nVALUE b 0 6\r\ncold-b\r\nEND\r\n\
              VALUE c 0 6\r\ncold-c\r\nEND\r\nVA 6\r\nwarm-m\r\nEND\r\nEN\r\n"
        ),
        "answers in the client's order"
    );
    // a, m and none twice: the keys cold missed.
    assert_eq!(
        warm.stat("cmd_get") - warm_gets,
        4,
        "warm asked only for cold's misses"
    );
}

#[test]
fn random_route_spreads_requests_over_its_children() {
    let a = Memcached::start();
    let b = Memcached::start();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("a", &a),
            pool("b", &b),
            "[routes.root]\ntype = \"random\"\nchildren = [\"a\", \"b\"]\n\n".to_string(),
        ],
    );
    let keys = numbered_keys("rnd", 1000);
    set_many_logged(&proxy, &mut proxy.connect(), &keys);
    let (in_a, in_b) = (a.stat("curr_items"), b.stat("curr_items"));
    println!("random: 1000 sets went {in_a} to a and {in_b} to b");
    assert_eq!(in_a + in_b, 1000);
    for n in [in_a, in_b] {
        assert!(
            (350..=650).contains(&n),
            "a child got {n} of 1000 (a {in_a}, b {in_b})"
        );
    }
}

#[test]
fn null_and_error_routes_answer_without_a_backend_beside_prefix_routes() {
    let main = Memcached::start();
    let p1 = Memcached::start();
    let p2 = Memcached::start();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("main", &main),
            pool("p1", &p1),
            pool("p2", &p2),
            "[routes.root]\ntype = \"prefix\"\n\
             prefixes = { \"null:\" = \"nothing\", \"err:\" = \"broken\", \"a:\" = \"p1\", \"a:b:\" = \"p2\" }\n\
             default = \"main\"\n\n"
                .to_string(),
            "[routes.nothing]\ntype = \"null\"\n\n".to_string(),
            "[routes.broken]\ntype = \"error\"\nmessage = \"maintenance window\"\n\n".to_string(),
        ],
    );
    let mut c = proxy.connect();
    assert_eq!(c.get("null:k"), None);
    assert_eq!(line(&mut c, "set null:k 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
    assert_eq!(line(&mut c, "delete null:k\r\n"), "NOT_FOUND\r\n");
    assert_eq!(
        line(&mut c, "get err:k\r\n"),
        "SERVER_ERROR maintenance window\r\n"
    );
    assert_eq!(
        line(&mut c, "set err:k 0 0 1\r\nx\r\n"),
        "SERVER_ERROR maintenance window\r\n"
    );

    // The prefix route beside them: the longest prefix wins, the rest goes to the default.
    c.set("a:x", b"1");
    c.set("a:b:x", b"2");
    c.set("plain", b"3");
    assert_eq!(p1.connect().get("a:x").as_deref(), Some(&b"1"[..]));
    assert_eq!(p2.connect().get("a:b:x").as_deref(), Some(&b"2"[..]));
    assert_eq!(
        p1.connect().get("a:b:x"),
        None,
        "a:b:x went to the shorter prefix"
    );
    assert_eq!(main.connect().get("plain").as_deref(), Some(&b"3"[..]));
    for server in [&main, &p1, &p2] {
        assert_eq!(
            server.connect().get("null:k"),
            None,
            "the null route reached a server"
        );
        assert_eq!(server.connect().get("err:k"), None);
    }
}
