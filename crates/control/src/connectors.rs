//! The backend connectors of a generation: one per server, kept across reloads while what
//! a connection needs is unchanged (address, the pool's TLS settings and their files, Fast
//! Open, the login), so reconnects keep resuming the stored TLS sessions.
use std::sync::Arc;

use memroute_config::Config;
use memroute_net::{BackendLogin, Connector};
use memroute_proxy::ProxyError;

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
    /// A changed user or password (its file rewritten) means new connections, which log
    /// in with it.
    login: Option<BackendLogin>,
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
            let login = pool
                .auth
                .as_ref()
                .map(crate::credentials::backend_login)
                .transpose()?;
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
                    login: login.clone(),
                };
                let connector = match self.known.iter().find(|(k, _)| *k == key) {
                    Some((_, connector)) => connector.clone(),
                    None => Arc::new(
                        Connector::new(&server.address, pool.tls.as_ref(), fastopen)?
                            .with_login(login.clone()),
                    ),
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
