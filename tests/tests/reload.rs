//! SIGHUP reloads the config file without a restart: new requests follow the new pools and
//! routes, connections opened before the reload keep working, a pipelining client gets every
//! reply across reloads, and an invalid config is rejected (its key paths logged) while the
//! running one keeps serving. Every wait is on memroute's own log line, bounded.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memroute_tests::*;

/// memroute's log without terminal colour codes (field `k=v` pairs read as written).
fn plain_log(proxy: &Memroute) -> String {
    let mut out = String::new();
    let text = proxy.log_text();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A `STAT name value` of a server, asked directly.
fn stat(server: &Memcached, name: &str) -> u64 {
    let stats = server.connect().stats();
    stats
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in {}'s stats", server.addr()))
        .1
        .parse()
        .expect("a numeric stat")
}

/// `curr_connections` asked over one long-lived direct connection (`probe`): a fresh
/// connection per question would leave the previous one closing in the count.
fn curr_connections(probe: &mut Conn) -> u64 {
    stat_u64(&probe.stats(), "curr_connections").expect("curr_connections in memcached's stats")
}

/// Polls (bounded) until curr_connections, asked over `probe`, is at most `at_most`.
fn wait_curr_connections(probe: &mut Conn, at_most: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = curr_connections(probe);
        if now <= at_most || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sighup_moves_a_pool_to_new_servers_and_open_connections_keep_working() {
    let m1 = Memcached::start();
    let m2 = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    // No resize window: this is about a reload moving the pool at once (tests/resize.rs
    // covers the window).
    let no_window = "resize_window = \"0s\"\n";
    let proxy = Memroute::start(&simple_config(&listen, &[m1.addr()], no_window));
    let mut before = proxy.connect();
    before.set("old", b"one");
    // Every direct question to m1 goes over this one connection, so m1's curr_connections
    // changes only with memroute's connections.
    let mut m1_probe = m1.connect();
    assert_eq!(m1_probe.get("old").as_deref(), Some(&b"one"[..]));
    // curr_connections counts the probe too: memroute's one connection is in it.
    let m1_connections = curr_connections(&mut m1_probe);

    assert!(
        proxy.reload(&simple_config(&listen, &[m2.addr()], no_window)),
        "reload rejected:\n{}",
        proxy.log_text()
    );

    // The connection opened before the reload follows the new config.
    before.set("new", b"two");
    assert_eq!(m2.connect().get("new").as_deref(), Some(&b"two"[..]));
    assert_eq!(
        m1_probe.get("new"),
        None,
        "a set after the reload reached m1"
    );
    assert_eq!(
        before.get("old"),
        None,
        "old keys are on m1, no longer routed"
    );
    // A new connection too.
    let mut after = proxy.connect();
    assert_eq!(after.get("new").as_deref(), Some(&b"two"[..]));

    // m1 left the config: memroute's connection to it closes.
    let left = wait_curr_connections(&mut m1_probe, m1_connections - 1);
    assert_eq!(
        left,
        m1_connections - 1,
        "memroute's connection to a removed server is still open"
    );
    let log = plain_log(&proxy);
    assert!(
        log.contains("config reloaded") && log.contains("pools=1"),
        "{log}"
    );
    // Per-server stats follow the config: m2 is reported, m1 no longer.
    let names: Vec<String> = after.stats().into_iter().map(|(k, _)| k).collect();
    assert!(
        names.contains(&format!("server:main:{}:errors", m2.addr())),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.contains(&m1.addr())), "{names:?}");
}

#[test]
fn sighup_adds_a_prefix_route_and_keeps_connections_to_unchanged_servers() {
    let m1 = Memcached::start();
    let m2 = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let base = simple_config(&listen, &[m1.addr()], "");
    let proxy = Memroute::start(&base);
    let mut c = proxy.connect();
    c.set("s:before", b"x");
    assert_eq!(m1.connect().get("s:before").as_deref(), Some(&b"x"[..]));
    let m1_opened = stat(&m1, "total_connections");

    let routed = format!(
        "{}\n[pools.sessions]\nservers = [\"{}\"]\n\n\
         [routes.by_prefix]\ntype = \"prefix\"\nprefixes = {{ \"s:\" = \"sessions\" }}\ndefault = \"main\"\n",
        base.replace("route = \"main\"", "route = \"by_prefix\""),
        m2.addr()
    );
    assert!(
        proxy.reload(&routed),
        "reload rejected:\n{}",
        proxy.log_text()
    );
    let log = plain_log(&proxy);
    assert!(log.contains("pools=2"), "{log}");

    c.set("s:after", b"y");
    c.set("plain", b"z");
    assert_eq!(m2.connect().get("s:after").as_deref(), Some(&b"y"[..]));
    assert_eq!(m1.connect().get("s:after"), None);
    assert_eq!(m1.connect().get("plain").as_deref(), Some(&b"z"[..]));
    // Only this test's own connections are new on m1 (the two `get`s above and the `stats`
    // below; the `stats` that read m1_opened was already counted): memroute kept its own.
    let opened = stat(&m1, "total_connections") - m1_opened;
    assert_eq!(
        opened, 3,
        "memroute reopened its connection to a server whose settings did not change"
    );
}

#[test]
fn invalid_config_on_sighup_is_rejected_and_the_old_one_keeps_serving() {
    let m1 = Memcached::start();
    let m2 = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&simple_config(&listen, &[m1.addr()], ""));
    let mut c = proxy.connect();
    c.set("k", b"v");

    // Two mistakes: both are reported, each with its key path.
    let bad = simple_config(
        &listen,
        &[format!("{}:0", m2.addr())],
        "timeout = \"soon\"\n",
    );
    assert!(!proxy.reload(&bad), "an invalid config was accepted");
    let log = plain_log(&proxy);
    assert!(log.contains("pools.main.servers[0].weight"), "{log}");
    assert!(log.contains("pools.main.timeout"), "{log}");

    // A config that validates but cannot be routed is rejected too.
    let unroutable =
        simple_config(&listen, &[m2.addr()], "").replace("route = \"main\"", "route = \"nowhere\"");
    assert!(
        !proxy.reload(&unroutable),
        "an unroutable config was accepted"
    );

    assert_eq!(c.get("k").as_deref(), Some(&b"v"[..]));
    c.set("k2", b"w");
    assert_eq!(m1.connect().get("k2").as_deref(), Some(&b"w"[..]));
    assert_eq!(m2.connect().get("k2"), None);
    assert!(proxy.connect().get("k").is_some());

    // A valid config after the rejected ones still applies.
    assert!(proxy.reload(&simple_config(&listen, &[m2.addr()], "")));
    c.set("k3", b"x");
    assert_eq!(m2.connect().get("k3").as_deref(), Some(&b"x"[..]));
}

