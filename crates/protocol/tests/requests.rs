//! parse_request against the replies memcached 1.6.18 gives for the same bytes.
//! Every expected error below was checked with a socket against a real
//! memcached 1.6.18 (`memcached -p 23456 -U 0`).
use bytes::BytesMut;
use memroute_protocol::{parse_request, Command, ErrorReply, Limits, Parse, Request, TooLarge};

fn limits() -> Limits {
    Limits::default()
}

/// Parses one request from `input`; returns the outcome and the bytes left.
fn parse(input: &[u8]) -> (Parse, Vec<u8>) {
    let mut buf = BytesMut::from(input);
    let p = parse_request(&mut buf, &limits());
    (p, buf.to_vec())
}

fn req(input: &[u8]) -> Request {
    match parse(input).0 {
        Parse::Request(r) => r,
        other => panic!(
            "expected a request for {:?}, got {other:?}",
            String::from_utf8_lossy(input)
        ),
    }
}

/// The reply bytes memroute must send, whether the stream survives, and the swallow count.
fn err(input: &[u8]) -> (Vec<u8>, usize, bool) {
    match parse(input).0 {
        Parse::Invalid {
            reply,
            swallow,
            close,
        } => (reply.to_bytes(), swallow, close),
        other => panic!(
            "expected Invalid for {:?}, got {other:?}",
            String::from_utf8_lossy(input)
        ),
    }
}

fn err_reply(input: &[u8]) -> Vec<u8> {
    err(input).0
}

const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";

#[test]
fn get_single_and_multi_keys() {
    let r = req(b"get foo\r\n");
    assert_eq!(r.command, Command::Get);
    assert_eq!(r.keys().collect::<Vec<_>>(), vec![&b"foo"[..]]);
    assert_eq!(r.line_len, 9);
    assert_eq!(&r.frame[..], b"get foo\r\n");

    let r = req(b"gets a  b a\n");
    assert_eq!(r.command, Command::Gets);
    assert_eq!(r.keys().collect::<Vec<_>>(), vec![&b"a"[..], b"b", b"a"]);
    assert_eq!(r.multi_key_head(), b"gets ");
    assert!(!r.noreply);
}

#[test]
fn get_with_many_keys_beyond_tokenizer_limit() {
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let line = format!("get {}\r\n", keys.join(" "));
    let r = req(line.as_bytes());
    assert_eq!(r.keys.len(), 100);
    assert_eq!(r.key(99), b"k99");
}

#[test]
fn gat_and_gats() {
    let r = req(b"gat 300 a b\r\n");
    assert_eq!(r.command, Command::Gat);
    assert_eq!(r.keys().collect::<Vec<_>>(), vec![&b"a"[..], b"b"]);
    assert_eq!(r.multi_key_head(), b"gat 300 ");
    let r = req(b"gats -1 a\r\n");
    assert_eq!(r.command, Command::Gats);
    // memcached answers END to a gat without keys.
    let r = req(b"gat 10\r\n");
    assert!(r.keys.is_empty());
    assert_eq!(
        err_reply(b"gat x a\r\n"),
        b"CLIENT_ERROR invalid exptime argument\r\n"
    );
    assert_eq!(err_reply(b"gat\r\n"), b"ERROR\r\n");
}

#[test]
fn unknown_empty_and_short_commands_are_error() {
    for input in [
        &b"foo\r\n"[..],
        b"\r\n",
        b"\n",
        b"get\r\n",
        b"m\r\n",
        b"mz\r\n",
        b"GET a\r\n",
        b"x\r\n",
        b"slabs reassign 1 2\r\n",
    ] {
        let (reply, swallow, close) = err(input);
        assert_eq!(reply, b"ERROR\r\n", "{:?}", String::from_utf8_lossy(input));
        assert_eq!((swallow, close), (0, false));
    }
}

#[test]
fn storage_commands_frame_line_and_data() {
    for (cmd, c) in [
        ("set", Command::Set),
        ("add", Command::Add),
        ("replace", Command::Replace),
        ("append", Command::Append),
        ("prepend", Command::Prepend),
    ] {
        let input = format!("{cmd} k 5 0 3\r\nabc\r\nget k\r\n");
        let (p, rest) = parse(input.as_bytes());
        let Parse::Request(r) = p else {
            panic!("{p:?}")
        };
        assert_eq!(r.command, c);
        assert_eq!(r.key(0), b"k");
        assert_eq!(r.line_len, cmd.len() + 10);
        assert_eq!(&r.frame[r.line_len..], b"abc\r\n");
        assert_eq!(rest, b"get k\r\n");
    }
    let r = req(b"cas k 0 0 1 99\r\nx\r\n");
    assert_eq!(r.command, Command::Cas);
    assert_eq!(r.frame.len(), 19);
    // memcached accepts "\n" line endings and tolerates words after the
    // length when the last is not `noreply`.
    let r = req(b"set k 0 0 1 foo\nx\r\n");
    assert!(!r.noreply);
    assert_eq!(r.line_len, 16);
}

#[test]
fn noreply_is_flagged_with_its_range() {
    let r = req(b"set k 0 0 1 noreply\r\nx\r\n");
    assert!(r.noreply);
    let q = r.quiet_token.clone().expect("quiet token");
    assert_eq!(&r.frame[q], b" noreply");
    let memroute_protocol::RequestBytes { head: a, tail: b } = r.forward_parts();
    let mut fwd = a.to_vec();
    fwd.extend_from_slice(&b.expect("second part"));
    assert_eq!(fwd, b"set k 0 0 1\r\nx\r\n");

    for input in [
        &b"delete k noreply\r\n"[..],
        b"delete k 0 noreply\r\n",
        b"incr k 1 noreply\r\n",
        b"decr k 1 noreply\r\n",
        b"touch k 1 noreply\r\n",
        b"flush_all noreply\r\n",
        b"flush_all 10 noreply\r\n",
        b"verbosity 1 noreply\r\n",
        b"cas k 0 0 1 5 noreply\r\nx\r\n",
    ] {
        let r = req(input);
        assert!(r.noreply, "{:?}", String::from_utf8_lossy(input));
        let q = r.quiet_token.clone().expect("quiet token");
        assert_eq!(&r.frame[q], b" noreply");
    }
    // `delete noreply` deletes the key "noreply".
    let r = req(b"delete noreply\r\n");
    assert!(!r.noreply);
    assert_eq!(r.key(0), b"noreply");
}

