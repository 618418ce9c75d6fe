//! TLS configuration for both directions, built with rustls and its `ring` provider
//! (chosen explicitly: no C toolchain, and one provider for the whole process).
//!
//! ```text
//!  listener (one ServerTls, shared by every worker's socket for that address)
//!    ArcSwap<ServerConfig>  <- rebuilt on reload / when the cert files change
//!       \-- ticketer (TLS 1.3 tickets) and session cache (TLS 1.2 ids): created once
//!           and carried into every rebuilt config, so a client resumes on any worker
//!           and across certificate reloads
//!  backend server (one ClientTls per server address, shared by every worker)
//!    ClientConfig with its own session store: each reconnect resumes that server's
//!    session, even when several servers share one certificate name
//! ```
//!
//! No ALPN (memcached has no protocol id) and no 0-RTT early data in either direction:
//! early data can be replayed by an attacker, and memcached commands (incr, append, set
//! with cas) are not idempotent.
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use memroute_config::{BackendTls, ListenerTls, TransportConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ProducesTickets, StoresServerSessions};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

use crate::NetError;

/// The one crypto provider of the process.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

const VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// Handshake counters of one listener (or one backend server), summed over workers.
#[derive(Debug, Default)]
pub struct TlsCounters {
    /// Handshakes that ran the full key exchange and certificate check.
    pub full: AtomicU64,
    /// Handshakes that resumed an earlier session (ticket or session id).
    pub resumed: AtomicU64,
    /// Handshakes that failed (bad certificate, plaintext peer, protocol error).
    pub failed: AtomicU64,
    /// Clients that did not finish the handshake within the timeout.
    pub timed_out: AtomicU64,
}

impl TlsCounters {
    pub(crate) fn count_kind(&self, kind: Option<rustls::HandshakeKind>) {
        match kind {
            Some(rustls::HandshakeKind::Resumed) => self.resumed.fetch_add(1, Relaxed),
            _ => self.full.fetch_add(1, Relaxed),
        };
    }
}

/// What a listener's TLS needs across rebuilds of its `ServerConfig`.
#[derive(Debug)]
struct Resumption {
    ticketer: Arc<dyn ProducesTickets>,
    sessions: Arc<dyn StoresServerSessions>,
}

/// The TLS side of one listener, shared by every worker that accepts on it.
#[derive(Debug)]
pub struct ServerTls {
    config: ArcSwap<ServerConfig>,
    resumption: Resumption,
    /// The settings and the files' stamps the current config was built from.
    source: Mutex<(ListenerTls, Vec<FileStamp>)>,
    handshake_timeout: Duration,
    pub counters: TlsCounters,
}

impl ServerTls {
    /// Reads the certificate, key and client CA files and builds the listener's config;
    /// fails, naming the setting, when a file is unreadable or the key is not the cert's.
    pub fn new(settings: &ListenerTls, transport: &TransportConfig) -> Result<ServerTls, NetError> {
        let lifetime = u32::try_from(transport.tls_ticket_lifetime.as_secs())
            .unwrap_or(u32::MAX)
            .max(1);
        let sessions: Arc<dyn StoresServerSessions> = match transport.tls_session_cache {
            0 => Arc::new(rustls::server::NoServerSessionStorage {}),
            size => rustls::server::ServerSessionMemoryCache::new(size),
        };
        let resumption = Resumption {
            ticketer: Arc::new(RotatingTicketer::new(lifetime).map_err(|e| {
                NetError::setup(&settings.key_path, format!("cannot create a ticketer: {e}"))
            })?),
            sessions,
        };
        let stamps = stamps(settings);
        let config = build_server_config(settings, &resumption)?;
        Ok(ServerTls {
            config: ArcSwap::from_pointee(config),
            resumption,
            source: Mutex::new((settings.clone(), stamps)),
            handshake_timeout: transport.tls_handshake_timeout,
            counters: TlsCounters::default(),
        })
    }

    /// The `ServerConfig` new handshakes use now (the `tls_handshake` bench drives rustls
    /// with it directly, so it measures memroute's own settings).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.config.load_full()
    }

    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.load_full())
    }

    pub(crate) fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }

    /// Rebuilds the config when `settings` differ from the running ones or their files
    /// changed on disk (size, modification time, inode). New handshakes use the new
    /// certificate; connections already open keep their session, and tickets issued
    /// before stay valid (the ticketer is kept). Returns whether anything changed; on an
    /// error the running certificate stays in use.
    pub fn reload(&self, settings: &ListenerTls) -> Result<bool, NetError> {
        let mut source = self.source.lock().unwrap_or_else(|e| e.into_inner());
        let now = stamps(settings);
        if source.0 == *settings && source.1 == now {
            return Ok(false);
        }
        let config = build_server_config(settings, &self.resumption)?;
        self.config.store(Arc::new(config));
        *source = (settings.clone(), now);
        Ok(true)
    }

    /// Rebuilds when the files of the running settings changed.
    pub fn reload_if_changed(&self) -> Result<bool, NetError> {
        let settings = self
            .source
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone();
        self.reload(&settings)
    }
}

