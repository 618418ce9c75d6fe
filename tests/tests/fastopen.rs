//! TCP Fast Open, proven by the kernel's own counters. The test re-runs itself inside a
//! network namespace of its own (`unshare -n`), where it may set `net.ipv4.tcp_fastopen`
//! without touching the machine, and reads `TcpExtTCPFastOpenPassive` / `...Active` from
//! that namespace's /proc/net/netstat:
//!
//! - listener: a Python client sends its request in the SYN (`MSG_FASTOPEN`) to memroute;
//!   the passive counter moves only if memroute set `TCP_FASTOPEN` on its socket (the
//!   sysctl is 3 then: server TFO only where a listener asks for it);
//! - backend connects: memroute's reconnects to memcached carry their first request in the
//!   SYN (`TCP_FASTOPEN_CONNECT`); memcached accepts TFO because it started while the
//!   sysctl also had 0x400 (TFO on every listener).
use std::process::Command;
use std::time::Duration;

use memroute_tests::*;

const INSIDE: &str = "MEMROUTE_TFO_NAMESPACE";
const TEST: &str = "fastopen_counters_move_in_a_network_namespace";

#[test]
fn fastopen_counters_move_in_a_network_namespace() {
    if std::env::var_os(INSIDE).is_none() {
        let exe = std::env::current_exe().expect("test binary");
        let output = Command::new("unshare")
            .arg("-n")
            .arg(exe)
            .args([TEST, "--exact", "--nocapture", "--test-threads", "1"])
            .env(INSIDE, "1")
            .output()
            .expect("run unshare (scripts/test installs util-linux)");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() && stderr.contains("unshare failed") {
            skipped(
                TEST,
                &format!("network namespaces are not permitted here: {stderr}"),
            );
            return;
        }
        println!("{stdout}");
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "inside the namespace:\n{stdout}\n{stderr}"
        );
        return;
    }
    run_inside_namespace();
}

fn sh(command: &str) {
    let status = Command::new("sh")
        .arg("-c")
        .arg(command)
        .status()
        .expect("sh");
    assert!(status.success(), "{command}");
}

fn set_fastopen(value: u32) {
    std::fs::write("/proc/sys/net/ipv4/tcp_fastopen", value.to_string())
        .expect("set net.ipv4.tcp_fastopen in the namespace");
}

/// `TcpExt` counter `name` of this namespace.
fn tcp_ext(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").expect("read /proc/net/netstat");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("TcpExt:")).collect();
    let (names, values) = (lines[0], lines[1]);
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /proc/net/netstat"))
}

/// Three connections from Python, each sending `version` with MSG_FASTOPEN: the first
/// fetches the cookie, the next two carry the request in their SYN.
fn python_fastopen_client(addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let script = format!(
        "import socket\n\
         for _ in range(3):\n\
         \x20   s = socket.socket()\n\
         \x20   s.settimeout(5)\n\
         \x20   s.sendto(b'version\\r\\n', socket.MSG_FASTOPEN, ('{host}', {port}))\n\
         \x20   print(s.recv(100).decode().strip())\n\
         \x20   s.close()\n"
    );
    let output = Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .expect("python3");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn run_inside_namespace() {
    sh("ip link set lo up");
    // memcached listens while every listener gets TFO (0x400), so it accepts TFO SYNs.
    set_fastopen(0x403);
    let mc = Memcached::start();
    // From here on only listeners that ask for TFO (memroute's) get it.
    set_fastopen(3);
    let listen = format!("127.0.0.1:{}", free_port());
    let server = mc.addr();
    // Backend-connect TFO is on by default: the config does not ask for it.
    let config = |connections: u32| {
        format!(
            "[proxy]\nlisten = [\"{listen}\"]\nworkers = 1\nroute = \"main\"\nfastopen = 64\n\n\
             [pools.main]\nservers = [\"{server}\"]\nconnections = {connections}\n"
        )
    };
    let m = Memroute::start(&config(1));
    let mut c = m.connect();
    // The first backend connection fetches memcached's TFO cookie.
    c.set("tfo", b"1");

    let passive = tcp_ext("TCPFastOpenPassive");
    let replies = python_fastopen_client(&listen);
    assert_eq!(replies.lines().count(), 3, "{replies}");
    assert!(
        replies.lines().all(|l| l.starts_with("VERSION ")),
        "{replies}"
    );
    let passive_after = tcp_ext("TCPFastOpenPassive");
    assert!(
        passive_after >= passive + 2,
        "memroute's listener accepted no data in a SYN: TCPFastOpenPassive {passive} -> {passive_after}"
    );

    // New backend connections (a reload changes `connections`) now hold a cookie: their
    // first request rides in the SYN.
    let active = tcp_ext("TCPFastOpenActive");
    assert!(m.reload(&config(2)), "reload: {}", m.log_text());
    assert!(
        poll_until(Duration::from_secs(10), || {
            // Several client sessions, so both new connections send something.
            let mut fresh = m.connect();
            fresh.get("tfo").as_deref() == Some(&b"1"[..]) && tcp_ext("TCPFastOpenActive") > active
        }),
        "memroute's backend connects sent no data in a SYN: TCPFastOpenActive stayed {active}\n{}",
        m.log_text()
    );
    println!(
        "TFO: passive {passive} -> {passive_after}, active {active} -> {}",
        tcp_ext("TCPFastOpenActive")
    );

    // The server goes away while memroute holds its cookie. memroute's reconnects are now
    // deferred (`connect` returns before any packet is sent; the SYN waits for the first
    // request), so the refusal comes back as a reset to that request: clients still get
    // SERVER_ERROR, promptly, and memroute keeps working for them.
    drop(mc);
    let mut c = m.connect();
    for attempt in 0..5 {
        let reply = String::from_utf8_lossy(&c.roundtrip_line(b"get tfo\r\n")).into_owned();
        assert!(
            reply.starts_with("SERVER_ERROR "),
            "attempt {attempt} with the server gone: {reply:?}\n{}",
            m.log_text()
        );
    }
    // A deferred connect refused at its first request counts as a refused connect: the
    // server is marked down, and its requests fail fast from then on.
    assert!(
        m.wait_log("server marked down", Duration::from_secs(10)),
        "a refused deferred connect did not mark the server down\n{}",
        m.log_text()
    );
    let reply = String::from_utf8_lossy(&c.roundtrip_line(b"get tfo\r\n")).into_owned();
    assert!(
        reply.starts_with("SERVER_ERROR ") && reply.contains("marked down"),
        "after it was marked down: {reply:?}"
    );
    println!(
        "server gone: {}",
        m.log_text()
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join(" | ")
    );
}
