//! Client request framing: text protocol and meta protocol.
use std::ops::Range;

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::{decode_base64, ErrorReply};

/// Longest key memcached accepts, in any protocol (`KEY_MAX_LENGTH`).
pub const MAX_KEY_LEN: usize = 250;

/// memcached reads a command line into a 2048-byte buffer: a connection that holds more
/// than this without a newline is closed, unless the line is a `get`/`gets` (which takes
/// a slower large-multiget path). On a pipelined backend connection a long line can
/// straddle memcached's reads, so every line memroute sends, other than a get's, stays
/// below this; a coalesced get line stays below it too, to keep memcached's fast path.
pub const MAX_SHORT_LINE: usize = 2048;

/// When `frame` is exactly one `get` or `gets` line ending in `\r\n`: whether it is `gets`,
/// and where its keys start. A frame ending in a bare `\n`, or holding more than one line,
/// is `None`.
#[inline]
pub fn single_get_line(frame: &[u8]) -> Option<(bool, usize)> {
    let (gets, keys_start) = match frame {
        [b'g', b'e', b't', b' ', ..] => (false, 4),
        [b'g', b'e', b't', b's', b' ', ..] => (true, 5),
        _ => return None,
    };
    let first_newline = memchr::memchr(b'\n', frame)?;
    (first_newline + 1 == frame.len() && frame[first_newline - 1] == b'\r')
        .then_some((gets, keys_start))
}

/// Longest command line accepted by default (memroute's own bound: memcached has none
/// past its 2048-byte read buffer for lines other than gets, see [`MAX_SHORT_LINE`]).
/// `proxy.max_line_size` in the config defaults to this.
pub const DEFAULT_MAX_LINE_LEN: usize = 64 * 1024;

/// Largest data block accepted by default: memcached 1.6's item size max (`-I`, 1 MiB).
/// `proxy.max_value_size` in the config defaults to this.
pub const DEFAULT_MAX_VALUE_LEN: usize = 1024 * 1024;

/// The longest exptime memcached reads as seconds from now (30 days); it reads a larger
/// one as an absolute Unix time. So a relative TTL above this cannot be sent as is.
pub const MAX_RELATIVE_EXPTIME: u64 = 30 * 24 * 3600;

/// Scanning limits. Defaults follow memcached 1.6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key accepted (memcached: 250 bytes).
    pub max_key_len: usize,
    /// Longest command line (without data block) accepted.
    pub max_line_len: usize,
    /// Largest data block accepted for storage commands (memcached's item size max, default 1 MiB).
    /// Client side only: replies are framed up to `MAX_REPLY_VALUE_LEN` whatever this is.
    pub max_value_len: usize,
}

impl Limits {
    /// Longest line accepted for a retrieval command (`get`, `gets`, `gat`, `gats`): a
    /// multi-get may carry as many keys as memcached serves (10,000 short keys make a 69 KB
    /// line), so these lines are bounded by the data block size rather than by
    /// `max_line_len`. A storage request may already make memroute buffer that much, so a
    /// long multi-get adds no new worst case per connection.
    pub fn max_retrieval_line_len(&self) -> usize {
        self.max_line_len.max(self.max_value_len)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_len: MAX_KEY_LEN,
            max_line_len: DEFAULT_MAX_LINE_LEN,
            max_value_len: DEFAULT_MAX_VALUE_LEN,
        }
    }
}

