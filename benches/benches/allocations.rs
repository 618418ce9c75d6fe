//! Heap allocations per request on memroute's request path, counted, not timed.
//!
//! Starts one real `memcached` and memroute in this process (one worker), warms up, then
//! sends N requests of each kind over one client connection and counts every heap
//! allocation the process makes meanwhile. The client side allocates nothing in the window
//! (requests are pre-built, replies are read into a fixed buffer), so the count is the
//! proxy's. Background work (the control thread, health probes) is measured over an idle
//! window of the same length and reported beside it.
//!
//! `cargo bench -p memroute-benches --bench allocations` (needs `memcached` on PATH).
//!
//! Targets (issue 10): 0 per single-key request in steady state, at most 1 per server leg
//! of a multi-get.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counts allocations and forwards everything to the system allocator. `GlobalAlloc` is
/// an unsafe trait; this impl adds nothing but a relaxed counter increment.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

#[allow(unsafe_code)]
// SAFETY: every method forwards to `System` with the caller's own arguments.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const REQUESTS: usize = 20_000;

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
    }
}

/// Allocations per request over `REQUESTS` round trips, and the idle rate over as long.
fn count(stream: &mut TcpStream, request: &[u8], end: &[u8]) -> (f64, f64) {
    let mut buffer = vec![0u8; 1 << 20];
    for _ in 0..2_000 {
        round_trip(stream, request, end, &mut buffer);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let started = Instant::now();
    for _ in 0..REQUESTS {
        round_trip(stream, request, end, &mut buffer);
    }
    let elapsed = started.elapsed();
    let busy = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    std::thread::sleep(elapsed);
    let idle = ALLOCATIONS.load(Ordering::Relaxed) - before;
    (busy as f64 / REQUESTS as f64, idle as f64 / REQUESTS as f64)
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
            "[proxy]\nlisten = [\"127.0.0.1:{}\"]\nworkers = 1\n[pools.main]\nservers = [{}]\n",
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
        let config = memroute_config::parse(&text).expect("bench config");
        let proxy = memroute_proxy::start(config).expect("start memroute");
        let address = proxy.local_addresses[0].clone();
        let port: u16 = address
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("proxy port");
        let mut stream = connect(port);
        let mut buffer = vec![0u8; 1 << 16];
        let keys: Vec<String> = (0..20).map(|i| format!("alloc:key:{i}")).collect();
        for key in &keys {
            let set = format!("set {key} 0 0 64\r\n{}\r\n", "v".repeat(64));
            round_trip(&mut stream, set.as_bytes(), b"STORED\r\n", &mut buffer);
        }
        let get = b"get alloc:key:0\r\n".to_vec();
        let set = format!("set alloc:key:0 0 0 64\r\n{}\r\n", "v".repeat(64)).into_bytes();
        let multi = format!("get {}\r\n", keys.join(" ")).into_bytes();
        let cases: [(&str, &[u8], &[u8]); 3] = [
            ("get, 1 key (hit)", &get, b"END\r\n"),
            ("set, 64-byte value", &set, b"STORED\r\n"),
            ("get, 20 keys", &multi, b"END\r\n"),
        ];
        for (label, request, end) in cases {
            let (busy, idle) = count(&mut stream, request, end);
            println!(
                "{:<44}{busy:>14.2}{idle:>20.2}",
                format!("{label} [{name}]")
            );
        }
        drop(stream);
        proxy.shutdown();
        proxy.join();
    }
}
