//! Graceful drain on SIGTERM, against real memcached: memroute reports not ready at once,
//! keeps accepting and serving for `drain_delay`, then stops accepting and closes each
//! connection as it goes idle; a request in flight when the delay ends is still answered.
//!
//! ```text
//!   SIGTERM ─> /ready 503, still accepting + serving ──drain_delay──> listeners closed
//!          ─> idle connections closed at once, busy ones after their last reply ─> exit 0
//! ```
//!
//! Every wait is on a condition (a log line, a reply, end of stream) with a deadline.
use std::time::{Duration, Instant};

use memroute_tests::*;

const DEADLINE: Duration = Duration::from_secs(15);

#[test]
fn sigterm_drains_serves_new_and_old_clients_then_closes_idle_ones() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let mut toml = simple_config(&listen, &[server.addr()], "timeout = \"10s\"\n");
    toml = toml.replace(
        "route = \"main\"\n",
        "route = \"main\"\ndrain_delay = \"2s\"\n",
    );
    toml.push_str(&format!("\n[admin]\nlisten = \"{admin}\"\n"));
    let mut proxy = Memroute::start(&toml);
    // Ready once the pool's server is connected.
    assert!(
        poll_until(DEADLINE, || admin_http(&admin, "GET", "/ready").0 == 200),
        "never ready\n{}",
        proxy.log_text()
    );

    let mut old = proxy.connect();
    old.set("k", b"v");
    let mut in_flight = proxy.connect();
    proxy.signal("TERM");
    assert!(
        proxy.wait_log("draining: reporting not ready", DEADLINE),
        "{}",
        proxy.log_text()
    );
    // Not ready at once, still alive.
    assert_eq!(admin_http(&admin, "GET", "/ready").0, 503);
    assert_eq!(admin_http(&admin, "GET", "/healthz").0, 200);

    // During the delay, an old client and new clients are served.
    let mut served_new = 0;
    let mut served_old = 0;
    while !proxy.log_text().contains("drain delay over") {
        assert_eq!(old.get("k").as_deref(), Some(&b"v"[..]));
        served_old += 1;
        if let Ok(stream) = std::net::TcpStream::connect(&listen) {
            drop(stream);
            let mut fresh = proxy.connect();
            assert_eq!(fresh.get("k").as_deref(), Some(&b"v"[..]));
            served_new += 1;
        } else {
            // Refused only once the delay is over (the log line may lag the close).
            assert!(proxy.wait_log("drain delay over", Duration::from_secs(1)));
            break;
        }
        // Just before the delay ends, a request that will still be in flight then: its
        // backend is stopped, and resumed only after the listeners closed.
        if served_old == 3 {
            let frozen = server.stop();
            in_flight.send(b"get k\r\n");
            assert!(
                proxy.wait_log("drain delay over", DEADLINE),
                "{}",
                proxy.log_text()
            );
            // The idle old client is closed now; the busy one is not.
            assert!(
                old.expect_eof(),
                "an idle connection stayed open after the drain delay"
            );
            frozen.resume();
            assert_eq!(in_flight.read_get_reply(), b"VALUE k 0 1\r\nv\r\nEND\r\n");
            assert!(in_flight.expect_eof(), "closed once its reply was written");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("drain: served {served_old} requests on an old connection and {served_new} new connections during drain_delay");
    assert!(
        served_old >= 3 && served_new >= 3,
        "{served_old} / {served_new}"
    );
    let started = Instant::now();
    let status = proxy.wait_exit(DEADLINE);
    assert!(status.success(), "exit {status}\n{}", proxy.log_text());
    assert!(
        std::net::TcpStream::connect(&listen).is_err(),
        "still accepting after exit"
    );
    println!(
        "drain: exited {:.0} ms after the last connection closed",
        started.elapsed().as_secs_f64() * 1000.0
    );
}

#[test]
fn drain_delay_zero_stops_accepting_at_once_and_keeps_pipelined_requests() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = simple_config(&listen, &[server.addr()], "").replace(
        "route = \"main\"\n",
        "route = \"main\"\ndrain_delay = \"0s\"\n",
    );
    let mut proxy = Memroute::start(&toml);
    let mut c = proxy.connect();
    c.set("k", b"v");
    // Requests the client sent before the stop are all answered before the close, even
    // ones memroute had read but not yet parsed.
    let frozen = server.stop();
    let batch: String = (0..50).map(|_| "get k\r\n").collect();
    c.send(batch.as_bytes());
    proxy.signal("TERM");
    assert!(
        proxy.wait_log("drain delay over", DEADLINE),
        "{}",
        proxy.log_text()
    );
    frozen.resume();
    for i in 0..50 {
        assert_eq!(
            c.read_get_reply(),
            b"VALUE k 0 1\r\nv\r\nEND\r\n",
            "reply {i}"
        );
    }
    assert!(c.expect_eof());
    let status = proxy.wait_exit(DEADLINE);
    assert!(status.success(), "exit {status}\n{}", proxy.log_text());
}
