//! JSONM, mcrouter's config preprocessor (`mcrouter/lib/config/ConfigPreprocessor.cpp`),
//! expanded as it expands it: values, not text.
//!
//! - A string that is exactly `%name%` becomes the value of `name` (of any JSON type);
//!   `%name%` inside a longer string must be a string and is written in. A name is looked
//!   up in the scopes (`Scope`) from the innermost out, then among the consts (`constDef`
//!   and `--config-params`). A backslash escapes the next character in every string.
//! - A string that begins with `@` is a call (`jsonm_text`): each argument is itself
//!   expanded (a nested call, `%name%`, or text) and bound to the macro's parameter as a
//!   value. An object whose `type` names a macro is a call with its arguments by name.
//! - Object keys are expanded like values (`"%key%"`, `"@str(%item%)"`) and must come out
//!   as strings.
//! - A macro's body sees its parameters and the consts only, not its caller's names
//!   (mcrouter's base context); `vars` of an object are seen in that object, each expanded
//!   when first needed (they may use one another and the names outside); `transform`,
//!   `process` and `foreach` bind their entry's key and item (and value) around their
//!   templates. Arguments of `@if`, `@and`, `@or`, `@select`, `@shuffle` and `@import` are
//!   expanded only when needed; a default of a parameter is taken as written.
use std::cell::{Cell, RefCell};
use std::path::Path;

use super::jsonm_text::{call_params, split_call, unescape_until};
use super::*;

/// A macro parameter: its name, its default (taken as written, not expanded, as
/// mcrouter's), and whether a call must give it.
struct Param {
    name: String,
    default: Option<Value>,
    required: bool,
}

/// A macro defined with `macroDef`: its parameters and its body.
struct MacroDef {
    params: Vec<Param>,
    body: Value,
}

/// Why an expansion stopped (mcrouter stops at the first fault): where, and what.
struct Fault {
    kind: ErrorKind,
    path: String,
    message: String,
}

type Expanded = Result<Value, Fault>;

fn fault(path: &str, message: impl Into<String>) -> Fault {
    Fault {
        kind: ErrorKind::Invalid,
        path: path.to_string(),
        message: message.into(),
    }
}

/// A name bound in a scope: its value, or (a var) its JSONM until it is first needed.
enum Slot {
    Ready(Value),
    Lazy(Value),
    Expanding,
}

/// One scope of names (mcrouter's `Context`): a macro's parameters, an object's `vars`, a
/// loop's key and item. A sealed scope (a macro's) does not see the names outside it.
struct Scope<'s> {
    names: RefCell<HashMap<String, Slot>>,
    outer: Option<&'s Scope<'s>>,
    sealed: bool,
}

impl<'s> Scope<'s> {
    /// The scope of the file's top level (and of consts and imported files): no names.
    fn root() -> Scope<'static> {
        Scope {
            names: RefCell::default(),
            outer: None,
            sealed: true,
        }
    }

    fn inner(
        outer: &'s Scope<'s>,
        sealed: bool,
        names: impl IntoIterator<Item = (String, Slot)>,
    ) -> Self {
        Scope {
            names: RefCell::new(names.into_iter().collect()),
            outer: Some(outer),
            sealed,
        }
    }

    /// A loop's scope: `names` bound to values, the names outside seen.
    fn binding(outer: &'s Scope<'s>, names: impl IntoIterator<Item = (String, Value)>) -> Self {
        Self::inner(
            outer,
            false,
            names.into_iter().map(|(n, v)| (n, Slot::Ready(v))),
        )
    }

    /// Whether `name` is bound here or (unless sealed) outside: mcrouter's `@defined`.
    fn contains(&self, name: &str) -> bool {
        self.names.borrow().contains_key(name)
            || (!self.sealed && self.outer.is_some_and(|o| o.contains(name)))
    }
}

/// A call's arguments: written in a string (`@name(a,b)`, by position) or as an object
/// (by parameter name).
enum Args {
    Positional(Vec<Value>),
    Named(Map<String, Value>),
}

