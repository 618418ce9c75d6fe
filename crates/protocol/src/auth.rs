//! memcached's authentication on the wire, both directions, sans-I/O:
//!
//! ```text
//!   client side (a listener that requires a login; memcached's -Y and -S):
//!     text bytes --parse_login--> Login::{Incomplete, Close, Answer(reply), Attempt(user, pass)}
//!     SASL PLAIN (binary) --sasl_plain--> (user, pass)
//!     Authfile (memcached's `user:password` lines) --check(user, pass)--> bool
//!   backend side (memroute logging in to a memcached started with -Y):
//!     login_request(user, pass) -> "set ... N\r\nuser pass\r\n"
//!     classify_hello(first reply line) -> Hello::{Open, LoginRequired, Refused}
//! ```
//!
//! memcached's rules are copied from its proto_text.c (`try_read_command_asciiauth`),
//! proto_bin.c (SASL) and authfile.c, so a client sees through memroute exactly what it
//! would see from memcached itself.

use crate::ProtocolError;

/// Bytes without a newline after which memcached gives up on an unauthenticated
/// connection and closes it.
const MAX_LOGIN_LINE: usize = 2048;
/// The longest `user password` token memroute reads from a client that has not logged in
/// (memcached's `MAX_AUTH_REQ_LEN`, from 1.6.42 on).
pub const MAX_LOGIN_TOKEN: usize = 16384;

/// The reply memcached gives a connection that has not logged in to anything but a login.
pub const UNAUTHENTICATED: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";
/// A login whose user and password the authfile does not hold.
pub const AUTHENTICATION_FAILURE: &[u8] = b"CLIENT_ERROR authentication failure\r\n";
/// A login that succeeded.
pub const LOGGED_IN: &[u8] = b"STORED\r\n";

/// What a connection that has not logged in sent, as memcached reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Login<'a> {
    /// Not a whole login (or line) yet: read more.
    Incomplete,
    /// memcached closes the connection without a word (2 KiB without a newline).
    Close,
    /// Answered with `reply` (`CLIENT_ERROR ...`); `consumed` bytes are done with.
    Answer {
        consumed: usize,
        reply: &'static [u8],
    },
    /// A login to check against the authfile: [`LOGGED_IN`] if it holds them, else
    /// [`AUTHENTICATION_FAILURE`].
    Attempt {
        consumed: usize,
        user: &'a [u8],
        password: &'a [u8],
    },
}

/// Reads the next request of a client that has not logged in, as memcached 1.6.18's
/// `try_read_command_asciiauth` does (the memcached the tests compare against): a line of
/// at least five words, the first `set` and the fifth a size, followed by a data block of
/// that size whose first two words are the user and the password, is a login (the key,
/// flags and exptime are ignored); any other line is answered `CLIENT_ERROR
/// unauthenticated`, and only that line is read.
///
/// One bound 1.6.18 lacks and later versions have: a token over [`MAX_LOGIN_TOKEN`] bytes
/// is refused before it is read, so a client that has not logged in cannot make memroute
/// buffer a value of its choosing.
pub fn parse_login(input: &[u8]) -> Login<'_> {
    if input.len() < 2 {
        return Login::Incomplete;
    }
    let Some(newline) = memchr::memchr(b'\n', input) else {
        return match input.len() > MAX_LOGIN_LINE {
            true => Login::Close,
            false => Login::Incomplete,
        };
    };
    let after_line = newline + 1;
    let unauthenticated = Login::Answer {
        consumed: after_line,
        reply: UNAUTHENTICATED,
    };
    // The CR stays in the last word, as in memcached: its number parser stops at it.
    let mut words = c_words(&input[..newline]);
    if words.next() != Some(&b"set"[..]) {
        return unauthenticated;
    }
    let Some(size) = words.nth(3).and_then(c_strtoul) else {
        return unauthenticated;
    };
    if size > MAX_LOGIN_TOKEN as u64 {
        return Login::Answer {
            consumed: after_line,
            reply: b"CLIENT_ERROR auth token too long\r\n",
        };
    }
    let block = size as usize + 2;
    let Some(data) = input.get(after_line..after_line + block) else {
        return Login::Incomplete;
    };
    let consumed = after_line + block;
    let Some(token) = data.strip_suffix(b"\r\n") else {
        return Login::Answer {
            consumed,
            reply: b"CLIENT_ERROR bad command line termination\r\n",
        };
    };
    let mut words = c_words(token);
    match (words.next(), words.next()) {
        (Some(user), Some(password)) => Login::Attempt {
            consumed,
            user,
            password,
        },
        _ => Login::Answer {
            consumed,
            reply: b"CLIENT_ERROR bad authentication token format\r\n",
        },
    }
}

/// The words of `text` as memcached's `tokenize_command` splits them: at spaces, empty
/// words skipped, the text ending at its first NUL (memcached reads it as a C string).
fn c_words(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let text = match memchr::memchr(0, text) {
        Some(nul) => &text[..nul],
        None => text,
    };
    text.split(|&b| b == b' ').filter(|word| !word.is_empty())
}