#[test]
fn restart_only_settings_are_kept_and_named_in_a_warning() {
    let m1 = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&simple_config(&listen, &[m1.addr()], ""));
    let mut c = proxy.connect();
    let other = format!("127.0.0.1:{}", free_port());
    let moved = simple_config(&other, &[m1.addr()], "").replace("workers = 1", "workers = 2");
    assert!(
        proxy.reload(&moved),
        "reload rejected:\n{}",
        proxy.log_text()
    );
    let log = plain_log(&proxy);
    assert!(log.contains("proxy.listen"), "{log}");
    assert!(log.contains("proxy.workers"), "{log}");
    c.set("still", b"here");
    assert_eq!(proxy.connect().get("still").as_deref(), Some(&b"here"[..]));
}

#[test]
fn pipelining_client_gets_every_reply_across_reloads() {
    let m1 = Memcached::start();
    let m2 = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let one = simple_config(&listen, &[m1.addr()], "");
    let two = simple_config(&listen, &[m1.addr(), m2.addr()], "");
    let proxy = Memroute::start(&one);
    let mut setup = proxy.connect();
    for i in 0..50 {
        setup.set(&format!("p{i}"), b"v");
    }

    const BATCH: usize = 100;
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        let mut c = proxy.connect();
        std::thread::spawn(move || {
            let (mut replies, mut errors, mut batches) = (0usize, Vec::new(), 0usize);
            // At least a few batches, and keep going until the reloads are done.
            while batches < 5 || !stop.load(Ordering::SeqCst) {
                let mut request = Vec::new();
                for i in 0..BATCH {
                    request
                        .extend_from_slice(format!("get p{}\r\n", (batches + i) % 50).as_bytes());
                }
                c.send(&request);
                for _ in 0..BATCH {
                    let reply = c.read_get_reply();
                    if parse_values(&reply).is_none() {
                        errors.push(show(&reply));
                    }
                    replies += 1;
                }
                batches += 1;
            }
            (replies, batches, errors)
        })
    };

    // Add and remove m2 under load: requests in flight to a removed server must still be answered.
    for round in 0..6 {
        let config = if round % 2 == 0 { &two } else { &one };
        assert!(
            proxy.reload(config),
            "reload rejected:\n{}",
            proxy.log_text()
        );
    }
    stop.store(true, Ordering::SeqCst);
    let (replies, batches, errors) = client.join().expect("the pipelining client panicked");
    assert_eq!(replies, batches * BATCH);
    assert!(
        errors.is_empty(),
        "{} error replies, first: {}",
        errors.len(),
        errors[0]
    );
    assert_eq!(proxy.log_count("config reloaded"), 6);
}
