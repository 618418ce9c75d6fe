//! Fuzz target for `parse_request`, driven the way the proxy's client session drives it.
//!
//! Input layout: byte 0 picks the limits (default or tiny), bytes 1..4 pick up to three
//! split points, the rest is the client's byte stream. The stream is fed in those chunks
//! (emulating partial reads), parsing as far as possible after each one and honouring
//! `swallow`, exactly like `crates/proxy/src/session.rs`. The same stream is also parsed
//! in one piece, and both runs must agree. See docs/fuzzing.md for the invariants.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use memroute_protocol::{parse_request, Command, ErrorReply, Limits, Parse, Request};

/// What a run saw, Incomplete left out.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    Request(Request),
    Invalid { reply: ErrorReply, close: bool },
}

fn limits(selector: u8) -> Limits {
    if selector & 1 == 0 {
        Limits::default()
    } else {
        // Tiny limits, so that the limit paths are reached by short inputs.
        Limits {
            max_key_len: 1 + usize::from(selector >> 5),
            max_line_len: 8 + usize::from(selector >> 1 & 0x0f) * 8,
            max_value_len: usize::from(selector >> 3 & 0x07) * 4,
        }
    }
}

fn is_text_quiet_command(command: Command) -> bool {
    matches!(
        command,
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
            | Command::Verbosity
    )
}

fn is_meta_quiet_command(command: Command) -> bool {
    matches!(
        command,
        Command::MetaGet | Command::MetaSet | Command::MetaDelete | Command::MetaArithmetic
    )
}

