//! The process-wide budget for buffered replies, against real memcached: ten clients that
//! pipeline `get` of a 100 KB value and never read are paused and then closed, a client
//! that reads keeps being served meanwhile, and the memory comes back once they are gone.
//! The same scenario runs in the text protocol and in the binary one: every protocol is
//! served by the same session loop, so both are bounded alike.
//!
//! ```text
//!   10 x (1000 x "get big" , never read) ──> memroute ──> memcached (big = 100 KB)
//!   1 x reading client: get small, again and again (must keep working)
//!   max_buffered_replies = 16 MiB, slow_client_timeout = 1 s
//! ```
//!
//! RSS is sampled and printed (before, peak, after); the test asserts what the budget
//! promises: the heaviest holders are closed (counted, logged) until what the rest hold
//! fits the budget, the reading client is served throughout, the budget's own count
//! returns to zero once they go, and RSS is back within [`RETURNED_WITHIN`] of where it
//! started within [`RETURN_DEADLINE`] of the slow clients leaving (memroute's pools keep
//! only bounded, small buffers; the allocator gives back what was freed).
use std::io::Write;
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use memroute_tests::*;

#[path = "common/binary_client.rs"]
mod binary_client;

const VALUE_SIZE: usize = 100 * 1024;
const SLOW_CLIENTS: usize = 10;
const DEADLINE: Duration = Duration::from_secs(30);
const LIMIT: u64 = 16 * 1024 * 1024;

fn stat(conn: &mut Conn, name: &str) -> u64 {
    stat_u64(&conn.stats(), name).unwrap_or_else(|| panic!("no {name} in stats"))
}

/// How far above its start RSS may stay once the slow clients are gone, and how soon it
/// must get there: what the storm held (tens of MiB of replies) is freed when they close,
/// and the allocator returns freed pages within a second or two (jemalloc's background
/// purging; see docs/operations.md for a glibc build).
const RETURNED_WITHIN: u64 = 20 * 1024;
const RETURN_DEADLINE: Duration = Duration::from_secs(3);

/// A memroute built without jemalloc runs on glibc's malloc, which gives large freed blocks
/// back only with a fixed mmap threshold (docs/operations.md, "Memory budget for buffered
/// replies"); the default build ignores it. Every test in this file sets the same value for
/// the processes it starts, so they race with nothing.
const GLIBC_SETTING: (&str, &str) = ("MALLOC_MMAP_THRESHOLD_", "131072");

/// One scenario at a time: each measures a process's RSS while its slow clients keep the
/// machine busy, and two at once would slow each other past their deadlines.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The protocol a scenario's clients speak.
#[derive(Debug, Clone, Copy)]
enum Protocol {
    Text,
    Binary,
}

impl Protocol {
    /// A get of `key`, as this protocol frames it.
    fn get_request(self, key: &str) -> Vec<u8> {
        match self {
            Protocol::Text => format!("get {key}\r\n").into_bytes(),
            Protocol::Binary => binary_client::get_request(key),
        }
    }

    /// A get of `key` over `conn`, answered before it returns: the value, or `None` on a miss.
    fn get(self, conn: &mut Conn, key: &str) -> Option<Vec<u8>> {
        match self {
            Protocol::Text => conn.get(key),
            Protocol::Binary => binary_client::get(conn, key),
        }
    }
}

#[test]
fn clients_that_do_not_read_are_paused_then_closed_and_memory_returns() {
    slow_readers_are_bounded(Protocol::Text);
}

#[test]
fn binary_clients_that_do_not_read_are_paused_then_closed_and_memory_returns() {
    slow_readers_are_bounded(Protocol::Binary);
}