/// Every command memroute understands, as the wire names it. Routes do not choose by these
/// but by `memroute_routing::Operation`, the routed subset (a meta command counting as its
/// classic equivalent); `memroute_routing::operation_of` is the one mapping from these.
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
    /// The meta commands about a key: mg, ms, md, ma, me (not `mn`, which has none).
    pub fn is_keyed_meta(self) -> bool {
        matches!(
            self,
            Command::MetaGet
                | Command::MetaSet
                | Command::MetaDelete
                | Command::MetaArithmetic
                | Command::MetaDebug
        )
    }
    /// get, gets, gat, gats: commands that take one or more keys.
    pub fn is_multi_key(self) -> bool {
        matches!(
            self,
            Command::Get | Command::Gets | Command::Gat | Command::Gats
        )
    }
    /// Reads of a key's value: get, gets, gat, gats and mg. The routes that treat a read
    /// apart (warm-up, a resize window's fallback) and the hit/miss counters use this.
    pub fn is_read(self) -> bool {
        matches!(
            self,
            Command::Get | Command::Gets | Command::Gat | Command::Gats | Command::MetaGet
        )
    }
    /// Commands that carry a data block after the command line.
    pub fn has_data(self) -> bool {
        matches!(
            self,
            Command::Set
                | Command::Add
                | Command::Replace
                | Command::Append
                | Command::Prepend
                | Command::Cas
                | Command::MetaSet
        )
    }
    /// Commands that go to a backend chosen by key.
    pub fn is_keyed(self) -> bool {
        !matches!(
            self,
            Command::FlushAll
                | Command::Version
                | Command::Verbosity
                | Command::Stats
                | Command::Quit
                | Command::Shutdown
                | Command::MetaNoop
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
    pub keys: KeyRanges,
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

/// Where a request's keys are in its frame: 8 bytes per key (a multi-get of 10,000 keys
/// holds 80 KB of these beside its ~70 KB line, rather than 160 KB of `Range<usize>`).
/// Offsets fit in `u32`: `parse_request` refuses lines longer than that.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRanges(SmallVec<[(u32, u32); 2]>);

impl KeyRanges {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The i-th key's range.
    pub fn get(&self, i: usize) -> Option<Range<usize>> {
        self.0
            .get(i)
            .map(|&(start, end)| start as usize..end as usize)
    }

    pub fn first(&self) -> Option<Range<usize>> {
        self.get(0)
    }

    /// Every key's range, in order.
    pub fn iter(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.0
            .iter()
            .map(|&(start, end)| start as usize..end as usize)
    }

    /// Both ends are inside a line, which `parse_request` keeps under `u32::MAX`.
    fn push(&mut self, range: Range<usize>) {
        self.0.push((range.start as u32, range.end as u32));
    }

    /// Room for `most` keys in one allocation (beyond the two held inline).
    fn reserve(&mut self, most: usize) {
        if most > self.0.inline_size() {
            self.0.reserve_exact(most);
        }
    }
}

impl<'a> IntoIterator for &'a KeyRanges {
    type Item = Range<usize>;
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, (u32, u32)>, fn(&(u32, u32)) -> Range<usize>>;

    fn into_iter(self) -> Self::IntoIter {
        fn widen(&(start, end): &(u32, u32)) -> Range<usize> {
            start as usize..end as usize
        }
        self.0.iter().map(widen as fn(&(u32, u32)) -> Range<usize>)
    }
}

impl Request {
    /// The i-th key's bytes (empty past the last key).
    pub fn key(&self, i: usize) -> &[u8] {
        self.keys.get(i).map_or(&[][..], |range| &self.frame[range])
    }
    /// All keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.keys.iter().map(move |r| &self.frame[r])
    }
    /// The bytes of a multi-key command before its first key, e.g. `gat 300 `.
    /// Used to rebuild per-server sub-requests of a split multi-get.
    pub fn multi_key_head(&self) -> &[u8] {
        match self.keys.first() {
            Some(r) => &self.frame[..r.start],
            None => &self.frame[..0],
        }
    }
    /// The same request with only the keys `keep` lists (each `(index, cut)`: the key at
    /// `index`, its first `cut` bytes dropped), in that order, separated by single spaces;
    /// the line before the first key and everything after the last key (the rest of the
    /// line, the data block) as they were. Where a routed prefix is cut from a key
    /// (mcrouter's routing prefixes); allocates the new frame.
    pub fn with_keys(&self, keep: &[(usize, usize)]) -> Request {
        let (Some(first), Some(last)) = (self.keys.first(), self.keys.get(self.keys.len() - 1))
        else {
            return self.clone();
        };
        let mut frame = BytesMut::with_capacity(self.frame.len());
        frame.extend_from_slice(&self.frame[..first.start]);
        let mut keys = KeyRanges::default();
        // One allocation for the ranges, not one per doubling as they are pushed.
        keys.reserve(keep.len());
        for (n, &(index, cut)) in keep.iter().enumerate() {
            let Some(range) = self.keys.get(index) else {
                continue;
            };
            if n > 0 {
                frame.extend_from_slice(b" ");
            }
            let key = &self.frame[range.start + cut.min(range.len())..range.end];
            keys.push(frame.len()..frame.len() + key.len());
            frame.extend_from_slice(key);
        }
        // Everything after the last key moves by the same amount.
        let shift = |at: usize| (at + frame.len()).wrapping_sub(last.end);
        let moved = |range: &Range<usize>| match range.start >= last.end {
            true => shift(range.start)..shift(range.end),
            false => range.clone(),
        };
        let line_len = shift(self.line_len);
        let quiet_token = self.quiet_token.as_ref().map(moved);
        let stats_arg = moved(&self.stats_arg);
        frame.extend_from_slice(&self.frame[last.end..]);
        Request {
            command: self.command,
            frame: frame.freeze(),
            line_len,
            keys,
            noreply: self.noreply,
            quiet_token,
            base64_key: self.base64_key,
            arg: self.arg,
            stats_arg,
        }
    }

    /// The frame as it must be sent to a backend: without the `noreply`/`q` token
    /// when present (up to two slices of the same buffer, no copy).
    pub fn forward_parts(&self) -> RequestBytes {
        match &self.quiet_token {
            None => RequestBytes::whole(self.frame.clone()),
            Some(r) => RequestBytes {
                head: self.frame.slice(..r.start),
                tail: Some(self.frame.slice(r.end..)),
            },
        }
    }
}

/// A request's bytes as a server gets them: whole, or in two pieces around a `noreply` or
/// `q` token cut out (both views of the client's buffer, no copy). What travels from the
/// session through a route to a backend connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestBytes {
    pub head: Bytes,
    pub tail: Option<Bytes>,
}

impl RequestBytes {
    /// Bytes sent as they are.
    pub fn whole(bytes: Bytes) -> RequestBytes {
        RequestBytes {
            head: bytes,
            tail: None,
        }
    }

    /// The pieces, in the order they go on the wire.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(&self.head[..]).chain(self.tail.as_deref())
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
    Invalid {
        reply: ErrorReply,
        swallow: usize,
        close: bool,
    },
    /// A `set` or `ms` whose value is over `Limits::max_value_len`: answered and swallowed
    /// like `Invalid` (the line is removed, the stream goes on), and the key's old value must
    /// go, as memcached unlinks it so that a client who failed to write never reads the
    /// value it meant to replace (t/getset.t). memcached does this for `set`, binary set
    /// and `ms` in every mode; an add, replace, append, prepend or cas refused as too large
    /// leaves the old value, and is `Invalid`. Boxed: rare, and larger than a request.
    TooLarge(Box<TooLarge>),
}

/// A refused write whose key's old value must go: see [`Parse::TooLarge`].
#[derive(Debug, PartialEq, Eq)]
pub struct TooLarge {
    /// What memcached answers (`Silent` for a text `noreply`).
    pub reply: ErrorReply,
    /// Bytes of the data block still to discard as they arrive (see `Parse::Invalid`).
    pub swallow: usize,
    /// The refused request as far as it was framed: its `frame` is the command line alone
    /// (the data block is never buffered). Never to be sent: it says where the write would
    /// have gone (routes pick their way by its command and, for `ms`, its mode flag).
    pub refused: Request,
    /// `md <key>` (with `b` for a base64 key): the delete to send where `refused` would
    /// have gone. Its reply is not the client's; `reply` is.
    pub unlink: Request,
}

/// memcached's tokenizer keeps at most 23 words plus a terminal token; the
/// arity checks below are written against its `ntokens` so that over-long
/// lines get the same answer (`ERROR`) as memcached gives them.
const MAX_WORDS: usize = 23;

/// Meta commands with this many words or more are rejected (memcached's
/// MFLAG_MAX_OPT_LENGTH compared against ntokens).
const META_MAX_WORDS: usize = 20;

/// The space-separated words of one command line, as memcached splits them
/// (only ' ' separates; tabs and other control bytes are part of a word).
struct Words {
    /// `(start, end)` of each word, relative to the start of the line.
    w: [(usize, usize); MAX_WORDS],
    /// Number of words stored in `w`.
    n: usize,
    /// memcached's token count: words kept (at most 23) plus the terminal token.
    ntokens: usize,
}

impl Words {
    #[cfg(test)]
    fn split(line: &[u8]) -> Words {
        let mut words = Words::split_up_to(line, 2);
        words.split_more(line);
        words
    }

