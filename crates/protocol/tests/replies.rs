//! parse_reply, value_blocks and quiet_suppresses.
use memroute_protocol::{
    parse_reply, quiet_suppresses, value_block_at, value_blocks, Command, Limits, ProtocolError,
    ReplyKind, ReplyParse, MAX_REPLY_VALUE_LEN,
};

fn frame(buf: &[u8], kind: ReplyKind) -> Result<ReplyParse, ProtocolError> {
    parse_reply(buf, kind, &Limits::default())
}

/// The error for a reply memcached would never send.
fn bad(what: &'static str) -> Result<ReplyParse, ProtocolError> {
    Err(ProtocolError::BadReply(what))
}

/// `reply` must frame as exactly its own length, be Incomplete at every shorter
/// cut, and ignore whatever follows it.
fn check_whole(reply: &[u8], kind: ReplyKind) {
    for cut in 0..reply.len() {
        assert_eq!(
            frame(&reply[..cut], kind),
            Ok(ReplyParse::Incomplete),
            "cut {cut} of {:?}",
            String::from_utf8_lossy(reply)
        );
    }
    assert_eq!(frame(reply, kind), Ok(ReplyParse::Complete(reply.len())));
    let mut more = reply.to_vec();
    more.extend_from_slice(b"VALUE x 0 1\r\ny\r\nEND\r\n");
    assert_eq!(frame(&more, kind), Ok(ReplyParse::Complete(reply.len())));
}

#[test]
fn retrieval_replies() {
    check_whole(b"END\r\n", ReplyKind::Retrieval);
    check_whole(b"VALUE a 0 1\r\nx\r\nEND\r\n", ReplyKind::Retrieval);
    check_whole(
        b"VALUE a 5 3 99\r\na\r\n\r\nVALUE b 0 0\r\n\r\nEND\r\n",
        ReplyKind::Retrieval,
    );
    check_whole(
        b"SERVER_ERROR out of memory writing get response\r\n",
        ReplyKind::Retrieval,
    );
    check_whole(
        b"CLIENT_ERROR bad command line format\r\n",
        ReplyKind::Retrieval,
    );
    check_whole(b"ERROR\r\n", ReplyKind::Retrieval);
}

#[test]
fn retrieval_garbage_is_an_error() {
    let bad = |reason| Err(ProtocolError::BadReply(reason));
    let retrieval = |reply: &[u8]| frame(reply, ReplyKind::Retrieval);
    assert_eq!(retrieval(b"STORED\r\n"), bad("expected VALUE or END"));
    assert_eq!(retrieval(b"VALUE a 0 x\r\n"), bad("bad data length"));
    assert_eq!(
        retrieval(b"VALUE a 0 1\r\nxyz\r\n"),
        bad("data block not terminated by \\r\\n")
    );
    assert_eq!(
        retrieval(b"VALUE a 0 1\r\nx\r\nbogus\r\n"),
        bad("expected VALUE or END")
    );
    assert_eq!(retrieval(b"END\n"), bad("line not terminated by \\r\\n"));
    let too_large = bad("value larger than memcached's item maximum");
    assert_eq!(retrieval(b"VALUE a 0 1073741825\r\n"), too_large);
    assert_eq!(frame(b"VA 99999999999\r\n", ReplyKind::MetaGet), too_large);
    let short = Limits {
        max_line_len: 8,
        ..Limits::default()
    };
    assert_eq!(
        parse_reply(b"VALUE aaaaaaaaaaa", ReplyKind::Retrieval, &short),
        bad("line too long")
    );
}

#[test]
fn stats_replies() {
    check_whole(b"STAT pid 1\r\nSTAT uptime 5\r\nEND\r\n", ReplyKind::Stats);
    check_whole(b"END\r\n", ReplyKind::Stats);
    check_whole(b"RESET\r\n", ReplyKind::Stats);
    check_whole(b"ERROR\r\n", ReplyKind::Stats);
    assert_eq!(
        frame(b"STORED\r\n", ReplyKind::Stats),
        Err(ProtocolError::BadReply("expected STAT or END"))
    );
}

