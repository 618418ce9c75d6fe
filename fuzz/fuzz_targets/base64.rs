//! Fuzz target for `decode_base64`: never panics, and agrees with the reference below.
//!
//! Input layout: byte 0 is the size of the output buffer, the rest is the encoded text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memroute_protocol::decode_base64;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// RFC 4648 base64 with `=` padding, written the obvious way (a bit accumulator).
/// Like most decoders it ignores the unused low bits of the last symbol ("Zh==" is "f").
fn reference(encoded: &[u8]) -> Option<Vec<u8>> {
    if encoded.len() % 4 != 0 {
        return None;
    }
    let padding = encoded.iter().rev().take_while(|&&c| c == b'=').count();
    if padding > 2 {
        return None;
    }
    let body = &encoded[..encoded.len() - padding];
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0u32;
    for &c in body {
        let v = ALPHABET.iter().position(|&a| a == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&size, encoded)) = data.split_first() else {
        return;
    };
    let mut out = vec![0u8; usize::from(size)];
    let got = decode_base64(encoded, &mut out);
    match reference(encoded) {
        None => assert_eq!(got, None, "accepted invalid base64 {encoded:?}"),
        Some(plain) if plain.len() > out.len() => {
            assert_eq!(got, None, "decoded past the output buffer")
        }
        Some(plain) => {
            assert_eq!(got, Some(plain.len()), "refused valid base64 {encoded:?}");
            assert_eq!(&out[..plain.len()], &plain[..]);
        }
    }
});
