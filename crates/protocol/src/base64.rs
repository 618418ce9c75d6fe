//! Base64 keys (meta protocol `b` flag): decoded, so a key is placed by its bytes whether
//! a client sends it raw or encoded; encoded, for keys the proxy itself sends in meta
//! commands that a text line cannot carry raw.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Appends `bytes` in standard base64 (RFC 4648, `+/`, `=` padding) to `out`.
pub fn encode_base64<B: bytes::BufMut>(bytes: &[u8], out: &mut B) {
    for chunk in bytes.chunks(3) {
        let mut quad = [0u8; 3];
        quad[..chunk.len()].copy_from_slice(chunk);
        let value = u32::from_be_bytes([0, quad[0], quad[1], quad[2]]);
        let mut symbols = [b'='; 4];
        for (index, symbol) in symbols.iter_mut().enumerate().take(chunk.len() + 1) {
            *symbol = ALPHABET[(value >> (18 - 6 * index)) as usize & 63];
        }
        out.put_slice(&symbols);
    }
}

/// Decodes standard base64 (RFC 4648, `+/`, `=` padding) into `out`; returns the decoded
/// length, or `None` when `encoded` is not valid base64 or does not fit in `out`.
pub fn decode_base64(encoded: &[u8], out: &mut [u8]) -> Option<usize> {
    if !encoded.len().is_multiple_of(4) {
        return None;
    }
    let mut written = 0;
    for (index, chunk) in encoded.chunks_exact(4).enumerate() {
        let last = index + 1 == encoded.len() / 4;
        let padding = match chunk {
            [_, _, b'=', b'='] if last => 2,
            [_, _, _, b'='] if last => 1,
            _ => 0,
        };
        let mut quad = 0u32;
        for &symbol in &chunk[..4 - padding] {
            quad = (quad << 6) | u32::from(sextet(symbol)?);
        }
        quad <<= 6 * padding as u32;
        let bytes = quad.to_be_bytes();
        let produced = 3 - padding;
        out.get_mut(written..written + produced)?
            .copy_from_slice(&bytes[1..1 + produced]);
        written += produced;
    }
    Some(written)
}

fn sextet(symbol: u8) -> Option<u8> {
    match symbol {
        b'A'..=b'Z' => Some(symbol - b'A'),
        b'a'..=b'z' => Some(symbol - b'a' + 26),
        b'0'..=b'9' => Some(symbol - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::decode_base64;

    fn decode(s: &str) -> Option<Vec<u8>> {
        let mut out = [0u8; 64];
        decode_base64(s.as_bytes(), &mut out).map(|n| out[..n].to_vec())
    }

    #[test]
    fn rfc4648_vectors() {
        for (encoded, plain) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(
                decode(encoded).as_deref(),
                Some(plain.as_bytes()),
                "{encoded}"
            );
        }
    }

    #[test]
    fn invalid_input_is_refused() {
        for bad in ["Zg=", "Z===", "Zg==Zg==", "Zm9*", "====", "Zm\r\n"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
        let mut small = [0u8; 2];
        assert_eq!(decode_base64(b"Zm9v", &mut small), None);
    }

    #[test]
    fn encoding_round_trips() {
        for input in [&b""[..], b"a", b"ab", b"abc", b"abcd", b"k e\x00y\xff"] {
            let mut encoded = Vec::new();
            super::encode_base64(input, &mut encoded);
            let mut out = [0u8; 16];
            let len = super::decode_base64(&encoded, &mut out).expect("valid");
            assert_eq!(&out[..len], input);
        }
        let mut encoded = Vec::new();
        super::encode_base64(b"foo", &mut encoded);
        assert_eq!(encoded, b"Zm9v");
    }
}
