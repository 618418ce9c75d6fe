//! A request's exptime capped (a failover route's `failover_exptime`: what it writes to a
//! gutter pool lives at most that long). mcrouter's rule (`ModifyExptimeRoute`, action
//! `min`, which its `FailoverWithExptimeRoute` puts before each failover child): an exptime
//! of 0 (never expires) or above the cap becomes the cap; any other (a shorter one, or a
//! negative one, which memcached takes as already expired) is sent as it is. The value is
//! compared as a number, so an absolute Unix time (above 30 days, [`MAX_RELATIVE_EXPTIME`])
//! is above any cap a config accepts and becomes the cap, as in mcrouter.
//!
//! Which requests carry an exptime: set, add, replace, append, prepend, cas, touch, gat and
//! gats (mcrouter's requests with an exptime, delete aside, which memcached's text protocol
//! does not give one); `ms` by its `T` flag (none is 0, so one is added); `mg` only when it
//! touches (`T`). A binary request reaches a server as meta, so it is capped as meta.
//!
//! [`MAX_RELATIVE_EXPTIME`]: crate::MAX_RELATIVE_EXPTIME
use bytes::{BufMut, Bytes, BytesMut};

use crate::meta::decimal;
use crate::{Command, RequestBytes};

/// The exptime to send instead of `exptime` under a cap of `cap` seconds (above 0), or
/// `None` when it goes as it is.
pub fn capped_exptime(exptime: i64, cap: u32) -> Option<u32> {
    (exptime == 0 || exptime > i64::from(cap)).then_some(cap)
}

/// Where the exptime of a text command is: its word's index in the command line.
fn exptime_word(command: Command) -> Option<usize> {
    match command {
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas => Some(3),
        Command::Touch => Some(2),
        Command::Gat | Command::Gats => Some(1),
        _ => None,
    }
}

