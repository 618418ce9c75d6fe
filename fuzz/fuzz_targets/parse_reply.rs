//! Fuzz target for `parse_reply` and the VALUE-block walkers used on framed replies.
//!
//! Input layout: byte 0 picks the limits (default or a tiny line limit), the rest is what
//! a backend sent. Every `ReplyKind` is tried on it. See docs/fuzzing.md.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memroute_protocol::{
    parse_reply, retrieval_error, value_block_at, value_blocks, Limits, ReplyKind, ReplyParse,
};

const KINDS: [ReplyKind; 4] = [
    ReplyKind::Retrieval,
    ReplyKind::Stats,
    ReplyKind::MetaGet,
    ReplyKind::Line,
];

/// Longest reply whose every prefix is re-parsed (quadratic, so bounded).
const PREFIX_CHECK_MAX: usize = 1024;

fn check_value_blocks(reply: &[u8]) {
    let n = reply.len();
    match value_blocks(reply) {
        Err(line) => {
            // A single error line: the whole framed reply.
            assert_eq!(line, 0..n, "error line is not the whole reply");
            assert_eq!(retrieval_error(reply), Some(0..n));
        }
        Ok(blocks) => {
            assert_eq!(retrieval_error(reply), None);
            // Blocks tile the reply from its start, and END\r\n follows the last one.
            let mut pos = 0;
            for b in &blocks {
                assert_eq!(b.block.start, pos, "blocks not contiguous");
                assert!(
                    b.block.start < b.block.end && b.block.end <= n,
                    "block out of bounds"
                );
                assert!(
                    b.block.start + 6 <= b.key.start
                        && b.key.start <= b.key.end
                        && b.key.end < b.block.end,
                    "key outside its block"
                );
                assert!(reply[b.block.start..].starts_with(b"VALUE "));
                assert!(reply[..b.block.end].ends_with(b"\r\n"));
                assert!(!reply[b.key.clone()].contains(&b' '));
                assert_eq!(value_block_at(reply, b.block.start).as_ref(), Some(b));
                pos = b.block.end;
            }
            assert_eq!(&reply[pos..], b"END\r\n", "blocks do not end at END");
            assert_eq!(value_block_at(reply, pos), None);
        }
    }
}

/// `value_block_at` at any position: no panic, and a block it returns is in bounds.
fn probe_value_block_at(reply: &[u8]) {
    let positions = reply.len() + 2;
    let step = (positions / 256).max(1);
    for pos in (0..positions).step_by(step) {
        if let Some(b) = value_block_at(reply, pos) {
            assert_eq!(b.block.start, pos);
            assert!(b.block.end <= reply.len(), "block past the end");
            assert!(b.key.start >= pos + 6 && b.key.start <= b.key.end && b.key.end <= b.block.end);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, reply)) = data.split_first() else {
        return;
    };
    let limits = if selector & 1 == 0 {
        Limits::default()
    } else {
        Limits {
            max_line_len: 4 + usize::from(selector >> 1),
            ..Limits::default()
        }
    };
    // The walkers document that anything which is not a whole VALUE block ends the walk:
    // they must not panic on unframed bytes either.
    let _ = value_blocks(reply);
    let _ = retrieval_error(reply);
    probe_value_block_at(reply);
    for kind in KINDS {
        let Ok(parsed) = parse_reply(reply, kind, &limits) else {
            continue;
        };
        let ReplyParse::Complete(n) = parsed else {
            continue;
        };
        assert!(
            n >= 2 && n <= reply.len(),
            "Complete({n}) of {} bytes",
            reply.len()
        );
        assert!(
            reply[..n].ends_with(b"\r\n"),
            "reply does not end with \\r\\n"
        );
        let framed = &reply[..n];
        // A complete reply does not depend on what follows it ...
        assert_eq!(
            parse_reply(framed, kind, &limits),
            Ok(ReplyParse::Complete(n))
        );
        // ... and none of its prefixes is complete or an error.
        if n <= PREFIX_CHECK_MAX {
            for p in 0..n {
                assert_eq!(
                    parse_reply(&reply[..p], kind, &limits),
                    Ok(ReplyParse::Incomplete),
                    "prefix {p} of a {n}-byte {kind:?} reply"
                );
            }
        }
        if kind == ReplyKind::Retrieval {
            check_value_blocks(framed);
            probe_value_block_at(framed);
        }
    }
});