/// Checks a listener's TLS files as `--check` does: readable, and the key matches.
pub fn check_listener_tls(settings: &ListenerTls) -> Result<(), NetError> {
    let resumption = Resumption {
        ticketer: Arc::new(NoTickets),
        sessions: Arc::new(rustls::server::NoServerSessionStorage {}),
    };
    build_server_config(settings, &resumption).map(drop)
}

/// A ticketer for configs that are only checked, never served.
#[derive(Debug)]
struct NoTickets;

impl ProducesTickets for NoTickets {
    fn enabled(&self) -> bool {
        false
    }
    fn lifetime(&self) -> u32 {
        0
    }
    fn encrypt(&self, _plain: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn decrypt(&self, _cipher: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

fn build_server_config(
    settings: &ListenerTls,
    resumption: &Resumption,
) -> Result<ServerConfig, NetError> {
    let path = &settings.key_path;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| NetError::setup(path, e.to_string()))?;
    let builder = match &settings.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = load_roots(ca, &format!("{path}.client_ca"))?;
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| NetError::setup(&format!("{path}.client_ca"), e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let certs = load_certs(&settings.cert, &format!("{path}.cert"))?;
    let key = load_key(&settings.key, &format!("{path}.key"))?;
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| key_error(path, &settings.cert, &settings.key, e))?;
    config.ticketer = resumption.ticketer.clone();
    config.session_storage = resumption.sessions.clone();
    // Explicit, though it is rustls's default: no 0-RTT (see the module header).
    config.max_early_data_size = 0;
    Ok(config)
}

fn key_error(path: &str, cert: &Path, key: &Path, error: rustls::Error) -> NetError {
    let reason = match error {
        rustls::Error::InconsistentKeys(_) => format!(
            "private key {} does not match certificate {}",
            key.display(),
            cert.display()
        ),
        other => format!(
            "cannot use certificate {} with key {}: {other}",
            cert.display(),
            key.display()
        ),
    };
    NetError::setup(&format!("{path}.key"), reason)
}

fn load_certs(file: &Path, key_path: &str) -> Result<Vec<CertificateDer<'static>>, NetError> {
    let certs = CertificateDer::pem_file_iter(file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| NetError::setup(key_path, format!("cannot read {}: {e}", file.display())))?;
    if certs.is_empty() {
        return Err(NetError::setup(
            key_path,
            format!("no PEM certificate in {}", file.display()),
        ));
    }
    Ok(certs)
}

fn load_key(file: &Path, key_path: &str) -> Result<PrivateKeyDer<'static>, NetError> {
    PrivateKeyDer::from_pem_file(file).map_err(|e| {
        NetError::setup(
            key_path,
            format!("cannot read a private key from {}: {e}", file.display()),
        )
    })
}

fn load_roots(file: &Path, key_path: &str) -> Result<RootCertStore, NetError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(file, key_path)? {
        roots.add(cert).map_err(|e| {
            NetError::setup(
                key_path,
                format!("bad CA certificate in {}: {e}", file.display()),
            )
        })?;
    }
    Ok(roots)
}

/// Size, modification time and inode of a file: enough to notice a rewritten or
/// replaced (renamed over) certificate without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp(Option<(u64, SystemTime, u64)>);

impl FileStamp {
    /// The stamp of `path` now (an unreadable file has a stamp too: "missing").
    pub fn of(path: &Path) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp(
            std::fs::metadata(path)
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?, m.ino()))),
        )
    }

    /// The stamps of a pool's TLS files: a change means its connectors must be rebuilt.
    pub fn of_backend(settings: &BackendTls) -> Vec<FileStamp> {
        [&settings.ca, &settings.cert, &settings.key]
            .into_iter()
            .flatten()
            .map(|p| FileStamp::of(p))
            .collect()
    }
}

fn stamps(settings: &ListenerTls) -> Vec<FileStamp> {
    [
        Some(&settings.cert),
        Some(&settings.key),
        settings.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| FileStamp::of(p))
    .collect()
}

/// TLS 1.3 session tickets with a configurable key rotation: one key encrypts new
/// tickets for `lifetime` seconds, then only decrypts for another `lifetime`. Each key
/// is a rustls ring ticketer (which itself rotates every 6 hours, so `lifetime` is
/// capped at 6 hours by the config). One instance is shared by every worker.
#[derive(Debug)]
struct RotatingTicketer {
    lifetime: u32,
    keys: RwLock<TicketKeys>,
}

#[derive(Debug)]
struct TicketKeys {
    current: Arc<dyn ProducesTickets>,
    previous: Option<Arc<dyn ProducesTickets>>,
    rotate_at: Instant,
}