    /// The first `most` words only (a retrieval line's keys are scanned on their own).
    fn split_up_to(line: &[u8], most: usize) -> Words {
        let mut words = Words {
            w: [(0usize, 0usize); MAX_WORDS],
            n: 0,
            ntokens: 1,
        };
        words.split_from(line, 0, most.min(MAX_WORDS));
        words
    }

    /// Goes on splitting after the words found so far, as `split` would have.
    fn split_more(&mut self, line: &[u8]) {
        let from = match self.n {
            0 => line.len(),
            n => self.w[n - 1].1,
        };
        self.split_from(line, from, MAX_WORDS);
    }

    fn split_from(&mut self, line: &[u8], mut i: usize, most: usize) {
        while i < line.len() {
            if line[i] == b' ' {
                i += 1;
                continue;
            }
            if self.n == most {
                // memcached stops at MAX_WORDS too; its ntokens saturates at 24.
                break;
            }
            // Words are short: a byte loop, not a vectorised search set up per word.
            let end = word_end(line, i);
            self.w[self.n] = (i, end);
            self.n += 1;
            i = end;
        }
        self.ntokens = self.n + 1;
    }
    fn get<'a>(&self, line: &'a [u8], i: usize) -> &'a [u8] {
        let (s, e) = self.w[i];
        &line[s..e]
    }
    fn last<'a>(&self, line: &'a [u8]) -> &'a [u8] {
        if self.n == 0 {
            return &[];
        }
        self.get(line, self.n - 1)
    }
}

/// The end of the word starting at `from`: the next space, or the end of the line.
#[inline]
fn word_end(line: &[u8], from: usize) -> usize {
    let mut end = from;
    while end < line.len() && line[end] != b' ' {
        end += 1;
    }
    end
}

/// C's isspace() in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Sign and magnitude the way strtol/strtoul read a word: leading whitespace,
/// optional sign, at least one digit, then the end of the word or whitespace
/// (memcached's safe_strto* accept a number followed by whitespace).
/// `None` when there are no digits, trailing junk, or the magnitude overflows u64.
fn c_number(t: &[u8]) -> Option<(bool, u64)> {
    let mut i = 0;
    while i < t.len() && is_c_space(t[i]) {
        i += 1;
    }
    let mut neg = false;
    if i < t.len() && (t[i] == b'+' || t[i] == b'-') {
        neg = t[i] == b'-';
        i += 1;
    }
    let digits_start = i;
    let mut v: u64 = 0;
    while i < t.len() && t[i].is_ascii_digit() {
        v = v.checked_mul(10)?.checked_add(u64::from(t[i] - b'0'))?;
        i += 1;
    }
    if i == digits_start {
        return None;
    }
    if i < t.len() && !is_c_space(t[i]) {
        return None;
    }
    Some((neg, v))
}

/// memcached's safe_strtoull: strtoull, refusing results that look negative
/// because of a '-' sign.
fn strtoull(t: &[u8]) -> Option<u64> {
    let (neg, mag) = c_number(t)?;
    let v = if neg { mag.wrapping_neg() } else { mag };
    if (v as i64) < 0 && t.contains(&b'-') {
        return None;
    }
    Some(v)
}

/// memcached's safe_strtoul into a uint32_t: parsed as a 64-bit unsigned long,
/// then truncated (memcached 1.6.18 stores `4294967297` as 1; we must agree on
/// data lengths with the backend, so we truncate the same way).
fn strtoul32(t: &[u8]) -> Option<u32> {
    strtoull(t).map(|v| v as u32)
}

/// memcached's safe_strtol into an int32_t: a 64-bit long (ERANGE refused),
/// then truncated to 32 bits.
fn strtol32(t: &[u8]) -> Option<i32> {
    let (neg, mag) = c_number(t)?;
    let v: i64 = if neg {
        if mag > (i64::MAX as u64) + 1 {
            return None;
        }
        (mag as i64).wrapping_neg()
    } else {
        i64::try_from(mag).ok()?
    };
    Some(v as i32)
}

const BAD_FORMAT: ErrorReply = ErrorReply::Client("bad command line format");
const TOO_LARGE: ErrorReply = ErrorReply::Server("object too large for cache");
const BAD_CHUNK: ErrorReply = ErrorReply::Client("bad data chunk");

/// Removes `consume` bytes (the rejected line, or line plus data block) and
/// reports the error. Text-protocol errors are suppressed under `noreply`
/// exactly as memcached's out_string() does.
fn reject(
    buf: &mut BytesMut,
    consume: usize,
    reply: ErrorReply,
    swallow: usize,
    noreply: bool,
) -> Parse {
    let _ = buf.split_to(consume);
    let reply = if noreply { ErrorReply::Silent } else { reply };
    Parse::Invalid {
        reply,
        swallow,
        close: false,
    }
}

/// Rejects a storage command's line and its data block, which memcached
/// swallows. What is already buffered is removed now; the rest is `swallow`.
fn reject_with_data(
    buf: &mut BytesMut,
    line_total: usize,
    data_total: usize,
    reply: ErrorReply,
    noreply: bool,
) -> Parse {
    let have = buf.len() - line_total;
    let now = have.min(data_total);
    reject(buf, line_total + now, reply, data_total - now, noreply)
}

fn close(buf: &mut BytesMut, reply: ErrorReply) -> Parse {
    // The stream cannot be framed any more; drop what we have.
    buf.clear();
    Parse::Invalid {
        reply,
        swallow: 0,
        close: true,
    }
}

/// Everything a request needs besides its frame, gathered while scanning the line.
struct Head {
    command: Command,
    keys: KeyRanges,
    noreply: bool,
    quiet_token: Option<Range<usize>>,
    base64_key: bool,
    arg: Option<u64>,
    stats_arg: Range<usize>,
}

impl Head {
    fn new(command: Command) -> Head {
        Head {
            command,
            keys: KeyRanges::default(),
            noreply: false,
            quiet_token: None,
            base64_key: false,
            arg: None,
            stats_arg: 0..0,
        }
    }
}

fn finish(buf: &mut BytesMut, total: usize, line_len: usize, h: Head) -> Parse {
    Parse::Request(request(buf.split_to(total).freeze(), line_len, h))
}

