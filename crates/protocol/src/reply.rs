//! Backend reply framing: how long is the next reply, and where are its VALUE blocks.
use std::ops::Range;

use crate::{Command, Limits, ProtocolError};

/// The shape of reply a backend sends for a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// Zero or more `VALUE key flags bytes [cas]\r\n<data>\r\n` blocks then `END\r\n`
    /// (get, gets, gat, gats), or a single error line.
    Retrieval,
    /// Zero or more `STAT ...\r\n` lines then `END\r\n`, or a single error line.
    Stats,
    /// `VA <size> <flags>*\r\n<data>\r\n` or a single line (mg).
    MetaGet,
    /// Exactly one line (storage, delete, incr/decr, touch, flush_all, version, ms, md, ma, mn, me, ...).
    /// `ma` with the `v` flag replies `VA <size> ...\r\n<data>\r\n`: use MetaGet for ma too.
    Line,
}

impl ReplyKind {
    pub fn for_command(command: Command) -> ReplyKind {
        match command {
            Command::Get | Command::Gets | Command::Gat | Command::Gats => ReplyKind::Retrieval,
            Command::Stats => ReplyKind::Stats,
            Command::MetaGet | Command::MetaArithmetic => ReplyKind::MetaGet,
            _ => ReplyKind::Line,
        }
    }
}

/// The outcome of framing one reply at the front of a backend's read buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum ReplyParse {
    /// A whole reply of this many bytes is at the front of the buffer.
    Complete(usize),
    /// More bytes are needed.
    Incomplete,
}

/// Frames one reply of the given kind at the front of `buf`.
/// Errors mean the backend stream can no longer be trusted (close that connection).
pub fn parse_reply(buf: &[u8], kind: ReplyKind, limits: &Limits) -> Result<ReplyParse, ProtocolError> {
    let _ = (buf, kind, limits);
    todo!("protocol helper implements")
}

/// One `VALUE ...` block inside a complete retrieval reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueBlock {
    /// The key, as a range in the reply.
    pub key: Range<usize>,
    /// The whole block: `VALUE` line, data and the data's `\r\n`.
    pub block: Range<usize>,
}

/// The VALUE blocks of a complete retrieval reply (as framed by `parse_reply`), in order.
/// A reply that is a single error line (e.g. `SERVER_ERROR ...`) yields `Err` with that line's range.
pub fn value_blocks(reply: &[u8]) -> Result<Vec<ValueBlock>, Range<usize>> {
    let _ = reply;
    todo!("protocol helper implements")
}

/// For a reply to a request sent with `noreply`/`q` stripped: whether memcached would
/// have suppressed this reply. `first_line` is the reply's first line without `\r\n`.
///
/// Text noreply: memcached suppresses every normal reply (STORED, NOT_STORED, EXISTS,
/// NOT_FOUND, DELETED, TOUCHED, OK, numbers) and also ERROR/CLIENT_ERROR for most cases.
/// Meta `q`: mg hides EN; ms hides HD; md hides HD and NF; ma hides HD and NF.
pub fn quiet_suppresses(command: Command, first_line: &[u8]) -> bool {
    let _ = (command, first_line);
    todo!("protocol helper implements")
}