impl RotatingTicketer {
    fn new(lifetime: u32) -> Result<RotatingTicketer, rustls::Error> {
        Ok(RotatingTicketer {
            lifetime,
            keys: RwLock::new(TicketKeys {
                current: rustls::crypto::ring::Ticketer::new()?,
                previous: None,
                rotate_at: Instant::now() + Duration::from_secs(u64::from(lifetime)),
            }),
        })
    }

    fn maybe_rotate(&self) {
        let due = self
            .keys
            .read()
            .map(|k| Instant::now() >= k.rotate_at)
            .unwrap_or(false);
        if !due {
            return;
        }
        let Ok(fresh) = rustls::crypto::ring::Ticketer::new() else {
            return; // no randomness now: keep the current key a little longer
        };
        if let Ok(mut keys) = self.keys.write() {
            if Instant::now() >= keys.rotate_at {
                keys.previous = Some(std::mem::replace(&mut keys.current, fresh));
                keys.rotate_at = Instant::now() + Duration::from_secs(u64::from(self.lifetime));
            }
        }
    }
}

impl ProducesTickets for RotatingTicketer {
    fn enabled(&self) -> bool {
        true
    }
    fn lifetime(&self) -> u32 {
        self.lifetime
    }
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.maybe_rotate();
        self.keys.read().ok()?.current.encrypt(plain)
    }
    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.maybe_rotate();
        let keys = self.keys.read().ok()?;
        keys.current
            .decrypt(cipher)
            .or_else(|| keys.previous.as_ref()?.decrypt(cipher))
    }
}

/// The TLS side of connections to one backend server.
#[derive(Debug)]
pub(crate) struct ClientTls {
    pub config: Arc<ClientConfig>,
    pub server_name: ServerName<'static>,
}

/// How many sessions each server's store keeps (TLS 1.3 servers send several tickets).
const CLIENT_SESSIONS_PER_SERVER: usize = 8;

impl ClientTls {
    /// The TLS settings for connections to `address` (`host:port`). Each server gets its
    /// own session store: rustls keys stored sessions by server name only, so servers
    /// that share a certificate name must not share a store.
    pub(crate) fn new(address: &str, settings: &BackendTls) -> Result<ClientTls, NetError> {
        let path = &settings.key_path;
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| NetError::setup(path, e.to_string()))?;
        let builder = match (&settings.ca, settings.insecure_skip_verify) {
            (_, true) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyServerCertificate(provider))),
            (Some(ca), false) => {
                builder.with_root_certificates(load_roots(ca, &format!("{path}.ca"))?)
            }
            (None, false) => {
                return Err(NetError::setup(&format!("{path}.ca"), "required"));
            }
        };
        let mut config = match (&settings.cert, &settings.key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(
                    load_certs(cert, &format!("{path}.cert"))?,
                    load_key(key, &format!("{path}.key"))?,
                )
                .map_err(|e| key_error(path, cert, key, e))?,
            _ => builder.with_no_client_auth(),
        };
        config.resumption = rustls::client::Resumption::store(Arc::new(
            rustls::client::ClientSessionMemoryCache::new(CLIENT_SESSIONS_PER_SERVER),
        ));
        config.enable_early_data = false;
        let name = match &settings.server_name {
            Some(name) => name.clone(),
            None => host_of(address).to_string(),
        };
        let server_name = ServerName::try_from(name.clone()).map_err(|_| {
            NetError::setup(
                &format!("{path}.server_name"),
                format!("\"{name}\" is not a DNS name or an IP address"),
            )
        })?;
        Ok(ClientTls {
            config: Arc::new(config),
            server_name,
        })
    }
}

/// `host` of `host:port` or `[v6]:port`.
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// `insecure_skip_verify`: accepts any certificate, but still checks that the server
/// holds the key of the certificate it sent (handshake signatures).
#[derive(Debug)]
struct AnyServerCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_strips_port_and_brackets() {
        assert_eq!(host_of("mc-1.internal:11211"), "mc-1.internal");
        assert_eq!(host_of("127.0.0.1:11211"), "127.0.0.1");
        assert_eq!(host_of("[::1]:11211"), "::1");
    }

    #[test]
    fn tickets_survive_one_rotation_but_not_two() {
        let ticketer = RotatingTicketer::new(3600).expect("ticketer");
        let ticket = ticketer.encrypt(b"session").expect("encrypt");
        let rotate = |t: &RotatingTicketer| {
            t.keys.write().expect("lock").rotate_at = Instant::now();
            t.maybe_rotate();
        };
        rotate(&ticketer);
        assert_eq!(ticketer.decrypt(&ticket).as_deref(), Some(&b"session"[..]));
        rotate(&ticketer);
        assert_eq!(ticketer.decrypt(&ticket), None);
    }
}
