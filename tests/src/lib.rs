//! Test support for memroute's end-to-end tests: real processes and a tiny blocking client.
//!
//! ```text
//!   test ──Conn──> Memroute (the built binary) ──> Memcached (real, on a free port)
//!        ──Conn──> Nutcracker (real twemproxy) ──> same Memcached
//!        ──Conn──> Memcached (direct, the reference for differential tests)
//! ```
//!
//! Every process is killed on Drop, so a panicking test leaves nothing behind. Readiness is
//! decided by the process itself (its port accepts, or memroute prints `memroute ready`), never
//! by sleeping; every wait has a deadline and every socket read a timeout.
#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test, with its message

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod scripts;
pub mod tls;

/// Where `scripts/test` collects the tests that could not run here (one line each).
pub const SKIP_LOG_VAR: &str = "MEMROUTE_SKIP_LOG";

/// Records that `test` did not run, and why: said on stderr, and appended to the file
/// named by `MEMROUTE_SKIP_LOG`, which `scripts/test` counts and lists in its summary, so a
/// skipped test never reads as a pass.
pub fn skipped(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os(SKIP_LOG_VAR) {
        let line = format!("{test}: {}\n", reason.replace('\n', " "));
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(line.as_bytes()));
        if let Err(error) = appended {
            panic!("cannot record the skip of {test} in {path:?}: {error}");
        }
    }
}

