//! Listening sockets: one SO_REUSEPORT socket per listen address per worker, so the
//! kernel spreads new connections over workers without a shared accept lock.
use memroute_config::ListenAddress;
use socket2::{Domain, Protocol, Socket, Type};

use crate::ProxyError;

/// A bound, listening socket not yet attached to a runtime.
#[derive(Debug)]
pub(crate) enum BoundListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl BoundListener {
    pub(crate) fn describe(&self) -> String {
        match self {
            BoundListener::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            BoundListener::Unix(l) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
                .unwrap_or_default(),
        }
    }
}

/// The kernel silently caps listen(2)'s backlog at net.core.somaxconn: say so, and
/// return what the kernel will really use.
pub fn effective_backlog(requested: u32) -> u32 {
    let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    match somaxconn {
        Some(cap) if cap < requested => {
            tracing::warn!(
                requested,
                effective = cap,
                "listen backlog capped by net.core.somaxconn; raise it with `sysctl -w net.core.somaxconn={requested}`"
            );
            cap
        }
        _ => requested,
    }
}

/// Binds every configured address for one worker. Unix sockets cannot be shared with
/// SO_REUSEPORT, so only the first worker binds them.
pub(crate) fn bind_all(
    addresses: &[ListenAddress],
    backlog: u32,
    first_worker: bool,
) -> Result<Vec<BoundListener>, ProxyError> {
    let mut bound = Vec::new();
    for address in addresses {
        match address {
            ListenAddress::Tcp(text) => bound.push(BoundListener::Tcp(bind_tcp(text, backlog)?)),
            ListenAddress::Unix(path) if first_worker => {
                let describe = format!("unix:{}", path.display());
                // A stale socket file from an earlier run would make bind fail.
                let _ = std::fs::remove_file(path);
                let listener = std::os::unix::net::UnixListener::bind(path).map_err(|source| {
                    ProxyError::Listen {
                        address: describe.clone(),
                        source,
                    }
                })?;
                listener
                    .set_nonblocking(true)
                    .map_err(|source| ProxyError::Listen {
                        address: describe,
                        source,
                    })?;
                bound.push(BoundListener::Unix(listener));
            }
            ListenAddress::Unix(_) => {}
        }
    }
    Ok(bound)
}

fn bind_tcp(text: &str, backlog: u32) -> Result<std::net::TcpListener, ProxyError> {
    let error = |source| ProxyError::Listen {
        address: text.to_string(),
        source,
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
    socket.bind(&address.into()).map_err(error)?;
    socket
        .listen(backlog.min(i32::MAX as u32) as i32)
        .map_err(error)?;
    socket.set_nonblocking(true).map_err(error)?;
    Ok(socket.into())
}
