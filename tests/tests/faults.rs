//! Network faults on one backend, against real memcached: packet loss and a blackhole made
//! by the kernel in a network namespace the test creates, and a 50 ms delay.
//!
//! ```text
//!   test (outside) ──unshare -n──> the same test binary, in a fresh netns (lo only)
//!        memcached x2 + memroute + client, all on 127.0.0.1
//!        nft table memroute_fault: drop all / 10% of the packets to and from one server
//!        (a blackhole drops silently: no RST, connects and requests just get no answer)
//! ```
//!
//! What must hold: requests to the faulty server end within the configured timeout
//! (`SERVER_ERROR`, never a hang), the other server's keys are unaffected, the server serves
//! again within a second of the fault healing, and in a replicated pool with `all-sync`
//! writes every write acknowledged `STORED` is on every replica.
//!
//! Why nftables and not `tc netem`: the kernel here is built without `sch_netem` (and without
//! `sch_prio`), so netem qdiscs cannot be created; nftables drops (with `numgen random` for a
//! loss rate) are real kernel packet loss all the same. A delay cannot be made that way, so
//! the 50 ms delay is a relay in the test that holds every chunk 50 ms in each direction.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use memroute_tests::*;

/// Set in the child that runs inside the new network namespace.
const IN_NETNS: &str = "MEMROUTE_TEST_IN_NETNS";
/// The pool timeout of these tests (memroute's default).
const TIMEOUT: Duration = Duration::from_millis(250);
/// What "ended within the configured timeout" allows for: the timeout, the reader's tick
/// (a quarter of it) and a loaded machine.
const TIMEOUT_BOUND: Duration = Duration::from_millis(250 + 750);
const RECOVERY_BOUND: Duration = Duration::from_secs(1);
const DEADLINE: Duration = Duration::from_secs(20);

/// Runs test `name` again inside a new network namespace (`unshare -n`), with only `lo`, up.
/// Returns true in that child (run the body), false in the parent (the child's outcome has
/// been asserted). Needs root or CAP_SYS_ADMIN: without it this fails, it does not skip.
fn in_own_netns(name: &str) -> bool {
    if std::env::var_os(IN_NETNS).is_some() {
        let up = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("run ip (iproute2)");
        assert!(up.success(), "ip link set lo up: {up}");
        return true;
    }
    require_program("unshare");
    require_program("nft");
    let exe = std::env::current_exe().expect("test binary path");
    let output = Command::new("unshare")
        .arg("-n")
        .arg("--")
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads", "1"])
        .env(IN_NETNS, "1")
        .stdin(Stdio::null())
        .output()
        .expect("run unshare -n");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // libtest prints `test NAME ... ` before the body's output on the same line.
    for line in stdout
        .lines()
        .filter_map(|l| l.find("fault:").map(|at| &l[at..]))
    {
        println!("{line}");
    }
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{name} in its own network namespace: {}\n{stdout}\n{stderr}",
        output.status
    );
    false
}

/// Packet drops on one port, both directions, in this namespace's nftables.
struct Fault;

impl Fault {
    /// Drops every packet (`percent` = 100) or that share of them, to and from `port`.
    fn drop(port: u16, percent: u32) -> Fault {
        let matcher = match percent {
            100 => String::new(),
            p => format!("numgen random mod 100 < {p} "),
        };
        nft(&format!(
            "table inet memroute_fault {{\n  chain out {{\n    type filter hook output priority 0;\n    \
             tcp dport {port} {matcher}drop\n    tcp sport {port} {matcher}drop\n  }}\n}}\n"
        ));
        Fault
    }

    /// Removes the drops: the fault heals.
    fn heal(self) {
        nft("delete table inet memroute_fault\n");
    }
}

fn nft(script: &str) {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("run nft");
    child
        .stdin
        .take()
        .expect("nft stdin")
        .write_all(script.as_bytes())
        .expect("write nft script");
    let status = child.wait().expect("nft");
    assert!(status.success(), "nft -f - failed on:\n{script}");
}