/// How long any process gets to become ready.
pub const START_DEADLINE: Duration = Duration::from_secs(10);
/// Socket read/write timeout: a reply that takes longer than this is a failure, not a wait.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between readiness polls. This is a poll interval, not synchronisation: readiness is
/// decided by the connect succeeding, and the loop gives up at its deadline.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// A TCP port free on 127.0.0.1 and reserved for this test process until it exits.
///
/// Two races made a port that was free a moment ago taken when memcached or memroute bound it
/// (CI saw memcached exit with "Address already in use"):
/// - ports come from below the kernel's ephemeral range, so no client connection of any test
///   (nor memroute's backend connections) can take one as its local port;
/// - test binaries run in parallel, so each port is reserved across processes by an exclusive
///   lock on a file named after it, held until this process exits (the kernel drops the lock
///   then, whatever way the process ends). Ports handed out by this process are never handed
///   out twice, so threads of one binary cannot collide either.
pub fn free_port() -> u16 {
    static HELD: Mutex<Vec<(u16, std::fs::File)>> = Mutex::new(Vec::new());
    const LOWEST: u16 = 10_000;
    let below = ephemeral_port_range_start();
    let span = u32::from(below.saturating_sub(LOWEST)).max(1);
    let dir = std::env::temp_dir().join("memroute-tests-ports");
    std::fs::create_dir_all(&dir).expect("create the port reservation directory");
    let mut held = HELD.lock().unwrap();
    // Start where another process is unlikely to: at a point drawn from the pid and the clock.
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.subsec_nanos());
    for step in 0..span {
        let port =
            LOWEST + ((seed.wrapping_mul(2_654_435_761) >> 7).wrapping_add(step) % span) as u16;
        if held.iter().any(|(given, _)| *given == port) {
            continue;
        }
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
        else {
            continue;
        };
        if file.try_lock().is_err() {
            continue; // another test process holds it
        }
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue; // something outside the tests listens there
        }
        held.push((port, file));
        return port;
    }
    panic!("no free port in {LOWEST}..{below} on 127.0.0.1");
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`, 32768 by default).
fn ephemeral_port_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A loopback address 127.0.0.X (X >= 2) on which `port` is free, for pools whose servers all
/// listen on the same port (twemproxy's port-11211 identity rule). Each X is handed out once.
pub fn free_loopback_host(port: u16) -> String {
    static NEXT: AtomicU8 = AtomicU8::new(2);
    loop {
        let x = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(x < 255, "ran out of 127.0.0.X addresses");
        let ip = Ipv4Addr::new(127, 0, 0, x);
        if TcpListener::bind((ip, port)).is_ok() {
            return ip.to_string();
        }
    }
}

/// A scratch directory removed on Drop (configs, logs).
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("memroute-tests-{}-{tag}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        TempDir { path }
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let file = self.path.join(name);
        std::fs::write(&file, contents).unwrap();
        file
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Fails with a clear message when a program the tests need is not installed.
pub fn require_program(name: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(found, "`{name}` is not installed: run scripts/test (it installs memcached and nutcracker) or `apt-get install -y memcached nutcracker`");
}

/// Where program `name` is: the first executable file of that name on `PATH`, else in the
/// sbin directories a non-root user's `PATH` often lacks (Debian puts dnsmasq in /usr/sbin).
/// Looked up in-process, so a busy machine failing to fork a shell does not read as "not
/// installed".
pub fn find_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Waits until `addr` accepts a TCP connection; panics (with the log) if the child exits first
/// or the deadline passes.
fn wait_accepting(child: &mut Child, addr: &str, what: &str, log: Option<&Path>) {
    let sock: SocketAddr = addr.parse().unwrap();
    wait_until_connects(child, addr, what, log, || {
        TcpStream::connect_timeout(&sock, Duration::from_millis(200)).is_ok()
    });
}

/// Polls `connects` until it succeeds (the child accepts on `addr`), failing the test with
/// the child's log if it exits first or `START_DEADLINE` passes.
fn wait_until_connects(
    child: &mut Child,
    addr: &str,
    what: &str,
    log: Option<&Path>,
    connects: impl Fn() -> bool,
) {
    let deadline = Instant::now() + START_DEADLINE;
    let log_text = || {
        log.map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .unwrap_or_default()
    };
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "{what} exited before accepting on {addr}: {status}\n{}",
                log_text()
            );
        }
        if connects() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} (pid {}) did not accept on {addr} within {START_DEADLINE:?}; its log:\n{}",
            child.id(),
            log_text()
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Kills and reaps a child; used by every Drop so nothing outlives a test.
fn kill_child(child: &mut Child) {
    if child.try_wait().ok().flatten().is_none() {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// Waits for a child to exit by itself, with a deadline.
fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// A real memcached process.
#[derive(Debug)]
pub struct Memcached {
    child: Option<Child>,
    pub host: String,
    pub port: u16,
    /// What `-l` is given: `host`, or several addresses for [`Memcached::start_on_many`].
    listen: String,
    memory_mb: u32,
    /// Extra command-line arguments (e.g. `-Z -o ssl_chain_cert=...` for TLS).
    extra_args: Vec<String>,
    /// Extra environment (`SASL_CONF_PATH` for `-S`).
    extra_env: Vec<(String, String)>,
    dir: TempDir,
}

impl Memcached {
    /// memcached with extra arguments and environment, e.g. `-S` with the `SASL_CONF_PATH`
    /// that names its SASL database.
    pub fn start_with_env(extra_args: Vec<String>, extra_env: Vec<(String, String)>) -> Memcached {
        let hosts = ["127.0.0.1".to_string()];
        let mut mc = Memcached::unstarted(&hosts, free_port(), 64, extra_args);
        mc.extra_env = extra_env;
        mc.spawn();
        mc
    }

    /// memcached on 127.0.0.1 and a free port, 64 MB.
    pub fn start() -> Memcached {
        Memcached::start_on("127.0.0.1", free_port(), 64)
    }

    /// memcached on a given host and port with `memory_mb` of cache (small pools of many
    /// servers use 8 to stay light).
    pub fn start_on(host: &str, port: u16, memory_mb: u32) -> Memcached {
        Memcached::start_on_many(&[host.to_string()], port, memory_mb)
    }

    /// memcached with extra arguments (kept for `restart`), e.g. `-Z` for TLS.
    pub fn start_with_args(
        host: &str,
        port: u16,
        memory_mb: u32,
        extra_args: Vec<String>,
    ) -> Memcached {
        Memcached::start_on_many_with_args(&[host.to_string()], port, memory_mb, extra_args)
    }

    /// One memcached listening on every address of `hosts` (same port): many pool entries
    /// backed by one process, for placement tests over pools larger than the processes it
    /// is practical to start. `host` is the first address.
    pub fn start_on_many(hosts: &[String], port: u16, memory_mb: u32) -> Memcached {
        Memcached::start_on_many_with_args(hosts, port, memory_mb, Vec::new())
    }

    fn start_on_many_with_args(
        hosts: &[String],
        port: u16,
        memory_mb: u32,
        extra_args: Vec<String>,
    ) -> Memcached {
        let mut mc = Memcached::unstarted(hosts, port, memory_mb, extra_args);
        mc.spawn();
        mc
    }

    fn unstarted(
        hosts: &[String],
        port: u16,
        memory_mb: u32,
        extra_args: Vec<String>,
    ) -> Memcached {
        require_program("memcached");
        Memcached {
            child: None,
            host: hosts[0].clone(),
            port,
            listen: hosts.join(","),
            memory_mb,
            extra_args,
            extra_env: Vec::new(),
            dir: TempDir::new("memcached"),
        }
    }

    fn spawn(&mut self) {
        let log = self.dir.path().join("memcached.log");
        let child = Command::new("memcached")
            .args([
                "-l",
                &self.listen,
                "-p",
                &self.port.to_string(),
                "-U",
                "0",
                "-t",
                "1",
            ])
            .args(["-m", &self.memory_mb.to_string()])
            .args(&self.extra_args)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            // memcached refuses to run as root without -u; it ignores -u when not root.
            .args(["-u", "root"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn memcached");
        let addr = self.addr();
        self.child = Some(child);
        wait_accepting(self.child.as_mut().unwrap(), &addr, "memcached", Some(&log));
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Kills the server (a backend failure); `restart` brings it back on the same address.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// Starts the server again on the same address (empty cache).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A direct connection, bypassing any proxy.
    pub fn connect(&self) -> Conn {
        Conn::connect(&self.addr())
    }

    /// The server's process id, while it runs (for SIGSTOP/SIGCONT stall tests).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the server with SIGSTOP: it keeps its port (the kernel still accepts
    /// connections) but answers nothing. The returned guard sends SIGCONT when dropped,
    /// so a failing test never leaves a stopped process behind.
    pub fn stop(&self) -> Stopped {
        let pid = self.pid().expect("memcached is not running");
        signal_pid(pid, "STOP");
        // `kill` returns once the signal is queued; a memcached thread may still be running
        // (on the other core) and answer one more request. Wait until every thread is stopped.
        assert!(
            poll_until(Duration::from_secs(5), || all_threads_stopped(pid)),
            "memcached {pid}: not every thread stopped 5 s after SIGSTOP"
        );
        Stopped { pid: Some(pid) }
    }
}

/// Whether every thread of `pid` is in the stopped state (`T` in /proc/PID/task/TID/stat).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            // The state follows the command name, which is in parentheses and may hold spaces.
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    })
}

/// A process frozen with SIGSTOP; SIGCONT on `resume` or on Drop.
#[derive(Debug)]
pub struct Stopped {
    pid: Option<u32>,
}

impl Stopped {
    /// Lets the process run again now.
    pub fn resume(mut self) {
        if let Some(pid) = self.pid.take() {
            signal_pid(pid, "CONT");
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            // No panic in Drop (it may run while unwinding): a failed kill is ignored.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A real twemproxy (nutcracker) process.
#[derive(Debug)]
pub struct Nutcracker {
    child: Child,
    /// The pool's listen address, read from the YAML's first `listen:` line.
    pub listen: String,
    _dir: TempDir,
}

impl Nutcracker {
    /// Starts nutcracker on `yaml` and waits until every pool's `listen:` address (TCP, or
    /// a unix socket path with an optional mode after it) accepts: nutcracker binds them
    /// one after another. `connect` uses the first.
    pub fn start(yaml: &str) -> Nutcracker {
        require_program("nutcracker");
        let listens: Vec<String> = yaml
            .lines()
            .filter_map(|l| l.trim().strip_prefix("listen:"))
            .map(|s| s.trim().to_string())
            .collect();
        let listen = listens
            .first()
            .cloned()
            .expect("nutcracker yaml needs a `listen:` line");
        let dir = TempDir::new("nutcracker");
        let conf = dir.write("nutcracker.yml", yaml);
        let log = dir.path().join("nutcracker.log");
        let child = Command::new("nutcracker")
            .arg("-c")
            .arg(&conf)
            .args(["-s", &free_port().to_string(), "-a", "127.0.0.1"])
            .arg("-o")
            .arg(&log)
            .arg("-p")
            .arg(dir.path().join("nutcracker.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nutcracker");
        // Wrap the child before waiting, so a readiness panic still kills it (Drop).
        let mut nc = Nutcracker {
            child,
            listen,
            _dir: dir,
        };
        for address in &listens {
            match address.strip_prefix('/') {
                Some(_) => {
                    let path = address.split(' ').next().unwrap_or(address);
                    wait_until_connects(&mut nc.child, path, "nutcracker", Some(&log), || {
                        std::os::unix::net::UnixStream::connect(path).is_ok()
                    });
                }
                None => wait_accepting(&mut nc.child, address, "nutcracker", Some(&log)),
            }
        }
        nc
    }

    pub fn connect(&self) -> Conn {
        Conn::connect(&self.listen)
    }
}

impl Drop for Nutcracker {
    fn drop(&mut self) {
        kill_child(&mut self.child);
    }
}

/// Sends signal `name` (`STOP`, `CONT`, `TERM`, ...) to `pid` with the `kill` command.
pub fn signal_pid(pid: u32, name: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{name} {pid} failed");
}

/// Resident memory of a process in KiB (`VmRSS` from /proc/PID/status).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// What a finished command printed.
#[derive(Debug)]
pub struct CliOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the memroute binary with `args` (no server: `--check`, `import-twemproxy`), bounded by
/// `timeout`; the process is killed if it does not finish in time.
pub fn run_memroute_cli<S: AsRef<std::ffi::OsStr>>(args: &[S], timeout: Duration) -> CliOutput {
    run_program(memroute_binary(), args, timeout)
}

/// Runs any program (a client tool such as `memcstat`) to completion within `timeout`.
pub fn run_program<P: AsRef<std::ffi::OsStr>, S: AsRef<std::ffi::OsStr>>(
    program: P,
    args: &[S],
    timeout: Duration,
) -> CliOutput {
    run_program_with_env(program, args, &[], timeout)
}

/// [`run_program`] with extra environment variables (`MEMROUTE_ZONE` for `--check`).
pub fn run_program_with_env<P: AsRef<std::ffi::OsStr>, S: AsRef<std::ffi::OsStr>>(
    program: P,
    args: &[S],
    env: &[(&str, &str)],
    timeout: Duration,
) -> CliOutput {
    let name = program.as_ref().to_string_lossy().into_owned();
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memroute");
    // Drain both pipes on threads so a large output cannot block the child.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = match wait_child(&mut child, timeout) {
        Some(status) => status,
        None => {
            kill_child(&mut child);
            panic!(
                "{name} {:?} did not finish within {timeout:?}",
                args.iter()
                    .map(|a| a.as_ref().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
            );
        }
    };
    CliOutput {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// One HTTP/1.1 request to memroute's admin endpoint with `Connection: close`; returns the
/// status code and the body (checked against `Content-Length` when the reply has one).
pub fn admin_http(addr: &str, method: &str, path: &str) -> (u16, String) {
    admin_request(addr, method, path, &[])
}

/// [`admin_http`] with more request headers (`("Authorization", "Bearer T")`).
pub fn admin_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect admin {addr}: {e}"));
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    s.set_read_timeout(Some(IO_TIMEOUT)).expect("read timeout");
    s.set_write_timeout(Some(IO_TIMEOUT))
        .expect("write timeout");
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .expect("send request");
    let mut response = String::new();
    s.read_to_string(&mut response)
        .unwrap_or_else(|e| panic!("{method} {path}: {e} after {response:?}"));
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: no header end in {response:?}"));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: status line of {head:?}"));
    let length: Option<usize> = head.lines().find_map(|line| {
        let line = line.to_ascii_lowercase();
        line.strip_prefix("content-length:")?.trim().parse().ok()
    });
    if let Some(length) = length {
        assert_eq!(
            length,
            body.len(),
            "{method} {path}: Content-Length vs body"
        );
    }
    (code, body.to_string())
}

/// The memroute binary built by `cargo build -p memroute`.
pub fn memroute_binary() -> PathBuf {
    // Integration tests run as target/<profile>/deps/<test>-<hash>; the binary is target/<profile>/memroute.
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("memroute");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p memroute` first",
        bin.display()
    );
    bin
}