/// An argument bound to a parameter: as written (to expand in the caller's scope) or a
/// value already (a default).
enum Arg {
    Raw(Value),
    Ready(Value),
}

/// Undoes `nest`'s count when an expansion returns.
struct Nested<'a>(&'a Cell<usize>);

impl Drop for Nested<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// mcrouter's `nestedLimit`: expansion nested deeper is taken as a loop.
const NESTED_LIMIT: usize = 250;

/// The preprocessor: the macros and consts of the file, and where `@import` reads.
struct Jsonm<'a> {
    macros: HashMap<String, MacroDef>,
    consts: HashMap<String, Value>,
    base: Option<&'a Path>,
    notes: RefCell<Vec<String>>,
    depth: Cell<usize>,
}

impl Importer {
    /// The config with its JSONM expanded (`macros` read and removed), as mcrouter's
    /// `getConfigWithoutMacros`; a fault is reported with its JSON path.
    pub(super) fn expand_macros(&mut self, mut top: Map<String, Value>) -> Map<String, Value> {
        // `--config-params` are consts (strings), which a `constDef` of the name replaces.
        let consts = self.flags.config_params.iter();
        let mut jsonm = Jsonm {
            macros: HashMap::new(),
            consts: consts
                .map(|(name, value)| (name.clone(), Value::String(value.clone())))
                .collect(),
            base: self.base.as_deref(),
            notes: RefCell::default(),
            depth: Cell::new(0),
        };
        let expanded = match top.remove("macros") {
            Some(defs) => jsonm.read_defs(defs, "macros"),
            None => Ok(()),
        }
        .and_then(|()| jsonm.expand(Value::Object(top), &Scope::root(), ""));
        if !jsonm.macros.is_empty() {
            self.notes.push(format!(
                "macros ({}) were expanded in place.",
                sorted_keys(jsonm.macros.keys())
            ));
        }
        self.notes.extend(jsonm.notes.take());
        match expanded {
            Ok(Value::Object(top)) => top,
            Ok(_) => Map::new(),
            Err(f) => {
                self.error(f.kind, &f.path, f.message);
                Map::new()
            }
        }
    }
}

