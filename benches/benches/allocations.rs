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
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
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
        round_trip(&mut stream, set.as_bytes(), b"STORED\r\n", &mut buffer);
    }
    (proxy, stream, keys)
}

/// Sends `request` and reads until the reply ends with `end`, allocation-free.
fn round_trip(stream: &mut TcpStream, request: &[u8], end: &[u8], buffer: &mut [u8]) {
    stream.write_all(request).expect("write");
    let mut filled = 0;
    loop {
        let n = stream.read(&mut buffer[filled..]).expect("read");
        assert!(n > 0, "connection closed");
        filled += n;
        if buffer[..filled].ends_with(end) {
            return;
        }
        // An error line in place of the reply would otherwise leave this loop waiting forever.
        let error = [&b"SERVER_ERROR"[..], b"CLIENT_ERROR", b"ERROR\r\n"];
        if buffer[..filled].ends_with(b"\r\n")
            && error.iter().any(|e| buffer[..filled].starts_with(e))
        {
            panic!(
                "error reply: {}",
                String::from_utf8_lossy(&buffer[..filled])
            );
        }
    }
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
fn count(stream: &mut TcpStream, request: &[u8], end: &[u8], requests: usize) -> Counted {
    let mut buffer = vec![0u8; 1 << 20];
    for _ in 0..requests / 10 {
        round_trip(stream, request, end, &mut buffer);
    }
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let started = Instant::now();
    for _ in 0..requests {
        round_trip(stream, request, end, &mut buffer);
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
            let counted = count(&mut stream, request, end, requests);
            println!(
                "{:<44}{:>14.2}{:>20.2}",
                format!("{label} [{name}]"),
                counted.busy,
                counted.idle
            );
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
        let counted = count(&mut stream, request, end, REQUESTS / 4);
        print_row(&format!("  {label}"), &counted);
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
        let counted = count(&mut stream, &multi, b"END\r\n", REQUESTS);
        print_row(&format!("  {name}"), &counted);
        // The same route's single-key get (a hit): the fast paths that skip the executor
        // (a failover's or warm-up's first pool, a shadow's or random route's pool).
        let single = format!("get {}\r\n", keys[0]).into_bytes();
        let counted = count(&mut stream, &single, b"END\r\n", REQUESTS);
        print_row(&format!("  {name}, 1-key get"), &counted);
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
        let counted = count(&mut stream, &set, b"STORED\r\n", REQUESTS);
        print_row(&format!("  {name}"), &counted);
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
        let counted = count(&mut stream, request, end, REQUESTS);
        print_row(&format!("  {label}"), &counted);
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
        let counted = count(&mut stream, request, end, REQUESTS);
        print_row(&format!("{label} [{name}]"), &counted);
    }
}
