//! Connections to one backend server: TCP (with TCP Fast Open where the kernel allows
//! it), then TLS when the pool asks for it. One `Connector` per server is shared by every
//! worker's connections and by the server's health prober, so they all resume the same
//! TLS sessions: a reconnect after a restart or a network blip is a resumed handshake.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use memroute_config::BackendTls;
use tokio::net::{TcpSocket, TcpStream};

use crate::sockopt;
use crate::tls::{ClientTls, TlsCounters};
use crate::uring::Peer;
use crate::{NetError, Stream};

/// How to reach one backend server.
#[derive(Debug)]
pub struct Connector {
    address: Arc<str>,
    tls: Option<ClientTls>,
    fastopen: bool,
    /// Who to log in as once connected (memcached's ASCII auth). Carried here, beside the
    /// TLS client certificate, because it belongs to reaching the server and is shared by
    /// every worker's connections and the prober alike; memroute-backend speaks it.
    login: Option<BackendLogin>,
    /// Handshakes made to this server (full vs resumed), by every worker.
    pub counters: TlsCounters,
}

/// A user name and password for a memcached started with `-Y`.
#[derive(Clone, PartialEq, Eq)]
pub struct BackendLogin {
    pub username: String,
    pub password: String,
}

/// The password is never printed.
impl std::fmt::Debug for BackendLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BackendLogin({}, <redacted>)", self.username)
    }
}

impl Connector {
    /// A connector to `address` (`host:port`), speaking TLS when `tls` is set (reads its
    /// CA and client certificate files now; errors name the config setting).
    pub fn new(
        address: &str,
        tls: Option<&BackendTls>,
        fastopen: bool,
    ) -> Result<Connector, NetError> {
        let tls = tls
            .map(|settings| ClientTls::new(address, settings))
            .transpose()?;
        Ok(Connector {
            address: Arc::from(address),
            tls,
            fastopen: fastopen && fastopen_connect_allowed(),
            login: None,
            counters: TlsCounters::default(),
        })
    }

    /// A plaintext connector without TCP Fast Open (tests, tools).
    pub fn plain(address: &str) -> Connector {
        Connector {
            address: Arc::from(address),
            tls: None,
            fastopen: false,
            login: None,
            counters: TlsCounters::default(),
        }
    }

    /// This connector, logging in as `login` once connected.
    pub fn with_login(mut self, login: Option<BackendLogin>) -> Connector {
        self.login = login;
        self
    }

    /// Who to log in as once connected, if anyone.
    pub fn login(&self) -> Option<&BackendLogin> {
        self.login.as_ref()
    }

    pub fn address(&self) -> &Arc<str> {
        &self.address
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Connects (and completes the TLS handshake) within `timeout`.
    pub async fn connect(&self, timeout: Duration) -> Result<Stream, NetError> {
        match tokio::time::timeout(timeout, self.connect_unbounded()).await {
            Ok(result) => result,
            Err(_) => Err(NetError::ConnectTimeout),
        }
    }

    async fn connect_unbounded(&self) -> Result<Stream, NetError> {
        let tcp = self.connect_tcp().await?;
        // Small requests must not wait for Nagle: latency is the product.
        let _ = tcp.set_nodelay(true);
        // A backend's replies arrive in batches: its receives use the larger buffers.
        let socket = Stream::from_tcp(tcp, Peer::Backend).map_err(NetError::Connect)?;
        let Some(tls) = &self.tls else {
            return Ok(socket);
        };
        match socket {
            Stream::Tcp(tcp) => Ok(Stream::ClientTls(Box::new(self.handshake(tls, tcp).await?))),
            Stream::Uring(socket) => Ok(Stream::UringClientTls(Box::new(
                self.handshake(tls, socket).await?,
            ))),
            other => Ok(other),
        }
    }

    /// The client side of a TLS handshake over `socket` (a tokio or an io_uring socket).
    async fn handshake<S>(
        &self,
        tls: &ClientTls,
        socket: S,
    ) -> Result<tokio_rustls::client::TlsStream<S>, NetError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
        match connector.connect(tls.server_name.clone(), socket).await {
            Ok(stream) => {
                self.counters
                    .count_kind(stream.get_ref().1.handshake_kind());
                Ok(stream)
            }
            // With TCP Fast Open and a cookie for this server, `connect` returned before any
            // packet left (the SYN waits for the first write, the ClientHello), so a server
            // that is gone answers the handshake with a reset: that is a refused connect,
            // not a TLS failure, and the backend marks the server down at once as usual.
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                Err(NetError::ConnectRefused)
            }
            Err(error) => {
                self.counters.failed.fetch_add(1, Relaxed);
                Err(NetError::Handshake(Arc::from(error.to_string())))
            }
        }
    }

    async fn connect_tcp(&self) -> Result<TcpStream, NetError> {
        let addresses = tokio::net::lookup_host(&*self.address)
            .await
            .map_err(NetError::Connect)?;
        let mut last = None;
        for address in addresses {
            let socket = match address {
                std::net::SocketAddr::V4(_) => TcpSocket::new_v4(),
                std::net::SocketAddr::V6(_) => TcpSocket::new_v6(),
            }
            .map_err(NetError::Connect)?;
            if self.fastopen {
                // With a cookie for this server the kernel sends the first write (the
                // TLS ClientHello, or the first request) in the SYN. `connect` then
                // returns before anything is sent: a plain connection is proven by its
                // first reply, a TLS one by its handshake (see `connect_unbounded`).
                // Without a cookie it is an ordinary connect that asks for one.
                let _ = sockopt::set_fastopen_connect(&socket);
            }
            match socket.connect(address).await {
                Ok(stream) => return Ok(stream),
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                    last = Some(NetError::ConnectRefused)
                }
                Err(error) => last = Some(NetError::Connect(error)),
            }
        }
        Err(last.unwrap_or_else(|| {
            NetError::Connect(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "address resolves to nothing",
            ))
        }))
    }
}

/// Whether the kernel lets clients use TCP Fast Open. (When it does not, the proxy says so
/// once at start, with its other kernel limits.)
fn fastopen_connect_allowed() -> bool {
    sockopt::kernel_fastopen().is_some_and(|k| k.client)
}
