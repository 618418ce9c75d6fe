//! Heap allocations per request on memroute's request path, counted, not timed.
//!
//! Starts one real `memcached` and memroute in this process (one worker), warms up, then
//! sends N requests of each kind over one client connection and counts every heap
//! allocation the process makes meanwhile. The client side allocates nothing in the window
//! (requests are pre-built, replies are read into a fixed buffer), so the count is the
//! proxy's. Background work (the control thread, health probes) is measured over an idle
//! window of the same length and reported beside it.
//!
//! Each server setup is measured over text requests, then over binary ones (a get, a set
//! and a noop, a run of getkq and a noop) on a binary connection.
//!
//! `cargo bench -p memroute-benches --bench allocations` (needs `memcached` on PATH).
//!
//! Targets: 0 per single-key request in steady state, at most 1 per server leg
//! of a multi-get. For a 10,000-key `get` (served while holding the line only once) it also reports the peak of live heap bytes above the level before the window,
//! per key: every key misses, so no value bytes are counted, only the line, its parsed
//! keys, the per-key bookkeeping and the sub-requests.
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Counts allocations and live bytes, and forwards everything to the system allocator.
/// `GlobalAlloc` is an unsafe trait; this impl adds nothing but relaxed counter updates.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Heap bytes allocated and not yet freed, and the most of them seen since `PEAK` was reset.
static LIVE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes as i64, Ordering::Relaxed) + bytes as i64;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    LIVE.fetch_sub(bytes as i64, Ordering::Relaxed);
}

#[allow(unsafe_code)]
// SAFETY: every method forwards to `System` with the caller's own arguments.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        grew(layout.size());
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        shrank(layout.size());
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // Counted as the new block before the old one goes: realloc may copy.
        grew(size);
        shrank(layout.size());
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const REQUESTS: usize = 20_000;
/// Keys of the large multi-get, and how many of them are sent.
const HUGE: usize = 10_000;
const HUGE_REQUESTS: usize = 200;

/// A read that gets no byte for this long says so on stderr (with the case and what the
/// servers counted) and reads on; after [`STALLED`] without a byte the bench fails with
/// the same evidence. Every pool here has a 10 s timeout, so memroute has answered long
/// before (a `SERVER_ERROR` at worst): a reply still missing then is a stall, not load.
const SLOW: Duration = Duration::from_secs(20);
const STALLED: Duration = Duration::from_secs(120);

/// The memcached ports, for the evidence a stall prints.
static SERVER_PORTS: OnceLock<Vec<u16>> = OnceLock::new();

struct Memcached(Child);

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

