//! Which [`Operation`] a request counts as, for operation routes and replicated routes.
//!
//! Classic commands map one to one. Meta commands count as their classic equivalent, the
//! way memcached itself executes them: `ms` by its mode flag `M<c>` (memcached accepts
//! either case), `ma` by its mode flag, `mg` and `me` as `get`, `md` as `delete`.
use crate::spec::Operation;
use memroute_protocol::{Command, Request};

/// The operation a request counts as for operation routes and replicated routes.
///
/// Keyless and local commands (`version`, `stats`, `verbosity`, `mn`, `quit`, `shutdown`)
/// answer [`Operation::Get`]: the proxy answers or broadcasts them itself and never routes
/// them, so the value only has to be harmless (a read, never replicated as a write).
/// `flush_all` is routed (to every server of the pools it reaches) and has its own
/// operation.
pub fn operation_of(request: &Request) -> Operation {
    match request.command {
        Command::Get => Operation::Get,
        Command::Gets => Operation::Gets,
        Command::Gat => Operation::Gat,
        Command::Gats => Operation::Gats,
        Command::Set => Operation::Set,
        Command::Add => Operation::Add,
        Command::Replace => Operation::Replace,
        Command::Append => Operation::Append,
        Command::Prepend => Operation::Prepend,
        Command::Cas => Operation::Cas,
        Command::Delete => Operation::Delete,
        Command::Incr => Operation::Incr,
        Command::Decr => Operation::Decr,
        Command::Touch => Operation::Touch,
        Command::FlushAll => Operation::FlushAll,
        Command::MetaGet | Command::MetaDebug => Operation::Get,
        Command::MetaDelete => Operation::Delete,
        // `ms <key> <datalen> <flags>*`: the flags start after the length.
        // A compare-and-swap (`C<cas>` flag) counts as `cas` whatever its mode: like `cas`,
        // it must never be repeated on another server.
        Command::MetaSet if meta_flag(request, 1, b'C') => Operation::Cas,
        Command::MetaSet => match meta_mode(request, 1) {
            Some(b'E' | b'e') => Operation::Add,
            Some(b'A' | b'a') => Operation::Append,
            Some(b'P' | b'p') => Operation::Prepend,
            Some(b'R' | b'r') => Operation::Replace,
            // `MS`, no mode, or a mode memcached will reject (it answers the error).
            _ => Operation::Set,
        },
        // `ma <key> <flags>*`.
        Command::MetaArithmetic => match meta_mode(request, 0) {
            Some(b'D' | b'd' | b'-') => Operation::Decr,
            _ => Operation::Incr,
        },
        Command::Version
        | Command::Verbosity
        | Command::Stats
        | Command::Quit
        | Command::Shutdown
        | Command::MetaNoop => Operation::Get,
    }
}

/// Whether a meta command line carries the flag `flag`, skipping `skip` words after the key.
fn meta_flag(request: &Request, skip: usize, flag: u8) -> bool {
    meta_words(request, skip).any(|word| word.first() == Some(&flag))
}

/// The words of a meta command line after its key, skipping `skip` of them.
fn meta_words(request: &Request, skip: usize) -> impl Iterator<Item = &[u8]> {
    let line = request
        .keys
        .first()
        .and_then(|key| request.frame.get(key.end..request.line_len))
        .unwrap_or_default();
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.split(|&b| b == b' ')
        .filter(|word| !word.is_empty())
        .skip(skip)
}

