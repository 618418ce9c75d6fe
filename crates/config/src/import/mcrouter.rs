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
mod builtins;
mod json;

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

/// mcrouter's other route handles (its McRouteHandleProvider and routes/, plus
/// McRefillRoute of its tests): each gets its nearest memroute equivalent and a note
/// (`Importer::nearest`). A handle in neither list is one mcrouter rejects.
const OTHER_HANDLES: &[&str] = &[
    "AxonLogRoute",
    "BigValueRoute",
    "BlackholeRoute",
    "CarbonLookasideRoute",
    "DevNullRoute",
    "DistributionRoute",
    "HashStopAllowListRoute",
    "HostIdRoute",
    "KeyParseRoute",
    "KeySplitRoute",
    "L1L2CacheRoute",
    "L1L2SizeSplitRoute",
    "LatencyInjectionRoute",
    "LoadBalancerRoute",
    "LoggingRoute",
    "McRefillRoute",
    "MigrateRoute",
    "ModifyExptimeRoute",
    "ModifyKeyRoute",
    "OriginalClientHashRoute",
    "PrefixPolicyRoute",
    "RateLimitRoute",
    "RoutingGroupRoute",
    "SaltedFailoverRoute",
    "SRRoute",
    "SetDistributionTargetRoute",
    "StagingRoute",
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

/// mcrouter's command-line flags that change what the config does, as the importer takes
/// them (`memroute import-mcrouter --route-prefix /dc/cluster/ ...`).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--route-prefix`: the default routing prefix (`[proxy] routing_prefix`).
    pub route_prefix: Option<String>,
    /// `--timeouts-until-tko`: failures before a server is marked down (`failure_limit`).
    pub timeouts_until_tko: Option<u32>,
    /// `--probe-timeout-initial` in milliseconds: the first probe of a down server
    /// (`probe_interval`).
    pub probe_timeout_initial_ms: Option<u64>,
    /// `--max-client-outstanding-reqs`: requests one client may have in flight
    /// (`max_client_pending`; 0 is mcrouter's "no limit").
    pub max_client_outstanding_reqs: Option<u64>,
    /// `--num-proxies`: mcrouter's proxy threads (`workers`).
    pub num_proxies: Option<u32>,
    /// `--config-params name1:value1,...`: mcrouter's preprocessor parameters, `%name%`
    /// in the config.
    pub config_params: Vec<(String, String)>,
    /// `--pem-ca-path`, `--pem-cert-path`, `--pem-key-path`: TLS to `:ssl` servers.
    pub pem_ca_path: Option<String>,
    pub pem_cert_path: Option<String>,
    pub pem_key_path: Option<String>,
}

/// Returns the equivalent memroute TOML for an mcrouter JSON config.
pub fn import(json: &str) -> Result<String, ConfigErrors> {
    import_with(json, &Flags::default())
}

/// `import_with` for the config file at `path` (its `@import`s are read relative to it).
pub fn import_file(
    json: &str,
    path: &std::path::Path,
    flags: &Flags,
) -> Result<String, ConfigErrors> {
    let base = path.parent().map(std::path::Path::to_path_buf);
    import_from(json, base, flags)
}

/// `import`, with mcrouter's command-line flags carried over too.
pub fn import_with(json: &str, flags: &Flags) -> Result<String, ConfigErrors> {
    import_from(json, None, flags)
}

fn import_from(
    json: &str,
    base: Option<std::path::PathBuf>,
    flags: &Flags,
) -> Result<String, ConfigErrors> {
    super::checked(translate(json, base, flags)?)
}