/// Two servers in pool `main` (default timeout and probes), keys set through memroute, one
/// key held by each server.
struct Setup {
    servers: Vec<Memcached>,
    proxy: Memroute,
    victim_key: String,
    other_key: String,
}

fn setup(pool_lines: &str) -> Setup {
    let servers: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let mut toml = proxy_section(&format!("127.0.0.1:{}", free_port()), "main");
    toml.push_str(&pool_section("main", &addrs, pool_lines));
    let proxy = Memroute::start(&toml);
    let keys: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
    proxy.connect().set_many(&keys, |k| format!("v-{k}"));
    let on = |index: usize| {
        keys.iter()
            .find(|k| holder(&servers, k) == index)
            .cloned()
            .expect("a key on each server")
    };
    let (victim_key, other_key) = (on(0), on(1));
    Setup {
        servers,
        proxy,
        victim_key,
        other_key,
    }
}

/// `get key` through `c`: the reply and how long it took.
fn timed_get(c: &mut Conn, key: &str) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    c.send(format!("get {key}\r\n").as_bytes());
    let reply = c.read_get_reply();
    (reply, started.elapsed())
}

fn is_value(reply: &[u8], key: &str) -> bool {
    reply == format!("VALUE {key} 0 {}\r\nv-{key}\r\nEND\r\n", key.len() + 2).as_bytes()
}

/// Polls `set key` until STORED; returns how long it took.
fn wait_stored(c: &mut Conn, key: &str, proxy: &Memroute) -> Duration {
    let started = Instant::now();
    loop {
        let reply =
            c.roundtrip_line(format!("set {key} 0 0 {}\r\nv-{key}\r\n", key.len() + 2).as_bytes());
        if reply == b"STORED\r\n" {
            return started.elapsed();
        }
        assert!(reply.starts_with(b"SERVER_ERROR "), "{}", show(&reply));
        assert!(started.elapsed() < DEADLINE, "{}", proxy.log_text());
        std::thread::sleep(POLL);
    }
}

#[test]
fn a_blackholed_backend_times_out_in_bounds_spares_the_other_and_recovers_within_a_second() {
    if !in_own_netns(
        "a_blackholed_backend_times_out_in_bounds_spares_the_other_and_recovers_within_a_second",
    ) {
        return;
    }
    let s = setup("");
    let mut c = s.proxy.connect();
    let fault = Fault::drop(s.servers[0].port, 100);

    // Requests to it end in SERVER_ERROR within the timeout, until it is marked down
    // (failure_limit = 3 timeouts), and then at once.
    let mut slowest = Duration::ZERO;
    let mut errors = 0;
    let started = Instant::now();
    while !s.proxy.log_text().contains("server marked down") {
        let (reply, took) = timed_get(&mut c, &s.victim_key);
        assert!(reply.starts_with(b"SERVER_ERROR "), "{}", show(&reply));
        assert!(took < TIMEOUT_BOUND, "a blackholed request took {took:?}");
        slowest = slowest.max(took);
        errors += 1;
        // Between timeouts the connection is re-established (its connects time out too,
        // each counted as a failure); requests meanwhile fail at once.
        assert!(started.elapsed() < DEADLINE, "{}", s.proxy.log_text());
        std::thread::sleep(POLL);
        // The other server's keys are unaffected meanwhile.
        let (reply, _) = timed_get(&mut c, &s.other_key);
        assert!(is_value(&reply, &s.other_key), "{}", show(&reply));
    }
    let (reply, fail_fast) = timed_get(&mut c, &s.victim_key);
    assert!(reply.starts_with(b"SERVER_ERROR "), "{}", show(&reply));
    let mut other = Vec::new();
    for _ in 0..50 {
        let (reply, took) = timed_get(&mut c, &s.other_key);
        assert!(is_value(&reply, &s.other_key), "{}", show(&reply));
        other.push(took);
    }

    fault.heal();
    let took = wait_stored(&mut c, &s.victim_key, &s.proxy);
    println!(
        "fault: blackhole: {errors} SERVER_ERRORs before marked down (slowest {:.0} ms, timeout {TIMEOUT:?}), then fail-fast in {:.2} ms; other server meanwhile: {}; served again {:.0} ms after the heal",
        slowest.as_secs_f64() * 1000.0,
        fail_fast.as_secs_f64() * 1000.0,
        latency_summary(&other),
        took.as_secs_f64() * 1000.0
    );
    assert!(
        took < RECOVERY_BOUND,
        "served again {took:?} after the heal\n{}",
        s.proxy.log_text()
    );
}

