//! The proxy's use of memroute-net: binding every worker's listeners (TLS ones share one
//! `ServerTls` per address), reloading certificates with the config and when their files
//! change, and the TLS handshake counters in `stats` and `/metrics`.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use memroute_config::{Config, ListenAddress, ListenerTls};
use memroute_net::{BoundListener, Connector, ListenOptions, ServerTls, TlsCounters};
use tokio::sync::watch;

use crate::ProxyError;

/// A TLS listener: its address as configured and as bound, and its TLS state.
#[derive(Debug, Clone)]
pub(crate) struct TlsListener {
    pub address: ListenAddress,
    /// The bound address (`127.0.0.1:11212`), as `stats` and `/metrics` name it.
    pub name: String,
    pub tls: Arc<ServerTls>,
}

/// Binds every configured address for every worker: the sockets of worker `i` are
/// `result.0[i]`. Later workers bind the ports the first one got, so `:0` in a config
/// still means one port shared by every worker.
pub(crate) fn bind_listeners(
    config: &Config,
    backlog: u32,
    workers: usize,
) -> Result<(Vec<Vec<BoundListener>>, Vec<TlsListener>), ProxyError> {
    let transport = &config.proxy.transport;
    let options = ListenOptions {
        backlog,
        fastopen: transport.fastopen,
    };
    let mut first = Vec::new();
    let mut tls_listeners = Vec::new();
    for address in &config.proxy.listen {
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
            first.push(bound);
        }
    }
    let mut all = Vec::with_capacity(workers);
    for _ in 1..workers {
        let mut bound = Vec::new();
        for listener in &first {
            let Some(address) = listener.shared_address() else {
                continue;
            };
            let tls = listener.tls().cloned();
            bound.extend(memroute_net::bind(&address, options, tls, false)?);
        }
        all.push(bound);
    }
    all.insert(0, first);
    Ok((all, tls_listeners))
}

/// On reload: each running TLS listener takes the certificate settings of `new` (or its
/// current ones if `new` drops TLS there, which needs a restart) and re-reads its files.
/// Returns the TLS settings now in force; an unusable certificate fails the reload.
pub(crate) fn reload_certificates(
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

/// How often the certificate files are looked at (a stat per file, nothing read).
const CERT_POLL: Duration = Duration::from_secs(2);

/// Reloads a listener's certificate when its files change on disk (cert-manager and
/// similar rewrite them in place), without waiting for a config reload. A file caught
/// half-written fails to parse and is tried again on the next look; the running
/// certificate stays until then.
pub(crate) fn watch_certificates(
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
                for listener in &listeners {
                    match listener.tls.reload_if_changed() {
                        Ok(true) => tracing::info!(listener = %listener.name, "TLS certificate files changed; reloaded"),
                        Ok(false) => {}
                        Err(error) => tracing::warn!(listener = %listener.name, %error, "TLS certificate files changed but cannot be used; keeping the running certificate"),
                    }
                }
            }
        })
        .map_err(ProxyError::Thread)?;
    Ok(())
}

/// One connector per server of `config`, indexed [pool id][server index] like the
/// health table; reused across reloads while the address, the pool's TLS settings and
/// their files stay the same, so reconnects keep resuming the stored sessions.
#[derive(Debug, Default)]
pub(crate) struct Connectors {
    known: Vec<(ConnectorKey, Arc<Connector>)>,
}

#[derive(Debug, Clone, PartialEq)]
struct ConnectorKey {
    address: String,
    tls: Option<memroute_config::BackendTls>,
    files: Vec<memroute_net::FileStamp>,
    fastopen: bool,
}

