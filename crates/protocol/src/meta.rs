//! The meta protocol as memroute itself speaks it to its servers: one builder for the
//! requests it writes (the binary protocol's translation, a resize window's moves, probes)
//! and one reader for their replies, so no other crate writes `mg` or reads `VA` by hand.
//!
//! ```text
//!   MetaRequest::new(out, b"mg", key).flag(b'v').number(b'T', 30).finish()
//!       -> "mg KEY v T30\r\n"   (the key raw when a text line carries it, else base64 + `b`)
//!   MetaReply::of(b"VA 2 f5 c9\r\nhi\r\n")
//!       -> code "VA", numbers { size 2, flags 5, cas 9, ttl None }, rest "hi\r\n"
//! ```
use bytes::BufMut;

use crate::{encode_base64, MAX_KEY_LEN};

/// Whether `key` goes into a text or meta command line as it is: memcached's text parser
/// reads it whole, as one word, and as the key it is (no byte at or below space, no DEL).
pub fn is_text_key(key: &[u8]) -> bool {
    !key.is_empty() && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// How a key goes into a meta request: raw when it is a text key; otherwise base64 (the
/// `b` flag), unless its base64 form is longer than memcached takes (250 bytes, a key of
/// 187 bytes or more) while the key itself holds no space, CR, LF or NUL: memcached's text
/// parser splits words at spaces only and keeps control bytes as they are, so such a key
/// goes raw and is stored as the very bytes it is. A key that fits neither way goes base64
/// and memcached refuses it as too long, as it refuses the key from any client.
pub fn key_goes_raw(key: &[u8]) -> bool {
    is_text_key(key)
        || (base64_len(key.len()) > MAX_KEY_LEN
            && !key.iter().any(|&b| matches!(b, b' ' | b'\n' | b'\r' | 0)))
}

/// The length of `len` bytes in padded base64.
fn base64_len(len: usize) -> usize {
    len.div_ceil(3) * 4
}

/// One meta request being written into `out`: the verb and the key, then its tokens and
/// flags in order, then the `b` flag (when the key went base64) and the line's end, then,
/// for `ms`, the data.
#[must_use = "a meta request is written only when finished"]
#[derive(Debug)]
pub struct MetaRequest<'a, B: BufMut> {
    out: &'a mut B,
    base64: bool,
}

impl<'a, B: BufMut> MetaRequest<'a, B> {
    /// `verb key` (`mg`, `ms`, `md`, `ma`), the key as [`key_goes_raw`] says.
    pub fn new(out: &'a mut B, verb: &[u8], key: &[u8]) -> MetaRequest<'a, B> {
        out.put_slice(verb);
        out.put_u8(b' ');
        let raw = key_goes_raw(key);
        match raw {
            true => out.put_slice(key),
            false => encode_base64(key, out),
        }
        MetaRequest { out, base64: !raw }
    }

    /// A bare word: a flag without a value (`v`, `f`, `c`, `t`, `q`), or `ms`'s data size
    /// written with [`MetaRequest::size`].
    pub fn flag(self, flag: u8) -> Self {
        self.out.put_u8(b' ');
        self.out.put_u8(flag);
        self
    }

    /// A flag with a number (`T30`, `C123`, `D5`, `N0`, `J7`, `F0`).
    pub fn number(self, flag: u8, value: u64) -> Self {
        self.out.put_u8(b' ');
        self.out.put_u8(flag);
        put_decimal(self.out, value);
        self
    }

    /// A flag with a one-byte token (`MS`, `ME`, `MI`: a mode).
    pub fn mode(self, flag: u8, mode: u8) -> Self {
        self.out.put_u8(b' ');
        self.out.put_u8(flag);
        self.out.put_u8(mode);
        self
    }

    /// `ms`'s data size: the first word after the key.
    pub fn size(self, len: usize) -> Self {
        self.out.put_u8(b' ');
        put_decimal(self.out, len as u64);
        self
    }

    /// Ends the line: the `b` flag when the key went base64, then CRLF.
    pub fn finish(self) {
        if self.base64 {
            self.out.put_slice(b" b");
        }
        self.out.put_slice(b"\r\n");
    }

    /// Ends the line and writes `data` and its CRLF (`ms`).
    pub fn finish_with_data(self, data: &[u8]) {
        let out = &mut *self.out;
        if self.base64 {
            out.put_slice(b" b");
        }
        out.put_slice(b"\r\n");
        out.put_slice(data);
        out.put_slice(b"\r\n");
    }
}

/// `value` in decimal, without a formatter (the request path writes these).
fn put_decimal<B: BufMut>(out: &mut B, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.put_slice(&digits[at..]);
}

/// A text or meta reply: its first line (without its line end), that line's first word (a
/// meta status code comes with flags, `NS c0`: judged by the first word) and what follows
/// the line (a `VA` value, or the rest of a multi-line reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaReply<'a> {
    pub line: &'a [u8],
    pub code: &'a [u8],
    pub rest: &'a [u8],
}

/// The numbers of a meta reply line (`VA <size> f<flags> c<cas> t<ttl>`): what is absent
/// or garbled reads as 0 (the ttl as `None`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetaNumbers {
    pub size: usize,
    pub flags: u32,
    pub cas: u64,
    /// Seconds the item has left (`t`): `None` when the reply carries none or says `t-1`
    /// (never expires); `Some(0)` is an item with no time left.
    pub ttl: Option<u64>,
}