fn connect(port: u16) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => {
                stream.set_nodelay(true).expect("nodelay");
                // Set once, outside every measured window: a read that gets nothing for
                // SLOW returns, so a stall is reported rather than waited on forever.
                stream.set_read_timeout(Some(SLOW)).expect("read timeout");
                return stream;
            }
            Err(error) if Instant::now() > deadline => panic!("cannot connect to {port}: {error}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Starts memroute in this process on `config_text`, connects one client to it and sets the
/// 20 keys every multi-get here asks for (64-byte values); returns the proxy, the client
/// and the keys.
fn start_with_keys(config_text: &str) -> (memroute_control::ProxyHandle, TcpStream, Vec<String>) {
    let config = memroute_config::parse(config_text).expect("bench config");
    let proxy = memroute_control::start(config).expect("start memroute");
    let port: u16 = proxy.local_addresses[0]
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("proxy port");
    let mut stream = connect(port);
    let mut buffer = vec![0u8; 1 << 20];
    let keys: Vec<String> = (0..20).map(|i| format!("alloc:key:{i}")).collect();
    for key in &keys {
        let set = format!("set {key} 0 0 64\r\n{}\r\n", "v".repeat(64));
        round_trip(
            &mut stream,
            "set the keys",
            set.as_bytes(),
            b"STORED\r\n",
            &mut buffer,
        );
    }
    (proxy, stream, keys)
}

/// Sends `request` (of `case`) and reads until the reply ends with `end`, allocation-free
/// unless it stalls (`SLOW`, `STALLED`).
fn round_trip(stream: &mut TcpStream, case: &str, request: &[u8], end: &[u8], buffer: &mut [u8]) {
    stream.write_all(request).expect("write");
    let mut filled = 0;
    let mut silent_reads = 0u32;
    loop {
        let n = match stream.read(&mut buffer[filled..]) {
            Ok(n) => n,
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                silent_reads += 1;
                let waited = SLOW * silent_reads;
                let evidence = stall_evidence(case, request, &buffer[..filled], waited);
                assert!(waited < STALLED, "stalled: {evidence}");
                eprintln!("slow: {evidence}");
                continue;
            }
            // A read with a timeout is not restarted after the process was stopped and
            // continued (a debugger attaching to take backtraces, SIGSTOP): read again.
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => panic!("read in {case}: {error}"),
        };
        assert!(n > 0, "connection closed in {case}");
        silent_reads = 0;
        filled += n;
        if buffer[..filled].ends_with(end) {
            return;
        }
        // An error in place of the reply never ends as `end` does: fail at once, or this
        // loop would wait for bytes that never come. memroute answers a text request that
        // failed (a multi-get whose batch failed too) with one error line, a binary one
        // with a response whose status is not 0.
        let error = [&b"SERVER_ERROR"[..], b"CLIENT_ERROR", b"ERROR\r\n"];
        if buffer[..filled].ends_with(b"\r\n")
            && error.iter().any(|e| buffer[..filled].starts_with(e))
        {
            panic!(
                "error reply in {case}: {}",
                String::from_utf8_lossy(&buffer[..filled])
            );
        }
        if let Some(status) = binary_error(&buffer[..filled]) {
            panic!(
                "binary error response (status {status:#06x}) in {case}: {:?}",
                String::from_utf8_lossy(&buffer[..filled])
            );
        }
    }
}

/// The status of the first binary response in `bytes` that is not a success (0), looking
/// at each whole header (24 bytes, status at 6, body length at 8); `None` for text.
fn binary_error(bytes: &[u8]) -> Option<u16> {
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + 24) {
        if header[0] != 0x81 {
            return None;
        }
        let status = u16::from_be_bytes([header[6], header[7]]);
        if status != 0 {
            return Some(status);
        }
        let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
        at += 24 + body as usize;
    }
    None
}

/// What a stalled round trip of `case` shows: the request, the reply bytes so far, and
/// each memcached's counts (so two reports a while apart say whether anything moved).
fn stall_evidence(case: &str, request: &[u8], got: &[u8], waited: Duration) -> String {
    let shown = |bytes: &[u8], from_end: bool| {
        let cut = bytes.len().min(160);
        let part = if from_end {
            &bytes[bytes.len() - cut..]
        } else {
            &bytes[..cut]
        };
        format!(
            "{:?} ({} bytes)",
            String::from_utf8_lossy(part),
            bytes.len()
        )
    };
    format!(
        "case {case:?}: no reply byte for {waited:?} (pid {}); request {}; reply so far, its end {}; memcached: {}",
        std::process::id(),
        shown(request, false),
        shown(got, true),
        memcached_stats()
    )
}