fn request(frame: Bytes, line_len: usize, h: Head) -> Request {
    Request {
        command: h.command,
        frame,
        line_len,
        keys: h.keys,
        noreply: h.noreply,
        quiet_token: h.quiet_token,
        base64_key: h.base64_key,
        arg: h.arg,
        stats_arg: h.stats_arg,
    }
}

/// Range of word `i` together with the space before it (words are separated by
/// at least one space, so `start - 1` is a space).
///
/// Except when the previous word ends in `\r`: removing that space could put the `\r` right
/// before the line's `\n` (`mg k\r q\n` forwarded as `mg k\r\n`), where memcached strips it
/// as part of the terminator and so sees another key than the one we placed. Keeping the
/// space (`mg k\r \n`) is harmless: memcached ignores trailing spaces. Found by fuzzing.
fn with_space(line: &[u8], words: &Words, i: usize) -> Range<usize> {
    let (s, e) = words.w[i];
    if s >= 2 && line[s - 2] == b'\r' {
        return s..e;
    }
    s.saturating_sub(1)..e
}

/// Frames one request from the front of `buf`.
///
/// On `Parse::Request` and `Parse::Invalid`, the consumed bytes are removed from
/// `buf`; on `Parse::Incomplete` the buffer is untouched.
pub fn parse_request(buf: &mut BytesMut, limits: &Limits) -> Parse {
    let nl = match memchr::memchr(b'\n', buf) {
        Some(nl) => nl,
        None => return no_newline(buf, limits),
    };
    let line_total = nl + 1;
    // Key offsets are kept as u32 (`KeyRanges`): a line that long is refused whatever
    // the configured limits.
    if line_total > line_limit(buf, limits) || line_total > u32::MAX as usize {
        return close(buf, ErrorReply::Client("line too long"));
    }
    // memcached strips one '\r' before the '\n'; a lone "\r\n" is an empty line.
    let line_end = if nl > 0 && buf[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    };
    // memcached tokenises the line as a C string: nothing after a NUL byte is part of the
    // command (the line still ends at its '\n'). Only the bytes before the NUL are looked
    // at, and a request accepted from such a line is forwarded rebuilt without the tail,
    // so the backend never sees a NUL in a command line.
    match memchr::memchr(0, &buf[..line_end]) {
        None => parse_line(buf, limits, line_end, line_total),
        Some(cut) => match parse_line(buf, limits, cut, line_total) {
            Parse::Request(request) => Parse::Request(without_nul_tail(request, cut)),
            Parse::TooLarge(mut refused) => {
                refused.refused = without_nul_tail(refused.refused, cut);
                Parse::TooLarge(refused)
            }
            other => other,
        },
    }
}

/// A request parsed from the bytes of its line before a NUL at `cut`: the frame rebuilt
/// as those bytes, `\r\n`, and the data block if any. Every range in the request lies
/// before `cut`, so only `frame` and `line_len` change.
fn without_nul_tail(mut request: Request, cut: usize) -> Request {
    let data = &request.frame[request.line_len..];
    let mut frame = BytesMut::with_capacity(cut + 2 + data.len());
    frame.extend_from_slice(&request.frame[..cut]);
    frame.extend_from_slice(b"\r\n");
    frame.extend_from_slice(data);
    request.frame = frame.freeze();
    request.line_len = cut + 2;
    request
}

/// Parses the command line `buf[..line_end]` (its content, without the terminator or
/// anything after a NUL); `line_total` is where the next line or the data block starts.
fn parse_line(buf: &mut BytesMut, limits: &Limits, line_end: usize, line_total: usize) -> Parse {
    let line = &buf[..line_end];
    // The command and its first argument; the rest of the line is split below, once the
    // command says how (a retrieval line may carry any number of keys).
    let mut words = Words::split_up_to(line, 2);
    // No valid command is shorter than two bytes.
    if words.n == 0 || words.w[0].1 - words.w[0].0 < 2 {
        return reject(buf, line_total, ErrorReply::Error, 0, false);
    }
    let name = words.get(line, 0);
    let command = match name {
        b"get" | b"bget" => Command::Get,
        b"gets" => Command::Gets,
        b"gat" => Command::Gat,
        b"gats" => Command::Gats,
        b"set" => Command::Set,
        b"add" => Command::Add,
        b"replace" => Command::Replace,
        b"append" => Command::Append,
        b"prepend" => Command::Prepend,
        b"cas" => Command::Cas,
        b"delete" => Command::Delete,
        b"incr" => Command::Incr,
        b"decr" => Command::Decr,
        b"touch" => Command::Touch,
        b"flush_all" => Command::FlushAll,
        b"version" => Command::Version,
        b"verbosity" => Command::Verbosity,
        b"stats" => Command::Stats,
        b"quit" => Command::Quit,
        b"shutdown" => Command::Shutdown,
        b"mg" => Command::MetaGet,
        b"ms" => Command::MetaSet,
        b"md" => Command::MetaDelete,
        b"ma" => Command::MetaArithmetic,
        b"mn" => Command::MetaNoop,
        b"me" => Command::MetaDebug,
        // Everything else, including memcached's admin commands memroute does
        // not proxy (slabs, lru, watch, ...).
        _ => {
            words.split_more(line);
            if hangs_up_on(name, words.last(line)) {
                return close(buf, ErrorReply::Silent);
            }
            return reject(buf, line_total, ErrorReply::Error, 0, false);
        }
    };
    if let Command::Get | Command::Gets | Command::Gat | Command::Gats = command {
        return parse_retrieval(buf, limits, command, &words, line_end, line_total);
    }
    words.split_more(line);
    match command {
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas => parse_storage(buf, limits, command, &words, line_total),
        Command::MetaSet => parse_meta_set(buf, limits, &words, line_total),
        Command::MetaGet | Command::MetaDelete | Command::MetaArithmetic | Command::MetaDebug => {
            parse_meta_keyed(buf, limits, command, &words, line_total)
        }
        Command::MetaNoop | Command::Version | Command::Quit | Command::Shutdown => {
            finish(buf, line_total, line_total, Head::new(command))
        }
        Command::Stats => {
            let mut h = Head::new(command);
            if words.n > 1 {
                h.stats_arg = words.w[1].0..line_end;
            }
            finish(buf, line_total, line_total, h)
        }
        _ => parse_simple(buf, limits, command, &words, line_total),
    }
}

