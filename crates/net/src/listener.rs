//! Listening sockets: one SO_REUSEPORT socket per listen address per worker, so the
//! kernel spreads new connections over workers without a shared accept lock; TCP Fast
//! Open and the backlog are set here; a TLS listener's sockets share one [`ServerTls`].
//!
//! ```text
//!  bind() on the main thread -> BoundListener (std socket, Send)
//!  Listener::attach() on the worker's runtime -> accept() -> Incoming (plain socket)
//!  Incoming::establish() in the session's own task -> Stream (plain, or TLS after a
//!    handshake bounded by tls_handshake_timeout): a slow handshake never holds up accept
//! ```
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use memroute_config::ListenAddress;
use socket2::{Domain, Protocol, Socket, Type};

use crate::sockopt;
use crate::uring::Peer;
use crate::{NetError, ServerTls, Stream};

/// How listening sockets are set up.
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    /// listen(2)'s backlog (already capped by [`effective_backlog`]).
    pub backlog: u32,
    /// TCP Fast Open queue; 0 leaves TFO off.
    pub fastopen: u32,
}

/// A bound, listening socket not yet attached to a runtime.
#[derive(Debug)]
pub struct BoundListener {
    socket: BoundSocket,
    tls: Option<Arc<ServerTls>>,
}

#[derive(Debug)]
enum BoundSocket {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl BoundListener {
    /// `host:port` actually bound, or `unix:/path`.
    pub fn describe(&self) -> String {
        match &self.socket {
            BoundSocket::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            BoundSocket::Unix(l) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
                .unwrap_or_default(),
        }
    }

    /// The address other workers bind to share this socket's port (`None` for unix
    /// sockets, which only one worker serves).
    pub fn shared_address(&self) -> Option<ListenAddress> {
        match &self.socket {
            BoundSocket::Tcp(_) => Some(ListenAddress::Tcp(self.describe())),
            BoundSocket::Unix(_) => None,
        }
    }

    pub fn tls(&self) -> Option<&Arc<ServerTls>> {
        self.tls.as_ref()
    }
}

/// What the kernel really uses of listen(2)'s `requested` backlog: it silently caps it at
/// net.core.somaxconn. (The proxy says so once at start, with its other kernel limits.)
pub fn effective_backlog(requested: u32) -> u32 {
    let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    somaxconn.map_or(requested, |cap| cap.min(requested))
}

/// Binds `address` for one worker. Unix sockets cannot be shared with SO_REUSEPORT, so
/// only the first worker binds them (`None` for the others).
pub fn bind(
    address: &ListenAddress,
    options: ListenOptions,
    tls: Option<Arc<ServerTls>>,
    first_worker: bool,
) -> Result<Option<BoundListener>, NetError> {
    let socket = match address {
        ListenAddress::Tcp(text) => BoundSocket::Tcp(bind_tcp(text, options)?),
        ListenAddress::Unix(path) if first_worker => {
            let describe = format!("unix:{}", path.display());
            let error = |error| NetError::Listen {
                address: describe.clone(),
                error,
            };
            // A stale socket file from an earlier run would make bind fail.
            let _ = std::fs::remove_file(path);
            let listener = std::os::unix::net::UnixListener::bind(path).map_err(error)?;
            listener.set_nonblocking(true).map_err(error)?;
            BoundSocket::Unix(listener)
        }
        ListenAddress::Unix(_) => return Ok(None),
    };
    Ok(Some(BoundListener { socket, tls }))
}

fn bind_tcp(text: &str, options: ListenOptions) -> Result<std::net::TcpListener, NetError> {
    let error = |error| NetError::Listen {
        address: text.to_string(),
        error,
    };
    let address = std::net::ToSocketAddrs::to_socket_addrs(text)
        .map_err(error)?
        .next()
        .ok_or_else(|| {
            error(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "address resolves to nothing",
            ))
        })?;
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(error)?;
    socket.set_reuse_address(true).map_err(error)?;
    socket.set_reuse_port(true).map_err(error)?;
    socket.set_nodelay(true).map_err(error)?;
    if options.fastopen > 0 {
        enable_listener_fastopen(&socket, text, options.fastopen);
    }
    socket.bind(&address.into()).map_err(error)?;
    socket
        .listen(options.backlog.min(i32::MAX as u32) as i32)
        .map_err(error)?;
    socket.set_nonblocking(true).map_err(error)?;
    Ok(socket.into())
}