impl<'a> MetaReply<'a> {
    /// Reads the first line of `reply`.
    pub fn of(reply: &'a [u8]) -> MetaReply<'a> {
        let (line, rest) = split_line(reply);
        let code = line.split(|&b| b == b' ').next().unwrap_or_default();
        MetaReply { line, code, rest }
    }

    /// Whether the reply's code is `code` (`VA`, `HD`, `NS`, `NF`, `EN`, `EX`, `END`, ...).
    pub fn is(&self, code: &[u8]) -> bool {
        self.code == code
    }

    /// The numbers of the line, read in one pass over its words after the code.
    pub fn numbers(&self) -> MetaNumbers {
        let mut numbers = MetaNumbers::default();
        let words = self.line.get(self.code.len() + 1..).unwrap_or_default();
        for (at, word) in words.split(|&b| b == b' ').enumerate() {
            match word.first() {
                Some(first) if at == 0 && first.is_ascii_digit() => {
                    numbers.size = decimal(word).unwrap_or(0) as usize;
                }
                Some(b'f') => numbers.flags = decimal(&word[1..]).unwrap_or(0) as u32,
                Some(b'c') => numbers.cas = decimal(&word[1..]).unwrap_or(0),
                Some(b't') => numbers.ttl = decimal(&word[1..]),
                _ => {}
            }
        }
        numbers
    }

    /// The value of a `VA` reply: the `size` bytes after its line, when they are all there.
    pub fn value(&self) -> Option<&'a [u8]> {
        self.rest.get(..self.numbers().size)
    }
}

/// `reply`'s first line (without CRLF or LF) and what follows it.
pub fn split_line(reply: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memchr(b'\n', reply) {
        Some(nl) => {
            let line = &reply[..nl];
            (line.strip_suffix(b"\r").unwrap_or(line), &reply[nl + 1..])
        }
        None => (reply, &[]),
    }
}

/// A decimal number: digits only, no sign, no overflow.
pub fn decimal(word: &[u8]) -> Option<u64> {
    if word.is_empty() || word.len() > 20 {
        return None;
    }
    let mut number = 0u64;
    for &digit in word {
        let value = digit.wrapping_sub(b'0');
        if value > 9 {
            return None;
        }
        number = number.checked_mul(10)?.checked_add(u64::from(value))?;
    }
    Some(number)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(build: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        build(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn requests_are_written_word_by_word_with_the_key_as_a_text_line_carries_it() {
        let get = line(|out| {
            MetaRequest::new(out, b"mg", b"k1")
                .flag(b'v')
                .flag(b'f')
                .number(b'T', 30)
                .finish()
        });
        assert_eq!(get, "mg k1 v f T30\r\n");
        let set = line(|out| {
            MetaRequest::new(out, b"ms", b"a b")
                .size(2)
                .mode(b'M', b'E')
                .number(b'C', 0)
                .finish_with_data(b"hi")
        });
        assert_eq!(set, "ms YSBi 2 ME C0 b\r\nhi\r\n");
        let delete = line(|out| {
            MetaRequest::new(out, b"md", b"k")
                .number(b'C', u64::MAX)
                .finish()
        });
        assert_eq!(delete, "md k C18446744073709551615\r\n");
    }

    #[test]
    fn one_rule_says_when_a_key_goes_raw() {
        assert!(key_goes_raw(b"user:42"));
        assert!(!key_goes_raw(b"a b"));
        assert!(!key_goes_raw(b""));
        assert!(!key_goes_raw(b"\x01short"));
        // Too long for base64 (a 187-byte key is 252 encoded): raw when a line holds it.
        let long_control = [&[1u8][..], &[b'k'; 186]].concat();
        assert!(key_goes_raw(&long_control));
        let long_space = [&b" "[..], &[b'k'; 186]].concat();
        assert!(!key_goes_raw(&long_space));
        let short_control = [&[1u8][..], &[b'k'; 185]].concat();
        assert!(!key_goes_raw(&short_control), "248 bytes of base64 fit");
    }

    #[test]
    fn replies_are_read_in_one_pass_and_what_is_absent_or_garbled_reads_as_zero() {
        let reply = MetaReply::of(b"VA 2 f5 c9 t-1\r\nhi\r\n");
        assert!(reply.is(b"VA"));
        assert_eq!(
            reply.numbers(),
            MetaNumbers {
                size: 2,
                flags: 5,
                cas: 9,
                ttl: None
            }
        );
        assert_eq!(reply.value(), Some(&b"hi"[..]));
        let stored = MetaReply::of(b"HD c7 t30\r\n");
        assert!(stored.is(b"HD") && !stored.is(b"H"));
        assert_eq!(stored.numbers().cas, 7);
        assert_eq!(stored.numbers().ttl, Some(30));
        assert_eq!(
            MetaReply::of(b"VA x fz\r\n").numbers(),
            MetaNumbers::default()
        );
        assert_eq!(MetaReply::of(b"VA 5\r\nhi").value(), None);
        assert_eq!(decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(decimal(b"18446744073709551616"), None);
        assert_eq!(decimal(b""), None);
    }
}
