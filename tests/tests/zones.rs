//! Zones against real memcached: a replicated route reading `nearest` reads the copy in
//! the proxy's own zone, and the other zone's when the local servers are gone.
//!
//! ```text
//!   test ──> memroute (zone b: MEMROUTE_ZONE=b) ──replicated, writes all-sync──> pool in_a (zone a) ──> a1, a2
//!                                                  reads nearest            └─> pool in_b (zone b) ──> b1, b2
//! ```
//!
//! Where reads land is measured by each memcached's own `cmd_get`; waits are polls of a
//! condition with a deadline.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memroute_tests::*;

/// How long a failover to the other zone may take before gets must stop failing.
const SETTLE: Duration = Duration::from_secs(1);

/// Two memcached per zone.
struct Zones {
    a: [Memcached; 2],
    b: [Memcached; 2],
}

impl Zones {
    fn start() -> Zones {
        Zones {
            a: [Memcached::start(), Memcached::start()],
            b: [Memcached::start(), Memcached::start()],
        }
    }

    fn gets(servers: &[Memcached]) -> u64 {
        servers.iter().map(|s| s.stat("cmd_get")).sum()
    }
}

/// One pool per zone under one replicated route reading `nearest`; `proxy_lines` go into
/// `[proxy]` (a `zone = ...`), `admin`: an admin listen address.
fn config(zones: &Zones, proxy_lines: &str, admin: Option<&str>) -> String {
    let listen = format!("127.0.0.1:{}", free_port());
    let addrs = |servers: &[Memcached]| servers.iter().map(Memcached::addr).collect::<Vec<_>>();
    let mut toml =
        proxy_section(&listen, "both").replacen("[proxy]\n", &format!("[proxy]\n{proxy_lines}"), 1);
    // A long timeout: a debug build on a busy machine may be slow; a stopped server here
    // is a refused connection, failed at once whatever the timeout.
    toml.push_str(&pool_section(
        "in_a",
        &addrs(&zones.a),
        "zone = \"a\"\ntimeout = \"10s\"",
    ));
    toml.push_str(&pool_section(
        "in_b",
        &addrs(&zones.b),
        "zone = \"b\"\ntimeout = \"10s\"",
    ));
    toml.push_str(
        "[routes.both]\ntype = \"replicated\"\nchildren = [\"in_a\", \"in_b\"]\n\
         writes = \"all-sync\"\nreads = \"nearest\"\n\n",
    );
    if let Some(admin) = admin {
        toml.push_str(&format!("[admin]\nlisten = \"{admin}\"\n"));
    }
    toml
}

/// memroute on `toml` with `MEMROUTE_ZONE` set to `zone`.
fn start_in_zone(toml: &str, zone: &str) -> Memroute {
    let toml = with_io_mode(toml);
    let dir = TempDir::new("memroute-zone");
    let conf = dir.write("memroute.toml", &toml);
    let mut command = Command::new(memroute_binary());
    command
        .arg("--config")
        .arg(&conf)
        .env("MEMROUTE_ZONE", zone);
    Memroute::start_command(command, &toml, conf, dir)
}

/// Gets every key of `keys` once through `c`, pipelined 100 at a time; the number of
/// replies that were not the key's value (`value_of`).
fn get_all(c: &mut Conn, keys: &[String]) -> usize {
    let mut wrong = 0;
    for chunk in keys.chunks(100) {
        let batch: String = chunk.iter().map(|k| format!("get {k}\r\n")).collect();
        c.send(batch.as_bytes());
        for key in chunk {
            let reply = c.read_get_reply();
            let want = format!(
                "VALUE {key} 0 {}\r\n{}\r\nEND\r\n",
                value_of(key).len(),
                value_of(key)
            );
            if reply != want.as_bytes() {
                wrong += 1;
            }
        }
    }
    wrong
}

fn value_of(key: &str) -> String {
    format!("v-{key}")
}

/// A stat of memroute's, 0 when absent.
fn stat(stats: &[(String, String)], name: &str) -> u64 {
    stat_u64(stats, name).unwrap_or(0)
}