/// A running memroute.
#[derive(Debug)]
pub struct Memroute {
    child: Child,
    /// The first listen address (`127.0.0.1:PORT`).
    pub listen: String,
    /// Every stderr line so far (drained by a thread, so the pipe never fills).
    log: Arc<Mutex<Vec<String>>>,
    /// The config file memroute was started with (rewrite it, then SIGHUP, to reload).
    config: PathBuf,
    _dir: TempDir,
}

/// `MEMROUTE_TEST_IO=epoll` runs every memroute the harness starts with that `proxy.io`
/// (unless the config names one): `MEMROUTE_TEST_IO=epoll cargo test -p memroute-tests
/// --test conformance` runs a suite through the epoll mode (the default is io_uring).
pub fn with_io_mode(toml: &str) -> String {
    match std::env::var("MEMROUTE_TEST_IO") {
        Ok(mode) if !mode.is_empty() && !toml.contains("\nio = ") => {
            toml.replacen("[proxy]\n", &format!("[proxy]\nio = \"{mode}\"\n"), 1)
        }
        _ => toml.to_string(),
    }
}

/// `[proxy]` + one ketama/fnv1a_64 pool `main` over `servers`.
/// Servers are twemproxy-style strings ("host:port" or "host:port:weight name").
pub fn simple_config(listen: &str, servers: &[String], extra_pool_lines: &str) -> String {
    pool_config(listen, servers, "ketama", "fnv1a_64", extra_pool_lines)
}

