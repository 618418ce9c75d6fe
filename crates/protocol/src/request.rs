//! Client request framing: text protocol and meta protocol.
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use crate::ErrorReply;

/// Scanning limits. Defaults follow memcached 1.6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key accepted (memcached: 250 bytes).
    pub max_key_len: usize,
    /// Longest command line (without data block) accepted.
    pub max_line_len: usize,
    /// Largest data block accepted for storage commands (memcached's item size max, default 1 MiB).
    pub max_value_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_key_len: 250, max_line_len: 64 * 1024, max_value_len: 1024 * 1024 }
    }
}

/// Every command memroute understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Get,
    Gets,
    Gat,
    Gats,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Delete,
    Incr,
    Decr,
    Touch,
    FlushAll,
    Version,
    Verbosity,
    Stats,
    Quit,
    /// `shutdown`: memroute refuses it (a client must not stop the proxy).
    Shutdown,
    MetaGet,
    MetaSet,
    MetaDelete,
    MetaArithmetic,
    MetaNoop,
    MetaDebug,
}

impl Command {
    /// get, gets, gat, gats: commands that take one or more keys.
    pub fn is_multi_key(self) -> bool {
        matches!(self, Command::Get | Command::Gets | Command::Gat | Command::Gats)
    }
    /// Commands that carry a data block after the command line.
    pub fn has_data(self) -> bool {
        matches!(
            self,
            Command::Set | Command::Add | Command::Replace | Command::Append | Command::Prepend | Command::Cas | Command::MetaSet
        )
    }
    /// Commands that go to a backend chosen by key.
    pub fn is_keyed(self) -> bool {
        !matches!(
            self,
            Command::FlushAll | Command::Version | Command::Verbosity | Command::Stats | Command::Quit | Command::Shutdown | Command::MetaNoop
        )
    }
    /// Name as counted in stats (`cmd_get` etc. use these buckets).
    pub fn name(self) -> &'static str {
        match self {
            Command::Get => "get",
            Command::Gets => "gets",
            Command::Gat => "gat",
            Command::Gats => "gats",
            Command::Set => "set",
            Command::Add => "add",
            Command::Replace => "replace",
            Command::Append => "append",
            Command::Prepend => "prepend",
            Command::Cas => "cas",
            Command::Delete => "delete",
            Command::Incr => "incr",
            Command::Decr => "decr",
            Command::Touch => "touch",
            Command::FlushAll => "flush_all",
            Command::Version => "version",
            Command::Verbosity => "verbosity",
            Command::Stats => "stats",
            Command::Quit => "quit",
            Command::Shutdown => "shutdown",
            Command::MetaGet => "mg",
            Command::MetaSet => "ms",
            Command::MetaDelete => "md",
            Command::MetaArithmetic => "ma",
            Command::MetaNoop => "mn",
            Command::MetaDebug => "me",
        }
    }
}

/// One framed client request. `frame` holds the exact bytes the client sent
/// (command line and data block), so a single-key request is forwarded as-is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    /// The whole request: command line including `\r\n` (or `\n`), then the data block if any.
    pub frame: Bytes,
    /// Length of the command line inside `frame`, including its line terminator.
    pub line_len: usize,
    /// Byte ranges of the keys inside `frame`, in the client's order (duplicates kept).
    /// Empty for keyless commands.
    pub keys: SmallVec<[Range<usize>; 2]>,
    /// The client asked for no reply: `noreply` (text) or the `q` flag (meta).
    pub noreply: bool,
    /// Range inside `frame` of the `noreply` token or meta `q` flag *including the
    /// space before it*, so the proxy can forward the request without it and decide
    /// itself which reply to suppress (memcached still sends some errors under noreply,
    /// which would desynchronise a pipelined backend connection).
    pub quiet_token: Option<Range<usize>>,
    /// Meta commands: the key is base64 (`b` flag); it is decoded for hashing by the router.
    pub base64_key: bool,
    /// Numeric argument the proxy itself needs: `verbosity` level, `flush_all` delay.
    /// Unused (None) for other commands.
    pub arg: Option<u64>,
    /// `stats` sub-command bytes (empty for plain `stats`), as a range inside `frame`.
    pub stats_arg: Range<usize>,
}

impl Request {
    /// The i-th key's bytes.
    pub fn key(&self, i: usize) -> &[u8] {
        &self.frame[self.keys[i].clone()]
    }
    /// All keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.keys.iter().map(move |r| &self.frame[r.clone()])
    }
    /// The bytes of a multi-key command before its first key, e.g. `gat 300 `.
    /// Used to rebuild per-server sub-requests of a split multi-get.
    pub fn multi_key_head(&self) -> &[u8] {
        match self.keys.first() {
            Some(r) => &self.frame[..r.start],
            None => &self.frame[..0],
        }
    }
    /// The frame as it must be sent to a backend: without the `noreply`/`q` token
    /// when present (returned as up to two slices of the same buffer, no copy).
    pub fn forward_parts(&self) -> (Bytes, Option<Bytes>) {
        match &self.quiet_token {
            None => (self.frame.clone(), None),
            Some(r) => (self.frame.slice(..r.start), Some(self.frame.slice(r.end..))),
        }
    }
}

/// The outcome of trying to frame one request from the front of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse {
    /// A whole request was framed and removed from the front of the buffer.
    Request(Request),
    /// More bytes are needed; nothing was removed.
    Incomplete,
    /// Bad input. The offending line was removed from the buffer; `reply` is what
    /// memcached answers. `swallow` more bytes (a rejected data block and its `\r\n`
    /// that has not fully arrived yet, or arrived partially and was removed) must be
    /// discarded from the stream before parsing resumes. When `close` is set the stream
    /// can no longer be framed and the connection must be closed after the reply.
    Invalid { reply: ErrorReply, swallow: usize, close: bool },
}

/// Frames one request from the front of `buf`.
///
/// On `Parse::Request` and `Parse::Invalid`, the consumed bytes are removed from
/// `buf`; on `Parse::Incomplete` the buffer is untouched.
pub fn parse_request(buf: &mut BytesMut, limits: &Limits) -> Parse {
    let _ = (buf, limits, ErrorReply::Error);
    todo!("protocol helper implements")
}