impl Jsonm<'_> {
    /// `macros`, expanded first (it may be an array of definition objects, or built by
    /// macros, `@import` included), then each definition read (mcrouter's
    /// `parseMacroDefs`).
    fn read_defs(&mut self, defs: Value, path: &str) -> Result<(), Fault> {
        match self.expand(defs, &Scope::root(), path)? {
            Value::Object(defs) => {
                for (name, def) in defs {
                    self.read_def(name, def, path)?;
                }
                Ok(())
            }
            Value::Array(items) => {
                for (i, item) in items.into_iter().enumerate() {
                    self.read_defs(item, &index(path, i))?;
                }
                Ok(())
            }
            other => Err(fault(
                path,
                format!(
                    "expected an object or array of macro definitions, found {}",
                    compact(&other)
                ),
            )),
        }
    }

    /// One `macroDef` or `constDef` (a later one of a name replaces an earlier one).
    fn read_def(&mut self, name: String, def: Value, parent: &str) -> Result<(), Fault> {
        let path = join(parent, &name);
        let Value::Object(mut def) = def else {
            return Err(fault(&path, "expected a macro definition object"));
        };
        let kind = def.get("type").and_then(Value::as_str).unwrap_or_default();
        let kind = kind.to_string();
        let Some(body) = def.remove("result") else {
            return Err(fault(&path, "a macro definition needs a \"result\""));
        };
        match kind.as_str() {
            "constDef" => {
                self.consts.insert(name, body);
            }
            "macroDef" => {
                let params = match def.remove("params") {
                    None => Vec::new(),
                    Some(Value::Array(params)) => read_params(params, &join(&path, "params"))?,
                    Some(_) => return Err(fault(&path, "macroDef params is not an array")),
                };
                self.macros.insert(name, MacroDef { params, body });
            }
            other => {
                return Err(fault(
                    &join(&path, "type"),
                    format!("expected \"macroDef\" or \"constDef\", found \"{other}\""),
                ))
            }
        }
        Ok(())
    }

    /// Counts one level of nesting; too deep is a fault (a macro that calls itself).
    fn nest(&self, path: &str) -> Result<Nested<'_>, Fault> {
        if self.depth.get() >= NESTED_LIMIT {
            return Err(Fault {
                kind: ErrorKind::Circle,
                path: path.to_string(),
                message: "macro expansion too deep (a macro that calls itself?)".to_string(),
            });
        }
        self.depth.set(self.depth.get() + 1);
        Ok(Nested(&self.depth))
    }

    /// `value` with its JSONM expanded in `scope` (mcrouter's `expandMacros`).
    fn expand(&self, value: Value, scope: &Scope, path: &str) -> Expanded {
        let _nested = self.nest(path)?;
        match value {
            Value::String(s) => self.expand_string(&s, scope, path),
            Value::Object(o) => self.expand_object(o, scope, path),
            Value::Array(items) => {
                let items = items.into_iter().enumerate();
                items
                    .map(|(i, v)| self.expand(v, scope, &index(path, i)))
                    .collect::<Result<_, _>>()
                    .map(Value::Array)
            }
            other => Ok(other),
        }
    }

    /// A string: a call if it begins with `@` (its name may hold `%name%` too), else its
    /// `%name%`s replaced (`replace_params`).
    fn expand_string(&self, s: &str, scope: &Scope, path: &str) -> Expanded {
        let _nested = self.nest(path)?;
        if !s.starts_with('@') {
            return self.replace_params(s, scope, path);
        }
        let (name, args) = split_call(s).map_err(|m| fault(path, m))?;
        let name = match self.replace_params(name, scope, path)? {
            Value::String(name) => name,
            other => {
                let found = compact(&other);
                return Err(fault(path, format!("macro name {found} is not a string")));
            }
        };
        let args = match args {
            Some(text) => call_params(text).map_err(|m| fault(path, m))?,
            None => Vec::new(),
        };
        let args = args.into_iter().map(|a| Value::String(a.to_string()));
        self.call(&name, Args::Positional(args.collect()), scope, path)
    }

    /// mcrouter's `replaceParams`: escapes undone and each `%name%` replaced; a string that
    /// is one `%name%` (with nothing written before it) is the value itself.
    fn replace_params(&self, s: &str, scope: &Scope, path: &str) -> Expanded {
        if !s.contains(['%', '\\']) {
            return Ok(Value::String(s.to_string()));
        }
        let (mut out, mut rest) = (String::new(), s);
        while !rest.is_empty() {
            let Some(open) = unescape_until(rest, &mut out, '%') else {
                break;
            };
            rest = &rest[open + 1..];
            let mut name = String::new();
            let Some(close) = unescape_until(rest, &mut name, '%') else {
                return Err(fault(
                    path,
                    format!("odd number of percent signs in \"{s}\""),
                ));
            };
            let value = self.param(&name, scope, path)?;
            if out.is_empty() && close == rest.len() - 1 {
                return Ok(value);
            }
            match value {
                Value::String(text) => out.push_str(&text),
                other => {
                    let found = compact(&other);
                    let message = format!("%{name}% is {found}, not a string, inside \"{s}\"");
                    return Err(fault(path, message));
                }
            }
            rest = &rest[close + 1..];
        }
        Ok(Value::String(out))
    }

    /// The value of `%name%`: from the scopes, else a const (expanded where it is used,
    /// in no scope).
    fn param(&self, name: &str, scope: &Scope, path: &str) -> Expanded {
        if let Some(value) = self.lookup(name, scope, path)? {
            return Ok(value);
        }
        match self.consts.get(name) {
            Some(raw) => self.expand(raw.clone(), &Scope::root(), path),
            None => Err(fault(
                path,
                format!("%{name}%: no parameter, var or const of that name in scope"),
            )),
        }
    }

    /// `name` in `scope` or (unless sealed) the scopes around it; a var is expanded the
    /// first time it is needed, in its own scope.
    fn lookup(&self, name: &str, scope: &Scope, path: &str) -> Result<Option<Value>, Fault> {
        let slot = match scope.names.borrow_mut().get_mut(name) {
            Some(Slot::Ready(value)) => return Ok(Some(value.clone())),
            Some(slot) => Some(std::mem::replace(slot, Slot::Expanding)),
            None => None,
        };
        match slot {
            Some(Slot::Lazy(raw)) => {
                let value = self.expand(raw, scope, path)?;
                let ready = Slot::Ready(value.clone());
                scope.names.borrow_mut().insert(name.to_string(), ready);
                Ok(Some(value))
            }
            Some(_) => Err(fault(path, format!("var \"{name}\" is defined by itself"))),
            None => match scope.outer {
                Some(outer) if !scope.sealed => self.lookup(name, outer, path),
                _ => Ok(None),
            },
        }
    }

    /// An object: its `vars` bound; then, by its `type`, a `macroDef` / `constDef` left
    /// as it is, `transform` / `process` / `foreach`, or a call of a macro with its
    /// arguments by name; else each key and value expanded.
    fn expand_object(&self, mut o: Map<String, Value>, outer: &Scope, path: &str) -> Expanded {
        let vars = match o.remove("vars") {
            None => None,
            Some(Value::Object(vars)) => Some(vars),
            Some(_) => return Err(fault(&join(path, "vars"), "vars is not an object")),
        };
        let names: Vec<String> = vars.iter().flat_map(|v| v.keys().cloned()).collect();
        let local = vars.map(|vars| {
            let slots = vars.into_iter().map(|(name, raw)| (name, Slot::Lazy(raw)));
            Scope::inner(outer, false, slots)
        });
        let scope = local.as_ref().unwrap_or(outer);
        for name in &names {
            self.lookup(name, scope, &join(&join(path, "vars"), name))?;
        }
        if let Some(kind) = o.get("type").cloned() {
            if let Value::String(kind) = self.expand(kind, scope, &join(path, "type"))? {
                match kind.as_str() {
                    "macroDef" | "constDef" => return Ok(Value::Object(o)),
                    "transform" => return self.transform(o, scope, path),
                    "process" => return self.process(o, scope, path),
                    "foreach" => return self.foreach(o, scope, path),
                    _ if self.is_macro(&kind) => {
                        return self.call(&kind, Args::Named(o), scope, path)
                    }
                    _ => {}
                }
            }
        }
        let mut out = Map::new();
        for (key, value) in o {
            let at = join(path, &key);
            let key = match self.expand_string(&key, scope, &at)? {
                Value::String(key) => key,
                other => {
                    let found = compact(&other);
                    return Err(fault(
                        &at,
                        format!("the key expands to {found}, not a string"),
                    ));
                }
            };
            out.insert(key, self.expand(value, scope, &at)?);
        }
        Ok(Value::Object(out))
    }

    /// A macro of the file or one of mcrouter's built-ins.
    fn is_macro(&self, name: &str) -> bool {
        self.macros.contains_key(name) || builtins::params(name).is_some()
    }

    /// Macro `name` called from `caller`: a macro of the file (its body expanded in a sealed
    /// scope of its parameters, each argument expanded in the caller's), else a built-in.
    fn call(&self, name: &str, args: Args, caller: &Scope, path: &str) -> Expanded {
        let Some(def) = self.macros.get(name) else {
            let Some(names) = builtins::params(name) else {
                return Err(fault(
                    path,
                    format!("macro \"@{name}\" is neither defined in \"macros\" nor one of mcrouter's built-ins"),
                ));
            };
            let params: Vec<Param> = names
                .iter()
                .map(|n| Param {
                    name: n.trim_end_matches('?').to_string(),
                    default: None,
                    required: !n.ends_with('?'),
                })
                .collect();
            let bound = bind(name, &params, args, path)?;
            return self.builtin(name, bound, caller, path);
        };
        let bound = bind(name, &def.params, args, path)?;
        let mut names = Vec::new();
        for (param, arg) in def.params.iter().zip(bound) {
            if let Some(arg) = arg {
                let value = self.ready(arg, caller, path)?;
                names.push((param.name.clone(), value));
            }
        }
        let scope = Scope::binding(caller, distinct(names, path)?);
        let scope = Scope {
            sealed: true,
            ..scope
        };
        self.expand(def.body.clone(), &scope, path)
    }

    /// An argument's value: as written, expanded in the caller's scope; a default as it is.
    fn ready(&self, arg: Arg, caller: &Scope, path: &str) -> Expanded {
        match arg {
            Arg::Raw(raw) => self.expand(raw, caller, path),
            Arg::Ready(value) => Ok(value),
        }
    }

    /// Built-in `name` with its arguments in parameter order: those that expand an argument
    /// only when needed (`@if`, `@and`, `@or`, `@select`, `@shuffle`, `@import`) and
    /// `@defined` (which looks in the caller's scope) here; the others computed from their
    /// values (`builtins::compute`).
    fn builtin(
        &self,
        name: &str,
        mut args: Vec<Option<Arg>>,
        caller: &Scope,
        path: &str,
    ) -> Expanded {
        let count = args.len();
        let mut arg = |i: usize| match args.get_mut(i).and_then(Option::take) {
            Some(arg) => self.ready(arg, caller, path).map(Some),
            None => Ok(None),
        };
        let boolean = |v: Option<Value>, what: &str| match v {
            Some(Value::Bool(b)) => Ok(b),
            other => {
                let found = other.map_or("nothing".to_string(), |v| compact(&v));
                Err(fault(
                    path,
                    format!("@{name}: {what} is {found}, not a boolean"),
                ))
            }
        };
        match name {
            "if" => {
                let branch = if boolean(arg(0)?, "the condition")? {
                    1
                } else {
                    2
                };
                Ok(arg(branch)?.unwrap_or_default())
            }
            "and" | "or" => {
                let a = boolean(arg(0)?, "A")?;
                match (name, a) {
                    ("and", false) | ("or", true) => Ok(Value::Bool(a)),
                    _ => boolean(arg(1)?, "B").map(Value::Bool),
                }
            }
            "select" => {
                let (dictionary, key) = (arg(0)?.unwrap_or_default(), arg(1)?.unwrap_or_default());
                match builtins::select(&dictionary, &key).map_err(|m| fault(path, m))? {
                    Some(value) => Ok(value.clone()),
                    None => arg(2)?.ok_or_else(|| {
                        fault(
                            path,
                            format!("@select: {} not found, and no default", compact(&key)),
                        )
                    }),
                }
            }
            "shuffle" => {
                let (list, seed) = (arg(0)?.unwrap_or_default(), arg(1)?);
                if seed.is_none() {
                    self.notes.borrow_mut().push(format!(
                        "{path}: @shuffle without a seed is random in mcrouter (a new order at each start); the list is kept in the order written. Give it a seed for mcrouter's order."
                    ));
                }
                let computed = builtins::compute(name, &[list, seed.unwrap_or_default()]);
                computed.map_err(|m| fault(path, m))
            }
            "import" => match arg(0)? {
                Some(Value::String(file)) => self.import(&file, path).or_else(|f| arg(1)?.ok_or(f)),
                _ => Err(fault(path, "@import: the path is not a string")),
            },
            "defined" => match arg(0)? {
                Some(Value::String(n)) => Ok(Value::Bool(
                    caller.contains(&n) || self.consts.contains_key(&n),
                )),
                _ => Err(fault(path, "@defined: the name is not a string")),
            },
            _ => {
                let mut values = Vec::with_capacity(count);
                for i in 0..count {
                    values.push(arg(i)?.unwrap_or_default());
                }
                builtins::compute(name, &values).map_err(|m| fault(path, m))
            }
        }
    }

    /// `@import(path)`: the JSON of the file at `path` (relative to the config's directory,
    /// mcrouter's rule for a relative path), expanded in no scope.
    fn import(&self, file: &str, path: &str) -> Expanded {
        let full = match self.base {
            Some(base) => base.join(file),
            None => std::path::PathBuf::from(file),
        };
        let text = std::fs::read_to_string(&full).map_err(|error| {
            fault(
                path,
                format!("@import: cannot read {}: {error}", full.display()),
            )
        })?;
        // Not JSON: an error (the `default`, if given), as mcrouter's parse of it.
        let value = json::parse(&text).map_err(|error| {
            fault(
                path,
                format!("@import: {} is not JSON: {error}", full.display()),
            )
        })?;
        self.expand(value, &Scope::root(), path)
    }

    /// The value of key `k` of a loop object, expanded; `Err` when it is missing.
    fn required(&self, o: &mut Map<String, Value>, k: &str, scope: &Scope, path: &str) -> Expanded {
        match o.remove(k) {
            Some(raw) => self.expand(raw, scope, &join(path, k)),
            None => Err(fault(path, format!("\"{k}\" not found"))),
        }
    }

    /// `transform` (`dictionary`, `itemTransform`, `keyTransform`, `itemName`, `keyName`):
    /// each entry's item (and, in an object, key) remade with `%key%` and `%item%` bound.
    fn transform(&self, mut o: Map<String, Value>, scope: &Scope, path: &str) -> Expanded {
        let dictionary = self.required(&mut o, "dictionary", scope, path)?;
        let names = [
            loop_name(&o, "keyName", "key", path)?,
            loop_name(&o, "itemName", "item", path)?,
        ];
        distinct(names.iter().map(|n| (n, ())), path)?;
        let (is_object, entries) = entries(dictionary, "transform", path)?;
        let (item_t, key_t) = (o.get("itemTransform"), o.get("keyTransform"));
        if !is_object && item_t.is_none() && !entries.is_empty() {
            return Err(fault(
                path,
                "transform: itemTransform is required for an array",
            ));
        }
        let (mut list, mut object) = (Vec::new(), Map::new());
        for (key, item) in entries {
            let [k, i] = names.clone();
            let each = Scope::binding(scope, [(k, key.clone()), (i, item.clone())]);
            let remade = |t: Option<&Value>, v: Value, at: &str| match t {
                Some(t) => self.expand(t.clone(), &each, &join(path, at)),
                None => Ok(v),
            };
            if !is_object {
                list.push(remade(item_t, item, "itemTransform")?);
                continue;
            }
            let keys = match remade(key_t, key, "keyTransform")? {
                Value::Array(keys) => keys,
                key @ Value::String(_) => vec![key],
                other => {
                    let found = compact(&other);
                    return Err(fault(
                        path,
                        format!("transform: the key {found} is not an array or string"),
                    ));
                }
            };
            if keys.is_empty() {
                continue;
            }
            let item = remade(item_t, item, "itemTransform")?;
            for key in keys {
                let Value::String(key) = key else {
                    return Err(fault(path, "transform: a key of the list is not a string"));
                };
                object.insert(key, item.clone());
            }
        }
        Ok(if is_object {
            Value::Object(object)
        } else {
            Value::Array(list)
        })
    }

    /// `process` (`dictionary`, `initialValue`, `transform`, `keyName`, `itemName`,
    /// `valueName`): a value carried through the entries, `transform` making the next
    /// from `%key%`, `%item%` and `%value%`.
    fn process(&self, mut o: Map<String, Value>, scope: &Scope, path: &str) -> Expanded {
        let dictionary = self.required(&mut o, "dictionary", scope, path)?;
        let mut value = self.required(&mut o, "initialValue", scope, path)?;
        let Some(transform) = o.get("transform") else {
            return Err(fault(path, "process: \"transform\" not found"));
        };
        let names = [
            loop_name(&o, "keyName", "key", path)?,
            loop_name(&o, "itemName", "item", path)?,
            loop_name(&o, "valueName", "value", path)?,
        ];
        distinct(names.iter().map(|n| (n, ())), path)?;
        for (key, item) in entries(dictionary, "process", path)?.1 {
            let [k, i, v] = names.clone();
            let each = Scope::binding(scope, [(k, key), (i, item), (v, value)]);
            value = self.expand(transform.clone(), &each, &join(path, "transform"))?;
        }
        Ok(value)
    }

    /// `foreach` (`from`, `key`, `item`, `where`, `use`, `top`, `noMatchResult`): the
    /// `use` of at most `top` entries that satisfy `where`, merged into one list or object.
    fn foreach(&self, mut o: Map<String, Value>, scope: &Scope, path: &str) -> Expanded {
        let from = self.required(&mut o, "from", scope, path)?;
        let names = [
            loop_name(&o, "key", "key", path)?,
            loop_name(&o, "item", "item", path)?,
        ];
        distinct(names.iter().map(|n| (n, ())), path)?;
        let (is_object, entries) = entries(from, "foreach", path)?;
        let top = match o.remove("top") {
            None => usize::MAX,
            Some(top) => match self.expand(top, scope, &join(path, "top"))?.as_u64() {
                Some(top) => usize::try_from(top).unwrap_or(usize::MAX),
                None => return Err(fault(path, "foreach: top is not a non-negative integer")),
            },
        };
        let (mut result, mut taken) = (None, 0);
        for (key, item) in entries {
            if taken >= top {
                break;
            }
            let [k, i] = names.clone();
            let each = Scope::binding(scope, [(k, key.clone()), (i, item.clone())]);
            if let Some(condition) = o.get("where") {
                match self.expand(condition.clone(), &each, &join(path, "where"))? {
                    Value::Bool(true) => {}
                    Value::Bool(false) => continue,
                    _ => return Err(fault(path, "foreach: \"where\" is not a boolean")),
                }
            }
            let found = match o.get("use") {
                Some(used) => self.expand(used.clone(), &each, &join(path, "use"))?,
                None if is_object => Value::Object(Map::from_iter([(builtins::text(&key), item)])),
                None => Value::Array(vec![item]),
            };
            result = Some(merged(result, found).map_err(|m| fault(path, m))?);
            taken += 1;
        }
        match (result, o.remove("noMatchResult")) {
            (Some(result), _) => Ok(result),
            (None, Some(none)) => self.expand(none, scope, &join(path, "noMatchResult")),
            (None, None) if is_object => Ok(Value::Object(Map::new())),
            (None, None) => Ok(Value::Array(Vec::new())),
        }
    }
}