#[test]
fn ten_percent_loss_on_a_backend_stays_in_bounds_and_spares_the_other() {
    if !in_own_netns("ten_percent_loss_on_a_backend_stays_in_bounds_and_spares_the_other") {
        return;
    }
    let s = setup("");
    let mut c = s.proxy.connect();
    let fault = Fault::drop(s.servers[0].port, 10);
    let (mut ok, mut failed, mut slowest) = (0, 0, Duration::ZERO);
    let mut other = Vec::new();
    // At least 150 requests, and until some were served: when the first requests meet the
    // loss, the server is marked down and the rest of a fixed count fail fast in
    // microseconds, before its prober finds it back (within a second, under the loss).
    let until = Instant::now() + DEADLINE;
    while other.len() < 150 || (ok == 0 && Instant::now() < until) {
        let (reply, took) = timed_get(&mut c, &s.victim_key);
        slowest = slowest.max(took);
        if is_value(&reply, &s.victim_key) {
            ok += 1;
        } else {
            // A lost packet the retransmission did not repair in time: a timeout (or the
            // server marked down after several): an error, in bounds.
            assert!(reply.starts_with(b"SERVER_ERROR "), "{}", show(&reply));
            assert!(took < TIMEOUT_BOUND, "a request under loss took {took:?}");
            failed += 1;
        }
        let (reply, took) = timed_get(&mut c, &s.other_key);
        assert!(is_value(&reply, &s.other_key), "{}", show(&reply));
        other.push(took);
    }
    fault.heal();
    let took = wait_stored(&mut c, &s.victim_key, &s.proxy);
    println!(
        "fault: 10% loss: {ok} served, {failed} SERVER_ERROR (slowest {:.0} ms); other server: {}; after the heal served in {:.0} ms",
        slowest.as_secs_f64() * 1000.0,
        latency_summary(&other),
        took.as_secs_f64() * 1000.0
    );
    assert!(ok > 0, "nothing served under 10% loss");
    assert!(took < RECOVERY_BOUND, "{took:?}\n{}", s.proxy.log_text());
}

#[test]
fn all_sync_writes_acknowledged_stored_are_on_every_replica_after_the_heal() {
    if !in_own_netns("all_sync_writes_acknowledged_stored_are_on_every_replica_after_the_heal") {
        return;
    }
    let replicas: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let mut toml = proxy_section(&format!("127.0.0.1:{}", free_port()), "both");
    // A timeout above TCP's retransmission time (200 ms+), so that a lost packet delays a
    // write rather than failing it: under loss some writes must be acknowledged, or the
    // test would show nothing.
    let pool_lines = "timeout = \"1s\"\n";
    toml.push_str(&pool_section("a", &[replicas[0].addr()], pool_lines));
    toml.push_str(&pool_section("b", &[replicas[1].addr()], pool_lines));
    toml.push_str(
        "[routes.both]\ntype = \"replicated\"\nchildren = [\"a\", \"b\"]\nwrites = \"all-sync\"\nreads = \"first\"\n",
    );
    let proxy = Memroute::start(&toml);
    let mut c = proxy.connect();
    let mut stored = Vec::new();
    let mut refused = 0;
    // Replica b loses 10% of its packets, then is blackholed, then heals.
    for (phase, percent) in [("loss", 10), ("blackhole", 100)] {
        let fault = Fault::drop(replicas[1].port, percent);
        for i in 0..60 {
            let key = format!("{phase}{i}");
            let reply = c.roundtrip_line(
                format!("set {key} 0 0 {}\r\nv-{key}\r\n", key.len() + 2).as_bytes(),
            );
            match reply.as_slice() {
                b"STORED\r\n" => stored.push(key),
                other => {
                    assert!(other.starts_with(b"SERVER_ERROR "), "{}", show(other));
                    refused += 1;
                }
            }
        }
        fault.heal();
    }
    // Every acknowledged write is on both replicas.
    for key in &stored {
        for replica in &replicas {
            assert_eq!(
                replica.connect().get(key).as_deref(),
                Some(format!("v-{key}").as_bytes()),
                "{key} was acknowledged STORED but is missing on {}",
                replica.addr()
            );
        }
    }
    // And once healed, writes are acknowledged again.
    let took = wait_stored(&mut c, "after-heal", &proxy);
    println!(
        "fault: all-sync (timeout 1 s) under 10% loss then blackhole of one replica: {} STORED (all on both replicas), {refused} refused; STORED again {:.0} ms after the heal",
        stored.len(),
        took.as_secs_f64() * 1000.0
    );
    assert!(!stored.is_empty(), "no write acknowledged under 10% loss");
    assert!(refused > 0, "the blackhole refused nothing");
}

