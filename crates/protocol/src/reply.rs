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

/// One `VALUE ...` block inside a complete retrieval reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueBlock {
    /// The key, as a range in the reply.
    pub key: Range<usize>,
    /// The whole block: `VALUE` line, data and the data's `\r\n`.
    pub block: Range<usize>,
}

/// The next `\r\n`-terminated line starting at `pos`: returns the end of the
/// line content (before `\r\n`) or `None` when it has not fully arrived.
/// A bare `\n`, or no newline within the line limit, means the stream is garbage.
fn line_at(buf: &[u8], pos: usize, limits: &Limits) -> Result<Option<usize>, ProtocolError> {
    let rest = &buf[pos..];
    match memchr::memchr(b'\n', rest) {
        Some(nl) => {
            if nl == 0 || rest[nl - 1] != b'\r' {
                return Err(ProtocolError::BadReply("line not terminated by \\r\\n"));
            }
            if nl + 1 > limits.max_line_len {
                return Err(ProtocolError::BadReply("line too long"));
            }
            Ok(Some(pos + nl - 1))
        }
        None if rest.len() > limits.max_line_len => Err(ProtocolError::BadReply("line too long")),
        None => Ok(None),
    }
}

/// A single-line reply memcached may send in place of a multi-line one.
fn is_error_line(line: &[u8]) -> bool {
    line == b"ERROR"
        || line.starts_with(b"ERROR ")
        || line.starts_with(b"CLIENT_ERROR ")
        || line.starts_with(b"SERVER_ERROR ")
}

/// The `n`-th (0-based) space-separated word of a line.
fn word(line: &[u8], n: usize) -> Option<&[u8]> {
    line.split(|&b| b == b' ').filter(|w| !w.is_empty()).nth(n)
}

/// The data length of `VALUE <key> <flags> <bytes>[ <cas>]` as memcached writes it: single
/// spaces, numeric flags and cas. The header is passed on to the client as it is, so one
/// that a client could read differently (two spaces, a flags field that is not a number;
/// found by session fuzzing with a backend answering garbage) is a bad reply.
fn value_header_length(line: &[u8]) -> Result<Option<&[u8]>, ProtocolError> {
    let mut words = line.split(|&b| b == b' ');
    let (_value, key, flags, bytes, cas) = (
        words.next(),
        words.next(),
        words.next(),
        words.next(),
        words.next(),
    );
    let number = |w: &[u8]| !w.is_empty() && w.iter().all(u8::is_ascii_digit);
    let well_formed = key.is_some_and(|k| !k.is_empty())
        && flags.is_some_and(number)
        && cas.is_none_or(number)
        && words.next().is_none();
    match well_formed {
        true => Ok(bytes),
        false => Err(ProtocolError::BadReply("malformed VALUE line")),
    }
}

