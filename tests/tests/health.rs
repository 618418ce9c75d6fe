//! Backend health against real memcached: a server failing `failure_limit` consecutive
//! requests (or refusing one connect) is marked down and its requests fail fast; `version`
//! probes bring it back; `eject = true` moves a down server's keys to the others, never more
//! than `max_ejected_fraction` of the pool.
//!
//! ```text
//!   up ──failure_limit failures / refused connect──> down ──probe answers──> up
//!         (log: "server marked down")                   (log: "server back up")
//! ```
//!
//! Every wait is a poll with a deadline (memroute's log, its stats, a server's contents);
//! latencies and recovery times are printed for the report, never asserted. Stopped servers
//! are resumed by a guard on every path.
use std::time::{Duration, Instant};

use memroute_tests::*;

/// Probing settings that keep recovery quick: first probe after 100 ms, never more than 500 ms
/// apart, so a server that comes back is seen within a second or so.
const FAST_PROBES: &str = "probe_interval = \"100ms\"\nprobe_interval_max = \"500ms\"\n";
/// How long memroute may take to mark a server down or up before the test fails.
const HEALTH_DEADLINE: Duration = Duration::from_secs(10);

struct Setup {
    servers: Vec<Memcached>,
    proxy: Memroute,
    keys: Vec<String>,
    victim: usize,
    victim_keys: Vec<String>,
    other_keys: Vec<String>,
}

fn value_of(key: &str) -> String {
    format!("v-{key}")
}

/// `n` servers in pool `main` (ketama over md5, so short sequential keys reach every server),
/// 60 keys set through memroute, and the server holding the first key as the victim.
fn setup(n: usize, pool_lines: &str) -> Setup {
    let servers: Vec<Memcached> = (0..n).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let mut toml = proxy_section(&format!("127.0.0.1:{}", free_port()), "main");
    toml.push_str(&pool_section("main", &addrs, pool_lines));
    let proxy = Memroute::start(&toml);
    let keys: Vec<String> = (0..60).map(|i| format!("h{i}")).collect();
    proxy.connect().set_many(&keys, value_of);
    let victim = holder(&servers, &keys[0]);
    let (victim_keys, other_keys): (Vec<String>, Vec<String>) = keys
        .iter()
        .cloned()
        .partition(|k| holder(&servers, k) == victim);
    assert!(!other_keys.is_empty(), "all keys landed on one server");
    Setup {
        servers,
        proxy,
        keys,
        victim,
        victim_keys,
        other_keys,
    }
}

/// `SERVER_ERROR backend ADDR is marked down: REASON`.
fn is_marked_down(reply: &[u8], addr: &str) -> bool {
    String::from_utf8_lossy(reply)
        .starts_with(&format!("SERVER_ERROR backend {addr} is marked down: "))
}

/// The address named by a marked-down reply, if it is one.
fn marked_down_addr(reply: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(reply);
    let rest = text.strip_prefix("SERVER_ERROR backend ")?;
    let (addr, tail) = rest.split_once(' ')?;
    tail.starts_with("is marked down: ")
        .then(|| addr.to_string())
}

/// A timeout reply for `addr` (`... timed out`, possibly `unavailable: timed out`), which is
/// not the marked-down one.
fn is_timeout_error(reply: &[u8], addr: &str) -> bool {
    let text = String::from_utf8_lossy(reply);
    text.starts_with(&format!("SERVER_ERROR backend {addr} "))
        && text.ends_with("timed out\r\n")
        && !is_marked_down(reply, addr)
}

/// memroute's health stats for one server of pool `main`: (down, marked_down, marked_up).
fn health(proxy: &Memroute, addr: &str) -> (u64, u64, u64) {
    let stats = proxy.stats();
    let get = |what: &str| {
        let name = format!("server:main:{addr}:{what}");
        stat_u64(&stats, &name).unwrap_or_else(|| panic!("no {name} in stats: {stats:?}"))
    };
    (get("down"), get("marked_down"), get("marked_up"))
}

/// The first stderr line containing `needle`.
fn log_line(proxy: &Memroute, needle: &str) -> String {
    proxy
        .log_text()
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_default()
        .to_string()
}

/// Polls (bounded) until a get of `key` through `c` answers `value`; other replies while
/// waiting must be SERVER_ERROR. Returns how long it took.
fn wait_key_served(c: &mut Conn, key: &str, value: &[u8], proxy: &Memroute) -> Duration {
    let started = Instant::now();
    loop {
        c.send(format!("get {key}\r\n").as_bytes());
        let reply = c.read_get_reply();
        if parse_values(&reply).is_some_and(|v| v.first().map(|x| x.2.as_slice()) == Some(value)) {
            return started.elapsed();
        }
        assert!(
            reply.starts_with(b"SERVER_ERROR ") || reply == b"END\r\n",
            "get {key} while the server recovers: {}",
            show(&reply)
        );
        assert!(
            started.elapsed() < HEALTH_DEADLINE,
            "{key} not served within {HEALTH_DEADLINE:?}\n{}",
            proxy.log_text()
        );
        std::thread::sleep(POLL);
    }
}