/// `[proxy]` (one worker, route = "main") + pool `main` with the given distribution and hash.
pub fn pool_config(
    listen: &str,
    servers: &[String],
    distribution: &str,
    hash: &str,
    extra_pool_lines: &str,
) -> String {
    let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
    format!(
        "[proxy]\nlisten = [\"{listen}\"]\nworkers = 1\nroute = \"main\"\n\n\
         [pools.main]\nservers = [{}]\ndistribution = \"{distribution}\"\nhash = \"{hash}\"\n{extra_pool_lines}\n",
        servers.join(", ")
    )
}

impl Memroute {
    /// memroute with one ketama/fnv1a_64 pool over `servers` on a free port.
    pub fn start_pool(servers: &[String]) -> Memroute {
        Memroute::start_pool_with(servers, "")
    }

    /// Same, with extra lines for `[pools.main]` (e.g. `max_keys_per_request = 3`).
    pub fn start_pool_with(servers: &[String], extra_pool_lines: &str) -> Memroute {
        let listen = format!("127.0.0.1:{}", free_port());
        Memroute::start(&simple_config(&listen, servers, extra_pool_lines))
    }

    /// memroute with one worker on a free port, root target `root`, and the given pool and
    /// route sections appended.
    pub fn start_routes(root: &str, sections: &[String]) -> Memroute {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut toml = proxy_section(&listen, root);
        for section in sections {
            toml.push_str(section);
        }
        Memroute::start(&toml)
    }

    /// Runs memroute on `toml` and waits for its `memroute ready` line on stderr. The first
    /// `listen` address of `[proxy]` is what tests connect to.
    pub fn start(toml: &str) -> Memroute {
        Memroute::start_args(toml, &[])
    }

    /// Same, with extra command-line arguments (`--no-watch`).
    pub fn start_args(toml: &str, args: &[&str]) -> Memroute {
        Memroute::start_logging(toml, args, "info")
    }

    /// Same, logging what the tracing filter `filter` lets through (`RUST_LOG` syntax; it
    /// must let `info` through, for the ready line): `info,memroute_backend::health=debug`
    /// adds the prober's "probe failed" lines.
    pub fn start_logging(toml: &str, args: &[&str], filter: &str) -> Memroute {
        let toml = &with_io_mode(toml);
        let dir = TempDir::new("memroute");
        let conf = dir.write("memroute.toml", toml);
        let mut command = Command::new(memroute_binary());
        command
            .arg("--config")
            .arg(&conf)
            .args(args)
            .env("RUST_LOG", filter);
        Memroute::start_command(command, toml, conf, dir)
    }

