//! Transport settings: TLS on listeners and to backends, TLS session resumption, TCP
//! Fast Open. Checked here with the same key-path errors as the rest of the config; the
//! files they name are read (and cert/key pairs matched) by memroute-net, which reports
//! its errors with the same key paths ([`ListenerTls::key_path`], [`BackendTls::key_path`]).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use toml::{Table, Value};

use crate::checked::ListenAddress;
use crate::raw::{check_keys, get_bool, get_duration, get_int, get_str, join, wrong_type, Errors};

/// Defaults of the transport settings (docs/configuration.md lists the same values).
pub mod defaults {
    /// Listener TCP Fast Open queue (pending TFO connections per listener); 0 = off.
    pub const FASTOPEN: u32 = 1024;
    /// On where the kernel allows it (`net.ipv4.tcp_fastopen` bit 1, the kernel default).
    /// It changes nothing until a server hands out a TFO cookie (memcached does not unless
    /// the sysctl has 0x400); see docs/configuration.md for what a deferred connect means.
    pub const FASTOPEN_CONNECT: bool = true;
    pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
    /// How long one ticket key encrypts new tickets; tickets are accepted for twice this.
    /// rustls's ring ticketer rotates its own keys every 6 hours, which caps it.
    pub const TLS_TICKET_LIFETIME_SECS: u64 = 6 * 3600;
    /// TLS 1.2 sessions remembered for resumption by session id (TLS 1.3 uses tickets).
    pub const TLS_SESSION_CACHE: usize = 4096;
}

/// `[proxy]` keys this module checks.
pub(crate) const PROXY_TRANSPORT_KEYS: &[&str] = &[
    "fastopen",
    "fastopen_connect",
    "tls_handshake_timeout",
    "tls_ticket_lifetime",
    "tls_session_cache",
];
const LISTENER_ENTRY_KEYS: &[&str] = &["address", "route", "tls"];
const LISTENER_TLS_KEYS: &[&str] = &["cert", "key", "client_ca"];
const BACKEND_TLS_KEYS: &[&str] = &["ca", "server_name", "cert", "key", "insecure_skip_verify"];

/// Process-wide transport settings (`[proxy]`) and the TLS of each listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    /// TCP Fast Open queue length of every TCP listener; 0 turns listener TFO off.
    pub fastopen: u32,
    /// TCP Fast Open on backend connects (`TCP_FASTOPEN_CONNECT`).
    pub fastopen_connect: bool,
    /// A client must finish its TLS handshake within this long, or it is closed (counted).
    pub tls_handshake_timeout: Duration,
    /// Ticket key rotation period; a ticket is accepted for up to twice this long.
    pub tls_ticket_lifetime: Duration,
    /// TLS 1.2 sessions kept for resumption by session id, per listener.
    pub tls_session_cache: usize,
    /// The listeners that speak TLS, by address (the others are plaintext).
    pub listen_tls: BTreeMap<ListenAddress, ListenerTls>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            fastopen: defaults::FASTOPEN,
            fastopen_connect: defaults::FASTOPEN_CONNECT,
            tls_handshake_timeout: Duration::from_millis(defaults::TLS_HANDSHAKE_TIMEOUT_MS),
            tls_ticket_lifetime: Duration::from_secs(defaults::TLS_TICKET_LIFETIME_SECS),
            tls_session_cache: defaults::TLS_SESSION_CACHE,
            listen_tls: BTreeMap::new(),
        }
    }
}

/// `tls = { cert, key, client_ca }` on a listen entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs (PEM).
    pub client_ca: Option<PathBuf>,
    /// Where this table is in the config (`proxy.listen[1].tls`), for error messages.
    pub key_path: String,
}

/// `[pools.X] tls = { ca, server_name, cert, key, insecure_skip_verify }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendTls {
    /// CAs that sign the servers' certificates (PEM). Required unless
    /// `insecure_skip_verify` is set.
    pub ca: Option<PathBuf>,
    /// Name the servers' certificates must carry; default: each server's host.
    pub server_name: Option<String>,
    /// Client certificate and key, for memcached's `ssl_verify_mode`.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Accept any server certificate. Loud on purpose: logged at every start and reload.
    pub insecure_skip_verify: bool,
    /// Where this table is in the config (`pools.main.tls`), for error messages.
    pub key_path: String,
}

