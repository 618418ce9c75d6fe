//! TLS on both sides, with real parts: certificates made by `openssl` for each test, a
//! rustls client and `openssl s_client` towards memroute, real `memcached -Z` servers
//! behind it. Resumption is checked on both ends (the client's handshake kind, memroute's
//! per-listener and per-server counters).
use std::process::{Command, Stdio};
use std::time::Duration;

use memroute_tests::tls::{client_config, CertFiles, Pki, TlsConn};
use memroute_tests::*;
use rustls::HandshakeKind;

const WAIT: Duration = Duration::from_secs(10);

/// memroute with a plaintext listener (`m.listen`) and a TLS one (returned), over `servers`.
fn start_tls_proxy(
    pki: &Pki,
    servers: &[String],
    listener_tls_extra: &str,
    proxy_extra: &str,
    pool_extra: &str,
) -> (Memroute, String) {
    let plain = format!("127.0.0.1:{}", free_port());
    let tls = format!("127.0.0.1:{}", free_port());
    let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
    let toml = format!(
        "[proxy]\nlisten = [\"{plain}\", {{ address = \"{tls}\", tls = {{ cert = {:?}, key = {:?}{listener_tls_extra} }} }}]\n\
         workers = 2\nroute = \"main\"\n{proxy_extra}\n\n\
         [pools.main]\nservers = [{}]\n{pool_extra}\n",
        pki.server.cert.display().to_string(),
        pki.server.key.display().to_string(),
        servers.join(", ")
    );
    (Memroute::start(&toml), tls)
}

/// Reply bytes as text, unescaped (for comparisons with literal replies).
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn stat(m: &Memroute, name: &str) -> u64 {
    stat_u64(&m.stats(), name).unwrap_or_else(|| panic!("no {name} in stats:\n{:?}", m.stats()))
}

#[test]
fn rustls_client_resumes_on_any_worker_and_requests_work() {
    let pki = Pki::generate();
    let mc = Memcached::start();
    let admin = format!("127.0.0.1:{}", free_port());
    let (m, tls) = start_tls_proxy(
        &pki,
        &[mc.addr()],
        "",
        "",
        &format!("[admin]\nlisten = \"{admin}\""),
    );
    let config = client_config(&pki.ca, None);
    let mut kinds = Vec::new();
    // Eight connections over two workers (SO_REUSEPORT spreads them by source port): every
    // one after the first resumes, whichever worker took it, because the ticketer is shared.
    for i in 0..8 {
        let mut c = TlsConn::connect(&tls, &config).expect("handshake");
        let reply = c
            .roundtrip(format!("set k{i} 0 0 2\r\nv{i}\r\n").as_bytes(), b"\r\n")
            .expect("set");
        assert_eq!(text(&reply), "STORED\r\n");
        let reply = c
            .roundtrip(format!("get k{i}\r\n").as_bytes(), b"END\r\n")
            .expect("get");
        assert_eq!(text(&reply), format!("VALUE k{i} 0 2\r\nv{i}\r\nEND\r\n"));
        kinds.push(c.handshake_kind());
    }
    assert_eq!(kinds[0], Some(HandshakeKind::Full));
    assert!(
        kinds[1..]
            .iter()
            .all(|k| *k == Some(HandshakeKind::Resumed)),
        "{kinds:?}"
    );
    let prefix = format!("listener:{tls}:tls_handshakes");
    assert_eq!(stat(&m, &format!("{prefix}_full")), 1);
    assert_eq!(stat(&m, &format!("{prefix}_resumed")), 7);
    // The plaintext listener beside it still serves.
    assert_eq!(m.connect().get("k3").as_deref(), Some(&b"v3"[..]));
    // The same counters in /metrics.
    let mut http = std::net::TcpStream::connect(&admin).expect("admin");
    std::io::Write::write_all(
        &mut http,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .expect("request");
    let mut metrics = String::new();
    std::io::Read::read_to_string(&mut http, &mut metrics).expect("metrics");
    for kind in ["full\"} 1", "resumed\"} 7"] {
        let line =
            format!("memroute_listener_tls_handshakes_total{{listener=\"{tls}\",kind=\"{kind}");
        assert!(metrics.contains(&line), "/metrics lacks {line}:\n{metrics}");
    }
}

#[test]
fn openssl_s_client_session_is_reused() {
    let pki = Pki::generate();
    let mc = Memcached::start();
    let (m, tls) = start_tls_proxy(&pki, &[mc.addr()], "", "", "");
    let session = pki.dir().join("session.pem");
    let run = |sess_arg: &str| -> String {
        let mut child = Command::new("openssl")
            .args(["s_client", "-connect", &tls, "-CAfile"])
            .arg(&pki.ca)
            .args(["-servername", "localhost", "-ign_eof", sess_arg])
            .arg(&session)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("openssl s_client");
        // `quit` makes memroute close the connection, which ends s_client after it read
        // the reply and the session tickets.
        std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), b"version\r\nquit\r\n")
            .expect("write");
        let output = child.wait_with_output().expect("s_client output");
        String::from_utf8_lossy(&output.stdout).to_string()
    };
    let first = run("-sess_out");
    assert!(first.contains("New, TLSv1.3"), "{first}");
    assert!(first.contains("VERSION "), "{first}");
    let second = run("-sess_in");
    assert!(second.contains("Reused, TLSv1.3"), "{second}");
    assert!(second.contains("VERSION "), "{second}");
    let prefix = format!("listener:{tls}:tls_handshakes");
    assert_eq!(stat(&m, &format!("{prefix}_resumed")), 1);
}

