//! Transport setup through memroute-net: binding every worker's listeners (TLS ones share
//! one `ServerTls` per address), reloading certificates with the config and when their
//! files change, and the kernel settings and TLS files `--check` reports.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use memroute_config::{Config, ListenAddress, ListenerTls};
use memroute_net::{Connector, ListenOptions, ServerTls};
use tokio::sync::watch;

use memroute_proxy::transport::IndexedListener;
use memroute_proxy::ProxyError;

/// A TLS listener: its address as configured and as bound, and its TLS state.
#[derive(Debug, Clone)]
pub struct TlsListener {
    pub address: ListenAddress,
    /// The bound address (`127.0.0.1:11212`), as `stats` and `/metrics` name it.
    pub name: String,
    pub tls: Arc<ServerTls>,
}

/// Binds every configured address for every worker: the sockets of worker `i` are
/// `result.0[i]`, each with its index in `proxy.listen`. Later workers bind the ports the
/// first one got, so `:0` in a config still means one port shared by every worker.
pub fn bind_listeners(
    config: &Config,
    backlog: u32,
    workers: usize,
) -> Result<(Vec<Vec<IndexedListener>>, Vec<TlsListener>), ProxyError> {
    let transport = &config.proxy.transport;
    let options = ListenOptions {
        backlog,
        fastopen: transport.fastopen,
    };
    let mut first = Vec::new();
    let mut tls_listeners = Vec::new();
    for (index, address) in config.proxy.listen.iter().enumerate() {
        let tls = match transport.listen_tls.get(address) {
            Some(settings) => Some(Arc::new(ServerTls::new(settings, transport)?)),
            None => None,
        };
        if let Some(bound) = memroute_net::bind(address, options, tls.clone(), true)? {
            if let Some(tls) = tls {
                tls_listeners.push(TlsListener {
                    address: address.clone(),
                    name: bound.describe(),
                    tls,
                });
            }
            first.push((index, bound));
        }
    }
    let mut all = Vec::with_capacity(workers);
    for _ in 1..workers {
        let mut bound = Vec::new();
        for (index, listener) in &first {
            let Some(address) = listener.shared_address() else {
                continue;
            };
            let tls = listener.tls().cloned();
            let socket = memroute_net::bind(&address, options, tls, false)?;
            bound.extend(socket.map(|socket| (*index, socket)));
        }
        all.push(bound);
    }
    all.insert(0, first);
    Ok((all, tls_listeners))
}

/// On reload: each running TLS listener takes the certificate settings of `new` (or its
/// current ones if `new` drops TLS there, which needs a restart) and re-reads its files.
/// Returns the TLS settings now in force; an unusable certificate fails the reload.
pub fn reload_certificates(
    listeners: &[TlsListener],
    current: &Config,
    new: &Config,
) -> Result<BTreeMap<ListenAddress, ListenerTls>, ProxyError> {
    let mut in_force = BTreeMap::new();
    for listener in listeners {
        let settings = new
            .proxy
            .transport
            .listen_tls
            .get(&listener.address)
            .or_else(|| current.proxy.transport.listen_tls.get(&listener.address));
        let Some(settings) = settings else { continue };
        // Checked for every listener before any is switched, so a reload is all or nothing.
        memroute_net::check_listener_tls(settings)?;
        in_force.insert(listener.address.clone(), settings.clone());
    }
    for listener in listeners {
        if let Some(settings) = in_force.get(&listener.address) {
            if listener.tls.reload(settings)? {
                tracing::info!(listener = %listener.name, cert = %settings.cert.display(), "TLS certificate reloaded");
            }
        }
    }
    Ok(in_force)
}

/// Reloads each listener whose certificate files changed; logs what happened.
pub fn recheck_certificates(listeners: &[TlsListener]) {
    for listener in listeners {
        match listener.tls.reload_if_changed() {
            Ok(true) => {
                tracing::info!(listener = %listener.name, "TLS certificate files changed; reloaded")
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(listener = %listener.name, %error, "TLS certificate files changed but cannot be used; keeping the running certificate")
            }
        }
    }
}

/// How often the certificate files are looked at (a stat per file, nothing read).
const CERT_POLL: Duration = Duration::from_secs(2);

/// Reloads a listener's certificate when its files change on disk (cert-manager and
/// similar rewrite them in place), without waiting for a config reload. A file caught
/// half-written fails to parse and is tried again on the next look; the running
/// certificate stays until then.
pub fn watch_certificates(
    listeners: &[TlsListener],
    shutdown: watch::Receiver<bool>,
) -> Result<(), ProxyError> {
    if listeners.is_empty() {
        return Ok(());
    }
    let listeners = listeners.to_vec();
    std::thread::Builder::new()
        .name("memroute-certs".to_string())
        .spawn(move || {
            while !*shutdown.borrow() {
                std::thread::park_timeout(CERT_POLL);
                recheck_certificates(&listeners);
            }
        })
        .map_err(ProxyError::Thread)?;
    Ok(())
}

