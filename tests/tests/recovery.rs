//! Recovery with the default probe settings, against real memcached: a server that comes
//! back after an outage serves through memroute again within a second, whatever the
//! outage's length, and a down server is probed at a bounded rate by one prober for the
//! whole process (not once per worker connection).
//!
//! ```text
//!   kill / SIGSTOP ──> marked down (requests fail fast) ──outage──> restart / SIGCONT
//!        prober: every 200 ms, x1.5 per failure, capped at 500 ms (±20% jitter, never past the cap)
//!   ──> next probe answers ──> marked up, every worker's connections reconnect at once
//! ```
//!
//! The recovery bound is the probe interval's cap plus one probe round trip, so it does not
//! grow with the outage: once three probes have failed (200, 300, 450 ms: ~1 s down) the
//! next wait is at the cap, and every longer outage behaves alike. So the outage lasts until
//! memroute has logged three failed probes (its prober logs each at debug, which these
//! tests turn on), not a fixed time; `MEMROUTE_TEST_OUTAGE_SECS=60` makes it last at least
//! that long, to run a long case by hand.
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memroute_tests::*;

/// Served again within a second of the server's return.
const RECOVERY_BOUND: Duration = Duration::from_secs(1);
/// How long any other wait (marked down, a log line) may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);
/// The proxy's log filter: info (the harness's) and the prober's failed probes.
const LOG_FILTER: &str = "info,memroute_backend::health=debug";
/// What memroute's prober logs for each probe that fails.
const PROBE_FAILED: &str = "probe failed";
/// Failed probes after which the prober's interval is at its cap: 200 ms x1.5 per failure
/// is 300, 450, then 675, capped at 500 ms (the defaults).
const PROBES_TO_CAP: usize = 3;