/// TFO is an optimisation: failing to turn it on is logged, never fatal. (A kernel that has
/// it off for listeners is said once at start, with the proxy's other kernel limits.)
fn enable_listener_fastopen(socket: &Socket, address: &str, queue: u32) {
    if let Err(error) = sockopt::set_fastopen_listener(socket, queue) {
        tracing::warn!(listener = %address, %error, "cannot enable TCP Fast Open on the listener");
    }
}

/// A listener attached to a worker's runtime.
#[derive(Debug)]
pub struct Listener {
    socket: AttachedSocket,
    tls: Option<Arc<ServerTls>>,
}

#[derive(Debug)]
enum AttachedSocket {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// A connection accepted, before its TLS handshake (if any).
#[derive(Debug)]
pub struct Incoming {
    stream: Stream,
    tls: Option<Arc<ServerTls>>,
    /// The client's address (`ip:port`), or `unix-socket`: what client error logs name.
    pub peer: String,
}

impl Listener {
    /// Attaches a bound listener to the current tokio runtime.
    pub fn attach(bound: BoundListener) -> std::io::Result<Listener> {
        let socket = match bound.socket {
            BoundSocket::Tcp(l) => AttachedSocket::Tcp(tokio::net::TcpListener::from_std(l)?),
            BoundSocket::Unix(l) => AttachedSocket::Unix(tokio::net::UnixListener::from_std(l)?),
        };
        Ok(Listener {
            socket,
            tls: bound.tls,
        })
    }

    pub async fn accept(&self) -> std::io::Result<Incoming> {
        let (stream, peer) = match &self.socket {
            AttachedSocket::Tcp(l) => {
                let (stream, peer) = l.accept().await?;
                // Small replies must not wait for Nagle: latency is the product.
                let _ = stream.set_nodelay(true);
                (Stream::from_tcp(stream, Peer::Client)?, peer.to_string())
            }
            AttachedSocket::Unix(l) => (
                Stream::from_unix(l.accept().await?.0, Peer::Client)?,
                "unix-socket".to_string(),
            ),
        };
        Ok(Incoming {
            stream,
            tls: self.tls.clone(),
            peer,
        })
    }
}

impl Incoming {
    /// The stream at once when there is no handshake to do (a plaintext listener), or the
    /// connection back: a session starts serving a plaintext client without building (and
    /// storing) the handshake's future.
    pub fn into_plain(self) -> Result<Stream, Incoming> {
        match (&self.tls, &self.stream) {
            (Some(_), Stream::Tcp(_) | Stream::Uring(_)) => Err(self),
            _ => Ok(self.stream),
        }
    }

    /// The stream to serve: at once for a plaintext listener; after the TLS handshake,
    /// bounded by the listener's handshake timeout, for a TLS one. Every outcome of a
    /// handshake is counted on the listener.
    pub async fn establish(self) -> Result<Stream, NetError> {
        let Some(tls) = self.tls else {
            return Ok(self.stream);
        };
        match self.stream {
            Stream::Tcp(tcp) => Ok(Stream::ServerTls(Box::new(handshake(&tls, tcp).await?))),
            Stream::Uring(socket) => Ok(Stream::UringServerTls(Box::new(
                handshake(&tls, socket).await?,
            ))),
            // Config validation allows TLS on TCP listeners only.
            other => Ok(other),
        }
    }
}

/// The server side of a TLS handshake over `socket` (a tokio or an io_uring socket),
/// bounded by the listener's handshake timeout; every outcome is counted.
async fn handshake<S>(
    tls: &ServerTls,
    socket: S,
) -> Result<tokio_rustls::server::TlsStream<S>, NetError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let counters = &tls.counters;
    // Boxed: the handshake's state (rustls's connection, the timer) is large, and an
    // inline future would size every session's task for it, plaintext ones included,
    // for the connection's whole life. The box is freed once the handshake is over.
    let handshake = Box::pin(tokio::time::timeout(
        tls.handshake_timeout(),
        tls.acceptor().accept(socket),
    ));
    match handshake.await {
        Ok(Ok(stream)) => {
            counters.count_kind(stream.get_ref().1.handshake_kind());
            Ok(stream)
        }
        Ok(Err(error)) => {
            counters.failed.fetch_add(1, Relaxed);
            Err(NetError::Handshake(Arc::from(error.to_string())))
        }
        Err(_) => {
            counters.timed_out.fetch_add(1, Relaxed);
            Err(NetError::HandshakeTimeout)
        }
    }
}
