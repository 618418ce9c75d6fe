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
        let (mut macros, consts) = match top.remove("macros") {
            Some(defs) => self.read_macro_defs(defs),
            None => (Macros::new(), HashMap::new()),
        };
        // A const is `%name%` anywhere (mcrouter looks a name up in the local context
        // first, then among the consts): written in where no macro parameter has its name.
        if !consts.is_empty() {
            self.consts = consts.keys().cloned().collect();
            top = match substitute(Value::Object(top), &consts) {
                Value::Object(top) => top,
                _ => Map::new(),
            };
            for (params, body) in macros.values_mut() {
                let mut visible = consts.clone();
                visible.retain(|name, _| params.iter().all(|(p, _)| p != name));
                *body = substitute(std::mem::take(body), &visible);
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

    /// The definitions under `macros`: each `macroDef` (parameters with their defaults,
    /// and the body) and each `constDef`, which is also a const (`%name%`).
    fn read_macro_defs(&mut self, defs: Value) -> (Macros, HashMap<String, Value>) {
        let mut macros = Macros::new();
        let mut consts: HashMap<String, Value> = HashMap::new();
        let Value::Object(defs) = defs else {
            self.error(
                ErrorKind::WrongType,
                "macros",
                "expected an object of macro definitions",
            );
            return (macros, consts);
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
            if def.get("type").and_then(Value::as_str) == Some("constDef") {
                consts.insert(name.clone(), result.clone());
            }
            macros.insert(name, (params, result.clone()));
        }
        (macros, consts)
    }

    /// `value` with every macro in it expanded: a call written as a string (`"@name(a,b)"`,
    /// `expand_call`), an object that is a call, a built-in or has `vars`
    /// (`expand_object`), and everything inside arrays and plain objects.
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
            Value::String(s) if s.starts_with('@') => self.expand_call(&s, macros, path, depth),
            Value::Object(o) => self.expand_object(o, macros, path, depth),
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

    /// A call written as a string, `"@name(a,b)"`: a macro of `macros` (its parameters
    /// bound by position, or their defaults), else a built-in (bound by its parameter
    /// names); a value written in (`@json(...)`) reads back as itself.
    fn expand_call(&mut self, s: &str, macros: &Macros, path: &str, depth: usize) -> Value {
        if let Some(value) = json_argument(s) {
            return value;
        }
        let Some((name, args)) = parse_call(s) else {
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

    /// An object: its `vars` bound first; then a call of a macro of `macros` by its
    /// `type` (parameters by name), a built-in, `transform` / `foreach` / `process`; or
    /// a plain object, each value expanded.
    fn expand_object(
        &mut self,
        mut o: Map<String, Value>,
        macros: &Macros,
        path: &str,
        depth: usize,
    ) -> Value {
        if let Some(Value::Object(vars)) = o.remove("vars") {
            let bound = self.bind_vars(vars, macros, path, depth);
            let o = substitute(Value::Object(o), &bound);
            return self.expand(o, macros, path, depth + 1);
        }
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
            if kind == "process" {
                return self.process(o, macros, path, depth);
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
        let seeded = call.contains_key("seed");
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
            // A name bound where the call stands was answered by `substitute`; what is
            // left is true for a const only.
            "defined" => match arg(self, "name") {
                Some(Value::String(name)) => Value::Bool(self.consts.contains(&name)),
                _ => {
                    self.error(
                        ErrorKind::Invalid,
                        path,
                        "@defined: the name is not a string",
                    );
                    Value::Null
                }
            },
            "shuffle" if !seeded => {
                let list = arg(self, "dictionary");
                self.notes.push(format!(
                    "{path}: @shuffle without a seed is random in mcrouter (a new order at each start); the list is kept in the order written. Give it a seed for mcrouter's order."
                ));
                self.computed(name, &[list.unwrap_or_default()], path)
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
                self.computed(name, &args, path)
            }
        }
    }

    /// An object's `vars`: names bound for the rest of it. mcrouter expands each lazily,
    /// in a scope where the others are bound (`"a": "%b%"` sees a `b` written after it):
    /// each var has the others written into it until none is left (as many rounds as
    /// there are vars: a chain that long), then is expanded.
    fn bind_vars(
        &mut self,
        vars: Map<String, Value>,
        macros: &Macros,
        path: &str,
        depth: usize,
    ) -> HashMap<String, Value> {
        let mut bound: HashMap<String, Value> = vars.into_iter().collect();
        for _ in 0..bound.len() {
            let before = bound.clone();
            for (name, var) in bound.iter_mut() {
                let mut others = before.clone();
                others.remove(name);
                *var = substitute(std::mem::take(var), &others);
            }
        }
        bound
            .into_iter()
            .map(|(name, var)| {
                let var = self.expand(var, macros, &join(path, "vars"), depth + 1);
                (name, var)
            })
            .collect()
    }

    /// Built-in `name` over its expanded `args` (`builtins::compute`); its error reported.
    fn computed(&mut self, name: &str, args: &[Value], path: &str) -> Value {
        match builtins::compute(name, args) {
            Ok(v) => v,
            Err(message) => {
                self.error(ErrorKind::Invalid, path, message);
                Value::Null
            }
        }
    }

    /// `process` (`dictionary`, `initialValue`, `transform`, `keyName`, `itemName`,
    /// `valueName`): a value carried through the entries, `transform` making the next from
    /// `%key%`, `%item%` and `%value%` (or the names given), as mcrouter folds them.
    fn process(
        &mut self,
        o: Map<String, Value>,
        macros: &Macros,
        path: &str,
        depth: usize,
    ) -> Value {
        let name_of = |k: &str, default: &str| {
            o.get(k)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_string()
        };
        let names = [
            name_of("keyName", "key"),
            name_of("itemName", "item"),
            name_of("valueName", "value"),
        ];
        let expanded = |me: &mut Self, k: &str| {
            let v = o.get(k).cloned().unwrap_or(Value::Null);
            me.expand(v, macros, &join(path, k), depth + 1)
        };
        let entries = match expanded(self, "dictionary") {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (Value::from(i), v))
                .collect::<Vec<_>>(),
            Value::Object(map) => map
                .into_iter()
                .map(|(k, v)| (Value::String(k), v))
                .collect(),
            other => {
                let found = compact(&other);
                self.error(
                    ErrorKind::WrongType,
                    &join(path, "dictionary"),
                    format!("process: {found} is not an array or object"),
                );
                return Value::Null;
            }
        };
        let mut value = expanded(self, "initialValue");
        let transform = o.get("transform").cloned().unwrap_or(Value::Null);
        for (key, item) in entries {
            let [k, i, v] = names.clone();
            let bound: HashMap<String, Value> = [(k, key), (i, item), (v, value)].into();
            let step = substitute(transform.clone(), &bound);
            value = self.expand(step, macros, &join(path, "transform"), depth + 1);
        }
        value
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
                split_args(args)
            };
            Some((name, args))
        }
    }
}

