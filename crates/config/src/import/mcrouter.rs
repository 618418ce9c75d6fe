//! `memroute import-mcrouter config.json`: translate an mcrouter config to memroute TOML.
//!
//! ```text
//!   JSON --serde_json--> Value --expand plain macros--> Value
//!        --walk the route tree from `route` / `routes`--> pools + [routes.*] --render--> TOML
//!        --crate::parse()--> checked (the output always loads)
//! ```
//!
//! Placement is carried over exactly: a PoolRoute (or a HashRoute over `Pool|NAME`) becomes
//! a memroute pool with the same servers in the same order and distribution `ch3`, `wch3`
//! (with the weights, padded or cut by mcrouter's rules) or `crc32`, which place every key
//! where mcrouter would. Route handles map to memroute route types; a named handle becomes
//! a route of that name. What has no equivalent is a `# NOTE` naming its JSON path, and
//! what cannot be translated at all (an unknown handle, a weight outside (0, 1], a loop
//! between named handles, a macro that computes) is an error naming its JSON path.
use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Map, Value};

use super::push_note;
use crate::raw::{check_host_port, toml_key};
use crate::walk::join;
use crate::{ConfigError, ConfigErrors, ErrorKind};

/// Route handles read here, by mcrouter's name.
const HANDLES: &[&str] = &[
    "PoolRoute",
    "HashRoute",
    "PrefixSelectorRoute",
    "OperationSelectorRoute",
    "AllSyncRoute",
    "AllAsyncRoute",
    "AllInitialRoute",
    "AllMajorityRoute",
    "AllFastestRoute",
    "FailoverRoute",
    "FailoverWithExptimeRoute",
    "MissFailoverRoute",
    "WarmUpRoute",
    "ShadowRoute",
    "RandomRoute",
    "LatestRoute",
    "NullRoute",
    "ErrorRoute",
];

/// mcrouter operation names and memroute's.
const OPERATIONS: &[(&str, &str)] = &[
    ("get", "get"),
    ("gets", "gets"),
    ("gat", "gat"),
    ("gats", "gats"),
    ("set", "set"),
    ("add", "add"),
    ("replace", "replace"),
    ("append", "append"),
    ("prepend", "prepend"),
    ("cas", "cas"),
    ("delete", "delete"),
    ("incr", "incr"),
    ("decr", "decr"),
    ("touch", "touch"),
    ("flushall", "flush_all"),
];

/// Plain macros by name: parameters (with their defaults) and the body.
type Macros = HashMap<String, (Vec<(String, Option<Value>)>, Value)>;

/// Macro expansion deeper than this is taken as a loop.
const MAX_MACRO_DEPTH: usize = 32;

/// Returns the equivalent memroute TOML for an mcrouter JSON config.
pub fn import(json: &str) -> Result<String, ConfigErrors> {
    let doc: Value = serde_json::from_str(json).map_err(|e| {
        ConfigErrors::single(ConfigError::new(
            ErrorKind::Syntax,
            format!("line {}, column {}", e.line(), e.column()),
            format!("invalid JSON: {e}"),
        ))
    })?;
    let Value::Object(top) = doc else {
        return Err(single(
            ErrorKind::WrongType,
            "",
            "expected a JSON object (an mcrouter config)",
        ));
    };
    let mut importer = Importer::default();
    let top = importer.expand_macros(top);
    // A macro that failed leaves nulls behind: reporting those too would only confuse.
    if !importer.errs.is_empty() {
        return Err(ConfigErrors(importer.errs));
    }
    importer.read_pools(&top);
    importer.read_named_handles(&top);
    let root = importer.read_root(&top);
    importer.note_top_level_keys(&top);
    if !importer.errs.is_empty() {
        return Err(ConfigErrors(importer.errs));
    }
    let Some(root) = root else {
        return Err(single(ErrorKind::Missing, "", "no route to import"));
    };
    super::checked(importer.render(&root))
}

fn single(kind: ErrorKind, path: &str, message: impl Into<String>) -> ConfigErrors {
    ConfigErrors::single(ConfigError::new(kind, path, message))
}

fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

/// An mcrouter pool as read from `pools`.
#[derive(Debug, Clone)]
struct McPool {
    servers: Vec<String>,
    /// Pool-level `weights` (switches PoolRoute to WeightedCh3), checked.
    weights: Option<Vec<f64>>,
    /// `server_timeout`, in milliseconds.
    timeout_ms: Option<u64>,
    notes: Vec<String>,
}

/// How a pool's keys are placed: mcrouter's hash functions.
#[derive(Debug, Clone, PartialEq)]
enum Hash {
    Ch3,
    Crc32,
    WeightedCh3(Vec<f64>),
}

impl Hash {
    fn distribution(&self) -> &'static str {
        match self {
            Hash::Ch3 => "ch3",
            Hash::Crc32 => "crc32",
            Hash::WeightedCh3(_) => "wch3",
        }
    }
}

/// A memroute pool to write out.
#[derive(Debug)]
struct OutPool {
    servers: Vec<String>,
    hash: Hash,
    /// mcrouter's hash salt (empty: none).
    salt: String,
    timeout_ms: Option<u64>,
    notes: Vec<String>,
}

/// What a route handle turned into.
#[derive(Debug)]
enum Built {
    /// An existing target (a pool, or a child route): nothing of its own to write.
    Target(String),
    /// A new memroute route: its `key = value` lines.
    Route(Vec<String>),
}

/// A note for every key of `o` that is not in `known`.
fn note_unknown_keys(o: &Map<String, Value>, known: &[&str], path: &str, notes: &mut Vec<String>) {
    for (key, value) in o {
        if !known.contains(&key.as_str()) {
            notes.push(format!(
                "{}: {} is not carried over.",
                join(path, key),
                compact(value)
            ));
        }
    }
}

/// A memroute route to write out: its `key = value` lines and notes.
#[derive(Debug)]
struct OutRoute {
    lines: Vec<String>,
    notes: Vec<String>,
}

#[derive(Debug, Default)]
struct Importer {
    errs: Vec<ConfigError>,
    /// Notes about the file as a whole.
    notes: Vec<String>,
    pools: BTreeMap<String, McPool>,
    /// Pools that had errors (already reported): uses of them say nothing more.
    bad_pools: HashSet<String>,
    /// Named handles not yet translated: name -> (definition, JSON path).
    named: BTreeMap<String, (Value, String)>,
    /// Named handles translated: name -> memroute target.
    named_done: HashMap<String, String>,
    /// Named handles being translated (to report loops).
    resolving: Vec<String>,
    /// (mcrouter pool, hash, salt) -> memroute pool name.
    pool_variants: Vec<((String, Hash, String), String)>,
    out_pools: BTreeMap<String, OutPool>,
    out_routes: BTreeMap<String, OutRoute>,
    /// Every memroute name handed out (pools and routes share one namespace).
    used: HashSet<String>,
}

impl Importer {
    fn error(&mut self, kind: ErrorKind, path: &str, message: impl Into<String>) {
        self.errs.push(ConfigError::new(kind, path, message));
    }

