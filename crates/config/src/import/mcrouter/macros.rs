//! JSONM macros: `macros` (`macroDef`, `constDef`) expanded in place, mcrouter's built-ins
//! (`builtins`) computed, `@import` read beside the config, `transform` / `foreach` walked.
use super::*;

impl Importer {
    /// Expands `macros` defined with `macroDef` where they are plain substitution:
    /// `{"type": "name", "param": value}` and `"@name(a,b)"` calls, `%param%` in the body.
    /// mcrouter's built-in macros compute (`@if`, `@merge`, `@int`, ...): those are errors.
    pub(super) fn expand_macros(&mut self, top: Map<String, Value>) -> Map<String, Value> {
        // `--config-params` are constants everywhere in the file, macros included.
        let params: HashMap<String, Value> = self
            .flags
            .config_params
            .iter()
            .map(|(name, value)| (name.clone(), Value::String(value.clone())))
            .collect();
        let mut top = match params.is_empty() {
            true => top,
            false => match substitute(Value::Object(top), &params) {
                Value::Object(top) => top,
                _ => Map::new(),
            },
        };
        let mut macros = Macros::new();
        if let Some(defs) = top.remove("macros") {
            let Value::Object(defs) = defs else {
                self.error(
                    ErrorKind::WrongType,
                    "macros",
                    "expected an object of macro definitions",
                );
                return top;
            };
            for (name, def) in defs {
                let path = join("macros", &name);
                let Some(def) = def.as_object() else {
                    self.error(
                        ErrorKind::WrongType,
                        &path,
                        "expected a macro definition object",
                    );
                    continue;
                };
                match def.get("type").and_then(Value::as_str) {
                    Some("macroDef") | Some("constDef") => {}
                    other => {
                        self.error(
                            ErrorKind::Invalid,
                            &join(&path, "type"),
                            format!(
                                "expected \"macroDef\" or \"constDef\", found {}",
                                other.map_or("nothing".to_string(), |s| format!("\"{s}\""))
                            ),
                        );
                        continue;
                    }
                }
                let mut params = Vec::new();
                for (i, p) in def
                    .get("params")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    match p {
                        Value::String(s) => params.push((s.clone(), None)),
                        Value::Object(o) => match o.get("name").and_then(Value::as_str) {
                            Some(n) => params.push((n.to_string(), o.get("default").cloned())),
                            None => self.error(
                                ErrorKind::Missing,
                                &index(&join(&path, "params"), i),
                                "a parameter needs a \"name\"",
                            ),
                        },
                        _ => self.error(
                            ErrorKind::WrongType,
                            &index(&join(&path, "params"), i),
                            "expected a parameter name or {\"name\": ..., \"default\": ...}",
                        ),
                    }
                }
                let Some(result) = def.get("result") else {
                    self.error(ErrorKind::Missing, &path, "a macro needs a \"result\"");
                    continue;
                };
                macros.insert(name, (params, result.clone()));
            }
        }
        if !macros.is_empty() {
            self.notes.push(format!(
                "macros ({}) were expanded in place.",
                sorted_keys(macros.keys())
            ));
        }
        // Walked even without definitions: a call to a built-in macro is an error.
        let mut out = Map::new();
        for (key, value) in top {
            let expanded = self.expand(value, &macros, &key, 0);
            out.insert(key, expanded);
        }
        out
    }

    pub(super) fn expand(
        &mut self,
        value: Value,
        macros: &Macros,
        path: &str,
        depth: usize,
    ) -> Value {
        if depth > MAX_MACRO_DEPTH {
            self.error(
                ErrorKind::Circle,
                path,
                "macro expansion too deep (a macro that calls itself?)",
            );
            return Value::Null;
        }
        match value {
            Value::String(s) if s.starts_with('@') => {
                let Some((name, args)) = parse_call(&s) else {
                    self.error(
                        ErrorKind::Invalid,
                        path,
                        format!("cannot read macro call \"{s}\""),
                    );
                    return Value::Null;
                };
                let Some((params, body)) = macros.get(name) else {
                    if let Some(names) = builtins::params(name) {
                        let mut call = Map::new();
                        for (param, arg) in names.iter().zip(&args) {
                            let param = param.trim_end_matches('?');
                            call.insert(param.to_string(), Value::String(arg.to_string()));
                        }
                        return self.builtin(name, call, macros, path, depth);
                    }
                    self.error(ErrorKind::Invalid,
                        path,
                        format!(
                            "macro \"@{name}\" is neither defined in \"macros\" nor one of mcrouter's built-ins the importer computes; write its result out"
                        ),
                    );
                    return Value::Null;
                };
                let mut bound = HashMap::new();
                for (i, (param, default)) in params.iter().enumerate() {
                    match args
                        .get(i)
                        .map(|a| Value::String(a.to_string()))
                        .or_else(|| default.clone())
                    {
                        Some(v) => {
                            bound.insert(param.clone(), v);
                        }
                        None => self.error(
                            ErrorKind::Missing,
                            path,
                            format!("macro \"@{name}\": no value for parameter \"{param}\""),
                        ),
                    }
                }
                let body = substitute(body.clone(), &bound);
                self.expand(body, macros, path, depth + 1)
            }
            Value::Object(o) => {
                if let Some((params, body)) = o
                    .get("type")
                    .and_then(Value::as_str)
                    .and_then(|t| macros.get(t))
                {
                    let mut bound = HashMap::new();
                    for (param, default) in params {
                        match o.get(param).cloned().or_else(|| default.clone()) {
                            Some(v) => {
                                let v = self.expand(v, macros, &join(path, param), depth + 1);
                                bound.insert(param.clone(), v);
                            }
                            None => self.error(
                                ErrorKind::Missing,
                                path,
                                format!("macro call: no value for parameter \"{param}\""),
                            ),
                        }
                    }
                    let body = substitute(body.clone(), &bound);
                    return self.expand(body, macros, path, depth + 1);
                }
                if let Some(kind) = o.get("type").and_then(Value::as_str).map(str::to_string) {
                    if builtins::params(&kind).is_some() {
                        return self.builtin(&kind, o, macros, path, depth);
                    }
                    if kind == "transform" || kind == "foreach" {
                        return self.for_each(&kind, o, macros, path, depth);
                    }
                }
                let mut out = Map::new();
                for (k, v) in o {
                    let child = join(path, &k);
                    let v = self.expand(v, macros, &child, depth);
                    out.insert(k, v);
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| self.expand(v, macros, &index(path, i), depth))
                    .collect(),
            ),
            other => other,
        }
    }

    /// Built-in macro `name` with its arguments by parameter name (`call`): `if` expands
    /// only the branch its condition takes, `import` reads a file beside the config; the
    /// others compute from their expanded arguments (`builtins::compute`).
    pub(super) fn builtin(
        &mut self,
        name: &str,
        mut call: Map<String, Value>,
        macros: &Macros,
        path: &str,
        depth: usize,
    ) -> Value {
        let mut arg = |me: &mut Self, param: &str| {
            call.remove(param)
                .map(|v| me.expand(v, macros, &join(path, param), depth + 1))
        };
        match name {
            "if" => {
                let condition = arg(self, "condition");
                let branch = match condition {
                    Some(Value::Bool(true)) => "is_true",
                    Some(Value::Bool(false)) => "is_false",
                    other => {
                        let found = other.map_or("nothing".to_string(), |v| compact(&v));
                        self.error(
                            ErrorKind::Invalid,
                            &join(path, "condition"),
                            format!("@if: the condition is {found}, not a boolean"),
                        );
                        return Value::Null;
                    }
                };
                arg(self, branch).unwrap_or(Value::Null)
            }
            "import" => {
                let file = arg(self, "path");
                let default = call.remove("default");
                self.import_macro(file, default, macros, path, depth)
            }
            _ => {
                let names = builtins::params(name).unwrap_or_default();
                let mut args = Vec::with_capacity(names.len());
                for param in names {
                    let optional = param.ends_with('?');
                    let param = param.trim_end_matches('?');
                    match arg(self, param) {
                        Some(v) => args.push(v),
                        None if optional => args.push(Value::Null),
                        None => {
                            self.error(
                                ErrorKind::Missing,
                                &join(path, param),
                                format!("@{name}: required"),
                            );
                            return Value::Null;
                        }
                    }
                }
                match builtins::compute(name, &args) {
                    Ok(v) => v,
                    Err(message) => {
                        self.error(ErrorKind::Invalid, path, message);
                        Value::Null
                    }
                }
            }
        }
    }

    /// `@import(path)`: the JSON of the file at `path` (relative to the config's directory,
    /// mcrouter's rule for a relative path), expanded where it stands; `default` when the
    /// file cannot be read and one is given.
    pub(super) fn import_macro(
        &mut self,
        file: Option<Value>,
        default: Option<Value>,
        macros: &Macros,
        path: &str,
        depth: usize,
    ) -> Value {
        let Some(Value::String(file)) = file else {
            self.error(
                ErrorKind::Missing,
                &join(path, "path"),
                "@import: a file path is required",
            );
            return Value::Null;
        };
        let full = match &self.base {
            Some(base) => base.join(&file),
            None => std::path::PathBuf::from(&file),
        };
        let text = match std::fs::read_to_string(&full) {
            Ok(text) => text,
            Err(error) => {
                if let Some(default) = default {
                    return self.expand(default, macros, path, depth + 1);
                }
                self.error(
                    ErrorKind::Invalid,
                    path,
                    format!("@import: cannot read {}: {error}", full.display()),
                );
                return Value::Null;
            }
        };
        match json::parse(&text) {
            Ok(v) => self.expand(v, macros, path, depth + 1),
            // A file that is not JSON is taken as a string, as mcrouter does.
            Err(_) => Value::String(text.trim_end().to_string()),
        }
    }

    /// `transform` (`dictionary`, `itemTransform`, `keyTransform`, `itemName`, `keyName`)
    /// and `foreach` (`from`, `key`, `item`, `where`, `use`, `top`): each entry bound as
    /// `%key%` / `%item%` (or the names given) in the macro that makes its result.
    pub(super) fn for_each(
        &mut self,
        kind: &str,
        o: Map<String, Value>,
        macros: &Macros,
        path: &str,
        depth: usize,
    ) -> Value {
        let foreach = kind == "foreach";
        let (from_key, key_key, item_key) = match foreach {
            true => ("from", "key", "item"),
            false => ("dictionary", "keyName", "itemName"),
        };
        let name_of = |k: &str, default: &str| {
            o.get(k)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_string()
        };
        let (key_name, item_name) = (name_of(key_key, "key"), name_of(item_key, "item"));
        let from = o.get(from_key).cloned().unwrap_or(Value::Null);
        let from = self.expand(from, macros, &join(path, from_key), depth + 1);
        let entries: Vec<(Value, Value)> = match from {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (Value::from(i), v))
                .collect(),
            Value::Object(map) => map
                .into_iter()
                .map(|(k, v)| (Value::String(k), v))
                .collect(),
            other => {
                self.error(
                    ErrorKind::WrongType,
                    &join(path, from_key),
                    format!("{kind}: {} is not an array or object", compact(&other)),
                );
                return Value::Null;
            }
        };
        let was_object = entries.first().is_some_and(|(k, _)| k.is_string());
        let top = o
            .get("top")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |t| t as usize);
        let mut list = Vec::new();
        let mut object = Map::new();
        for (key, item) in entries {
            if list.len() + object.len() >= top {
                break;
            }
            let bound: HashMap<String, Value> = [
                (key_name.clone(), key.clone()),
                (item_name.clone(), item.clone()),
            ]
            .into();
            let make = |me: &mut Self, k: &str| {
                o.get(k).map(|m| {
                    me.expand(
                        substitute(m.clone(), &bound),
                        macros,
                        &join(path, k),
                        depth + 1,
                    )
                })
            };
            if foreach {
                if let Some(keep) = make(self, "where") {
                    if keep != Value::Bool(true) {
                        continue;
                    }
                }
                match make(self, "use") {
                    Some(Value::Object(more)) => object.extend(more),
                    Some(Value::Array(more)) => list.extend(more),
                    None if was_object => {
                        object.insert(builtins_text(&key), item);
                    }
                    None => list.push(item),
                    Some(other) => list.push(other),
                }
            } else {
                let new_item = make(self, "itemTransform").unwrap_or(item);
                match was_object {
                    true => {
                        let new_key = make(self, "keyTransform").unwrap_or(key);
                        object.insert(builtins_text(&new_key), new_item);
                    }
                    false => list.push(new_item),
                }
            }
        }
        match (list.is_empty(), object.is_empty(), was_object) {
            (true, false, _) | (true, true, true) => Value::Object(object),
            _ => Value::Array(list),
        }
    }
}