#[test]
fn mutual_tls_accepts_the_right_client_and_rejects_others() {
    let pki = Pki::generate();
    let mc = Memcached::start();
    let ca = format!(", client_ca = {:?}", pki.ca.display().to_string());
    let (m, tls) = start_tls_proxy(&pki, &[mc.addr()], &ca, "", "");
    let mut good = TlsConn::connect(&tls, &client_config(&pki.ca, Some(&pki.client)))
        .expect("a client certificate from the trusted CA is accepted");
    assert_eq!(
        text(&good.roundtrip(b"get nothing\r\n", b"END\r\n").expect("get")),
        "END\r\n"
    );
    // TLS 1.3: the client finishes first; the server's verdict arrives as an alert on the
    // first read, so each rejected client is asked for something.
    let expired = pki.expired_client();
    for (what, client, alert) in [
        ("no client certificate", None, "CertificateRequired"),
        (
            "a certificate from another CA",
            Some(&pki.rogue_client),
            "UnknownCA",
        ),
        (
            "an expired certificate from the trusted CA",
            Some(&expired),
            "CertificateExpired",
        ),
    ] {
        let outcome = TlsConn::connect(&tls, &client_config(&pki.ca, client))
            .and_then(|mut c| c.roundtrip(b"get nothing\r\n", b"END\r\n"));
        // The alert names why: an expired certificate is refused for its dates, not its CA.
        assert!(
            outcome.as_ref().is_err_and(|e| e.contains(alert)),
            "{what}: wanted alert {alert}, got {outcome:?}"
        );
    }
    let failed = format!("listener:{tls}:tls_handshakes_failed");
    m.wait_stats("three failed handshakes", WAIT, |s| {
        stat_u64(s, &failed) == Some(3)
    });
    // The accepted client is unaffected.
    assert_eq!(
        text(&good.roundtrip(b"get nothing\r\n", b"END\r\n").expect("get")),
        "END\r\n"
    );
}

#[test]
fn plaintext_to_tls_listener_and_tls_to_plain_listener_fail_cleanly() {
    let pki = Pki::generate();
    let mc = Memcached::start();
    let (m, tls) = start_tls_proxy(&pki, &[mc.addr()], "", "", "");
    // A memcached command sent to the TLS listener is not a ClientHello: closed, counted.
    let mut plain = Conn::connect(&tls);
    plain.send(b"get foo\r\n");
    let reply = plain.read_until_with(|_| None).expect_err("closed");
    assert!(reply.eof, "the TLS listener must close a plaintext client");
    assert!(
        !reply.partial.starts_with(b"END") && !reply.partial.starts_with(b"VALUE"),
        "{}",
        show(&reply.partial)
    );
    let failed = format!("listener:{tls}:tls_handshakes_failed");
    m.wait_stats("the plaintext client counted", WAIT, |s| {
        stat_u64(s, &failed) == Some(1)
    });
    // A ClientHello sent to the plaintext listener gets memcached's answer to garbage.
    let outcome = TlsConn::connect(&m.listen, &client_config(&pki.ca, None));
    assert!(outcome.is_err(), "TLS to a plain listener: {outcome:?}");
    // Both listeners still serve.
    assert_eq!(m.connect().get("x"), None);
    let mut c = TlsConn::connect(&tls, &client_config(&pki.ca, None)).expect("handshake");
    assert_eq!(
        text(&c.roundtrip(b"get x\r\n", b"END\r\n").expect("get")),
        "END\r\n"
    );
}