/// A `macroDef`'s `params`: a name (required), or `{"name", "default"}` /
/// `{"name", "optional": true}`; after an optional one, every one is optional.
fn read_params(params: Vec<Value>, path: &str) -> Result<Vec<Param>, Fault> {
    let mut out: Vec<Param> = Vec::new();
    for (i, p) in params.into_iter().enumerate() {
        let at = index(path, i);
        let param = match p {
            Value::String(name) => Param {
                name,
                default: None,
                required: true,
            },
            Value::Object(mut o) => {
                let Some(Value::String(name)) = o.remove("name") else {
                    return Err(fault(&at, "a parameter needs a \"name\" (a string)"));
                };
                let optional = match o.get("optional") {
                    None => None,
                    Some(Value::Bool(b)) => Some(*b),
                    Some(_) => return Err(fault(&at, "\"optional\" is not a boolean")),
                };
                let default = o.remove("default");
                if default.is_some() && optional == Some(false) {
                    return Err(fault(
                        &at,
                        "a default is set, but the parameter is not optional",
                    ));
                }
                let required = default.is_none() && optional != Some(true);
                Param {
                    name,
                    default,
                    required,
                }
            }
            _ => {
                return Err(fault(
                    &at,
                    "expected a parameter name or {\"name\": ..., \"default\": ...}",
                ))
            }
        };
        if param.required && out.iter().any(|p| !p.required) {
            return Err(fault(
                &at,
                "every parameter after an optional one must be optional",
            ));
        }
        out.push(param);
    }
    Ok(out)
}