#[test]
fn reads_land_in_the_proxys_zone_and_move_to_the_other_when_it_is_gone() {
    let mut zones = Zones::start();
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = start_in_zone(&config(&zones, "", Some(&admin)), "b");
    assert!(
        proxy.wait_log("zone=b (from MEMROUTE_ZONE)", Duration::from_secs(5)),
        "the ready line names the zone and its source:\n{}",
        proxy.log_text()
    );
    let mut c = proxy.connect();
    let keys = numbered_keys("zone-key-", 1000);
    c.set_many(&keys, value_of);

    let (a_before, b_before) = (Zones::gets(&zones.a), Zones::gets(&zones.b));
    const GETS: usize = 10_000;
    let mut wrong = 0;
    for round in 0..GETS / keys.len() {
        wrong += get_all(&mut c, &keys);
        assert_eq!(
            wrong,
            0,
            "round {round}: wrong replies\n{}",
            proxy.log_text()
        );
    }
    let (a_gets, b_gets) = (
        Zones::gets(&zones.a) - a_before,
        Zones::gets(&zones.b) - b_before,
    );
    println!("10,000 gets from zone b: {b_gets} on zone b's servers, {a_gets} on zone a's");
    // Every get, not only 99% of them: with zone b's servers up, none has a reason to
    // leave the zone (memcached's cmd_get counts only these gets).
    assert_eq!(
        (a_gets, b_gets),
        (0, GETS as u64),
        "gets seen by (zone a's, zone b's) servers"
    );

    // Counted as local reads, in stats and in /metrics.
    let stats = proxy.wait_stats("local reads counted", Duration::from_secs(5), |s| {
        stat(s, "route:both:reads_local") >= GETS as u64
    });
    assert_eq!(stat(&stats, "route:both:reads_local"), GETS as u64);
    assert_eq!(stat(&stats, "route:both:reads_cross_zone"), 0);
    let (code, metrics) = admin_http(&admin, "GET", "/metrics");
    assert_eq!(code, 200);
    let local =
        format!("memroute_route_zone_reads_total{{locality=\"local\",route=\"both\"}} {GETS}");
    assert!(
        metrics.contains(&local),
        "no `{local}` in /metrics:\n{metrics}"
    );

    // The admin's /route names the child a read uses first: zone b's pool.
    let (code, routed) = admin_http(&admin, "GET", "/route?key=zone-key-0");
    assert_eq!(code, 200, "{routed}");
    let first = routed.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("zone-key-0: both -> in_b => ") && first.contains("read here first"),
        "{routed}"
    );
    // ... and orders the children by what the running proxy measured (the replicated sets
    // reached zone a's servers too), not "unknown until measured" as offline.
    let mut routed = String::new();
    assert!(
        poll_until(Duration::from_secs(5), || {
            routed = admin_http(&admin, "GET", "/route?key=zone-key-0").1;
            routed.lines().all(|l| l.contains(", mean round trip "))
        }),
        "{routed}"
    );
    let second = routed.lines().nth(1).unwrap_or_default();
    assert!(
        second.starts_with("zone-key-0: both -> in_a => ")
            && second.contains("(zone a): read on failure 1, mean round trip "),
        "{routed}"
    );
    // mcrouter's route query names the server a get uses: zone b's.
    c.send(b"get __mcrouter__.route(get,zone-key-0)\r\n");
    let reply = c.read_get_reply();
    let routed = parse_values(&reply)
        .and_then(|values| values.into_iter().next())
        .map(|(_, _, value)| String::from_utf8_lossy(&value).to_string())
        .unwrap_or_else(|| panic!("route query: {}", show(&reply)));
    assert!(
        zones.b.iter().any(|server| server.addr() == routed),
        "__mcrouter__.route(get,...) names {routed}, not a zone b server"
    );

    // Zone b's servers go away: the reads move to zone a.
    let a_before = Zones::gets(&zones.a);
    for server in &mut zones.b {
        server.kill();
    }
    let gone = Instant::now();
    let first = &keys[0];
    assert!(
        poll_until(Duration::from_secs(5), || get_all(
            &mut c,
            std::slice::from_ref(first)
        ) == 0),
        "no get answered from zone a within 5s of zone b going away\n{}",
        proxy.log_text()
    );
    let mut errors_after_settling = 0;
    let mut gets_after_settling = 0;
    while gets_after_settling < 2000 {
        let settled = gone.elapsed() >= SETTLE;
        let chunk = &keys[gets_after_settling % keys.len()..][..100];
        let wrong = get_all(&mut c, chunk);
        if settled {
            errors_after_settling += wrong;
            gets_after_settling += chunk.len();
        }
    }
    assert_eq!(
        errors_after_settling,
        0,
        "gets failed more than {SETTLE:?} after zone b went away\n{}",
        proxy.log_text()
    );
    let a_gets = Zones::gets(&zones.a) - a_before;
    assert!(
        a_gets >= gets_after_settling as u64,
        "zone a's servers saw {a_gets} gets, fewer than the {gets_after_settling} served"
    );
    let stats = proxy.wait_stats("cross-zone reads counted", Duration::from_secs(5), |s| {
        stat(s, "route:both:reads_cross_zone") >= gets_after_settling as u64
    });
    println!(
        "after zone b went away: reads_local {}, reads_cross_zone {}",
        stat(&stats, "route:both:reads_local"),
        stat(&stats, "route:both:reads_cross_zone")
    );
    // Once zone b's servers are marked down, reads stop trying them first: no more local
    // reads (each would fail fast before going on to zone a).
    let skipped = poll_until(Duration::from_secs(5), || {
        let before = stat(&proxy.stats(), "route:both:reads_local");
        get_all(&mut c, &keys[..100]) == 0
            && stat(&proxy.stats(), "route:both:reads_local") == before
    });
    assert!(
        skipped,
        "reads still tried zone b's down servers first
{}",
        proxy.log_text()
    );
}