#[test]
fn a_handshake_never_finished_is_closed_at_the_timeout_and_counted() {
    let pki = Pki::generate();
    let mc = Memcached::start();
    let (m, tls) = start_tls_proxy(
        &pki,
        &[mc.addr()],
        "",
        "tls_handshake_timeout = \"300ms\"",
        "",
    );
    let mut silent = Conn::connect(&tls);
    // Nothing sent: memroute closes the connection after 300 ms (the read would time out
    // after 5 s if it did not).
    let outcome = silent.read_until_with(|_| None).expect_err("closed");
    assert!(outcome.eof && outcome.partial.is_empty(), "{outcome:?}");
    assert_eq!(
        stat(&m, &format!("listener:{tls}:tls_handshakes_timeout")),
        1
    );
    let mut c = TlsConn::connect(&tls, &client_config(&pki.ca, None)).expect("handshake");
    assert_eq!(
        text(&c.roundtrip(b"get x\r\n", b"END\r\n").expect("get")),
        "END\r\n"
    );
}

/// `[pools.main]` lines for TLS to the servers, trusting `pki.ca`.
fn pool_tls(pki: &Pki, extra: &str) -> String {
    format!(
        "tls = {{ ca = {:?}, server_name = \"localhost\"{extra} }}\nhash = \"md5\"",
        pki.ca.display().to_string()
    )
}

fn tls_memcached(cert: &CertFiles) -> Memcached {
    Memcached::start_with_args("127.0.0.1", free_port(), 16, Pki::memcached_args(cert))
}

#[test]
fn tls_pool_serves_the_protocol_and_a_server_with_a_bad_certificate_gets_server_error() {
    let pki = Pki::generate();
    let good = [tls_memcached(&pki.server), tls_memcached(&pki.server)];
    let bad = tls_memcached(&pki.rogue_server);
    let mut addrs: Vec<String> = good.iter().map(Memcached::addr).collect();
    addrs.push(bad.addr());
    let (m, _tls) = start_tls_proxy(&pki, &addrs, "", "", &pool_tls(&pki, ""));
    let mut c = m.connect();
    // Keys on the two good servers work; keys on the bad one get SERVER_ERROR naming the cause.
    let mut good_keys = Vec::new();
    let mut refused = 0;
    for i in 0..30 {
        let key = format!("key{i}");
        c.send(format!("set {key} 0 0 5\r\nhello\r\n").as_bytes());
        let reply = c.read_line();
        if reply == b"STORED\r\n" {
            assert_eq!(c.get(&key).as_deref(), Some(&b"hello"[..]));
            good_keys.push(key);
        } else {
            refused += 1;
            let text = text(&reply);
            assert!(
                text.starts_with("SERVER_ERROR ")
                    && text.contains(&bad.addr())
                    && text.contains("certificate"),
                "{text}"
            );
        }
    }
    assert!(
        !good_keys.is_empty() && refused > 0,
        "served {}, refused {refused}",
        good_keys.len()
    );
    // The protocol through TLS, on the keys of the good servers: a multi-get spanning both,
    // a 500 KiB value, incr, delete.
    c.send(format!("get {}\r\n", good_keys.join(" ")).as_bytes());
    let values = parse_values(&c.read_get_reply()).expect("multi-get reply");
    assert_eq!(values.len(), good_keys.len());
    assert!(values.iter().all(|(_, _, v)| v == b"hello"));
    let key = &good_keys[0];
    let big = vec![b'x'; 500 * 1024];
    c.send(format!("set {key} 0 0 {}\r\n", big.len()).as_bytes());
    c.send(&big);
    c.send(b"\r\n");
    assert_eq!(text(&c.read_line()), "STORED\r\n");
    assert_eq!(c.get(key).map(|v| v.len()), Some(big.len()));
    for (request, reply) in [
        (format!("set {key} 0 0 1\r\n5\r\n"), "STORED\r\n"),
        (format!("incr {key} 10\r\n"), "15\r\n"),
        (format!("delete {key}\r\n"), "DELETED\r\n"),
        (format!("delete {key}\r\n"), "NOT_FOUND\r\n"),
    ] {
        assert_eq!(
            text(&c.roundtrip_line(request.as_bytes())),
            reply,
            "{request}"
        );
    }
    let handshakes: u64 = good
        .iter()
        .map(|g| stat(&m, &format!("server:main:{}:tls_handshakes_full", g.addr())))
        .sum();
    assert!(handshakes >= 2, "every good server was reached over TLS");
    assert!(
        stat(
            &m,
            &format!("server:main:{}:tls_handshakes_failed", bad.addr())
        ) >= 1
    );
}