impl Connectors {
    pub(crate) fn for_config(
        &mut self,
        pool_names: &[String],
        config: &Config,
    ) -> Result<Vec<Vec<Arc<Connector>>>, ProxyError> {
        let fastopen = config.proxy.transport.fastopen_connect;
        let mut next = Vec::new();
        let mut table = Vec::with_capacity(pool_names.len());
        for name in pool_names {
            let Some(pool) = config.pools.get(name) else {
                table.push(Vec::new());
                continue;
            };
            if let Some(tls) = pool.tls.as_ref().filter(|t| t.insecure_skip_verify) {
                tracing::warn!(
                    pool = %name,
                    setting = %format!("{}.insecure_skip_verify", tls.key_path),
                    "INSECURE: backend TLS certificates are NOT verified for this pool; anyone on the path can read and change its traffic"
                );
            }
            let mut servers = Vec::with_capacity(pool.servers.len());
            for server in &pool.servers {
                let key = ConnectorKey {
                    address: server.address.clone(),
                    tls: pool.tls.clone(),
                    files: pool
                        .tls
                        .as_ref()
                        .map(memroute_net::FileStamp::of_backend)
                        .unwrap_or_default(),
                    fastopen,
                };
                let connector = match self.known.iter().find(|(k, _)| *k == key) {
                    Some((_, connector)) => connector.clone(),
                    None => Arc::new(Connector::new(
                        &server.address,
                        pool.tls.as_ref(),
                        fastopen,
                    )?),
                };
                next.push((key, connector.clone()));
                servers.push(connector);
            }
            table.push(servers);
        }
        self.known = next;
        Ok(table)
    }
}

/// `STAT` lines for the TLS handshake counters of listeners and backend servers.
pub(crate) fn render_stats(
    listeners: &[(String, Arc<ServerTls>)],
    connectors: &[(String, Arc<Connector>)],
    out: &mut String,
) {
    for (name, tls) in listeners {
        let c = &tls.counters;
        for (kind, value) in handshake_counts(c) {
            let _ = write!(
                out,
                "STAT listener:{name}:tls_handshakes_{kind} {value}\r\n"
            );
        }
    }
    for (pool, connector) in connectors.iter().filter(|(_, c)| c.is_tls()) {
        let address = connector.address();
        for (kind, value) in handshake_counts(&connector.counters).into_iter().take(3) {
            let _ = write!(
                out,
                "STAT server:{pool}:{address}:tls_handshakes_{kind} {value}\r\n"
            );
        }
    }
}

/// The same counters for `/metrics`.
pub(crate) fn render_metrics(
    listeners: &[(String, Arc<ServerTls>)],
    connectors: &[(String, Arc<Connector>)],
    out: &mut String,
) {
    out.push_str("# HELP memroute_listener_tls_handshakes_total TLS handshakes with clients by outcome (full, resumed, failed, timeout).\n# TYPE memroute_listener_tls_handshakes_total counter\n");
    for (name, tls) in listeners {
        for (kind, value) in handshake_counts(&tls.counters) {
            let _ = writeln!(
                out,
                "memroute_listener_tls_handshakes_total{{listener=\"{name}\",kind=\"{kind}\"}} {value}"
            );
        }
    }
    out.push_str("# HELP memroute_backend_tls_handshakes_total TLS handshakes with servers by outcome (full, resumed, failed).\n# TYPE memroute_backend_tls_handshakes_total counter\n");
    for (pool, connector) in connectors.iter().filter(|(_, c)| c.is_tls()) {
        let address = connector.address();
        for (kind, value) in handshake_counts(&connector.counters).into_iter().take(3) {
            let _ = writeln!(
                out,
                "memroute_backend_tls_handshakes_total{{pool=\"{pool}\",server=\"{address}\",kind=\"{kind}\"}} {value}"
            );
        }
    }
}

fn handshake_counts(c: &TlsCounters) -> [(&'static str, u64); 4] {
    [
        ("full", c.full.load(Relaxed)),
        ("resumed", c.resumed.load(Relaxed)),
        ("failed", c.failed.load(Relaxed)),
        ("timeout", c.timed_out.load(Relaxed)),
    ]
}
