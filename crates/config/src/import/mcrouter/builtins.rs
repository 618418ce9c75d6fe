//! mcrouter's built-in JSONM macros (`mcrouter/lib/config/ConfigPreprocessor.cpp`), those
//! that compute a value from values: `@int(5)`, `{"type": "select", "dictionary": ...,
//! "key": ...}`, ... Their parameters are named as mcrouter names them, so the object form
//! and the call form (`@name(a,b)`, positional) bind the same way. The macros that expand
//! an argument only when needed (`if`, `and`, `or`, `select`, `import`) and the loops
//! (`transform`, `process`, `foreach`) are walked by the expansion (`macros`) itself, which
//! calls back here for the rest.
use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

use super::jsonm_hash;

/// The parameters of built-in macro `name`, in order (`?` marks an optional one); `None`
/// when it is not one the importer computes.
pub(super) fn params(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "int" | "double" | "str" | "bool" | "isArray" | "isBool" | "isInt" | "isDouble"
        | "isObject" | "isString" | "hash" => &["value"],
        "keys" | "values" | "empty" | "size" | "sort" => &["dictionary"],
        "merge" => &["params"],
        "select" => &["dictionary", "key", "default?"],
        "slice" => &["dictionary", "from", "to"],
        "split" => &["dictionary", "delim"],
        "range" => &["from", "to"],
        "contains" => &["dictionary", "key"],
        "weightedHash" => &["dictionary", "key"],
        "shuffle" => &["dictionary", "seed?"],
        "equals" | "less" | "and" | "or" | "add" | "sub" | "mul" | "div" | "mod" => &["A", "B"],
        "not" | "bitwiseNot" => &["A"],
        "bitwiseAnd" | "bitwiseOr" | "bitwiseXor" | "bitwiseLeftShift" | "bitwiseRightShift" => {
            &["A", "B"]
        }
        "fail" => &["msg"],
        "set" => &["dictionary", "key", "value"],
        "if" => &["condition", "is_true", "is_false"],
        "import" => &["path", "default?"],
        "define" => &["result"],
        "defined" => &["name"],
        "isLocalIp" => &["ip"],
        _ => return None,
    })
}

/// Built-in macro `name` over its (expanded) arguments, in `params` order (`Null` for an
/// optional one not given). `Err`: what mcrouter's preprocessor would reject it for.
/// (`defined` needs the names in scope: the expansion answers it.)
pub(super) fn compute(name: &str, args: &[Value]) -> Result<Value, String> {
    let arg = |i: usize| args.get(i).unwrap_or(&Value::Null);
    match name {
        "int" | "double" | "str" | "bool" => cast(name, arg(0)),
        "isArray" | "isBool" | "isInt" | "isDouble" | "isObject" | "isString" => {
            Ok(Value::Bool(is_type(name, arg(0))))
        }
        "keys" | "values" | "empty" | "size" | "sort" | "merge" | "set" => {
            whole(name, arg(0), arg(1), arg(2))
        }
        "slice" | "split" | "range" | "contains" => part(name, arg(0), arg(1), arg(2)),
        "equals" | "less" | "not" => logic(name, arg(0), arg(1)),
        "add" | "sub" | "mul" | "div" | "mod" => arithmetic(name, arg(0), arg(1)),
        "hash" | "weightedHash" | "shuffle" => hashed(name, arg(0), arg(1)),
        "bitwiseAnd" | "bitwiseOr" | "bitwiseXor" | "bitwiseLeftShift" | "bitwiseRightShift"
        | "bitwiseNot" => bitwise(name, arg(0), arg(1)),
        "isLocalIp" => Ok(Value::Bool(is_local_ip(arg(0)))),
        "define" => Ok(arg(0).clone()),
        "fail" => Err(format!("@fail: {}", text(arg(0)))),
        other => Err(format!(
            "@{other} is not a built-in macro the importer computes"
        )),
    }
}