/// The memroute TOML for an mcrouter config, before it is checked by loading it.
fn translate(
    json: &str,
    base: Option<std::path::PathBuf>,
    flags: &Flags,
) -> Result<String, ConfigErrors> {
    let doc: Value = json::parse(json).map_err(|e| {
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
    let mut importer = Importer {
        flags: flags.clone(),
        base,
        ..Importer::default()
    };
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
    importer.placeholder_pool();
    Ok(importer.render(&root))
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
    /// Its servers are `host:port:ascii:ssl`: TLS.
    tls: bool,
    /// `keep_routing_prefix`: its servers get keys with their routing prefix.
    keep_prefix: bool,
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
    tls: bool,
    keep_prefix: bool,
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

fn children_has(children: &[String], child: &str) -> bool {
    children.iter().any(|c| c == child)
}

/// A failover handle's `failover_errors` as memroute's line (none: every error). mcrouter
/// also takes separate lists for gets, updates and deletes (an object); memroute has one
/// list per route: their union, with a note.
fn failover_errors(o: &Map<String, Value>, path: &str, notes: &mut Vec<String>) -> Option<String> {
    let at = join(path, "failover_errors");
    let names: Vec<String> = match o.get("failover_errors")? {
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        Value::Object(by_kind) => {
            notes.push(format!("{at}: separate lists for gets, updates and deletes; memroute has one list per route: their union, for every request."));
            let mut all: Vec<String> = Vec::new();
            for list in by_kind.values().filter_map(Value::as_array) {
                for name in list.iter().filter_map(Value::as_str) {
                    if !all.iter().any(|n| n == name) {
                        all.push(name.to_string());
                    }
                }
            }
            all
        }
        other => {
            notes.push(format!(
                "{at}: {} is not a list of errors; not carried over.",
                compact(other)
            ));
            return None;
        }
    };
    let known: Vec<String> = names
        .into_iter()
        .filter(|name| {
            let ok = crate::ErrorClass::from_name(name).is_some();
            if !ok {
                notes.push(format!(
                    "{at}: \"{name}\" is not one of mcrouter's errors; left out."
                ));
            }
            ok
        })
        .collect();
    Some(format!("failover_errors = {}", list(&known)))
}

/// A `RoutingGroupRoute` as the `OperationSelectorRoute` it amounts to: each group
/// (`get_like`, `update_like`, `delete_like`, `arithmetic_like`) is its operations.
fn routing_groups_as_operations(o: &Map<String, Value>) -> Map<String, Value> {
    const GROUPS: &[(&str, &[&str])] = &[
        ("get_like", &["get", "gets", "gat", "gats"]),
        (
            "update_like",
            &["set", "add", "replace", "append", "prepend", "cas", "touch"],
        ),
        ("delete_like", &["delete"]),
        ("arithmetic_like", &["incr", "decr"]),
    ];
    let mut policies = Map::new();
    if let Some(groups) = o.get("routing_group_policies").and_then(Value::as_object) {
        for (group, ops) in GROUPS {
            if let Some(route) = groups.get(*group) {
                for op in *ops {
                    policies.insert(op.to_string(), route.clone());
                }
            }
        }
    }
    let mut out = Map::new();
    out.insert("operation_policies".to_string(), Value::Object(policies));
    if let Some(default) = o.get("default_policy") {
        out.insert("default_policy".to_string(), default.clone());
    }
    out
}

/// What mcrouter's handle did, for the note on its nearest memroute equivalent.
fn handle_note(kind: &str) -> &'static str {
    match kind {
        "AxonLogRoute" | "LoggingRoute" => "mcrouter logged the requests on the way; memroute's logs and metrics are in docs/operations.md.",
        "BigValueRoute" => "mcrouter split values above its threshold into chunks; memroute sends values whole (proxy.max_value_size bounds them).",
        "CarbonLookasideRoute" => "mcrouter answered some reads from a lookaside cache; memroute asks the route every time.",
        "DistributionRoute" | "SetDistributionTargetRoute" => "mcrouter also distributed writes to other regions; write to them with a replicated route.",
        "HashStopAllowListRoute" | "KeyParseRoute" => "mcrouter chose by parts of the key; use a prefix route for the same.",
        "HostIdRoute" | "OriginalClientHashRoute" | "LoadBalancerRoute" => "mcrouter picked one child per client (or by load); memroute tries them in order.",
        "KeySplitRoute" => "mcrouter spread a hot key's copies over several keys; memroute sends the key as it is.",
        "L1L2SizeSplitRoute" => "mcrouter kept large values in l2 behind a marker in l1; memroute keeps every value in l1.",
        "LatencyInjectionRoute" => "mcrouter added latency (a test aid); memroute adds none.",
        "MigrateRoute" => "mcrouter moved from \"from\" to \"to\" at start_time; memroute routes to \"to\" now (a resize window, docs/configuration.md, moves keys between pools).",
        "ModifyExptimeRoute" => "mcrouter changed the exptime on the way; memroute caps exptimes only on a failover route's failover children (failover_exptime).",
        "ModifyKeyRoute" => "mcrouter rewrote the key (routing prefix, key prefix); memroute sends it as the client did.",
        "RateLimitRoute" => "mcrouter rate-limited requests; memroute does not (proxy.max_client_pending bounds one client).",
        "SRRoute" => "mcrouter found servers through a service router, which memroute does not have; use DNS discovery (docs/configuration.md).",
        "StagingRoute" => "mcrouter also wrote to a staging route; a shadow route copies requests to another.",
        "McRefillRoute" => "mcrouter refilled misses from \"refill\"; memroute's warm-up route fills from another on a miss.",
        _ => "",
    }
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
    flags: Flags,
    /// The directory `@import` paths are relative to (the config file's).
    base: Option<std::path::PathBuf>,
    errs: Vec<ConfigError>,
    /// Routes chosen by routing prefix (mcrouter's `routes[].aliases`): target -> prefixes.
    prefixed: Vec<(String, Vec<String>)>,
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
    fn expand_macros(&mut self, top: Map<String, Value>) -> Map<String, Value> {
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
    fn builtin(
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
    fn import_macro(
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
    fn for_each(
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

    // ---- pools ----------------------------------------------------------------------

    fn read_pools(&mut self, top: &Map<String, Value>) {
        // mcrouter also reads pools from `regional_pools`, by the same names.
        for key in ["pools", "regional_pools"] {
            self.read_pools_at(top, key);
        }
    }

    fn read_pools_at(&mut self, top: &Map<String, Value>, key: &str) {
        let Some(pools) = top.get(key) else {
            return;
        };
        let Some(pools) = pools.as_object() else {
            self.error(
                ErrorKind::WrongType,
                key,
                "expected an object of pools by name",
            );
            return;
        };
        for (name, pool) in pools {
            let path = join(key, name);
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
        let mut security = Vec::new();
        match pool.get("servers") {
            Some(Value::Array(items)) if !items.is_empty() => {
                // `port_override`: every server's port (mcrouter lets them omit theirs).
                let port_override = pool.get("port_override").and_then(Value::as_u64);
                for (i, s) in items.iter().enumerate() {
                    let item_path = index(&servers_path, i);
                    let with_port = |a: &str| match port_override {
                        Some(port) => {
                            let host = a.split_once(':').map_or(a, |(host, _)| host);
                            let rest = a.splitn(3, ':').nth(2).map(|r| format!(":{r}"));
                            format!("{host}:{port}{}", rest.unwrap_or_default())
                        }
                        None => a.to_string(),
                    };
                    match s.as_str().map(with_port).as_deref().map(split_server) {
                        Some(Ok((address, extra))) => {
                            match extra.as_deref() {
                                Some("ascii:ssl" | "ssl") => security.push(true),
                                Some(extra) => {
                                    notes.push(format!(
                                        "{item_path}: \"{extra}\" after the address (protocol/security) is not carried over; memroute speaks the ASCII protocol to servers"
                                    ));
                                    security.push(false);
                                }
                                None => security.push(false),
                            }
                            servers.push(address);
                        }
                        // Port 0: mcrouter reads it (and never reaches the server).
                        Some(Err(_)) if s.as_str().is_some_and(|a| a.ends_with(":0")) => {
                            notes.push(format!("{item_path}: {} has port 0, which no server listens on; left out.", compact(s)));
                        }
                        Some(Err(message)) => self.error(ErrorKind::Invalid, &item_path, message),
                        // mcrouter takes a route handle as a "server" (its requests go
                        // there); memroute's pools hold servers only.
                        None => notes.push(format!(
                            "{item_path}: {} is not a server; memroute's pools hold servers only, so it is left out (and the pool's keys are spread over the others).",
                            compact(s)
                        )),
                    }
                }
            }
            // mcrouter takes a pool without servers (its requests fail); so does the
            // importer: routes to it become error routes (`pool_target`).
            Some(Value::Array(_)) => {}
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
                "servers"
                | "weights"
                | "server_timeout"
                | "keep_routing_prefix"
                | "port_override" => {}
                "protocol" if value.as_str() == Some("ascii") => {}
                _ => notes.push(format!(
                    "{}: {} is not carried over",
                    join(path, key),
                    compact(value)
                )),
            }
        }
        // mcrouter takes a server twice in a pool (two shares of the hash space); memroute
        // needs each server once.
        let mut seen = HashSet::new();
        let before_dedup = servers.len();
        servers.retain(|server| seen.insert(server.clone()));
        if servers.len() < before_dedup {
            notes.push(format!("{servers_path}: a server is listed more than once; memroute lists each once, so keys are placed over the distinct servers (not where mcrouter placed them)."));
        }
        let tls = !security.is_empty() && security.iter().all(|&ssl| ssl);
        if !tls && security.contains(&true) {
            notes.push(format!(
                "{servers_path}: some servers are \":ssl\" and some plain; memroute speaks TLS to a whole pool or to none of it: this pool is plain. Split it to keep TLS."
            ));
        }
        (self.errs.len() == before).then_some(McPool {
            servers,
            weights,
            timeout_ms,
            tls,
            keep_prefix: pool.get("keep_routing_prefix").and_then(Value::as_bool) == Some(true),
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
                // mcrouter takes 0: the server gets only the keys all 32 tries miss.
                // memroute's weights are above 0: the least weight is the nearest.
                Some(0.0) => {
                    self.notes.push(format!("{item_path}: weight 0 (mcrouter gives such a server only the keys all 32 WeightedCh3 tries miss) is written as 0.000001, memroute's nearest: about as few keys."));
                    out.push(0.000001);
                }
                Some(x) if x < 0.0 => {
                    self.error(ErrorKind::OutOfRange,
                        &item_path,
                        format!("weight {x} must be > 0 (a server that should get no keys belongs out of the pool; with weight 0 WeightedCh3 still gives it the keys all 32 tries miss)"),
                    );
                }
                // WeightedCh3 compares the weight with a number in [0, 1): above 1 is 1.
                Some(x) => {
                    self.notes.push(format!("{item_path}: weight {x} is above 1, which WeightedCh3 treats as 1: written as 1."));
                    out.push(1.0);
                }
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
        if pool.servers.is_empty() {
            return Some(self.empty_pool(name));
        }
        let (hash, salt) = match hash {
            Some(spec) => spec,
            None => match &pool.weights {
                Some(w) => (Hash::WeightedCh3(w.clone()), String::new()),
                None => (Hash::Ch3, String::new()),
            },
        };
        let hash = match hash {
            Hash::WeightedCh3(weights) if weights.is_empty() => {
                let weights = pool.weights.clone().unwrap_or_default();
                Hash::WeightedCh3(self.fit_weights(weights, pool.servers.len(), name))
            }
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
                tls: pool.tls,
                keep_prefix: pool.keep_prefix,
                notes: pool.notes.clone(),
            },
        );
        Some(out)
    }

    /// A config whose routes reach no server (a NullRoute alone) still needs a pool in
    /// memroute: one no route uses, with a note.
    fn placeholder_pool(&mut self) {
        if !self.out_pools.is_empty() {
            return;
        }
        let name = self.fresh_name("unused", true);
        let note = "memroute needs at least one pool and no route of this config reaches a server: this pool is a placeholder no route uses (memroute may still connect to and probe its server).".to_string();
        self.out_pools.insert(
            name,
            OutPool {
                servers: vec!["127.0.0.1:11211".to_string()],
                hash: Hash::Ch3,
                salt: String::new(),
                timeout_ms: None,
                tls: false,
                keep_prefix: false,
                notes: vec![note],
            },
        );
    }

    /// What a route to mcrouter pool `name`, which has no servers, becomes: an error route
    /// (one per pool), as mcrouter fails such a pool's requests.
    fn empty_pool(&mut self, name: &str) -> String {
        let key = (format!("{name}\u{0}empty"), Hash::Ch3, String::new());
        if let Some((_, existing)) = self.pool_variants.iter().find(|(k, _)| *k == key) {
            return existing.clone();
        }
        self.notes.push(format!("pool \"{name}\" has no servers: mcrouter fails its requests; here its routes are an error route."));
        let message = format!("message = \"pool {name} has no servers\"");
        let route = self.simple_route(&format!("{name}_no_servers"), "error", vec![message]);
        self.pool_variants.push((key, route.clone()));
        route
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
        if pool.servers.is_empty() {
            return Some(vec![self.empty_pool(name)]);
        }
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
                    tls: pool.tls,
                    keep_prefix: pool.keep_prefix,
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
            (Some(route), None) => {
                let root = self.route(route, "route", "root")?;
                // The one route serves the default prefix too.
                if let Some(prefix) = self.flags.route_prefix.clone() {
                    self.add_prefixes(&root, vec![prefix]);
                }
                Some(root)
            }
            (None, Some(Value::Array(routes))) if !routes.is_empty() => self.read_routes(routes),
            // mcrouter's short form: `"routes": {"/a/b/": ROUTE, ...}`.
            (None, Some(Value::Object(by_alias))) if !by_alias.is_empty() => {
                let routes: Vec<Value> = by_alias
                    .iter()
                    .map(|(alias, route)| serde_json::json!({"aliases": [alias], "route": route}))
                    .collect();
                self.read_routes(&routes)
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

    /// mcrouter's `routes`: each entry's route, chosen by the routing prefixes in its
    /// `aliases` (`routing_prefixes` on its memroute target). The root (`proxy.route`) is
    /// the route of `--route-prefix`, else the first entry's.
    fn read_routes(&mut self, routes: &[Value]) -> Option<String> {
        let mut root = None;
        for (i, entry) in routes.iter().enumerate() {
            let path = index("routes", i);
            let aliases: Vec<String> = match entry.get("aliases") {
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(|a| a.as_str().map(str::to_string))
                    .collect(),
                Some(Value::String(one)) => vec![one.clone()],
                _ => Vec::new(),
            };
            if aliases.is_empty() {
                self.notes.push(format!(
                    "{path}: no \"aliases\"; no routing prefix selects this route."
                ));
            }
            let hint = aliases
                .first()
                .map_or_else(|| format!("routes_{i}"), |a| a.replace('/', "_"));
            let Some(route) = entry.get("route") else {
                self.error(ErrorKind::Missing, &join(&path, "route"), "required");
                continue;
            };
            let Some(target) = self.route(route, &join(&path, "route"), &hint) else {
                continue;
            };
            let is_default = match &self.flags.route_prefix {
                Some(prefix) => aliases.contains(prefix),
                None => i == 0,
            };
            if is_default && root.is_none() {
                root = Some(target.clone());
            }
            self.add_prefixes(&target, aliases);
        }
        match (&self.flags.route_prefix, &root) {
            (None, _) => self.notes.push(
                "mcrouter serves a key without a routing prefix by its --route-prefix flag; none was given to the importer, so proxy.route is routes[0]'s route. Give --route-prefix /REGION/CLUSTER/ to choose.".to_string(),
            ),
            (Some(prefix), None) => self.error(
                ErrorKind::UnknownTarget,
                "routes",
                format!("--route-prefix {prefix}: no entry of routes has it among its aliases (mcrouter would not start)"),
            ),
            _ => {}
        }
        root
    }

    /// Routing prefixes that select memroute target `target`.
    fn add_prefixes(&mut self, target: &str, prefixes: Vec<String>) {
        if prefixes.is_empty() {
            return;
        }
        match self.prefixed.iter_mut().find(|(t, _)| t == target) {
            Some((_, have)) => have.extend(prefixes),
            None => self.prefixed.push((target.to_string(), prefixes)),
        }
    }

    fn note_top_level_keys(&mut self, top: &Map<String, Value>) {
        for (key, value) in top {
            if !matches!(
                key.as_str(),
                "pools" | "regional_pools" | "route" | "routes" | "named_handles"
            ) {
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
            // mcrouter's short form of a handle over its children: `AllSyncRoute|Pool|A`
            // is `{"type": "AllSyncRoute", "children": "Pool|A"}`.
            (_, Some(rest)) if HANDLES.contains(&kind) || OTHER_HANDLES.contains(&kind) => {
                let mut o = Map::new();
                o.insert("type".to_string(), Value::String(kind.to_string()));
                o.insert("children".to_string(), Value::String(rest.to_string()));
                self.route_object(kind, &o, path, hint)
            }
            // A handle with nothing to say (`DevNullRoute`), as an object.
            _ if OTHER_HANDLES.contains(&kind) => {
                let mut o = Map::new();
                o.insert("type".to_string(), Value::String(kind.to_string()));
                self.route_object(kind, &o, path, hint)
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
        self.children_at(o.get("children"), &join(path, "children"), hint)
    }

    /// A list of child handles at `children_path`: a list, a single child where a list is
    /// allowed, `"Pool|NAME"` or an inline `{"type": "Pool", ...}` (one child per server of
    /// the pool, in a list too).
    fn children_at(
        &mut self,
        children: Option<&Value>,
        children_path: &str,
        hint: &str,
    ) -> Option<Vec<String>> {
        let children_path = children_path.to_string();
        match children {
            Some(Value::String(s)) if s.starts_with("Pool|") => {
                self.server_targets(&s["Pool|".len()..], &children_path)
            }
            Some(one @ (Value::String(_) | Value::Object(_))) => {
                self.children_at(Some(&Value::Array(vec![one.clone()])), &children_path, hint)
            }
            Some(Value::Array(items)) if !items.is_empty() => {
                let mut out = Vec::new();
                let mut ok = true;
                for (i, child) in items.iter().enumerate() {
                    let at = index(&children_path, i);
                    let pool = match child {
                        Value::String(s) => s.strip_prefix("Pool|").map(str::to_string),
                        Value::Object(p)
                            if p.get("type").and_then(Value::as_str) == Some("Pool") =>
                        {
                            self.inline_pool(p, &at)
                        }
                        _ => None,
                    };
                    let targets = match pool {
                        Some(pool) => self.server_targets(&pool, &at),
                        None => self
                            .route(child, &at, &format!("{hint}_{i}"))
                            .map(|t| vec![t]),
                    };
                    match targets {
                        Some(t) => out.extend(t),
                        None => ok = false,
                    }
                }
                // mcrouter takes a child twice (a failover that tries a pool again);
                // memroute asks each child once: the second is dropped.
                let mut seen = HashSet::new();
                let mut distinct = Vec::new();
                for t in out {
                    if seen.insert(t.clone()) {
                        distinct.push(t);
                    } else {
                        self.notes.push(format!("{children_path}: \"{t}\" is a child twice; memroute asks each child once, so the second is dropped."));
                    }
                }
                ok.then_some(distinct)
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

    /// An inline pool (`{"type": "Pool", "name": ..., "servers": [...]}`) read and kept
    /// under its name; the name, or `None` (reported) when it cannot be read.
    fn inline_pool(&mut self, p: &Map<String, Value>, path: &str) -> Option<String> {
        let Some(name) = p.get("name").and_then(Value::as_str) else {
            self.error(ErrorKind::Missing, path, "an inline pool needs a \"name\"");
            return None;
        };
        let mut body = p.clone();
        body.remove("type");
        body.remove("name");
        let read = self.read_pool(&Value::Object(body), path)?;
        self.pools.insert(name.to_string(), read);
        Some(name.to_string())
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
            "FailoverWithExptimeRoute" => (
                self.failover_with_exptime(o, path, hint, &mut notes)?,
                &[
                    "type",
                    "name",
                    "normal",
                    "failover",
                    "failover_exptime",
                    "failover_errors",
                ],
            ),
            "FailoverRoute" | "MissFailoverRoute" | "LatestRoute" | "RandomRoute" => (
                self.list_route(kind, o, path, hint, &mut notes)?,
                &["type", "name", "children", "failover_errors"],
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
            // mcrouter's older name for OperationSelectorRoute.
            "PrefixPolicyRoute" => (
                self.operation_selector(o, path, hint, &mut notes)?,
                &["type", "name", "operation_policies", "default_policy"],
            ),
            "RoutingGroupRoute" => {
                let as_operations = routing_groups_as_operations(o);
                (
                    self.operation_selector(&as_operations, path, hint, &mut notes)?,
                    &["type", "name", "routing_group_policies", "default_policy"],
                )
            }
            "L1L2CacheRoute" => (
                self.l1_l2_cache(o, path, hint, &mut notes)?,
                &["type", "name", "l1", "l2", "upgradingL1Exptime"],
            ),
            other if OTHER_HANDLES.contains(&other) => {
                let built = self.nearest(other, o, path, hint, &mut notes)?;
                self.notes.extend(notes);
                return Some(built);
            }
            other => {
                let message = format!("unknown route handle \"{other}\"");
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

    /// `L1L2CacheRoute`: reads from `l1`, on a miss from `l2`, filling `l1`: memroute's
    /// warm-up route (l1 cold, l2 warm). mcrouter also wrote to both; memroute writes to l1.
    fn l1_l2_cache(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let side = |me: &mut Self, key: &str| match o.get(key) {
            Some(r) => me.route(r, &join(path, key), &format!("{hint}_{key}")),
            None => {
                me.error(ErrorKind::Missing, &join(path, key), "required");
                None
            }
        };
        let l1 = side(self, "l1")?;
        let l2 = side(self, "l2")?;
        notes.push(format!("{path}: L1L2CacheRoute: memroute's warm-up route is the nearest (reads l1, then l2 on a miss, filling l1); mcrouter's writes to l2 and its upgradingL1Exptime are not carried over: writes go to l1."));
        if l1 == l2 {
            return Some(Built::Target(l1));
        }
        let ttl = o
            .get("upgradingL1Exptime")
            .and_then(Value::as_u64)
            .filter(|&t| t <= memroute_protocol::MAX_RELATIVE_EXPTIME)
            .unwrap_or(0);
        Some(Built::Route(vec![
            "type = \"warm-up\"".to_string(),
            format!("cold = {}", quote(&l1)),
            format!("warm = {}", quote(&l2)),
            format!("ttl = {ttl}"),
        ]))
    }

    /// A handle memroute has no equivalent of: its nearest, with a note. A handle that
    /// wraps one route (a `target`, `child`, `to`, ...) becomes that route (mcrouter's
    /// handle did something on the way that memroute does not); one over a list of children
    /// a failover route over them; one with no route to go on to an error route, so
    /// that nothing is answered as if it worked.
    fn nearest(
        &mut self,
        kind: &str,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<String> {
        const ONE: &[&str] = &[
            "target",
            "child",
            "destination",
            "default",
            "default_policy",
            "normal",
            "primary",
            "to",
            "warm",
            "l1",
            "from",
        ];
        let what = handle_note(kind);
        if matches!(kind, "DevNullRoute" | "BlackholeRoute") {
            notes.push(format!("{path}: {kind} has no memroute equivalent; the nearest is a null route (every request answered as a miss / not stored, nothing sent). {what}"));
            return Some(self.simple_route(hint, "null", Vec::new()));
        }
        if let Some(key) = ONE.iter().find(|k| o.contains_key(**k)) {
            notes.push(format!("{path}: {kind} has no memroute equivalent; its requests go to its \"{key}\" as they are. {what}"));
            return self.route(&o[*key], &join(path, key), &format!("{hint}_{key}"));
        }
        if o.contains_key("children") {
            let children = self.children(o, path, hint)?;
            notes.push(format!("{path}: {kind} has no memroute equivalent; the nearest is a failover route over its children, in order. {what}"));
            if let [only] = children.as_slice() {
                return Some(only.clone());
            }
            let lines = vec![
                "type = \"failover\"".to_string(),
                format!("children = {}", list(&children)),
            ];
            let name = self.fresh_name(hint, false);
            self.out_routes.insert(
                name.clone(),
                OutRoute {
                    lines,
                    notes: Vec::new(),
                },
            );
            return Some(name);
        }
        notes.push(format!("{path}: {kind} has no memroute equivalent and no route under it; it becomes an error route. {what}"));
        let message = format!("message = \"{kind} is not available in memroute\"");
        Some(self.simple_route(hint, "error", vec![message]))
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
        if kind == "LatestRoute" {
            notes.push(format!("{path}: LatestRoute picked `failover_count` children at random per proxy and failed over among them; memroute fails over among all of them in order."));
        }
        if let [only] = children.as_slice() {
            return Some(Built::Target(only.clone()));
        }
        let errors = match kind {
            "RandomRoute" => None,
            _ => failover_errors(o, path, notes),
        };
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
        lines.extend(errors);
        Some(Built::Route(lines))
    }

    /// `FailoverWithExptimeRoute`: `normal`, then the `failover` children with their
    /// exptime capped at `failover_exptime` (mcrouter's default 60 s; 0 or below: no cap).
    fn failover_with_exptime(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let Some(normal) = o.get("normal") else {
            self.error(
                ErrorKind::Missing,
                &join(path, "normal"),
                "required (FailoverWithExptimeRoute: normal not found)",
            );
            return None;
        };
        let normal = self.route(normal, &join(path, "normal"), &format!("{hint}_normal"))?;
        let failover = match o.get("failover") {
            Some(f) => self.children_at(
                Some(f),
                &join(path, "failover"),
                &format!("{hint}_failover"),
            )?,
            None => Vec::new(),
        };
        let exptime = match o.get("failover_exptime") {
            None => 60,
            Some(v) => match v.as_i64() {
                Some(n) => n,
                None => {
                    self.error(
                        ErrorKind::WrongType,
                        &join(path, "failover_exptime"),
                        "FailoverWithExptimeRoute: failover_exptime is not an integer",
                    );
                    return None;
                }
            },
        };
        let mut children = vec![normal];
        for child in failover {
            if !children_has(&children, &child) {
                children.push(child);
            }
        }
        if children.len() == 1 {
            return Some(Built::Target(children.remove(0)));
        }
        let mut lines = vec![
            "type = \"failover\"".to_string(),
            format!("children = {}", list(&children)),
        ];
        lines.extend(failover_errors(o, path, notes));
        match exptime {
            n if n <= 0 => {}
            n if n as u64 > memroute_protocol::MAX_RELATIVE_EXPTIME => notes.push(format!(
                "{}: {n} s is more than 30 days, which memcached reads as a Unix time; memroute cannot cap at it, so failover writes keep the client's exptime.",
                join(path, "failover_exptime")
            )),
            n => lines.push(format!("failover_exptime = {n}")),
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
                self.notes.push(format!(
                    "{p}: {} is not a shadow object with \"target\"; mcrouter skips it, and so does memroute.",
                    compact(shadow)
                ));
                continue;
            };
            let Some(t) = s.get("target") else {
                self.notes.push(format!(
                    "{p}: no \"target\"; mcrouter skips this shadow, and so does memroute."
                ));
                continue;
            };
            // mcrouter logs a shadow it cannot build and goes on without it.
            let errors_before = self.errs.len();
            let Some(shadow_target) =
                self.route(t, &join(&p, "target"), &format!("{hint}_shadow_{i}"))
            else {
                let why: Vec<String> = self
                    .errs
                    .drain(errors_before..)
                    .map(|e| e.to_string())
                    .collect();
                self.notes.push(format!(
                    "{p}: mcrouter skips this shadow ({}), and so does memroute.",
                    why.join("; ")
                ));
                continue;
            };
            let range = match s.get("key_fraction_range") {
                None => [0.0, 1.0],
                Some(r) => match r
                    .as_array()
                    .map(|a| a.iter().map(Value::as_f64).collect::<Vec<_>>())
                    .as_deref()
                {
                    Some([Some(a), Some(b)]) if 0.0 <= *a && a <= b && *b <= 1.0 => [*a, *b],
                    // mcrouter logs such a shadow and goes on without it.
                    _ => {
                        self.notes.push(format!(
                            "{}: {} is not [a, b] with 0 <= a <= b <= 1; mcrouter skips this shadow, and so does memroute.",
                            join(&p, "key_fraction_range"),
                            compact(r)
                        ));
                        continue;
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
                // The pool's weights (a PoolRoute gives them to its hash), else mcrouter's
                // 0.5 for each server (`fit_weights`).
                None => Some(Hash::WeightedCh3(Vec::new())),
            },
            other => {
                notes.push(format!("{func_path}: hash function \"{other}\" has no memroute equivalent; the nearest is Ch3 (mcrouter's default): keys are spread over the same servers, but not placed where \"{other}\" placed them."));
                Some(Hash::Ch3)
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
        self.render_proxy_flags(&mut out);
        for (name, pool) in &self.out_pools {
            out.push('\n');
            for note in &pool.notes {
                push_note(&mut out, note);
            }
            if pool.tls {
                push_note(&mut out, &self.tls_note());
            }
            out.push_str(&format!("[pools.{}]\n", toml_key(name)));
            self.render_prefixes(&mut out, name);
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
            if pool.keep_prefix {
                out.push_str("keep_routing_prefix = true\n");
            }
            self.render_pool_flags(&mut out, pool.tls);
        }
        for (name, route) in &self.out_routes {
            out.push('\n');
            for note in &route.notes {
                push_note(&mut out, note);
            }
            out.push_str(&format!("[routes.{}]\n", toml_key(name)));
            self.render_prefixes(&mut out, name);
            for line in &route.lines {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

impl Importer {
    /// `[proxy]` keys from mcrouter's flags.
    fn render_proxy_flags(&self, out: &mut String) {
        let flags = &self.flags;
        if let Some(prefix) = &flags.route_prefix {
            out.push_str(&format!("routing_prefix = {}\n", quote(prefix)));
        }
        if let Some(n) = flags.num_proxies.filter(|&n| n > 0) {
            out.push_str(&format!("workers = {n}\n"));
        }
        if let Some(n) = flags.max_client_outstanding_reqs.filter(|&n| n > 0) {
            out.push_str(&format!("max_client_pending = {n}\n"));
        }
    }

    /// Per-pool keys from mcrouter's flags, and a TLS pool's `tls`.
    fn render_pool_flags(&self, out: &mut String, tls: bool) {
        let flags = &self.flags;
        if let Some(n) = flags.timeouts_until_tko.filter(|&n| n > 0) {
            out.push_str(&format!("failure_limit = {n}\n"));
        }
        if let Some(ms) = flags.probe_timeout_initial_ms.filter(|&ms| ms > 0) {
            out.push_str(&format!("probe_interval = \"{ms}ms\"\n"));
        }
        if tls {
            let ca = flags.pem_ca_path.as_deref().unwrap_or("ca.pem");
            let mut keys = vec![format!("ca = {}", quote(ca))];
            if let (Some(cert), Some(key)) = (&flags.pem_cert_path, &flags.pem_key_path) {
                keys.push(format!("cert = {}", quote(cert)));
                keys.push(format!("key = {}", quote(key)));
            }
            out.push_str(&format!("tls = {{ {} }}\n", keys.join(", ")));
        }
    }

    fn tls_note(&self) -> String {
        let given = match &self.flags.pem_ca_path {
            Some(_) => "from the importer's --pem-* flags",
            None => "\"ca.pem\" is a placeholder: no --pem-ca-path was given to the importer",
        };
        format!("this pool's servers are \":ssl\": memroute speaks TLS to them. mcrouter took the CA and client certificate from its --pem-ca-path, --pem-cert-path and --pem-key-path flags; memroute takes them from this pool's tls.ca, tls.cert and tls.key ({given}); tls.server_name if the certificates do not name the hosts (docs/configuration.md, Backend TLS).")
    }

    /// `routing_prefixes` of target `name`, if routing prefixes select it.
    fn render_prefixes(&self, out: &mut String, name: &str) {
        if let Some((_, prefixes)) = self.prefixed.iter().find(|(t, _)| t == name) {
            out.push_str(&format!("routing_prefixes = {}\n", list(prefixes)));
        }
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

/// A JSON value as text: a string as it is.
fn builtins_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
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

    /// A config in the shape of issue 30's: routes chosen by routing prefix per DC, a
    /// gutter (FailoverWithExptimeRoute on tko, 600 s), an OperationSelectorRoute whose set
    /// and delete are AllSyncRoutes with inline children, ascii:plain servers locally and
    /// ascii:ssl across DCs, comments and trailing commas, and --route-prefix.
    #[test]
    fn a_prefix_routed_config_with_a_gutter_imports_whole() {
        let json = r#"{
          // two DCs, one cluster each
          "pools": {
            "eqiad-wan": {"servers": ["10.0.0.1:11211:ascii:plain", "10.0.0.2:11211:ascii:plain"]},
            "eqiad-wan-failover": {"servers": ["10.0.1.1:11211:ascii:plain"]},
            "codfw-wan": {"servers": ["10.1.0.1:11214:ascii:ssl", "10.1.0.2:11214:ascii:ssl"]},
          },
          "routes": [
            {
              "aliases": ["/eqiad/wan/"],
              "route": {
                "type": "OperationSelectorRoute",
                "default_policy": {
                  "type": "FailoverWithExptimeRoute",
                  "normal": "PoolRoute|eqiad-wan",
                  "failover": "PoolRoute|eqiad-wan-failover",
                  "failover_errors": ["tko"],
                  "failover_exptime": 600,
                },
                "operation_policies": {
                  "set": {"type": "AllSyncRoute", "children": [
                    {"type": "PoolRoute", "pool": "eqiad-wan"},
                    {"type": "PoolRoute", "pool": "codfw-wan"},
                  ]},
                  "delete": {"type": "AllSyncRoute", "children": [
                    "PoolRoute|eqiad-wan", "PoolRoute|codfw-wan",
                  ]},
                },
              },
            },
            {"aliases": ["/codfw/wan/"], "route": "PoolRoute|codfw-wan"},
          ],
        }"#;
        let flags = Flags {
            route_prefix: Some("/eqiad/wan/".to_string()),
            pem_ca_path: Some("/etc/mcrouter/ca.pem".to_string()),
            ..Flags::default()
        };
        let text = translate(json, None, &flags).expect("translated");
        for line in [
            "routing_prefix = \"/eqiad/wan/\"",
            "routing_prefixes = [\"/eqiad/wan/\"]",
            "routing_prefixes = [\"/codfw/wan/\"]",
            "type = \"failover\"",
            "children = [\"eqiad-wan\", \"eqiad-wan-failover\"]",
            "failover_errors = [\"tko\"]",
            "failover_exptime = 600",
            "tls = { ca = \"/etc/mcrouter/ca.pem\" }",
            "servers = [\"10.0.0.1:11211\", \"10.0.0.2:11211\"]",
            "writes = \"all-sync\"",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(text.contains("--pem-ca-path"), "the TLS note: {text}");
        // MERGE NOTE (issue 30): the routing-prefix keys load once h-prefix is merged; until
        // then the rest of the file must load without them.
        let without_prefixes: String = text
            .lines()
            .filter(|l| !l.starts_with("routing_prefix"))
            .map(|l| format!("{l}\n"))
            .collect();
        let config = crate::parse(&without_prefixes).expect("loads without the prefix keys");
        let root = &config.routes[&config.proxy.route];
        let crate::RouteConfig::Operation {
            operations,
            default,
        } = root
        else {
            panic!("root: {root:?}");
        };
        assert_eq!(operations.len(), 2, "{operations:?}");
        assert!(matches!(
            &config.routes[default],
            crate::RouteConfig::Failover {
                exptime_cap: Some(600),
                ..
            }
        ));
        assert!(config.pools["codfw-wan"].tls.is_some());
        assert!(config.pools["eqiad-wan"].tls.is_none());
        if crate::parse(&text).is_ok() {
            // h-prefix merged: the whole file loads.
            assert!(import_with(json, &flags).is_ok());
        }
    }

    #[test]
    fn mcrouters_flags_map_to_memroute_keys() {
        let flags = Flags {
            timeouts_until_tko: Some(5),
            probe_timeout_initial_ms: Some(250),
            max_client_outstanding_reqs: Some(64),
            num_proxies: Some(3),
            ..Flags::default()
        };
        let json = r#"{"pools": {"A": {"servers": ["h:1"]}}, "route": "PoolRoute|A"}"#;
        let text = import_with(json, &flags).expect("imports");
        let config = crate::parse(&text).expect("loads");
        assert_eq!(config.proxy.workers, 3);
        assert_eq!(config.proxy.max_client_pending, 64);
        assert_eq!(config.pools["A"].failure_limit, 5);
        assert_eq!(
            config.pools["A"].probe_interval,
            std::time::Duration::from_millis(250)
        );
    }

    #[test]
    fn jsonm_built_ins_expand_as_mcrouters_preprocessor() {
        let json = r#"{
          "macros": {"n": {"type": "constDef", "result": 2}},
          "pools": {"@select(pools_by_dc,eqiad)": {"servers": {"type": "foreach", "from": {"type": "range", "from": 1, "to": 3},
                                                  "item": "i", "use": ["10.0.0.%i%:11211"]}}},
          "route": {"type": "if", "condition": {"type": "equals", "A": "a", "B": "a"},
                    "is_true": "PoolRoute|main", "is_false": "NullRoute"}
        }"#;
        // A key is not expanded (mcrouter expands values); the pool is named as written.
        let json = json.replace("@select(pools_by_dc,eqiad)", "main");
        let (text, config) = ok(&json);
        assert_eq!(
            config.pools["main"]
                .servers
                .iter()
                .map(|s| s.address.as_str())
                .collect::<Vec<_>>(),
            ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"],
            "{text}"
        );
        assert_eq!(config.proxy.route, "main");
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
            ["route.type: unknown route handle \"FancyRoute\""]
        );
        assert_eq!(
            err(r#"{"pools": {"A": {"servers": ["h:1", "h:2"], "weights": [0, -1, "x"]}}, "route": "PoolRoute|A"}"#),
            [
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
            ["route: @merge: params is not an array"]
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