/// `args` bound to `params` (`None`: an optional one not given and without a default).
fn bind(name: &str, params: &[Param], args: Args, path: &str) -> Result<Vec<Option<Arg>>, Fault> {
    match args {
        Args::Positional(list) => {
            let least = params.iter().filter(|p| p.required).count();
            if list.len() < least || list.len() > params.len() {
                return Err(fault(
                    path,
                    format!(
                        "@{name}: {} arguments; it takes {least} to {}",
                        list.len(),
                        params.len()
                    ),
                ));
            }
            let mut list = list.into_iter();
            Ok(params
                .iter()
                .map(|p| {
                    list.next()
                        .map(Arg::Raw)
                        .or_else(|| p.default.clone().map(Arg::Ready))
                })
                .collect())
        }
        Args::Named(mut o) => params
            .iter()
            .map(|p| match o.remove(&p.name) {
                Some(raw) => Ok(Some(Arg::Raw(raw))),
                None if p.required => Err(fault(
                    path,
                    format!("@{name}: parameter \"{}\" not found", p.name),
                )),
                None => Ok(p.default.clone().map(Arg::Ready)),
            })
            .collect(),
    }
}

/// `names`, checked to be bound once each: mcrouter rejects a name bound twice in one
/// scope (a macro's parameter written twice, a loop whose key and item share a name).
fn distinct<N: AsRef<str>, V>(
    names: impl IntoIterator<Item = (N, V)>,
    path: &str,
) -> Result<Vec<(N, V)>, Fault> {
    let mut out: Vec<(N, V)> = Vec::new();
    for (name, value) in names {
        if out.iter().any(|(n, _)| n.as_ref() == name.as_ref()) {
            let name = name.as_ref();
            return Err(fault(
                path,
                format!("\"{name}\" is bound twice in one scope"),
            ));
        }
        out.push((name, value));
    }
    Ok(out)
}