/// Whether memcached hangs up, without a reply, on a line whose first word is `name` and
/// whose last word (of the first 23, as its tokenizer keeps them) is `last`: a line it does
/// not know whose last word starts with `HTTP/` (`GET / HTTP/1.0`, `PUT /x HTTP/1.1`,
/// `DELETE HTTP/1.1`). That is an HTTP request, most likely a web page making a browser
/// talk to a cache on localhost; answering `ERROR` and reading on would take the request's
/// headers and body as commands (memcached's t/malicious-commands.t).
///
/// memcached 1.6.18 (process_command_ascii) looks only in its last branch, reached by a
/// name it dispatched nowhere before: not one starting with g, s, a, c, i, d or t (those
/// branches answer `ERROR` themselves), not a two-byte name starting with m (meta), and
/// none of the admin commands it runs there. A one-byte name never gets this far
/// (`ERROR`). `misbehave` exists only in debug builds, so it reaches the last branch too.
fn hangs_up_on(name: &[u8], last: &[u8]) -> bool {
    let dispatched_earlier = match name.first() {
        Some(b'g' | b's' | b'a' | b'c' | b'i' | b'd' | b't') => true,
        Some(b'm') => name.len() == 2,
        _ => matches!(
            name,
            b"replace"
                | b"prepend"
                | b"bget"
                | b"flush_all"
                | b"version"
                | b"quit"
                | b"lru_crawler"
                | b"watch"
                | b"verbosity"
                | b"lru"
                | b"extstore"
                | b"refresh_certs"
        ),
    };
    !dispatched_earlier && last.starts_with(b"HTTP/")
}

/// No newline in the buffer yet: wait, or give up the way memcached does.
fn no_newline(buf: &mut BytesMut, limits: &Limits) -> Parse {
    if buf.len() > line_limit(buf, limits) {
        return close(buf, ErrorReply::Client("line too long"));
    }
    // memcached tolerates an unterminated line this long only for a multi-get (after at
    // most 100 leading spaces); anything else is junk and it closes the connection without
    // a reply. memcached checks for get/gets only, so a long gat line survives there only
    // when it arrives in one read; memroute accepts gat/gats alike, whatever the reads.
    if buf.len() > MAX_SHORT_LINE && !is_retrieval_line(buf) {
        return close(buf, ErrorReply::Silent);
    }
    Parse::Incomplete
}

/// The longest line `buf` may hold: retrieval lines may be longer than other lines.
fn line_limit(buf: &[u8], limits: &Limits) -> usize {
    match buf.len() > limits.max_line_len && is_retrieval_line(buf) {
        true => limits.max_retrieval_line_len(),
        false => limits.max_line_len,
    }
}

/// `buf` starts (after at most 100 spaces, as memcached allows) with a retrieval command
/// word and a space: a multi-get that may be longer than other lines.
fn is_retrieval_line(buf: &[u8]) -> bool {
    let lead = buf.iter().take(101).take_while(|&&b| b == b' ').count();
    let rest = &buf[lead..];
    lead <= 100
        && [&b"get "[..], b"gets ", b"gat ", b"gats "]
            .iter()
            .any(|word| rest.starts_with(word))
}

/// get/gets `<key>+`, gat/gats `<exptime> <key>+`.
fn parse_retrieval(
    buf: &mut BytesMut,
    limits: &Limits,
    command: Command,
    words: &Words,
    line_end: usize,
    line_total: usize,
) -> Parse {
    if words.n < 2 {
        return reject(buf, line_total, ErrorReply::Error, 0, false);
    }
    let mut h = Head::new(command);
    let mut pos = words.w[1].0;
    if matches!(command, Command::Gat | Command::Gats) {
        let line = &buf[..line_end];
        if strtol32(words.get(line, 1)).is_none() {
            return reject(
                buf,
                line_total,
                ErrorReply::Client("invalid exptime argument"),
                0,
                false,
            );
        }
        // `gat <exptime>` with no key is valid: memcached answers END.
        pos = words.w[1].1;
    }
    // Keys are scanned directly rather than through `Words`: a multi-get may
    // have any number of keys.
    let line = &buf[..line_end];
    // Room for every key at once (one allocation past the inline two, rather than a
    // doubling per power of two; for 10,000 keys no half-used doubled buffer either).
    // The line's spaces bound the number of keys; padding only rounds it up.
    let most = memchr::memchr_iter(b' ', &line[pos..]).count() + 1;
    h.keys.reserve(most);
    while pos < line.len() {
        if line[pos] == b' ' {
            pos += 1;
            continue;
        }
        // Keys are found eight bytes at a time; a line holds no newline (or it would
        // have ended there), so the space is the only byte looked for.
        let end = crate::scan::find_either(line, pos, b' ', b' ').unwrap_or(line.len());
        if end - pos > limits.max_key_len {
            return reject(buf, line_total, BAD_FORMAT, 0, false);
        }
        h.keys.push(pos..end);
        pos = end;
    }
    finish(buf, line_total, line_total, h)
}

/// set/add/replace/append/prepend `<key> <flags> <exptime> <bytes> [noreply]`,
/// cas `<key> <flags> <exptime> <bytes> <cas> [noreply]`, then the data block.
fn parse_storage(
    buf: &mut BytesMut,
    limits: &Limits,
    command: Command,
    words: &Words,
    line_total: usize,
) -> Parse {
    let is_cas = command == Command::Cas;
    let (min, max) = if is_cas { (7, 8) } else { (6, 7) };
    if words.ntokens != min && words.ntokens != max {
        return reject(buf, line_total, ErrorReply::Error, 0, false);
    }
    let line = &buf[..line_total];
    let mut h = Head::new(command);
    // memcached looks only at the last word for noreply.
    if words.last(line) == b"noreply" {
        h.noreply = true;
        if words.ntokens == max {
            h.quiet_token = Some(with_space(line, words, words.n - 1));
        }
    }
    let noreply = h.noreply;
    if words.w[1].1 - words.w[1].0 > limits.max_key_len {
        return reject(buf, line_total, BAD_FORMAT, 0, noreply);
    }
    let nums_ok = strtoul32(words.get(line, 2)).is_some() && strtol32(words.get(line, 3)).is_some();
    let vlen = strtol32(words.get(line, 4));
    let (true, Some(vlen)) = (nums_ok, vlen) else {
        return reject(buf, line_total, BAD_FORMAT, 0, noreply);
    };
    if is_cas && strtoull(words.get(line, 5)).is_none() {
        return reject(buf, line_total, BAD_FORMAT, 0, noreply);
    }
    let Some(vlen) = storage_len(vlen) else {
        return reject(buf, line_total, BAD_FORMAT, 0, noreply);
    };
    h.keys.push(words.w[1].0..words.w[1].1);
    data_block(buf, limits, h, line_total, vlen, noreply)
}