#[test]
fn storage_errors_match_memcached() {
    // Too few words: ERROR, and the data line is then parsed as a command.
    let (p, rest) = parse(b"set a 0 0\r\nx\r\n");
    assert_eq!(
        p,
        Parse::Invalid {
            reply: ErrorReply::Error,
            swallow: 0,
            close: false
        }
    );
    assert_eq!(rest, b"x\r\n");
    assert_eq!(err_reply(b"set a 0 0 1 noreply extra\r\n"), b"ERROR\r\n");
    // Bad numbers: CLIENT_ERROR, data block not swallowed.
    for input in [
        &b"set a 0 0 -1\r\n"[..],
        b"set a 0 0 abc\r\n",
        b"set a abc 0 1\r\n",
        b"set a 0 x 1\r\n",
        b"set a -1 0 1\r\n",
        b"cas a 0 0 1 x\r\n",
        b"cas a 0 0 1 -1\r\n",
        b"set a 0 0 \t\r\n",
    ] {
        let (p, rest) = parse(&[input, b"x\r\n"].concat());
        assert_eq!(
            p,
            Parse::Invalid {
                reply: ErrorReply::Client("bad command line format"),
                swallow: 0,
                close: false
            },
            "{:?}",
            String::from_utf8_lossy(input)
        );
        assert_eq!(rest, b"x\r\n");
    }
    // Key too long: same, memcached answers bad command line format.
    let long = "k".repeat(251);
    assert_eq!(
        err_reply(format!("set {long} 0 0 1\r\nx\r\n").as_bytes()),
        BAD_FORMAT
    );
    let ok = "k".repeat(250);
    assert_eq!(
        req(format!("set {ok} 0 0 1\r\nx\r\n").as_bytes())
            .key(0)
            .len(),
        250
    );
    // Under noreply memcached sends nothing for these errors.
    assert_eq!(err(b"set a 0 0 -1 noreply\r\n"), (vec![], 0, false));
    assert_eq!(err(b"set a 0 0 noreply\r\n"), (vec![], 0, false));
}

#[test]
fn numbers_parse_like_c_strtol() {
    // memcached 1.6.18 truncates to 32 bits and accepts signs: these store.
    let r = req(b"set a 0 0 4294967297\r\nx\r\n");
    assert_eq!(&r.frame[r.line_len..], b"x\r\n");
    req(b"set a 4294967296 0 1\r\nx\r\n");
    req(b"set a -0 +0 +1\r\nx\r\n");
    req(b"set a 0 0 1\tq\r\nx\r\n");
    req(b"set a 0 0 \t1\r\nx\r\n");
    req(b"touch a 99999999999\r\n");
    assert_eq!(
        err_reply(b"touch a 9999999999999999999999\r\n"),
        b"CLIENT_ERROR invalid exptime argument\r\n"
    );
    assert_eq!(
        err_reply(b"touch a +\r\n"),
        b"CLIENT_ERROR invalid exptime argument\r\n"
    );
    assert_eq!(
        err_reply(b"incr a -1\r\n"),
        b"CLIENT_ERROR invalid numeric delta argument\r\n"
    );
    assert_eq!(
        err_reply(b"incr a 18446744073709551616\r\n"),
        b"CLIENT_ERROR invalid numeric delta argument\r\n"
    );
    req(b"incr a 18446744073709551615\r\n");
}

#[test]
fn bad_data_chunk_consumes_exactly_bytes_plus_two() {
    // memcached: CLIENT_ERROR bad data chunk, then "\r\n" is an empty line (ERROR).
    let (p, rest) = parse(b"set a 0 0 1\r\nxyz\r\n");
    assert_eq!(
        p,
        Parse::Invalid {
            reply: ErrorReply::Client("bad data chunk"),
            swallow: 0,
            close: false
        }
    );
    assert_eq!(rest, b"\r\n");
    let (_, rest) = parse(b"set a 0 0 1\r\nx\nget a\r\n");
    assert_eq!(rest, b"et a\r\n");
    // Under noreply the error is silent.
    assert_eq!(err(b"set a 0 0 1 noreply\r\nxy\r\n"), (vec![], 0, false));
    // ms: never silent.
    assert_eq!(
        err_reply(b"ms a 1 q\r\nxy\r\n"),
        b"CLIENT_ERROR bad data chunk\r\n"
    );
}

/// A refused `set` or `ms`: what memcached answers, how much of the data is still to
/// swallow, and the delete of its key memcached does in its place (t/getset.t).
fn too_large(input: &[u8], limits: &Limits) -> (ErrorReply, usize, Request, Request, Vec<u8>) {
    let mut buf = BytesMut::from(input);
    match parse_request(&mut buf, limits) {
        Parse::TooLarge(refused) => {
            let TooLarge {
                reply,
                swallow,
                refused,
                unlink,
            } = *refused;
            (reply, swallow, refused, unlink, buf.to_vec())
        }
        other => panic!(
            "expected TooLarge for {:?}, got {other:?}",
            String::from_utf8_lossy(input)
        ),
    }
}

const TOO_LARGE: ErrorReply = ErrorReply::Server("object too large for cache");