/// memcached's `safe_strtoul`: C's `strtoul` (leading blanks and one sign allowed), the
/// digits followed by whitespace or nothing, no negative number.
fn c_strtoul(word: &[u8]) -> Option<u64> {
    let text = word.trim_ascii_start();
    let (negative, digits) = match text.first() {
        Some(b'+') => (false, &text[1..]),
        Some(b'-') => (true, &text[1..]),
        _ => (false, text),
    };
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 || !digits[end..].first().is_none_or(u8::is_ascii_whitespace) {
        return None;
    }
    let value: u64 = std::str::from_utf8(&digits[..end]).ok()?.parse().ok()?;
    match negative && value != 0 {
        true => None,
        false => Some(value),
    }
}

/// The user and password of a SASL PLAIN message (RFC 4616: `authzid NUL authcid NUL
/// passwd`); `None` when it is not one.
pub fn sasl_plain(message: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut parts = message.splitn(3, |&b| b == 0);
    let _authorization = parts.next()?;
    let user = parts.next()?;
    let password = parts.next()?;
    Some((user, password))
}

/// The only SASL mechanism memroute offers its binary clients.
pub const SASL_MECHANISMS: &[u8] = b"PLAIN";
/// The body of memcached's answer to a SASL login that succeeded.
pub const SASL_AUTHENTICATED: &[u8] = b"Authenticated";

/// Users and passwords in memcached's authfile format (`memcached -Y FILE`): one
/// `user:password` per line.
#[derive(Clone, PartialEq, Eq)]
pub struct Authfile {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Passwords are never printed.
impl std::fmt::Debug for Authfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Authfile({} users)", self.entries.len())
    }
}

impl Authfile {
    /// Reads the file's text as memcached's authfile.c does: each line up to its first `:`
    /// is a user, the rest up to CR or LF the password; a line without `:` makes the whole
    /// file unusable (memcached refuses to start). Unlike memcached, which keeps the first
    /// 8 entries and silently drops the rest, every entry is kept, and an empty file is an
    /// error rather than a listener nobody can log in to.
    pub fn parse(text: &[u8]) -> Result<Authfile, ProtocolError> {
        let mut entries = Vec::new();
        for (index, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                return Err(ProtocolError::AuthfileMalformed { line: index + 1 });
            };
            entries.push((line[..colon].to_vec(), line[colon + 1..].to_vec()));
        }
        if entries.is_empty() {
            return Err(ProtocolError::AuthfileEmpty);
        }
        Ok(Authfile { entries })
    }

    /// Whether `user` with `password` may log in. Every entry is compared in full, so the
    /// time taken does not tell how much of a guess was right.
    pub fn check(&self, user: &[u8], password: &[u8]) -> bool {
        let mut found = false;
        for (known_user, known_password) in &self.entries {
            found |= same(user, known_user) & same(password, known_password);
        }
        found
    }

    /// How many users it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Byte equality that reads all of both inputs' common length whatever they hold.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut difference = u8::from(a.len() != b.len());
    for (x, y) in a.iter().zip(b) {
        difference |= x ^ y;
    }
    difference == 0
}

/// The line memroute sends first on every backend connection: memcached answers `VERSION`
/// on a connection that may be used, and `CLIENT_ERROR unauthenticated` when it wants a
/// login first (started with -Y).
pub const HELLO: &[u8] = b"version\r\n";

/// The login memroute sends a memcached that wants one: a `set` whose data block is
/// `user password` (the key is ignored by memcached; it names who logs in for a reader of
/// a packet capture).
pub fn login_request(user: &str, password: &str) -> Vec<u8> {
    let token_len = user.len() + 1 + password.len();
    let mut request = format!("set memroute 0 0 {token_len}\r\n").into_bytes();
    request.extend_from_slice(user.as_bytes());
    request.push(b' ');
    request.extend_from_slice(password.as_bytes());
    request.extend_from_slice(b"\r\n");
    request
}

/// What a backend's first reply line says about logging in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hello {
    /// Anything but an authentication error: the connection may be used.
    Open,
    /// memcached wants a login (`CLIENT_ERROR unauthenticated`).
    LoginRequired,
    /// memcached refused a login (`CLIENT_ERROR authentication failure`, or the token's
    /// form).
    Refused,
}

