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

/// A `VALUE <key> <flags> <bytes>[ <cas>]\r\n` line as memcached writes it, at the start of
/// `rest`, read in one pass of byte compares: no search for the line's end or the key's
/// (a reply carries one such line per value; the key's end is found eight bytes at a time,
/// see `scan`). `None` for anything else, a line not fully arrived included
/// (the careful readers below then say what it is): the same lines are accepted, with the
/// same key and length, as when the line is first cut at its `\r\n` and read word by word.
#[inline]
fn value_line(rest: &[u8]) -> Option<ValueLine> {
    let after = rest.strip_prefix(b"VALUE ")?;
    // The key runs to the next space; a newline first means this is not one whole line.
    let key_end = crate::scan::find_either(after, 0, b' ', b'\n')?;
    if key_end == 0 || after[key_end] != b' ' {
        return None;
    }
    value_line_numbers(after, key_end)
}

/// The rest of a VALUE line after its key (`after` starts after `VALUE `, the key ends at
/// `key_end`, where a space is): flags, data length, optional cas, `\r\n`.
#[inline(always)]
fn value_line_numbers(after: &[u8], key_end: usize) -> Option<ValueLine> {
    // Flags: digits, then a space.
    let flags_start = key_end + 1;
    let mut i = skip_digits(after, flags_start);
    if i == flags_start || after.get(i) != Some(&b' ') {
        return None;
    }
    // The data length: at most 19 digits (so no overflow), at most memcached's maximum.
    let bytes_start = i + 1;
    let mut len = 0usize;
    i = bytes_start;
    while let Some(&digit) = after.get(i).filter(|b| b.is_ascii_digit()) {
        if i - bytes_start == 19 {
            return None;
        }
        len = len * 10 + usize::from(digit - b'0');
        i += 1;
    }
    if i == bytes_start || len > MAX_REPLY_VALUE_LEN {
        return None;
    }
    // An optional cas, then the end of the line.
    if after.get(i) == Some(&b' ') {
        let cas_start = i + 1;
        i = skip_digits(after, cas_start);
        if i == cas_start {
            return None;
        }
    }
    if after.get(i..i + 2) != Some(b"\r\n") {
        return None;
    }
    Some(ValueLine {
        key_end: 6 + key_end,
        len,
        data_start: 6 + i + 2,
    })
}

/// A VALUE line read by [`value_line`]; offsets from the line's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ValueLine {
    /// Where the key ends (it starts at 6, after `VALUE `).
    key_end: usize,
    /// The data block's length, without its `\r\n`.
    len: usize,
    /// Just past the line's `\r\n`: where the data block starts.
    data_start: usize,
}

/// The end of the run of ASCII digits starting at `from` (`from` itself when none).
#[inline(always)]
fn skip_digits(bytes: &[u8], mut from: usize) -> usize {
    while bytes.get(from).is_some_and(u8::is_ascii_digit) {
        from += 1;
    }
    from
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
    parse_reply_counting(buf, kind, limits).map(|(parse, _)| parse)
}

/// [`parse_reply`], and with a complete retrieval reply how many `VALUE` blocks it holds
/// (0 for an error line and for every other kind). Counted as the framing reads them: a
/// caller that must know whether every key of a batch was answered (a warm-up asks warm
/// only for cold's misses) compares the count with the keys it asked for instead of
/// walking the reply again.
pub fn parse_reply_counting(
    buf: &[u8],
    kind: ReplyKind,
    limits: &Limits,
) -> Result<(ReplyParse, u32), ProtocolError> {
    parse_reply_blocks(buf, 0, kind, limits, &mut |_| {})
}

/// [`parse_reply_counting`] for a retrieval reply that also tells `block_end` where each
/// `VALUE` block ends, in order, as the framing passes it. Whoever must split a reply by
/// its blocks (a coalesced get's reply, per request) then needs no second parse of each
/// block's numbers.
///
/// `from` is where to start: 0, or the end of the last block told by an earlier attempt
/// on the same reply that was still incomplete (a long reply arriving in several reads is
/// framed once, not again from its start at every read). The count returned is of the
/// blocks from there.
pub fn parse_retrieval_blocks(
    buf: &[u8],
    from: usize,
    limits: &Limits,
    block_end: &mut impl FnMut(usize),
) -> Result<(ReplyParse, u32), ProtocolError> {
    parse_reply_blocks(buf, from, ReplyKind::Retrieval, limits, block_end)
}