#[test]
fn a_reconnect_to_a_tls_backend_resumes_its_session() {
    let pki = Pki::generate();
    // memcached closes connections idle for 1 s: every later request reconnects.
    let mut args = Pki::memcached_args(&pki.server);
    args.extend(["-o".to_string(), "idle_timeout=1".to_string()]);
    let mc = Memcached::start_with_args("127.0.0.1", free_port(), 16, args);
    let (m, _tls) = start_tls_proxy(&pki, &[mc.addr()], "", "", &pool_tls(&pki, ""));
    let mut c = m.connect();
    c.set("a", b"1");
    let resumed = format!("server:main:{}:tls_handshakes_resumed", mc.addr());
    // After memcached drops the idle connection, memroute reconnects and the handshake is
    // resumed from the session stored for this server.
    m.wait_stats("a resumed reconnect", Duration::from_secs(20), |s| {
        stat_u64(s, &resumed).is_some_and(|n| n >= 1)
    });
    assert!(poll_until(WAIT, || c.get("a").as_deref() == Some(&b"1"[..])));
}

#[test]
fn a_key_that_does_not_match_its_certificate_refuses_to_start() {
    let pki = Pki::generate();
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        "[proxy]\nlisten = [{{ address = \"{listen}\", tls = {{ cert = {:?}, key = {:?} }} }}]\nroute = \"main\"\n\
         [pools.main]\nservers = [\"127.0.0.1:1\"]\n",
        pki.mismatched.cert.display().to_string(),
        pki.mismatched.key.display().to_string()
    );
    let dir = TempDir::new("mismatch");
    let path = dir.write("memroute.toml", &toml);
    for args in [vec!["--check", "--config"], vec!["--config"]] {
        let mut args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        args.push(path.clone().into());
        let out = run_memroute_cli(&args, WAIT);
        assert!(!out.status.success(), "{args:?} succeeded: {}", out.stderr);
        let expected = format!(
            "proxy.listen[0].tls.key: private key {} does not match certificate {}",
            pki.client.key.display(),
            pki.server.cert.display()
        );
        assert!(out.stderr.contains(&expected), "{args:?}: {}", out.stderr);
    }
}

#[test]
fn certificate_files_rewritten_on_disk_are_picked_up_without_a_restart() {
    let pki = Pki::generate();
    let mc = Memcached::start();
    // The listener's files are copies, so the test can rewrite them in place.
    let cert = pki.dir().join("live.pem");
    let key = pki.dir().join("live.key");
    std::fs::copy(&pki.server.cert, &cert).expect("copy cert");
    std::fs::copy(&pki.server.key, &key).expect("copy key");
    let plain = format!("127.0.0.1:{}", free_port());
    let tls = format!("127.0.0.1:{}", free_port());
    let m = Memroute::start(&format!(
        "[proxy]\nlisten = [\"{plain}\", {{ address = \"{tls}\", tls = {{ cert = {:?}, key = {:?} }} }}]\n\
         route = \"main\"\n[pools.main]\nservers = [\"{}\"]\n",
        cert.display().to_string(),
        key.display().to_string(),
        mc.addr()
    ));
    let trusts_ca = client_config(&pki.ca, None);
    let trusts_rogue = client_config(&pki.rogue_ca, None);
    let mut before = TlsConn::connect(&tls, &trusts_ca).expect("first certificate");
    assert!(TlsConn::connect(&tls, &trusts_rogue).is_err());
    // The operator's tooling replaces both files (key first, as cert-manager may).
    std::fs::copy(&pki.rogue_server.key, &key).expect("rewrite key");
    std::fs::copy(&pki.rogue_server.cert, &cert).expect("rewrite cert");
    assert!(
        poll_until(WAIT, || TlsConn::connect(&tls, &trusts_rogue).is_ok()),
        "the new certificate was not served within {WAIT:?}\n{}",
        m.log_text()
    );
    // The connection made before the change keeps its session.
    assert_eq!(
        text(&before.roundtrip(b"get x\r\n", b"END\r\n").expect("get")),
        "END\r\n"
    );
}
