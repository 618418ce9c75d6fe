//! `proxy.io = "io_uring"` end to end, with real parts: memroute's workers read and write
//! every client and backend socket through their io_uring (the log says so, or the test
//! fails: a silent fallback to epoll would make the rest prove nothing). Pipelining, a
//! multi-get over several servers, values larger than a provided buffer and than the
//! per-connection write cap, a client closing mid-request, a backend killed and
//! restarted, and TLS on both sides (a rustls client and `openssl s_client` in front,
//! `memcached -Z` behind).
//!
//! io_uring is the default, so every other suite runs in this mode too (the conformance
//! scripts of tests/conformance.rs among them, which also run them on epoll);
//! `MEMROUTE_TEST_IO=epoll` runs a suite on epoll (see the harness). The last two tests
//! keep `proxy.io = "epoll"` serving in every run, and the fallback to epoll where a
//! seccomp profile forbids io_uring (as Docker's default one does).
use std::process::{Command, Stdio};
use std::time::Duration;

use memroute_tests::tls::{client_config, Pki, TlsConn};
use memroute_tests::*;

const WAIT: Duration = Duration::from_secs(10);
const URING_LINE: &str = "worker serves its sockets through io_uring";

/// `[proxy]` with io_uring on, `workers` workers, root `main`, and the rest of `toml`.
fn uring_config(listen: &str, workers: usize, rest: &str) -> String {
    format!(
        "[proxy]\nlisten = [\"{listen}\"]\nio = \"io_uring\"\nworkers = {workers}\nroute = \"main\"\n\n{rest}"
    )
}

/// memroute in io_uring mode over `servers` (one pool, md5 ketama), checked to really use
/// io_uring on every worker.
fn start_uring(servers: &[String], workers: usize, pool_extra: &str) -> Memroute {
    let listen = format!("127.0.0.1:{}", free_port());
    let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
    let pool = format!(
        "[pools.main]\nservers = [{}]\nhash = \"md5\"\n{pool_extra}\n",
        servers.join(", ")
    );
    let proxy = Memroute::start(&uring_config(&listen, workers, &pool));
    assert_uring(&proxy, workers);
    proxy
}

fn assert_uring(proxy: &Memroute, workers: usize) {
    assert!(
        proxy.wait_log_count(URING_LINE, workers, WAIT),
        "memroute did not run its workers on io_uring:\n{}",
        proxy.log_text()
    );
}

#[test]
fn pipelined_requests_and_a_multi_get_over_three_servers() {
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let proxy = start_uring(&addrs, 2, "");
    let mut c = proxy.connect();
    let keys = numbered_keys("ur", 300);
    // 300 sets in two writes of 200 and 100, replies read in order.
    c.set_many(&keys, |k| format!("value-of-{k}"));
    // Every server holds some of them: the multi-get below really is split.
    for server in &servers {
        assert!(
            !server.held(&keys).is_empty(),
            "{} holds no key",
            server.addr()
        );
    }
    // 300 gets pipelined in one write, then one 300-key multi-get.
    let mut batch = Vec::new();
    for k in &keys {
        batch.extend_from_slice(format!("get {k}\r\n").as_bytes());
    }
    c.send(&batch);
    for k in &keys {
        let reply = c.read_get_reply();
        let values = parse_values(&reply).unwrap_or_else(|| panic!("get {k}: {}", show(&reply)));
        assert_eq!(values.len(), 1, "get {k}: {}", show(&reply));
        assert_eq!(values[0].0, *k);
        assert_eq!(values[0].2, format!("value-of-{k}").into_bytes());
    }
    c.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    let reply = c.read_get_reply();
    let values = parse_values(&reply).unwrap_or_else(|| panic!("multi-get: {}", show(&reply)));
    let got: Vec<&String> = values.iter().map(|(k, _, _)| k).collect();
    assert_eq!(
        got,
        keys.iter().collect::<Vec<_>>(),
        "keys in request order"
    );
    for (k, _, v) in &values {
        assert_eq!(*v, format!("value-of-{k}").into_bytes());
    }
}