    /// Runs `command` (a memroute, however started: another binary, under chroot) whose
    /// config is `toml`, kept at `config` (for `rewrite_config`) inside `dir` (removed when
    /// this is dropped), and waits for `memroute ready`.
    pub fn start_command(
        mut command: Command,
        toml: &str,
        config: PathBuf,
        dir: TempDir,
    ) -> Memroute {
        // The first entry of `listen = [...]`, written as a string or as a table.
        let listen = toml
            .lines()
            .find_map(|l| {
                let first = l.trim().strip_prefix("listen = [")?;
                let first = first.strip_prefix("{ address = ").unwrap_or(first);
                first.strip_prefix('"')?.split('"').next()
            })
            .expect("config needs `listen = [\"host:port\", ...]` in [proxy]")
            .to_string();
        let conf = config;
        // The ready line is logged at info; pin the level so an outer RUST_LOG cannot hide it
        // (unless the caller chose a filter: `start_logging`).
        if !command.get_envs().any(|(name, _)| name == "RUST_LOG") {
            command.env("RUST_LOG", "info");
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn memroute");

        // Drain stderr for the life of the process: a full pipe would block memroute's logging.
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let thread_log = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("memroute ready") {
                    let _ = ready_tx.send(());
                }
                thread_log.lock().unwrap().push(line);
            }
        });
        let mut mr = Memroute {
            child,
            listen,
            log,
            config: conf,
            _dir: dir,
        };
        match ready_rx.recv_timeout(START_DEADLINE) {
            Ok(()) => mr,
            Err(_) => {
                let status = mr.child.try_wait().unwrap();
                panic!(
                    "memroute did not log `memroute ready` within {START_DEADLINE:?} (exit: {status:?})\nconfig:\n{toml}\nstderr:\n{}",
                    mr.log_text()
                );
            }
        }
    }

    pub fn connect(&self) -> Conn {
        Conn::connect(&self.listen)
    }

    /// Everything memroute wrote to stderr so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends a signal by name (`TERM`, `INT`) with the `kill` command (no unsafe libc call).
    pub fn signal(&self, name: &str) {
        signal_pid(self.child.id(), name);
    }

    /// memroute's process id (for /proc/PID/status).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) until a stderr line contains `needle`; false if the deadline passes.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log.lock().unwrap().iter().any(|l| l.contains(needle)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// The config file memroute was started with.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// Replaces the config file's contents atomically (write a sibling, rename over it), so a
    /// reload never reads a half-written file.
    pub fn rewrite_config(&self, toml: &str) {
        let staged = self.config.with_extension("toml.new");
        std::fs::write(&staged, toml).unwrap();
        std::fs::rename(&staged, &self.config).unwrap();
    }

    /// How many stderr lines so far contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits (bounded) until at least `n` stderr lines contain `needle`; false at the deadline.
    pub fn wait_log_count(&self, needle: &str, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log_count(needle) >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Rewrites the config with `toml`, sends SIGHUP and waits (bounded) for the outcome: true
    /// when memroute logged `config reloaded` (or, for a file whose bytes did not change,
    /// `nothing to do`), false when it logged `config reload rejected`. (memroute also
    /// watches the file: whichever of the watch and SIGHUP comes first reloads, the other
    /// finds the bytes unchanged.)
    pub fn reload(&self, toml: &str) -> bool {
        let (done, unchanged, rejected) = (
            self.log_count("config reloaded"),
            self.log_count("nothing to do"),
            self.log_count("config reload rejected"),
        );
        let same_bytes = std::fs::read(&self.config).is_ok_and(|b| b == toml.as_bytes());
        self.rewrite_config(toml);
        self.signal("HUP");
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if self.log_count("config reloaded") > done {
                return true;
            }
            if same_bytes && self.log_count("nothing to do") > unchanged {
                return true;
            }
            if self.log_count("config reload rejected") > rejected {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "memroute logged neither `config reloaded` nor `config reload rejected` within {START_DEADLINE:?} of SIGHUP\nstderr:\n{}",
                self.log_text()
            );
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Waits (bounded) for memroute to exit; panics with its log if it does not.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match wait_child(&mut self.child, timeout) {
            Some(status) => status,
            None => panic!(
                "memroute did not exit within {timeout:?}\nstderr:\n{}",
                self.log_text()
            ),
        }
    }
}

impl Drop for Memroute {
    fn drop(&mut self) {
        kill_child(&mut self.child);
    }
}

/// A tiny blocking, byte-oriented memcached client. Reads time out after [`IO_TIMEOUT`].
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    /// Bytes read from the socket but not yet returned.
    buf: Vec<u8>,
    addr: String,
}