#[test]
fn stalled_server_is_marked_down_fails_fast_and_comes_back_after_sigcont() {
    let s = setup(
        2,
        &format!("timeout = \"200ms\"\nfailure_limit = 2\n{FAST_PROBES}"),
    );
    let addr = s.servers[s.victim].addr();
    let other_addr = s.servers[1 - s.victim].addr();
    let mut c = s.proxy.connect();

    let frozen = s.servers[s.victim].stop();
    // Gets only: a set queued in the stopped server's socket would run after SIGCONT.
    // Requests until the marked-down reply (bounded). Between the timeouts memroute re-opens
    // its connection and, while it does, answers `unavailable: timed out` at once; those
    // never reached the server, so only the requests that waited out the timeout count
    // toward failure_limit.
    let mut timeouts = 0;
    let mut unavailable = 0;
    let mut first_fast = None;
    let mut replies = Vec::new();
    let deadline = Instant::now() + HEALTH_DEADLINE;
    for key in s.victim_keys.iter().cycle() {
        let started = Instant::now();
        let reply = c.roundtrip_line(format!("get {key}\r\n").as_bytes());
        replies.push(format!(
            "{:.0} ms {}",
            started.elapsed().as_secs_f64() * 1000.0,
            String::from_utf8_lossy(&reply).trim_end()
        ));
        if is_marked_down(&reply, &addr) {
            first_fast = Some(reply);
            break;
        }
        if reply == format!("SERVER_ERROR backend {addr} timed out\r\n").as_bytes() {
            timeouts += 1;
        } else {
            assert!(
                is_timeout_error(&reply, &addr),
                "get {key} on a SIGSTOPped server: {}",
                show(&reply)
            );
            unavailable += 1;
        }
        assert!(
            Instant::now() < deadline,
            "a stopped server not marked down within {HEALTH_DEADLINE:?}; replies:\n{}\nlog:\n{}",
            replies.join("\n"),
            s.proxy.log_text()
        );
        // Pace the polling of a condition (the marked-down reply), bounded above.
        std::thread::sleep(POLL);
    }
    println!(
        "health: stopped server: {timeouts} timed-out requests and {unavailable} immediate \
         `unavailable` replies (10 ms apart) before the first marked-down reply"
    );
    // failure_limit = 2: one request waits out the timeout and breaks the connection; the
    // reconnect's `version` greeting (memroute speaks first on every connection it opens)
    // is not answered either, and that second failure marks the server down. Requests sent
    // meanwhile wait for no timeout of their own.
    assert_eq!(
        timeouts,
        1,
        "requests that waited out the timeout before the server was marked down:\n{}",
        replies.join("\n")
    );
    assert!(
        s.proxy.wait_log("server marked down", HEALTH_DEADLINE),
        "no `server marked down` in the log\n{}",
        s.proxy.log_text()
    );
    println!("health: log: {}", log_line(&s.proxy, "server marked down"));

    // Fail fast, while the other server's keys keep working on the same connection.
    let mut latencies = Vec::new();
    for (dead, live) in s
        .victim_keys
        .iter()
        .cycle()
        .take(100)
        .zip(s.other_keys.iter().cycle())
    {
        let started = Instant::now();
        let reply = c.roundtrip_line(format!("get {dead}\r\n").as_bytes());
        latencies.push(started.elapsed());
        assert!(
            is_marked_down(&reply, &addr),
            "get {dead} of a marked-down server: {}",
            show(&reply)
        );
        assert_eq!(
            c.get(live).as_deref(),
            Some(value_of(live).as_bytes()),
            "{live} on the healthy server"
        );
    }
    println!(
        "health: fail-fast {} while stopped; pool timeout is 200 ms; reply {:?}",
        latency_summary(&latencies),
        String::from_utf8_lossy(first_fast.as_deref().unwrap_or_default()).trim_end()
    );
    assert_eq!(
        health(&s.proxy, &addr),
        (1, 1, 0),
        "down, marked_down, marked_up of {addr}"
    );
    assert_eq!(
        health(&s.proxy, &other_addr).0,
        0,
        "the healthy server is down"
    );
    let stats = s.proxy.stats();
    assert_eq!(stat_u64(&stats, "pool:main:servers"), Some(2), "{stats:?}");

    let resumed = Instant::now();
    frozen.resume();
    assert!(
        s.proxy.wait_log("server back up", HEALTH_DEADLINE),
        "no `server back up` within {HEALTH_DEADLINE:?} of SIGCONT\n{}",
        s.proxy.log_text()
    );
    let back_up = resumed.elapsed();
    let served = wait_key_served(
        &mut c,
        &s.victim_keys[0],
        value_of(&s.victim_keys[0]).as_bytes(),
        &s.proxy,
    );
    println!(
        "health: SIGCONT -> `server back up` in {:.0} ms (probe_interval 100ms, max 500ms); first key served {:.0} ms after that",
        back_up.as_secs_f64() * 1000.0,
        served.as_secs_f64() * 1000.0
    );
    for k in &s.keys {
        assert_eq!(
            c.get(k).as_deref(),
            Some(value_of(k).as_bytes()),
            "{k} after SIGCONT"
        );
    }
    assert_eq!(
        health(&s.proxy, &addr),
        (0, 1, 1),
        "down, marked_down, marked_up of {addr}"
    );
}