/// Invariants of one framed request. `consumed` are the bytes removed from the input.
fn check_request(r: &Request, consumed: &[u8], limits: &Limits) {
    let frame = &r.frame[..];
    assert!(r.line_len >= 1, "empty command line");
    assert!(r.line_len <= frame.len(), "line_len past the frame");
    let line = &frame[..r.line_len];
    assert_eq!(
        line[line.len() - 1],
        b'\n',
        "command line without terminator"
    );
    let content = &line[..line.len() - 1];
    assert!(!content.contains(&b'\n'), "newline inside the command line");
    assert!(
        !content.contains(&0),
        "NUL inside the forwarded command line"
    );

    // The frame is the consumed bytes, or (NUL in the line) the line rebuilt before the
    // NUL followed by the same data block.
    let data = &frame[r.line_len..];
    assert!(
        consumed.ends_with(data),
        "data block differs from the input"
    );
    let original_line = &consumed[..consumed.len() - data.len()];
    if !original_line.contains(&0) {
        assert_eq!(frame, consumed, "frame differs from the consumed bytes");
    } else {
        let cut = original_line.iter().position(|&b| b == 0).unwrap_or(0);
        assert_eq!(&content[..content.len() - 1], &original_line[..cut]);
    }

    if r.command.has_data() {
        assert!(data.len() >= 2 && data.ends_with(b"\r\n"), "bad data block");
        assert!(
            data.len() - 2 <= limits.max_value_len,
            "value over the limit"
        );
    } else {
        assert!(data.is_empty(), "data block on a command without data");
    }

    for k in &r.keys {
        assert!(k.start < k.end, "empty key");
        assert!(k.end <= content.len(), "key outside the command line");
        assert!(k.end - k.start <= limits.max_key_len, "key over the limit");
        assert!(!frame[k.clone()].contains(&b' '), "space in a key");
    }
    if !r.command.is_keyed() {
        assert!(r.keys.is_empty(), "keys on a keyless command");
    } else if !r.command.is_multi_key() {
        assert_eq!(
            r.keys.len(),
            1,
            "single-key command without exactly one key"
        );
    }
    assert!(r.stats_arg.start <= r.stats_arg.end && r.stats_arg.end <= content.len());
    if r.command != Command::Stats {
        assert!(r.stats_arg.is_empty());
    }
    if r.command.is_multi_key() {
        // The head must end right before the first key.
        assert!(r.multi_key_head().len() <= content.len());
    }

    // The quiet token: present exactly when noreply, inside the line, " noreply" for
    // text commands or " q..." for meta commands.
    assert_eq!(
        r.noreply,
        r.quiet_token.is_some(),
        "noreply without a token"
    );
    if let Some(q) = &r.quiet_token {
        assert!(
            q.start < q.end && q.end <= content.len(),
            "quiet token outside"
        );
        // The space before the token is left in place after a word ending in `\r`.
        let token = &frame[q.clone()];
        let word = token.strip_prefix(b" ").unwrap_or(token);
        if word.len() == token.len() {
            assert!(q.start >= 2 && &frame[q.start - 2..q.start] == b"\r ");
        }
        if is_text_quiet_command(r.command) {
            assert_eq!(word, b"noreply");
        } else {
            assert!(
                is_meta_quiet_command(r.command),
                "quiet token on {:?}",
                r.command
            );
            assert!(word.first() == Some(&b'q'));
        }
        for k in &r.keys {
            assert!(
                k.end <= q.start || k.start >= q.end,
                "quiet token overlaps a key"
            );
        }
    }

    // What goes to the backend: the frame without the quiet token. It must parse back to
    // the same request, without noreply (so the backend sends every reply), and with the
    // same keys, data and arguments.
    let memroute_protocol::RequestBytes { head, tail } = r.forward_parts();
    let mut forwarded = BytesMut::new();
    forwarded.extend_from_slice(&head);
    if let Some(tail) = &tail {
        forwarded.extend_from_slice(tail);
    }
    let forwarded_bytes: Bytes = forwarded.clone().freeze();
    let fline_end = forwarded_bytes
        .iter()
        .position(|&b| b == b'\n')
        .expect("forwarded frame without newline");
    let fline = &forwarded_bytes[..fline_end];
    if let Some(q) = &r.quiet_token {
        // The token bytes are gone from the forwarded command line.
        let token = &frame[q.clone()];
        let words: Vec<&[u8]> = fline
            .split(|&b| b == b' ')
            .filter(|w| !w.is_empty())
            .collect();
        if is_text_quiet_command(r.command) {
            assert_ne!(
                words.last().copied(),
                Some(&b"noreply"[..]),
                "noreply forwarded"
            );
        } else {
            let flags = if r.command == Command::MetaSet { 3 } else { 2 };
            assert!(
                words.iter().skip(flags).all(|w| w[0] != b'q'),
                "q flag forwarded ({:?})",
                String::from_utf8_lossy(token)
            );
        }
    }
    let reparsed = match parse_request(&mut forwarded, limits) {
        Parse::Request(again) => again,
        other => panic!("forwarded frame does not parse: {other:?}"),
    };
    assert!(forwarded.is_empty(), "forwarded frame not consumed whole");
    assert_eq!(reparsed.command, r.command);
    assert!(
        !reparsed.noreply && reparsed.quiet_token.is_none(),
        "forwarded still quiet"
    );
    assert!(reparsed.keys().eq(r.keys()), "forwarded keys differ");
    assert_eq!(reparsed.base64_key, r.base64_key);
    assert_eq!(reparsed.arg, r.arg);
    assert_eq!(&reparsed.frame[reparsed.line_len..], data);
    if r.quiet_token.is_none() {
        assert_eq!(&reparsed, r, "frame does not parse back to itself");
    }
}