/// A TCP relay that holds every chunk `delay` before passing it on, in both directions:
/// a link with that one-way latency. Runs until the test process exits.
fn delaying_relay(target: String, delay: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
    let address = listener.local_addr().expect("relay address").to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            for (from, to) in [
                (client.try_clone(), server.try_clone()),
                (server.try_clone(), client.try_clone()),
            ] {
                if let (Ok(from), Ok(to)) = (from, to) {
                    pump_delayed(from, to, delay);
                }
            }
        }
    });
    address
}

/// Copies `from` to `to`, each chunk `delay` after it was read (order kept).
fn pump_delayed(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buffer) {
            if n == 0
                || chunks
                    .send((Instant::now() + delay, buffer[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (at, chunk) in due {
            // The link's latency itself, not a synchronisation.
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

#[test]
fn fifty_ms_delay_on_a_backend_is_served_within_the_timeout_or_bounded_by_it() {
    let servers: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let slow = delaying_relay(servers[0].addr(), Duration::from_millis(50));
    let keys: Vec<String> = (0..40).map(|i| format!("d{i}")).collect();
    for (timeout, served) in [("250ms", true), ("60ms", false)] {
        let mut toml = proxy_section(&format!("127.0.0.1:{}", free_port()), "main");
        toml.push_str(&pool_section(
            "main",
            &[slow.clone(), servers[1].addr()],
            &format!("timeout = \"{timeout}\"\nfailure_limit = 1000\n"),
        ));
        let proxy = Memroute::start(&toml);
        let mut c = proxy.connect();
        // Keys set directly on both servers; the ring decides which one each key is read from.
        for server in &servers {
            server.connect().set_many(&keys, |k| format!("v-{k}"));
        }
        let (mut slow_times, mut fast_times) = (Vec::new(), Vec::new());
        for key in &keys {
            let (reply, took) = timed_get(&mut c, key);
            if took >= Duration::from_millis(100) || !is_value(&reply, key) {
                // Through the relay: 50 ms each way.
                if served {
                    assert!(
                        is_value(&reply, key),
                        "{key} with timeout {timeout}: {}",
                        show(&reply)
                    );
                } else {
                    assert!(
                        String::from_utf8_lossy(&reply).ends_with("timed out\r\n"),
                        "{key} with timeout {timeout}: {}",
                        show(&reply)
                    );
                    assert!(took < TIMEOUT_BOUND, "{took:?}");
                }
                slow_times.push(took);
            } else {
                fast_times.push(took);
            }
        }
        println!(
            "fault: 50 ms delay, timeout {timeout}: delayed server {}; other server {}",
            latency_summary(&slow_times),
            latency_summary(&fast_times)
        );
        assert!(!slow_times.is_empty() && !fast_times.is_empty());
    }
}
