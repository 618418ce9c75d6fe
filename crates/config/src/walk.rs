//! Walking a `toml::Table` with key-path errors: the helpers every section's checks use
//! (raw.rs for the config's own sections, transport.rs for the transport settings), and
//! [`Errors`], where a walk collects every problem instead of stopping at the first.
//!
//! A getter returns the value, or the default when the key is absent; a value of the
//! wrong type or out of range is reported at its key path (`pools.main.timeout`) and the
//! default is returned too, so the walk goes on and finds the next problem.
use std::time::Duration;

use toml::{Table, Value};

use crate::{ConfigError, ErrorKind};

/// Every problem a walk has found so far, each at its key path.
#[derive(Debug, Default)]
pub(crate) struct Errors(pub(crate) Vec<ConfigError>);

impl Errors {
    pub(crate) fn push(&mut self, kind: ErrorKind, path: &str, message: impl Into<String>) {
        self.0.push(ConfigError::new(kind, path, message));
    }
}

/// Appends a key to a path, quoting keys that are not bare TOML keys so the path
/// reads back unambiguously (`routes.r.prefixes."user:"`).
pub(crate) fn join(parent: &str, key: &str) -> String {
    let key = toml_key(key);
    if parent.is_empty() {
        key
    } else {
        format!("{parent}.{key}")
    }
}

/// A key as TOML would need it written: bare when possible, else a quoted string.
pub(crate) fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        Value::String(key.to_string()).to_string()
    }
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a datetime",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

pub(crate) fn wrong_type(errs: &mut Errors, path: &str, expected: &str, found: &Value) {
    errs.push(
        ErrorKind::WrongType,
        path,
        format!("expected {expected}, found {}", type_name(found)),
    );
}

/// Reports every key of `table` not in `allowed`.
pub(crate) fn check_keys(table: &Table, path: &str, allowed: &[&str], errs: &mut Errors) {
    for key in table.keys() {
        if !allowed.contains(&key.as_str()) {
            errs.push(
                ErrorKind::UnknownKey,
                &join(path, key),
                format!("unknown key (expected one of: {})", allowed.join(", ")),
            );
        }
    }
}

/// A sub-table, or None (with an error when present but not a table).
pub(crate) fn get_table<'a>(
    table: &'a Table,
    key: &str,
    path: &str,
    errs: &mut Errors,
) -> Option<&'a Table> {
    match table.get(key)? {
        Value::Table(t) => Some(t),
        other => {
            wrong_type(errs, &join(path, key), "a table", other);
            None
        }
    }
}

pub(crate) fn get_str<'a>(
    table: &'a Table,
    key: &str,
    path: &str,
    errs: &mut Errors,
) -> Option<&'a str> {
    match table.get(key)? {
        Value::String(s) => Some(s),
        other => {
            wrong_type(errs, &join(path, key), "a string", other);
            None
        }
    }
}

/// An integer key within `min..=max`, or the default when absent. On error the
/// default is returned too, so checking continues and finds more problems.
pub(crate) fn get_int<T>(
    table: &Table,
    key: &str,
    path: &str,
    min: i64,
    max: u64,
    default: T,
    errs: &mut Errors,
) -> T
where
    T: TryFrom<i64> + Copy,
{
    let Some(v) = table.get(key) else {
        return default;
    };
    let p = join(path, key);
    let Value::Integer(n) = v else {
        wrong_type(errs, &p, "an integer", v);
        return default;
    };
    check_range(*n, min, max, &p, default, errs)
}

pub(crate) fn check_range<T>(
    n: i64,
    min: i64,
    max: u64,
    path: &str,
    default: T,
    errs: &mut Errors,
) -> T
where
    T: TryFrom<i64> + Copy,
{
    if n < min {
        let msg = match min {
            0 => "must be >= 0".to_string(),
            1 => "must be > 0".to_string(),
            _ => format!("must be at least {min}"),
        };
        errs.push(ErrorKind::OutOfRange, path, msg);
        return default;
    }
    if u64::try_from(n).map_or(true, |u| u > max) {
        errs.push(
            ErrorKind::OutOfRange,
            path,
            format!("must be at most {max}"),
        );
        return default;
    }
    match T::try_from(n) {
        Ok(v) => v,
        Err(_) => {
            errs.push(
                ErrorKind::OutOfRange,
                path,
                format!("must be at most {max}"),
            );
            default
        }
    }
}

/// The kind of a [`parse_duration`] or [`parse_size`] error `message` for value `v`: a
/// negative integer or a number too large is out of range, another string that does not
/// parse is invalid, anything else is the wrong type.
pub(crate) fn parse_error_kind(v: &Value, message: &str) -> ErrorKind {
    match v {
        Value::Integer(_) => ErrorKind::OutOfRange,
        Value::String(_) if message.ends_with("is too large") => ErrorKind::OutOfRange,
        Value::String(_) => ErrorKind::Invalid,
        _ => ErrorKind::WrongType,
    }
}