/// Ten clients of `protocol` that pipeline gets of a big value and never read, beside one
/// of `protocol` that reads; stats are asked over a text connection of their own.
fn slow_readers_are_bounded(protocol: Protocol) {
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    std::env::set_var(GLIBC_SETTING.0, GLIBC_SETTING.1);
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = simple_config(&listen, &[server.addr()], "").replace(
        "route = \"main\"\n",
        "route = \"main\"\nmax_buffered_replies = \"16MiB\"\nslow_client_timeout = \"1s\"\n",
    );
    let proxy = Memroute::start(&toml);
    let mut observer = proxy.connect();
    observer.set("big", &vec![b'x'; VALUE_SIZE]);
    observer.set("small", b"s");
    let mut reader = proxy.connect();
    // Warm up the path (one big reply through) before the baseline.
    assert_eq!(
        protocol.get(&mut reader, "big").map(|v| v.len()),
        Some(VALUE_SIZE)
    );
    let before = rss_kib(proxy.pid());

    let requests = protocol.get_request("big").repeat(1000);
    let slow: Vec<TcpStream> = (0..SLOW_CLIENTS)
        .map(|_| {
            let mut stream = TcpStream::connect(&proxy.listen).expect("connect");
            stream.write_all(&requests).expect("send");
            stream
        })
        .collect();

    // While the slow clients hold the budget, the reading client keeps being served, and
    // memroute pauses and then closes the slow ones.
    let mut peak = before;
    let mut peak_buffered = 0;
    let mut served = 0;
    let mut latencies = Vec::new();
    let started = Instant::now();
    loop {
        let asked = Instant::now();
        assert_eq!(
            protocol.get(&mut reader, "small").as_deref(),
            Some(&b"s"[..])
        );
        latencies.push(asked.elapsed());
        served += 1;
        peak = peak.max(rss_kib(proxy.pid()));
        let buffered = stat(&mut observer, "buffered_reply_bytes");
        peak_buffered = peak_buffered.max(buffered);
        // Settled: some were closed and what the rest hold fits the budget.
        if stat(&mut observer, "slow_clients_closed") >= 1 && buffered <= LIMIT {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "slow clients not all closed: {:?}\n{}",
            observer.stats(),
            proxy.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Blocked writers are what this scenario makes (reads pause when a session that is
    // still reading holds too much): each closing is counted and logged once. The log
    // line reaches the test through memroute's stderr a moment after the count.
    let (mut closed, mut logged) = (0, 0);
    let agree = poll_until(DEADLINE, || {
        closed = stat(&mut observer, "slow_clients_closed");
        logged = proxy.log_count("does not read") as u64;
        logged == closed
    });
    assert!(
        agree,
        "{logged} closings logged, {closed} counted\n{}",
        proxy.log_text()
    );
    let paused = stat(&mut observer, "reads_paused");
    drop(slow);
    let left = Instant::now();

    // Everything they held is released: the memory, soon, then the budget's count.
    let returned = |after: u64| after <= before + RETURNED_WITHIN;
    let mut after = rss_kib(proxy.pid());
    poll_until(RETURN_DEADLINE, || {
        after = rss_kib(proxy.pid());
        returned(after)
    });
    let took = left.elapsed();
    assert!(
        poll_until(DEADLINE, || stat(&mut observer, "buffered_reply_bytes")
            == 0),
        "buffered_reply_bytes stays at {}",
        stat(&mut observer, "buffered_reply_bytes")
    );
    println!(
        "reply budget ({protocol:?}): RSS before {} MiB, peak {} MiB, {} MiB {took:.1?} after the slow clients went; buffered replies peaked at {} MiB (limit 16); {} of {SLOW_CLIENTS} slow clients closed, {} pauses; reading client served {served} gets meanwhile ({})",
        before / 1024,
        peak / 1024,
        after / 1024,
        peak_buffered / (1024 * 1024),
        closed,
        paused,
        latency_summary(&latencies)
    );
    assert!(
        returned(after),
        "memory did not come back within {RETURN_DEADLINE:?}: {before} KiB before, {peak} KiB peak, {after} KiB after"
    );
    // Still serving big values to a client that reads.
    assert_eq!(
        protocol.get(&mut reader, "big").map(|v| v.len()),
        Some(VALUE_SIZE)
    );
}
