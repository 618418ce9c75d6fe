//! Inputs found by the fuzz targets in `fuzz/` (see docs/fuzzing.md), kept as plain tests
//! so they run with `cargo test` and on stable.

use memroute_protocol::{value_block_at, value_blocks};

/// fuzz target `parse_reply` (walkers on unframed bytes): a `VALUE ` line with nothing
/// after the space and a bare `\n` made `value_block_at` slice `reply[6..5]` and panic.
/// Its contract is `None` for anything that is not a whole VALUE block.
#[test]
fn value_block_at_empty_value_line_with_bare_newline() {
    assert_eq!(value_block_at(b"VALUE \n", 0), None);
    assert_eq!(value_block_at(b"VALUE \nf", 0), None);
    assert_eq!(value_block_at(b"xxVALUE \n", 2), None);
    assert_eq!(value_blocks(b"VALUE \nfy\rN"), Ok(Vec::new()));
}

/// The bytes a request is forwarded as (`forward_parts`, joined).
fn forwarded(request: &memroute_protocol::Request) -> bytes::BytesMut {
    let memroute_protocol::RequestBytes { head, tail } = request.forward_parts();
    let mut out = bytes::BytesMut::from(&head[..]);
    if let Some(tail) = tail {
        out.extend_from_slice(&tail);
    }
    out
}

fn parse_one(input: &[u8]) -> memroute_protocol::Request {
    let mut buf = bytes::BytesMut::from(input);
    match memroute_protocol::parse_request(&mut buf, &memroute_protocol::Limits::default()) {
        memroute_protocol::Parse::Request(request) => request,
        other => panic!("{input:?}: {other:?}"),
    }
}

/// fuzz target `parse_request` (forwarded frame parses back to the same keys): a key ending
/// in `\r` followed by the quiet token as the last word of a line ended by a bare `\n`.
/// Dropping " q" / " noreply" put the key's `\r` right before the `\n`, where memcached strips
/// it as part of the terminator: the backend saw key "k" while the proxy had placed "k\r"
/// (here minimised to `mg \r q\n`, which the backend even refused as a line without a key).
#[test]
fn quiet_token_after_key_ending_in_cr() {
    for input in [
        &b"mg \r q\n"[..],
        b"mg k\r q\n",
        b"md k\r q\n",
        b"ms k\r 1 q\nx\r\n",
        b"delete k\r noreply\n",
        b"touch k\r 10 noreply\n",
        b"mg k\r  q\n",
        b"mg k\r q v\n",
        b"mg k\r q\r\n",
    ] {
        let request = parse_one(input);
        assert!(request.noreply, "{input:?}");
        let mut again = forwarded(&request);
        let sent = again.clone();
        let backend = match memroute_protocol::parse_request(
            &mut again,
            &memroute_protocol::Limits::default(),
        ) {
            memroute_protocol::Parse::Request(backend) => backend,
            other => panic!("{input:?} forwarded as {sent:?}: {other:?}"),
        };
        assert!(
            backend.keys().eq(request.keys()),
            "{input:?} forwarded as {sent:?}"
        );
        assert!(!backend.noreply, "{input:?} forwarded as {sent:?}");
    }
    // A token that does not follow a `\r` is still removed with its space.
    assert_eq!(&forwarded(&parse_one(b"mg k q\n"))[..], b"mg k\n");
    assert_eq!(
        &forwarded(&parse_one(b"delete k noreply\r\n"))[..],
        b"delete k\r\n"
    );
}

/// Session fuzzing (`memroute_proxy::fuzzing`, a backend answering garbage): `VALUE a 01`
/// was accepted as the one-line reply to `incr` and passed on, telling the client a data
/// block follows that never comes. A line announcing a data block is never a one-line
/// reply (nor a meta reply unless it is `VA <size>` with its block).
#[test]
fn a_value_line_is_not_a_one_line_reply() {
    use memroute_protocol::{parse_reply, Limits, ReplyKind};
    let limits = Limits::default();
    for line in [&b"VALUE a 01\r\n"[..], b"VALUE\r\n", b"VA 1 t\r\n"] {
        assert!(
            parse_reply(line, ReplyKind::Line, &limits).is_err(),
            "{line:?}"
        );
    }
    assert!(parse_reply(b"VALUE a 0 1\r\n", ReplyKind::MetaGet, &limits).is_err());
    // What a one-line reply may be is unchanged.
    for line in [
        &b"STORED\r\n"[..],
        b"12\r\n",
        b"SERVER_ERROR x\r\n",
        b"VERSION 1.6\r\n",
    ] {
        assert!(
            parse_reply(line, ReplyKind::Line, &limits).is_ok(),
            "{line:?}"
        );
    }
}

/// Session fuzzing, backend answering garbage: `VALUE a  \x05 1` (two spaces, flags not a
/// number) was framed and passed on; a client splitting on single spaces or parsing the flags
/// reads it differently. memcached writes single spaces and numbers only.
#[test]
fn a_value_header_memcached_would_not_write_is_a_bad_reply() {
    use memroute_protocol::{parse_reply, Limits, ReplyKind, ReplyParse};
    let limits = Limits::default();
    for reply in [
        &b"VALUE a  \x05 1\r\nx\r\nEND\r\n"[..],
        b"VALUE a x 1\r\nx\r\nEND\r\n",
        b"VALUE a 0  1\r\nx\r\nEND\r\n",
        b"VALUE a 0 1 c\r\nx\r\nEND\r\n",
        b"VALUE a 0 1 2 3\r\nx\r\nEND\r\n",
    ] {
        assert!(
            parse_reply(reply, ReplyKind::Retrieval, &limits).is_err(),
            "{reply:?}"
        );
    }
    for reply in [
        &b"VALUE a 0 1\r\nx\r\nEND\r\n"[..],
        b"VALUE a 7 1 99\r\nx\r\nEND\r\n",
    ] {
        assert_eq!(
            parse_reply(reply, ReplyKind::Retrieval, &limits),
            Ok(ReplyParse::Complete(reply.len()))
        );
    }
}