/// `parts` (a request of `command` as a server gets it) with its exptime capped at `cap`
/// seconds (above 0); `None` when it has no exptime or keeps its own. Allocates the new
/// request (a failover's path only).
pub fn cap_exptime(command: Command, parts: &RequestBytes, cap: u32) -> Option<RequestBytes> {
    let frame: Bytes = match &parts.tail {
        None => parts.head.clone(),
        Some(_) => {
            let mut joined = BytesMut::new();
            parts.pieces().for_each(|piece| joined.put_slice(piece));
            joined.freeze()
        }
    };
    let line_end = frame.iter().position(|&b| b == b'\n')?;
    let line = &frame[..line_end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (replace, value) = match command {
        Command::MetaSet | Command::MetaGet => meta_exptime(command, line, cap)?,
        _ => {
            let (range, word) = words(line).nth(exptime_word(command)?)?;
            let exptime = std::str::from_utf8(word).ok()?.parse::<i64>().ok()?;
            (range, capped_exptime(exptime, cap)?)
        }
    };
    let mut out = BytesMut::with_capacity(frame.len() + 12);
    out.put_slice(&frame[..replace.start]);
    if replace.is_empty() {
        out.put_slice(b" T");
    }
    out.put_slice(value.to_string().as_bytes());
    out.put_slice(&frame[replace.end..]);
    Some(RequestBytes::whole(out.freeze()))
}

/// The head of a multi-key `gat`/`gats` line (`gat 300 `: what comes before its keys)
/// with its exptime capped at `cap` seconds (above 0); `None` for any other head, or one
/// whose exptime goes as it is. (A multi-key touch sent on to a failover child.)
pub fn cap_multi_head(head: &[u8], cap: u32) -> Option<Bytes> {
    let mut words = words(head);
    let (_, command) = words.next()?;
    if command != b"gat" && command != b"gats" {
        return None;
    }
    let (range, word) = words.next()?;
    let exptime = std::str::from_utf8(word).ok()?.parse::<i64>().ok()?;
    let value = capped_exptime(exptime, cap)?;
    let mut out = BytesMut::with_capacity(head.len() + 12);
    out.put_slice(&head[..range.start]);
    out.put_slice(value.to_string().as_bytes());
    out.put_slice(&head[range.end..]);
    Some(out.freeze())
}

/// For `ms` / `mg`: the bytes of the `T` flag's number to replace (an empty range at the
/// line's end: a `T` flag to add) and the capped value.
fn meta_exptime(command: Command, line: &[u8], cap: u32) -> Option<(std::ops::Range<usize>, u32)> {
    // The flags follow the key (and, for ms, the data length).
    let skip = match command {
        Command::MetaSet => 3,
        _ => 2,
    };
    let flag = words(line)
        .skip(skip)
        .find(|(_, word)| word.first() == Some(&b'T'));
    match flag {
        Some((range, word)) => {
            let digits = &word[1..];
            let exptime = match digits.strip_prefix(b"-") {
                Some(negative) => -i64::try_from(decimal(negative)?).ok()?,
                None => i64::try_from(decimal(digits)?).ok()?,
            };
            Some((range.start + 1..range.end, capped_exptime(exptime, cap)?))
        }
        // An ms without T never expires: it gets the cap. An mg without T does not touch.
        None if command == Command::MetaSet => Some((line.len()..line.len(), cap)),
        None => None,
    }
}

/// The words of a command line with their byte ranges.
fn words(line: &[u8]) -> impl Iterator<Item = (std::ops::Range<usize>, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        while line.get(at) == Some(&b' ') {
            at += 1;
        }
        if at >= line.len() {
            return None;
        }
        let start = at;
        while at < line.len() && line[at] != b' ' {
            at += 1;
        }
        Some((start..at, &line[start..at]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(command: Command, request: &str, cap: u32) -> Option<String> {
        let parts = RequestBytes::whole(Bytes::from(request.to_string()));
        cap_exptime(command, &parts, cap).map(|p| {
            let bytes: Vec<u8> = p.pieces().flatten().copied().collect();
            String::from_utf8(bytes).expect("ascii")
        })
    }

    #[test]
    fn a_multi_key_touch_head_is_capped() {
        let head = |h: &str| cap_multi_head(h.as_bytes(), 60).map(|b| b.to_vec());
        assert_eq!(head("gat 0 "), Some(b"gat 60 ".to_vec()));
        assert_eq!(head("gats 3600 "), Some(b"gats 60 ".to_vec()));
        assert_eq!(head("gat 10 "), None);
        assert_eq!(head("gat -1 "), None);
        assert_eq!(head("get "), None);
        assert_eq!(head("gets "), None);
    }

    #[test]
    fn mcrouters_rule_zero_and_longer_become_the_cap_shorter_and_negative_stay() {
        assert_eq!(capped_exptime(0, 60), Some(60));
        assert_eq!(capped_exptime(61, 60), Some(60));
        assert_eq!(capped_exptime(60, 60), None);
        assert_eq!(capped_exptime(1, 60), None);
        assert_eq!(capped_exptime(-1, 60), None);
        // An absolute time (past 30 days) is a larger number than any cap.
        assert_eq!(capped_exptime(1_900_000_000, 600), Some(600));
    }

    #[test]
    fn text_storage_touch_and_gat_lines_get_the_cap() {
        let set = "set k 5 0 2\r\nhi\r\n";
        assert_eq!(
            capped(Command::Set, set, 60).as_deref(),
            Some("set k 5 60 2\r\nhi\r\n")
        );
        let cas = "cas k 0 9000 2 77\r\nhi\r\n";
        assert_eq!(
            capped(Command::Cas, cas, 600).as_deref(),
            Some("cas k 0 600 2 77\r\nhi\r\n")
        );
        assert_eq!(capped(Command::Add, "add k 0 30 1\r\nx\r\n", 60), None);
        assert_eq!(capped(Command::Set, "set k 0 -1 1\r\nx\r\n", 60), None);
        assert_eq!(
            capped(Command::Touch, "touch k 0\r\n", 60).as_deref(),
            Some("touch k 60\r\n")
        );
        assert_eq!(
            capped(Command::Gat, "gat 1900000000 a b\r\n", 60).as_deref(),
            Some("gat 60 a b\r\n")
        );
        assert_eq!(capped(Command::Get, "get k\r\n", 60), None);
        assert_eq!(capped(Command::Delete, "delete k 0\r\n", 60), None);
    }

    #[test]
    fn a_request_in_two_pieces_around_noreply_is_capped_whole() {
        let parts = RequestBytes {
            head: Bytes::from_static(b"set k 0 0 2"),
            tail: Some(Bytes::from_static(b"\r\nhi\r\n")),
        };
        let out = cap_exptime(Command::Set, &parts, 60).expect("capped");
        assert_eq!(&out.head[..], b"set k 0 60 2\r\nhi\r\n");
        assert!(out.tail.is_none());
    }

    #[test]
    fn meta_set_by_its_t_flag_mg_only_when_it_touches() {
        assert_eq!(
            capped(Command::MetaSet, "ms k 2 T0 F5\r\nhi\r\n", 60).as_deref(),
            Some("ms k 2 T60 F5\r\nhi\r\n")
        );
        assert_eq!(
            capped(Command::MetaSet, "ms k 2 F5\r\nhi\r\n", 60).as_deref(),
            Some("ms k 2 F5 T60\r\nhi\r\n")
        );
        assert_eq!(capped(Command::MetaSet, "ms k 2 T30\r\nhi\r\n", 60), None);
        assert_eq!(capped(Command::MetaSet, "ms k 2 T-1\r\nhi\r\n", 60), None);
        // The data block may hold a T: only the line's flags count.
        assert_eq!(
            capped(Command::MetaSet, "ms k 3\r\nT99\r\n", 60).as_deref(),
            Some("ms k 3 T60\r\nT99\r\n")
        );
        assert_eq!(
            capped(Command::MetaGet, "mg k v T0\r\n", 60).as_deref(),
            Some("mg k v T60\r\n")
        );
        assert_eq!(capped(Command::MetaGet, "mg k v\r\n", 60), None);
        // A key that looks like a flag is the key.
        assert_eq!(capped(Command::MetaGet, "mg T5 v\r\n", 60), None);
    }
}