/// `@int`, `@double`, `@str`, `@bool`.
fn cast(name: &str, a: &Value) -> Result<Value, String> {
    Ok(match name {
        "int" => Value::from(int(a).ok_or_else(|| format!("@int: {a} is not an integer"))?),
        "double" => match number(a) {
            Some(x) => Number::from_f64(x).map_or(Value::Null, Value::Number),
            None => return Err(format!("@double: {a} is not a number")),
        },
        "str" => match a {
            Value::String(_) | Value::Number(_) | Value::Bool(_) => Value::String(text(a)),
            other => return Err(format!("@str: {other} cannot be cast to a string")),
        },
        _ => Value::Bool(match a {
            Value::Bool(v) => *v,
            Value::Number(n) => n.as_f64() != Some(0.0),
            // folly's `to<bool>`, which mcrouter's `asBool` is for a string.
            Value::String(s) => match s.to_ascii_lowercase().as_str() {
                "1" | "true" | "t" | "yes" | "y" | "on" => true,
                "0" | "false" | "f" | "no" | "n" | "off" => false,
                _ => return Err(format!("@bool: \"{s}\" is not a boolean")),
            },
            other => return Err(format!("@bool: {other} is not a boolean")),
        }),
    })
}

/// `@isArray`, `@isBool`, ...
fn is_type(name: &str, a: &Value) -> bool {
    match name {
        "isArray" => a.is_array(),
        "isBool" => a.is_boolean(),
        "isInt" => a.is_i64() || a.is_u64(),
        "isDouble" => a.is_f64(),
        "isObject" => a.is_object(),
        _ => a.is_string(),
    }
}

/// The built-ins over a whole list or object: `@keys`, `@values`, `@empty`, `@size`,
/// `@sort`, `@merge`, `@set`.
fn whole(name: &str, a: &Value, b: &Value, c: &Value) -> Result<Value, String> {
    Ok(match (name, a) {
        ("keys", Value::Object(o)) => Value::Array(o.keys().cloned().map(Value::String).collect()),
        ("values", Value::Object(o)) => Value::Array(o.values().cloned().collect()),
        ("empty", _) => Value::Bool(size(a)? == 0),
        ("size", _) => Value::from(size(a)?),
        ("sort", Value::Array(items)) => {
            let mut items = items.clone();
            items.sort_by(order);
            Value::Array(items)
        }
        ("merge", _) => merge(a)?,
        ("set", Value::Object(o)) => {
            let Value::String(key) = b else {
                return Err(format!("@set: key {b} is not a string"));
            };
            let mut o = o.clone();
            o.insert(key.clone(), c.clone());
            Value::Object(o)
        }
        ("set", Value::Array(items)) => {
            let at = b.as_i64().and_then(|i| usize::try_from(i).ok());
            let Some(at) = at.filter(|&at| at < items.len()) else {
                return Err(format!(
                    "@set: key {b} is out of range [0..{})",
                    items.len()
                ));
            };
            let mut items = items.clone();
            items[at] = c.clone();
            Value::Array(items)
        }
        ("sort", other) => return Err(format!("@sort: {other} is not an array")),
        (_, other) => return Err(format!("@{name}: {other} is not an object")),
    })
}

/// The built-ins that take a part of a value: `@slice`, `@split`, `@range`, `@contains`.
fn part(name: &str, a: &Value, b: &Value, c: &Value) -> Result<Value, String> {
    Ok(match name {
        "slice" => slice(a, b, c)?,
        "split" => match (a, b) {
            // folly's split: an empty delimiter leaves the string whole.
            (Value::String(s), Value::String(delim)) if delim.is_empty() => {
                Value::Array(vec![Value::String(s.clone())])
            }
            (Value::String(s), Value::String(delim)) => Value::Array(
                s.split(delim.as_str())
                    .map(|p| Value::String(p.to_string()))
                    .collect(),
            ),
            _ => return Err("@split: expected a string and a delimiter".to_string()),
        },
        "range" => {
            let (Some(from), Some(to)) = (a.as_i64(), b.as_i64()) else {
                return Err("@range: from and to must be integers".to_string());
            };
            if to.saturating_sub(from) > 1_000_000 {
                return Err("@range: too long".to_string());
            }
            Value::Array((from..=to).map(Value::from).collect())
        }
        _ => Value::Bool(match (a, b) {
            (Value::Array(items), _) => items.iter().any(|item| equal(item, b)),
            (Value::Object(o), Value::String(key)) => o.contains_key(key),
            (Value::String(s), Value::String(part)) => s.contains(part.as_str()),
            (Value::Object(_) | Value::String(_), _) => {
                return Err(format!("@contains: the key {b} is not a string"))
            }
            (other, _) => {
                return Err(format!(
                    "@contains: {other} is not an array, object or string"
                ))
            }
        }),
    })
}

