use std::sync::Arc;
use thiserror::Error;

/// Why a request sent to a backend did not get a reply. Cloneable: one connection
/// failure is reported to every request that was in flight on it.
#[derive(Debug, Clone, Error)]
pub enum BackendError {
    /// The connection broke while the request may already have been written (a write
    /// failed, or the server closed the connection), so it may have been executed.
    #[error("backend {server} unavailable: {reason}")]
    Unavailable { server: Arc<str>, reason: Arc<str> },
    /// There was no connection to write the request on (connecting failed, or the
    /// connection is waiting out its reconnect backoff): failed fast, never written.
    /// Same text as `Unavailable`: to the client both mean "could not reach the server".
    #[error("backend {server} unavailable: {reason}")]
    NotConnected { server: Arc<str>, reason: Arc<str> },
    /// The server is marked down by health checking: failed fast, never written.
    #[error("backend {server} is marked down: {reason}")]
    Down { server: Arc<str>, reason: Arc<str> },
    /// No reply within the pool's timeout.
    #[error("backend {server} timed out")]
    Timeout { server: Arc<str> },
    /// The server sent bytes that are not a memcached reply.
    #[error("backend {server} sent a malformed reply")]
    BadReply { server: Arc<str> },
    /// memroute itself is stopping this connection.
    #[error("backend {server} connection closed by proxy")]
    Closed { server: Arc<str> },
    /// The reply was to come from a task inside the proxy (a backend connection, a route's
    /// child request) that ended without giving it: while a worker stops, or after a
    /// connection's reply slot was dropped. Not a fault of any one server, so none is named.
    #[error("no reply: the proxy task that was to deliver it ended")]
    Lost,
    /// A DNS-discovered pool's host name could not be resolved to any address.
    #[error("cannot resolve {host}: {reason}")]
    Resolve { host: Arc<str>, reason: Arc<str> },
}

impl BackendError {
    /// The cause without the server's address, for messages that name the server already.
    pub fn reason(&self) -> Arc<str> {
        match self {
            BackendError::Unavailable { reason, .. }
            | BackendError::NotConnected { reason, .. }
            | BackendError::Resolve { reason, .. } => reason.clone(),
            BackendError::Down { reason, .. } => Arc::from(format!("marked down: {reason}")),
            BackendError::Timeout { .. } => Arc::from("timed out"),
            BackendError::BadReply { .. } => Arc::from("sent a malformed reply"),
            BackendError::Closed { .. } => Arc::from("connection closed by proxy"),
            BackendError::Lost => {
                Arc::from("no reply: the proxy task that was to deliver it ended")
            }
        }
    }

    /// True for timeouts (counted separately in stats).
    pub fn is_timeout(&self) -> bool {
        matches!(self, BackendError::Timeout { .. })
    }

    /// True when the request certainly never reached the server (marked down, or failed
    /// fast during reconnect backoff, or connect failed before it was written) — safe to
    /// retry even for non-idempotent commands.
    pub fn never_sent(&self) -> bool {
        // Closed is not here: requests in flight when a connection shuts down get it too,
        // and those were written.
        matches!(
            self,
            BackendError::Down { .. } | BackendError::NotConnected { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fail_fast_errors_are_never_sent() {
        let server: Arc<str> = Arc::from("127.0.0.1:1");
        let reason: Arc<str> = Arc::from("connection refused");
        let down = BackendError::Down {
            server: server.clone(),
            reason: reason.clone(),
        };
        assert!(down.never_sent());
        assert_eq!(&*down.reason(), "marked down: connection refused");
        assert_eq!(
            down.to_string(),
            "backend 127.0.0.1:1 is marked down: connection refused"
        );
        let not_connected = BackendError::NotConnected {
            server: server.clone(),
            reason: reason.clone(),
        };
        assert!(not_connected.never_sent());
        assert_eq!(
            not_connected.to_string(),
            "backend 127.0.0.1:1 unavailable: connection refused"
        );
        for sent in [
            BackendError::Unavailable {
                server: server.clone(),
                reason,
            },
            BackendError::Timeout {
                server: server.clone(),
            },
            BackendError::BadReply {
                server: server.clone(),
            },
            BackendError::Closed { server },
            BackendError::Lost,
        ] {
            assert!(!sent.never_sent(), "{sent}");
        }
    }
}