pub(crate) fn usize_max() -> u64 {
    u64::try_from(usize::MAX).unwrap_or(u64::MAX)
}

/// Parses a duration: an integer number of milliseconds, or a string `<int><unit>`
/// with unit `us`, `ms`, `s`, `m` or `h` (`"250ms"`, `"1s"`, `"2m"`).
pub fn parse_duration(v: &Value) -> Result<Duration, String> {
    let expected = "expected a duration such as \"250ms\", \"1s\", \"2m\" or an integer number of milliseconds";
    match v {
        Value::Integer(n) => u64::try_from(*n)
            .map(Duration::from_millis)
            .map_err(|_| "must be >= 0".to_string()),
        Value::String(s) => {
            let s = s.trim();
            let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let (digits, unit) = s.split_at(split);
            let n: u64 = digits
                .parse()
                .map_err(|_| format!("invalid duration \"{s}\" ({expected})"))?;
            let d = match unit.trim() {
                "us" => Some(Duration::from_micros(n)),
                "ms" => Some(Duration::from_millis(n)),
                "s" => Some(Duration::from_secs(n)),
                "m" => n.checked_mul(60).map(Duration::from_secs),
                "h" => n.checked_mul(3600).map(Duration::from_secs),
                _ => return Err(format!("invalid duration \"{s}\" ({expected})")),
            };
            d.ok_or_else(|| format!("duration \"{s}\" is too large"))
        }
        other => Err(format!("{expected}, found {}", type_name(other))),
    }
}

/// Parses a byte size: an integer number of bytes, or a string `<int><unit>` with unit
/// `B`, `KiB`, `MiB`, `GiB` (powers of 1024) or `KB`, `MB`, `GB` (powers of 1000).
pub fn parse_size(v: &Value) -> Result<u64, String> {
    let expected = "expected a size such as \"1MiB\", \"512KiB\" or an integer number of bytes";
    match v {
        Value::Integer(n) => u64::try_from(*n).map_err(|_| "must be >= 0".to_string()),
        Value::String(s) => {
            let s = s.trim();
            let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let (digits, unit) = s.split_at(split);
            let n: u64 = digits
                .parse()
                .map_err(|_| format!("invalid size \"{s}\" ({expected})"))?;
            let mult: u64 = match unit.trim() {
                "" | "B" => 1,
                "KiB" => 1 << 10,
                "MiB" => 1 << 20,
                "GiB" => 1 << 30,
                "KB" => 1_000,
                "MB" => 1_000_000,
                "GB" => 1_000_000_000,
                _ => return Err(format!("invalid size \"{s}\" ({expected})")),
            };
            n.checked_mul(mult)
                .ok_or_else(|| format!("size \"{s}\" is too large"))
        }
        other => Err(format!("{expected}, found {}", type_name(other))),
    }
}

pub(crate) fn get_size(
    t: &Table,
    key: &str,
    path: &str,
    min: usize,
    default: usize,
    errs: &mut Errors,
) -> usize {
    let Some(v) = t.get(key) else { return default };
    let p = join(path, key);
    match parse_size(v) {
        Ok(n) => match usize::try_from(n) {
            Ok(n) if n >= min => n,
            Ok(_) if min == 1 => {
                errs.push(ErrorKind::OutOfRange, &p, "must be > 0");
                default
            }
            Ok(_) => {
                errs.push(
                    ErrorKind::OutOfRange,
                    &p,
                    format!("must be at least {min} bytes"),
                );
                default
            }
            Err(_) => {
                errs.push(ErrorKind::OutOfRange, &p, "is too large");
                default
            }
        },
        Err(m) => {
            errs.push(parse_error_kind(v, &m), &p, m);
            default
        }
    }
}

pub(crate) fn get_duration(
    t: &Table,
    key: &str,
    path: &str,
    default: Duration,
    errs: &mut Errors,
) -> Duration {
    let Some(v) = t.get(key) else { return default };
    let p = join(path, key);
    match parse_duration(v) {
        Ok(d) if d.is_zero() => {
            errs.push(ErrorKind::OutOfRange, &p, "must be > 0");
            default
        }
        Ok(d) => d,
        Err(m) => {
            errs.push(parse_error_kind(v, &m), &p, m);
            default
        }
    }
}

/// `get_duration` for a setting where zero means "off".
pub(crate) fn get_duration_or_zero(
    t: &Table,
    key: &str,
    path: &str,
    default: Duration,
    errs: &mut Errors,
) -> Duration {
    let Some(v) = t.get(key) else { return default };
    parse_duration(v).unwrap_or_else(|m| {
        errs.push(parse_error_kind(v, &m), &join(path, key), m);
        default
    })
}

pub(crate) fn get_bool(t: &Table, key: &str, path: &str, default: bool, errs: &mut Errors) -> bool {
    match t.get(key) {
        None => default,
        Some(Value::Boolean(b)) => *b,
        Some(other) => {
            wrong_type(errs, &join(path, key), "true or false", other);
            default
        }
    }
}
