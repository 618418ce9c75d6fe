use thiserror::Error;

/// What memcached answers to input it cannot accept. Each variant is the
/// whole reply line, byte-for-byte as memcached 1.6 sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorReply {
    /// `ERROR\r\n`: unknown command (also empty line).
    Error,
    /// `CLIENT_ERROR <msg>\r\n`
    Client(&'static str),
    /// `SERVER_ERROR <msg>\r\n`
    Server(&'static str),
    /// Nothing at all: memcached rejects the request but sends no reply, either
    /// because the client asked for `noreply` (text protocol errors are
    /// suppressed too) or because it closes the connection without a word.
    Silent,
}

impl ErrorReply {
    /// The full reply line including the trailing `\r\n`.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            ErrorReply::Error => b"ERROR\r\n".to_vec(),
            ErrorReply::Client(m) => format!("CLIENT_ERROR {m}\r\n").into_bytes(),
            ErrorReply::Server(m) => format!("SERVER_ERROR {m}\r\n").into_bytes(),
            ErrorReply::Silent => Vec::new(),
        }
    }
}

/// Errors of the protocol crate (malformed backend replies and the like).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("malformed reply from server: {0}")]
    BadReply(&'static str),
    /// An authfile (memcached's `user:password` lines) with a line that is not one.
    #[error("line {line} is not `user:password`")]
    AuthfileMalformed { line: usize },
    #[error("holds no `user:password` line")]
    AuthfileEmpty,
}