/// `@slice(dictionary, from, to)`, both ends inclusive: a list's items or a string's bytes
/// by index (clamped to the ends), an object's entries whose keys lie between `from` and
/// `to`.
fn slice(a: &Value, from: &Value, to: &Value) -> Result<Value, String> {
    if let Value::Object(o) = a {
        let (Value::String(from), Value::String(to)) = (from, to) else {
            return Err("@slice: from and to of an object must be strings".to_string());
        };
        let inside = o.iter().filter(|(k, _)| from <= *k && *k <= to);
        return Ok(Value::Object(
            inside.map(|(k, v)| (k.clone(), v.clone())).collect(),
        ));
    }
    let (Some(from), Some(to)) = (from.as_i64(), to.as_i64()) else {
        return Err("@slice: from and to must be integers".to_string());
    };
    let range = |len: usize| {
        let start = usize::try_from(from.max(0)).unwrap_or(usize::MAX);
        let end = usize::try_from(to.saturating_add(1).max(0))
            .unwrap_or(usize::MAX)
            .min(len);
        start..end.max(start)
    };
    match a {
        Value::Array(items) => Ok(Value::Array(
            items.get(range(items.len())).unwrap_or_default().to_vec(),
        )),
        Value::String(s) => {
            let bytes = s.as_bytes().get(range(s.len())).unwrap_or_default();
            Ok(Value::String(String::from_utf8_lossy(bytes).into_owned()))
        }
        other => Err(format!("@slice: {other} is not an array, object or string")),
    }
}

/// `@equals`, `@less`, `@and`, `@or`, `@not`.
fn logic(name: &str, a: &Value, b: &Value) -> Result<Value, String> {
    Ok(Value::Bool(match name {
        "equals" => equal(a, b),
        "less" if a.is_object() || b.is_object() => {
            return Err("@less: objects cannot be compared".to_string())
        }
        "less" => order(a, b) == Ordering::Less,
        _ => !truth(a)?,
    }))
}

/// `@bitwiseAnd`, ... over integers (JSON integers only, as mcrouter's `isInt`); a shift
/// is of the 64 bits unsigned, as mcrouter's.
fn bitwise(name: &str, a: &Value, b: &Value) -> Result<Value, String> {
    let integer = |v: &Value| {
        v.as_i64()
            .ok_or_else(|| format!("@{name}: {v} is not an integer"))
    };
    let x = integer(a)?;
    if name == "bitwiseNot" {
        return Ok(Value::from(!x));
    }
    let y = integer(b)?;
    let shift = |by: i64| u32::try_from(by).ok().filter(|&by| by < 64);
    let result = match name {
        "bitwiseAnd" => x & y,
        "bitwiseOr" => x | y,
        "bitwiseXor" => x ^ y,
        _ => {
            let Some(by) = shift(y) else {
                return Err(format!("@{name}: cannot shift by {y}"));
            };
            match name {
                "bitwiseLeftShift" => ((x as u64) << by) as i64,
                _ => ((x as u64) >> by) as i64,
            }
        }
    };
    Ok(Value::from(result))
}

/// `@hash`, `@weightedHash` and a seeded `@shuffle`, as mcrouter computes them
/// (`jsonm_hash`). A `@shuffle` without a seed is random in mcrouter (a new order each
/// start): the list is kept as written (the expansion notes it).
fn hashed(name: &str, a: &Value, b: &Value) -> Result<Value, String> {
    match name {
        "hash" => {
            let hash = match a {
                Value::Number(n) if n.is_i64() || n.is_u64() => {
                    jsonm_hash::twang_mix64(n.as_i64().unwrap_or_default() as u64)
                }
                Value::String(s) => jsonm_hash::spooky64(s),
                other => return Err(format!("@hash: cannot hash {other}")),
            };
            // folly's dynamic holds it as a signed 64-bit integer.
            Ok(Value::from(hash as i64))
        }
        "weightedHash" => weighted_hash(a, b),
        _ => {
            let Value::Array(items) = a else {
                return Err(format!("@shuffle: {a} is not an array"));
            };
            let mut items = items.clone();
            match b {
                Value::Null => {}
                Value::Number(n) if n.as_u64().is_some() => {
                    jsonm_hash::shuffle(&mut items, n.as_u64().unwrap_or_default() as u32)
                }
                other => {
                    return Err(format!(
                        "@shuffle: seed {other} is not a non-negative integer"
                    ))
                }
            }
            Ok(Value::Array(items))
        }
    }
}