#[test]
fn meta_get_replies() {
    check_whole(b"VA 3 f0 c5\r\nabc\r\n", ReplyKind::MetaGet);
    check_whole(b"VA 0\r\n\r\n", ReplyKind::MetaGet);
    check_whole(b"HD c5\r\n", ReplyKind::MetaGet);
    check_whole(b"EN\r\n", ReplyKind::MetaGet);
    check_whole(b"NF O1 kfoo\r\n", ReplyKind::MetaGet);
    check_whole(b"CLIENT_ERROR invalid flag\r\n", ReplyKind::MetaGet);
    assert_eq!(
        frame(b"VA x\r\n", ReplyKind::MetaGet),
        bad("bad data length")
    );
    assert_eq!(
        frame(b"VA 1\r\nxy\r\n", ReplyKind::MetaGet),
        bad("data block not terminated by \\r\\n")
    );
    assert_eq!(
        frame(b"va 1\r\n", ReplyKind::MetaGet),
        bad("unexpected meta reply")
    );
}

#[test]
fn line_replies() {
    for r in [
        &b"STORED\r\n"[..],
        b"NOT_FOUND\r\n",
        b"42\r\n",
        b"VERSION 1.6.18\r\n",
        b"HD\r\n",
        b"MN\r\n",
        b"ME a exp=-1\r\n",
        b"OK\r\n",
    ] {
        check_whole(r, ReplyKind::Line);
    }
    assert_eq!(
        frame(b"\r\n", ReplyKind::Line),
        bad("unexpected reply line")
    );
    assert_eq!(
        frame(b"stored\r\n", ReplyKind::Line),
        bad("unexpected reply line")
    );
}

#[test]
fn value_blocks_in_order() {
    let reply = b"VALUE a 0 1\r\nx\r\nVALUE bb 7 2 12\r\nyz\r\nEND\r\n";
    let blocks = value_blocks(reply).expect("blocks");
    assert_eq!(blocks.len(), 2);
    assert_eq!(&reply[blocks[0].key.clone()], b"a");
    assert_eq!(&reply[blocks[0].block.clone()], b"VALUE a 0 1\r\nx\r\n");
    assert_eq!(&reply[blocks[1].key.clone()], b"bb");
    assert_eq!(
        &reply[blocks[1].block.clone()],
        b"VALUE bb 7 2 12\r\nyz\r\n"
    );
    assert_eq!(value_blocks(b"END\r\n"), Ok(vec![]));
    let err = b"SERVER_ERROR out of memory\r\n";
    assert_eq!(value_blocks(err), Err(0..err.len()));
    // A data block containing "\r\nEND\r\n" is data, not the end.
    let tricky = b"VALUE a 0 7\r\n\r\nEND\r\n\r\nEND\r\n";
    assert_eq!(
        frame(tricky, ReplyKind::Retrieval),
        Ok(ReplyParse::Complete(tricky.len()))
    );
    assert_eq!(value_blocks(tricky).expect("blocks").len(), 1);
}

