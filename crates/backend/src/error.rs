use std::sync::Arc;
use thiserror::Error;

/// Why a request sent to a backend did not get a reply. Cloneable: one connection
/// failure is reported to every request that was in flight on it.
#[derive(Debug, Clone, Error)]
pub enum BackendError {
    /// The server could not be reached (connect refused/failed, or the connection broke)
    /// and memroute fails requests fast until a reconnect succeeds.
    #[error("backend {server} unavailable: {reason}")]
    Unavailable { server: Arc<str>, reason: Arc<str> },
    /// No reply within the pool's timeout.
    #[error("backend {server} timed out")]
    Timeout { server: Arc<str> },
    /// The server sent bytes that are not a memcached reply.
    #[error("backend {server} sent a malformed reply")]
    BadReply { server: Arc<str> },
    /// memroute itself is stopping this connection.
    #[error("backend {server} connection closed by proxy")]
    Closed { server: Arc<str> },
}

impl BackendError {
    /// The cause without the server's address, for messages that name the server already.
    pub fn reason(&self) -> Arc<str> {
        match self {
            BackendError::Unavailable { reason, .. } => reason.clone(),
            BackendError::Timeout { .. } => Arc::from("timed out"),
            BackendError::BadReply { .. } => Arc::from("sent a malformed reply"),
            BackendError::Closed { .. } => Arc::from("connection closed by proxy"),
        }
    }

    /// True for timeouts (counted separately in stats).
    pub fn is_timeout(&self) -> bool {
        matches!(self, BackendError::Timeout { .. })
    }
}