/// The shortest outage: none unless `MEMROUTE_TEST_OUTAGE_SECS` asks for a long one (the
/// outage always lasts until the prober is at its cap).
fn least_outage() -> Duration {
    let secs = std::env::var("MEMROUTE_TEST_OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Duration::from_secs(secs)
}

/// Two servers in pool `main` with default health and probe settings; `workers` workers
/// with `connections` connections each to every server. Returns the servers, the proxy,
/// and a key held by server 0 and one held by server 1.
fn setup(workers: usize, connections: usize) -> (Vec<Memcached>, Memroute, String, String) {
    let servers: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut toml =
        proxy_section(&listen, "main").replace("workers = 1\n", &format!("workers = {workers}\n"));
    toml.push_str(&pool_section(
        "main",
        &addrs,
        &format!("connections = {connections}\n"),
    ));
    let proxy = Memroute::start_logging(&toml, &[], LOG_FILTER);
    let keys: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
    proxy.connect().set_many(&keys, |k| format!("v-{k}"));
    let key_on = |index: usize| {
        keys.iter()
            .find(|k| holder(&servers, k) == index)
            .cloned()
            .expect("a key on each server")
    };
    let (victim_key, other_key) = (key_on(0), key_on(1));
    (servers, proxy, victim_key, other_key)
}

/// Sends `set KEY` through `c` until it is STORED; every other reply on the way must be a
/// SERVER_ERROR (the server is still down or just reconnecting). Returns how long it took.
fn wait_stored(c: &mut Conn, key: &str, proxy: &Memroute) -> Duration {
    let started = Instant::now();
    loop {
        let reply = c.roundtrip_line(format!("set {key} 0 0 4\r\nback\r\n").as_bytes());
        if reply == b"STORED\r\n" {
            return started.elapsed();
        }
        assert!(
            reply.starts_with(b"SERVER_ERROR "),
            "set {key} while the server recovers: {}",
            show(&reply)
        );
        assert!(
            started.elapsed() < DEADLINE,
            "{key} not stored within {DEADLINE:?}\n{}",
            proxy.log_text()
        );
        std::thread::sleep(POLL);
    }
}

/// Kills `server` and asks for `key` (held by it) until memroute marks it down: one refused
/// connect is enough.
fn kill_and_wait_down(server: &mut Memcached, proxy: &Memroute, c: &mut Conn, key: &str) {
    server.kill();
    let reply = c.roundtrip_line(format!("get {key}\r\n").as_bytes());
    assert!(reply.starts_with(b"SERVER_ERROR "), "{}", show(&reply));
    assert!(
        proxy.wait_log("server marked down", DEADLINE),
        "{}",
        proxy.log_text()
    );
}

/// While the victim is away: its keys fail fast with the marked-down error and the other
/// server's keys keep working. Lasts until the prober's interval is at its cap (and at
/// least `least_outage`), checking as it goes. Returns how long it lasted.
fn ride_out_outage(
    c: &mut Conn,
    proxy: &Memroute,
    victim: &str,
    victim_key: &str,
    other_key: &str,
) -> Duration {
    let started = Instant::now();
    let mut checks = 0;
    while checks == 0
        || proxy.log_count(PROBE_FAILED) < PROBES_TO_CAP
        || started.elapsed() < least_outage()
    {
        let reply = c.roundtrip_line(format!("get {victim_key}\r\n").as_bytes());
        assert!(
            String::from_utf8_lossy(&reply)
                .starts_with(&format!("SERVER_ERROR backend {victim} is marked down: ")),
            "get of a down server's key: {}",
            show(&reply)
        );
        assert_eq!(c.get(other_key).as_deref(), Some(&b"other"[..]));
        checks += 1;
        assert!(
            started.elapsed() < DEADLINE + least_outage(),
            "{PROBES_TO_CAP} failed probes not logged within {DEADLINE:?}\n{}",
            proxy.log_text()
        );
        std::thread::sleep(POLL);
    }
    started.elapsed()
}

#[test]
fn killed_server_serves_again_within_a_second_of_its_restart() {
    let (mut servers, proxy, victim_key, other_key) = setup(2, 1);
    let victim = servers[0].addr();
    let mut c = proxy.connect();
    c.set(&other_key, b"other");
    kill_and_wait_down(&mut servers[0], &proxy, &mut c, &victim_key);
    let outage = ride_out_outage(&mut c, &proxy, &victim, &victim_key, &other_key);

    // restart() returns once memcached accepts connections: the clock starts there.
    servers[0].restart();
    let took = wait_stored(&mut c, &victim_key, &proxy);
    println!(
        "recovery: killed for {outage:?}, served {:.0} ms after its restart",
        took.as_secs_f64() * 1000.0
    );
    assert!(
        took < RECOVERY_BOUND,
        "served again {took:?} after the restart\n{}",
        proxy.log_text()
    );
    assert_eq!(
        servers[0].connect().get(&victim_key).as_deref(),
        Some(&b"back"[..])
    );
}

#[test]
fn stalled_server_serves_again_within_a_second_of_sigcont() {
    let (servers, proxy, victim_key, other_key) = setup(2, 1);
    let victim = servers[0].addr();
    let mut c = proxy.connect();
    c.set(&other_key, b"other");
    c.set(&victim_key, b"before");
    let stopped = servers[0].stop();
    // Default failure_limit (3) timeouts of the default 250 ms mark it down.
    let deadline = Instant::now() + DEADLINE;
    while !proxy.log_text().contains("server marked down") {
        let reply = c.roundtrip_line(format!("get {victim_key}\r\n").as_bytes());
        assert!(reply.starts_with(b"SERVER_ERROR "), "{}", show(&reply));
        assert!(Instant::now() < deadline, "{}", proxy.log_text());
    }
    let outage = ride_out_outage(&mut c, &proxy, &victim, &victim_key, &other_key);

    let resumed = Instant::now();
    stopped.resume();
    let took = wait_stored(&mut c, &victim_key, &proxy);
    let since_resume = resumed.elapsed();
    println!(
        "recovery: stalled for {outage:?}, served {:.0} ms after SIGCONT",
        since_resume.as_secs_f64() * 1000.0
    );
    assert!(took <= since_resume);
    assert!(
        since_resume < RECOVERY_BOUND,
        "served again {since_resume:?} after SIGCONT\n{}",
        proxy.log_text()
    );
}

/// A server that stays down is probed by one prober for the whole process at its bounded
/// rate: with 4 workers x 2 connections the connects it sees per second stay at the
/// prober's (at most one per 160 ms: 200 ms -20% jitter), not one per connection.
#[test]
fn a_down_server_sees_one_bounded_prober_not_every_connection() {
    let (mut servers, proxy, victim_key, _) = setup(4, 2);
    let port = servers[0].port;
    let mut c = proxy.connect();
    kill_and_wait_down(&mut servers[0], &proxy, &mut c, &victim_key);
    // Something now listens on the dead server's port but is not memcached: it accepts and
    // closes at once, so every probe fails and the server stays down. Count the connects.
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the victim's port");
    let accepted = Arc::new(AtomicUsize::new(0));
    {
        let accepted = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                accepted.fetch_add(1, Ordering::Relaxed);
                drop(stream);
            }
        });
    }
    let window = Duration::from_secs(3);
    let started = Instant::now();
    // Requests keep arriving for the down server meanwhile: they must not cause connects.
    while started.elapsed() < window {
        let reply = c.roundtrip_line(format!("get {victim_key}\r\n").as_bytes());
        assert!(reply.starts_with(b"SERVER_ERROR "), "{}", show(&reply));
        std::thread::sleep(POLL);
    }
    let connects = accepted.load(Ordering::Relaxed);
    let most = (window.as_millis() / 160) as usize + 1;
    println!("recovery: {connects} connects to a down server in {window:?} (4 workers x 2 connections; bound {most})");
    assert!(
        connects >= 2,
        "the prober stopped probing: {connects} connects"
    );
    assert!(
        connects <= most,
        "{connects} connects in {window:?}: more than one prober's rate"
    );
}