/// memcached refuses a data length outside `0..=INT_MAX - 2` (it adds 2 for the `\r\n`)
/// as a bad command line, before looking at the item size, and swallows nothing.
/// Lengths inside that range but above the item size are "too large" and swallowed.
fn storage_len(vlen: i32) -> Option<usize> {
    if vlen > i32::MAX - 2 {
        return None;
    }
    usize::try_from(vlen).ok()
}

/// Frames the data block after a storage line: too large is rejected before it
/// arrives (and swallowed), a bad terminator is rejected once it has.
fn data_block(
    buf: &mut BytesMut,
    limits: &Limits,
    h: Head,
    line_total: usize,
    vlen: usize,
    quiet_errors: bool,
) -> Parse {
    let data_total = vlen + 2;
    if vlen > limits.max_value_len {
        if matches!(h.command, Command::Set | Command::MetaSet) {
            return too_large(buf, h, line_total, data_total, quiet_errors);
        }
        return reject_with_data(buf, line_total, data_total, TOO_LARGE, quiet_errors);
    }
    let total = line_total + data_total;
    if buf.len() < total {
        return Parse::Incomplete;
    }
    if &buf[total - 2..total] != b"\r\n" {
        // memcached reads exactly <bytes>+2 bytes, then resumes parsing after them.
        return reject(buf, total, BAD_CHUNK, 0, quiet_errors);
    }
    finish(buf, total, line_total, h)
}

/// Refuses a `set` or `ms` as too large, as `reject_with_data` does, with the delete of
/// its key that memcached does in its place (`Parse::TooLarge`). Allocates: only a
/// refused request comes here.
fn too_large(
    buf: &mut BytesMut,
    h: Head,
    line_total: usize,
    data_total: usize,
    noreply: bool,
) -> Parse {
    let line = buf.split_to(line_total).freeze();
    let now = buf.len().min(data_total);
    buf.advance(now);
    let key = h.keys.first().unwrap_or(0..0);
    let unlink = unlink_request(&line[key], h.base64_key);
    let refused = request(line, line_total, h);
    Parse::TooLarge(Box::new(TooLarge {
        reply: if noreply {
            ErrorReply::Silent
        } else {
            TOO_LARGE
        },
        swallow: data_total - now,
        refused,
        unlink,
    }))
}

/// `md <key>` (`b` when the key is base64, as the client sent it), framed as a request.
fn unlink_request(key: &[u8], base64: bool) -> Request {
    let mut line = BytesMut::with_capacity(key.len() + 7);
    line.extend_from_slice(b"md ");
    line.extend_from_slice(key);
    if base64 {
        line.extend_from_slice(b" b");
    }
    line.extend_from_slice(b"\r\n");
    let mut h = Head::new(Command::MetaDelete);
    h.keys.push(3..3 + key.len());
    h.base64_key = base64;
    let line_len = line.len();
    request(line.freeze(), line_len, h)
}

/// The meta flags after the key (or after ms's length): find `q` and `b`.
/// Returns an error text when `q` appears twice, because stripping one of them
/// would leave the backend a `q` and a reply we would wait for forever; the
/// error is the one memcached gives for that line.
fn meta_flags(line: &[u8], words: &Words, first: usize, h: &mut Head) -> Result<(), &'static str> {
    let mut q_count = 0;
    for i in first..words.n {
        match words.get(line, i).first() {
            Some(b'q') => {
                q_count += 1;
                h.noreply = true;
                h.quiet_token = Some(with_space(line, words, i));
            }
            Some(b'b') => h.base64_key = true,
            _ => {}
        }
    }
    if q_count < 2 {
        return Ok(());
    }
    // Replay memcached's flag pre-parse to find which error it reports first.
    let mut seen = [false; 128];
    for i in first..words.n {
        let c = words.get(line, i).first().copied().unwrap_or(0);
        if c >= 127 || seen[usize::from(c)] {
            return Err("duplicate flag");
        }
        seen[usize::from(c)] = true;
        if !b"bNTRlOPLkstcfvhuqFCMJDI".contains(&c) {
            return Err("invalid flag");
        }
    }
    Err("duplicate flag")
}

/// mg/md/ma/me `<key> <flag>*`.
fn parse_meta_keyed(
    buf: &mut BytesMut,
    limits: &Limits,
    command: Command,
    words: &Words,
    line_total: usize,
) -> Parse {
    if words.ntokens < 3 {
        // me checks its arity itself; the others through WANT_TOKENS_MIN.
        let reply = if command == Command::MetaDebug {
            BAD_FORMAT
        } else {
            ErrorReply::Error
        };
        return reject(buf, line_total, reply, 0, false);
    }
    if words.w[1].1 - words.w[1].0 > limits.max_key_len {
        return reject(buf, line_total, BAD_FORMAT, 0, false);
    }
    let mut h = Head::new(command);
    h.keys.push(words.w[1].0..words.w[1].1);
    if command == Command::MetaDebug {
        // me takes only an optional `b`, as its second word.
        if words.n >= 3 && words.get(&buf[..line_total], 2) == b"b" {
            h.base64_key = true;
        }
        return finish(buf, line_total, line_total, h);
    }
    if words.ntokens > META_MAX_WORDS {
        let msg = if command == Command::MetaGet {
            "options flags are too long"
        } else {
            "options flags too long"
        };
        return reject(buf, line_total, ErrorReply::Client(msg), 0, false);
    }
    if let Err(msg) = meta_flags(&buf[..line_total], words, 2, &mut h) {
        let msg = if command == Command::MetaGet {
            msg
        } else {
            "invalid or duplicate flag"
        };
        return reject(buf, line_total, ErrorReply::Client(msg), 0, false);
    }
    finish(buf, line_total, line_total, h)
}

