//! Fuzz target for `binary::parse_binary`, driven the way the binary session drives it.
//!
//! Input layout: byte 0 picks the value limit (default or tiny), bytes 1..3 pick up to two
//! split points, the rest is the client's byte stream. Fed in those chunks (partial reads)
//! and in one piece, both runs must frame the same requests and stop at the same error.
//! Invariants: `Incomplete` leaves the buffer untouched; a request consumes exactly its
//! header plus body; its parts add up to the body; no body over the limit is framed.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use memroute_protocol::binary::{
    parse_binary, BinaryError, BinaryParse, BinaryRequest, BODY_HEADROOM, HEADER_LEN,
};
use memroute_protocol::Limits;

#[derive(Debug, PartialEq, Eq)]
enum Event {
    Request(BinaryRequest),
    Invalid(BinaryError),
}

fn run(chunks: &[&[u8]], limits: &Limits) -> Vec<Event> {
    let mut events = Vec::new();
    let mut input = BytesMut::new();
    for chunk in chunks {
        input.extend_from_slice(chunk);
        loop {
            let before = Bytes::copy_from_slice(&input);
            match parse_binary(&mut input, limits) {
                BinaryParse::Incomplete => {
                    assert_eq!(&input[..], &before[..], "Incomplete changed the buffer");
                    break;
                }
                BinaryParse::Request(r) => {
                    let consumed = before.len() - input.len();
                    let body = r.extras.len() + r.key.len() + r.value.len();
                    assert_eq!(consumed, HEADER_LEN + body, "frame length");
                    assert!(body <= limits.max_value_len + BODY_HEADROOM);
                    assert_eq!(&before[HEADER_LEN..consumed], &[&r.extras[..], &r.key, &r.value].concat()[..]);
                    assert_eq!(before[1], r.opcode);
                    events.push(Event::Request(r));
                }
                BinaryParse::Invalid { error, .. } => {
                    assert_eq!(&input[..], &before[..], "Invalid changed the buffer");
                    events.push(Event::Invalid(error));
                    return events;
                }
            }
        }
    }
    events
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let limits = if data[0] & 1 == 0 {
        Limits::default()
    } else {
        Limits {
            max_value_len: usize::from(data[0] >> 1),
            ..Limits::default()
        }
    };
    let stream = &data[3..];
    let mut cuts: Vec<usize> = data[1..3]
        .iter()
        .map(|&b| usize::from(b) * stream.len() / 255)
        .collect();
    cuts.sort_unstable();
    let chunks = [&stream[..cuts[0]], &stream[cuts[0]..cuts[1]], &stream[cuts[1]..]];
    assert_eq!(run(&chunks, &limits), run(&[stream], &limits), "chunked and whole differ");
});