impl Conn {
    pub fn connect(addr: &str) -> Conn {
        let sock: SocketAddr = addr.parse().unwrap();
        let stream = TcpStream::connect_timeout(&sock, IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            buf: Vec::new(),
            addr: addr.to_string(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("write to {}: {e}", self.addr));
    }

    /// Like `send`, but a write error (the peer closed) is returned instead of panicking.
    pub fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads more bytes into the buffer. Ok(0) is EOF; a timeout is an Err.
    fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 64 * 1024];
        // A signal delivered to the test process interrupts the read (EINTR): that is
        // neither a timeout nor an EOF, so read again (seen under load, as a false
        // "read timed out" a few ms into the read).
        let n = loop {
            match self.stream.read(&mut chunk) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Reads until `done(buffered bytes)` returns the length of a complete reply, then returns
    /// those bytes. On EOF or timeout returns Err with what was read so far.
    pub fn read_until_with(
        &mut self,
        done: impl Fn(&[u8]) -> Option<usize>,
    ) -> Result<Vec<u8>, ReadError> {
        loop {
            if let Some(n) = done(&self.buf) {
                return Ok(self.buf.drain(..n).collect());
            }
            match self.fill() {
                Ok(0) => {
                    return Err(ReadError {
                        partial: std::mem::take(&mut self.buf),
                        eof: true,
                    })
                }
                Ok(_) => {}
                Err(_) => {
                    return Err(ReadError {
                        partial: std::mem::take(&mut self.buf),
                        eof: false,
                    })
                }
            }
        }
    }

    /// Reads up to and including the first occurrence of `terminator`.
    pub fn read_until(&mut self, terminator: &[u8]) -> Vec<u8> {
        let t = terminator.to_vec();
        self.read_until_with(move |b| find(b, &t).map(|i| i + t.len()))
            .unwrap_or_else(|e| panic!("{}: waiting for {:?}: {e}", self.addr, show(terminator)))
    }

    /// One line including its `\r\n`.
    pub fn read_line(&mut self) -> Vec<u8> {
        self.read_until(b"\r\n")
    }

    /// Exactly `n` bytes.
    pub fn read_for(&mut self, n: usize) -> Vec<u8> {
        self.read_until_with(|b| (b.len() >= n).then_some(n))
            .unwrap_or_else(|e| panic!("{}: waiting for {n} bytes: {e}", self.addr))
    }

    /// A whole retrieval reply (`VALUE ...` blocks then `END\r\n`), or one line if the server
    /// answered with something else (an error).
    pub fn read_get_reply(&mut self) -> Vec<u8> {
        self.read_until_with(complete_get_reply)
            .unwrap_or_else(|e| panic!("{}: waiting for a get reply: {e}", self.addr))
    }

    /// Sends `request` and reads one line.
    pub fn roundtrip_line(&mut self, request: &[u8]) -> Vec<u8> {
        self.send(request);
        self.read_line()
    }

    /// Sends `request` and reads `n` lines.
    pub fn roundtrip_lines(&mut self, request: &[u8], n: usize) -> Vec<u8> {
        self.send(request);
        (0..n).flat_map(|_| self.read_line()).collect()
    }

    /// Sends `request` and then `mn\r\n`, and reads everything up to the `MN\r\n` that ends the
    /// reply. meta no-op is answered in order after everything before it, so this frames the
    /// reply to any request, even ones that answer nothing (noreply, quiet meta) or several lines.
    pub fn roundtrip_fenced(&mut self, request: &[u8]) -> Result<Vec<u8>, ReadError> {
        let mut bytes = request.to_vec();
        bytes.extend_from_slice(b"mn\r\n");
        if let Err(e) = self.try_send(&bytes) {
            return Err(ReadError {
                partial: format!("<write failed: {e}>").into_bytes(),
                eof: true,
            });
        }
        let mut reply = self.read_until_with(ends_with_mn)?;
        reply.truncate(reply.len() - 4);
        Ok(reply)
    }

    /// Closes our sending side (the peer reads end of stream); replies can still be read.
    pub fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
    }

    /// Waits for the peer to close the connection (bounded by the read timeout). Returns false
    /// if it sent bytes instead or the read timed out.
    pub fn expect_eof(&mut self) -> bool {
        matches!(self.fill(), Ok(0)) && self.buf.is_empty()
    }

    /// The `STAT name value` lines of a `stats` reply, as (name, value).
    pub fn stats(&mut self) -> Vec<(String, String)> {
        self.send(b"stats\r\n");
        let reply = self.read_until(b"END\r\n");
        String::from_utf8_lossy(&reply)
            .lines()
            .filter_map(|l| l.strip_prefix("STAT "))
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// set `key` to `value`; panics unless STORED.
    pub fn set(&mut self, key: &str, value: &[u8]) {
        let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        let reply = self.roundtrip_line(&req);
        assert!(
            reply == b"STORED\r\n",
            "set {key} via {}: {}",
            self.addr,
            show(&reply)
        );
    }

    /// get `key`: Some(value) on a hit, None on a miss; panics on any other reply.
    pub fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.send(format!("get {key}\r\n").as_bytes());
        let reply = self.read_get_reply();
        parse_values(&reply)
            .unwrap_or_else(|| panic!("get {key} via {}: {}", self.addr, show(&reply)))
            .into_iter()
            .next()
            .map(|v| v.2)
    }
}

/// A read that ended before the expected reply was complete.
#[derive(Debug)]
pub struct ReadError {
    pub partial: Vec<u8>,
    /// true: the peer closed; false: the read timed out.
    pub eof: bool,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.eof {
            "connection closed"
        } else {
            "read timed out"
        };
        write!(f, "{how} after {:?}", show(&self.partial))
    }
}