/// Reads the reply line (CRLF or not) to [`HELLO`] or to a [`login_request`].
pub fn classify_hello(line: &[u8]) -> Hello {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    match line {
        b"CLIENT_ERROR unauthenticated" => Hello::LoginRequired,
        b"CLIENT_ERROR authentication failure"
        | b"CLIENT_ERROR auth token too long"
        | b"CLIENT_ERROR bad authentication token format" => Hello::Refused,
        _ => Hello::Open,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(input: &[u8]) -> (&[u8], &[u8]) {
        match parse_login(input) {
            Login::Attempt { user, password, .. } => (user, password),
            other => panic!("{other:?}"),
        }
    }

    fn answer(input: &[u8]) -> String {
        match parse_login(input) {
            Login::Answer { reply, .. } => String::from_utf8_lossy(reply).into_owned(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_login_set_is_an_attempt_whatever_its_key_flags_and_exptime() {
        let input = b"set anything 5 99 7\r\nfoo bar\r\nget x\r\n";
        assert_eq!(
            parse_login(input),
            Login::Attempt {
                consumed: 30,
                user: b"foo",
                password: b"bar"
            }
        );
    }

    #[test]
    fn any_other_line_is_unauthenticated_and_only_that_line_is_read() {
        for line in [
            &b"get foo\r\n"[..],
            b"mg foo v\r\n",
            b"set foo 0 0\r\n",
            b"setx foo 0 0 7\r\n",
            b"set k 0 0 x\r\n",
            b"set k 0 0 -1\r\n",
            b"mn\r\n",
            b"\r\n",
        ] {
            let mut input = line.to_vec();
            input.extend_from_slice(b"rest");
            assert_eq!(
                parse_login(&input),
                Login::Answer {
                    consumed: line.len(),
                    reply: UNAUTHENTICATED
                },
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn words_split_at_spaces_as_memcached_splits_them() {
        let foo_bar = (&b"foo"[..], &b"bar"[..]);
        assert_eq!(attempt(b"  set  k  0 0   7\r\nfoo bar\r\n"), foo_bar);
        assert_eq!(attempt(b"set k 0 0 9\r\nfoo bar x\r\n"), foo_bar);
        assert_eq!(attempt(b"set k 0 0 8\r\n foo bar\r\n"), foo_bar);
        assert_eq!(attempt(b"set k 0 0 +7\r\nfoo bar\r\n"), foo_bar);
        assert_eq!(attempt(b"set k 0 0 7\nfoo bar\r\n"), foo_bar);
    }

    #[test]
    fn only_endless_lines_close_as_memcached_closes_them() {
        assert_eq!(parse_login(&[b'a'; 2049]), Login::Close);
        assert_eq!(parse_login(&[b'a'; 2048]), Login::Incomplete);
        assert_eq!(parse_login(b"\n"), Login::Incomplete);
        assert_eq!(parse_login(b"set k 0 0 7\r\nfoo"), Login::Incomplete);
    }

    #[test]
    fn a_malformed_token_gets_memcached_s_own_error() {
        let format = "CLIENT_ERROR bad authentication token format\r\n";
        assert_eq!(answer(b"set k 0 0 6\r\nfoobar\r\n"), format);
        assert_eq!(answer(b"set k 0 0 4\r\nfoo \r\n"), format);
        let termination = "CLIENT_ERROR bad command line termination\r\n";
        assert_eq!(answer(b"set k 0 0 7\r\nfoo barXY"), termination);
        assert_eq!(
            answer(b"set k 0 0 16385\r\n"),
            "CLIENT_ERROR auth token too long\r\n"
        );
    }

    #[test]
    fn the_authfile_reads_as_memcached_reads_it() {
        let file = Authfile::parse(b"foo:bar\r\nuser:pa:ss\n\n").expect("parses");
        assert_eq!(file.len(), 2);
        assert!(file.check(b"foo", b"bar"));
        assert!(file.check(b"user", b"pa:ss"));
        assert!(!file.check(b"foo", b"ba"));
        assert!(!file.check(b"fo", b"bar"));
        assert!(!file.check(b"foo", b"barr"));
        assert_eq!(
            Authfile::parse(b"foo:bar\nnocolon\n"),
            Err(ProtocolError::AuthfileMalformed { line: 2 })
        );
        assert_eq!(Authfile::parse(b"\n"), Err(ProtocolError::AuthfileEmpty));
        assert_eq!(format!("{file:?}"), "Authfile(2 users)");
    }

    #[test]
    fn sasl_plain_carries_user_and_password_after_the_authorization_id() {
        assert_eq!(sasl_plain(b"\0foo\0bar"), Some((&b"foo"[..], &b"bar"[..])));
        assert_eq!(
            sasl_plain(b"admin\0foo\0b\0r"),
            Some((&b"foo"[..], &b"b\0r"[..]))
        );
        assert_eq!(sasl_plain(b"foo bar"), None);
    }

    #[test]
    fn the_backend_login_is_a_set_memcached_reads_as_one() {
        let request = login_request("foo", "bar");
        assert_eq!(request, b"set memroute 0 0 7\r\nfoo bar\r\n");
        assert_eq!(attempt(&request), (&b"foo"[..], &b"bar"[..]));
        assert_eq!(classify_hello(b"VERSION 1.6.18\r\n"), Hello::Open);
        assert_eq!(
            classify_hello(b"CLIENT_ERROR unauthenticated\r\n"),
            Hello::LoginRequired
        );
        assert_eq!(
            classify_hello(b"CLIENT_ERROR authentication failure\r\n"),
            Hello::Refused
        );
    }
}