    /// A memroute name not used yet, as close to `wanted` as possible. Pools keep their
    /// mcrouter name when it is free; routes never take the name of an mcrouter pool, which
    /// may still become a memroute pool later in the walk.
    fn fresh_name(&mut self, wanted: &str, for_pool: bool) -> String {
        let base: String = wanted
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        // `root_session:` + `_delete` reads better as `root_session_delete`.
        let mut collapsed = String::with_capacity(base.len());
        for c in base.chars() {
            if !(c == '_' && collapsed.ends_with('_')) {
                collapsed.push(c);
            }
        }
        let base = collapsed.trim_matches('_');
        let base = if base.is_empty() { "route" } else { base };
        let taken = |me: &Self, name: &str| {
            me.used.contains(name) || (!for_pool && me.pools.contains_key(name))
        };
        let mut name = if for_pool {
            wanted.to_string()
        } else {
            base.to_string()
        };
        let mut n = 2;
        while taken(self, &name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        self.used.insert(name.clone());
        name
    }

    // ---- macros ---------------------------------------------------------------------

    /// Expands `macros` defined with `macroDef` where they are plain substitution:
    /// `{"type": "name", "param": value}` and `"@name(a,b)"` calls, `%param%` in the body.
    /// mcrouter's built-in macros compute (`@if`, `@merge`, `@int`, ...): those are errors.
    fn expand_macros(&mut self, mut top: Map<String, Value>) -> Map<String, Value> {
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

    fn expand(&mut self, value: Value, macros: &Macros, path: &str, depth: usize) -> Value {
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
                    self.error(ErrorKind::Invalid,
                        path,
                        format!(
                            "macro \"@{name}\" is not a plain macro defined in \"macros\" (mcrouter's built-in macros compute; write the result out)"
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

    // ---- pools ----------------------------------------------------------------------

    fn read_pools(&mut self, top: &Map<String, Value>) {
        let Some(pools) = top.get("pools") else {
            return;
        };
        let Some(pools) = pools.as_object() else {
            self.error(
                ErrorKind::WrongType,
                "pools",
                "expected an object of pools by name",
            );
            return;
        };
        for (name, pool) in pools {
            let path = join("pools", name);
            match self.read_pool(pool, &path) {
                Some(pool) => {
                    self.pools.insert(name.clone(), pool);
                }
                None => {
                    self.bad_pools.insert(name.clone());
                }
            }
        }
    }

    fn read_pool(&mut self, pool: &Value, path: &str) -> Option<McPool> {
        let Some(pool) = pool.as_object() else {
            self.error(
                ErrorKind::WrongType,
                path,
                "expected a pool object with \"servers\"",
            );
            return None;
        };
        let before = self.errs.len();
        let mut notes = Vec::new();
        let servers_path = join(path, "servers");
        let mut servers = Vec::new();
        match pool.get("servers") {
            Some(Value::Array(items)) if !items.is_empty() => {
                for (i, s) in items.iter().enumerate() {
                    let item_path = index(&servers_path, i);
                    match s.as_str().map(split_server) {
                        Some(Ok((address, extra))) => {
                            if let Some(extra) = extra {
                                notes.push(format!(
                                    "{item_path}: \"{extra}\" after the address (protocol/security) is not carried over; memroute speaks the ASCII protocol to servers"
                                ));
                            }
                            servers.push(address);
                        }
                        Some(Err(message)) => self.error(ErrorKind::Invalid, &item_path, message),
                        None => self.error(
                            ErrorKind::WrongType,
                            &item_path,
                            "expected a \"host:port\" string",
                        ),
                    }
                }
            }
            Some(Value::Array(_)) => self.error(
                ErrorKind::Missing,
                &servers_path,
                "a pool needs at least one server",
            ),
            Some(_) => self.error(
                ErrorKind::WrongType,
                &servers_path,
                "expected an array of \"host:port\" strings",
            ),
            None => self.error(ErrorKind::Missing, &servers_path, "required"),
        }
        let weights = pool
            .get("weights")
            .map(|w| self.read_weights(w, &join(path, "weights")));
        let timeout_ms = match pool.get("server_timeout") {
            None => None,
            Some(v) => match v.as_u64().filter(|&ms| ms > 0) {
                Some(ms) => Some(ms),
                None => {
                    self.error(
                        ErrorKind::OutOfRange,
                        &join(path, "server_timeout"),
                        "expected a positive number of milliseconds",
                    );
                    None
                }
            },
        };
        for (key, value) in pool {
            match key.as_str() {
                "servers" | "weights" | "server_timeout" => {}
                "protocol" if value.as_str() == Some("ascii") => {}
                _ => notes.push(format!(
                    "{}: {} is not carried over",
                    join(path, key),
                    compact(value)
                )),
            }
        }
        (self.errs.len() == before).then_some(McPool {
            servers,
            weights,
            timeout_ms,
            notes,
        })
    }

    /// WeightedCh3 weights: numbers in (0, 1].
    fn read_weights(&mut self, v: &Value, path: &str) -> Vec<f64> {
        let Some(items) = v.as_array() else {
            self.error(
                ErrorKind::WrongType,
                path,
                "expected an array of weights between 0 and 1",
            );
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, w) in items.iter().enumerate() {
            let item_path = index(path, i);
            match w.as_f64() {
                Some(x) if x > 0.0 && x <= 1.0 => out.push(x),
                Some(x) if x <= 0.0 => {
                    self.error(ErrorKind::OutOfRange,
                        &item_path,
                        format!("weight {x} must be > 0 (a server that should get no keys belongs out of the pool; with weight 0 WeightedCh3 still gives it the keys all 32 tries miss)"),
                    );
                }
                Some(x) => self.error(
                    ErrorKind::OutOfRange,
                    &item_path,
                    format!("weight {x} must be at most 1"),
                ),
                None => self.error(
                    ErrorKind::WrongType,
                    &item_path,
                    format!("expected a number, found {}", compact(w)),
                ),
            }
        }
        out
    }

    /// The memroute pool for mcrouter pool `name` placed by `hash`, created on first use.
    /// mcrouter's pools and memroute's pools are not one-to-one: the same servers hashed
    /// two ways are two memroute pools.
    fn pool_target(
        &mut self,
        name: &str,
        hash: Option<(Hash, String)>,
        path: &str,
    ) -> Option<String> {
        let Some(pool) = self.pools.get(name).cloned() else {
            if !self.bad_pools.contains(name) {
                self.error(
                    ErrorKind::UnknownTarget,
                    path,
                    format!("unknown pool \"{name}\""),
                );
            }
            return None;
        };
        let (hash, salt) = match hash {
            Some(spec) => spec,
            None => match &pool.weights {
                Some(w) => (Hash::WeightedCh3(w.clone()), String::new()),
                None => (Hash::Ch3, String::new()),
            },
        };
        let hash = match hash {
            Hash::WeightedCh3(weights) => {
                Hash::WeightedCh3(self.fit_weights(weights, pool.servers.len(), name))
            }
            other => other,
        };
        let key = (name.to_string(), hash.clone(), salt.clone());
        if let Some((_, out)) = self.pool_variants.iter().find(|(k, _)| *k == key) {
            return Some(out.clone());
        }
        let wanted = if self.pool_variants.iter().any(|((n, _, _), _)| n == name) {
            format!("{name}_{}", hash.distribution())
        } else {
            name.to_string()
        };
        let out = self.fresh_name(&wanted, true);
        self.pool_variants.push((key, out.clone()));
        self.out_pools.insert(
            out.clone(),
            OutPool {
                servers: pool.servers.clone(),
                hash,
                salt,
                timeout_ms: pool.timeout_ms,
                notes: pool.notes.clone(),
            },
        );
        Some(out)
    }

    /// mcrouter's rule for a weights list of the wrong length: extra weights are ignored,
    /// missing ones are 0.5. Written out explicitly, with a note.
    fn fit_weights(&mut self, mut weights: Vec<f64>, servers: usize, pool: &str) -> Vec<f64> {
        if weights.len() != servers {
            self.notes.push(format!(
                "pools.{pool}: {} weights for {servers} servers; mcrouter {} (written out here).",
                weights.len(),
                if weights.len() > servers {
                    "ignores the extra ones"
                } else {
                    "gives the missing ones 0.5"
                }
            ));
            weights.resize(servers, 0.5);
        }
        weights
    }

    /// One single-server memroute pool per server of `name` (mcrouter's `Pool|NAME` as a
    /// list of children: one destination per server).
    fn server_targets(&mut self, name: &str, path: &str) -> Option<Vec<String>> {
        let Some(pool) = self.pools.get(name).cloned() else {
            if !self.bad_pools.contains(name) {
                self.error(
                    ErrorKind::UnknownTarget,
                    path,
                    format!("unknown pool \"{name}\""),
                );
            }
            return None;
        };
        let mut out = Vec::new();
        for (i, server) in pool.servers.iter().enumerate() {
            let key = (format!("{name}\u{0}{i}"), Hash::Ch3, String::new());
            if let Some((_, existing)) = self.pool_variants.iter().find(|(k, _)| *k == key) {
                out.push(existing.clone());
                continue;
            }
            let pool_name = self.fresh_name(&format!("{name}_{i}"), true);
            self.pool_variants.push((key, pool_name.clone()));
            self.out_pools.insert(
                pool_name.clone(),
                OutPool {
                    servers: vec![server.clone()],
                    hash: Hash::Ch3,
                    salt: String::new(),
                    timeout_ms: pool.timeout_ms,
                    notes: vec![format!("server {i} of mcrouter pool \"{name}\" ({path})")],
                },
            );
            out.push(pool_name);
        }
        Some(out)
    }

    // ---- named handles and the root ---------------------------------------------------

    fn read_named_handles(&mut self, top: &Map<String, Value>) {
        let Some(handles) = top.get("named_handles") else {
            return;
        };
        let items: Vec<(String, Value, String)> = match handles {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let name = h.get("name").and_then(Value::as_str).unwrap_or_default();
                    (name.to_string(), h.clone(), index("named_handles", i))
                })
                .collect(),
            Value::Object(o) => o
                .iter()
                .map(|(n, h)| (n.clone(), h.clone(), join("named_handles", n)))
                .collect(),
            _ => {
                self.error(
                    ErrorKind::WrongType,
                    "named_handles",
                    "expected an array of named route handles",
                );
                return;
            }
        };
        for (name, handle, path) in items {
            if name.is_empty() {
                self.error(ErrorKind::Missing, &path, "a named handle needs a \"name\"");
            } else {
                self.named.insert(name, (handle, path));
            }
        }
    }

    fn read_root(&mut self, top: &Map<String, Value>) -> Option<String> {
        match (top.get("route"), top.get("routes")) {
            (Some(route), None) => self.route(route, "route", "root"),
            (None, Some(Value::Array(routes))) if !routes.is_empty() => {
                for (i, entry) in routes.iter().enumerate().skip(1) {
                    let aliases = entry.get("aliases").map(compact).unwrap_or_default();
                    self.notes.push(format!(
                        "routes[{i}] (aliases {aliases}) is not imported: memroute has one root route and no routing prefixes; import it from a config with only that entry to serve it from another memroute."
                    ));
                }
                let first = &routes[0];
                if let Some(aliases) = first.get("aliases") {
                    self.notes.push(format!(
                        "routes[0].aliases {}: memroute does not select a route by routing prefix; every request takes this route.",
                        compact(aliases)
                    ));
                }
                match first.get("route") {
                    Some(route) => self.route(route, "routes[0].route", "root"),
                    None => {
                        self.error(ErrorKind::Missing, "routes[0].route", "required");
                        None
                    }
                }
            }
            (None, Some(_)) => {
                self.error(
                    ErrorKind::WrongType,
                    "routes",
                    "expected a non-empty array of {\"aliases\", \"route\"}",
                );
                None
            }
            (Some(_), Some(_)) => {
                self.error(
                    ErrorKind::Conflict,
                    "routes",
                    "write either \"route\" or \"routes\", not both",
                );
                None
            }
            (None, None) => {
                self.error(ErrorKind::Missing, "route", "required (or \"routes\")");
                None
            }
        }
    }

    fn note_top_level_keys(&mut self, top: &Map<String, Value>) {
        for (key, value) in top {
            if !matches!(key.as_str(), "pools" | "route" | "routes" | "named_handles") {
                self.notes
                    .push(format!("{key}: {} is not carried over.", compact(value)));
            }
        }
    }

    // ---- routes ---------------------------------------------------------------------

    /// Translates the route at `path`; returns the memroute target (pool or route name).
    /// `hint` names an anonymous route.
    fn route(&mut self, v: &Value, path: &str, hint: &str) -> Option<String> {
        match v {
            Value::String(s) => self.route_string(s, path, hint),
            Value::Object(o) => {
                let Some(kind) = o.get("type").and_then(Value::as_str) else {
                    self.error(
                        ErrorKind::Missing,
                        &join(path, "type"),
                        "required (the route handle's name)",
                    );
                    return None;
                };
                match o.get("name").and_then(Value::as_str) {
                    // An inline named handle: translated once, under its name.
                    Some(name) => {
                        if let Some(done) = self.named_done.get(name) {
                            return Some(done.clone());
                        }
                        let target = self.route_object(kind, o, path, name)?;
                        self.named_done.insert(name.to_string(), target.clone());
                        Some(target)
                    }
                    None => self.route_object(kind, o, path, hint),
                }
            }
            Value::Array(_) => {
                self.error(
                    ErrorKind::WrongType,
                    path,
                    "expected one route here, found a list",
                );
                None
            }
            other => {
                self.error(
                    ErrorKind::WrongType,
                    path,
                    format!("expected a route, found {}", compact(other)),
                );
                None
            }
        }
    }

    fn route_string(&mut self, s: &str, path: &str, hint: &str) -> Option<String> {
        if let Some(target) = self.named_done.get(s) {
            return Some(target.clone());
        }
        if let Some((handle, path_of_def)) = self.named.get(s).cloned() {
            if let Some(at) = self.resolving.iter().position(|n| n == s) {
                let chain = self.resolving[at..].join(" -> ");
                self.error(
                    ErrorKind::Circle,
                    path,
                    format!("named handle loop: {chain} -> {s}"),
                );
                return None;
            }
            self.resolving.push(s.to_string());
            let target = match handle.as_object() {
                Some(o) => match o.get("type").and_then(Value::as_str) {
                    Some(kind) => self.route_object(kind, o, &path_of_def, s),
                    None => {
                        self.error(ErrorKind::Missing, &join(&path_of_def, "type"), "required");
                        None
                    }
                },
                None => self.route(&handle, &path_of_def, s),
            };
            self.resolving.pop();
            if let Some(t) = &target {
                self.named_done.insert(s.to_string(), t.clone());
            }
            return target;
        }
        let (kind, arg) = match s.split_once('|') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        match (kind, arg) {
            ("PoolRoute" | "Pool", Some(pool)) => self.pool_target(pool, None, path),
            ("HashRoute", Some(rest)) => match rest.strip_prefix("Pool|") {
                Some(pool) => self.pool_target(pool, None, path),
                None => {
                    self.error(
                        ErrorKind::Invalid,
                        path,
                        format!("cannot read \"{s}\" (expected HashRoute|Pool|NAME)"),
                    );
                    None
                }
            },
            ("NullRoute", None) => Some(self.simple_route(hint, "null", Vec::new())),
            ("ErrorRoute", message) => {
                let lines = message
                    .map(|m| vec![format!("message = {}", quote(&one_line(m)))])
                    .unwrap_or_default();
                Some(self.simple_route(hint, "error", lines))
            }
            _ if HANDLES.contains(&kind) => {
                self.error(
                    ErrorKind::Invalid,
                    path,
                    format!("\"{s}\": this handle needs its settings (write it as an object)"),
                );
                None
            }
            _ => {
                self.error(
                    ErrorKind::UnknownTarget,
                    path,
                    format!("unknown route handle or named handle \"{s}\""),
                );
                None
            }
        }
    }

    fn simple_route(&mut self, hint: &str, kind: &str, mut lines: Vec<String>) -> String {
        let name = self.fresh_name(hint, false);
        lines.insert(0, format!("type = \"{kind}\""));
        self.out_routes.insert(
            name.clone(),
            OutRoute {
                lines,
                notes: Vec::new(),
            },
        );
        name
    }

    /// Children of an All*/Failover/Random route: a list of routes, or `"Pool|NAME"` (one
    /// destination per server of the pool).
    fn children(&mut self, o: &Map<String, Value>, path: &str, hint: &str) -> Option<Vec<String>> {
        let children_path = join(path, "children");
        match o.get("children") {
            Some(Value::String(s)) if s.starts_with("Pool|") => {
                self.server_targets(&s["Pool|".len()..], &children_path)
            }
            Some(Value::Array(items)) if !items.is_empty() => {
                let mut out = Vec::new();
                let mut ok = true;
                for (i, child) in items.iter().enumerate() {
                    match self.route(child, &index(&children_path, i), &format!("{hint}_{i}")) {
                        Some(t) => out.push(t),
                        None => ok = false,
                    }
                }
                let mut seen = HashSet::new();
                for (i, t) in out.iter().enumerate() {
                    if !seen.insert(t) {
                        self.error(
                            ErrorKind::Conflict,
                            &index(&children_path, i),
                            format!(
                                "the same target twice (\"{t}\"); memroute needs distinct children"
                            ),
                        );
                        ok = false;
                    }
                }
                ok.then_some(out)
            }
            Some(Value::Array(_)) => {
                self.error(
                    ErrorKind::Missing,
                    &children_path,
                    "needs at least one child",
                );
                None
            }
            Some(other) => {
                self.error(
                    ErrorKind::WrongType,
                    &children_path,
                    format!(
                        "expected a list of routes or \"Pool|NAME\", found {}",
                        compact(other)
                    ),
                );
                None
            }
            None => {
                self.error(ErrorKind::Missing, &children_path, "required");
                None
            }
        }
    }

    /// A route handle written as an object, by its `type`.
    fn route_object(
        &mut self,
        kind: &str,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Option<String> {
        let mut notes = Vec::new();
        let (built, known): (Built, &[&str]) = match kind {
            // These may wrap their target in shadow routes and note their own keys.
            "PoolRoute" => return self.pool_route(o, path, hint),
            "HashRoute" => return self.hash_route(o, path, hint),
            "ShadowRoute" => return self.shadow_route(o, path, hint),
            "PrefixSelectorRoute" => (
                self.prefix_selector(o, path, hint, &mut notes)?,
                &["type", "name", "policies", "wildcard"],
            ),
            "OperationSelectorRoute" => (
                self.operation_selector(o, path, hint, &mut notes)?,
                &["type", "name", "operation_policies", "default_policy"],
            ),
            "AllSyncRoute" | "AllAsyncRoute" | "AllInitialRoute" | "AllMajorityRoute"
            | "AllFastestRoute" => (
                self.all_route(kind, o, path, hint, &mut notes)?,
                &["type", "name", "children"],
            ),
            "FailoverRoute"
            | "MissFailoverRoute"
            | "FailoverWithExptimeRoute"
            | "LatestRoute"
            | "RandomRoute" => (
                self.list_route(kind, o, path, hint, &mut notes)?,
                &["type", "name", "children"],
            ),
            "WarmUpRoute" => (
                self.warm_up_route(o, path, hint)?,
                &["type", "name", "cold", "warm", "exptime"],
            ),
            "NullRoute" => (
                Built::Route(vec!["type = \"null\"".to_string()]),
                &["type", "name"],
            ),
            "ErrorRoute" => {
                let mut lines = vec!["type = \"error\"".to_string()];
                if let Some(m) = o.get("response").and_then(Value::as_str) {
                    lines.push(format!("message = {}", quote(&one_line(m))));
                }
                (Built::Route(lines), &["type", "name", "response"])
            }
            other => {
                let message = if other.ends_with("Route") {
                    format!("route handle \"{other}\" has no memroute equivalent")
                } else {
                    format!("unknown route handle \"{other}\"")
                };
                self.error(ErrorKind::Invalid, &join(path, "type"), message);
                return None;
            }
        };
        note_unknown_keys(o, known, path, &mut notes);
        match built {
            Built::Target(target) => {
                // Nothing of its own to write (one child, no prefixes): its notes go to the
                // top of the file.
                self.notes.extend(notes);
                Some(target)
            }
            Built::Route(lines) => {
                let name = self.fresh_name(hint, false);
                self.out_routes
                    .insert(name.clone(), OutRoute { lines, notes });
                Some(name)
            }
        }
    }

    /// `PoolRoute`: the pool, hashed as `hash` says (or by the pool's weights, or Ch3).
    fn pool_route(&mut self, o: &Map<String, Value>, path: &str, hint: &str) -> Option<String> {
        let mut notes = Vec::new();
        let hash = match o.get("hash") {
            Some(h) => Some(self.hash_spec(h, &join(path, "hash"), &mut notes)?),
            None => None,
        };
        let pool_path = join(path, "pool");
        let pool = match o.get("pool") {
            Some(Value::String(p)) => self.pool_target(p, hash, &pool_path)?,
            Some(Value::Object(inline)) => {
                let Some(name) = inline.get("name").and_then(Value::as_str) else {
                    self.error(
                        ErrorKind::Missing,
                        &pool_path,
                        "an inline pool needs a \"name\"",
                    );
                    return None;
                };
                let read = self.read_pool(&Value::Object(inline.clone()), &pool_path)?;
                self.pools.insert(name.to_string(), read);
                self.pool_target(name, hash, &pool_path)?
            }
            _ => {
                self.error(ErrorKind::Missing, &pool_path, "required (a pool name)");
                return None;
            }
        };
        note_unknown_keys(
            o,
            &["type", "name", "pool", "hash", "shadows"],
            path,
            &mut notes,
        );
        self.notes.extend(notes);
        self.with_shadows(pool, o, path, hint)
    }

    /// `HashRoute` over `"Pool|NAME"`: the same as a PoolRoute of that pool. memroute hashes
    /// only over a pool's servers, so a HashRoute over other routes is an error.
    fn hash_route(&mut self, o: &Map<String, Value>, path: &str, hint: &str) -> Option<String> {
        let mut notes = Vec::new();
        let mut spec = Map::new();
        for k in ["hash_func", "salt", "weights"] {
            if let Some(v) = o.get(k) {
                spec.insert(k.to_string(), v.clone());
            }
        }
        let hash = if spec.is_empty() {
            None
        } else {
            Some(self.hash_spec(&Value::Object(spec), path, &mut notes)?)
        };
        let children = o.get("children").and_then(Value::as_str);
        let Some(pool) = children.and_then(|s| s.strip_prefix("Pool|")) else {
            self.error(ErrorKind::Invalid,
                &join(path, "children"),
                "memroute hashes over a pool's servers only: expected \"Pool|NAME\" (a HashRoute over other routes has no memroute equivalent)",
            );
            return None;
        };
        let pool = self.pool_target(pool, hash, &join(path, "children"))?;
        let known = [
            "type",
            "name",
            "children",
            "hash_func",
            "salt",
            "weights",
            "shadows",
        ];
        note_unknown_keys(o, &known, path, &mut notes);
        self.notes.extend(notes);
        self.with_shadows(pool, o, path, hint)
    }

    /// `ShadowRoute`: its `children` (or `default`) answer; `shadows` get copies.
    fn shadow_route(&mut self, o: &Map<String, Value>, path: &str, hint: &str) -> Option<String> {
        let key = if o.contains_key("default") {
            "default"
        } else {
            "children"
        };
        let Some(primary) = o.get(key) else {
            self.error(
                ErrorKind::Missing,
                &join(path, "children"),
                "required (the route that answers)",
            );
            return None;
        };
        let primary = self.route(primary, &join(path, key), &format!("{hint}_primary"))?;
        let mut notes = Vec::new();
        note_unknown_keys(
            o,
            &["type", "name", "children", "default", "shadows"],
            path,
            &mut notes,
        );
        self.notes.extend(notes);
        self.with_shadows(primary, o, path, hint)
    }

    /// `PrefixSelectorRoute` -> `type = "prefix"`.
    fn prefix_selector(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let mut prefixes = Vec::new();
        let policies_path = join(path, "policies");
        match o.get("policies") {
            Some(Value::Object(policies)) => {
                for (prefix, route) in policies {
                    let p = join(&policies_path, prefix);
                    if prefix.is_empty() {
                        self.error(ErrorKind::Invalid, &p, "an empty prefix; use \"wildcard\"");
                        continue;
                    }
                    if let Some(t) = self.route(route, &p, &format!("{hint}_{prefix}")) {
                        prefixes.push(format!("{} = {}", quote(prefix), quote(&t)));
                    }
                }
            }
            None => {}
            Some(_) => self.error(
                ErrorKind::WrongType,
                &policies_path,
                "expected an object of prefix -> route",
            ),
        }
        let default = self.default_or_error(o, "wildcard", path, hint, "key", notes)?;
        if prefixes.is_empty() {
            notes.push(format!(
                "{path}: no prefix policies; every key takes the wildcard."
            ));
            return Some(Built::Target(default));
        }
        Some(Built::Route(vec![
            "type = \"prefix\"".to_string(),
            format!("prefixes = {{ {} }}", prefixes.join(", ")),
            format!("default = {}", quote(&default)),
        ]))
    }

    /// `OperationSelectorRoute` -> `type = "operation"`.
    fn operation_selector(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let mut lines = vec!["type = \"operation\"".to_string()];
        let policies_path = join(path, "operation_policies");
        match o.get("operation_policies") {
            None => {}
            Some(Value::Object(policies)) => {
                for (op, route) in policies {
                    let p = join(&policies_path, op);
                    let Some((_, ours)) = OPERATIONS.iter().find(|(mc, _)| mc == op) else {
                        notes.push(format!(
                            "{p}: operation \"{op}\" has no memroute equivalent; it takes the default."
                        ));
                        continue;
                    };
                    if let Some(t) = self.route(route, &p, &format!("{hint}_{ours}")) {
                        lines.push(format!("{ours} = {}", quote(&t)));
                    }
                }
            }
            Some(_) => {
                self.error(
                    ErrorKind::WrongType,
                    &policies_path,
                    "expected an object of operation -> route",
                );
                return None;
            }
        }
        let default = self.default_or_error(o, "default_policy", path, hint, "operation", notes)?;
        if lines.len() == 1 {
            return Some(Built::Target(default));
        }
        lines.push(format!("default = {}", quote(&default)));
        Some(Built::Route(lines))
    }

    /// The route under `key` (a selector's default), or, when there is none, an error route
    /// (with a note): what the request would otherwise get is not known here.
    fn default_or_error(
        &mut self,
        o: &Map<String, Value>,
        key: &str,
        path: &str,
        hint: &str,
        what: &str,
        notes: &mut Vec<String>,
    ) -> Option<String> {
        match o.get(key) {
            Some(route) => self.route(route, &join(path, key), &format!("{hint}_{key}")),
            None => {
                notes.push(format!(
                    "{path}: no \"{key}\"; a request whose {what} matches no policy gets an error."
                ));
                Some(self.simple_route(
                    &format!("{hint}_no_match"),
                    "error",
                    vec![format!("message = \"no route for this {what}\"")],
                ))
            }
        }
    }

    /// `AllSyncRoute` ... `AllFastestRoute` -> `type = "replicated"`.
    fn all_route(
        &mut self,
        kind: &str,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let children = self.children(o, path, hint)?;
        let (writes, reads, difference) = match kind {
            "AllSyncRoute" => ("all-sync", "failover", "mcrouter also sent reads to every child and answered with the worst reply; memroute reads from the first child, then the next on an error"),
            "AllAsyncRoute" => ("all-async", "failover", "mcrouter answered reads at once as misses; memroute reads from the first child, then the next on an error"),
            "AllInitialRoute" => ("all-initial", "first", ""),
            "AllMajorityRoute" => ("all-majority", "failover", "mcrouter also sent reads to every child and answered with the majority's reply; memroute reads from the first child, then the next on an error"),
            _ => ("all-initial", "fastest", "mcrouter answered writes with the first reply that was not an error; memroute answers with the first child's reply"),
        };
        if !difference.is_empty() {
            notes.push(format!("{path}: {kind}: {difference}."));
        }
        Some(Built::Route(vec![
            "type = \"replicated\"".to_string(),
            format!("children = {}", list(&children)),
            format!("writes = \"{writes}\""),
            format!("reads = \"{reads}\""),
        ]))
    }

    /// Failover-like handles and `RandomRoute`: a list of children (one child is just that
    /// child).
    fn list_route(
        &mut self,
        kind: &str,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let children = self.children(o, path, hint)?;
        match kind {
            "LatestRoute" => notes.push(format!("{path}: LatestRoute picked `failover_count` children at random per proxy and failed over among them; memroute fails over among all of them in order.")),
            "FailoverWithExptimeRoute" => notes.push(format!("{path}: FailoverWithExptimeRoute's failover exptime is not carried over; failover writes keep the client's exptime.")),
            _ => {}
        }
        if let [only] = children.as_slice() {
            return Some(Built::Target(only.clone()));
        }
        let kind_line = if kind == "RandomRoute" {
            "type = \"random\""
        } else {
            "type = \"failover\""
        };
        let mut lines = vec![
            kind_line.to_string(),
            format!("children = {}", list(&children)),
        ];
        if kind == "MissFailoverRoute" {
            lines.push("on = \"error-or-miss\"".to_string());
        }
        Some(Built::Route(lines))
    }

    /// `WarmUpRoute` -> `type = "warm-up"` (`exptime` is `ttl`).
    fn warm_up_route(&mut self, o: &Map<String, Value>, path: &str, hint: &str) -> Option<Built> {
        let side = |me: &mut Self, key: &str| match o.get(key) {
            Some(r) => me.route(r, &join(path, key), &format!("{hint}_{key}")),
            None => {
                me.error(ErrorKind::Missing, &join(path, key), "required");
                None
            }
        };
        let (cold, warm) = (side(self, "cold"), side(self, "warm"));
        let (cold, warm) = (cold?, warm?);
        if cold == warm {
            self.error(
                ErrorKind::Conflict,
                path,
                "cold and warm are the same target",
            );
            return None;
        }
        let mut lines = vec![
            "type = \"warm-up\"".to_string(),
            format!("cold = {}", quote(&cold)),
            format!("warm = {}", quote(&warm)),
        ];
        if let Some(v) = o.get("exptime") {
            let Some(ttl) = v
                .as_u64()
                .filter(|&t| t <= memroute_protocol::MAX_RELATIVE_EXPTIME)
            else {
                self.error(
                    ErrorKind::OutOfRange,
                    &join(path, "exptime"),
                    "expected seconds, at most 30 days",
                );
                return None;
            };
            lines.push(format!("ttl = {ttl}"));
        }
        Some(Built::Route(lines))
    }

    /// mcrouter's `shadows` on PoolRoute, HashRoute and ShadowRoute: each becomes a
    /// memroute shadow route around the previous target, with the same key fraction range.
    fn with_shadows(
        &mut self,
        mut target: String,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Option<String> {
        let Some(shadows) = o.get("shadows") else {
            return Some(target);
        };
        let shadows_path = join(path, "shadows");
        let Some(shadows) = shadows.as_array() else {
            self.error(
                ErrorKind::WrongType,
                &shadows_path,
                "expected an array of shadow settings",
            );
            return None;
        };
        for (i, shadow) in shadows.iter().enumerate() {
            let p = index(&shadows_path, i);
            let Some(s) = shadow.as_object() else {
                self.error(
                    ErrorKind::WrongType,
                    &p,
                    "expected a shadow object with \"target\"",
                );
                return None;
            };
            let Some(t) = s.get("target") else {
                self.error(ErrorKind::Missing, &join(&p, "target"), "required");
                return None;
            };
            let shadow_target =
                self.route(t, &join(&p, "target"), &format!("{hint}_shadow_{i}"))?;
            let range = match s.get("key_fraction_range") {
                None => [0.0, 1.0],
                Some(r) => match r
                    .as_array()
                    .map(|a| a.iter().map(Value::as_f64).collect::<Vec<_>>())
                    .as_deref()
                {
                    Some([Some(a), Some(b)]) if 0.0 <= *a && a <= b && *b <= 1.0 => [*a, *b],
                    _ => {
                        self.error(
                            ErrorKind::Invalid,
                            &join(&p, "key_fraction_range"),
                            "expected [a, b] with 0 <= a <= b <= 1",
                        );
                        return None;
                    }
                },
            };
            let mut route_notes = vec![format!(
                "{p}: memroute picks the shadowed keys by xxh3 of the key, so the same fraction but not the same keys as mcrouter are shadowed."
            )];
            for (key, value) in s {
                if !matches!(key.as_str(), "target" | "key_fraction_range") {
                    route_notes.push(format!(
                        "{}: {} is not carried over.",
                        join(&p, key),
                        compact(value)
                    ));
                }
            }
            if shadow_target == target {
                self.error(
                    ErrorKind::Conflict,
                    &join(&p, "target"),
                    "shadows the route to itself",
                );
                return None;
            }
            let name = self.fresh_name(&format!("{hint}_shadowed_{i}"), false);
            self.out_routes.insert(
                name.clone(),
                OutRoute {
                    lines: vec![
                        "type = \"shadow\"".to_string(),
                        format!("primary = {}", quote(&target)),
                        format!("shadow = {}", quote(&shadow_target)),
                        format!("key_range = [{}, {}]", number(range[0]), number(range[1])),
                    ],
                    notes: route_notes,
                },
            );
            target = name;
        }
        Some(target)
    }

    /// A hash spec: `"Ch3"`, `"WeightedCh3"`, `"Crc32"`, or an object with `hash_func`,
    /// `weights` and `salt`; with the salt (empty: none).
    fn hash_spec(
        &mut self,
        v: &Value,
        path: &str,
        notes: &mut Vec<String>,
    ) -> Option<(Hash, String)> {
        let mut salt = String::new();
        let (func, weights, func_path) = match v {
            Value::String(s) => (s.as_str(), None, path.to_string()),
            Value::Object(o) => {
                match o.get("salt") {
                    None => {}
                    Some(Value::String(s)) => salt = s.clone(),
                    Some(other) => {
                        self.error(
                            ErrorKind::WrongType,
                            &join(path, "salt"),
                            format!("expected a string, found {}", compact(other)),
                        );
                        return None;
                    }
                }
                for (k, val) in o {
                    if !matches!(k.as_str(), "hash_func" | "weights" | "salt") {
                        notes.push(format!(
                            "{}: {} is not carried over.",
                            join(path, k),
                            compact(val)
                        ));
                    }
                }
                (
                    o.get("hash_func").and_then(Value::as_str).unwrap_or("Ch3"),
                    o.get("weights"),
                    join(path, "hash_func"),
                )
            }
            other => {
                self.error(
                    ErrorKind::WrongType,
                    path,
                    format!(
                        "expected a hash function name or object, found {}",
                        compact(other)
                    ),
                );
                return None;
            }
        };
        let hash = match func {
            "Ch3" => Some(Hash::Ch3),
            "Crc32" => Some(Hash::Crc32),
            "WeightedCh3" => match weights {
                Some(w) => {
                    let before = self.errs.len();
                    let w = self.read_weights(w, &join(path, "weights"));
                    (self.errs.len() == before).then_some(Hash::WeightedCh3(w))
                }
                None => {
                    self.error(
                        ErrorKind::Missing,
                        &join(path, "weights"),
                        "required by WeightedCh3",
                    );
                    None
                }
            },
            other => {
                self.error(ErrorKind::Invalid, &func_path, format!("hash function \"{other}\" has no memroute equivalent (expected Ch3, WeightedCh3 or Crc32)"));
                None
            }
        };
        hash.map(|h| (h, salt))
    }

    // ---- output ---------------------------------------------------------------------

    fn render(&self, root: &str) -> String {
        let mut out = String::new();
        out.push_str("# Generated by `memroute import-mcrouter` from an mcrouter JSON config.\n");
        out.push_str(
            "# Keys are placed on the same servers as mcrouter placed them: same servers in the\n",
        );
        out.push_str("# same order, with mcrouter's Ch3 / WeightedCh3 / Crc32 (distribution ch3 / wch3 / crc32).\n");
        out.push_str(
            "# Lines marked NOTE say what mcrouter did that this file does differently.\n",
        );
        out.push_str("#\n");
        push_note(
            &mut out,
            "mcrouter's listen port is a command-line flag (-p); set proxy.listen to it.",
        );
        for note in &self.notes {
            push_note(&mut out, note);
        }
        out.push_str("\n[proxy]\n");
        out.push_str(&format!("route = {}\n", quote(root)));
        for (name, pool) in &self.out_pools {
            out.push('\n');
            for note in &pool.notes {
                push_note(&mut out, note);
            }
            out.push_str(&format!("[pools.{}]\n", toml_key(name)));
            out.push_str(&format!("servers = {}\n", list(&pool.servers)));
            out.push_str(&format!(
                "distribution = \"{}\"\n",
                pool.hash.distribution()
            ));
            if let Hash::WeightedCh3(weights) = &pool.hash {
                let ws: Vec<String> = weights.iter().map(|w| number(*w)).collect();
                out.push_str(&format!("weights = [{}]\n", ws.join(", ")));
            }
            if !pool.salt.is_empty() {
                out.push_str(&format!("salt = {}\n", quote(&pool.salt)));
            }
            if let Some(ms) = pool.timeout_ms {
                out.push_str(&format!("timeout = \"{ms}ms\"\n"));
            }
        }
        for (name, route) in &self.out_routes {
            out.push('\n');
            for note in &route.notes {
                push_note(&mut out, note);
            }
            out.push_str(&format!("[routes.{}]\n", toml_key(name)));
            for line in &route.lines {
                out.push_str(line);
                out.push('\n');
            }
        }
        super::push_admin(&mut out, "127.0.0.1:9150", super::MCROUTER_ADMIN_NOTE);
        out
    }
}

/// `host:port` and whatever mcrouter allows after it (`:protocol:security:...`).
fn split_server(s: &str) -> Result<(String, Option<String>), String> {
    let (address, rest) = if let Some(after) = s.strip_prefix('[') {
        let Some(end) = after.find(']') else {
            return Err(format!("invalid address \"{s}\""));
        };
        let port_and_rest = &after[end + 1..];
        let port_and_rest = port_and_rest.strip_prefix(':').unwrap_or(port_and_rest);
        let (port, rest) = match port_and_rest.split_once(':') {
            Some((p, r)) => (p, Some(r)),
            None => (port_and_rest, None),
        };
        (format!("[{}]:{port}", &after[..end]), rest)
    } else {
        let mut parts = s.splitn(3, ':');
        let host = parts.next().unwrap_or_default();
        let port = parts.next().unwrap_or_default();
        (format!("{host}:{port}"), parts.next())
    };
    check_host_port(&address)?;
    let extra = rest.filter(|r| !matches!(*r, "ascii" | "ascii:plain" | "plain" | ""));
    Ok((address, extra.map(str::to_string)))
}

/// `@name(a,b)` -> ("name", ["a", "b"]); `@name` -> ("name", []).
fn parse_call(s: &str) -> Option<(&str, Vec<&str>)> {
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
fn substitute(v: Value, params: &HashMap<String, Value>) -> Value {
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

fn sorted_keys<'a>(keys: impl Iterator<Item = &'a String>) -> String {
    let mut keys: Vec<&String> = keys.collect();
    keys.sort();
    keys.iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A JSON value on one line, cut short if long.
fn compact(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 80 {
        let cut: String = text.chars().take(77).collect();
        format!("{cut}...")
    } else {
        text
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| quote(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// A weight or fraction as TOML: always with a decimal point or exponent.
fn number(x: f64) -> String {
    toml::Value::Float(x).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(json: &str) -> (String, crate::Config) {
        let text = import(json).unwrap_or_else(|e| panic!("import failed:\n{e}"));
        let config = crate::parse(&text).expect("output parses");
        (text, config)
    }

    fn err(json: &str) -> Vec<String> {
        match import(json) {
            Ok(text) => panic!("expected an error, got:\n{text}"),
            Err(ConfigErrors(es)) => es.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn pool_route_keeps_servers_in_order_with_ch3() {
        let (text, config) = ok(r#"{
            "pools": {"A": {"servers": ["10.0.0.2:11211", "10.0.0.1:11211:ascii:plain"]}},
            "route": "PoolRoute|A"
        }"#);
        let pool = &config.pools["A"];
        assert_eq!(pool.distribution.as_str(), "ch3");
        let addresses: Vec<&str> = pool.servers.iter().map(|s| s.address.as_str()).collect();
        assert_eq!(addresses, ["10.0.0.2:11211", "10.0.0.1:11211"]);
        assert_eq!(config.proxy.route, "A");
        assert!(text.contains("# NOTE: mcrouter's listen port"), "{text}");
    }

    #[test]
    fn weights_pick_wch3_and_are_fitted_by_mcrouters_rule() {
        let (text, config) = ok(r#"{
            "pools": {"A": {"servers": ["h1:1", "h2:2", "h3:3"], "weights": [1, 0.5]}},
            "route": {"type": "PoolRoute", "pool": "A"}
        }"#);
        assert_eq!(config.pools["A"].distribution.as_str(), "wch3");
        assert_eq!(config.pools["A"].weights, [1.0, 0.5, 0.5]);
        assert!(text.contains("gives the missing ones 0.5"), "{text}");
    }

    #[test]
    fn salt_is_carried_over() {
        let (_, config) = ok(r#"{
            "pools": {"A": {"servers": ["h1:1", "h2:2"]}},
            "route": {"type": "HashRoute", "children": "Pool|A", "hash_func": "Crc32", "salt": "v2"}
        }"#);
        assert_eq!(config.pools["A"].salt, "v2");
        assert_eq!(config.pools["A"].distribution.as_str(), "crc32");
    }

    #[test]
    fn one_pool_hashed_two_ways_is_two_pools() {
        let (_, config) = ok(r#"{
            "pools": {"A": {"servers": ["h1:1", "h2:2"]}},
            "route": {"type": "OperationSelectorRoute",
                      "operation_policies": {"get": {"type": "PoolRoute", "pool": "A", "hash": "Crc32"}},
                      "default_policy": "PoolRoute|A"}
        }"#);
        assert_eq!(config.pools["A"].distribution.as_str(), "crc32");
        assert_eq!(config.pools["A_ch3"].distribution.as_str(), "ch3");
    }

    #[test]
    fn every_route_handle_maps() {
        let (text, config) = ok(r#"{
            "pools": {
                "A": {"servers": ["h1:1", "h2:2"]},
                "B": {"servers": ["h3:3"]},
                "C": {"servers": ["h4:4", "h5:5"]}
            },
            "named_handles": [
                {"type": "AllSyncRoute", "name": "both", "children": ["PoolRoute|A", "PoolRoute|B"]}
            ],
            "route": {
                "type": "PrefixSelectorRoute",
                "policies": {
                    "a:": {"type": "AllAsyncRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                    "i:": {"type": "AllInitialRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                    "m:": {"type": "AllMajorityRoute", "children": ["PoolRoute|A", "PoolRoute|B", "PoolRoute|C"]},
                    "f:": {"type": "AllFastestRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                    "s:": "both",
                    "fo:": {"type": "FailoverRoute", "children": "Pool|C"},
                    "mf:": {"type": "MissFailoverRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                    "w:": {"type": "WarmUpRoute", "cold": "PoolRoute|C", "warm": "PoolRoute|A", "exptime": 60},
                    "sh:": {"type": "PoolRoute", "pool": "A",
                            "shadows": [{"target": "PoolRoute|C", "key_fraction_range": [0, 0.1]}]},
                    "r:": {"type": "RandomRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                    "l:": {"type": "LatestRoute", "children": ["PoolRoute|A", "PoolRoute|B"], "failover_count": 2},
                    "n:": "NullRoute",
                    "e:": {"type": "ErrorRoute", "response": "go away"},
                    "h:": {"type": "HashRoute", "children": "Pool|C", "hash_func": "Crc32"}
                },
                "wildcard": "PoolRoute|A"
            }
        }"#);
        let kinds: std::collections::BTreeSet<&str> = config
            .routes
            .values()
            .map(|r| match r {
                crate::RouteConfig::Prefix { .. } => "prefix",
                crate::RouteConfig::Operation { .. } => "operation",
                crate::RouteConfig::Shadow { .. } => "shadow",
                crate::RouteConfig::Replicated { .. } => "replicated",
                crate::RouteConfig::Failover { .. } => "failover",
                crate::RouteConfig::WarmUp { .. } => "warm-up",
                crate::RouteConfig::Random { .. } => "random",
                crate::RouteConfig::Null => "null",
                crate::RouteConfig::Error { .. } => "error",
            })
            .collect();
        assert_eq!(
            kinds.into_iter().collect::<Vec<_>>(),
            [
                "error",
                "failover",
                "null",
                "prefix",
                "random",
                "replicated",
                "shadow",
                "warm-up"
            ]
        );
        assert!(config.routes.contains_key("both"), "{text}");
        // Pool|C as failover children: one pool per server, in order.
        assert_eq!(config.pools["C_0"].servers[0].address, "h4:4");
        assert_eq!(config.pools["C_1"].servers[0].address, "h5:5");
        assert!(text.contains("failover_count"), "{text}");
        assert!(text.contains("on = \"error-or-miss\""), "{text}");
        assert!(text.contains("key_range = [0.0, 0.1]"), "{text}");
    }

    #[test]
    fn plain_macros_expand() {
        let (_, config) = ok(r#"{
            "macros": {
                "pool_of": {"type": "macroDef", "params": ["p"], "result": {"type": "PoolRoute", "pool": "%p%"}},
                "fail": {"type": "macroDef", "params": ["a", {"name": "b", "default": "B"}],
                         "result": {"type": "FailoverRoute", "children": ["@pool_of(%a%)", "@pool_of(%b%)"]}}
            },
            "pools": {"A": {"servers": ["h1:1"]}, "B": {"servers": ["h2:2"]}},
            "route": {"type": "fail", "a": "A"}
        }"#);
        assert!(matches!(
            &config.routes[&config.proxy.route],
            crate::RouteConfig::Failover { children, .. } if children == &["A", "B"]
        ));
    }

    #[test]
    fn bad_input_is_an_error_with_its_json_path() {
        assert_eq!(
            err("{\"pools\": "),
            ["line 1, column 10: invalid JSON: EOF while parsing a value at line 1 column 10"]
        );
        assert_eq!(
            err(r#"{"pools": {"A": {"servers": ["h:1"]}}, "route": {"type": "FancyRoute"}}"#),
            ["route.type: route handle \"FancyRoute\" has no memroute equivalent"]
        );
        assert_eq!(
            err(r#"{"pools": {"A": {"servers": ["h:1", "h:2"], "weights": [0, -1, "x"]}}, "route": "PoolRoute|A"}"#),
            [
                "pools.A.weights[0]: weight 0 must be > 0 (a server that should get no keys belongs out of the pool; with weight 0 WeightedCh3 still gives it the keys all 32 tries miss)",
                "pools.A.weights[1]: weight -1 must be > 0 (a server that should get no keys belongs out of the pool; with weight 0 WeightedCh3 still gives it the keys all 32 tries miss)",
                "pools.A.weights[2]: expected a number, found \"x\"",
            ]
        );
        assert_eq!(
            err(r#"{"pools": {"A": {"servers": ["h:1"]}},
                    "named_handles": [{"name": "x", "type": "FailoverRoute", "children": ["y", "PoolRoute|A"]},
                                      {"name": "y", "type": "FailoverRoute", "children": ["x"]}],
                    "route": "x"}"#),
            ["named_handles[1].children[0]: named handle loop: x -> y -> x"]
        );
        assert_eq!(
            err(r#"{"pools": {}, "route": "nothing"}"#),
            ["route: unknown route handle or named handle \"nothing\""]
        );
        assert_eq!(
            err(
                r#"{"pools": {"A": {"servers": ["h:1"]}}, "route": {"type": "PoolRoute", "pool": "A", "hash": {"hash_func": "Ch3", "salt": 7}}}"#
            ),
            ["route.hash.salt: expected a string, found 7"]
        );
        assert_eq!(err("[1]"), ["expected a JSON object (an mcrouter config)"]);
        assert_eq!(
            err(r#"{"macros": {"m": {"type": "macroDef", "result": "@m"}}, "route": "@m"}"#),
            ["route: macro expansion too deep (a macro that calls itself?)"]
        );
        assert_eq!(
            err(r#"{"route": "@merge(a,b)"}"#),
            ["route: macro \"@merge\" is not a plain macro defined in \"macros\" (mcrouter's built-in macros compute; write the result out)"]
        );
    }

    /// Every prefix of a realistic config, and the config with each byte replaced by each
    /// of a few troublesome ones: import answers (Ok or errors) and never panics.
    #[test]
    fn never_panics_on_truncated_or_mangled_configs() {
        let config = r#"{"macros": {"m": {"type": "macroDef", "params": ["p"], "result": "PoolRoute|%p%"}},
            "pools": {"A": {"servers": ["h1:1", "[::1]:2"], "weights": [1, 0.5]}, "B": {"servers": ["h3:3"]}},
            "named_handles": [{"name": "n", "type": "FailoverRoute", "children": ["@m(A)", "Pool|B"]}],
            "route": {"type": "PrefixSelectorRoute", "policies": {"a": "n", "b": {"type": "WarmUpRoute", "cold": "PoolRoute|B", "warm": "PoolRoute|A", "exptime": 5}},
                      "wildcard": {"type": "PoolRoute", "pool": "A", "hash": {"hash_func": "WeightedCh3", "weights": [1]},
                                   "shadows": [{"target": "PoolRoute|B", "key_fraction_range": [0, 0.5]}]}}}"#;
        assert!(import(config).is_ok(), "{:?}", import(config).err());
        for end in 0..config.len() {
            if config.is_char_boundary(end) {
                let _ = import(&config[..end]);
            }
        }
        for i in 0..config.len() {
            for b in ["\"", "[", "]", "{", "}", "|", "%", "@", "0", "-", ","] {
                if config.is_char_boundary(i) && config.is_char_boundary(i + 1) {
                    let _ = import(&format!("{}{b}{}", &config[..i], &config[i + 1..]));
                }
            }
        }
    }

    #[test]
    fn never_panics_on_odd_shapes() {
        for json in [
            "null", "{}", "{\"route\": null}", "{\"route\": []}", "{\"route\": {}}",
            "{\"pools\": [], \"route\": \"PoolRoute|A\"}", "{\"pools\": {\"A\": 1}, \"route\": \"PoolRoute|A\"}",
            "{\"pools\": {\"A\": {\"servers\": [1, \"[::1\", \"h:0\"]}}, \"route\": \"Pool|A\"}",
            "{\"routes\": [{\"aliases\": []}]}", "{\"route\": {\"type\": \"PrefixSelectorRoute\", \"policies\": {\"\": \"NullRoute\"}}}",
            "{\"route\": {\"type\": \"ShadowRoute\", \"children\": \"NullRoute\", \"shadows\": [{\"target\": \"NullRoute\", \"key_fraction_range\": [0.5, 0.1]}]}}",
            "{\"macros\": 3, \"route\": \"@x(\"}",
        ] {
            let _ = import(json);
        }
    }
}