/// Position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Bytes as a readable string (escapes for control and non-UTF-8 bytes), for messages.
pub fn show(bytes: &[u8]) -> String {
    let shown: String = bytes
        .iter()
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    // Keep line ends readable.
    shown.replace("\\r\\n", "\\r\\n\n")
}

/// `Some(len)` when `buf` holds a complete reply ending in `MN\r\n` at a line start.
fn ends_with_mn(buf: &[u8]) -> Option<usize> {
    let mut start = 0;
    // Walk line by line so an `MN` inside a line is not mistaken for the fence.
    while let Some(i) = find(&buf[start..], b"\r\n") {
        let line = &buf[start..start + i];
        let next = start + i + 2;
        if line == b"MN" {
            return Some(next);
        }
        // Skip value data blocks so their contents cannot look like the fence.
        if let Some(len) = data_len(line) {
            if buf.len() < next + len + 2 {
                return None;
            }
            start = next + len + 2;
        } else {
            start = next;
        }
    }
    None
}

/// For a `VALUE key flags bytes [cas]` or meta `VA bytes ...` line, the data block length.
fn data_len(line: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(line).ok()?;
    let mut t = text.split(' ');
    match t.next()? {
        "VALUE" => t.nth(2)?.parse().ok(),
        "VA" => t.next()?.parse().ok(),
        _ => None,
    }
}

/// `Some(len)` when `buf` holds a complete get reply (VALUE blocks + END, or a single other line).
pub fn complete_get_reply(buf: &[u8]) -> Option<usize> {
    let mut start = 0;
    loop {
        let i = find(&buf[start..], b"\r\n")?;
        let line = &buf[start..start + i];
        let next = start + i + 2;
        if line.starts_with(b"VALUE ") {
            let len = data_len(line)?;
            if buf.len() < next + len + 2 {
                return None;
            }
            start = next + len + 2;
        } else {
            // END, or an error line that replaces the whole reply.
            return Some(next);
        }
    }
}

/// Parses a complete get reply into (key, flags, data); None if it is not VALUE*/END.
pub fn parse_values(reply: &[u8]) -> Option<Vec<(String, u32, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut rest = reply;
    loop {
        let i = find(rest, b"\r\n")?;
        let line = std::str::from_utf8(&rest[..i]).ok()?;
        if line == "END" {
            return (i + 2 == rest.len()).then_some(out);
        }
        let mut t = line.split(' ');
        if t.next()? != "VALUE" {
            return None;
        }
        let key = t.next()?.to_string();
        let flags = t.next()?.parse().ok()?;
        let len: usize = t.next()?.parse().ok()?;
        let data = rest.get(i + 2..i + 2 + len)?.to_vec();
        out.push((key, flags, data));
        rest = rest.get(i + 2 + len + 2..)?;
    }
}

// ---- Helpers for route, health and discovery tests ----

/// Pause between polls of a condition (stats, a server's contents). A poll interval, not
/// synchronisation: every poll loop decides by the condition and gives up at its deadline.
pub const POLL: Duration = POLL_INTERVAL;