/// Where the kernel's settings keep the proxy from what `config` asks, each with the sysctl
/// that lifts it: the listen backlog capped by `net.core.somaxconn`, TCP Fast Open off for
/// listeners or for connects. Tuning notes, not faults (the defaults of most kernels do
/// both): the proxy logs them once at start, as one line at info.
pub fn kernel_limits(config: &Config) -> Vec<String> {
    let mut limits = Vec::new();
    let requested = config.proxy.backlog;
    let backlog = memroute_net::effective_backlog(requested);
    if backlog < requested {
        limits.push(format!(
            "listen backlog {backlog}, not proxy.backlog {requested} (net.core.somaxconn; `sysctl -w net.core.somaxconn={requested}`)"
        ));
    }
    let transport = &config.proxy.transport;
    let tcp_listener = config
        .proxy
        .listen
        .iter()
        .any(|l| matches!(l, ListenAddress::Tcp(_)));
    let kernel = memroute_net::sockopt::kernel_fastopen();
    let sysctl = memroute_net::sockopt::FASTOPEN_SYSCTL;
    if transport.fastopen > 0 && tcp_listener && kernel.is_some_and(|k| !k.server) {
        limits.push(format!(
            "TCP Fast Open off on listeners ({sysctl} lacks bit 2; `sysctl -w {sysctl}=3`)"
        ));
    }
    if transport.fastopen_connect && kernel.is_some_and(|k| !k.client) {
        limits.push(format!(
            "TCP Fast Open off on backend connects ({sysctl} lacks bit 1; `sysctl -w {sysctl}=3`)"
        ));
    }
    limits
}

/// What `memroute --check` says about the transport: every listener's TLS and TFO, every
/// pool's TLS, and the kernel's TFO switch. Reads every certificate, key and CA file;
/// the errors (each naming its setting and file) come back in the second element.
pub fn check_transport(config: &Config) -> (String, Vec<String>) {
    let transport = &config.proxy.transport;
    let kernel = memroute_net::sockopt::kernel_fastopen();
    let mut out = String::new();
    let mut errors = Vec::new();
    let tfo = match (transport.fastopen, kernel) {
        (0, _) => "off".to_string(),
        (queue, Some(k)) if !k.server => format!(
            "queue {queue}, but the kernel has it off for listeners ({} lacks bit 2)",
            memroute_net::sockopt::FASTOPEN_SYSCTL
        ),
        (queue, _) => format!("queue {queue}"),
    };
    for address in &config.proxy.listen {
        let name = match address {
            ListenAddress::Tcp(a) => a.clone(),
            ListenAddress::Unix(p) => format!("unix:{}", p.display()),
        };
        let tls = match transport.listen_tls.get(address) {
            None => "plaintext".to_string(),
            Some(tls) => {
                if let Err(error) = memroute_net::check_listener_tls(tls) {
                    errors.push(error.to_string());
                }
                format!(
                    "TLS 1.2+1.3 cert {} key {}{}, handshake timeout {:?}, tickets rotate every {:?}, TLS 1.2 session cache {}",
                    tls.cert.display(),
                    tls.key.display(),
                    tls.client_ca
                        .as_ref()
                        .map(|ca| format!(", client certificates required (CA {})", ca.display()))
                        .unwrap_or_default(),
                    transport.tls_handshake_timeout,
                    transport.tls_ticket_lifetime,
                    transport.tls_session_cache,
                )
            }
        };
        let tfo = match address {
            ListenAddress::Tcp(_) => format!(", TCP Fast Open {tfo}"),
            ListenAddress::Unix(_) => String::new(),
        };
        let _ = writeln!(out, "listener {name}: {tls}{tfo}");
    }
    let connect_tfo = match (transport.fastopen_connect, kernel) {
        (false, _) => "off".to_string(),
        (true, Some(k)) if !k.client => format!(
            "on, but the kernel has it off for clients ({} lacks bit 1)",
            memroute_net::sockopt::FASTOPEN_SYSCTL
        ),
        (true, _) => "on".to_string(),
    };
    let _ = writeln!(out, "backend connects: TCP Fast Open {connect_tfo}");
    for (name, pool) in &config.pools {
        let Some(tls) = &pool.tls else { continue };
        // Reads the files exactly as the proxy will (one connector, nothing connected).
        let probe_address = pool
            .servers
            .first()
            .map_or("localhost:11211", |s| s.address.as_str());
        if let Err(error) = Connector::new(probe_address, Some(tls), false) {
            errors.push(error.to_string());
        }
        let _ = writeln!(
            out,
            "pool {name}: TLS{} server name {}{}, sessions resumed per server",
            match (&tls.ca, tls.insecure_skip_verify) {
                (_, true) => " WITHOUT CERTIFICATE VERIFICATION (insecure_skip_verify)".to_string(),
                (Some(ca), false) => format!(" verified against {}", ca.display()),
                (None, false) => String::new(),
            },
            tls.server_name
                .as_deref()
                .unwrap_or("from each server's address"),
            tls.cert
                .as_ref()
                .map(|c| format!(", client certificate {}", c.display()))
                .unwrap_or_default(),
        );
    }
    (out, errors)
}
