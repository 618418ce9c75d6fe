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
//!
//! Then the count is held to be exact: five rounds of slow clients that close on their own
//! (mid-reply, mid-multi-get, mid-binary-frame; through a plain pool and replicated, shadow
//! and failover routes) must each leave `buffered_reply_bytes` at exactly 0 and no session
//! of theirs behind. How soon memory and the count come back is measured, not asserted:
//! `scripts/bench-memory --scenarios storm`.
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memroute_tests::*;

#[path = "common/binary_client.rs"]
mod binary_client;

const VALUE_SIZE: usize = 100 * 1024;
const SLOW_CLIENTS: usize = 10;
const DEADLINE: Duration = Duration::from_secs(30);
const LIMIT: u64 = 16 * 1024 * 1024;

/// A pool timeout no storm on a loaded machine reaches.
const PATIENT: &str = "timeout = \"30s\"";

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

/// How long each round's slow clients pipeline before they close: long enough for their
/// sessions to fill the budget, pause and block writing (a few hundred ms on this machine);
/// counted from the first reply charged when the clients are slow to start (`storm`).
const STORM: Duration = Duration::from_millis(1000);
const ROUNDS: usize = 5;
/// A slow client's receive buffer (SO_RCVBUF): its kernel takes a few KiB of replies, then
/// memroute's writes to it block.
const SLOW_RCVBUF: usize = 4096;

/// One kind of slow client and the routes it goes through.
struct Leak {
    name: &'static str,
    /// `[proxy]` root and the route sections over pools `main`, `spare` and `empty`.
    root: &'static str,
    routes: &'static str,
    /// What each slow client pipelines, again and again, without reading.
    requests: fn() -> Vec<u8>,
}

fn text_gets() -> Vec<u8> {
    b"get big\r\n".repeat(200)
}

/// Multi-gets whose keys are on both servers of a pool: each waits for several legs.
fn text_multi_gets() -> Vec<u8> {
    b"get big big:1 big:2 big:3 small\r\n".repeat(50)
}

/// Binary gets (27-byte frames: memroute's 16 KiB reads end mid-frame, and so does the
/// client's last write, cut by its timeout).
fn binary_gets() -> Vec<u8> {
    binary_client::get_request("big").repeat(200)
}

/// Every way a client can leave with replies charged: mid-reply (its socket full, a write
/// blocked), mid-multi-get (legs in flight), mid-binary-frame, and through each policy
/// route kind that holds more per request (replicated, shadow, failover).
const LEAKS: &[Leak] = &[
    Leak {
        name: "text get, closed mid-reply",
        root: "main",
        routes: "",
        requests: text_gets,
    },
    Leak {
        name: "text multi-get over two servers, closed mid-multi-get",
        root: "main",
        routes: "",
        requests: text_multi_gets,
    },
    Leak {
        name: "binary get, closed mid-frame",
        root: "main",
        routes: "",
        requests: binary_gets,
    },
    Leak {
        name: "replicated route, reads = fastest",
        root: "both",
        routes: "[routes.both]\ntype = \"replicated\"\nchildren = [\"main\", \"spare\"]\nreads = \"fastest\"\n",
        requests: text_multi_gets,
    },
    Leak {
        name: "shadow route, every key shadowed",
        root: "shadowed",
        routes: "[routes.shadowed]\ntype = \"shadow\"\nprimary = \"main\"\nshadow = \"spare\"\nfraction = 1.0\n",
        requests: text_gets,
    },
    Leak {
        name: "failover route on miss (every read asks both pools)",
        root: "fo",
        routes: "[routes.fo]\ntype = \"failover\"\nchildren = [\"empty\", \"main\"]\non = \"error-or-miss\"\n",
        requests: text_multi_gets,
    },
];