/// A JSON value as text: a string as it is.
pub(super) fn builtins_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `@name(a,b)` -> ("name", ["a", "b"]); `@name` -> ("name", []).
pub(super) fn parse_call(s: &str) -> Option<(&str, Vec<&str>)> {
    let body = s.strip_prefix('@')?;
    match body.split_once('(') {
        None => Some((body, Vec::new())),
        Some((name, args)) => {
            let args = args.strip_suffix(')')?;
            let args = if args.is_empty() {
                Vec::new()
            } else {
                args.split(',').map(str::trim).collect()
            };
            Some((name, args))
        }
    }
}

/// `%param%` replaced by its value: a string that is exactly `%param%` becomes the value
/// itself (of any type); inside a longer string, the value's text.
pub(super) fn substitute(v: Value, params: &HashMap<String, Value>) -> Value {
    match v {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix('%').and_then(|r| r.strip_suffix('%')) {
                if let Some(value) = params.get(name) {
                    return value.clone();
                }
            }
            let mut out = s;
            for (name, value) in params {
                let text = match value {
                    Value::String(t) => t.clone(),
                    other => other.to_string(),
                };
                out = out.replace(&format!("%{name}%"), &text);
            }
            Value::String(out)
        }
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|i| substitute(i, params)).collect())
        }
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, substitute(v, params)))
                .collect(),
        ),
        other => other,
    }
}

pub(super) fn sorted_keys<'a>(keys: impl Iterator<Item = &'a String>) -> String {
    let mut keys: Vec<&String> = keys.collect();
    keys.sort();
    keys.iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