/// A call's arguments: split at the commas outside brackets (an inner call's own, as
/// mcrouter's `getCallParams` keeps them, and a value written in as `@json(...)`) and
/// outside quotes; a backslash escapes the next character.
fn split_args(args: &str) -> Vec<&str> {
    let (mut out, mut depth, mut quoted, mut escaped, mut start) =
        (Vec::new(), 0i32, false, false, 0);
    for (at, c) in args.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            _ if quoted => {}
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(args[start..at].trim());
                start = at + 1;
            }
            _ => {}
        }
    }
    out.push(args[start..].trim());
    out
}

/// A value that is not a string, written into a macro call (`@weightedHash(%weights%, 5)`
/// with `weights` an object): mcrouter binds a call's argument that is exactly `%name%`
/// to the value itself, whatever its type; here the call is text until it is read, so the
/// value goes in as `@json(<its JSON>)`, which reads back as that value.
fn as_call_argument(value: &Value) -> String {
    format!("@json({value})")
}

/// `@json(<JSON>)` (`as_call_argument`): the value.
pub(super) fn json_argument(s: &str) -> Option<Value> {
    let raw = s.strip_prefix("@json(")?.strip_suffix(')')?;
    serde_json::from_str(raw).ok()
}

/// `%param%` replaced by its value: a string that is exactly `%param%` becomes the value
/// itself (of any type); inside a longer string, the value's text.
///
/// `@defined(name)` of a name among `params` is true: the name is bound where it stands.
pub(super) fn substitute(v: Value, params: &HashMap<String, Value>) -> Value {
    if defined_here(&v, params) {
        return Value::Bool(true);
    }
    match v {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix('%').and_then(|r| r.strip_suffix('%')) {
                if let Some(value) = params.get(name) {
                    return value.clone();
                }
            }
            let mut out = s;
            for (name, value) in params {
                // A call nested in a longer string (`@and(@defined(a), ...)`).
                out = out.replace(&format!("@defined({name})"), "@bool(true)");
                let text = match value {
                    Value::String(t) => t.clone(),
                    other if out.starts_with('@') => as_call_argument(other),
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

/// Whether `v` is `@defined(name)` (or its object form) of a name among `params`.
fn defined_here(v: &Value, params: &HashMap<String, Value>) -> bool {
    let name = match v {
        Value::String(s) => match parse_call(s) {
            Some(("defined", args)) if args.len() == 1 => args[0],
            _ => return false,
        },
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("defined") => {
            match o.get("name").and_then(Value::as_str) {
                Some(name) => name,
                None => return false,
            }
        }
        _ => return false,
    };
    params.contains_key(name)
}
