use thiserror::Error;

/// Why the proxy could not start.
#[derive(Debug, Error)]
pub enum ProxyError {
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
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