#[test]
fn values_larger_than_the_buffers_go_both_ways_intact() {
    let backend = Memcached::start();
    // Moving megabytes through a debug build on a busy machine can take longer than the
    // default 250 ms backend timeout; this test is about the bytes, not the clock.
    let proxy = start_uring(&[backend.addr()], 1, "timeout = \"10s\"");
    let mut c = proxy.connect();
    // 900 KiB: hundreds of 4 KiB provided buffers in, more than the 256 KiB write cap out.
    let value: Vec<u8> = (0..900 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    let mut set = format!("set large 0 0 {}\r\n", value.len()).into_bytes();
    set.extend_from_slice(&value);
    set.extend_from_slice(b"\r\n");
    // Two of them and a get, in one write.
    let mut both = set.clone();
    both.extend_from_slice(&set);
    both.extend_from_slice(b"get large large\r\n");
    c.send(&both);
    assert_eq!(c.read_line(), b"STORED\r\n");
    assert_eq!(c.read_line(), b"STORED\r\n");
    let reply = c.read_get_reply();
    let values = parse_values(&reply).expect("two values");
    assert_eq!(values.len(), 2);
    assert!(values.iter().all(|(k, _, v)| k == "large" && *v == value));
    assert_eq!(backend.connect().get("large").as_deref(), Some(&value[..]));
}

#[test]
fn a_client_that_closes_mid_request_costs_nobody_else() {
    let backend = Memcached::start();
    let proxy = start_uring(&[backend.addr()], 1, "");
    for _ in 0..20 {
        // Half a data block, half a request line, and a request whose reply nobody reads.
        let mut gone = proxy.connect();
        gone.send(b"set half 0 0 100\r\nonly some of the bytes");
        drop(gone);
        let mut gone = proxy.connect();
        gone.send(b"get a b c");
        drop(gone);
        let mut gone = proxy.connect();
        gone.send(b"set k 0 0 1\r\nv\r\nget k\r\n");
        drop(gone);
    }
    let mut c = proxy.connect();
    c.set("after", b"ok");
    assert_eq!(c.get("after").as_deref(), Some(&b"ok"[..]));
    assert_eq!(
        backend.connect().get("half"),
        None,
        "the half set was never sent on"
    );
    // Every connection closed is a session gone: only ours and the one asking are left.
    proxy.wait_stats("closed sessions counted", WAIT, |stats| {
        stat_u64(stats, "curr_connections") == Some(2)
    });
}

#[test]
fn a_killed_backend_is_marked_down_and_comes_back() {
    let mut servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let proxy = start_uring(&addrs, 1, "");
    let mut c = proxy.connect();
    let keys = numbered_keys("bk", 60);
    c.set_many(&keys, |_| "v".to_string());
    let victim = holder(&servers, &keys[0]);
    let (dead, live): (Vec<&String>, Vec<&String>) =
        keys.iter().partition(|k| holder(&servers, k) == victim);
    assert!(!live.is_empty(), "all keys on one server");
    servers[victim].kill();
    // The io_uring backend connection sees the end of its stream, the reconnect is refused:
    // the server is marked down, as on epoll, and its keys fail fast.
    assert!(
        proxy.wait_log("server marked down", WAIT),
        "no server marked down:\n{}",
        proxy.log_text()
    );
    for (d, l) in dead.iter().zip(live.iter().cycle()) {
        let reply = c.roundtrip_line(format!("get {d}\r\n").as_bytes());
        assert!(reply.starts_with(b"SERVER_ERROR "), "{}", show(&reply));
        assert_eq!(c.get(l).as_deref(), Some(&b"v"[..]));
    }
    servers[victim].restart();
    assert!(
        poll_until(WAIT, || {
            c.roundtrip_line(format!("set {} 0 0 1\r\ny\r\n", dead[0]).as_bytes()) == b"STORED\r\n"
        }),
        "the restarted server never served again:\n{}",
        proxy.log_text()
    );
    assert_eq!(c.get(dead[0]).as_deref(), Some(&b"y"[..]));
}

#[test]
fn tls_on_both_sides_over_io_uring() {
    let pki = Pki::generate();
    let backend = Memcached::start_with_args(
        "127.0.0.1",
        free_port(),
        16,
        Pki::memcached_args(&pki.server),
    );
    let plain = format!("127.0.0.1:{}", free_port());
    let tls = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        "[proxy]\nlisten = [\"{plain}\", {{ address = \"{tls}\", tls = {{ cert = {:?}, key = {:?} }} }}]\n\
         io = \"io_uring\"\nworkers = 2\nroute = \"main\"\n\n\
         [pools.main]\nservers = [{:?}]\ntls = {{ ca = {:?}, server_name = \"localhost\" }}\n",
        pki.server.cert.display().to_string(),
        pki.server.key.display().to_string(),
        backend.addr(),
        pki.ca.display().to_string(),
    );
    let proxy = Memroute::start(&toml);
    assert_uring(&proxy, 2);
    // rustls in front; a 100 KiB value crosses many TLS records and provided buffers.
    let config = client_config(&pki.ca, None);
    let value = "t".repeat(100 * 1024);
    for i in 0..4 {
        let mut c = TlsConn::connect(&tls, &config).expect("handshake");
        let reply = c
            .roundtrip(
                format!("set tk{i} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes(),
                b"\r\n",
            )
            .expect("set");
        assert_eq!(reply, b"STORED\r\n");
        let reply = c
            .roundtrip(format!("get tk{i}\r\n").as_bytes(), b"END\r\n")
            .expect("get");
        assert_eq!(
            reply,
            format!("VALUE tk{i} 0 {}\r\n{value}\r\nEND\r\n", value.len()).into_bytes()
        );
    }
    // What went through the TLS pool is really in the TLS memcached.
    assert_eq!(
        proxy.connect().get("tk3").as_deref(),
        Some(value.as_bytes())
    );
    // openssl s_client in front.
    let mut child = Command::new("openssl")
        .args(["s_client", "-quiet", "-connect", &tls, "-CAfile"])
        .arg(&pki.ca)
        .args(["-servername", "localhost", "-ign_eof"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    std::io::Write::write_all(
        child.stdin.as_mut().expect("stdin"),
        b"get tk0\r\nversion\r\nquit\r\n",
    )
    .expect("write");
    let output = child.wait_with_output().expect("s_client output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("VALUE tk0 0 102400\r\n"), "{stdout}");
    assert!(stdout.contains("VERSION "), "{stdout}");
}

#[test]
fn epoll_mode_still_serves_without_a_ring() {
    let backend = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = uring_config(
        &listen,
        1,
        &format!("[pools.main]\nservers = [{:?}]\n", backend.addr()),
    )
    .replace("io = \"io_uring\"", "io = \"epoll\"");
    let proxy = Memroute::start(&toml);
    let mut c = proxy.connect();
    let keys = numbered_keys("ep", 50);
    c.set_many(&keys, |k| k.to_string());
    c.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    let values = parse_values(&c.read_get_reply()).expect("values");
    assert_eq!(values.len(), keys.len());
    assert_eq!(proxy.log_count(URING_LINE), 0, "{}", proxy.log_text());
}

/// Runs `argv` with `io_uring_setup` denied (EPERM) by a seccomp filter, as Docker's and
/// containerd's default profiles deny it. x86_64 syscall number; the filter is installed
/// with `no_new_privs`, so it needs no privilege.
const DENY_IO_URING: &str = r#"
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
IO_URING_SETUP = 425
EPERM = 1
def ins(code, jt, jf, k): return struct.pack("HBBI", code, jt, jf, k)
prog = b"".join([
    ins(0x20, 0, 0, 0),                      # ld [nr]
    ins(0x15, 0, 1, IO_URING_SETUP),         # jeq io_uring_setup
    ins(0x06, 0, 0, 0x00050000 | EPERM),     # ret ERRNO(EPERM)
    ins(0x06, 0, 0, 0x7fff0000),             # ret ALLOW
])
buf = ctypes.create_string_buffer(prog)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
    sys.exit("seccomp: " + os.strerror(ctypes.get_errno()))
os.execv(sys.argv[1], sys.argv[1:])
"#;

#[test]
fn where_io_uring_is_forbidden_workers_fall_back_to_epoll_and_say_so_once() {
    assert_eq!(
        std::env::consts::ARCH,
        "x86_64",
        "the seccomp filter names x86_64's io_uring_setup"
    );
    let backend = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = uring_config(
        &listen,
        2,
        &format!("[pools.main]\nservers = [{:?}]\n", backend.addr()),
    );
    let dir = TempDir::new("uring-denied");
    let config = dir.write("memroute.toml", &toml);
    let mut command = Command::new("python3");
    command
        .args(["-c", DENY_IO_URING])
        .arg(memroute_binary())
        .arg("--config")
        .arg(&config);
    let proxy = Memroute::start_command(command, &toml, config, dir);
    let mut c = proxy.connect();
    c.set("fallback", b"served");
    assert_eq!(c.get("fallback").as_deref(), Some(&b"served"[..]));
    let fallback = "io_uring cannot be set up here; serving with epoll";
    assert!(proxy.wait_log(fallback, WAIT), "{}", proxy.log_text());
    // Two workers, one line; and no worker claims to use io_uring.
    assert_eq!(proxy.log_count(fallback), 1, "{}", proxy.log_text());
    assert_eq!(proxy.log_count(URING_LINE), 0, "{}", proxy.log_text());
    assert!(
        proxy.log_text().contains("Operation not permitted"),
        "the error is named: {}",
        proxy.log_text()
    );
}