#[test]
fn quiet_suppression_matches_memcached_1_6_18() {
    // Text noreply: memcached sends nothing at all, errors included.
    for line in [
        &b"STORED"[..],
        b"NOT_STORED",
        b"EXISTS",
        b"NOT_FOUND",
        b"CLIENT_ERROR bad data chunk",
    ] {
        assert!(quiet_suppresses(Command::Set, line));
    }
    assert!(quiet_suppresses(Command::Delete, b"DELETED"));
    assert!(quiet_suppresses(Command::Incr, b"42"));
    assert!(quiet_suppresses(Command::Touch, b"TOUCHED"));
    assert!(quiet_suppresses(Command::FlushAll, b"OK"));
    // Meta q, as observed: mg hides EN only; ms/md hide HD only; ma hides HD and VA.
    assert!(quiet_suppresses(Command::MetaGet, b"EN"));
    assert!(quiet_suppresses(Command::MetaGet, b"EN O1 kfoo"));
    assert!(!quiet_suppresses(Command::MetaGet, b"VA 1 c5"));
    assert!(!quiet_suppresses(Command::MetaGet, b"HD"));
    assert!(quiet_suppresses(Command::MetaSet, b"HD c7"));
    assert!(!quiet_suppresses(Command::MetaSet, b"NS"));
    assert!(!quiet_suppresses(
        Command::MetaSet,
        b"CLIENT_ERROR bad data chunk"
    ));
    assert!(quiet_suppresses(Command::MetaDelete, b"HD"));
    assert!(!quiet_suppresses(Command::MetaDelete, b"NF"));
    assert!(quiet_suppresses(Command::MetaArithmetic, b"HD"));
    assert!(quiet_suppresses(Command::MetaArithmetic, b"VA 1"));
    assert!(!quiet_suppresses(Command::MetaArithmetic, b"NF"));
    assert!(!quiet_suppresses(Command::MetaNoop, b"MN"));
    assert!(!quiet_suppresses(Command::Get, b"END"));
}

/// Values larger than the client-side `max_value_len` (a backend with a bigger `-I`, or a
/// value grown by append) are still framed: refusing them would reset the backend
/// connection on every get of such a key.
#[test]
fn reply_values_are_framed_beyond_the_client_value_limit() {
    let small = Limits {
        max_value_len: 4,
        ..Limits::default()
    };
    let reply = b"VALUE a 0 5\r\nhello\r\nEND\r\n";
    assert_eq!(
        parse_reply(reply, ReplyKind::Retrieval, &small),
        Ok(ReplyParse::Complete(reply.len()))
    );
    assert_eq!(
        parse_reply(&reply[..20], ReplyKind::Retrieval, &small),
        Ok(ReplyParse::Incomplete)
    );
    let va = b"VA 5 f0\r\nhello\r\n";
    assert_eq!(
        parse_reply(va, ReplyKind::MetaGet, &small),
        Ok(ReplyParse::Complete(va.len()))
    );

    // Default limits (1 MiB) and a 2 MiB value, as from memcached -I 2m.
    let big = vec![b'x'; 2 * 1024 * 1024];
    let mut reply = b"VALUE big 0 2097152\r\n".to_vec();
    reply.extend_from_slice(&big);
    reply.extend_from_slice(b"\r\nEND\r\n");
    check_whole_prefixes(&reply, ReplyKind::Retrieval);
    assert_eq!(value_blocks(&reply).map(|b| b.len()), Ok(1));
    let block = value_block_at(&reply, 0).expect("value block");
    assert_eq!(block.block.end, reply.len() - 5);

    // The header alone of a value at the sanity bound waits for its data; one byte more
    // is garbage.
    let at_max = format!("VALUE a 0 {MAX_REPLY_VALUE_LEN}\r\n");
    assert_eq!(
        frame(at_max.as_bytes(), ReplyKind::Retrieval),
        Ok(ReplyParse::Incomplete)
    );
    let over = format!("VALUE a 0 {}\r\n", MAX_REPLY_VALUE_LEN + 1);
    assert_eq!(
        frame(over.as_bytes(), ReplyKind::Retrieval),
        bad("value larger than memcached's item maximum")
    );
    let over = format!("VA {} v\r\n", MAX_REPLY_VALUE_LEN + 1);
    assert_eq!(
        frame(over.as_bytes(), ReplyKind::MetaGet),
        bad("value larger than memcached's item maximum")
    );
}

/// Like `check_whole` but only at a few cuts (the reply is large).
fn check_whole_prefixes(reply: &[u8], kind: ReplyKind) {
    for cut in [0, 10, 21, 22, 1000, reply.len() - 6, reply.len() - 1] {
        assert_eq!(
            frame(&reply[..cut], kind),
            Ok(ReplyParse::Incomplete),
            "cut {cut}"
        );
    }
    assert_eq!(frame(reply, kind), Ok(ReplyParse::Complete(reply.len())));
}
