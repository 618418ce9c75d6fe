//! Server-side CPU of one TLS handshake, full vs resumed, with memroute's own listener
//! config (`memroute_net::ServerTls`: the shared rotating ticketer, the TLS 1.2 session
//! cache, the ring provider) against a rustls client, in memory: no sockets, no
//! accept, no session task, so what is left is the handshake alone.
//!
//! ```text
//!  client (rustls) --write_tls--> buffer --read_tls/process--> server  (timed)
//!  client <--read_tls/process-- buffer <--write_tls----------- server  (timed)
//!  ... until neither side is handshaking and nothing is left to send (TLS 1.3
//!  tickets included: the client stores them, so the next connection resumes)
//! ```
//!
//! Only the server's calls are timed (`iter_custom`), so the numbers compare with the
//! server CPU per connection of `scripts/bench-tls`; each sample is the median
//! handshake of its batch (see `median_of`), so preemption by other work on a shared
//! machine does not count. Variants: TLS 1.3 and 1.2, P-256 and
//! RSA 2048 certificates, full and resumed; TLS 1.3 also with one ticket per handshake
//! instead of rustls's two; and one X25519 key exchange alone, the floor of a resumed
//! TLS 1.3 handshake (rustls resumes only with `psk_dhe_ke`).
//! Certificates are made with the `openssl` command in a temporary directory.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use memroute_config::{ListenerTls, TransportConfig};
use memroute_net::ServerTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, HandshakeKind, ServerConfig, ServerConnection};

/// A CA and a localhost certificate of `kind` ("ec" or "rsa") in `dir`.
fn make_certs(dir: &Path, kind: &str) -> (PathBuf, PathBuf, PathBuf) {
    let key_args: &[&str] = match kind {
        "rsa" => &["-newkey", "rsa:2048"],
        _ => &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
    };
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend(key_args);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=bench-ca",
    ]);
    openssl(&ca);
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write ext");
    let mut req = vec!["req", "-nodes"];
    req.extend(key_args);
    req.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&req);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        "server.pem",
        "-extfile",
        "ext",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

/// memroute's listener config for these files, as `ServerTls` builds it.
fn memroute_server_config(cert: &Path, key: &Path) -> Arc<ServerConfig> {
    let settings = ListenerTls {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        client_ca: None,
        key_path: "bench.tls".to_string(),
    };
    ServerTls::new(&settings, &TransportConfig::default())
        .expect("memroute's ServerTls")
        .server_config()
}

fn client_config(
    ca: &Path,
    version: &'static rustls::SupportedProtocolVersion,
    resume: bool,
) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("ca file") {
        roots.add(cert.expect("ca cert")).expect("add ca");
    }
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[version])
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    if !resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Arc::new(config)
}

/// One handshake in memory; returns the time spent in the server's calls and its kind.
fn handshake(
    client_config: &Arc<ClientConfig>,
    server_config: &Arc<ServerConfig>,
) -> (Duration, Option<HandshakeKind>) {
    let name = ServerName::try_from("localhost").expect("name");
    let mut client = ClientConnection::new(client_config.clone(), name).expect("client");
    let mut buf = Vec::with_capacity(8192);
    let started = Instant::now();
    let mut server = ServerConnection::new(server_config.clone()).expect("server");
    let mut server_time = started.elapsed();
    loop {
        buf.clear();
        while client.wants_write() {
            client.write_tls(&mut buf).expect("client write");
        }
        let started = Instant::now();
        let mut input = &buf[..];
        while !input.is_empty() {
            server.read_tls(&mut input).expect("server read");
            server.process_new_packets().expect("server handshake");
        }
        let mut out = Vec::with_capacity(8192);
        while server.wants_write() {
            server.write_tls(&mut out).expect("server write");
        }
        server_time += started.elapsed();
        let mut input = &out[..];
        while !input.is_empty() {
            client.read_tls(&mut input).expect("client read");
            client.process_new_packets().expect("client handshake");
        }
        if !client.is_handshaking()
            && !server.is_handshaking()
            && !client.wants_write()
            && !server.wants_write()
        {
            return (server_time, server.handshake_kind());
        }
    }
}

/// `iters` times the median of `iters` runs of `one`: on a machine shared with other
/// work, a handshake that was preempted costs milliseconds of wall time that are not
/// its own CPU; the median of a sample leaves those out, the sum would not.
fn median_of(iters: u64, mut one: impl FnMut() -> Duration) -> Duration {
    let mut times: Vec<Duration> = (0..iters).map(|_| one()).collect();
    times.sort_unstable();
    times[times.len() / 2] * u32::try_from(iters).unwrap_or(u32::MAX)
}

fn bench_handshakes(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("memroute-bench-tls-{}", std::process::id()));
    let mut group = c.benchmark_group("tls_handshake");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for kind in ["ec", "rsa"] {
        let dir = dir.join(kind);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (ca, cert, key) = make_certs(&dir, kind);
        let memroute = memroute_server_config(&cert, &key);
        let mut one_ticket = (*memroute).clone();
        one_ticket.send_tls13_tickets = 1;
        let one_ticket = Arc::new(one_ticket);
        let variants: [(&str, _, &Arc<ServerConfig>); 3] = [
            ("tls13", &rustls::version::TLS13, &memroute),
            ("tls13_1ticket", &rustls::version::TLS13, &one_ticket),
            ("tls12", &rustls::version::TLS12, &memroute),
        ];
        for (version_name, version, server) in variants {
            for resume in [false, true] {
                let client = client_config(&ca, version, resume);
                let want = match resume {
                    true => HandshakeKind::Resumed,
                    false => HandshakeKind::Full,
                };
                // Prime the client's session store (and check the kind we measure).
                let _ = handshake(&client, server);
                assert_eq!(
                    handshake(&client, server).1,
                    Some(want),
                    "{kind} {version_name}"
                );
                let id = format!(
                    "{kind}/{version_name}/{}",
                    if resume { "resumed" } else { "full" }
                );
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| median_of(iters, || handshake(&client, server).0))
                });
            }
        }
    }
    // The floor of a resumed TLS 1.3 handshake in rustls: one X25519 exchange (the server
    // makes a key pair and completes the agreement with the client's share).
    let provider = rustls::crypto::ring::default_provider();
    let x25519 = provider
        .kx_groups
        .iter()
        .find(|g| g.name() == rustls::NamedGroup::X25519)
        .expect("x25519");
    let peer = x25519.start().expect("client share").pub_key().to_vec();
    group.bench_function("x25519_keygen", |b| {
        b.iter_custom(|iters| {
            median_of(iters, || {
                let started = Instant::now();
                std::hint::black_box(x25519.start().expect("keypair"));
                started.elapsed()
            })
        })
    });
    group.bench_function("x25519_exchange", |b| {
        b.iter(|| {
            x25519
                .start()
                .expect("keypair")
                .complete(&peer)
                .expect("agree")
        })
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench_handshakes);
criterion_main!(benches);