/// After every round of slow clients leaving, the budget's count is exactly 0 again, and no
/// session of theirs is left: in every protocol, framing state and route kind.
#[test]
fn the_budget_count_returns_to_zero_after_every_round() {
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let main = [Memcached::start(), Memcached::start()];
    let spare = Memcached::start();
    let empty = Memcached::start();
    let main_addrs: Vec<String> = main.iter().map(Memcached::addr).collect();
    // The values are written to the servers directly, every key on each (whichever server
    // a key hashes to has it); `empty` has none, so a failover on miss asks two pools for
    // every key.
    for server in main.iter().chain([&spare]) {
        let mut direct = server.connect();
        for key in ["big", "big:1", "big:2", "big:3"] {
            direct.set(key, &vec![b'x'; VALUE_SIZE]);
        }
        direct.set("small", b"s");
    }
    for leak in LEAKS {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut toml = proxy_section(&listen, leak.root).replace(
            "\n\n",
            // A small budget so that every storm goes past it: sessions pause and their
            // writes block over their share, the states a client can leave in.
            "\nmax_buffered_replies = \"4MiB\"\n\n",
        );
        // Healthy servers, but a loaded machine can keep a backend's pipeline of 100 KB
        // replies waiting past the default timeout; a server marked down answers every get
        // with a short error, and a round would then charge nothing. Timeouts are not what
        // this test is about.
        toml.push_str(&pool_section("main", &main_addrs, PATIENT));
        toml.push_str(&pool_section("spare", &[spare.addr()], PATIENT));
        toml.push_str(&pool_section("empty", &[empty.addr()], PATIENT));
        toml.push_str(leak.routes);
        let proxy = Memroute::start(&toml);
        let mut observer = proxy.connect();
        for round in 1..=ROUNDS {
            let peak = storm(&proxy, &mut observer, (leak.requests)());
            // A round whose clients held nothing would test nothing.
            if peak == 0 {
                let log = proxy.log_text();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "{}, round {round}: nothing was charged; stats:\n{}\nlast log lines (newest first):\n{}",
                    leak.name,
                    observer
                        .stats()
                        .iter()
                        .filter(|(name, _)| name.starts_with("server:") || name.contains("slow"))
                        .map(|(name, value)| format!("{name} {value}"))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    tail.join("\n")
                );
            }
            let mut last = u64::MAX;
            let mut sessions = u64::MAX;
            let released = poll_until(DEADLINE, || {
                let stats = observer.stats();
                last = stat_u64(&stats, "buffered_reply_bytes").unwrap_or(u64::MAX);
                sessions = stat_u64(&stats, "curr_connections").unwrap_or(u64::MAX);
                last == 0 && sessions == 1
            });
            assert!(
                released,
                "{}, round {round}: buffered_reply_bytes stays at {last} (peak {peak}), {sessions} connections open\n{}",
                leak.name,
                proxy.log_text()
            );
            println!(
                "{}, round {round}: buffered_reply_bytes peaked at {peak}, back to 0",
                leak.name
            );
        }
        // Still serving, with nothing charged to a client that reads.
        assert_eq!(
            observer.get("big").map(|v| v.len()),
            Some(VALUE_SIZE),
            "{}",
            leak.name
        );
        assert_eq!(stat(&mut observer, "buffered_reply_bytes"), 0);
    }
}

/// Ten clients with a small receive buffer pipeline `requests` for [`STORM`] without
/// reading, then close (with replies unread: a reset). Returns the highest
/// `buffered_reply_bytes` seen meanwhile.
fn storm(proxy: &Memroute, observer: &mut Conn, requests: Vec<u8>) -> u64 {
    let start = Instant::now();
    // The clients stop at `until` (ms after `start`): STORM, moved on while nothing is charged
    // yet (a loaded machine can take longer than STORM to get the clients going), so every
    // round's clients leave with replies charged, as the round needs, or the test says so
    // after DEADLINE.
    let until = Arc::new(AtomicU64::new(STORM.as_millis() as u64));
    let writers: Vec<_> = (0..SLOW_CLIENTS)
        .map(|_| {
            let socket = slow_socket(&proxy.listen);
            let requests = requests.clone();
            let until = until.clone();
            std::thread::spawn(move || pipeline_until(socket, &requests, start, &until))
        })
        .collect();
    let mut peak = 0;
    while start.elapsed() < Duration::from_millis(until.load(Ordering::Relaxed)) {
        peak = peak.max(stat(observer, "buffered_reply_bytes"));
        if peak == 0 && start.elapsed() < DEADLINE {
            let later = (start.elapsed() + STORM).as_millis() as u64;
            until.fetch_max(later, Ordering::Relaxed);
        }
    }
    for writer in writers {
        writer.join().expect("a slow client's thread");
    }
    peak
}

/// A client socket whose receive buffer holds [`SLOW_RCVBUF`] bytes (set before connecting,
/// so the window it offers is small from the start).
fn slow_socket(addr: &str) -> TcpStream {
    let addr: std::net::SocketAddr = addr.parse().expect("listen address");
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(SLOW_RCVBUF).expect("SO_RCVBUF");
    socket.connect(&addr.into()).expect("connect");
    socket.into()
}

/// Writes `requests` again and again until `until` (ms after `start`, which may move on),
/// never reading; a write blocked because memroute stopped reading ends at `until` (a write
/// timeout), wherever it stands in a frame. Then the socket closes with replies unread.
fn pipeline_until(mut socket: TcpStream, requests: &[u8], start: Instant, until: &AtomicU64) {
    loop {
        let until = Duration::from_millis(until.load(Ordering::Relaxed));
        let left = until.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        socket.set_write_timeout(Some(left)).expect("write timeout");
        if socket.write_all(requests).is_err() {
            break;
        }
    }
}