/// `@weightedHash(dictionary, key)`: the name mcrouter's rendezvous hash picks for `key`.
fn weighted_hash(dictionary: &Value, key: &Value) -> Result<Value, String> {
    let Value::Object(choices) = dictionary else {
        return Err(format!("@weightedHash: {dictionary} is not an object"));
    };
    let mut weights = Vec::with_capacity(choices.len());
    for (name, weight) in choices {
        let Some(weight) = weight.as_f64() else {
            return Err(format!(
                "@weightedHash: {name}'s weight {weight} is not a number"
            ));
        };
        if weight < -0.01 {
            return Err(format!(
                "@weightedHash: {name}'s weight {weight} is negative"
            ));
        }
        weights.push((name.as_str(), weight.max(0.0)));
    }
    if weights.is_empty() {
        return Err("@weightedHash: the dictionary is empty".to_string());
    }
    let key = match key {
        Value::Number(n) if n.is_i64() || n.is_u64() => n.as_i64().unwrap_or_default() as u64,
        Value::String(s) => jsonm_hash::spooky64(s),
        other => {
            return Err(format!(
                "@weightedHash: key {other} is not a string or an integer"
            ))
        }
    };
    let chosen = jsonm_hash::rendezvous(&weights, key)?;
    Ok(Value::String(weights[chosen].0.to_string()))
}

/// `@isLocalIp(ip)`: mcrouter asks the host's interfaces. The importer runs elsewhere
/// (often not on the host that will run memroute) and reads no interfaces: it takes the
/// loopback addresses (`127.0.0.0/8`, `::1`) as local and every other address as not;
/// anything that is not an IP address is not local, as in mcrouter.
fn is_local_ip(ip: &Value) -> bool {
    match ip.as_str().map(str::parse::<std::net::IpAddr>) {
        Some(Ok(address)) => address.is_loopback(),
        _ => false,
    }
}

/// folly's `asInt`, which mcrouter's `@int` is: an integer, a double without a fraction, a
/// string of an integer, a boolean.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            let x = n.as_f64()?;
            (x.fract() == 0.0 && x.abs() < 9.2e18).then_some(x as i64)
        }),
        Value::String(s) => s.parse().ok(),
        Value::Bool(b) => Some(i64::from(*b)),
        _ => None,
    }
}

/// folly `dynamic`'s `==`, which `@equals` and `@contains` use: an integer equals the
/// double of its value.
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            x.as_f64() == y.as_f64()
        }
        _ => a == b,
    }
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A value as text: a string as it is, anything else as JSON.
pub(super) fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn truth(v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(*b),
        other => Err(format!("{other} is not a boolean")),
    }
}

/// mcrouter's order of values (folly `dynamic`'s `<`, which `@sort` and `@less` use):
/// numbers by value, strings by bytes, lists item by item; values of different kinds by
/// kind, null < list < boolean < number < object < string.
fn order(a: &Value, b: &Value) -> Ordering {
    let rank = |v: &Value| match v {
        Value::Null => 0,
        Value::Array(_) => 1,
        Value::Bool(_) => 2,
        Value::Number(_) => 3,
        Value::Object(_) => 4,
        Value::String(_) => 5,
    };
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => x
                .as_f64()
                .partial_cmp(&y.as_f64())
                .unwrap_or(Ordering::Equal),
        },
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            let first = x
                .iter()
                .zip(y)
                .map(|(x, y)| order(x, y))
                .find(|o| o.is_ne());
            first.unwrap_or_else(|| x.len().cmp(&y.len()))
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

fn size(v: &Value) -> Result<usize, String> {
    match v {
        Value::Array(items) => Ok(items.len()),
        Value::Object(o) => Ok(o.len()),
        Value::String(s) => Ok(s.len()),
        other => Err(format!("{other} has no size")),
    }
}

/// `@select(dictionary, key)`: an object's value of a string key, a list's item of an
/// integer index (a negative one counts from the end); `None` when there is none.
pub(super) fn select<'a>(dictionary: &'a Value, key: &Value) -> Result<Option<&'a Value>, String> {
    match (dictionary, key) {
        (Value::Object(o), Value::String(key)) => Ok(o.get(key)),
        (Value::Array(items), Value::Number(n)) if n.is_i64() => {
            let i = n.as_i64().unwrap_or_default();
            let i = if i < 0 { i + items.len() as i64 } else { i };
            Ok(usize::try_from(i).ok().and_then(|i| items.get(i)))
        }
        (Value::Object(_), _) => {
            Err("@select: the dictionary is an object, the key not a string".to_string())
        }
        (Value::Array(_), _) => {
            Err("@select: the dictionary is an array, the key not an integer".to_string())
        }
        (other, _) => Err(format!(
            "@select: the dictionary {other} is not an array or object"
        )),
    }
}