/// The name a loop binds (`keyName`, `item`, ...): as written, a string.
fn loop_name(o: &Map<String, Value>, k: &str, default: &str, path: &str) -> Result<String, Fault> {
    match o.get(k) {
        None => Ok(default.to_string()),
        Some(Value::String(name)) => Ok(name.clone()),
        Some(_) => Err(fault(&join(path, k), format!("\"{k}\" is not a string"))),
    }
}

/// A list's or object's entries as (key, item): a list's keyed by index. `true`: an object.
fn entries(v: Value, what: &str, path: &str) -> Result<(bool, Vec<(Value, Value)>), Fault> {
    match v {
        Value::Array(items) => Ok((
            false,
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (Value::from(i), v))
                .collect(),
        )),
        Value::Object(o) => Ok((
            true,
            o.into_iter().map(|(k, v)| (Value::String(k), v)).collect(),
        )),
        other => Err(fault(
            path,
            format!("{what}: {} is not an array or object", compact(&other)),
        )),
    }
}

/// `foreach`'s result with one more `use` merged in: lists joined, objects merged.
fn merged(result: Option<Value>, found: Value) -> Result<Value, String> {
    match (result, found) {
        (None, found @ (Value::Array(_) | Value::Object(_))) => Ok(found),
        (Some(Value::Array(mut list)), Value::Array(more)) => {
            list.extend(more);
            Ok(Value::Array(list))
        }
        (Some(Value::Object(mut object)), Value::Object(more)) => {
            object.extend(more);
            Ok(Value::Object(object))
        }
        (_, other) => Err(format!(
            "foreach: {} does not merge into the result",
            compact(&other)
        )),
    }
}

fn sorted_keys<'a>(keys: impl Iterator<Item = &'a String>) -> String {
    let mut keys: Vec<&String> = keys.collect();
    keys.sort();
    keys.iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