/// Runs the session loop over `chunks`; returns the events seen.
fn run(chunks: &[&[u8]], limits: &Limits) -> Vec<Event> {
    let mut events = Vec::new();
    let mut input = BytesMut::new();
    let mut swallow = 0usize;
    for chunk in chunks {
        input.extend_from_slice(chunk);
        loop {
            if swallow > 0 {
                let skip = swallow.min(input.len());
                let _ = input.split_to(skip);
                swallow -= skip;
                if swallow > 0 {
                    break;
                }
            }
            let before = Bytes::copy_from_slice(&input);
            let parsed = parse_request(&mut input, limits);
            let consumed = before.len() - input.len();
            match parsed {
                Parse::Incomplete => {
                    assert_eq!(&input[..], &before[..], "Incomplete changed the buffer");
                    break;
                }
                Parse::Request(r) => {
                    assert!(consumed > 0, "request consumed nothing");
                    assert_eq!(
                        &input[..],
                        &before[consumed..],
                        "rest of the buffer changed"
                    );
                    check_request(&r, &before[..consumed], limits);
                    events.push(Event::Request(r));
                }
                Parse::TooLarge(refused) => {
                    assert!(consumed > 0, "TooLarge consumed nothing");
                    // The unlink names the refused request's key, and is itself a request
                    // a backend can read: one `md` line.
                    assert_eq!(refused.unlink.command, Command::MetaDelete);
                    assert_eq!(refused.unlink.key(0), refused.refused.key(0));
                    assert!(refused.unlink.frame.ends_with(b"\r\n"));
                    assert!(!refused.unlink.frame[..refused.unlink.frame.len() - 1].contains(&b'\n'));
                    if refused.swallow > 0 {
                        assert!(input.is_empty(), "swallow with input still buffered");
                    }
                    swallow = refused.swallow;
                    events.push(Event::Invalid {
                        reply: refused.reply,
                        close: false,
                    });
                }
                Parse::Invalid {
                    reply,
                    swallow: rest,
                    close,
                } => {
                    assert!(consumed > 0, "Invalid consumed nothing");
                    let bytes = reply.to_bytes();
                    assert!(bytes.is_empty() || bytes.ends_with(b"\r\n"));
                    assert!(!bytes[..bytes.len().saturating_sub(2)].contains(&b'\n'));
                    events.push(Event::Invalid { reply, close });
                    if close {
                        assert!(input.is_empty(), "close left input behind");
                        return events;
                    }
                    assert_eq!(
                        &input[..],
                        &before[consumed..],
                        "rest of the buffer changed"
                    );
                    if rest > 0 {
                        // Swallowing more means everything buffered was already dropped.
                        assert!(input.is_empty(), "swallow with input still buffered");
                    }
                    swallow = rest;
                }
            }
        }
    }
    events
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let limits = limits(data[0]);
    let stream = &data[4..];
    let mut cuts: Vec<usize> = data[1..4]
        .iter()
        .map(|&b| usize::from(b) * stream.len() / 255)
        .collect();
    cuts.sort_unstable();
    let mut chunks = Vec::new();
    let mut start = 0;
    for cut in cuts {
        chunks.push(&stream[start..cut]);
        start = cut;
    }
    chunks.push(&stream[start..]);

    let chunked = run(&chunks, &limits);
    let whole = run(&[stream], &limits);
    // Framing does not depend on how the bytes arrived, up to the first close: memcached
    // (and so the proxy) closes a connection on 2048 bytes without a newline, which only
    // a partial read can show.
    for (a, b) in chunked.iter().zip(whole.iter()) {
        if matches!(a, Event::Invalid { close: true, .. })
            || matches!(b, Event::Invalid { close: true, .. })
        {
            return;
        }
        assert_eq!(a, b, "chunked and whole parses differ");
    }
    let (shorter, longer) = if chunked.len() < whole.len() {
        (&chunked, &whole)
    } else {
        (&whole, &chunked)
    };
    if shorter.len() != longer.len() {
        // The shorter run may only have stopped early at a close.
        assert!(
            matches!(shorter.last(), Some(Event::Invalid { close: true, .. }))
                || matches!(
                    longer.get(shorter.len()),
                    Some(Event::Invalid { close: true, .. })
                ),
            "chunked and whole parses differ in length"
        );
    }
});
