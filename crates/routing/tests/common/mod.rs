//! Shared by the golden-file tests.

/// Undoes the golden files' escaping: `\\` is a backslash, `\xNN` the byte NN, anything
/// else itself (mcrouter's files and memroute's own use the same rule).
pub fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'\\', Some(b'\\')) => {
                out.push(b'\\');
                i += 2;
            }
            (b'\\', Some(b'x')) => {
                let hex = std::str::from_utf8(&bytes[i + 2..i + 4]).expect("hex");
                out.push(u8::from_str_radix(hex, 16).expect("hex byte"));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}
