//! Framing of binary-protocol requests: whole frames, partial frames, every malformed header.
use bytes::BytesMut;
use memroute_protocol::binary::{
    encode_error, opcode, parse_binary, BinaryError, BinaryParse, Status, BODY_HEADROOM,
};
use memroute_protocol::{decode_base64, encode_base64, Limits};

fn frame(op: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32, cas: u64) -> Vec<u8> {
    let mut f = vec![0x80, op];
    f.extend_from_slice(&(key.len() as u16).to_be_bytes());
    f.push(extras.len() as u8);
    f.extend_from_slice(&[0, 0, 0]);
    f.extend_from_slice(&((key.len() + extras.len() + value.len()) as u32).to_be_bytes());
    f.extend_from_slice(&opaque.to_be_bytes());
    f.extend_from_slice(&cas.to_be_bytes());
    f.extend_from_slice(extras);
    f.extend_from_slice(key);
    f.extend_from_slice(value);
    f
}

#[test]
fn a_set_frame_splits_into_extras_key_value() {
    let bytes = frame(
        opcode::SET,
        b"key",
        &[0, 0, 0, 5, 0, 0, 0, 9],
        b"value",
        42,
        7,
    );
    let mut buf = BytesMut::from(&bytes[..]);
    buf.extend_from_slice(b"\x80rest");
    let BinaryParse::Request(r) = parse_binary(&mut buf, &Limits::default()) else {
        panic!("not framed");
    };
    assert_eq!((r.opcode, r.opaque, r.cas), (opcode::SET, 42, 7));
    assert_eq!((&r.key[..], &r.value[..]), (&b"key"[..], &b"value"[..]));
    assert_eq!((r.extra_u32(0), r.extra_u32(4)), (Some(5), Some(9)));
    assert_eq!(&buf[..], b"\x80rest", "only the frame is consumed");
}

#[test]
fn every_prefix_of_a_frame_is_incomplete_and_untouched() {
    let bytes = frame(opcode::GETK, b"abc", b"", b"", 1, 0);
    for cut in 0..bytes.len() {
        let mut buf = BytesMut::from(&bytes[..cut]);
        assert_eq!(
            parse_binary(&mut buf, &Limits::default()),
            BinaryParse::Incomplete
        );
        assert_eq!(&buf[..], &bytes[..cut]);
    }
}

#[test]
fn malformed_headers_are_refused_once_extras_and_key_are_in() {
    let limits = Limits::default();
    let mut bad_magic = BytesMut::from(&b"\x81"[..]);
    assert!(matches!(
        parse_binary(&mut bad_magic, &limits),
        BinaryParse::Invalid {
            error: BinaryError::BadMagic,
            ..
        }
    ));

    let mut huge = frame(opcode::SET, b"k", &[0; 8], b"", 3, 0);
    let too_long = (limits.max_value_len + BODY_HEADROOM + 1) as u32;
    huge[8..12].copy_from_slice(&too_long.to_be_bytes());
    // The body's length is judged once extras and key are in, not before.
    let mut buf = BytesMut::from(&huge[..24 + 8]);
    assert_eq!(parse_binary(&mut buf, &limits), BinaryParse::Incomplete);
    let mut buf = BytesMut::from(&huge[..]);
    assert_eq!(
        parse_binary(&mut buf, &limits),
        BinaryParse::Invalid {
            error: BinaryError::BodyTooLarge,
            opcode: opcode::SET,
            opaque: 3,
            body_len: too_long as usize,
        }
    );

    // Key and extras longer than the body: memcached waits for them, then refuses.
    let mut lengths = frame(opcode::GET, b"abc", b"", b"", 4, 0);
    lengths[2..4].copy_from_slice(&100u16.to_be_bytes());
    let mut buf = BytesMut::from(&lengths[..]);
    assert_eq!(parse_binary(&mut buf, &limits), BinaryParse::Incomplete);
    buf.extend_from_slice(&[0; 97]);
    assert!(matches!(
        parse_binary(&mut buf, &limits),
        BinaryParse::Invalid {
            error: BinaryError::LengthsExceedBody,
            opaque: 4,
            ..
        }
    ));

    // A key over 250 bytes is refused before the body is looked at.
    let mut long_key = frame(opcode::SET, &[b'k'; 251], &[0; 8], b"", 5, 0);
    long_key[8..12].copy_from_slice(&too_long.to_be_bytes());
    let mut buf = BytesMut::from(&long_key[..]);
    assert!(matches!(
        parse_binary(&mut buf, &limits),
        BinaryParse::Invalid {
            error: BinaryError::KeyTooLong,
            opaque: 5,
            ..
        }
    ));
}

#[test]
fn error_responses_carry_memcacheds_text_and_the_opaque() {
    let mut out = BytesMut::new();
    encode_error(&mut out, opcode::ADD, Status::KeyExists, 0xdead_beef);
    assert_eq!(out[0], 0x81);
    assert_eq!(&out[6..8], &[0, 2]);
    assert_eq!(&out[12..16], &0xdead_beefu32.to_be_bytes());
    assert_eq!(&out[24..], b"Data exists for key.");
}

#[test]
fn base64_round_trips_binary_keys() {
    for key in [&b"a"[..], b"ab", b"abc", b"key with space", b"\n\r\0\xff"] {
        let mut encoded = BytesMut::new();
        encode_base64(key, &mut encoded);
        let mut decoded = [0u8; 64];
        let len = decode_base64(&encoded, &mut decoded).expect("valid base64");
        assert_eq!(&decoded[..len], key);
    }
}
