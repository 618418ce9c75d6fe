use std::sync::Arc;

use thiserror::Error;

/// Everything that can go wrong in the transport: binding, TLS setup, handshakes, connects.
#[derive(Debug, Error)]
pub enum NetError {
    // The reason is in the message and deliberately not a `source`: printed with its
    // chain (`{:#}`), a source would say "Address already in use" twice.
    #[error("cannot listen on {address}: {error}")]
    Listen {
        address: String,
        error: std::io::Error,
    },
    /// A certificate, key or CA file cannot be used; `key_path` is the config setting.
    #[error("{key_path}: {reason}")]
    TlsSetup { key_path: String, reason: String },
    /// A client did not finish its TLS handshake within the listener's timeout.
    #[error("TLS handshake timed out")]
    HandshakeTimeout,
    /// A TLS handshake failed (either side): bad certificate, plaintext peer, protocol error.
    #[error("TLS handshake failed: {0}")]
    Handshake(Arc<str>),
    #[error("connection refused")]
    ConnectRefused,
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("{0}")]
    Connect(std::io::Error),
}

impl NetError {
    pub(crate) fn setup(key_path: &str, reason: impl Into<String>) -> NetError {
        NetError::TlsSetup {
            key_path: key_path.to_string(),
            reason: reason.into(),
        }
    }
}