#[inline(always)]
fn parse_reply_blocks(
    buf: &[u8],
    from: usize,
    kind: ReplyKind,
    limits: &Limits,
    block_end: &mut impl FnMut(usize),
) -> Result<(ReplyParse, u32), ProtocolError> {
    if kind == ReplyKind::Retrieval {
        if let Some(parsed) = framed_value_blocks(buf, from, limits, block_end) {
            return parsed;
        }
    }
    let first_end = match line_at(buf, 0, limits)? {
        Some(e) => e,
        None => return Ok((ReplyParse::Incomplete, 0)),
    };
    let first = &buf[..first_end];
    let parsed = match kind {
        ReplyKind::Line => one_line(first, first_end),
        ReplyKind::MetaGet => meta_get(buf, first, first_end),
        ReplyKind::Retrieval => {
            if is_error_line(first) {
                return Ok((ReplyParse::Complete(first_end + 2), 0));
            }
            return retrieval_lines(buf, 0, first_end, limits, 0, block_end);
        }
        ReplyKind::Stats => stats_listing(buf, first, first_end, limits),
    };
    parsed.map(|parse| (parse, 0))
}

/// A retrieval reply's `VALUE` blocks as memcached writes them and the `END` line, each
/// line read in one pass from `from`. The first line that is anything else (an error
/// line, a line not fully arrived, a malformed one) is read again by the careful readers:
/// from there (`retrieval_lines`) past a first block, else `None` (the first line, read
/// by the caller).
#[inline(always)]
fn framed_value_blocks(
    buf: &[u8],
    from: usize,
    limits: &Limits,
    block_end: &mut impl FnMut(usize),
) -> Option<Result<(ReplyParse, u32), ProtocolError>> {
    let (mut pos, mut blocks) = (from, 0u32);
    loop {
        let rest = &buf[pos..];
        if rest.starts_with(b"END\r\n") {
            return Some(Ok((ReplyParse::Complete(pos + 5), blocks)));
        }
        let Some(line) = value_line(rest).filter(|line| line.data_start <= limits.max_line_len)
        else {
            break;
        };
        pos = match data_after(buf, pos + line.data_start - 2, line.len) {
            Ok(Some(end)) => end,
            Ok(None) => return Some(Ok((ReplyParse::Incomplete, 0))),
            Err(error) => return Some(Err(error)),
        };
        block_end(pos);
        blocks = blocks.saturating_add(1);
    }
    if pos == 0 {
        return None;
    }
    Some(match line_at(buf, pos, limits) {
        Ok(Some(line_end)) => retrieval_lines(buf, pos, line_end, limits, blocks, block_end),
        Ok(None) => Ok((ReplyParse::Incomplete, 0)),
        Err(error) => Err(error),
    })
}