/// ms `<key> <datalen> <flag>*`, then the data block.
fn parse_meta_set(buf: &mut BytesMut, limits: &Limits, words: &Words, line_total: usize) -> Parse {
    if words.ntokens < 3 {
        return reject(buf, line_total, ErrorReply::Error, 0, false);
    }
    // Errors before the length is known do not swallow the data block.
    if words.w[1].1 - words.w[1].0 > limits.max_key_len || words.ntokens == 3 {
        return reject(buf, line_total, BAD_FORMAT, 0, false);
    }
    if words.ntokens > META_MAX_WORDS {
        return reject(
            buf,
            line_total,
            ErrorReply::Client("options flags too long"),
            0,
            false,
        );
    }
    let line = &buf[..line_total];
    let Some(vlen) = strtol32(words.get(line, 2)).and_then(storage_len) else {
        return reject(buf, line_total, BAD_FORMAT, 0, false);
    };
    let mut h = Head::new(Command::MetaSet);
    h.keys.push(words.w[1].0..words.w[1].1);
    if let Err(msg) = meta_flags(line, words, 3, &mut h) {
        // Flag errors come after the length is known: memcached swallows the data.
        return reject_with_data(buf, line_total, vlen + 2, ErrorReply::Client(msg), false);
    }
    if vlen > limits.max_value_len {
        // memroute refuses this one itself, so it answers what memcached would: the first
        // error memcached finds in the flags comes before the size (and keeps the value).
        if let Some(msg) = mset_flag_error(line, words) {
            return reject_with_data(buf, line_total, vlen + 2, ErrorReply::Client(msg), false);
        }
    }
    // Meta errors are never suppressed by `q`.
    data_block(buf, limits, h, line_total, vlen, false)
}

/// The error memcached 1.6.18 gives an `ms` for its flags before it looks at the value's
/// size (process_mset_command: `_meta_flag_preparse`, the opaque's length, the mode), or
/// `None` when the flags pass. Asked only for an `ms` memroute refuses as too large: any
/// other goes to memcached, which checks for itself. A duplicate or unknown flag stops the
/// scan at once; other errors are remembered (the last message wins, as in memcached,
/// whose `F` error keeps the message it had) and reported after it.
fn mset_flag_error(line: &[u8], words: &Words) -> Option<&'static str> {
    const BAD_TOKEN: &str = "bad token in command line format";
    let mut seen = [false; 127];
    let mut message = "bad command line format";
    let mut failed = false;
    let mut mode = 0u8;
    let mut fail = |msg: Option<&'static str>| {
        failed = true;
        if let Some(msg) = msg {
            message = msg;
        }
    };
    for i in 3..words.n {
        let token = words.get(line, i);
        let (flag, argument) = match token.split_first() {
            Some((&flag, argument)) => (flag, argument),
            None => continue,
        };
        if flag >= 127 || seen[usize::from(flag)] {
            return Some("duplicate flag");
        }
        seen[usize::from(flag)] = true;
        match flag {
            b'b' => {
                // memcached decodes the key in place; nothing decoded is an error.
                let mut decoded = [0u8; MAX_KEY_LEN];
                if !matches!(decode_base64(words.get(line, 1), &mut decoded), Some(1..)) {
                    fail(Some("error decoding key"));
                }
            }
            b'N' | b'T' | b'R' if strtol32(argument).is_none() => fail(Some(BAD_TOKEN)),
            b'C' if strtoull(argument).is_none() => fail(Some(BAD_TOKEN)),
            b'F' if strtoul32(argument).is_none() => fail(None),
            b'M' if token.len() != 2 => fail(Some("incorrect length for M token")),
            b'M' => mode = token[1],
            b'J' if strtoull(argument).is_none() => fail(Some("invalid numeric initial value")),
            b'D' if strtoull(argument).is_none() => fail(Some("invalid numeric delta value")),
            b'N' | b'T' | b'R' | b'C' | b'F' | b'J' | b'D' => {}
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'v' | b'h' | b'u'
            | b'q' | b'I' => {}
            _ => return Some("invalid flag"),
        }
    }
    if failed {
        return Some(message);
    }
    // After the flags: an opaque longer than 32 bytes is remembered, a bad mode ends it.
    let opaque_too_long = (3..words.n).any(|i| {
        let token = words.get(line, i);
        token.first() == Some(&b'O') && token.len() > 32
    });
    if !matches!(mode, 0 | b'E' | b'A' | b'P' | b'R' | b'S') {
        return Some("invalid mode for ms M token");
    }
    opaque_too_long.then_some("opaque token too long")
}