#[test]
fn refused_connect_marks_a_killed_server_down_after_one_request() {
    // failure_limit stays at its default (3): one refused connect is enough anyway.
    let mut s = setup(2, &format!("timeout = \"200ms\"\n{FAST_PROBES}"));
    let addr = s.servers[s.victim].addr();
    let mut c = s.proxy.connect();
    s.servers[s.victim].kill();

    let reply = c.roundtrip_line(format!("get {}\r\n", s.victim_keys[0]).as_bytes());
    assert!(
        reply.starts_with(b"SERVER_ERROR "),
        "first get of a killed server's key: {}",
        show(&reply)
    );
    assert!(
        s.proxy.wait_log("server marked down", HEALTH_DEADLINE),
        "a killed server was not marked down after one request\n{}",
        s.proxy.log_text()
    );
    println!("health: log: {}", log_line(&s.proxy, "server marked down"));
    let started = Instant::now();
    let reply = c.roundtrip_line(format!("set {} 0 0 1\r\nx\r\n", s.victim_keys[0]).as_bytes());
    let took = started.elapsed();
    assert!(
        is_marked_down(&reply, &addr),
        "set of a marked-down server's key: {}",
        show(&reply)
    );
    println!(
        "health: killed server: marked-down reply in {:.2} ms: {:?}",
        took.as_secs_f64() * 1000.0,
        String::from_utf8_lossy(&reply).trim_end()
    );
    assert_eq!(health(&s.proxy, &addr), (1, 1, 0));
    for k in &s.other_keys {
        assert_eq!(c.get(k).as_deref(), Some(value_of(k).as_bytes()));
    }

    // Back on the same port (empty): probes bring it back and its keys work.
    let restarted = Instant::now();
    s.servers[s.victim].restart();
    assert!(
        s.proxy.wait_log("server back up", HEALTH_DEADLINE),
        "no `server back up` after restart\n{}",
        s.proxy.log_text()
    );
    println!(
        "health: restart -> `server back up` in {:.0} ms",
        restarted.elapsed().as_secs_f64() * 1000.0
    );
    let key = &s.victim_keys[0];
    let deadline = Instant::now() + HEALTH_DEADLINE;
    while c.roundtrip_line(format!("set {key} 0 0 4\r\nback\r\n").as_bytes()) != b"STORED\r\n" {
        assert!(Instant::now() < deadline, "{key} not stored after back up");
        std::thread::sleep(POLL);
    }
    assert_eq!(
        s.servers[s.victim].connect().get(key).as_deref(),
        Some(&b"back"[..])
    );
    assert_eq!(health(&s.proxy, &addr), (0, 1, 1));
}

