//! The text rules of mcrouter's JSONM strings, as its preprocessor reads them
//! (`mcrouter/lib/config/ConfigPreprocessor.cpp`): a backslash escapes the next character
//! anywhere in a string; a string that begins with `@` is a call, `@name` or
//! `@name(a,b,...)`, whose arguments are split at commas by `getCallParams`' rules
//! (`call_params`). Quotes mean nothing there: `@f("x,y")` has two arguments, `"x` and `y"`.
//! Only these functions know the syntax; the expansion (`macros`) gives them meaning.

/// The index of the first `c` (an ASCII character) not escaped by a backslash.
pub(super) fn find_unescaped(s: &str, c: u8) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if bytes[i] == c {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Copies `s` into `out` with its escapes undone, up to the first unescaped `stop`: its
/// index, or `None` when there is none (or `s` ends in a lone backslash, which is dropped),
/// as mcrouter's `unescapeUntil`.
pub(super) fn unescape_until(s: &str, out: &mut String, stop: char) -> Option<usize> {
    let mut chars = s.char_indices();
    while let Some((at, c)) = chars.next() {
        if c == '\\' {
            out.push(chars.next()?.1);
            continue;
        }
        if c == stop {
            return Some(at);
        }
        out.push(c);
    }
    None
}

/// `@name(args)` -> (`name`, `Some(args)`); `@name` -> (`name`, `None`). The name ends at
/// the first unescaped `(`, and a call with one must end in `)`.
pub(super) fn split_call(s: &str) -> Result<(&str, Option<&str>), String> {
    let body = s.strip_prefix('@').unwrap_or(s);
    match find_unescaped(body, b'(') {
        None => Ok((body, None)),
        Some(open) if body.len() > open + 1 && body.ends_with(')') => {
            Ok((&body[..open], Some(&body[open + 1..body.len() - 1])))
        }
        Some(_) => Err(format!("no closing bracket for call \"{s}\"")),
    }
}

/// A call's arguments, as mcrouter's `getCallParams` splits them: at the first unescaped
/// comma, unless an unescaped `(` comes before it, in which case the argument runs to its
/// matching `)` and on to the next comma; each trimmed (`trim`), escapes left in. `@f()` has
/// one argument, the empty string; `@f(a,)` two, the second empty.
pub(super) fn call_params(mut s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    loop {
        if s.is_empty() {
            out.push("");
            return Ok(out);
        }
        let Some(mut comma) = find_unescaped(s, b',') else {
            out.push(trim(s));
            return Ok(out);
        };
        if let Some(open) = find_unescaped(&s[..comma], b'(') {
            let close =
                matching_bracket(s, open).ok_or_else(|| format!("brackets do not match: {s}"))?;
            if close == s.len() - 1 {
                out.push(trim(s));
                return Ok(out);
            }
            comma = s[close + 1..]
                .find(',')
                .map(|at| close + 1 + at)
                .ok_or_else(|| format!("no comma after closing bracket: {s}"))?;
        }
        out.push(trim(&s[..comma]));
        s = &s[comma + 1..];
    }
}

/// The index of the `)` that closes the `(` at `open` (escaped brackets do not count).
fn matching_bracket(s: &str, open: usize) -> Option<usize> {
    let bytes = s.as_bytes();
    let (mut depth, mut i) = (0i64, open);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'(' => depth += 1,
            b')' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// C's `isspace`, which mcrouter's trim uses.
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// An argument without the blanks around it; a trailing blank escaped by a backslash
/// (`a\ `) stays, as mcrouter's `trim` keeps it.
fn trim(s: &str) -> &str {
    let mut s = s.trim_start_matches(|c: char| c.is_ascii() && is_space(c as u8));
    while let Some(&last) = s.as_bytes().last() {
        if !is_space(last) {
            break;
        }
        let before = &s.as_bytes()[..s.len() - 1];
        let slashes = before.iter().rev().take_while(|&&c| c == b'\\').count();
        if slashes > 0 {
            if slashes % 2 == 0 {
                s = &s[..s.len() - 1];
            }
            break;
        }
        s = &s[..s.len() - 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_split_as_mcrouters_get_call_params() {
        let split = |s| call_params(s).expect("splits");
        assert_eq!(split(""), [""]);
        assert_eq!(split("  "), [""]);
        assert_eq!(split("a\\ "), ["a\\ "]);
        assert_eq!(split("a,@b(c,d),e"), ["a", "@b(c,d)", "e"]);
        assert_eq!(split("@b(c,@d(e,f)) , g"), ["@b(c,@d(e,f))", "g"]);
        assert_eq!(split("@b(c,d)"), ["@b(c,d)"]);
        assert_eq!(split("\\a,"), ["\\a", ""]);
        assert_eq!(split("x\\,y,z"), ["x\\,y", "z"]);
        // Quotes are not special: the comma between them splits.
        assert_eq!(split("a,\"x,y\""), ["a", "\"x", "y\""]);
        assert!(call_params("@b(c,d").is_err());
        assert!(call_params("@b(c)d").is_ok());
        assert!(call_params("@b(c,d)e").is_err());
    }

    #[test]
    fn trim_keeps_an_escaped_trailing_blank() {
        assert_eq!(trim("  \\   \\\\ \\   "), "\\   \\\\ \\ ");
        assert_eq!(trim("\\\\\\ "), "\\\\\\ ");
        assert_eq!(trim("\\\\ "), "\\\\");
        assert_eq!(trim(" "), "");
    }

    #[test]
    fn calls_split_into_name_and_arguments() {
        assert_eq!(split_call("@a"), Ok(("a", None)));
        assert_eq!(split_call("@a()"), Ok(("a", Some(""))));
        assert_eq!(split_call("@\\(x"), Ok(("\\(x", None)));
        assert!(split_call("@a(b").is_err());
        assert!(split_call("@(").is_err());
    }
}
