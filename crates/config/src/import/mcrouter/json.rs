//! mcrouter's JSON, as its config loader reads it: `//` and `/* */` comments anywhere
//! between tokens (folly's `json::stripComments`) and a trailing comma before `]` or `}`
//! (folly's `allow_trailing_comma`). Both are removed here, outside strings, and the rest
//! is read as plain JSON; a comment mark inside a string is part of the string.
use serde_json::Value;

/// Reads mcrouter's JSON; `Err` carries serde's message with line and column (of the text
/// as written: comments are blanked, not removed, so positions hold).
pub(super) fn parse(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str(&plain_json(text))
}

/// `text` with comments blanked (newlines kept) and trailing commas dropped.
fn plain_json(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    // Where in `out` the last comma outside a string is, while only blanks follow it.
    let mut pending_comma: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'"' => {
                pending_comma = None;
                let end = string_end(bytes, i);
                out.extend_from_slice(&bytes[i..end]);
                i = end;
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    out.push(b' ');
                    i += 1;
                }
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let close = text[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |at| i + 2 + at + 2);
                for &c in &bytes[i..close] {
                    out.push(if c == b'\n' { b'\n' } else { b' ' });
                }
                i = close;
                continue;
            }
            b',' => pending_comma = Some(out.len()),
            b']' | b'}' => {
                if let Some(at) = pending_comma.take() {
                    out[at] = b' ';
                }
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => pending_comma = None,
        }
        out.push(b);
        i += 1;
    }
    // Only ASCII bytes were replaced (by ASCII), so the text is still UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// The index just past the string starting at `start` (a `"`), escapes skipped.
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_trailing_commas_go_strings_stay() {
        let text = r#"{
  // a line comment
  "a": [1, 2, /* inline */ 3,],
  /* a block
     comment */
  "b": {"url": "http://x//y", "c": "/* not a comment */", "q": "\"//\"",},
}"#;
        let v = parse(text).expect("mcrouter's JSON");
        assert_eq!(v["a"], serde_json::json!([1, 2, 3]));
        assert_eq!(v["b"]["url"], "http://x//y");
        assert_eq!(v["b"]["c"], "/* not a comment */");
        assert_eq!(v["b"]["q"], "\"//\"");
    }

    #[test]
    fn errors_keep_the_position_of_the_text_as_written() {
        let error = parse("{\n /* two\n lines */\n \"a\": x\n}").expect_err("not JSON");
        assert_eq!(error.line(), 4);
    }

    #[test]
    fn odd_input_never_panics() {
        for text in ["", "/*", "\"", "//", ",]", "{\"a\":\"\\", "[1,,]", "é/*é*/"] {
            let _ = parse(text);
        }
    }
}