/// The byte after `M` in the first mode flag of a meta command line, skipping `skip`
/// words after the key before the flags begin. `None` without a mode flag.
fn meta_mode(request: &Request, skip: usize) -> Option<u8> {
    let key = request.keys.first()?;
    let line = request.frame.get(key.end..request.line_len)?;
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.split(|&b| b == b' ')
        .filter(|word| !word.is_empty())
        .skip(skip)
        .find(|word| word.first() == Some(&b'M'))
        .and_then(|word| word.get(1).copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use memroute_protocol::{parse_request, Limits, Parse};

    #[test]
    fn meta_set_with_a_cas_flag_is_a_cas() {
        assert_eq!(operation("ms k 2 C99\r\nhi\r\n"), Operation::Cas);
        assert_eq!(operation("ms k 2 MA C99\r\nhi\r\n"), Operation::Cas);
        assert_eq!(operation("ms k 2 T0\r\nhi\r\n"), Operation::Set);
    }

    fn operation(line: &str) -> Operation {
        let mut buf = BytesMut::from(line.as_bytes());
        match parse_request(&mut buf, &Limits::default()) {
            Parse::Request(request) => operation_of(&request),
            other => panic!("{line:?} did not parse: {other:?}"),
        }
    }

    #[test]
    fn classic_commands_map_one_to_one() {
        let cases = [
            ("get a b\r\n", Operation::Get),
            ("bget a\r\n", Operation::Get),
            ("gets a\r\n", Operation::Gets),
            ("gat 10 a b\r\n", Operation::Gat),
            ("gats 10 a\r\n", Operation::Gats),
            ("set k 0 0 1\r\nx\r\n", Operation::Set),
            ("add k 0 0 1\r\nx\r\n", Operation::Add),
            ("replace k 0 0 1\r\nx\r\n", Operation::Replace),
            ("append k 0 0 1\r\nx\r\n", Operation::Append),
            ("prepend k 0 0 1\r\nx\r\n", Operation::Prepend),
            ("cas k 0 0 1 7\r\nx\r\n", Operation::Cas),
            ("delete k\r\n", Operation::Delete),
            ("incr k 1\r\n", Operation::Incr),
            ("decr k 1\r\n", Operation::Decr),
            ("touch k 10\r\n", Operation::Touch),
            ("flush_all\r\n", Operation::FlushAll),
            ("flush_all 10 noreply\r\n", Operation::FlushAll),
        ];
        for (line, expected) in cases {
            assert_eq!(operation(line), expected, "{line:?}");
        }
    }

    #[test]
    fn meta_commands_count_as_their_classic_equivalent() {
        let cases = [
            ("mg k v\r\n", Operation::Get),
            ("mg k s v t T30\r\n", Operation::Get),
            ("me k\r\n", Operation::Get),
            ("md k q\r\n", Operation::Delete),
            ("ms k 1\r\nx\r\n", Operation::Set),
            ("ms k 1 T0 F5\r\nx\r\n", Operation::Set),
            ("ms k 1 MS\r\nx\r\n", Operation::Set),
            ("ms k 1 ME\r\nx\r\n", Operation::Add),
            ("ms k 1 Me\r\nx\r\n", Operation::Add),
            ("ms k 1 T0 MA\r\nx\r\n", Operation::Append),
            ("ms k 1 ma q\r\nx\r\n", Operation::Set), // `ma` is no mode flag: lower-case m
            ("ms k 1 MP\r\nx\r\n", Operation::Prepend),
            ("ms k 1 Mp\r\nx\r\n", Operation::Prepend),
            ("ms k 1 MR\r\nx\r\n", Operation::Replace),
            ("ms k 1 Mr\r\nx\r\n", Operation::Replace),
            ("ms k 1 MX\r\nx\r\n", Operation::Set), // memcached rejects it; still a write
            ("ms k 1 MR\nx\r\n", Operation::Replace), // bare \n terminator
            ("ma k\r\n", Operation::Incr),
            ("ma k MI\r\n", Operation::Incr),
            ("ma k M+ D5\r\n", Operation::Incr),
            ("ma k MD\r\n", Operation::Decr),
            ("ma k N0 Md v\r\n", Operation::Decr),
            ("ma k M-\r\n", Operation::Decr),
        ];
        for (line, expected) in cases {
            assert_eq!(operation(line), expected, "{line:?}");
        }
    }

    #[test]
    fn the_key_and_the_length_are_never_read_as_flags() {
        // A key or data length that starts with M is not a mode flag.
        assert_eq!(operation("ms MR 1\r\nx\r\n"), Operation::Set);
        assert_eq!(operation("ma MD\r\n"), Operation::Incr);
        assert_eq!(operation("ma MD MD\r\n"), Operation::Decr);
        // A base64 key (`b` flag) does not change where the flags are.
        assert_eq!(operation("ms a2V5 1 b ME\r\nx\r\n"), Operation::Add);
    }

    #[test]
    fn local_and_keyless_commands_count_as_reads() {
        for line in [
            "version\r\n",
            "verbosity 1\r\n",
            "stats\r\n",
            "stats slabs\r\n",
            "mn\r\n",
            "quit\r\n",
            "shutdown\r\n",
        ] {
            assert_eq!(operation(line), Operation::Get, "{line:?}");
        }
    }
}