/// `@merge`: lists joined, objects merged (later keys win), strings concatenated.
fn merge(params: &Value) -> Result<Value, String> {
    let Value::Array(parts) = params else {
        return Err("@merge: params is not an array".to_string());
    };
    match parts.first() {
        None => Err("@merge: empty params".to_string()),
        Some(Value::Array(_)) => {
            let mut out = Vec::new();
            for part in parts {
                match part {
                    Value::Array(items) => out.extend(items.iter().cloned()),
                    other => return Err(format!("@merge: {other} is not an array")),
                }
            }
            Ok(Value::Array(out))
        }
        Some(Value::Object(_)) => {
            let mut out = Map::new();
            for part in parts {
                match part {
                    Value::Object(o) => out.extend(o.iter().map(|(k, v)| (k.clone(), v.clone()))),
                    other => return Err(format!("@merge: {other} is not an object")),
                }
            }
            Ok(Value::Object(out))
        }
        Some(Value::String(_)) => {
            let mut out = String::new();
            for part in parts {
                match part {
                    Value::String(s) => out.push_str(s),
                    other => return Err(format!("@merge: {other} is not a string")),
                }
            }
            Ok(Value::String(out))
        }
        Some(other) => Err(format!("@merge: {other} is not an array, object or string")),
    }
}

/// `@add`, `@sub`, `@mul`, `@div`, `@mod` of two integers (JSON integers, as mcrouter's
/// `isInt`: `@add(1,2)` is of two strings, an error there too).
fn arithmetic(op: &str, a: &Value, b: &Value) -> Result<Value, String> {
    let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) else {
        return Err(format!("@{op}: {a} and {b} must be integers"));
    };
    let result = match op {
        "add" => x.checked_add(y),
        "sub" => x.checked_sub(y),
        "mul" => x.checked_mul(y),
        "div" => x.checked_div(y),
        _ => x.checked_rem(y),
    };
    result
        .map(Value::from)
        .ok_or_else(|| format!("@{op}({x}, {y}): overflow or division by zero"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn value_macros_compute_as_mcrouters() {
        assert_eq!(compute("int", &[json!("12")]), Ok(json!(12)));
        assert_eq!(compute("str", &[json!(5)]), Ok(json!("5")));
        assert_eq!(
            compute("range", &[json!(1), json!(3)]),
            Ok(json!([1, 2, 3]))
        );
        assert_eq!(
            select(&json!(["x", "y"]), &json!(-1)),
            Ok(Some(&json!("y")))
        );
        assert_eq!(select(&json!({"a": 1}), &json!("b")), Ok(None));
        assert!(select(&json!(["x", "y"]), &json!("1")).is_err());
        assert_eq!(
            compute("merge", &[json!([[1], [2, 3]])]),
            Ok(json!([1, 2, 3]))
        );
        assert_eq!(
            compute("merge", &[json!([{"a": 1}, {"a": 2, "b": 3}])]),
            Ok(json!({"a": 2, "b": 3}))
        );
        assert_eq!(compute("merge", &[json!(["a", "b"])]), Ok(json!("ab")));
        assert_eq!(
            compute("equals", &[json!("x"), json!("x")]),
            Ok(json!(true))
        );
        assert_eq!(compute("add", &[json!(2), json!(3)]), Ok(json!(5)));
        assert!(compute("add", &[json!("2"), json!(3)]).is_err());
        assert!(compute("div", &[json!(1), json!(0)]).is_err());
        assert!(compute("fail", &[json!("no")]).is_err());
        assert_eq!(
            compute("keys", &[json!({"b": 1, "a": 2})]),
            Ok(json!(["a", "b"]))
        );
        assert_eq!(compute("bitwiseAnd", &[json!(6), json!(3)]), Ok(json!(2)));
        assert_eq!(compute("bitwiseXor", &[json!(6), json!(3)]), Ok(json!(5)));
        assert_eq!(compute("bitwiseNot", &[json!(0)]), Ok(json!(-1)));
        assert_eq!(
            compute("bitwiseLeftShift", &[json!(1), json!(63)]),
            Ok(json!(i64::MIN))
        );
        assert_eq!(
            compute("bitwiseRightShift", &[json!(-1), json!(60)]),
            Ok(json!(15))
        );
        assert!(compute("bitwiseOr", &[json!("1"), json!(2)]).is_err());
    }
}