/// A few of each memcached's `stats` counters, one server after another.
fn memcached_stats() -> String {
    const SHOWN: [&str; 6] = [
        "curr_connections",
        "cmd_get",
        "get_hits",
        "get_misses",
        "cmd_set",
        "curr_items",
    ];
    let ports = SERVER_PORTS.get().map(Vec::as_slice).unwrap_or_default();
    let one = |port: u16| -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"stats\r\n")?;
        let mut text = Vec::new();
        let mut chunk = [0u8; 4096];
        while !text.ends_with(b"END\r\n") {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            text.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&text).into_owned();
        let counts: Vec<String> = text
            .lines()
            .filter_map(|line| {
                let mut words = line.split(' ').skip(1);
                let (name, value) = (words.next()?, words.next()?);
                SHOWN.contains(&name).then(|| format!("{name}={value}"))
            })
            .collect();
        Ok(counts.join(" "))
    };
    ports
        .iter()
        .map(|&port| match one(port) {
            Ok(counts) => format!("[{port}: {counts}]"),
            Err(error) => format!("[{port}: stats failed: {error}]"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What one kind of request cost over its measured window.
struct Counted {
    /// Allocations per request.
    busy: f64,
    /// Allocations per request-time while idle (background work).
    idle: f64,
    /// Peak live heap bytes above the level before the window.
    peak: i64,
}

/// Allocations per request over `requests` round trips (after a tenth as many of warm-up),
/// the idle rate over as long, and the peak of live bytes in the window.
fn count(
    stream: &mut TcpStream,
    case: &str,
    request: &[u8],
    end: &[u8],
    requests: usize,
) -> Counted {
    let mut buffer = vec![0u8; 1 << 20];
    for _ in 0..requests / 10 {
        round_trip(stream, case, request, end, &mut buffer);
    }
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let started = Instant::now();
    for _ in 0..requests {
        round_trip(stream, case, request, end, &mut buffer);
    }
    let elapsed = started.elapsed();
    let busy = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let peak = PEAK.load(Ordering::Relaxed) - base;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    std::thread::sleep(elapsed);
    let idle = ALLOCATIONS.load(Ordering::Relaxed) - before;
    Counted {
        busy: busy as f64 / requests as f64,
        idle: idle as f64 / requests as f64,
        peak,
    }
}

fn main() {
    let servers: Vec<(u16, Memcached)> = (0..4)
        .map(|_| {
            let port = free_port();
            let mut command = Command::new("memcached");
            // memcached refuses to run as root without -u and ignores -u otherwise.
            command.args([
                "-l",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "0",
                "-t",
                "1",
            ]);
            command.args(["-u", "nobody"]);
            let child = command
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start memcached (is it installed?)");
            (port, Memcached(child))
        })
        .collect();
    for (port, _) in &servers {
        drop(connect(*port));
    }
    let _ = SERVER_PORTS.set(servers.iter().map(|(port, _)| *port).collect());
    let list = |ports: &[(u16, Memcached)]| {
        ports
            .iter()
            .map(|(p, _)| format!("\"127.0.0.1:{p}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let config = |servers: &[(u16, Memcached)]| {
        format!(
            "[proxy]\nlisten = [\"127.0.0.1:{}\"]\nworkers = 1\n[pools.main]\nservers = [{}]\ntimeout = \"10s\"\n",
            free_port(),
            list(servers)
        )
    };
    let single = config(&servers[..1]);
    let sharded = config(&servers);
    println!(
        "allocations per request (memroute, 1 worker, {REQUESTS} requests after 2,000 of warm-up)"
    );
    println!(
        "{:<44}{:>14}{:>20}",
        "request", "per request", "idle (same time)"
    );
    for (name, text) in [("1 server", single), ("4 servers", sharded)] {
        let (proxy, mut stream, keys) = start_with_keys(&text);
        let get = b"get alloc:key:0\r\n".to_vec();
        let set = format!("set alloc:key:0 0 0 64\r\n{}\r\n", "v".repeat(64)).into_bytes();
        let multi = format!("get {}\r\n", keys.join(" ")).into_bytes();
        // Keys nobody set: the reply is END, so the peak is the request's own bytes.
        let huge_keys: Vec<String> = (0..HUGE).map(|i| format!("absent:{i}")).collect();
        let huge = format!("get {}\r\n", huge_keys.join(" ")).into_bytes();
        let cases: [(&str, &[u8], &[u8], usize); 4] = [
            ("get, 1 key (hit)", &get, b"END\r\n", REQUESTS),
            ("set, 64-byte value", &set, b"STORED\r\n", REQUESTS),
            ("get, 20 keys", &multi, b"END\r\n", REQUESTS),
            (
                "get, 10,000 keys (misses)",
                &huge,
                b"END\r\n",
                HUGE_REQUESTS,
            ),
        ];
        for (label, request, end, requests) in cases {
            let case = format!("{label} [{name}]");
            let counted = count(&mut stream, &case, request, end, requests);
            println!("{:<44}{:>14.2}{:>20.2}", case, counted.busy, counted.idle);
            if request.len() == huge.len() {
                println!(
                    "    line {} bytes; peak live heap above the start of the window: {} bytes ({:.1} per key, {:.2}x the line)",
                    huge.len(),
                    counted.peak,
                    counted.peak as f64 / HUGE as f64,
                    counted.peak as f64 / huge.len() as f64
                );
            }
        }
        binary_cases(&proxy, &keys, name);
        drop(stream);
        proxy.shutdown();
        proxy.join();
    }
    policy_routes(&list(&servers));
    policy_writes(&list(&servers));
    routing_prefixes(&list(&servers));
    resize_window(&list(&servers[..3]), &list(&servers));
}

/// The same requests while a resize window runs (3 servers, then the fourth added): every
/// request takes the general walk, and a miss of a key that moved also asks its old owner.
/// Reported, not a target: a window lasts minutes after a change.
fn resize_window(before: &str, after: &str) {
    let port = free_port();
    let config = |servers: &str| {
        format!(
            "[proxy]\nlisten = [\"127.0.0.1:{port}\"]\nworkers = 1\n[pools.main]\n\
             servers = [{servers}]\ntimeout = \"10s\"\nresize_window = \"1h\"\n"
        )
    };
    let (proxy, mut stream, keys) = start_with_keys(&config(before));
    proxy
        .reload(memroute_config::parse(&config(after)).expect("bench config"))
        .expect("reload with a fourth server");
    let get = b"get alloc:key:0\r\n".to_vec();
    let set = format!("set alloc:key:0 0 0 64\r\n{}\r\n", "v".repeat(64)).into_bytes();
    let multi = format!("get {}\r\n", keys.join(" ")).into_bytes();
    // Keys nobody set: every one misses, and those that moved are asked of the old owner.
    let absent: Vec<String> = (0..20).map(|i| format!("absent:{i}")).collect();
    let misses = format!("get {}\r\n", absent.join(" ")).into_bytes();
    println!("during a resize window (3 servers + 1 added)");
    let cases: [(&str, &[u8], &[u8]); 4] = [
        ("get, 1 key (hit)", &get, b"END\r\n"),
        ("set, 64-byte value", &set, b"STORED\r\n"),
        ("get, 20 keys (hits)", &multi, b"END\r\n"),
        ("get, 20 keys (misses)", &misses, b"END\r\n"),
    ];
    for (label, request, end) in cases {
        let case = format!("  {label}");
        let counted = count(&mut stream, &case, request, end, REQUESTS / 4);
        print_row(&case, &counted);
    }
    drop(stream);
    proxy.shutdown();
    proxy.join();
}

/// The 20-key multi-get through each kind of policy route, over two pools of the same 4
/// servers (`main` answers every key): they are batched per server as a plain pool's are,
/// so they should allocate what the plain pool's does.
fn policy_routes(servers: &str) {
    let routes: [(&str, &str); 8] = [
        ("failover", "[routes.root]\ntype = \"failover\"\nchildren = [\"main\", \"spare\"]\n"),
        (
            "prefix -> failover",
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"zz:\" = \"main\" }\ndefault = \"fo\"\n\
             [routes.fo]\ntype = \"failover\"\nchildren = [\"main\", \"spare\"]\n",
        ),
        (
            "shadow (fraction 0)",
            "[routes.root]\ntype = \"shadow\"\nprimary = \"main\"\nshadow = \"spare\"\nfraction = 0.0\n",
        ),
        (
            "shadow (fraction 0.1)",
            "[routes.root]\ntype = \"shadow\"\nprimary = \"main\"\nshadow = \"spare\"\nfraction = 0.1\n",
        ),
        ("warm-up (cold hits)", "[routes.root]\ntype = \"warm-up\"\ncold = \"main\"\nwarm = \"spare\"\n"),
        ("random", "[routes.root]\ntype = \"random\"\nchildren = [\"main\", \"spare\"]\n"),
        (
            "replicated, reads failover",
            "[routes.root]\ntype = \"replicated\"\nchildren = [\"main\", \"spare\"]\nreads = \"failover\"\n",
        ),
        (
            "replicated, reads nearest",
            "[routes.root]\ntype = \"replicated\"\nchildren = [\"main\", \"spare\"]\nreads = \"nearest\"\n",
        ),
    ];
    println!("get, 20 keys, through a policy route over 4 servers");
    for (name, route) in routes {
        let text = two_pools(servers, route);
        let (proxy, mut stream, keys) = start_with_keys(&text);
        let multi = format!("get {}\r\n", keys.join(" ")).into_bytes();
        let case = format!("  {name}");
        let counted = count(&mut stream, &case, &multi, b"END\r\n", REQUESTS);
        print_row(&case, &counted);
        // The same route's single-key get (a hit): the fast paths that skip the executor
        // (a failover's or warm-up's first pool, a shadow's or random route's pool).
        let single = format!("get {}\r\n", keys[0]).into_bytes();
        let case = format!("  {name}, 1-key get");
        let counted = count(&mut stream, &case, &single, b"END\r\n", REQUESTS);
        print_row(&case, &counted);
        drop(stream);
        proxy.shutdown();
        proxy.join();
    }
}

/// A single-key set through replicated and failover routes over two pools of the same 4
/// servers (a replicated or failover write should cost about what a plain pool's does,
/// plus the second backend write). A plain pool's set is the
/// `set, 64-byte value [4 servers]` line above. Expected (docs/benchmarks.md, "Allocations
/// per request"): all-sync, all-majority (2 replicas) and failover 0.00; all-initial and
/// all-async 1.00, the one task that finishes the replicas still writing when the client is
/// answered.
fn policy_writes(servers: &str) {
    let replicated = |writes: &str| {
        format!(
            "[routes.root]\ntype = \"replicated\"\nchildren = [\"main\", \"spare\"]\nwrites = \"{writes}\"\n"
        )
    };
    let routes: [(&str, String); 5] = [
        ("replicated all-sync", replicated("all-sync")),
        ("replicated all-initial", replicated("all-initial")),
        ("replicated all-majority", replicated("all-majority")),
        ("replicated all-async", replicated("all-async")),
        (
            "failover",
            "[routes.root]\ntype = \"failover\"\nchildren = [\"main\", \"spare\"]\n".to_string(),
        ),
    ];
    println!("set, 64-byte value, through a policy route over 4 servers");
    for (name, route) in routes {
        let text = two_pools(servers, &route);
        let (proxy, mut stream, _) = start_with_keys(&text);
        let set = format!("set alloc:key:0 0 0 64\r\n{}\r\n", "v".repeat(64)).into_bytes();
        let case = format!("  {name}");
        let counted = count(&mut stream, &case, &set, b"STORED\r\n", REQUESTS);
        print_row(&case, &counted);
        drop(stream);
        proxy.shutdown();
        proxy.join();
    }
}

/// Plain keys through a config that declares routing prefixes (one branch on the key's
/// first byte: the same as without), then keys carrying a prefix (the prefix is cut
/// into a new request and put back into the reply: a few allocations, reported, not a
/// target).
fn routing_prefixes(servers: &str) {
    let text = format!(
        "[proxy]\nlisten = [\"127.0.0.1:{}\"]\nworkers = 1\nrouting_prefix = \"/here/web/\"\n\
         [pools.main]\nservers = [{servers}]\ntimeout = \"10s\"\nrouting_prefixes = [\"/here/web/\"]\n\
         [pools.spare]\nservers = [{servers}]\ntimeout = \"10s\"\nrouting_prefixes = [\"/there/web/\"]\n",
        free_port()
    );
    let (proxy, mut stream, keys) = start_with_keys(&text);
    println!("through a config with routing prefixes, 4 servers");
    let get = format!("get {}\r\n", keys[0]).into_bytes();
    let set = format!("set {} 0 0 64\r\n{}\r\n", keys[0], "v".repeat(64)).into_bytes();
    let multi = format!("get {}\r\n", keys.join(" ")).into_bytes();
    let prefixed = format!("get /here/web/{}\r\n", keys[0]).into_bytes();
    let prefixed_keys: Vec<String> = keys.iter().map(|k| format!("/here/web/{k}")).collect();
    let prefixed_multi = format!("get {}\r\n", prefixed_keys.join(" ")).into_bytes();
    let cases: [(&str, &[u8], &[u8]); 5] = [
        ("plain key, get (hit)", &get, b"END\r\n"),
        ("plain key, set", &set, b"STORED\r\n"),
        ("plain keys, get, 20 keys", &multi, b"END\r\n"),
        ("prefixed key, get (hit)", &prefixed, b"END\r\n"),
        ("prefixed keys, get, 20 keys", &prefixed_multi, b"END\r\n"),
    ];
    for (label, request, end) in cases {
        let case = format!("  {label}");
        let counted = count(&mut stream, &case, request, end, REQUESTS);
        print_row(&case, &counted);
    }
    drop(stream);
    proxy.shutdown();
    proxy.join();
}

/// memroute (one worker) with the root `route` over two pools, `main` and `spare`, of the
/// same `servers`.
fn two_pools(servers: &str, route: &str) -> String {
    format!(
        "[proxy]\nlisten = [\"127.0.0.1:{}\"]\nworkers = 1\nroute = \"root\"\n\
         [pools.main]\nservers = [{servers}]\ntimeout = \"10s\"\n[pools.spare]\nservers = [{servers}]\ntimeout = \"10s\"\n{route}",
        free_port()
    )
}

fn print_row(label: &str, counted: &Counted) {
    println!("{label:<44}{:>14.2}{:>20.2}", counted.busy, counted.idle);
}

/// Binary protocol opcodes the binary rows send.
const BINARY_GET: u8 = 0x00;
const BINARY_SET: u8 = 0x01;
const BINARY_NOOP: u8 = 0x0a;
const BINARY_GETKQ: u8 = 0x0d;
/// The noop's opaque, which ends each batch of binary responses.
const NOOP_OPAQUE: u32 = 0xfeed_face;

/// A binary request frame.
fn binary_frame(opcode: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    let body = (key.len() + extras.len() + value.len()) as u32;
    let mut frame = vec![0x80, opcode];
    frame.extend_from_slice(&(key.len() as u16).to_be_bytes());
    frame.push(extras.len() as u8);
    // Raw data type, vbucket 0.
    frame.extend_from_slice(&[0, 0, 0]);
    frame.extend_from_slice(&body.to_be_bytes());
    frame.extend_from_slice(&opaque.to_be_bytes());
    frame.extend_from_slice(&0u64.to_be_bytes());
    frame.extend_from_slice(extras);
    frame.extend_from_slice(key);
    frame.extend_from_slice(value);
    frame
}

/// The binary protocol's rows, over a binary connection to the same proxy: a get hit, a set
/// (then a noop, whose response ends the reply), and 20 getkq hits closed by a noop (one
/// text multi-get inside, so one allocation per batch as a text multi-get has).
fn binary_cases(proxy: &memroute_control::ProxyHandle, keys: &[String], name: &str) {
    let port: u16 = proxy.local_addresses[0]
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("proxy port");
    let mut stream = connect(port);
    let value = vec![b'v'; 64];
    // A noop response ends with its opaque and a zero CAS.
    let mut noop_end = NOOP_OPAQUE.to_be_bytes().to_vec();
    noop_end.extend_from_slice(&0u64.to_be_bytes());
    let noop = binary_frame(BINARY_NOOP, b"", b"", b"", NOOP_OPAQUE);
    let get = binary_frame(BINARY_GET, keys[0].as_bytes(), b"", b"", 7);
    // Flags and expiry, both 0.
    let mut set = binary_frame(BINARY_SET, keys[0].as_bytes(), &[0; 8], &value, 8);
    set.extend_from_slice(&noop);
    let mut getkq = Vec::new();
    for key in keys {
        getkq.extend_from_slice(&binary_frame(BINARY_GETKQ, key.as_bytes(), b"", b"", 9));
    }
    getkq.extend_from_slice(&noop);
    // A get's response ends with the value the text rows set.
    let cases: [(&str, &[u8], &[u8]); 3] = [
        ("binary get, 1 key (hit)", &get, &value),
        ("binary set, 64-byte value, + noop", &set, &noop_end),
        ("binary 20 x getkq + noop", &getkq, &noop_end),
    ];
    for (label, request, end) in cases {
        let case = format!("{label} [{name}]");
        let counted = count(&mut stream, &case, request, end, REQUESTS);
        print_row(&case, &counted);
    }
}
