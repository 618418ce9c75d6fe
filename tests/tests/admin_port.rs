//! The admin port faces a network: whoever reaches it must not be able to crowd out the
//! probes or change memroute's state.
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use memroute_tests::*;
use socket2::{Domain, Socket, Type};

fn config(listen: &str, admin: &str, server: &str, admin_extra: &str) -> String {
    format!(
        "[proxy]\nlisten = [\"{listen}\"]\nworkers = 1\nroute = \"main\"\n\n\
         [pools.main]\nservers = [\"{server}\"]\n\n[admin]\nlisten = \"{admin}\"\n{admin_extra}"
    )
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8 is all on lo),
/// so one test can play several peers.
fn connect_from(from: [u8; 4], to: &str) -> Option<TcpStream> {
    let to: SocketAddr = to.parse().expect("admin address");
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    socket.bind(&SocketAddr::from((from, 0)).into()).ok()?;
    socket.connect(&to.into()).ok()?;
    Some(socket.into())
}

/// `POST /reload` carrying `Authorization: Bearer TOKEN`.
fn reload_with(admin: &str, token: &str) -> (u16, String) {
    let bearer = format!("Bearer {token}");
    admin_request(admin, "POST", "/reload", &[("Authorization", &bearer)])
}

fn refusals(admin: &str, reason: &str) -> u64 {
    let (_, text) = admin_http(admin, "GET", "/metrics");
    let series = format!("memroute_admin_refusals_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn probes_answer_while_others_hold_idle_connections() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &admin, &server.addr(), ""));

    // One peer opens 200 connections and sends nothing: it gets its own share, no more.
    let greedy: Vec<TcpStream> = (0..200)
        .filter_map(|_| connect_from([127, 0, 0, 2], &admin))
        .collect();
    assert_eq!(greedy.len(), 200, "the kernel accepts every connection");
    assert!(
        poll_until(Duration::from_secs(10), || refusals(&admin, "per_peer")
            >= 200 - 16),
        "a peer holding 200 connections is refused past its share: {} refusals",
        refusals(&admin, "per_peer")
    );
    // 200 more peers, one idle connection each.
    let crowd: Vec<TcpStream> = (0..200u8)
        .filter_map(|i| connect_from([127, 0, 1, i], &admin))
        .collect();
    assert_eq!(crowd.len(), 200);
    // Probes from the kubelet's own address keep answering, every one of them.
    for probe in 0..30 {
        let (code, body) = admin_http(&admin, "GET", "/healthz");
        assert_eq!((code, body.as_str()), (200, "ok\n"), "probe {probe}");
        let (code, _) = admin_http(&admin, "GET", "/ready");
        assert_eq!(code, 200, "readiness probe {probe}");
    }
    // The clients of the proxy never noticed.
    let mut c = proxy.connect();
    c.set("beside-the-crowd", b"v");
    assert_eq!(c.get("beside-the-crowd").as_deref(), Some(&b"v"[..]));
    drop(greedy);
    drop(crowd);
}

#[test]
fn reload_needs_loopback_or_the_token_and_no_other_site() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());

    // Without a token: a loopback peer may reload, a page on another site may not.
    let proxy = Memroute::start(&config(&listen, &admin, &server.addr(), ""));
    let (code, body) = admin_http(&admin, "POST", "/reload");
    assert_eq!(code, 200, "{body}");
    let (code, body) = admin_request(
        &admin,
        "POST",
        "/reload",
        &[
            ("Origin", "https://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
        ],
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("another site"), "{body}");
    assert_eq!(refusals(&admin, "cross_site"), 1);
    drop(proxy);

    // With a token file: only a request carrying it, and the file is read each time.
    let dir = TempDir::new("admin-token");
    let token_file = dir.write("token", "first-secret\n");
    let extra = format!("token_file = {:?}\n", token_file.display().to_string());
    let proxy = Memroute::start(&config(&listen, &admin, &server.addr(), &extra));
    let (code, body) = admin_http(&admin, "POST", "/reload");
    assert_eq!(code, 401, "{body}");
    let (code, body) = reload_with(&admin, "wrong-secret");
    assert_eq!(code, 401, "{body}");
    let (code, body) = reload_with(&admin, "first-secret");
    assert_eq!(code, 200, "{body}");
    std::fs::write(&token_file, "second-secret\n").expect("rotate token");
    let (code, _) = reload_with(&admin, "first-secret");
    assert_eq!(code, 401, "a rotated token file applies without a reload");
    let (code, body) = reload_with(&admin, "second-secret");
    assert_eq!(code, 200, "{body}");
    assert_eq!(refusals(&admin, "bad_token"), 3);
    // Reading stays open to everyone, and /config never shows a token.
    assert_eq!(admin_http(&admin, "GET", "/healthz").0, 200);
    drop(proxy);
    let extra = "token = \"inline-secret\"\n";
    let proxy = Memroute::start(&config(&listen, &admin, &server.addr(), extra));
    let (code, config) = admin_http(&admin, "GET", "/config");
    assert_eq!(code, 200);
    assert!(!config.contains("inline-secret"), "{config}");
    assert!(config.contains("<redacted>"), "{config}");
    let (code, body) = reload_with(&admin, "inline-secret");
    assert_eq!(code, 200, "{body}");
    drop(proxy);
}