/// A one-line reply whose line (`first`) is complete.
#[inline(always)]
fn one_line(first: &[u8], first_end: usize) -> Result<ReplyParse, ProtocolError> {
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

/// A meta get's reply: `VA` and its data block, or one line.
#[inline(always)]
fn meta_get(buf: &[u8], first: &[u8], first_end: usize) -> Result<ReplyParse, ProtocolError> {
    if first.starts_with(b"VA ") {
        let len = data_len(word(first, 1))?;
        return Ok(match data_after(buf, first_end, len)? {
            Some(end) => ReplyParse::Complete(end),
            None => ReplyParse::Incomplete,
        });
    }
    match first.first() {
        Some(_) if announces_data(first) => Err(ProtocolError::BadReply("unexpected meta reply")),
        Some(c) if c.is_ascii_uppercase() => Ok(ReplyParse::Complete(first_end + 2)),
        _ => Err(ProtocolError::BadReply("unexpected meta reply")),
    }
}

/// A stats reply: its listing up to `END`, or the one line some sub-commands answer.
#[inline(always)]
fn stats_listing(
    buf: &[u8],
    first: &[u8],
    first_end: usize,
    limits: &Limits,
) -> Result<ReplyParse, ProtocolError> {
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

/// The rest of a retrieval reply from its line at `pos` (content ending at `line_end`),
/// each line read word by word.
fn retrieval_lines(
    buf: &[u8],
    mut pos: usize,
    mut line_end: usize,
    limits: &Limits,
    mut blocks: u32,
    block_end: &mut impl FnMut(usize),
) -> Result<(ReplyParse, u32), ProtocolError> {
    loop {
        let line = &buf[pos..line_end];
        if line == b"END" {
            return Ok((ReplyParse::Complete(line_end + 2), blocks));
        }
        if !line.starts_with(b"VALUE ") {
            return Err(ProtocolError::BadReply("expected VALUE or END"));
        }
        let len = data_len(value_header_length(line)?)?;
        pos = match data_after(buf, line_end, len)? {
            Some(end) => end,
            None => return Ok((ReplyParse::Incomplete, 0)),
        };
        block_end(pos);
        blocks = blocks.saturating_add(1);
        line_end = match line_at(buf, pos, limits)? {
            Some(e) => e,
            None => return Ok((ReplyParse::Incomplete, 0)),
        };
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
    // The usual replies, told apart without looking for the line's end.
    if reply.starts_with(b"VALUE ") || reply.starts_with(b"END\r\n") {
        return None;
    }
    let nl = memchr::memchr(b'\n', reply)?;
    let line_end = nl.saturating_sub(1);
    is_error_line(&reply[..line_end]).then_some(0..(nl + 1))
}

/// The VALUE block that starts at byte `pos` of a framed retrieval reply, or `None` at
/// `END` (or at anything that is not a whole VALUE block). Lets a caller walk a reply
/// without collecting its blocks: `pos` of the next block is the returned `block.end`.
pub fn value_block_at(reply: &[u8], pos: usize) -> Option<ValueBlock> {
    let rest = reply.get(pos..)?;
    if let Some(line) = value_line(rest) {
        let end = pos + line.data_start + line.len + 2;
        return (end <= reply.len()).then_some(ValueBlock {
            key: pos + 6..pos + line.key_end,
            block: pos..end,
        });
    }
    if !rest.starts_with(b"VALUE ") {
        return None;
    }
    let line_end = pos + memchr::memchr(b'\n', rest)?.saturating_sub(1);
    let line = &reply[pos..line_end];
    // "VALUE " is 6 bytes; the key runs to the next space. On unframed input a bare
    // "VALUE \n" puts line_end before key_start: `get` makes that a None, not a panic
    // (found by fuzzing; a framed reply always has the `\r`).
    let key_start = pos + 6;
    let (key_end, len) = (
        key_start + memchr::memchr(b' ', reply.get(key_start..line_end)?)?,
        data_len(word(line, 3)).ok()?,
    );
    let end = line_end + 2 + len + 2;
    (end <= reply.len()).then_some(ValueBlock {
        key: key_start..key_end,
        block: pos..end,
    })
}

/// The VALUE block at byte `pos` of a framed retrieval reply when it is `key`'s (a key
/// as a client sends it: no spaces, no newline), else `None`: what [`value_block_at`] and a
/// comparison of its key with `key` answer, without looking for the key's end when the
/// reply's key is `key` (a multi-get's merge knows which key it expects next).
pub fn value_block_for(reply: &[u8], pos: usize, key: &[u8]) -> Option<Range<usize>> {
    let rest = reply.get(pos..)?;
    let after = rest.strip_prefix(b"VALUE ")?;
    let fast = match after.get(key.len()) {
        Some(b' ') if !key.is_empty() && after.starts_with(key) => {
            value_line_numbers(after, key.len())
        }
        _ => None,
    };
    let block = match fast {
        Some(line) => pos..pos + line.data_start + line.len + 2,
        None => {
            let block = value_block_at(reply, pos)?;
            if reply.get(block.key.clone())? != key {
                return None;
            }
            block.block
        }
    };
    (block.end <= reply.len()).then_some(block)
}

/// Whether the VALUE block that a framing pass found starting at byte `pos` of `reply` is
/// `key`'s: the key follows `VALUE ` and runs to the next space. Only the header is read,
/// so the block's data need not have arrived.
#[inline]
pub fn framed_block_is_for(reply: &[u8], pos: usize, key: &[u8]) -> bool {
    let key_start = pos + b"VALUE ".len();
    reply.get(key_start..key_start + key.len()) == Some(key)
        && reply.get(key_start + key.len()) == Some(&b' ')
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

    #[test]
    fn framed_block_is_for_reads_the_key_up_to_its_space() {
        let reply = b"END\r\nVALUE ab 0 1\r\nx\r\n";
        assert!(framed_block_is_for(reply, 5, b"ab"));
        assert!(!framed_block_is_for(reply, 5, b"a"), "a prefix of the key");
        assert!(!framed_block_is_for(reply, 5, b"abc"));
        assert!(
            !framed_block_is_for(b"VALUE ab", 0, b"ab"),
            "header cut before its space"
        );
    }

    /// Block ends are told once each, in order, however the reply arrives: fed one byte
    /// more at a time and resumed from the last end told (as the backend reader does), the
    /// ends and the length match one framing of the whole reply.
    #[test]
    fn retrieval_block_ends_resume_across_partial_reads() {
        let reply: &[u8] =
            b"VALUE a 0 1\r\nx\r\nVALUE bb 5 3 77\r\nEND\r\nVALUE c 0 2 9\r\nyy\r\nEND\r\n";
        let limits = Limits::default();
        let mut whole = Vec::new();
        let framed = parse_retrieval_blocks(reply, 0, &limits, &mut |end| whole.push(end));
        assert_eq!(
            framed.expect("framed"),
            (ReplyParse::Complete(reply.len()), 3)
        );
        assert_eq!(whole, vec![16, 38, 57]);
        let mut ends: Vec<usize> = Vec::new();
        for len in 0..=reply.len() {
            let from = ends.last().copied().unwrap_or(0);
            let parse =
                parse_retrieval_blocks(&reply[..len], from, &limits, &mut |end| ends.push(end))
                    .expect("a prefix of a good reply frames or waits");
            match parse.0 {
                ReplyParse::Incomplete => assert!(len < reply.len()),
                ReplyParse::Complete(n) => {
                    assert_eq!((len, n), (reply.len(), reply.len()));
                }
            }
        }
        assert_eq!(ends, whole);
        // An error line has no blocks; the count is the framing's.
        let mut none = Vec::new();
        let error =
            parse_retrieval_blocks(b"SERVER_ERROR busy\r\n", 0, &limits, &mut |e| none.push(e));
        assert_eq!(error.expect("framed"), (ReplyParse::Complete(19), 0));
        assert!(none.is_empty());
    }

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
            let whole = [line, b"\r\n"].concat();
            let read = value_line(&whole).map(|v| {
                assert_eq!(v.data_start, whole.len());
                (v.key_end, v.len)
            });
            assert_eq!(read, careful, "{:?}", String::from_utf8_lossy(line));
            // Followed by its data: the same; cut anywhere before its end: not read.
            let followed = [&whole[..], b"xxxxx\r\nEND\r\n"].concat();
            assert_eq!(value_line(&followed).map(|v| (v.key_end, v.len)), careful);
            for cut in 0..whole.len() {
                assert_eq!(value_line(&whole[..cut]), None);
            }
        }
        // A line that ends (at a newline) inside what would be its key is not one.
        assert_eq!(value_line(b"VALUE k\n 0 5\r\n"), None);
        assert_eq!(value_line(b"VALUE k 0 5\n"), None);
    }

    /// Random replies (VALUE lines with odd spacing, numbers and lengths, error lines, cut
    /// short, bytes flipped): the framing with its one-pass reader answers exactly what the
    /// careful readers alone answer, and the merge's `value_block_for` what `value_block_at`
    /// and a key comparison answer.
    #[test]
    fn one_pass_readers_agree_with_the_careful_ones_on_random_replies() {
        let limits = Limits {
            max_line_len: 40,
            ..Limits::default()
        };
        let careful = |buf: &[u8]| -> Result<ReplyParse, ProtocolError> {
            let Some(first_end) = line_at(buf, 0, &limits)? else {
                return Ok(ReplyParse::Incomplete);
            };
            if is_error_line(&buf[..first_end]) {
                return Ok(ReplyParse::Complete(first_end + 2));
            }
            retrieval_lines(buf, 0, first_end, &limits, 0, &mut |_| {}).map(|(parse, _)| parse)
        };
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |below: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % below as u64) as usize
        };
        let pieces: [&[u8]; 14] = [
            b"VALUE ",
            b"k",
            b"key:12",
            b" ",
            b"  ",
            b"0",
            b"17",
            b"3",
            b"x",
            b"\r\n",
            b"\n",
            b"\r",
            b"END",
            b"SERVER_ERROR oops",
        ];
        // Complete, incomplete, refused: each must come up often for the test to say much.
        let mut outcomes = [0usize; 3];
        for _ in 0..20_000 {
            let mut reply = Vec::new();
            for _ in 0..next(4) {
                // Mostly well-formed blocks, some with a piece swapped or added.
                let key = [&b"k"[..], b"key:12", b"ab"][next(3)];
                let len = next(4);
                let mut line = format!(" {} {}", next(3), len).into_bytes();
                if next(3) == 0 {
                    line.extend_from_slice(format!(" {}", next(100)).as_bytes());
                }
                reply.extend_from_slice(b"VALUE ");
                reply.extend_from_slice(key);
                reply.extend_from_slice(&line);
                reply.extend_from_slice(b"\r\n");
                reply.extend(std::iter::repeat_n(b'v', len));
                reply.extend_from_slice(b"\r\n");
                if next(4) == 0 {
                    let at = next(reply.len() + 1);
                    let piece = pieces[next(pieces.len())];
                    reply.splice(at..at, piece.iter().copied());
                }
            }
            reply.extend_from_slice(
                [&b"END\r\n"[..], b"SERVER_ERROR oops\r\n"][usize::from(next(8) == 0)],
            );
            if next(3) == 0 {
                let at = next(reply.len());
                reply[at] = b"VALUE k0123\r\n \n"[next(15)];
            }
            let cut = match next(3) {
                0 => next(reply.len() + 1),
                _ => reply.len(),
            };
            let buf = &reply[..cut];
            let framed = parse_reply(buf, ReplyKind::Retrieval, &limits);
            assert_eq!(framed, careful(buf), "{:?}", String::from_utf8_lossy(buf));
            // The count the framing keeps is the number of blocks a walk of the reply finds.
            if let Ok((ReplyParse::Complete(len), blocks)) =
                parse_reply_counting(buf, ReplyKind::Retrieval, &limits)
            {
                let walked = value_blocks(&buf[..len]).map_or(0, |blocks| blocks.len());
                assert_eq!(
                    blocks as usize,
                    walked,
                    "{:?}",
                    String::from_utf8_lossy(buf)
                );
            }
            outcomes[match framed {
                Ok(ReplyParse::Complete(_)) => 0,
                Ok(ReplyParse::Incomplete) => 1,
                Err(_) => 2,
            }] += 1;
            for pos in 0..buf.len() {
                for key in [&b"k"[..], b"key:12", b"ab", b"a"] {
                    let expected = value_block_at(buf, pos)
                        .filter(|block| &buf[block.key.clone()] == key)
                        .map(|block| block.block);
                    assert_eq!(value_block_for(buf, pos, key), expected);
                }
            }
        }
        assert!(outcomes.iter().all(|&n| n > 1_000), "{outcomes:?}");
    }

    /// Replies as memcached writes them are framed by the one-pass reader; anything else
    /// (error lines, malformed or cut lines anywhere in the reply) exactly as the careful
    /// reader does.
    #[test]
    fn retrieval_framing_agrees_on_whole_cut_and_broken_replies() {
        let limits = Limits::default();
        let replies: [&[u8]; 9] = [
            b"END\r\n",
            b"VALUE a 0 1\r\n1\r\nVALUE bb 5 2 77\r\n22\r\nEND\r\n",
            b"SERVER_ERROR out of memory\r\n",
            b"VALUE a 0 1\r\n1\r\nVALUE b  0 1\r\n2\r\nEND\r\n",
            b"VALUE a 0 1\r\n1\r\nVALUE b 0 1\n2\r\nEND\r\n",
            b"VALUE a 0 1\r\n12\r\nEND\r\n",
            b"VALUE a 0 1\r\n1\r\nEND\n",
            b"VALUE a 0 1\r\n1\r\nSTAT x\r\nEND\r\n",
            b"VALUE a 0 1\r\n1\r\nERROR\r\n",
        ];
        let expected = [
            Ok(ReplyParse::Complete(5)),
            Ok(ReplyParse::Complete(replies[1].len())),
            Ok(ReplyParse::Complete(replies[2].len())),
            Err(ProtocolError::BadReply("malformed VALUE line")),
            Err(ProtocolError::BadReply("line not terminated by \\r\\n")),
            Err(ProtocolError::BadReply(
                "data block not terminated by \\r\\n",
            )),
            Err(ProtocolError::BadReply("line not terminated by \\r\\n")),
            Err(ProtocolError::BadReply("expected VALUE or END")),
            Err(ProtocolError::BadReply("expected VALUE or END")),
        ];
        for (reply, expected) in replies.iter().zip(expected) {
            assert_eq!(parse_reply(reply, ReplyKind::Retrieval, &limits), expected);
        }
        // Every cut of a good reply waits for more.
        for cut in 0..replies[1].len() {
            assert_eq!(
                parse_reply(&replies[1][..cut], ReplyKind::Retrieval, &limits),
                Ok(ReplyParse::Incomplete),
                "cut at {cut}"
            );
        }
        // A VALUE line longer than the line limit is refused.
        let small = Limits {
            max_line_len: 12,
            ..Limits::default()
        };
        assert_eq!(
            parse_reply(
                b"VALUE abc 0 1\r\n1\r\nEND\r\n",
                ReplyKind::Retrieval,
                &small
            ),
            Err(ProtocolError::BadReply("line too long"))
        );
        // The merge's walk finds the same blocks.
        let blocks = value_blocks(replies[1]).expect("no error line");
        assert_eq!(blocks.len(), 2);
        assert_eq!(&replies[1][blocks[1].key.clone()], b"bb");
        assert_eq!(
            &replies[1][blocks[1].block.clone()],
            b"VALUE bb 5 2 77\r\n22\r\n"
        );
        assert_eq!(retrieval_error(replies[2]), Some(0..replies[2].len()));
        // Looking for a given key: its block, or nothing when the block is another key's
        // (a longer key, a shorter one, a prefix of it).
        let reply = b"VALUE ab 0 1\r\n1\r\nVALUE abc 0 2 9\r\n22\r\nEND\r\n";
        assert_eq!(value_block_for(reply, 0, b"ab"), Some(0..17));
        for other in [&b"a"[..], b"abc", b"b", b""] {
            assert_eq!(value_block_for(reply, 0, other), None);
        }
        assert_eq!(value_block_for(reply, 17, b"abc"), Some(17..38));
        assert_eq!(value_block_for(reply, 38, b"abc"), None);
        // A header the fast reader refuses is read by the careful one.
        let padded = b"VALUE k 0 1 \r\n1\r\nEND\r\n";
        assert_eq!(
            value_block_for(padded, 0, b"k"),
            value_block_at(padded, 0).map(|b| b.block)
        );
        // Cut short: no block.
        assert_eq!(value_block_for(&reply[..16], 0, b"ab"), None);
        assert_eq!(retrieval_error(replies[1]), None);
    }
}