/// delete, incr, decr, touch, flush_all, verbosity: one line, fixed arity.
fn parse_simple(
    buf: &mut BytesMut,
    limits: &Limits,
    command: Command,
    words: &Words,
    line_total: usize,
) -> Parse {
    let nt = words.ntokens;
    let arity_ok = match command {
        Command::Delete => (3..=5).contains(&nt),
        Command::Incr | Command::Decr | Command::Touch => nt == 4 || nt == 5,
        Command::FlushAll => (2..=4).contains(&nt),
        Command::Verbosity => nt == 3 || nt == 4,
        _ => false,
    };
    if !arity_ok {
        return reject(buf, line_total, ErrorReply::Error, 0, false);
    }
    let line = &buf[..line_total];
    let mut h = Head::new(command);
    // memcached's set_noreply_maybe: the last word, whatever the arity; but
    // `delete <key>` never looks for it (`delete noreply` deletes "noreply").
    if words.last(line) == b"noreply" && !(command == Command::Delete && nt == 3) {
        h.noreply = true;
        h.quiet_token = Some(with_space(line, words, words.n - 1));
    }
    let noreply = h.noreply;
    let key_too_long = || words.w[1].1 - words.w[1].0 > limits.max_key_len;
    match command {
        Command::Delete => {
            if nt > 3 {
                let hold_is_zero = words.get(line, 2) == b"0";
                let valid =
                    (nt == 4 && (hold_is_zero || noreply)) || (nt == 5 && hold_is_zero && noreply);
                if !valid {
                    let reply = ErrorReply::Client(
                        "bad command line format.  Usage: delete <key> [noreply]",
                    );
                    return reject(buf, line_total, reply, 0, noreply);
                }
            }
            if key_too_long() {
                return reject(buf, line_total, BAD_FORMAT, 0, noreply);
            }
            h.keys.push(words.w[1].0..words.w[1].1);
        }
        Command::Incr | Command::Decr => {
            if key_too_long() {
                return reject(buf, line_total, BAD_FORMAT, 0, noreply);
            }
            if strtoull(words.get(line, 2)).is_none() {
                let reply = ErrorReply::Client("invalid numeric delta argument");
                return reject(buf, line_total, reply, 0, noreply);
            }
            h.keys.push(words.w[1].0..words.w[1].1);
        }
        Command::Touch => {
            if key_too_long() {
                return reject(buf, line_total, BAD_FORMAT, 0, noreply);
            }
            if strtol32(words.get(line, 2)).is_none() {
                let reply = ErrorReply::Client("invalid exptime argument");
                return reject(buf, line_total, reply, 0, noreply);
            }
            h.keys.push(words.w[1].0..words.w[1].1);
        }
        Command::FlushAll => {
            let plain = if noreply { 3 } else { 2 };
            let mut delay = 0;
            if nt != plain {
                match strtol32(words.get(line, 1)) {
                    Some(d) => delay = d,
                    None => {
                        let reply = ErrorReply::Client("invalid exptime argument");
                        return reject(buf, line_total, reply, 0, noreply);
                    }
                }
            }
            // A negative delay means "now", like 0.
            h.arg = Some(u64::try_from(delay).unwrap_or(0));
        }
        Command::Verbosity => match strtoul32(words.get(line, 1)) {
            Some(level) => h.arg = Some(u64::from(level)),
            None => return reject(buf, line_total, BAD_FORMAT, 0, noreply),
        },
        _ => {}
    }
    finish(buf, line_total, line_total, h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(text: &[u8]) -> Request {
        let mut buf = BytesMut::from(text);
        match parse_request(&mut buf, &Limits::default()) {
            Parse::Request(request) => request,
            other => panic!("not a request: {other:?}"),
        }
    }

    #[test]
    fn with_keys_cuts_and_picks_keys_and_moves_what_follows() {
        let set = framed(b"set /a/b/k 0 0 2 noreply\r\nhi\r\n");
        let cut = set.with_keys(&[(0, 5)]);
        assert_eq!(&cut.frame[..], b"set k 0 0 2 noreply\r\nhi\r\n");
        assert_eq!(cut.key(0), b"k");
        assert_eq!(cut.line_len, set.line_len - 5);
        assert!(cut.noreply);
        assert_eq!(
            &cut.frame[cut.quiet_token.clone().expect("noreply token")],
            b" noreply"
        );
        assert_eq!(cut, framed(b"set k 0 0 2 noreply\r\nhi\r\n"));
        let get = framed(b"get  /a/b/x y   /c/d/z\r\n");
        let picked = get.with_keys(&[(2, 5), (0, 5)]);
        assert_eq!(&picked.frame[..], b"get  z x\r\n");
        assert_eq!(picked.keys().collect::<Vec<_>>(), [&b"z"[..], b"x"]);
        let mg = framed(b"mg /a/b/k v k q\r\n");
        let cut = mg.with_keys(&[(0, 5)]);
        assert_eq!(cut, framed(b"mg k v k q\r\n"));
    }

    /// Every command, each with whether it reads a key's value. The match has no
    /// wildcard, so a new command does not compile until it is placed here.
    #[test]
    fn is_read_names_the_reads_and_nothing_else() {
        let all = [
            Command::Get,
            Command::Gets,
            Command::Gat,
            Command::Gats,
            Command::Set,
            Command::Add,
            Command::Replace,
            Command::Append,
            Command::Prepend,
            Command::Cas,
            Command::Delete,
            Command::Incr,
            Command::Decr,
            Command::Touch,
            Command::FlushAll,
            Command::Version,
            Command::Verbosity,
            Command::Stats,
            Command::Quit,
            Command::Shutdown,
            Command::MetaGet,
            Command::MetaSet,
            Command::MetaDelete,
            Command::MetaArithmetic,
            Command::MetaNoop,
            Command::MetaDebug,
        ];
        for command in all {
            let read = match command {
                Command::Get | Command::Gets | Command::Gat | Command::Gats => true,
                Command::MetaGet => true,
                // touch changes only the expiry and returns no value; me returns
                // debug data, not the value.
                Command::Touch | Command::MetaDebug => false,
                Command::Set
                | Command::Add
                | Command::Replace
                | Command::Append
                | Command::Prepend
                | Command::Cas
                | Command::Delete
                | Command::Incr
                | Command::Decr
                | Command::FlushAll
                | Command::Version
                | Command::Verbosity
                | Command::Stats
                | Command::Quit
                | Command::Shutdown
                | Command::MetaSet
                | Command::MetaDelete
                | Command::MetaArithmetic
                | Command::MetaNoop => false,
            };
            assert_eq!(command.is_read(), read, "{}", command.name());
        }
    }

    #[test]
    fn single_get_line_is_one_whole_get_or_gets_line() {
        assert_eq!(single_get_line(b"get a b\r\n"), Some((false, 4)));
        assert_eq!(single_get_line(b"gets a\r\n"), Some((true, 5)));
        assert_eq!(single_get_line(b"get a\n"), None, "bare newline");
        assert_eq!(single_get_line(b"get a\r\nget b\r\n"), None, "two lines");
        assert_eq!(single_get_line(b"gat 0 a\r\n"), None);
        assert_eq!(single_get_line(b"get a"), None, "no newline");
    }

    /// Splitting a line's first words and then the rest finds what one whole split does,
    /// at memcached's word limit too (the retrieval path stops after two words).
    #[test]
    fn words_split_in_two_steps_as_in_one() {
        let many = (0..30)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join("  ");
        let lines: [&[u8]; 7] = [
            b"",
            b"   ",
            b"get",
            b" get  k1 ",
            b"set k 0 0 5 noreply",
            b"a b c d e f g h i j k l m n o p q r s t u v w x y z",
            many.as_bytes(),
        ];
        // The one-step split as it was: every word up to the limit, memchr for each end.
        let whole = |line: &[u8]| {
            let mut words = Vec::new();
            let mut i = 0;
            while i < line.len() {
                if line[i] == b' ' {
                    i += 1;
                    continue;
                }
                if words.len() == MAX_WORDS {
                    break;
                }
                let end = memchr::memchr(b' ', &line[i..]).map_or(line.len(), |off| i + off);
                words.push((i, end));
                i = end;
            }
            words
        };
        for line in lines {
            let expected = whole(line);
            let split = Words::split(line);
            assert_eq!(&split.w[..split.n], &expected[..]);
            assert_eq!(split.ntokens, expected.len() + 1);
            let head = Words::split_up_to(line, 2);
            assert_eq!(&head.w[..head.n], &expected[..expected.len().min(2)]);
        }
    }
}