#[test]
fn ejected_server_keys_move_to_the_others_and_come_back() {
    let mut s = setup(
        3,
        &format!("timeout = \"200ms\"\nfailure_limit = 2\neject = true\n{FAST_PROBES}"),
    );
    let addr = s.servers[s.victim].addr();
    let mut c = s.proxy.connect();
    s.servers[s.victim].kill();

    let reply = c.roundtrip_line(format!("get {}\r\n", s.victim_keys[0]).as_bytes());
    assert!(
        reply.ends_with(b"\r\n"),
        "first get of a killed server's key: {}",
        show(&reply)
    );
    assert!(
        s.proxy.wait_log("server marked down", HEALTH_DEADLINE),
        "a killed server was not marked down\n{}",
        s.proxy.log_text()
    );
    // The ring without it may reach the worker just after the log line: poll one key.
    let key = &s.victim_keys[0];
    assert!(
        poll_until(HEALTH_DEADLINE, || {
            c.roundtrip_line(format!("set {key} 0 0 1\r\nx\r\n").as_bytes()) == b"STORED\r\n"
        }),
        "the ejected server's keys were not remapped\n{}",
        s.proxy.log_text()
    );
    // Every key is stored and read back: the ejected server's keys live on the others now.
    let ejected_value = |k: &str| format!("e-{k}");
    c.set_many(&s.keys, ejected_value);
    for k in &s.keys {
        assert_eq!(
            c.get(k).as_deref(),
            Some(ejected_value(k).as_bytes()),
            "{k} after ejection"
        );
    }
    for k in &s.victim_keys {
        let holders = (0..s.servers.len())
            .filter(|&i| i != s.victim && s.servers[i].connect().get(k).is_some())
            .count();
        assert_eq!(
            holders, 1,
            "{k} of the ejected server is on {holders} other servers"
        );
    }
    assert_eq!(health(&s.proxy, &addr), (1, 1, 0));

    let restarted = Instant::now();
    s.servers[s.victim].restart();
    assert!(
        s.proxy.wait_log("server back up", HEALTH_DEADLINE),
        "no `server back up` after restart\n{}",
        s.proxy.log_text()
    );
    let back_up = restarted.elapsed();
    // Its keys route to it again: set through memroute, found on the (restarted, empty)
    // server directly.
    let returned = |k: &str| format!("r-{k}");
    assert!(
        poll_until(HEALTH_DEADLINE, || {
            let reply = c.roundtrip_line(
                format!(
                    "set {key} 0 0 {}\r\n{}\r\n",
                    returned(key).len(),
                    returned(key)
                )
                .as_bytes(),
            );
            reply == b"STORED\r\n" && s.servers[s.victim].connect().get(key).is_some()
        }),
        "{key} does not route to the rejoined server\n{}",
        s.proxy.log_text()
    );
    let rejoined = restarted.elapsed();
    println!(
        "health: eject: restart -> `server back up` {:.0} ms, keys routed to it again {:.0} ms",
        back_up.as_secs_f64() * 1000.0,
        rejoined.as_secs_f64() * 1000.0
    );
    c.set_many(&s.keys, returned);
    let held = s.servers[s.victim].held(&s.keys);
    let mut on_victim: Vec<&String> = held.keys().collect();
    on_victim.sort();
    let mut expected: Vec<&String> = s.victim_keys.iter().collect();
    expected.sort();
    assert_eq!(
        on_victim, expected,
        "the rejoined server holds exactly its own keys"
    );
    assert_eq!(health(&s.proxy, &addr), (0, 1, 1));
}

#[test]
fn never_more_than_max_ejected_fraction_is_ejected() {
    let mut s = setup(
        2,
        &format!(
            "timeout = \"200ms\"\nfailure_limit = 1\neject = true\nmax_ejected_fraction = 0.5\n{FAST_PROBES}"
        ),
    );
    let mut c = s.proxy.connect();
    for server in &mut s.servers {
        server.kill();
    }
    // Requests (each answered within the read timeout, or the test fails) until both are down.
    let deadline = Instant::now() + HEALTH_DEADLINE;
    for k in s.keys.iter().cycle() {
        if s.proxy.log_count("server marked down") >= 2 {
            break;
        }
        let reply = c.roundtrip_line(format!("get {k}\r\n").as_bytes());
        assert!(
            reply.starts_with(b"SERVER_ERROR "),
            "get {k} with both servers dead: {}",
            show(&reply)
        );
        assert!(
            Instant::now() < deadline,
            "both servers not marked down within {HEALTH_DEADLINE:?}\n{}",
            s.proxy.log_text()
        );
    }
    for server in &s.servers {
        assert_eq!(
            health(&s.proxy, &server.addr()).0,
            1,
            "{} down",
            server.addr()
        );
    }
    // One server is ejected (0.5 of 2); the other keeps its slots and every key, its own and
    // the ejected one's, fails fast naming it.
    let mut named = std::collections::BTreeSet::new();
    let started = Instant::now();
    for k in &s.keys {
        for request in [format!("get {k}\r\n"), format!("set {k} 0 0 1\r\nx\r\n")] {
            let reply = c.roundtrip_line(request.as_bytes());
            let addr = marked_down_addr(&reply).unwrap_or_else(|| {
                panic!(
                    "{} with both servers down: {}",
                    show(request.as_bytes()),
                    show(&reply)
                )
            });
            named.insert(addr);
        }
    }
    println!(
        "health: both of 2 servers dead, max_ejected_fraction 0.5: 120 requests answered in {:.1} ms, naming {named:?}",
        started.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(
        named.len(),
        1,
        "exactly one of two dead servers is ejected, so every key maps to the other: {named:?}"
    );
}