#[test]
fn proxy_zone_in_the_file_wins_over_the_environment() {
    let zones = Zones::start();
    let in_file = config(&zones, "zone = \"a\"\n", None);
    let proxy = start_in_zone(&in_file, "b");
    let mut c = proxy.connect();
    let keys = numbered_keys("file-zone-", 500);
    c.set_many(&keys, value_of);
    let (a_before, b_before) = (Zones::gets(&zones.a), Zones::gets(&zones.b));
    assert_eq!(get_all(&mut c, &keys), 0);
    let (a_gets, b_gets) = (
        Zones::gets(&zones.a) - a_before,
        Zones::gets(&zones.b) - b_before,
    );
    assert_eq!(
        (a_gets, b_gets),
        (keys.len() as u64, 0),
        "proxy.zone = \"a\" with MEMROUTE_ZONE=b: gets seen by (zone a's, zone b's) servers"
    );

    // A reload that drops proxy.zone applies: the environment's zone b is read from then.
    let listen = proxy.listen.clone();
    let without = in_file.replacen("zone = \"a\"\n", "", 1);
    assert!(without.contains(&listen) && !without.contains("[proxy]\nzone"));
    assert!(
        proxy.reload(&with_io_mode(&without)),
        "{}",
        proxy.log_text()
    );
    let mut c = proxy.connect();
    let (a_before, b_before) = (Zones::gets(&zones.a), Zones::gets(&zones.b));
    assert_eq!(get_all(&mut c, &keys), 0);
    let (a_gets, b_gets) = (
        Zones::gets(&zones.a) - a_before,
        Zones::gets(&zones.b) - b_before,
    );
    assert_eq!(
        (a_gets, b_gets),
        (0, keys.len() as u64),
        "after a reload without proxy.zone: gets seen by (zone a's, zone b's) servers"
    );
}

#[test]
fn check_shows_the_zone_its_source_and_the_read_order() {
    let zones = Zones::start();
    let dir = TempDir::new("zones-check");
    let from_env = dir.write("env.toml", &config(&zones, "", None));
    let from_file = dir.write("file.toml", &config(&zones, "zone = \"a\"\n", None));
    let check = |path: &std::path::Path| {
        let out = run_program_with_env(
            memroute_binary(),
            &["--check".as_ref(), "--config".as_ref(), path.as_os_str()],
            &[("MEMROUTE_ZONE", "b")],
            Duration::from_secs(10),
        );
        assert!(out.status.success(), "{}{}", out.stdout, out.stderr);
        out.stdout
    };
    let text = check(&from_env);
    assert!(
        text.contains("proxy: zone b (from MEMROUTE_ZONE)"),
        "{text}"
    );
    assert!(
        text.contains(
            "  read: in_b (replica, reads nearest (zone b): the proxy's zone: read here first)"
        ),
        "{text}"
    );
    assert!(
        text.contains("  read: in_a (replica, reads nearest (zone a): read on failure 1, latency order unknown until measured)"),
        "{text}"
    );
    let text = check(&from_file);
    assert!(text.contains("proxy: zone a (from proxy.zone)"), "{text}");
    assert!(
        text.contains(
            "  read: in_a (replica, reads nearest (zone a): the proxy's zone: read here first)"
        ),
        "{text}"
    );

    // `memroute route` names the child a read uses.
    let out = run_program_with_env(
        memroute_binary(),
        &[
            "route".as_ref(),
            "--config".as_ref(),
            from_env.as_os_str(),
            "some-key".as_ref(),
        ],
        &[("MEMROUTE_ZONE", "b")],
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "{}{}", out.stdout, out.stderr);
    let first = out.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("some-key: both -> in_b => ") && first.contains("read here first"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_multi_get_reads_the_local_zone_and_the_other_when_it_is_gone() {
    let mut zones = Zones::start();
    let proxy = start_in_zone(&config(&zones, "", None), "b");
    let mut c = proxy.connect();
    let keys = numbered_keys("multi-zone-", 40);
    c.set_many(&keys, value_of);
    let multi_get = |c: &mut Conn| {
        c.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
        let reply = c.read_get_reply();
        let values = parse_values(&reply).unwrap_or_default();
        values
            .iter()
            .filter(|(key, _, value)| value == value_of(key).as_bytes())
            .count()
    };
    let (a_before, b_before) = (Zones::gets(&zones.a), Zones::gets(&zones.b));
    for _ in 0..10 {
        assert_eq!(multi_get(&mut c), keys.len(), "{}", proxy.log_text());
    }
    let (a_gets, b_gets) = (
        Zones::gets(&zones.a) - a_before,
        Zones::gets(&zones.b) - b_before,
    );
    // memcached's cmd_get counts keys.
    assert_eq!((a_gets, b_gets), (0, 10 * keys.len() as u64));
    let stats = proxy.wait_stats(
        "local multi-get keys counted",
        Duration::from_secs(5),
        |s| stat(s, "route:both:reads_local") >= 10 * keys.len() as u64,
    );
    assert_eq!(stat(&stats, "route:both:reads_cross_zone"), 0);

    for server in &mut zones.b {
        server.kill();
    }
    assert!(
        poll_until(Duration::from_secs(5), || multi_get(&mut c) == keys.len()),
        "no complete multi-get from zone a within 5s of zone b going away\n{}",
        proxy.log_text()
    );
    let gone = Instant::now();
    while gone.elapsed() < SETTLE {
        multi_get(&mut c);
    }
    for _ in 0..10 {
        assert_eq!(multi_get(&mut c), keys.len(), "{}", proxy.log_text());
    }
}

/// A TCP relay to `target` that holds every chunk going to it for `delay` first: a server
/// that answers `delay` later than the others, for real (the delay is the relay's, not the
/// test's synchronisation). Stops accepting when dropped.
struct SlowRelay {
    addr: String,
    stop: Arc<AtomicBool>,
}

impl SlowRelay {
    fn start(target: String, delay: Duration) -> SlowRelay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let addr = listener.local_addr().expect("relay address").to_string();
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        relay(client, server, delay, stopping.clone());
                    }
                    // Nothing to accept: look again shortly (the relay's own loop).
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        SlowRelay { addr, stop }
    }
}