#[test]
fn too_large_value_is_swallowed() {
    let lim = Limits {
        max_value_len: 10,
        ..Limits::default()
    };
    // Nothing of the data has arrived: all of it (and \r\n) is to be swallowed.
    let (reply, swallow, refused, unlink, rest) = too_large(b"set a 0 0 20\r\n", &lim);
    assert_eq!((reply, swallow, rest.len()), (TOO_LARGE, 22, 0));
    assert_eq!(&refused.frame[..], b"set a 0 0 20\r\n");
    assert_eq!((refused.command, refused.key(0)), (Command::Set, &b"a"[..]));
    assert_eq!(&unlink.frame[..], b"md a\r\n");
    assert_eq!(
        (unlink.command, unlink.key(0)),
        (Command::MetaDelete, &b"a"[..])
    );
    assert!(!unlink.noreply && !unlink.base64_key);
    // Part of it has arrived: removed now, the rest swallowed.
    let (reply, swallow, ..) = too_large(b"set a 0 0 20\r\n0123456789", &lim);
    assert_eq!((reply, swallow), (TOO_LARGE, 12));
    // All of it and more: the next command stays; noreply silences the answer, not the
    // delete.
    let (reply, swallow, refused, unlink, rest) = too_large(
        b"set a 0 0 20 noreply\r\n01234567890123456789\r\nmn\r\n",
        &lim,
    );
    assert_eq!((reply, swallow), (ErrorReply::Silent, 0));
    assert_eq!(rest, b"mn\r\n");
    assert!(refused.noreply);
    assert_eq!(&unlink.frame[..], b"md a\r\n");
    // ms under q still gets the error (memcached shows meta errors); every mode unlinks.
    let (reply, swallow, refused, unlink, _) = too_large(b"ms a 20 q MA\r\n", &lim);
    assert_eq!((reply, swallow), (TOO_LARGE, 22));
    assert_eq!(&refused.frame[..], b"ms a 20 q MA\r\n");
    assert_eq!(&unlink.frame[..], b"md a\r\n");
    // A base64 key is deleted as the client named it.
    let (_, _, refused, unlink, _) = too_large(b"ms Zm9v 20 b\r\n", &lim);
    assert!(refused.base64_key);
    assert_eq!(&unlink.frame[..], b"md Zm9v b\r\n");
    assert!(unlink.base64_key);
    // The refused line as memcached reads it ends at a NUL byte.
    let (_, _, refused, unlink, _) = too_large(b"set a 0 0 20\0 junk\r\n", &lim);
    assert_eq!(&refused.frame[..], b"set a 0 0 20\r\n");
    assert_eq!(&unlink.frame[..], b"md a\r\n");
    // add, replace, append, prepend and cas refused as too large leave the old value
    // (memcached unlinks for set only): refused, nothing more.
    for line in [
        &b"add a 0 0 20\r\n"[..],
        b"replace a 0 0 20\r\n",
        b"append a 0 0 20\r\n",
        b"prepend a 0 0 20\r\n",
        b"cas a 0 0 20 1\r\n",
    ] {
        let mut buf = BytesMut::from(line);
        assert_eq!(
            parse_request(&mut buf, &lim),
            Parse::Invalid {
                reply: TOO_LARGE,
                swallow: 22,
                close: false
            },
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
    // Default limit: 1 MiB is fine, 2000000 is not (memcached says the same).
    let (_, swallow, ..) = too_large(b"set a 0 0 2000000\r\n", &limits());
    assert_eq!(swallow, 2000002);
}

#[test]
fn delete_forms() {
    let r = req(b"delete a\r\n");
    assert_eq!((r.command, r.key(0)), (Command::Delete, &b"a"[..]));
    assert!(!req(b"delete a 0\r\n").noreply);
    let usage = b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n";
    assert_eq!(err_reply(b"delete a 1\r\n"), usage);
    assert_eq!(err_reply(b"delete a x y\r\n"), usage);
    assert_eq!(err_reply(b"delete a b c d\r\n"), b"ERROR\r\n");
    assert_eq!(err_reply(b"delete\r\n"), b"ERROR\r\n");
}

#[test]
fn arithmetic_touch_flush_verbosity() {
    let r = req(b"incr a 5\r\n");
    assert_eq!((r.command, r.key(0)), (Command::Incr, &b"a"[..]));
    assert_eq!(req(b"decr a 5\r\n").command, Command::Decr);
    assert_eq!(err_reply(b"incr a\r\n"), b"ERROR\r\n");
    assert_eq!(
        err_reply(b"incr a x\r\n"),
        b"CLIENT_ERROR invalid numeric delta argument\r\n"
    );
    assert_eq!(err(b"incr a x noreply\r\n").0, b"");
    assert_eq!(req(b"touch a 10\r\n").command, Command::Touch);
    assert_eq!(
        err_reply(b"touch a x\r\n"),
        b"CLIENT_ERROR invalid exptime argument\r\n"
    );

    let r = req(b"flush_all\r\n");
    assert_eq!((r.command, r.arg), (Command::FlushAll, Some(0)));
    assert_eq!(req(b"flush_all 30\r\n").arg, Some(30));
    assert_eq!(req(b"flush_all 0 0\r\n").arg, Some(0));
    assert_eq!(req(b"flush_all -5\r\n").arg, Some(0));
    assert_eq!(
        err_reply(b"flush_all x\r\n"),
        b"CLIENT_ERROR invalid exptime argument\r\n"
    );
    assert_eq!(err_reply(b"flush_all 1 2 3\r\n"), b"ERROR\r\n");

    let r = req(b"verbosity 1\r\n");
    assert_eq!((r.command, r.arg), (Command::Verbosity, Some(1)));
    assert_eq!(req(b"verbosity 1 2\r\n").arg, Some(1));
    assert_eq!(err_reply(b"verbosity\r\n"), b"ERROR\r\n");
    assert_eq!(err_reply(b"verbosity x\r\n"), BAD_FORMAT);
}

#[test]
fn keyless_commands() {
    assert_eq!(req(b"version\r\n").command, Command::Version);
    assert_eq!(req(b"version x\r\n").command, Command::Version);
    assert_eq!(req(b"quit\r\n").command, Command::Quit);
    assert_eq!(req(b"shutdown\r\n").command, Command::Shutdown);
    assert_eq!(req(b"mn\r\n").command, Command::MetaNoop);
    let r = req(b"stats\r\n");
    assert_eq!((r.command, r.stats_arg.clone()), (Command::Stats, 0..0));
    let r = req(b"stats  slabs x\r\n");
    assert_eq!(&r.frame[r.stats_arg.clone()], b"slabs x");
    assert!(r.keys.is_empty());
}

#[test]
fn meta_commands() {
    let r = req(b"mg foo v c Oabc k\r\n");
    assert_eq!((r.command, r.key(0)), (Command::MetaGet, &b"foo"[..]));
    assert!(!r.noreply && !r.base64_key);
    let r = req(b"mg Zm9v b q v\r\n");
    assert!(r.noreply && r.base64_key);
    assert_eq!(&r.frame[r.quiet_token.clone().expect("q")], b" q");
    let memroute_protocol::RequestBytes { head: a, tail: b } = r.forward_parts();
    assert_eq!([&a[..], &b.expect("rest")[..]].concat(), b"mg Zm9v b v\r\n");

    let r = req(b"ms foo 3 T10 F5 q\r\nbar\r\nmn\r\n");
    assert_eq!(
        (r.command, r.key(0), r.line_len),
        (Command::MetaSet, &b"foo"[..], 19)
    );
    assert_eq!(&r.frame[r.line_len..], b"bar\r\n");
    assert!(r.noreply);
    assert_eq!(req(b"ms foo 0\r\n\r\n").frame.len(), 12);
    assert_eq!(req(b"md foo q\r\n").command, Command::MetaDelete);
    assert_eq!(req(b"ma foo D5 MI\r\n").command, Command::MetaArithmetic);
    let r = req(b"me foo\r\n");
    assert_eq!((r.command, r.key(0)), (Command::MetaDebug, &b"foo"[..]));
    // Flag errors other than a repeated q are left to the backend.
    assert_eq!(req(b"mg a zz\r\n").command, Command::MetaGet);
}

#[test]
fn meta_errors_match_memcached() {
    assert_eq!(err_reply(b"mg\r\n"), b"ERROR\r\n");
    assert_eq!(err_reply(b"md\r\n"), b"ERROR\r\n");
    assert_eq!(err_reply(b"ma\r\n"), b"ERROR\r\n");
    assert_eq!(err_reply(b"ms\r\n"), b"ERROR\r\n");
    assert_eq!(err_reply(b"me\r\n"), BAD_FORMAT);
    assert_eq!(err_reply(b"ms a\r\n"), BAD_FORMAT);
    assert_eq!(err_reply(b"ms a x\r\n"), BAD_FORMAT);
    assert_eq!(err_reply(b"ms a -1\r\n"), BAD_FORMAT);
    let long = "k".repeat(251);
    assert_eq!(err_reply(format!("mg {long} v\r\n").as_bytes()), BAD_FORMAT);
    // q is never silent for meta errors.
    assert_eq!(err_reply(b"ms a x q\r\n"), BAD_FORMAT);
    // A repeated q: memcached's own answers, and ms swallows its data block.
    let (p, rest) = parse(b"ms a 1 q q\r\nx\r\nmn\r\n");
    assert_eq!(
        p,
        Parse::Invalid {
            reply: ErrorReply::Client("duplicate flag"),
            swallow: 0,
            close: false
        }
    );
    assert_eq!(rest, b"mn\r\n");
    assert_eq!(
        err_reply(b"mg a q q\r\n"),
        b"CLIENT_ERROR duplicate flag\r\n"
    );
    assert_eq!(
        err_reply(b"mg a zz q q\r\n"),
        b"CLIENT_ERROR invalid flag\r\n"
    );
    assert_eq!(
        err_reply(b"md a q q\r\n"),
        b"CLIENT_ERROR invalid or duplicate flag\r\n"
    );
    // Too many flags.
    let flags = " v".repeat(18);
    assert_eq!(
        err_reply(format!("mg a{flags}\r\n").as_bytes()),
        b"CLIENT_ERROR options flags are too long\r\n"
    );
    assert_eq!(
        err_reply(format!("md a{flags}\r\n").as_bytes()),
        b"CLIENT_ERROR options flags too long\r\n"
    );
    let flags17 = " v".repeat(17);
    req(format!("mg a{flags17}\r\n").as_bytes());
}

#[test]
fn key_too_long_in_get() {
    let long = "k".repeat(251);
    let (p, rest) = parse(format!("get a {long} b\r\nmn\r\n").as_bytes());
    assert_eq!(
        p,
        Parse::Invalid {
            reply: ErrorReply::Client("bad command line format"),
            swallow: 0,
            close: false
        }
    );
    assert_eq!(rest, b"mn\r\n");
}

#[test]
fn keys_with_control_bytes_are_accepted_like_memcached() {
    // memcached splits on ' ' only; "a\rb" is one key (it answers END).
    assert_eq!(req(b"get a\rb\r\n").key(0), b"a\rb");
    assert_eq!(req(b"get a\tb\r\n").key(0), b"a\tb");
}

#[test]
fn long_lines_without_newline() {
    // memcached closes silently on >2048 bytes without a newline...
    let junk = vec![b'a'; 3000];
    assert_eq!(err(&junk), (vec![], 0, true));
    // ...except for a multi-get, which may be long.
    let mut get = b"get ".to_vec();
    get.resize(get.len() + 3000, b'a');
    assert_eq!(parse(&get).0, Parse::Incomplete);
    // Beyond memroute's own limit for retrieval lines (the larger of the line and value
    // limits): closed with an error line.
    let lim = Limits {
        max_line_len: 100,
        max_value_len: 100,
        ..Limits::default()
    };
    let mut buf = BytesMut::from(&get[..]);
    assert_eq!(
        parse_request(&mut buf, &lim),
        Parse::Invalid {
            reply: ErrorReply::Client("line too long"),
            swallow: 0,
            close: true
        }
    );
}

#[test]
fn pipelined_frames_come_out_one_by_one() {
    let input =
        b"get a b\r\nset k 0 0 2\r\nhi\r\nbogus\r\nmg k v\r\nms k 1\r\nx\r\ndelete k\r\nmn\r\n";
    let mut buf = BytesMut::from(&input[..]);
    let mut seen = Vec::new();
    loop {
        match parse_request(&mut buf, &limits()) {
            Parse::Request(r) => seen.push(r.command.name().to_string()),
            Parse::Invalid { reply, .. } => seen.push(
                String::from_utf8_lossy(&reply.to_bytes())
                    .trim()
                    .to_string(),
            ),
            Parse::TooLarge(refused) => panic!("nothing here is too large: {refused:?}"),
            Parse::Incomplete => break,
        }
    }
    assert_eq!(seen, ["get", "set", "ERROR", "mg", "ms", "delete", "mn"]);
    assert!(buf.is_empty());
}

#[test]
fn every_split_point_is_incomplete_then_whole() {
    let frames: [&[u8]; 6] = [
        b"delete k 0 noreply\n",
        b"get foo bar\r\n",
        b"set k 1 2 5 noreply\r\nhello\r\n",
        b"cas k 1 2 3 77\r\nabc\r\n",
        b"ms k 3 T0 q\r\nabc\r\n",
        b"mg k v c k O1\r\n",
    ];
    for frame in frames {
        let whole = parse(frame);
        for cut in 0..frame.len() {
            let mut buf = BytesMut::from(&frame[..cut]);
            assert_eq!(
                parse_request(&mut buf, &limits()),
                Parse::Incomplete,
                "cut {cut} of {:?}",
                String::from_utf8_lossy(frame)
            );
            assert_eq!(&buf[..], &frame[..cut], "consumed on Incomplete");
            buf.extend_from_slice(&frame[cut..]);
            assert_eq!(parse_request(&mut buf, &limits()), whole.0);
            assert_eq!(buf.to_vec(), whole.1);
        }
    }
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn random_input_never_panics_and_never_consumes_on_incomplete() {
    let pieces: [&[u8]; 25] = [
        b"get",
        b"gets",
        b"gat",
        b"set",
        b"cas",
        b"delete",
        b"incr",
        b"touch",
        b"flush_all",
        b"verbosity",
        b"mg",
        b"ms",
        b"md",
        b"ma",
        b"me",
        b"mn",
        b" ",
        b"noreply",
        b"q",
        b"\r\n",
        b"\n",
        b"5",
        b"-1",
        b"k",
        b"\0",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let lim = Limits {
        max_key_len: 250,
        max_line_len: 4096,
        max_value_len: 64,
    };
    for _ in 0..20_000 {
        let mut input = Vec::new();
        for _ in 0..rng.below(30) {
            if rng.below(8) == 0 {
                input.push(rng.next() as u8);
            } else {
                input.extend_from_slice(pieces[rng.below(pieces.len())]);
            }
        }
        let mut buf = BytesMut::from(&input[..]);
        let mut rounds = 0;
        loop {
            rounds += 1;
            assert!(rounds < 1000, "no progress on {input:?}");
            let before = buf.to_vec();
            match parse_request(&mut buf, &lim) {
                Parse::Incomplete => {
                    assert_eq!(buf.to_vec(), before, "consumed on Incomplete");
                    break;
                }
                Parse::Request(r) => {
                    assert!(!r.frame.is_empty() && r.line_len <= r.frame.len());
                    // The forwarded command line never holds a NUL: a line with one is
                    // rebuilt from the bytes before it, the data block kept as it was.
                    assert!(!r.frame[..r.line_len].contains(&0), "NUL forwarded");
                    let consumed = before.len() - buf.len();
                    let line_total = before
                        .iter()
                        .position(|&b| b == b'\n')
                        .expect("a request has a newline")
                        + 1;
                    if before[..line_total].contains(&0) {
                        assert_eq!(&r.frame[r.line_len..], &before[line_total..consumed]);
                        assert!(r.frame[..r.line_len].ends_with(b"\r\n"));
                        let cut = r.line_len - 2;
                        assert_eq!(&r.frame[..cut], &before[..cut]);
                        assert_eq!(before[cut], 0);
                    } else {
                        assert_eq!(&before[..consumed], &r.frame[..]);
                    }
                    for k in &r.keys {
                        assert!(k.end <= r.line_len && k.len() <= lim.max_key_len);
                    }
                    if let Some(q) = &r.quiet_token {
                        assert!(q.end <= r.line_len);
                    }
                }
                Parse::Invalid { close, .. } => {
                    assert!(buf.len() < before.len() || close);
                    if close {
                        break;
                    }
                }
                Parse::TooLarge(refused) => {
                    assert!(buf.len() < before.len());
                    assert_eq!(refused.unlink.key(0), refused.refused.key(0));
                    assert!(
                        !refused.refused.frame.contains(&0),
                        "NUL in the refused line"
                    );
                }
            }
        }
    }
}

/// memcached tokenises a command line as a C string: a NUL byte ends the command (the
/// line still ends at its `\n`). Verified against memcached 1.6.18:
/// `set k\0junk 0 0 5\r\nhello\r\n` -> `ERROR\r\nERROR\r\n` (too few args, then `hello`
/// is a command); `get a\0b` = `get a`; `incr k 1\0 abc` = `incr k 1`; `touch k 10\0` =
/// `touch k 10`; `delete k\0 0 noreply` = `delete k` (answers DELETED); `mg k\0 v` = `mg k`
/// (HD, no value); `ms k\0 5` -> bad command line format and the data is a command;
/// `ms k 5\0 T0` = `ms k 5`; `\0get k` -> ERROR; `mn\0x` = `mn`.
#[test]
fn nul_byte_ends_the_command_line() {
    // Too few arguments once cut: ERROR, the line alone is consumed, the data line
    // is then parsed as a command (ERROR again).
    let mut buf = BytesMut::from(&b"set k\0junk 0 0 5\r\nhello\r\nget k\r\n"[..]);
    let p = parse_request(&mut buf, &limits());
    assert_eq!(
        p,
        Parse::Invalid {
            reply: ErrorReply::Error,
            swallow: 0,
            close: false
        }
    );
    assert_eq!(&buf[..], b"hello\r\nget k\r\n");
    assert!(matches!(
        parse_request(&mut buf, &limits()),
        Parse::Invalid {
            reply: ErrorReply::Error,
            swallow: 0,
            close: false
        }
    ));
    assert_eq!(
        req_from(&mut buf).keys().collect::<Vec<_>>(),
        vec![&b"k"[..]]
    );

    // Valid once cut: forwarded rebuilt, without the NUL and what follows it.
    let r = req(b"get a\0b\r\n");
    assert_eq!(&r.frame[..], b"get a\r\n");
    assert_eq!(r.line_len, 7);
    assert_eq!(r.keys().collect::<Vec<_>>(), vec![&b"a"[..]]);

    let r = req(b"get a b\0 c d\n");
    assert_eq!(&r.frame[..], b"get a b\r\n");
    assert_eq!(r.keys().collect::<Vec<_>>(), vec![&b"a"[..], b"b"]);

    let r = req(b"incr k 1\0 abc\r\n");
    assert_eq!(r.command, Command::Incr);
    assert_eq!(&r.frame[..], b"incr k 1\r\n");

    let r = req(b"touch k 10\0\r\n");
    assert_eq!(&r.frame[..], b"touch k 10\r\n");

    // noreply after the NUL is not seen: memcached answers DELETED.
    let r = req(b"delete k\0 0 noreply\r\n");
    assert_eq!(r.command, Command::Delete);
    assert!(!r.noreply && r.quiet_token.is_none());
    assert_eq!(&r.frame[..], b"delete k\r\n");

    // noreply just before the NUL is seen, and still strippable.
    let r = req(b"delete k noreply\0x\r\n");
    assert!(r.noreply);
    let memroute_protocol::RequestBytes { head: a, tail: b } = r.forward_parts();
    assert_eq!(
        [&a[..], &b.expect("split at noreply")[..]].concat(),
        b"delete k\r\n"
    );

    let r = req(b"mg k\0 v\r\n");
    assert_eq!(r.command, Command::MetaGet);
    assert_eq!(&r.frame[..], b"mg k\r\n");

    let r = req(b"mn\0x\r\n");
    assert_eq!(&r.frame[..], b"mn\r\n");

    // A storage line valid once cut keeps its data block.
    let r = req(b"set k 0 0 5\0junk\r\nhello\r\n");
    assert_eq!(&r.frame[..], b"set k 0 0 5\r\nhello\r\n");
    assert_eq!(r.line_len, 13);
    let r = req(b"ms k 5\0 T0\nhello\r\n");
    assert_eq!(&r.frame[..], b"ms k 5\r\nhello\r\n");
    let r = req(b"set k 0 0 1 noreply\0 x\r\nz\r\n");
    assert!(r.noreply);
    let memroute_protocol::RequestBytes { head: a, tail: b } = r.forward_parts();
    assert_eq!(
        [&a[..], &b.expect("split at noreply")[..]].concat(),
        b"set k 0 0 1\r\nz\r\n"
    );

    // ms with no length once cut: bad command line format, nothing swallowed.
    let mut buf = BytesMut::from(&b"ms k\0 5\r\nhello\r\n"[..]);
    assert_eq!(
        parse_request(&mut buf, &limits()),
        Parse::Invalid {
            reply: ErrorReply::Client("bad command line format"),
            swallow: 0,
            close: false
        }
    );
    assert_eq!(&buf[..], b"hello\r\n");

    // Nothing before the NUL: ERROR.
    assert_eq!(err(b"\0get k\r\n"), (b"ERROR\r\n".to_vec(), 0, false));
    // A '\r' before the NUL stays in the key, as memcached keeps it.
    let r = req(b"get a\r\0b\r\n");
    assert_eq!(r.keys().collect::<Vec<_>>(), vec![&b"a\r"[..]]);
    assert_eq!(&r.frame[..], b"get a\r\r\n");
    // An incomplete data block after a cut line is Incomplete and consumes nothing.
    let mut buf = BytesMut::from(&b"set k 0 0 5\0x\r\nhel"[..]);
    assert_eq!(parse_request(&mut buf, &limits()), Parse::Incomplete);
    assert_eq!(&buf[..], b"set k 0 0 5\0x\r\nhel");
}

fn req_from(buf: &mut BytesMut) -> Request {
    match parse_request(buf, &limits()) {
        Parse::Request(r) => r,
        other => panic!("expected a request, got {other:?}"),
    }
}

/// memcached 1.6.18 refuses a data length above INT_MAX - 2 (or negative after its 32-bit
/// truncation) as a bad command line and swallows nothing; lengths up to 2147483645 are
/// "object too large" and swallowed (`set` and `ms` alike). Verified:
/// `set k 0 0 2147483647` / `2147483646` / `4294967295` / `4294967294` / `-1` -> bad command
/// line format, no swallow; `2147483645`, `1048577` -> swallowed (SERVER_ERROR object too
/// large for cache); `4294967296` is 0 after truncation. `ms k 2147483646 q q` -> bad command
/// line format (the length is checked before the flags).
#[test]
fn data_length_bounds_match_memcached() {
    for len in [
        "2147483646",
        "2147483647",
        "4294967295",
        "4294967294",
        "-1",
        "-2147483648",
    ] {
        for line in [
            format!("set k 0 0 {len}\r\n"),
            format!("set k 0 0 {len} noreply\r\n"),
            format!("cas k 0 0 {len} 1\r\n"),
            format!("ms k {len}\r\n"),
            format!("ms k {len} q q\r\n"),
            format!("ms k {len} T0\r\n"),
        ] {
            let mut buf = BytesMut::from(format!("{line}mn\r\n").as_bytes());
            let p = parse_request(&mut buf, &limits());
            let silent = line.contains("noreply");
            let want = if silent {
                ErrorReply::Silent
            } else {
                ErrorReply::Client("bad command line format")
            };
            assert_eq!(
                p,
                Parse::Invalid {
                    reply: want,
                    swallow: 0,
                    close: false
                },
                "{line:?}"
            );
            assert_eq!(&buf[..], b"mn\r\n", "{line:?} must swallow nothing");
        }
    }
    // The largest length memcached accepts on the line: too large, swallowed with its \r\n.
    for line in ["set k 0 0 2147483645\r\n", "ms k 2147483645 T0\r\n"] {
        let (reply, swallow, ..) = too_large(line.as_bytes(), &limits());
        assert_eq!((reply, swallow), (TOO_LARGE, 2147483647), "{line:?}");
    }
    assert_eq!(
        err(b"cas k 0 0 2147483645 1\r\n"),
        (
            b"SERVER_ERROR object too large for cache\r\n".to_vec(),
            2147483647,
            false
        ),
    );
    // Flag errors on ms come after the length: swallowed.
    assert_eq!(
        err(b"ms k 2147483645 q q\r\n"),
        (
            b"CLIENT_ERROR duplicate flag\r\n".to_vec(),
            2147483647,
            false
        )
    );
    // Just above the item size: too large, swallowed.
    let (reply, swallow, ..) = too_large(b"set k 0 0 1048577\r\n", &limits());
    assert_eq!((reply, swallow), (TOO_LARGE, 1048579));
    // 2^32 truncates to 0: a valid empty value.
    let r = req(b"set k 0 0 4294967296\r\n\r\n");
    assert_eq!(r.frame.len(), 24);
}

/// Only ' ' separates words (tabs and a '\r' inside the line are part of a word), and a
/// line ends only at '\n': whatever is forwarded is one request for memcached too.
/// Verified: `set k\t0 0 0 1` stores key "k\t0"; `get\tt\tx` -> ERROR; `set r\rx 0 0 1`
/// stores key "r\rx"; `get r\rx\rmn` is one get (END); `set n 0 0\t1` -> ERROR;
/// `set n 0 0 1\t` and `set n 0 0 1\r\r\n` -> STORED (strtol's trailing whitespace);
/// `touch n\r10` -> ERROR.
#[test]
fn tabs_and_inner_carriage_returns_are_word_bytes() {
    let r = req(b"set k\t0 0 0 1\r\nx\r\n");
    assert_eq!(r.keys().collect::<Vec<_>>(), vec![&b"k\t0"[..]]);
    assert_eq!(err_reply(b"get\tt\tx\r\n"), b"ERROR\r\n");
    let r = req(b"get r\rx\rmn\r\n");
    assert_eq!(r.keys().collect::<Vec<_>>(), vec![&b"r\rx\rmn"[..]]);
    assert_eq!(&r.frame[..], b"get r\rx\rmn\r\n");
    assert_eq!(err_reply(b"set n 0 0\t1\r\nz\r\n"), b"ERROR\r\n");
    assert_eq!(req(b"set n 0 0 1\t\r\nz\r\n").frame.len(), 17);
    assert_eq!(req(b"set n 0 0 1\r\r\nz\r\n").frame.len(), 17);
    assert_eq!(err_reply(b"touch n\r10\r\n"), b"ERROR\r\n");
    let r = req(b"mg r\rx v\r\n");
    assert_eq!(r.keys().collect::<Vec<_>>(), vec![&b"r\rx"[..]]);
}

/// `get key0 key1 ... key9999`: 10,000 keys, a 79 KB line.
fn ten_thousand_keys(command: &str) -> Vec<u8> {
    let keys: Vec<String> = (0..10_000).map(|i| format!("key{i}")).collect();
    format!("{command} {}\r\n", keys.join(" ")).into_bytes()
}

#[test]
fn multi_gets_may_be_longer_than_max_line_len() {
    let limits = Limits::default();
    for command in ["get", "gets", "gat 10", "gats 10"] {
        let line = ten_thousand_keys(command);
        assert!(line.len() > limits.max_line_len, "{}", line.len());
        let mut buf = BytesMut::from(&line[..]);
        match parse_request(&mut buf, &limits) {
            Parse::Request(request) => {
                assert_eq!(request.keys.len(), 10_000, "{command}");
                assert_eq!(request.key(9_999), b"key9999");
                assert_eq!(request.line_len, line.len());
            }
            other => panic!("{command}: {other:?}"),
        }
        assert!(buf.is_empty());
        // Arriving in pieces, it waits for its newline rather than closing.
        let mut partial = BytesMut::from(&line[..line.len() - 2]);
        assert_eq!(parse_request(&mut partial, &limits), Parse::Incomplete);
        assert_eq!(partial.len(), line.len() - 2, "nothing consumed");
    }
}

#[test]
fn max_line_len_still_bounds_lines_that_are_not_retrievals() {
    let limits = Limits::default();
    let close = Parse::Invalid {
        reply: ErrorReply::Client("line too long"),
        swallow: 0,
        close: true,
    };
    // Too many words for a delete, and far too long: closed, not parsed.
    let mut buf = BytesMut::from(&ten_thousand_keys("delete")[..]);
    assert_eq!(parse_request(&mut buf, &limits), close);
    // A set line padded past the limit; still waiting for its newline past 2 KB, memcached
    // closes at once.
    let padded = format!("set k{} 0 0 1\r\nx\r\n", " ".repeat(70_000));
    let mut buf = BytesMut::from(padded.as_bytes());
    assert_eq!(parse_request(&mut buf, &limits), close);
    let mut buf = BytesMut::from(&padded.as_bytes()[..10_000]);
    assert_eq!(parse_request(&mut buf, &limits), err_close_silent());
    // A retrieval line past the retrieval bound (max_value_len) is closed too.
    let small = Limits {
        max_value_len: 32 * 1024,
        ..Limits::default()
    };
    let mut buf = BytesMut::from(&ten_thousand_keys("get")[..]);
    assert_eq!(parse_request(&mut buf, &small), close);
}

/// What memcached does with 2 KB of a line that is not a multi-get and has no newline yet:
/// closes without a word.
fn err_close_silent() -> Parse {
    Parse::Invalid {
        reply: ErrorReply::Silent,
        swallow: 0,
        close: true,
    }
}

/// memcached hangs up without a word on a line it does not know whose last word starts
/// with `HTTP/` (t/malicious-commands.t), and answers `ERROR` to the lines that look alike
/// but reach another branch of its dispatch first. Every case checked against memcached
/// 1.6.18 (Debian's build).
#[test]
fn http_request_lines_are_hung_up_on_as_memcached_does() {
    let words_then_http = |words: usize, tail: &str| {
        let mut line = "xb ".repeat(words);
        line.push_str(tail);
        line.push_str("\r\n");
        line
    };
    let hung_up: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.0\r\n".to_vec(),
        b"PUT /asdf/asd/fasdfasdf/sadf HTTP/1.1\r\n".to_vec(),
        b"DELETE HTTP/1.1\r\n".to_vec(),
        b"POST /x HTTP/1.1\n".to_vec(),
        b"HEAD / HTTP/1.1 \r\n".to_vec(),
        b" PUT /x HTTP/1.1\r\n".to_vec(),
        // A line of only the HTTP word: memcached 1.6.18 looks at its one word.
        b"HTTP/1.1\r\n".to_vec(),
        b"HTTP/\r\n".to_vec(),
        // Names that reach the last branch: upper case, unknown, or debug-only.
        b"Xb HTTP/1.1\r\n".to_vec(),
        b"ver HTTP/1.1\r\n".to_vec(),
        b"misbehave HTTP/1.1\r\n".to_vec(),
        // The line as memcached reads it ends at a NUL byte.
        b"POST /x HTTP/1.1\0zz\r\n".to_vec(),
        // The 23rd word is the last one memcached's tokenizer keeps.
        words_then_http(22, "HTTP/1.1 x y").into_bytes(),
    ];
    for line in &hung_up {
        let (parsed, rest) = parse(line);
        assert_eq!(
            parsed,
            err_close_silent(),
            "{:?}",
            String::from_utf8_lossy(line)
        );
        assert!(rest.is_empty());
    }
    let answered: Vec<Vec<u8>> = vec![
        // Not `HTTP/` as the last word (case and the slash matter; a tab is no separator).
        b"PUT /x HTTP\r\n".to_vec(),
        b"PUT /x http/1.1\r\n".to_vec(),
        b"PUT /x\tHTTP/1.1\r\n".to_vec(),
        b"GET / HTTP/1.0 x\r\n".to_vec(),
        // A one-byte name is refused before the check.
        b"X HTTP/1.1\r\n".to_vec(),
        // Names memcached dispatches by their first letter, or as meta commands.
        b"gx / HTTP/1.1\r\n".to_vec(),
        b"delete_all HTTP/1.1\r\n".to_vec(),
        b"slabs HTTP/1.1\r\n".to_vec(),
        b"mx / HTTP/1.1\r\n".to_vec(),
        // Admin commands memcached runs (memroute answers ERROR, and reads on).
        b"lru HTTP/1.1\r\n".to_vec(),
        b"lru_crawler HTTP/1.1\r\n".to_vec(),
        b"watch HTTP/1.1\r\n".to_vec(),
        b"extstore HTTP/1.1\r\n".to_vec(),
        // The HTTP word past the 23 words memcached keeps, or before the last.
        words_then_http(30, "HTTP/1.1").into_bytes(),
        words_then_http(23, "HTTP/1.1").into_bytes(),
        words_then_http(21, "HTTP/1.1 x y").into_bytes(),
    ];
    for line in &answered {
        assert_eq!(
            err(line),
            (b"ERROR\r\n".to_vec(), 0, false),
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
    // Known commands whose arguments look like HTTP are parsed as themselves.
    assert_eq!(req(b"get / HTTP/1.0\r\n").keys().count(), 2);
    assert_eq!(req(b"version HTTP/1.1\r\n").command, Command::Version);
    assert_eq!(req(b"bget HTTP/1.1\r\n").command, Command::Get);
}

/// An `ms` memroute refuses as too large gets the error memcached finds first in its flags
/// (then the value stays): checked against memcached 1.6.18 with a 1 MiB + 1 value.
#[test]
fn a_too_large_ms_with_a_bad_flag_gets_the_flag_error() {
    let lim = Limits {
        max_value_len: 10,
        ..Limits::default()
    };
    let cases: [(&[u8], &str); 13] = [
        (b"ms foo 20 T1 Z\r\n", "invalid flag"),
        (b"ms foo 20 T1 T2\r\n", "duplicate flag"),
        (b"ms foo 20 Tx\r\n", "bad token in command line format"),
        (b"ms foo 20 Tx Cx\r\n", "bad token in command line format"),
        (b"ms foo 20 Cx Fx\r\n", "bad token in command line format"),
        (b"ms foo 20 Fx\r\n", "bad command line format"),
        (b"ms foo 20 Fx MZ\r\n", "bad command line format"),
        (b"ms foo 20 MXX\r\n", "incorrect length for M token"),
        (b"ms foo 20 MZ\r\n", "invalid mode for ms M token"),
        (b"ms foo 20 Jx Dx\r\n", "invalid numeric delta value"),
        (
            b"ms foo 20 O123456789012345678901234567890123\r\n",
            "opaque token too long",
        ),
        (
            b"ms foo 20 O123456789012345678901234567890123 MZ\r\n",
            "invalid mode for ms M token",
        ),
        (b"ms foo 20 b\r\n", "error decoding key"),
    ];
    for (line, message) in cases {
        let mut buf = BytesMut::from(line);
        assert_eq!(
            parse_request(&mut buf, &lim),
            Parse::Invalid {
                reply: ErrorReply::Client(message),
                swallow: 22,
                close: false
            },
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
    // Flags memcached accepts: too large, and the key goes.
    let (reply, swallow, ..) = too_large(b"ms foo 20 T1 I k O1 F5 C0 MS\r\n", &lim);
    assert_eq!((reply, swallow), (TOO_LARGE, 22));
    // Within the limit the flags are memcached's to judge: forwarded as they are.
    assert_eq!(req(b"ms foo 2 Z\r\nhi\r\n").command, Command::MetaSet);
}