/// Checks the transport keys of `[proxy]`; `listen_tls` is filled by [`check_listen_entry`].
pub(crate) fn check_proxy_transport(t: &Table, path: &str, errs: &mut Errors) -> TransportConfig {
    let fastopen: u32 = get_int(
        t,
        "fastopen",
        path,
        0,
        u64::from(u32::MAX >> 1),
        defaults::FASTOPEN,
        errs,
    );
    let fastopen_connect = get_bool(
        t,
        "fastopen_connect",
        path,
        defaults::FASTOPEN_CONNECT,
        errs,
    );
    let tls_handshake_timeout = get_duration(
        t,
        "tls_handshake_timeout",
        path,
        Duration::from_millis(defaults::TLS_HANDSHAKE_TIMEOUT_MS),
        errs,
    );
    let max_lifetime = Duration::from_secs(defaults::TLS_TICKET_LIFETIME_SECS);
    let mut tls_ticket_lifetime = get_duration(t, "tls_ticket_lifetime", path, max_lifetime, errs);
    if tls_ticket_lifetime > max_lifetime || tls_ticket_lifetime < Duration::from_secs(1) {
        errs.push(
            &join(path, "tls_ticket_lifetime"),
            "must be between 1s and 6h (rustls rotates its own ticket keys every 6h)",
        );
        tls_ticket_lifetime = max_lifetime;
    }
    let tls_session_cache: usize = get_int(
        t,
        "tls_session_cache",
        path,
        0,
        1 << 24,
        defaults::TLS_SESSION_CACHE,
        errs,
    );
    TransportConfig {
        fastopen,
        fastopen_connect,
        tls_handshake_timeout,
        tls_ticket_lifetime,
        tls_session_cache,
        listen_tls: BTreeMap::new(),
    }
}

/// `{ address = "...", route = "...", tls = { ... } }` in `proxy.listen`: the address
/// text and its TLS (`route` is checked with the other targets, in raw.rs).
pub(crate) fn check_listen_entry<'a>(
    t: &'a Table,
    path: &str,
    errs: &mut Errors,
) -> Option<(&'a str, Option<ListenerTls>)> {
    check_keys(t, path, LISTENER_ENTRY_KEYS, errs);
    let address = get_str(t, "address", path, errs);
    if address.is_none() && !t.contains_key("address") {
        errs.push(&join(path, "address"), "required (host:port or unix:/path)");
    }
    let tls = match t.get("tls") {
        None => None,
        Some(Value::Table(tls)) => check_listener_tls(tls, &join(path, "tls"), errs),
        Some(other) => {
            wrong_type(errs, &join(path, "tls"), "a table", other);
            None
        }
    };
    if tls.is_some() && address.is_some_and(|a| a.starts_with("unix:")) {
        errs.push(
            &join(path, "tls"),
            "TLS is for TCP listeners (a unix socket never leaves the host)",
        );
    }
    Some((address?, tls))
}

fn check_listener_tls(t: &Table, path: &str, errs: &mut Errors) -> Option<ListenerTls> {
    check_keys(t, path, LISTENER_TLS_KEYS, errs);
    let cert = required_path(t, "cert", path, errs);
    let key = required_path(t, "key", path, errs);
    let client_ca = optional_path(t, "client_ca", path, errs);
    Some(ListenerTls {
        cert: cert?,
        key: key?,
        client_ca,
        key_path: path.to_string(),
    })
}

/// `tls` of a pool.
pub(crate) fn check_backend_tls(v: &Value, path: &str, errs: &mut Errors) -> Option<BackendTls> {
    let Value::Table(t) = v else {
        wrong_type(errs, path, "a table", v);
        return None;
    };
    check_keys(t, path, BACKEND_TLS_KEYS, errs);
    let ca = optional_path(t, "ca", path, errs);
    let server_name = get_str(t, "server_name", path, errs).map(str::to_string);
    if server_name.as_deref() == Some("") {
        errs.push(&join(path, "server_name"), "must not be empty");
    }
    let cert = optional_path(t, "cert", path, errs);
    let key = optional_path(t, "key", path, errs);
    if cert.is_some() != key.is_some() {
        errs.push(
            path,
            "cert and key go together (a client certificate needs its key)",
        );
    }
    let insecure_skip_verify = get_bool(t, "insecure_skip_verify", path, false, errs);
    if ca.is_none() && !insecure_skip_verify {
        errs.push(
            &join(path, "ca"),
            "required: the CA file that signs the servers' certificates \
             (or insecure_skip_verify = true to accept any certificate)",
        );
    }
    Some(BackendTls {
        ca,
        server_name,
        cert,
        key,
        insecure_skip_verify,
        key_path: path.to_string(),
    })
}

fn optional_path(t: &Table, key: &str, path: &str, errs: &mut Errors) -> Option<PathBuf> {
    let s = get_str(t, key, path, errs)?;
    if s.is_empty() {
        errs.push(&join(path, key), "must not be empty");
        return None;
    }
    Some(PathBuf::from(s))
}

fn required_path(t: &Table, key: &str, path: &str, errs: &mut Errors) -> Option<PathBuf> {
    if !t.contains_key(key) {
        errs.push(&join(path, key), "required (a PEM file)");
        return None;
    }
    optional_path(t, key, path, errs)
}
