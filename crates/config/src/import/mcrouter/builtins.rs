//! mcrouter's built-in JSONM macros (`mcrouter/lib/config/ConfigPreprocessor.cpp`), those
//! that compute a value from values: `@int(5)`, `{"type": "select", "dictionary": ...,
//! "key": ...}`, ... Their parameters are named as mcrouter names them, so the object form
//! and the call form (`@name(a,b)`, positional) bind the same way. The macros that expand
//! other JSON lazily (`if`, `import`, `transform`, `foreach`) are walked by the importer's
//! expansion itself, which calls back here for the rest.
use serde_json::{Map, Number, Value};

/// The parameters of built-in macro `name`, in order (`?` marks an optional one); `None`
/// when it is not one the importer computes.
pub(super) fn params(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "int" | "double" | "str" | "bool" | "isArray" | "isBool" | "isInt" | "isDouble"
        | "isObject" | "isString" => &["value"],
        "keys" | "values" | "empty" | "size" | "sort" => &["dictionary"],
        "merge" => &["params"],
        "select" => &["dictionary", "key", "default?"],
        "slice" => &["dictionary", "from", "to"],
        "split" => &["dictionary", "delim"],
        "range" => &["from", "to"],
        "contains" => &["dictionary", "key"],
        "equals" | "less" | "and" | "or" | "add" | "sub" | "mul" | "div" | "mod" => &["A", "B"],
        "not" => &["A"],
        "fail" => &["msg"],
        "set" => &["dictionary", "key", "value"],
        "if" => &["condition", "is_true", "is_false"],
        "import" => &["path", "default?"],
        _ => return None,
    })
}