/// Copies client -> server (each chunk `delay` late) and server -> client, each on a thread.
fn relay(client: TcpStream, server: TcpStream, delay: Duration, stop: Arc<AtomicBool>) {
    let (Ok(mut client_in), Ok(mut server_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (mut server_in, mut client_out) = (server, client);
    let stop_up = stop.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while !stop_up.load(Ordering::Relaxed) {
            match client_in.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    std::thread::sleep(delay);
                    if server_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = server_out.shutdown(std::net::Shutdown::Both);
    });
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while !stop.load(Ordering::Relaxed) {
            match server_in.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if client_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = client_out.shutdown(std::net::Shutdown::Both);
    });
}

impl Drop for SlowRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn children_without_zones_are_read_in_order_of_measured_latency() {
    // The first child is slow (a relay 20ms late), the second is not: once writes (which go
    // to both) have measured them, reads go to the second.
    let slow = Memcached::start();
    let fast = Memcached::start();
    let relay = SlowRelay::start(slow.addr(), Duration::from_millis(20));
    let listen = format!("127.0.0.1:{}", free_port());
    let mut toml = proxy_section(&listen, "both");
    toml.push_str(&pool_section(
        "slow",
        std::slice::from_ref(&relay.addr),
        "timeout = \"10s\"",
    ));
    toml.push_str(&pool_section("fast", &[fast.addr()], "timeout = \"10s\""));
    toml.push_str(
        "[routes.both]\ntype = \"replicated\"\nchildren = [\"slow\", \"fast\"]\n\
         writes = \"all-sync\"\nreads = \"nearest\"\n",
    );
    let proxy = Memroute::start(&toml);
    let mut c = proxy.connect();
    let keys = numbered_keys("latency-", 20);
    c.set_many(&keys, value_of);
    // Until measured, config order: the slow child first. The order is looked at again at
    // most once a second, after the workers flushed the round trips they saw.
    let fast_before = fast.stat("cmd_get");
    let learned = poll_until(Duration::from_secs(10), || {
        let before = fast.stat("cmd_get");
        get_all(&mut c, &keys[..1]) == 0 && fast.stat("cmd_get") > before
    });
    assert!(
        learned,
        "reads never moved to the faster child\n{}",
        proxy.log_text()
    );
    let (slow_before, fast_before_rest) = (slow.stat("cmd_get"), fast.stat("cmd_get"));
    assert_eq!(get_all(&mut c, &keys), 0);
    assert_eq!(
        slow.stat("cmd_get") - slow_before,
        0,
        "the slow child was read"
    );
    assert_eq!(fast.stat("cmd_get") - fast_before_rest, keys.len() as u64);
    println!(
        "reads moved to the faster child after {} gets on it",
        fast.stat("cmd_get") - fast_before
    );
}