/// A `VALUE <key> <flags> <bytes>[ <cas>]` line as memcached writes it, read in one pass:
/// the key's end (as an offset in `line`) and the data length. `None` for anything else
/// (the careful readers above then say what is wrong): the same lines are accepted.
#[inline]
fn well_formed_value_line(line: &[u8]) -> Option<(usize, usize)> {
    let rest = line.strip_prefix(b"VALUE ")?;
    let key_end = memchr::memchr(b' ', rest)?;
    if key_end == 0 {
        return None;
    }
    let digits = |from: usize| {
        let count = rest[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        (count > 0).then_some(from + count)
    };
    // flags, then a space
    let flags_end = digits(key_end + 1)?;
    if rest.get(flags_end) != Some(&b' ') {
        return None;
    }
    let bytes_start = flags_end + 1;
    let bytes_end = digits(bytes_start)?;
    if bytes_end - bytes_start > 19 {
        return None;
    }
    let len = rest[bytes_start..bytes_end]
        .iter()
        .fold(0usize, |v, &d| v * 10 + usize::from(d - b'0'));
    if len > MAX_REPLY_VALUE_LEN {
        return None;
    }
    // An optional cas, then the end of the line.
    match rest.get(bytes_end) {
        None => {}
        Some(b' ') if digits(bytes_end + 1)? == rest.len() => {}
        Some(_) => return None,
    }
    Some((6 + key_end, len))
}

/// The largest value a reply may carry: memcached's hard item size maximum (`-I 1g`).
/// Replies are framed independently of the client-side `Limits::max_value_len`: a backend
/// may hold larger values (a bigger `-I`, or values grown with append/prepend), and
/// refusing to frame them would reset the backend connection on every read of such a key.
pub const MAX_REPLY_VALUE_LEN: usize = 1024 * 1024 * 1024;

/// A data length in a reply header: plain decimal, at most `MAX_REPLY_VALUE_LEN`.
fn data_len(w: Option<&[u8]>) -> Result<usize, ProtocolError> {
    let w = w.ok_or(ProtocolError::BadReply("missing data length"))?;
    if w.is_empty() || w.len() > 19 || !w.iter().all(u8::is_ascii_digit) {
        return Err(ProtocolError::BadReply("bad data length"));
    }
    let mut v: usize = 0;
    for &d in w {
        v = v * 10 + usize::from(d - b'0');
    }
    if v > MAX_REPLY_VALUE_LEN {
        return Err(ProtocolError::BadReply(
            "value larger than memcached's item maximum",
        ));
    }
    Ok(v)
}

/// After a header line ending at `line_end` (content end), a data block of
/// `len` bytes plus `\r\n`: the offset just past it, or `None` if incomplete.
fn data_after(buf: &[u8], line_end: usize, len: usize) -> Result<Option<usize>, ProtocolError> {
    let start = line_end + 2;
    let end = start + len + 2;
    if buf.len() < end {
        return Ok(None);
    }
    if &buf[end - 2..end] != b"\r\n" {
        return Err(ProtocolError::BadReply(
            "data block not terminated by \\r\\n",
        ));
    }
    Ok(Some(end))
}

/// Frames one reply of the given kind at the front of `buf`.
/// Errors mean the backend stream can no longer be trusted (close that connection).
/// A reply line that is followed by a data block (`VALUE ...`, `VA ...`), or is one cut
/// short (`VALUE`, `VA`).
fn announces_data(line: &[u8]) -> bool {
    let word = line.split(|&b| b == b' ').next().unwrap_or_default();
    word == b"VALUE" || word == b"VA"
}

pub fn parse_reply(
    buf: &[u8],
    kind: ReplyKind,
    limits: &Limits,
) -> Result<ReplyParse, ProtocolError> {
    let first_end = match line_at(buf, 0, limits)? {
        Some(e) => e,
        None => return Ok(ReplyParse::Incomplete),
    };
    let first = &buf[..first_end];
    match kind {
        ReplyKind::Line => {
            // Every memcached reply line starts with an upper-case word or a
            // number (incr/decr); anything else means we lost the framing. A line that
            // announces a data block (`VALUE`, `VA`) is never a one-line reply either:
            // passed on, it would tell the client to read a block that is not there.
            if announces_data(first) {
                return Err(ProtocolError::BadReply(
                    "data block where one line was expected",
                ));
            }
            match first.first() {
                Some(c) if c.is_ascii_uppercase() || c.is_ascii_digit() => {
                    Ok(ReplyParse::Complete(first_end + 2))
                }
                _ => Err(ProtocolError::BadReply("unexpected reply line")),
            }
        }
        ReplyKind::MetaGet => {
            if first.starts_with(b"VA ") {
                let len = data_len(word(first, 1))?;
                return Ok(match data_after(buf, first_end, len)? {
                    Some(end) => ReplyParse::Complete(end),
                    None => ReplyParse::Incomplete,
                });
            }
            match first.first() {
                Some(_) if announces_data(first) => {
                    Err(ProtocolError::BadReply("unexpected meta reply"))
                }
                Some(c) if c.is_ascii_uppercase() => Ok(ReplyParse::Complete(first_end + 2)),
                _ => Err(ProtocolError::BadReply("unexpected meta reply")),
            }
        }
        ReplyKind::Retrieval => {
            if is_error_line(first) {
                return Ok(ReplyParse::Complete(first_end + 2));
            }
            let mut pos = 0;
            let mut line_end = first_end;
            loop {
                let line = &buf[pos..line_end];
                if line == b"END" {
                    return Ok(ReplyParse::Complete(line_end + 2));
                }
                let len = match well_formed_value_line(line) {
                    Some((_, len)) => len,
                    None if !line.starts_with(b"VALUE ") => {
                        return Err(ProtocolError::BadReply("expected VALUE or END"));
                    }
                    None => data_len(value_header_length(line)?)?,
                };
                pos = match data_after(buf, line_end, len)? {
                    Some(end) => end,
                    None => return Ok(ReplyParse::Incomplete),
                };
                line_end = match line_at(buf, pos, limits)? {
                    Some(e) => e,
                    None => return Ok(ReplyParse::Incomplete),
                };
            }
        }
        ReplyKind::Stats => {
            // Sub-commands that answer with one line instead of a listing.
            if is_error_line(first) || first == b"RESET" || first == b"OK" {
                return Ok(ReplyParse::Complete(first_end + 2));
            }
            let mut pos = 0;
            let mut line_end = first_end;
            loop {
                let line = &buf[pos..line_end];
                if line == b"END" {
                    return Ok(ReplyParse::Complete(line_end + 2));
                }
                // STAT for stats listings, ITEM for cachedump, PREFIX for detail dump.
                if !(line.starts_with(b"STAT ")
                    || line.starts_with(b"ITEM ")
                    || line.starts_with(b"PREFIX "))
                {
                    return Err(ProtocolError::BadReply("expected STAT or END"));
                }
                pos = line_end + 2;
                line_end = match line_at(buf, pos, limits)? {
                    Some(e) => e,
                    None => return Ok(ReplyParse::Incomplete),
                };
            }
        }
    }
}

/// The VALUE blocks of a complete retrieval reply (as framed by `parse_reply`), in order.
/// A reply that is a single error line (e.g. `SERVER_ERROR ...`) yields `Err` with that line's range.
///
/// The reply is trusted to be framed already; anything unexpected ends the
/// iteration as if it were the `END` line.
pub fn value_blocks(reply: &[u8]) -> Result<Vec<ValueBlock>, Range<usize>> {
    if let Some(line) = retrieval_error(reply) {
        return Err(line);
    }
    let mut blocks = Vec::new();
    let mut pos = 0;
    while let Some(block) = value_block_at(reply, pos) {
        pos = block.block.end;
        blocks.push(block);
    }
    Ok(blocks)
}

/// When a framed retrieval reply is a single error line instead of VALUE blocks, that line's
/// range (with its terminator).
pub fn retrieval_error(reply: &[u8]) -> Option<Range<usize>> {
    let nl = memchr::memchr(b'\n', reply)?;
    let line_end = nl.saturating_sub(1);
    is_error_line(&reply[..line_end]).then_some(0..(nl + 1))
}

/// The VALUE block that starts at byte `pos` of a framed retrieval reply, or `None` at
/// `END` (or at anything that is not a whole VALUE block). Lets a caller walk a reply
/// without collecting its blocks: `pos` of the next block is the returned `block.end`.
pub fn value_block_at(reply: &[u8], pos: usize) -> Option<ValueBlock> {
    let rest = reply.get(pos..)?;
    if !rest.starts_with(b"VALUE ") {
        return None;
    }
    let line_end = pos + memchr::memchr(b'\n', rest)?.saturating_sub(1);
    let line = &reply[pos..line_end];
    // "VALUE " is 6 bytes; the key runs to the next space. On unframed input a bare
    // "VALUE \n" puts line_end before key_start: `get` makes that a None, not a panic
    // (found by fuzzing; a framed reply always has the `\r`).
    let key_start = pos + 6;
    let (key_end, len) = match well_formed_value_line(line) {
        Some((key_end, len)) => (pos + key_end, len),
        None => (
            key_start + memchr::memchr(b' ', reply.get(key_start..line_end)?)?,
            data_len(word(line, 3)).ok()?,
        ),
    };
    let end = line_end + 2 + len + 2;
    (end <= reply.len()).then_some(ValueBlock {
        key: key_start..key_end,
        block: pos..end,
    })
}

/// The first space-separated word of a reply line.
fn first_word(line: &[u8]) -> &[u8] {
    match memchr::memchr(b' ', line) {
        Some(i) => &line[..i],
        None => line,
    }
}

/// For a reply to a request sent with `noreply`/`q` stripped: whether memcached would
/// have suppressed this reply. `first_line` is the reply's first line without `\r\n`.
///
/// Text noreply: memcached 1.6.18 suppresses every reply that goes through its
/// out_string(), which is every reply of a storage, delete, incr/decr, touch,
/// flush_all and verbosity command, errors included (`set k 0 0 -1 noreply`,
/// `incr k x noreply` and a bad data chunk answer nothing). Only arity errors
/// (`ERROR`) are sent, and those are caught by `parse_request` before a request
/// is ever forwarded. So for text commands this returns true for every line.
///
/// Meta `q` (verified against memcached 1.6.18, which differs from
/// doc/protocol.txt for md and ma): mg hides `EN`; ms and md hide `HD` only
/// (`NF` from md is still sent); ma hides every success, `HD` and also `VA`
/// with the `v` flag, but still sends `NF`. Errors are never hidden.
pub fn quiet_suppresses(command: Command, first_line: &[u8]) -> bool {
    let code = first_word(first_line);
    match command {
        Command::MetaGet => code == b"EN",
        Command::MetaSet | Command::MetaDelete => code == b"HD",
        Command::MetaArithmetic => code == b"HD" || code == b"VA",
        Command::MetaNoop | Command::MetaDebug => false,
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas
        | Command::Delete
        | Command::Incr
        | Command::Decr
        | Command::Touch
        | Command::FlushAll
        | Command::Verbosity => true,
        // No noreply for these in memcached.
        Command::Get
        | Command::Gets
        | Command::Gat
        | Command::Gats
        | Command::Version
        | Command::Stats
        | Command::Quit
        | Command::Shutdown => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass reader accepts exactly the lines the word-by-word readers accept, with
    /// the same key and length.
    #[test]
    fn the_one_pass_value_line_reader_agrees_with_the_careful_one() {
        let lines: [&[u8]; 22] = [
            b"VALUE k 0 5",
            b"VALUE key:1 4294967295 64 123456789",
            b"VALUE k 0 0",
            b"VALUE k 0 5 ",
            b"VALUE k 0 5  7",
            b"VALUE k  0 5",
            b"VALUE  k 0 5",
            b"VALUE k 0",
            b"VALUE k 0 ",
            b"VALUE k x 5",
            b"VALUE k 0 5x",
            b"VALUE k 0 5 7 8",
            b"VALUE k 0 5 x",
            b"VALUE k 0 1073741824",
            b"VALUE k 0 1073741825",
            b"VALUE k 0 99999999999999999999",
            b"VALUE k 0 0000000000000000005",
            b"VALUE k",
            b"VALUE ",
            b"VALUEk 0 5",
            b"VALUE k\r 0 5",
            b"VALUE k 0 5\r",
        ];
        for line in lines {
            let careful = value_header_length(line)
                .and_then(data_len)
                .ok()
                .map(|len| (6 + memchr::memchr(b' ', &line[6..]).unwrap_or(0), len))
                .filter(|_| line.starts_with(b"VALUE "));
            assert_eq!(
                well_formed_value_line(line),
                careful,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }
}