/// Built-in macro `name` over its (expanded) arguments, in `params` order (`Null` for an
/// optional one not given). `Err`: what mcrouter's preprocessor would reject it for.
pub(super) fn compute(name: &str, args: &[Value]) -> Result<Value, String> {
    let arg = |i: usize| args.get(i).unwrap_or(&Value::Null);
    let (a, b) = (arg(0), arg(1));
    Ok(match name {
        "int" => Value::from(int(a).ok_or_else(|| format!("@int: {a} is not an integer"))?),
        "double" => match number(a) {
            Some(x) => Number::from_f64(x).map_or(Value::Null, Value::Number),
            None => return Err(format!("@double: {a} is not a number")),
        },
        "str" => Value::String(text(a)),
        "bool" => Value::Bool(match a {
            Value::Bool(v) => *v,
            Value::String(s) if s == "true" => true,
            Value::String(s) if s == "false" => false,
            other => return Err(format!("@bool: {other} is not a boolean")),
        }),
        "isArray" => Value::Bool(a.is_array()),
        "isBool" => Value::Bool(a.is_boolean()),
        "isInt" => Value::Bool(a.is_i64() || a.is_u64()),
        "isDouble" => Value::Bool(a.is_f64()),
        "isObject" => Value::Bool(a.is_object()),
        "isString" => Value::Bool(a.is_string()),
        "keys" => match a {
            Value::Object(o) => Value::Array(o.keys().cloned().map(Value::String).collect()),
            other => return Err(format!("@keys: {other} is not an object")),
        },
        "values" => match a {
            Value::Object(o) => Value::Array(o.values().cloned().collect()),
            other => return Err(format!("@values: {other} is not an object")),
        },
        "empty" => Value::Bool(size(a)? == 0),
        "size" => Value::from(size(a)?),
        "sort" => match a {
            Value::Array(items) => {
                let mut items = items.clone();
                items.sort_by_key(text);
                Value::Array(items)
            }
            other => return Err(format!("@sort: {other} is not an array")),
        },
        "merge" => merge(a)?,
        "select" => match (select(a, b), arg(2)) {
            (Some(v), _) => v.clone(),
            (None, Value::Null) => return Err(format!("@select: no {b} in the dictionary")),
            (None, default) => default.clone(),
        },
        "slice" => {
            let (from, to) = (
                int(b).unwrap_or(0).max(0) as usize,
                int(arg(2)).unwrap_or(0),
            );
            match a {
                Value::Array(items) => {
                    let to = (to.max(0) as usize).min(items.len().saturating_sub(1));
                    Value::Array(
                        items
                            .get(from..=to)
                            .map(<[Value]>::to_vec)
                            .unwrap_or_default(),
                    )
                }
                other => return Err(format!("@slice: {other} is not an array")),
            }
        }
        "split" => match (a, b) {
            (Value::String(s), Value::String(delim)) if !delim.is_empty() => Value::Array(
                s.split(delim.as_str())
                    .map(|p| Value::String(p.to_string()))
                    .collect(),
            ),
            _ => return Err("@split: expected a string and a delimiter".to_string()),
        },
        "range" => {
            let (from, to) = (int(a), int(b));
            let (Some(from), Some(to)) = (from, to) else {
                return Err("@range: from and to must be integers".to_string());
            };
            if to.saturating_sub(from) > 1_000_000 {
                return Err("@range: too long".to_string());
            }
            Value::Array((from..=to).map(Value::from).collect())
        }
        "contains" => Value::Bool(match a {
            Value::Array(items) => items.contains(b),
            Value::Object(o) => o.contains_key(&text(b)),
            Value::String(s) => s.contains(&text(b)),
            _ => false,
        }),
        "equals" => Value::Bool(a == b),
        "less" => Value::Bool(match (number(a), number(b)) {
            (Some(x), Some(y)) => x < y,
            _ => text(a) < text(b),
        }),
        "and" => Value::Bool(truth(a)? && truth(b)?),
        "or" => Value::Bool(truth(a)? || truth(b)?),
        "not" => Value::Bool(!truth(a)?),
        "add" | "sub" | "mul" | "div" | "mod" => arithmetic(name, a, b)?,
        "set" => match a {
            Value::Object(o) => {
                let mut o = o.clone();
                o.insert(text(b), arg(2).clone());
                Value::Object(o)
            }
            other => return Err(format!("@set: {other} is not an object")),
        },
        "fail" => return Err(format!("@fail: {}", text(a))),
        other => {
            return Err(format!(
                "@{other} is not a built-in macro the importer computes"
            ))
        }
    })
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|x| x as i64)),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(i64::from(*b)),
        _ => None,
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
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn truth(v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" => Ok(true),
        Value::String(s) if s == "false" => Ok(false),
        other => Err(format!("{other} is not a boolean")),
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

fn select<'a>(dictionary: &'a Value, key: &Value) -> Option<&'a Value> {
    match dictionary {
        Value::Array(items) => items.get(usize::try_from(int(key)?).ok()?),
        Value::Object(o) => o.get(&text(key)),
        _ => None,
    }
}

/// `@merge`: lists joined, objects merged (later keys win), strings concatenated.
fn merge(params: &Value) -> Result<Value, String> {
    let Value::Array(parts) = params else {
        return Err("@merge: params is not an array".to_string());
    };
    match parts.first() {
        None => Ok(Value::Array(Vec::new())),
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
        Some(_) => Ok(Value::String(parts.iter().map(text).collect())),
    }
}

fn arithmetic(op: &str, a: &Value, b: &Value) -> Result<Value, String> {
    let (Some(x), Some(y)) = (int(a), int(b)) else {
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
            compute("select", &[json!({"a": 1}), json!("b"), json!(7)]),
            Ok(json!(7))
        );
        assert_eq!(
            compute("select", &[json!(["x", "y"]), json!("1")]),
            Ok(json!("y"))
        );
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
        assert_eq!(compute("add", &[json!("2"), json!(3)]), Ok(json!(5)));
        assert!(compute("div", &[json!(1), json!(0)]).is_err());
        assert!(compute("fail", &[json!("no")]).is_err());
        assert_eq!(
            compute("keys", &[json!({"b": 1, "a": 2})]),
            Ok(json!(["a", "b"]))
        );
    }
}
