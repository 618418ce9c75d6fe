use thiserror::Error;

/// Why the proxy could not start.
#[derive(Debug, Error)]
pub enum ProxyError {
    // The reason is in the message and deliberately not a `source`: printed with its
    // chain (`{:#}`), a source would say "Address already in use" twice.
    #[error("cannot listen on {address}: {error}")]
    Listen {
        address: String,
        error: std::io::Error,
    },
    /// Listening sockets, TLS certificates and keys, backend TLS settings.
    #[error(transparent)]
    Net(#[from] memroute_net::NetError),
    #[error("routing: {0}")]
    Routing(#[from] memroute_routing::RoutingError),
    #[error("cannot start a worker thread: {0}")]
    Thread(std::io::Error),
    /// A pool's password file or a listener's authfile that cannot be read or used.
    #[error("{setting}: {reason}")]
    Auth { setting: String, reason: String },
}
