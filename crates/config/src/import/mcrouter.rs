//! `memroute import-mcrouter config.json`: translate an mcrouter config to memroute TOML.
//!
//! ```text
//!   JSON --json (comments, trailing commas)--> Value
//!        --macros (macroDef/constDef, builtins, @import, --config-params)--> Value
//!        --root (`route` / every `routes` entry) + handles + pools--> pools + [routes.*]
//!        --kept_prefixes (keep_routing_prefix agreed per routing prefix)
//!        --render (NOTEs, flags, routing_prefixes)--> TOML
//!        --crate::parse()--> checked (the output always loads)
//! ```
//!
//! One module per step: `json`, `macros` (with `jsonm_text` and `builtins`), `root`, `handles`, `pools`,
//! `kept_prefixes`, `render`; the shared state (`Importer`) and the entry points are here.
//!
//! Placement is carried over exactly: a PoolRoute (or a HashRoute over `Pool|NAME`) becomes
//! a memroute pool with the same servers in the same order and distribution `ch3`, `wch3`
//! (with the weights, padded or cut by mcrouter's rules) or `crc32`, which place every key
//! where mcrouter would. Route handles map to memroute route types; a named handle becomes
//! a route of that name. What has no equivalent gets its nearest and a `# NOTE` naming its
//! JSON path; only what mcrouter itself rejects (a handle it does not know, an unknown pool,
//! a negative weight, a loop between named handles, a macro that fails) is an error naming
//! its JSON path.
mod builtins;
mod handles;
mod json;
mod jsonm_hash;
mod jsonm_text;
mod kept_prefixes;
mod macros;
mod pools;
mod render;
mod root;

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
    importer.settle_kept_prefixes(&root);
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
mod tests;
