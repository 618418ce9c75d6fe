//! The checks of the transport settings: TLS on listeners and to backends, TLS session
//! resumption, TCP Fast Open, with the same key-path errors as the rest of the config
//! (the settings themselves are in `checked`, their defaults in `defaults`). The files
//! they name are read (and cert/key pairs matched) by memroute-net, which reports its
//! errors with the same key paths ([`ListenerTls::key_path`], [`BackendTls::key_path`]).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use toml::{Table, Value};

use crate::checked::{BackendTls, ListenerTls, TransportConfig};
use crate::defaults;
use crate::walk::{check_keys, get_bool, get_duration, get_int, get_str, join, wrong_type, Errors};
use crate::ErrorKind;

/// `[proxy]` keys this module checks.
pub(crate) const PROXY_TRANSPORT_KEYS: &[&str] = &[
    "fastopen",
    "fastopen_connect",
    "tls_handshake_timeout",
    "tls_ticket_lifetime",
    "tls_session_cache",
];
const LISTENER_ENTRY_KEYS: &[&str] = &["address", "route", "tls", "auth", "routing_prefix"];
const LISTENER_TLS_KEYS: &[&str] = &["cert", "key", "client_ca"];
const BACKEND_TLS_KEYS: &[&str] = &["ca", "server_name", "cert", "key", "insecure_skip_verify"];

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
            ErrorKind::OutOfRange,
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
        errs.push(
            ErrorKind::Missing,
            &join(path, "address"),
            "required (host:port or unix:/path)",
        );
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
            ErrorKind::Conflict,
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
        errs.push(
            ErrorKind::Invalid,
            &join(path, "server_name"),
            "must not be empty",
        );
    }
    let cert = optional_path(t, "cert", path, errs);
    let key = optional_path(t, "key", path, errs);
    if cert.is_some() != key.is_some() {
        errs.push(
            ErrorKind::Conflict,
            path,
            "cert and key go together (a client certificate needs its key)",
        );
    }
    let insecure_skip_verify = get_bool(t, "insecure_skip_verify", path, false, errs);
    if ca.is_none() && !insecure_skip_verify {
        errs.push(
            ErrorKind::Missing,
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
        errs.push(ErrorKind::Invalid, &join(path, key), "must not be empty");
        return None;
    }
    Some(PathBuf::from(s))
}

fn required_path(t: &Table, key: &str, path: &str, errs: &mut Errors) -> Option<PathBuf> {
    if !t.contains_key(key) {
        errs.push(
            ErrorKind::Missing,
            &join(path, key),
            "required (a PEM file)",
        );
        return None;
    }
    optional_path(t, key, path, errs)
}