/// Sets `key` to `again` through `c` until memroute answers STORED: the way to wait for a
/// server that was stopped or frozen to be used again. Until then every reply must be a
/// `SERVER_ERROR`; after `within` the test fails with `log` (memroute's log).
pub fn set_until_stored(c: &mut Conn, key: &str, within: Duration, log: impl Fn() -> String) {
    let deadline = Instant::now() + within;
    loop {
        let reply = c.roundtrip_line(format!("set {key} 0 0 5\r\nagain\r\n").as_bytes());
        if reply == b"STORED\r\n" {
            return;
        }
        assert!(
            reply.starts_with(b"SERVER_ERROR "),
            "while the server comes back: {}",
            show(&reply)
        );
        assert!(
            Instant::now() < deadline,
            "memroute did not use the server again within {within:?}\n{}",
            log()
        );
        // Poll interval between retries; success is decided by the reply, bounded above.
        std::thread::sleep(POLL);
    }
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held.
pub fn poll_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The numeric value of stat `name` in a `stats` reply, if present.
/// Index of the one server in `servers` holding `key`, found by asking each directly.
pub fn holder(servers: &[Memcached], key: &str) -> usize {
    let found: Vec<usize> = (0..servers.len())
        .filter(|&i| servers[i].connect().get(key).is_some())
        .collect();
    assert_eq!(found.len(), 1, "{key} is on servers {found:?}");
    found[0]
}

pub fn stat_u64(stats: &[(String, String)], name: &str) -> Option<u64> {
    stats
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// A random route's draws: sends `request` (a get) `draws` times on `c` and returns the share
/// answered `SERVER_ERROR` naming `error` (the child that fails); every other reply must be
/// a hit.
pub fn error_share(c: &mut Conn, request: &[u8], draws: usize, error: &str) -> f64 {
    let mut errors = 0;
    for _ in 0..draws {
        c.send(request);
        let reply = c.read_get_reply();
        if reply.starts_with(b"SERVER_ERROR") {
            assert!(show(&reply).contains(error), "{}", show(&reply));
            errors += 1;
        } else {
            assert!(reply.starts_with(b"VALUE "), "{}", show(&reply));
        }
    }
    errors as f64 / draws as f64
}

/// `prefix0`, `prefix1`, ... : `n` distinct keys.
pub fn numbered_keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// `toml` (an imported config, which always has an `[admin]` section) with the admin port
/// moved to `address` (a free port: the importers write a fixed one).
pub fn with_admin_on(toml: &str, address: &str) -> String {
    let start = toml
        .find("\n[admin]\nlisten = \"")
        .expect("an [admin] listen line")
        + 1;
    let line_end =
        start + "[admin]\n".len() + toml[start + "[admin]\n".len()..].find('\n').unwrap();
    format!(
        "{}[admin]\nlisten = \"{address}\"{}",
        &toml[..start],
        &toml[line_end..]
    )
}

/// `[proxy]` with one worker listening on `listen`, root target `route`.
pub fn proxy_section(listen: &str, route: &str) -> String {
    format!("[proxy]\nlisten = [\"{listen}\"]\nworkers = 1\nroute = \"{route}\"\n\n")
}

/// `[pools.NAME]` over `servers` (ketama over md5: short sequential keys spread), with extra
/// lines (`timeout = "200ms"`, health keys, ...).
pub fn pool_section(name: &str, servers: &[String], extra_lines: &str) -> String {
    let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
    format!(
        "[pools.{name}]\nservers = [{}]\ndistribution = \"ketama\"\nhash = \"md5\"\n{extra_lines}\n\n",
        servers.join(", ")
    )
}

/// A latency sample summary for printing ("p50 0.21 ms, p99 0.40 ms, max 1.30 ms over 100").
/// Measurements are printed for the report, never asserted: the machine is noisy.
pub fn latency_summary(samples: &[Duration]) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return "no samples".to_string();
    }
    let at = |p: f64| {
        let i = ((sorted.len() - 1) as f64 * p).round() as usize;
        sorted[i].as_secs_f64() * 1000.0
    };
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {}",
        at(0.5),
        at(0.99),
        at(1.0),
        sorted.len()
    )
}

impl Memcached {
    /// One numeric stat of this server, asked directly.
    pub fn stat(&self, name: &str) -> u64 {
        let stats = self.connect().stats();
        stat_u64(&stats, name).unwrap_or_else(|| panic!("no {name} in {}'s stats", self.addr()))
    }

    /// Which of `keys` this server holds, with their values (asked directly, 50 keys a get).
    pub fn held(&self, keys: &[String]) -> std::collections::HashMap<String, Vec<u8>> {
        let mut c = self.connect();
        let mut out = std::collections::HashMap::new();
        for chunk in keys.chunks(50) {
            c.send(format!("get {}\r\n", chunk.join(" ")).as_bytes());
            let reply = c.read_get_reply();
            let values = parse_values(&reply)
                .unwrap_or_else(|| panic!("get via {}: {}", self.addr(), show(&reply)));
            for (k, _, v) in values {
                out.insert(k, v);
            }
        }
        out
    }
}

impl Memroute {
    /// memroute's own `stats`, on a fresh connection.
    pub fn stats(&self) -> Vec<(String, String)> {
        self.connect().stats()
    }

    /// Polls memroute's `stats` until `done` holds for them (bounded); panics with `what`,
    /// the last stats and the log otherwise. Returns the stats that satisfied `done`.
    /// Waits (bounded) until memroute has greeted every server it knows: each has an open
    /// connection (`backend_connections:POOL:ADDRESS`, counted once its `version` greeting
    /// was answered) or is marked down. A test that counts what a server read (its
    /// `bytes_read`) starts after this, so the 9 bytes of a greeting never land in it.
    pub fn wait_greeted(&self) {
        self.wait_stats("every server greeted or down", START_DEADLINE, |stats| {
            let servers: Vec<&str> = stats
                .iter()
                .filter_map(|(name, _)| name.strip_prefix("backend_connections:"))
                .collect();
            // No server listed at all would make the wait pass for nothing.
            !servers.is_empty()
                && servers.iter().all(|server| {
                    let value = |name: String| stat_u64(stats, &name).unwrap_or(0);
                    value(format!("backend_connections:{server}")) > 0
                        || value(format!("server:{server}:down")) > 0
                })
        });
    }

    pub fn wait_stats(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[(String, String)]) -> bool,
    ) -> Vec<(String, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let stats = self.stats();
            if done(&stats) {
                return stats;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not reached within {timeout:?}\nstats: {stats:?}\nlog:\n{}",
                self.log_text()
            );
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Conn {
    /// Sets every key to `value(key)`, pipelined in batches of 200; panics unless every
    /// reply is STORED.
    pub fn set_many(&mut self, keys: &[String], value: impl Fn(&str) -> String) {
        for chunk in keys.chunks(200) {
            let mut batch = Vec::new();
            for k in chunk {
                let v = value(k);
                batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
            }
            self.send(&batch);
            for k in chunk {
                let reply = self.read_line();
                assert!(
                    reply == b"STORED\r\n",
                    "pipelined set {k} via {}: {}",
                    self.addr,
                    show(&reply)
                );
            }
        }
    }
}
