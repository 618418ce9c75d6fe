//! The raw config, exactly as written in the TOML file, and the walk that turns it
//! into the checked [`Config`].
//!
//! ```text
//!   text --toml--> RawConfig (a toml::Table) --validate()--> Config | ConfigErrors
//! ```
//!
//! Why a walk over `toml::Table` and not `#[derive(Deserialize)]` structs with
//! `deny_unknown_fields`: serde stops at the first problem and reports it by byte
//! span, not key path. Operators fixing a config want *every* problem at once, each
//! named by its key path (`pools.main.servers[1].weight: must be > 0`), including
//! unknown keys and wrong types. So the syntax is checked by `toml` (its message and
//! line/column are kept), and everything else is checked here, in one pass that
//! collects errors instead of returning on the first.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use memroute_protocol::MAX_RELATIVE_EXPTIME;
use toml::{Table, Value};

use crate::checked::RoutingPrefixConfig;
use crate::checked::{
    AdminConfig, AdminToken, Config, DiscoveryConfig, DistributionName, DnsDiscovery, DnsKind,
    FailoverOn, HashName, HotCache, IoMode, ListenAddress, ListenerAuth, Operation, PoolConfig,
    PoolSpec, ProxyConfig, ProxyZone, ReadPolicy, RouteConfig, ServerConfig, ShadowSelect,
    TransportConfig, WritePolicy, ZoneSource,
};
use crate::routing_prefixes::{default_prefix, take_target_keys};
use crate::walk::{
    check_keys, check_range, get_bool, get_duration, get_duration_or_zero, get_int, get_size,
    get_str, get_table, join, parse_error_kind, usize_max, wrong_type, Errors,
};
use crate::{ConfigError, ConfigErrors, ErrorKind};

use crate::defaults;
/// For the importers, which write keys the way the walker reads them back.
pub(crate) use crate::walk::toml_key;
/// The value parsers live with the walker; these paths stay valid.
pub use crate::walk::{parse_duration, parse_size};

const PROXY_KEYS: &[&str] = &[
    "listen",
    "workers",
    "backlog",
    "route",
    "max_value_size",
    "max_line_size",
    "max_client_pending",
    "max_connections",
    "shutdown_timeout",
    "drain_delay",
    "max_buffered_replies",
    "slow_client_timeout",
    "io",
    "zone",
    "routing_prefix",
];
const ADMIN_KEYS: &[&str] = &[
    "listen",
    "ready_fraction",
    "token",
    "token_file",
    "hot_keys_sample",
    "hot_keys_interval",
    "show_keys",
];
const POOL_KEYS: &[&str] = &[
    "servers",
    "distribution",
    "hash",
    "hash_tag",
    "vnodes",
    "weights",
    "salt",
    "connections",
    "timeout",
    "connect_timeout",
    "max_keys_per_request",
    "coalesce_gets",
    "collapse_gets",
    "hot_cache",
    "resize_window",
    "failure_limit",
    "eject",
    "max_ejected_fraction",
    "probe_interval",
    "probe_interval_max",
    "tls",
    "zone",
    "auth",
    // Read by routing_prefixes (taken out before the pool's checks); listed for the
    // unknown-key message.
    "routing_prefixes",
    "keep_routing_prefix",
];
const SERVER_KEYS: &[&str] = &["address", "weight", "name"];
const DNS_KEYS: &[&str] = &["dns", "srv", "refresh"];
const DISCOVERY_KEYS: &[&str] = &["hosts_file", "nameservers"];
const ROUTE_TYPES: &[&str] = &[
    "prefix",
    "operation",
    "shadow",
    "replicated",
    "failover",
    "warm-up",
    "random",
    "null",
    "error",
];
const PREFIX_ROUTE_KEYS: &[&str] = &["type", "prefixes", "default"];
const SHADOW_ROUTE_KEYS: &[&str] = &[
    "type",
    "primary",
    "shadow",
    "fraction",
    "key_range",
    "max_in_flight",
];
const REPLICATED_ROUTE_KEYS: &[&str] = &["type", "children", "writes", "reads"];
const FAILOVER_ROUTE_KEYS: &[&str] = &[
    "type",
    "children",
    "on",
    "failover_errors",
    "failover_exptime",
];
const WARM_UP_ROUTE_KEYS: &[&str] = &["type", "cold", "warm", "ttl"];
const RANDOM_ROUTE_KEYS: &[&str] = &["type", "children"];
const NULL_ROUTE_KEYS: &[&str] = &["type"];
const ERROR_ROUTE_KEYS: &[&str] = &["type", "message"];
const WRITE_POLICIES: &[(&str, WritePolicy)] = WritePolicy::NAMES;
const READ_POLICIES: &[(&str, ReadPolicy)] = ReadPolicy::NAMES;
const FAILOVER_ON: &[(&str, FailoverOn)] = FailoverOn::NAMES;
const TOP_KEYS: &[&str] = &["proxy", "admin", "pools", "routes", "discovery"];

/// The config as written: a TOML table that has passed the syntax check only.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(transparent)]
pub struct RawConfig {
    pub table: Table,
}

impl RawConfig {
    /// Checks TOML syntax only. A syntax error is reported with its line and column
    /// (toml can only report the first one; nothing after it can be trusted).
    pub fn from_toml(text: &str) -> Result<RawConfig, ConfigErrors> {
        match text.parse::<Table>() {
            Ok(table) => Ok(RawConfig { table }),
            Err(e) => {
                let path = match e.span() {
                    Some(span) => {
                        let (line, col) = line_col(text, span.start);
                        format!("line {line}, column {col}")
                    }
                    None => "toml".to_string(),
                };
                Err(ConfigErrors::single(ConfigError::new(
                    ErrorKind::Syntax,
                    path,
                    e.message().trim_end(),
                )))
            }
        }
    }

    /// Checks every key and value, applies defaults, and returns the checked config or
    /// every problem found.
    pub fn validate(self) -> Result<Config, ConfigErrors> {
        let mut errs = Errors::default();
        let config = check_config(&self.table, &mut errs);
        if errs.0.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(errs.0))
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Checks `host:port` (or `[v6]:port`) with a numeric, non-zero port. Host names are
/// allowed: they are resolved when connecting, not here.
pub fn check_host_port(s: &str) -> Result<(), String> {
    let bad = || format!("invalid address \"{s}\" (expected host:port with a numeric port)");
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or_else(bad)?;
        (h, p)
    } else {
        let (h, p) = s.rsplit_once(':').ok_or_else(bad)?;
        if h.contains(':') {
            return Err(format!(
                "invalid address \"{s}\" (write IPv6 addresses as [addr]:port)"
            ));
        }
        (h, p)
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(bad());
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(_) => Ok(()),
    }
}

fn check_config(top: &Table, errs: &mut Errors) -> Config {
    check_keys(top, "", TOP_KEYS, errs);
    let empty = Table::new();
    let proxy_table = get_table(top, "proxy", "", errs).unwrap_or(&empty);
    let mut prefixes = RoutingPrefixConfig::default();
    let (mut proxy, listener_targets) = check_proxy(proxy_table, &mut prefixes, errs);
    let admin = get_table(top, "admin", "", errs).map(|t| check_admin(t, errs));
    let discovery = get_table(top, "discovery", "", errs)
        .map(|t| check_discovery(t, errs))
        .unwrap_or_default();

    let pools = check_pools(top, &mut prefixes, errs);
    let routes = check_routes(top, &mut prefixes, errs);
    crate::routing_prefixes::resolve_roots(&prefixes, &mut proxy, &routes, errs);
    check_targets(
        top,
        proxy_table,
        &mut proxy,
        &listener_targets,
        &routes,
        errs,
    );
    check_cycles(&routes, errs);

    Config {
        proxy,
        admin,
        pools,
        routes,
        discovery,
        routing_prefixes: prefixes,
    }
}

/// `[pools.NAME]`: each pool that passed its checks (at least one is required).
fn check_pools(
    top: &Table,
    prefixes: &mut RoutingPrefixConfig,
    errs: &mut Errors,
) -> BTreeMap<String, PoolConfig> {
    let mut pools = BTreeMap::new();
    match top.get("pools") {
        None => errs.push(ErrorKind::Missing, "pools", "at least one pool is required"),
        Some(Value::Table(t)) => {
            if t.is_empty() {
                errs.push(ErrorKind::Missing, "pools", "at least one pool is required");
            }
            for (name, v) in t {
                let path = join("pools", name);
                match v {
                    Value::Table(pt) => {
                        let pt = take_target_keys(pt, name, &path, true, prefixes, errs);
                        if let Some(pool) = check_pool(&pt, &path, errs) {
                            pools.insert(name.clone(), pool);
                        }
                    }
                    other => wrong_type(errs, &path, "a table", other),
                }
            }
        }
        Some(other) => wrong_type(errs, "pools", "a table", other),
    }
    pools
}

/// `[routes.NAME]`: each route that passed its own checks (targets are checked later).
fn check_routes(
    top: &Table,
    prefixes: &mut RoutingPrefixConfig,
    errs: &mut Errors,
) -> BTreeMap<String, RouteConfig> {
    let mut routes = BTreeMap::new();
    if let Some(t) = get_table(top, "routes", "", errs) {
        for (name, v) in t {
            let path = join("routes", name);
            match v {
                Value::Table(rt) => {
                    let rt = take_target_keys(rt, name, &path, false, prefixes, errs);
                    if let Some(route) = check_route(&rt, &path, errs) {
                        routes.insert(name.clone(), route);
                    }
                }
                other => wrong_type(errs, &path, "a table", other),
            }
        }
    }
    routes
}

/// Every name a listener, `proxy.route` or a route points at is a pool or a route, and
/// no name is both; sets the default root when `proxy.route` is absent.
fn check_targets(
    top: &Table,
    proxy_table: &Table,
    proxy: &mut ProxyConfig,
    listener_targets: &[(String, String)],
    routes: &BTreeMap<String, RouteConfig>,
    errs: &mut Errors,
) {
    // Names are looked up in one namespace, so a name used by both is ambiguous.
    // Check against the raw tables so a pool with other errors still counts.
    let pool_names: BTreeSet<&String> = match top.get("pools") {
        Some(Value::Table(t)) => t.keys().collect(),
        _ => BTreeSet::new(),
    };
    let route_names: BTreeSet<&String> = match top.get("routes") {
        Some(Value::Table(t)) => t.keys().collect(),
        _ => BTreeSet::new(),
    };
    for name in route_names.intersection(&pool_names) {
        errs.push(
            ErrorKind::Conflict,
            &join("routes", name),
            format!("\"{name}\" is also a pool name; a target name must be unique"),
        );
    }
    let known =
        |t: &str| pool_names.contains(&t.to_string()) || route_names.contains(&t.to_string());

    for (key_path, target) in listener_targets {
        if !known(target) {
            errs.push(ErrorKind::UnknownTarget, key_path, unknown_target(target));
        }
    }

    check_default_root(proxy_table, proxy, &pool_names, &known, errs);

    for (name, route) in routes {
        let path = join("routes", name);
        for (key_path, target) in crate::checked::route_edges(&path, route) {
            if !known(&target) {
                errs.push(ErrorKind::UnknownTarget, &key_path, unknown_target(&target));
            }
        }
    }
}

fn unknown_target(target: &str) -> String {
    format!("unknown target \"{target}\" (no pool or route has that name)")
}

/// `proxy.route` names a known target; absent, the default root is the only pool, or when
/// every listener names its own root, the first listener's (so `memroute route` and
/// `RouteTable::root` have one to show).
fn check_default_root(
    proxy_table: &Table,
    proxy: &mut ProxyConfig,
    pool_names: &BTreeSet<&String>,
    known: &dyn Fn(&str) -> bool,
    errs: &mut Errors,
) {
    let every_listener_routed = proxy
        .listen
        .iter()
        .all(|address| proxy.listen_routes.contains_key(address));
    match proxy_table.get("route") {
        Some(Value::String(r)) => {
            if !known(r) {
                errs.push(ErrorKind::UnknownTarget, "proxy.route", unknown_target(r));
            }
        }
        Some(_) => {} // wrong type, reported by check_proxy
        // Set from `proxy.routing_prefix` (routing_prefixes::resolve_roots).
        None if !proxy.route.is_empty() => {}
        None => {
            let first_listener_route = proxy
                .listen
                .first()
                .and_then(|address| proxy.listen_routes.get(address))
                .filter(|_| every_listener_routed);
            if let Some(first) = first_listener_route {
                proxy.route = first.clone();
            } else if pool_names.len() == 1 {
                if let Some(only) = pool_names.iter().next() {
                    proxy.route = (*only).clone();
                }
            } else if pool_names.len() > 1 {
                errs.push(ErrorKind::Missing, "proxy.route", "required when there is more than one pool (name the pool or route to send requests to)");
            }
        }
    }
}

/// Reports each route cycle once, at the key of its first route (in name order) that
/// leads into it: `routes.a.default: route cycle a -> b -> a`.
fn check_cycles(routes: &BTreeMap<String, RouteConfig>, errs: &mut Errors) {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnStack,
        Done,
    }
    /// A route being visited: its name, its (key path, target) edges, the next edge to follow.
    type Frame<'a> = (&'a str, Vec<(String, String)>, usize);
    let mut marks: BTreeMap<&str, Mark> = routes.keys().map(|k| (k.as_str(), Mark::New)).collect();

    // Iterative DFS; each stack entry is (route name, its edges, next edge index).
    for start in routes.keys() {
        if marks.get(start.as_str()) != Some(&Mark::New) {
            continue;
        }
        let mut stack: Vec<Frame<'_>> = Vec::new();
        let edges_of = |name: &str| {
            routes
                .get(name)
                .map(|r| crate::checked::route_edges(&join("routes", name), r))
                .unwrap_or_default()
        };
        marks.insert(start, Mark::OnStack);
        stack.push((start, edges_of(start), 0));
        while let Some(top) = stack.last_mut() {
            let (name, edges, idx) = (top.0, &top.1, top.2);
            if idx >= edges.len() {
                marks.insert(name, Mark::Done);
                stack.pop();
                continue;
            }
            top.2 += 1;
            let target = edges[idx].1.clone();
            let Some((target_name, _)) = routes.get_key_value(&target) else {
                continue;
            }; // a pool (or unknown)
            match marks
                .get(target_name.as_str())
                .copied()
                .unwrap_or(Mark::Done)
            {
                Mark::New => {
                    marks.insert(target_name, Mark::OnStack);
                    stack.push((target_name, edges_of(target_name), 0));
                }
                Mark::OnStack => {
                    // The cycle is the stack from `target` to the top, then back to `target`.
                    let from = stack
                        .iter()
                        .position(|(n, _, _)| *n == target_name)
                        .unwrap_or(0);
                    let mut names: Vec<&str> = stack[from..].iter().map(|(n, _, _)| *n).collect();
                    names.push(target_name);
                    // The edge out of the cycle's first route is the one just taken from it.
                    let (_, first_edges, first_idx) = &stack[from];
                    let key_path = first_edges
                        .get(first_idx.saturating_sub(1))
                        .map(|(p, _)| p.clone())
                        .unwrap_or_else(|| join("routes", target_name));
                    errs.push(
                        ErrorKind::Circle,
                        &key_path,
                        format!("route cycle {}", names.join(" -> ")),
                    );
                }
                Mark::Done => {}
            }
        }
    }
}

/// `[proxy]`, and the targets its listeners name, each with its key path (checked against
/// the pools and routes once those are known).
fn check_proxy(
    t: &Table,
    prefixes: &mut RoutingPrefixConfig,
    errs: &mut Errors,
) -> (ProxyConfig, Vec<(String, String)>) {
    let path = "proxy";
    let allowed: Vec<&str> = PROXY_KEYS
        .iter()
        .chain(crate::transport::PROXY_TRANSPORT_KEYS)
        .copied()
        .collect();
    check_keys(t, path, &allowed, errs);
    let mut transport = crate::transport::check_proxy_transport(t, path, errs);
    let listeners = check_listeners(t, &mut transport, errs);
    prefixes.default = default_prefix(t, path, errs);
    prefixes.listeners = listeners.prefixes;

    let workers: usize = get_int(t, "workers", path, 0, usize_max(), 0, errs);
    let workers = if workers == 0 {
        default_workers(std::thread::available_parallelism().map_or(1, |n| n.get()))
    } else {
        workers
    };
    let backlog: u32 = get_int(
        t,
        "backlog",
        path,
        1,
        u64::from(u32::MAX),
        defaults::BACKLOG,
        errs,
    );
    let route = get_str(t, "route", path, errs)
        .unwrap_or_default()
        .to_string();
    let ProxyLimits {
        max_value_size,
        max_line_size,
        max_client_pending,
        max_connections,
        shutdown_timeout,
        drain_delay,
        max_buffered_replies,
        slow_client_timeout,
    } = check_proxy_limits(t, path, errs);
    let io = check_io(t, path, errs);
    let zone = check_zone(t, path, errs).map(|name| ProxyZone {
        name,
        source: ZoneSource::Config,
    });

    let proxy = ProxyConfig {
        zone,
        listen: listeners.listen,
        listen_routes: listeners.routes,
        listen_auth: listeners.auth,
        workers,
        io,
        backlog,
        route,
        max_value_size,
        max_line_size,
        max_client_pending,
        max_connections,
        shutdown_timeout,
        drain_delay,
        max_buffered_replies,
        slow_client_timeout,
        transport,
    };
    (proxy, listeners.route_paths)
}

/// `proxy.listen`: the addresses, and what the table entries add to them.
#[derive(Default)]
struct Listeners {
    listen: Vec<ListenAddress>,
    routes: BTreeMap<ListenAddress, String>,
    auth: BTreeMap<ListenAddress, ListenerAuth>,
    /// Listeners with their own default `routing_prefix`.
    prefixes: BTreeMap<ListenAddress, String>,
    /// Each listener's `route`, with its key path, to check once pools and routes are known.
    route_paths: Vec<(String, String)>,
}

/// `listen = "addr"`, or an array of addresses and `{ address, route, tls, auth }` tables
/// (a listener's TLS goes into `transport`).
fn check_listeners(t: &Table, transport: &mut TransportConfig, errs: &mut Errors) -> Listeners {
    let mut listeners = Listeners::default();
    match t.get("listen") {
        None => listeners
            .listen
            .push(ListenAddress::Tcp(defaults::LISTEN.to_string())),
        Some(Value::String(s)) => {
            if let Some(a) = check_listen(s, "proxy.listen", errs) {
                listeners.listen.push(a);
            }
        }
        Some(Value::Array(items)) => {
            if items.is_empty() {
                errs.push(
                    ErrorKind::Missing,
                    "proxy.listen",
                    "needs at least one address",
                );
            }
            for (i, item) in items.iter().enumerate() {
                let p = format!("proxy.listen[{i}]");
                match item {
                    Value::String(s) => {
                        if let Some(a) = check_listen(s, &p, errs) {
                            if listeners.listen.contains(&a) {
                                errs.push(
                                    ErrorKind::Conflict,
                                    &p,
                                    format!("duplicate listen address \"{s}\""),
                                );
                            }
                            listeners.listen.push(a);
                        }
                    }
                    Value::Table(entry) => listeners.add_entry(entry, &p, transport, errs),
                    other => {
                        wrong_type(errs, &p, "a string or { address, route, tls, auth }", other)
                    }
                }
            }
        }
        Some(other) => wrong_type(errs, "proxy.listen", "an array of addresses", other),
    }
    listeners
}

impl Listeners {
    /// `{ address, route, tls, auth }` at key path `p`.
    fn add_entry(
        &mut self,
        entry: &Table,
        p: &str,
        transport: &mut TransportConfig,
        errs: &mut Errors,
    ) {
        let route = get_str(entry, "route", p, errs);
        if let Some(route) = route {
            self.route_paths.push((join(p, "route"), route.to_string()));
        }
        let auth = entry
            .get("auth")
            .and_then(|v| crate::auth::check_listener_auth(v, &join(p, "auth"), errs));
        let prefix = default_prefix(entry, p, errs);
        let Some((s, tls)) = crate::transport::check_listen_entry(entry, p, errs) else {
            return;
        };
        let Some(a) = check_listen(s, &join(p, "address"), errs) else {
            return;
        };
        if self.listen.contains(&a) {
            errs.push(
                ErrorKind::Conflict,
                p,
                format!("duplicate listen address \"{s}\""),
            );
        }
        if let Some(tls) = tls {
            transport.listen_tls.insert(a.clone(), tls);
        }
        if let Some(route) = route {
            self.routes.insert(a.clone(), route.to_string());
        }
        if let Some(auth) = auth {
            self.auth.insert(a.clone(), auth);
        }
        if let Some(prefix) = prefix {
            self.prefixes.insert(a.clone(), prefix);
        }
        self.listen.push(a);
    }
}

/// `[proxy]`'s bounds on clients and on shutdown, read in the order they are documented.
struct ProxyLimits {
    max_value_size: usize,
    max_line_size: usize,
    max_client_pending: usize,
    max_connections: usize,
    shutdown_timeout: Duration,
    drain_delay: Duration,
    max_buffered_replies: usize,
    slow_client_timeout: Duration,
}

fn check_proxy_limits(t: &Table, path: &str, errs: &mut Errors) -> ProxyLimits {
    let max_value_size = get_size(t, "max_value_size", path, 1, defaults::MAX_VALUE_SIZE, errs);
    let max_line_size = get_size(
        t,
        "max_line_size",
        path,
        defaults::MIN_LINE_SIZE,
        defaults::MAX_LINE_SIZE,
        errs,
    );
    let max_client_pending: usize = get_int(
        t,
        "max_client_pending",
        path,
        1,
        usize_max(),
        defaults::MAX_CLIENT_PENDING,
        errs,
    );
    let max_connections: usize = get_int(
        t,
        "max_connections",
        path,
        0,
        usize_max(),
        defaults::MAX_CONNECTIONS,
        errs,
    );
    let shutdown_timeout = get_duration(
        t,
        "shutdown_timeout",
        path,
        Duration::from_millis(defaults::SHUTDOWN_TIMEOUT_MS),
        errs,
    );
    // 0 is meaningful here: stop accepting at once, with no drain delay.
    let drain_delay = match t.get("drain_delay") {
        None => Duration::from_millis(defaults::DRAIN_DELAY_MS),
        Some(v) => parse_duration(v).unwrap_or_else(|m| {
            errs.push(parse_error_kind(v, &m), &join(path, "drain_delay"), m);
            Duration::from_millis(defaults::DRAIN_DELAY_MS)
        }),
    };
    // 0 turns the budget off.
    let max_buffered_replies = get_size(
        t,
        "max_buffered_replies",
        path,
        0,
        defaults::MAX_BUFFERED_REPLIES,
        errs,
    );
    let slow_client_timeout = get_duration(
        t,
        "slow_client_timeout",
        path,
        Duration::from_millis(defaults::SLOW_CLIENT_TIMEOUT_MS),
        errs,
    );

    ProxyLimits {
        max_value_size,
        max_line_size,
        max_client_pending,
        max_connections,
        shutdown_timeout,
        drain_delay,
        max_buffered_replies,
        slow_client_timeout,
    }
}

/// `io = "epoll" | "io_uring"`.
fn check_io(t: &Table, path: &str, errs: &mut Errors) -> IoMode {
    match get_str(t, "io", path, errs) {
        None => IoMode::default(),
        Some(text) => match IoMode::NAMES.iter().find(|(name, _)| *name == text) {
            Some(&(_, mode)) => mode,
            None => {
                let expected: Vec<String> = IoMode::NAMES
                    .iter()
                    .map(|(name, _)| format!("\"{name}\""))
                    .collect();
                errs.push(
                    ErrorKind::Invalid,
                    &join(path, "io"),
                    format!(
                        "unknown I/O mode `{text}`; expected {}",
                        expected.join(" or ")
                    ),
                );
                IoMode::default()
            }
        },
    }
}

/// `zone = "..."` of `[proxy]` or a pool: a name without surrounding blanks (a zone is
/// compared as written: `"eu-west-1a"` and `"eu-west-1a "` would never match).
fn check_zone(t: &Table, path: &str, errs: &mut Errors) -> Option<String> {
    let zone = get_str(t, "zone", path, errs)?;
    if zone.is_empty() || zone.trim() != zone {
        errs.push(
            ErrorKind::Invalid,
            &join(path, "zone"),
            format!("must be a zone name without surrounding blanks (found {zone:?})"),
        );
        return None;
    }
    Some(zone.to_string())
}

fn check_listen(s: &str, path: &str, errs: &mut Errors) -> Option<ListenAddress> {
    if let Some(p) = s.strip_prefix("unix:") {
        if !p.starts_with('/') {
            errs.push(
                ErrorKind::Invalid,
                path,
                format!("invalid unix socket address \"{s}\" (expected unix:/absolute/path)"),
            );
            return None;
        }
        return Some(ListenAddress::Unix(PathBuf::from(p)));
    }
    match check_host_port(s) {
        Ok(()) => Some(ListenAddress::Tcp(s.to_string())),
        Err(m) => {
            errs.push(ErrorKind::Invalid, path, format!("{m}, or unix:/path"));
            None
        }
    }
}

fn check_admin(t: &Table, errs: &mut Errors) -> AdminConfig {
    check_keys(t, "admin", ADMIN_KEYS, errs);
    let listen = match get_str(t, "listen", "admin", errs) {
        Some(s) => {
            if let Err(m) = check_host_port(s) {
                errs.push(ErrorKind::Invalid, "admin.listen", m);
            }
            s.to_string()
        }
        None => {
            if !t.contains_key("listen") {
                errs.push(
                    ErrorKind::Missing,
                    "admin.listen",
                    "required when [admin] is present",
                );
            }
            String::new()
        }
    };
    let ready_fraction = t
        .get("ready_fraction")
        .and_then(|v| check_unit_number(v, "admin.ready_fraction", errs))
        .unwrap_or(0.0);
    AdminConfig {
        listen,
        ready_fraction,
        token: check_admin_token(t, errs),
        hot_keys_sample: get_int(
            t,
            "hot_keys_sample",
            "admin",
            0,
            1 << 20,
            AdminConfig::HOT_KEYS_SAMPLE,
            errs,
        ),
        hot_keys_interval: get_duration(
            t,
            "hot_keys_interval",
            "admin",
            AdminConfig::HOT_KEYS_INTERVAL,
            errs,
        ),
        show_keys: get_bool(t, "show_keys", "admin", true, errs),
    }
}

fn check_admin_token(t: &Table, errs: &mut Errors) -> Option<AdminToken> {
    let inline = get_str(t, "token", "admin", errs);
    let file = get_str(t, "token_file", "admin", errs);
    match (inline, file) {
        (Some(_), Some(_)) => {
            errs.push(
                ErrorKind::Conflict,
                "admin.token_file",
                "set admin.token or admin.token_file, not both",
            );
            None
        }
        (Some(""), None) => {
            errs.push(ErrorKind::Invalid, "admin.token", "must not be empty");
            None
        }
        (None, Some("")) => {
            errs.push(ErrorKind::Invalid, "admin.token_file", "must not be empty");
            None
        }
        (Some(token), None) => Some(AdminToken::Inline(token.to_string())),
        (None, Some(path)) => Some(AdminToken::File(PathBuf::from(path))),
        (None, None) => None,
    }
}

fn check_discovery(t: &Table, errs: &mut Errors) -> DiscoveryConfig {
    let path = "discovery";
    check_keys(t, path, DISCOVERY_KEYS, errs);
    let hosts_file = get_str(t, "hosts_file", path, errs).and_then(|s| {
        if s.is_empty() {
            errs.push(
                ErrorKind::Invalid,
                &join(path, "hosts_file"),
                "must not be empty",
            );
            None
        } else {
            Some(PathBuf::from(s))
        }
    });
    let nameservers = match t.get("nameservers") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| {
                let item_path = format!("{path}.nameservers[{i}]");
                match item {
                    Value::String(text) => match parse_nameserver(text) {
                        Some(address) => Some(address),
                        None => {
                            errs.push(ErrorKind::Invalid,
                                &item_path,
                                format!("invalid nameserver \"{text}\" (expected \"ip\" or \"ip:port\", e.g. \"10.96.0.10:53\")"),
                            );
                            None
                        }
                    },
                    other => {
                        wrong_type(errs, &item_path, "a string", other);
                        None
                    }
                }
            })
            .collect(),
        Some(other) => {
            wrong_type(errs, &join(path, "nameservers"), "an array of \"ip:port\" strings", other);
            Vec::new()
        }
    };
    DiscoveryConfig {
        hosts_file,
        nameservers,
    }
}

/// A nameserver address: `ip:port`, `[v6]:port`, or a bare IP meaning port 53.
fn parse_nameserver(text: &str) -> Option<std::net::SocketAddr> {
    text.parse().ok().or_else(|| {
        text.parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| std::net::SocketAddr::new(ip, 53))
    })
}

fn check_pool(t: &Table, path: &str, errs: &mut Errors) -> Option<PoolConfig> {
    let before = errs.0.len();
    check_keys(t, path, POOL_KEYS, errs);
    let (placement, discovery) = check_placement(t, path, errs);
    let connections: usize = get_int(t, "connections", path, 1, 1024, defaults::CONNECTIONS, errs);
    let max_keys_per_request: usize = get_int(
        t,
        "max_keys_per_request",
        path,
        1,
        usize_max(),
        defaults::MAX_KEYS_PER_REQUEST,
        errs,
    );
    let coalesce_gets = get_bool(t, "coalesce_gets", path, true, errs);
    let collapse_gets = get_bool(t, "collapse_gets", path, true, errs);
    let hot_cache = check_hot_cache(t, path, errs);
    let default_timeout = Duration::from_millis(defaults::TIMEOUT_MS);
    let timeout = get_duration(t, "timeout", path, default_timeout, errs);
    let connect_timeout = get_duration(t, "connect_timeout", path, timeout, errs);
    let resize_window = get_duration_or_zero(
        t,
        "resize_window",
        path,
        Duration::from_millis(defaults::RESIZE_WINDOW_MS),
        errs,
    );

    let PoolHealth {
        failure_limit,
        eject,
        max_ejected_fraction,
        probe_interval,
        probe_interval_max,
    } = check_pool_health(t, path, errs);
    let tls = t
        .get("tls")
        .and_then(|v| crate::transport::check_backend_tls(v, &join(path, "tls"), errs));
    let zone = check_zone(t, path, errs);
    let auth = t
        .get("auth")
        .and_then(|v| crate::auth::check_backend_auth(v, &join(path, "auth"), errs));

    (errs.0.len() == before).then_some(PoolConfig {
        tls,
        zone,
        auth,
        placement,
        discovery,
        failure_limit,
        eject,
        max_ejected_fraction,
        probe_interval,
        probe_interval_max,
        connections,
        timeout,
        connect_timeout,
        max_keys_per_request,
        coalesce_gets,
        collapse_gets,
        hot_cache,
        resize_window,
    })
}

/// `hot_cache = { ttl = "500ms", keys = 32 }`: absent means off.
fn check_hot_cache(t: &Table, path: &str, errs: &mut Errors) -> Option<HotCache> {
    let table = get_table(t, "hot_cache", path, errs)?;
    let path = join(path, "hot_cache");
    check_keys(table, &path, &["ttl", "keys"], errs);
    let ttl = get_duration(table, "ttl", &path, HotCache::TTL, errs);
    let keys: usize = get_int(table, "keys", &path, 1, 1024, HotCache::KEYS, errs);
    Some(HotCache { ttl, keys })
}

/// Where a pool's keys go: its servers (or their DNS name) and how keys are spread over them.
fn check_placement(t: &Table, path: &str, errs: &mut Errors) -> (PoolSpec, Option<DnsDiscovery>) {
    let servers_path = join(path, "servers");
    let (servers, discovery) = match t.get("servers") {
        Some(Value::Table(dns)) => (Vec::new(), check_dns(dns, &servers_path, errs)),
        other => (check_servers(other, &servers_path, errs), None),
    };

    let distribution = check_distribution(t, path, errs);
    let hash = check_hash(t, path, errs);
    let hash_tag = get_str(t, "hash_tag", path, errs).and_then(|s| match s.as_bytes() {
        [a, b] => Some([*a, *b]),
        _ => {
            errs.push(
                ErrorKind::Invalid,
                &join(path, "hash_tag"),
                format!("must be exactly two bytes, e.g. \"{{}}\" (found \"{s}\")"),
            );
            None
        }
    });
    let vnodes: u32 = get_int(
        t,
        "vnodes",
        path,
        1,
        u64::from(u32::MAX),
        defaults::VNODES,
        errs,
    );
    let weights = check_weights(t, path, distribution, servers.len(), errs);
    let salt = check_salt(t, path, distribution, errs);
    let spec = PoolSpec {
        servers,
        distribution,
        hash,
        hash_tag,
        vnodes,
        weights,
        salt,
        discovered: discovery.is_some(),
    };
    (spec, discovery)
}

fn check_distribution(t: &Table, path: &str, errs: &mut Errors) -> DistributionName {
    match get_str(t, "distribution", path, errs) {
        None => DistributionName::Ketama,
        Some(s) => DistributionName::parse(s).unwrap_or_else(|| {
            let all: Vec<&str> = DistributionName::ALL.iter().map(|d| d.as_str()).collect();
            errs.push(
                ErrorKind::Invalid,
                &join(path, "distribution"),
                format!(
                    "unknown distribution \"{s}\" (expected one of: {})",
                    all.join(", ")
                ),
            );
            DistributionName::Ketama
        }),
    }
}

fn check_hash(t: &Table, path: &str, errs: &mut Errors) -> HashName {
    match get_str(t, "hash", path, errs) {
        None => HashName::Fnv1a_64,
        Some(s) => HashName::parse(s).unwrap_or_else(|| {
            let all: Vec<&str> = HashName::ALL.iter().map(|h| h.as_str()).collect();
            errs.push(
                ErrorKind::Invalid,
                &join(path, "hash"),
                format!("unknown hash \"{s}\" (expected one of: {})", all.join(", ")),
            );
            HashName::Fnv1a_64
        }),
    }
}

/// How a pool's servers are marked down, ejected and probed.
struct PoolHealth {
    failure_limit: u32,
    eject: bool,
    max_ejected_fraction: f64,
    probe_interval: Duration,
    probe_interval_max: Duration,
}

fn check_pool_health(t: &Table, path: &str, errs: &mut Errors) -> PoolHealth {
    let failure_limit: u32 = get_int(
        t,
        "failure_limit",
        path,
        1,
        u64::from(u32::MAX),
        defaults::FAILURE_LIMIT,
        errs,
    );
    let eject = get_bool(t, "eject", path, false, errs);
    let max_ejected_fraction = t
        .get("max_ejected_fraction")
        .and_then(|v| check_unit_number(v, &join(path, "max_ejected_fraction"), errs))
        .unwrap_or(defaults::MAX_EJECTED_FRACTION);
    let probe_interval = get_duration(
        t,
        "probe_interval",
        path,
        Duration::from_millis(defaults::PROBE_INTERVAL_MS),
        errs,
    );
    // Unset, the ceiling is the default one or the first interval if that is longer, so raising
    // only `probe_interval` is never an error.
    let probe_interval_max = match t.get("probe_interval_max") {
        None => probe_interval.max(Duration::from_millis(defaults::PROBE_INTERVAL_MAX_MS)),
        Some(_) => {
            let max = get_duration(t, "probe_interval_max", path, probe_interval, errs);
            if max < probe_interval {
                errs.push(
                    ErrorKind::OutOfRange,
                    &join(path, "probe_interval_max"),
                    format!("must be at least probe_interval (found {max:?} < {probe_interval:?})"),
                );
            }
            max
        }
    };
    PoolHealth {
        failure_limit,
        eject,
        max_ejected_fraction,
        probe_interval,
        probe_interval_max,
    }
}

const NO_SERVERS: &str = "a pool needs at least one server (or servers = { dns = ... })";

/// `servers = { dns = "name:port", refresh = "5s" }` or `servers = { srv = "_s._tcp.name" }`.
fn check_dns(t: &Table, path: &str, errs: &mut Errors) -> Option<DnsDiscovery> {
    let before = errs.0.len();
    check_keys(t, path, DNS_KEYS, errs);
    let dns_path = join(path, "dns");
    let srv_path = join(path, "srv");
    let target = match (t.contains_key("dns"), t.contains_key("srv")) {
        (true, true) => {
            errs.push(ErrorKind::Conflict, path, "give either dns = \"name:port\" or srv = \"_service._proto.name\", not both");
            None
        }
        (false, false) => {
            errs.push(ErrorKind::Missing,
                &dns_path,
                "required (the name to resolve, as \"name:port\"; or srv = \"_service._proto.name\")",
            );
            None
        }
        (true, false) => get_str(t, "dns", path, errs).and_then(|spec| match split_dns_spec(spec) {
            Ok((host, port)) => Some((host, port, DnsKind::Address)),
            Err(m) => {
                errs.push(ErrorKind::Invalid, &dns_path, m);
                None
            }
        }),
        (false, true) => get_str(t, "srv", path, errs).and_then(|name| {
            if check_srv_name(name) {
                Some((name.to_string(), 0, DnsKind::Srv))
            } else {
                errs.push(ErrorKind::Invalid,
                    &srv_path,
                    format!("invalid SRV name \"{name}\" (expected \"_service._proto.name\", e.g. \"_memcache._tcp.memcached.cache.svc.cluster.local\")"),
                );
                None
            }
        }),
    };
    let refresh = get_duration(
        t,
        "refresh",
        path,
        Duration::from_millis(defaults::DNS_REFRESH_MS),
        errs,
    );
    let (host, port, kind) = target?;
    (errs.0.len() == before).then_some(DnsDiscovery {
        host,
        port,
        refresh,
        kind,
    })
}

/// An SRV name: `_service._proto.` followed by a non-empty domain, no spaces or ports.
fn check_srv_name(name: &str) -> bool {
    let mut labels = name.split('.');
    let service = labels.next().unwrap_or_default();
    let proto = labels.next().unwrap_or_default();
    let rest: Vec<&str> = labels.collect();
    service.len() > 1
        && service.starts_with('_')
        && proto.len() > 1
        && proto.starts_with('_')
        && rest.iter().any(|label| !label.is_empty())
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == '/' || c == ':' || c == '[' || c == ']')
}

/// Splits `name:port` for DNS discovery: a non-empty name and a port 1-65535.
fn split_dns_spec(spec: &str) -> Result<(String, u16), String> {
    let bad = || {
        format!("invalid DNS name \"{spec}\" (expected \"name:port\", e.g. \"memcached.cache.svc:11211\")")
    };
    let (host, port) = spec.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty()
        || host
            .chars()
            .any(|c| c.is_whitespace() || c == '/' || c == ':' || c == '[' || c == ']')
    {
        return Err(bad());
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(port) => Ok((host.to_string(), port)),
    }
}

/// A number in [0, 1]: a float, or the integer 0 or 1.
fn check_unit_number(v: &Value, path: &str, errs: &mut Errors) -> Option<f64> {
    let x = match v {
        Value::Float(f) => *f,
        // i64 -> f64 is exact for every integer this range check lets through.
        Value::Integer(n) => *n as f64,
        other => {
            wrong_type(errs, path, "a number between 0 and 1", other);
            return None;
        }
    };
    // `contains` is false for NaN, which TOML can spell as `nan`.
    if (0.0..=1.0).contains(&x) {
        Some(x)
    } else {
        // Shown as written in TOML (`nan`, `inf`), not as Rust prints it.
        errs.push(
            ErrorKind::OutOfRange,
            path,
            format!("must be between 0 and 1 (found {v})"),
        );
        None
    }
}

/// `weights = [1, 0.5, ...]`: mcrouter's per-server weights, for `wch3` only. A list
/// whose length differs from a static pool's server count is an error here (mcrouter
/// pads with 0.5 or cuts; `import-mcrouter` writes that out explicitly).
fn check_weights(
    t: &Table,
    path: &str,
    distribution: DistributionName,
    servers: usize,
    errs: &mut Errors,
) -> Vec<f64> {
    let weights_path = join(path, "weights");
    let Some(v) = t.get("weights") else {
        if distribution == DistributionName::WeightedCh3 {
            errs.push(
                ErrorKind::Missing,
                &weights_path,
                "required by distribution \"wch3\"",
            );
        }
        return Vec::new();
    };
    if distribution != DistributionName::WeightedCh3 {
        errs.push(
            ErrorKind::Conflict,
            &weights_path,
            "only used by distribution \"wch3\"",
        );
        return Vec::new();
    }
    let Value::Array(items) = v else {
        wrong_type(
            errs,
            &weights_path,
            "an array of numbers between 0 and 1",
            v,
        );
        return Vec::new();
    };
    if servers > 0 && items.len() != servers {
        errs.push(
            ErrorKind::Conflict,
            &weights_path,
            format!("has {} weights for {servers} servers", items.len()),
        );
    }
    items
        .iter()
        .enumerate()
        .filter_map(|(i, w)| check_unit_number(w, &format!("{weights_path}[{i}]"), errs))
        .collect()
}

/// `salt = "..."`: mcrouter's hash salt, for its distributions only.
fn check_salt(t: &Table, path: &str, distribution: DistributionName, errs: &mut Errors) -> String {
    let Some(salt) = get_str(t, "salt", path, errs) else {
        return String::new();
    };
    if !matches!(
        distribution,
        DistributionName::Ch3 | DistributionName::WeightedCh3 | DistributionName::Crc32
    ) {
        errs.push(
            ErrorKind::Conflict,
            &join(path, "salt"),
            "only used by distributions \"ch3\", \"wch3\" and \"crc32\"",
        );
    }
    salt.to_string()
}

fn check_servers(v: Option<&Value>, path: &str, errs: &mut Errors) -> Vec<ServerConfig> {
    let items = match v {
        None => {
            errs.push(ErrorKind::Missing, path, NO_SERVERS);
            return Vec::new();
        }
        Some(Value::Array(items)) => items,
        Some(other) => {
            wrong_type(
                errs,
                path,
                "an array of servers or a table { dns = \"name:port\" }",
                other,
            );
            return Vec::new();
        }
    };
    if items.is_empty() {
        errs.push(ErrorKind::Missing, path, NO_SERVERS);
    }
    let mut servers: Vec<ServerConfig> = Vec::new();
    // Where each address and name was first seen, to name the duplicate's twin.
    let mut seen_addr: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen_name: BTreeMap<String, usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let Some(server) = check_server(item, &p, errs) else {
            continue;
        };
        if let Some(first) = seen_addr.get(&server.address) {
            errs.push(
                ErrorKind::Conflict,
                &format!("{p}.address"),
                format!(
                    "duplicate address \"{}\" (also servers[{first}])",
                    server.address
                ),
            );
        } else {
            seen_addr.insert(server.address.clone(), i);
        }
        if let Some(name) = &server.name {
            if let Some(first) = seen_name.get(name) {
                errs.push(
                    ErrorKind::Conflict,
                    &format!("{p}.name"),
                    format!("duplicate name \"{name}\" (also servers[{first}])"),
                );
            } else {
                seen_name.insert(name.clone(), i);
            }
        }
        servers.push(server);
    }
    servers
}

/// One server: `"host:port"`, `"host:port:weight"`, `"host:port:weight name"` (twemproxy's
/// form) or `{ address, weight, name }`. Both forms report problems at the same
/// sub-paths (`servers[1].weight`), so messages read the same whichever form is used.
fn check_server(v: &Value, path: &str, errs: &mut Errors) -> Option<ServerConfig> {
    let before = errs.0.len();
    let (address, weight, name) = match v {
        Value::String(s) => {
            let mut words = s.split_whitespace();
            let spec = words.next().unwrap_or("");
            let name = words.next().map(str::to_string);
            if words.next().is_some() {
                errs.push(
                    ErrorKind::Invalid,
                    path,
                    format!("invalid server \"{s}\" (expected \"host:port[:weight] [name]\")"),
                );
                return None;
            }
            let (address, weight) = split_weight(spec);
            let weight = match weight {
                None => defaults::WEIGHT,
                Some(w) => match w.parse::<i64>() {
                    Ok(n) => check_range(
                        n,
                        1,
                        u64::from(u32::MAX),
                        &format!("{path}.weight"),
                        1,
                        errs,
                    ),
                    Err(_) => {
                        errs.push(
                            ErrorKind::WrongType,
                            &format!("{path}.weight"),
                            format!("expected an integer, found \"{w}\""),
                        );
                        1
                    }
                },
            };
            (address.to_string(), weight, name)
        }
        Value::Table(t) => {
            check_keys(t, path, SERVER_KEYS, errs);
            let address = match get_str(t, "address", path, errs) {
                Some(a) => a.to_string(),
                None => {
                    if !t.contains_key("address") {
                        errs.push(ErrorKind::Missing, &format!("{path}.address"), "required");
                    }
                    return None;
                }
            };
            let weight: u32 = get_int(
                t,
                "weight",
                path,
                1,
                u64::from(u32::MAX),
                defaults::WEIGHT,
                errs,
            );
            let name = get_str(t, "name", path, errs).map(str::to_string);
            (address, weight, name)
        }
        other => {
            wrong_type(
                errs,
                path,
                "a server string \"host:port[:weight] [name]\" or a table",
                other,
            );
            return None;
        }
    };
    if let Err(m) = check_host_port(&address) {
        errs.push(ErrorKind::Invalid, &format!("{path}.address"), m);
    }
    if let Some(n) = &name {
        if n.is_empty() || n.chars().any(char::is_whitespace) {
            errs.push(
                ErrorKind::Invalid,
                &format!("{path}.name"),
                "must be non-empty and contain no whitespace",
            );
        }
    }
    (errs.0.len() == before).then_some(ServerConfig {
        address,
        weight,
        name,
    })
}

/// Splits `host:port:weight` into (`host:port`, Some(weight)); `host:port` and
/// `[v6]:port` are left whole.
fn split_weight(spec: &str) -> (&str, Option<&str>) {
    let colons = if spec.starts_with('[') {
        // Only colons after the closing bracket separate fields.
        spec.find(']')
            .map_or(0, |end| spec[end..].matches(':').count())
    } else {
        spec.matches(':').count()
    };
    if colons >= 2 {
        match spec.rsplit_once(':') {
            Some((addr, w)) => (addr, Some(w)),
            None => (spec, None),
        }
    } else {
        (spec, None)
    }
}

fn check_route(t: &Table, path: &str, errs: &mut Errors) -> Option<RouteConfig> {
    let before = errs.0.len();
    let kind = match t.get("type") {
        None => {
            errs.push(
                ErrorKind::Missing,
                &join(path, "type"),
                format!("required (one of: {})", ROUTE_TYPES.join(", ")),
            );
            return None;
        }
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            wrong_type(errs, &join(path, "type"), "a string", other);
            return None;
        }
    };
    let route = match kind {
        "prefix" => check_prefix_route(t, path, errs),
        "operation" => check_operation_route(t, path, errs),
        "shadow" => check_shadow_route(t, path, errs),
        "replicated" => {
            check_keys(t, path, REPLICATED_ROUTE_KEYS, errs);
            RouteConfig::Replicated {
                children: get_children(t, path, errs),
                writes: get_choice(
                    t,
                    "writes",
                    path,
                    WRITE_POLICIES,
                    WritePolicy::AllSync,
                    errs,
                ),
                reads: get_choice(t, "reads", path, READ_POLICIES, ReadPolicy::Failover, errs),
            }
        }
        "failover" => check_failover_route(t, path, errs),
        "warm-up" => check_warm_up_route(t, path, errs),
        "random" => {
            check_keys(t, path, RANDOM_ROUTE_KEYS, errs);
            RouteConfig::Random {
                children: get_children(t, path, errs),
            }
        }
        "null" => {
            check_keys(t, path, NULL_ROUTE_KEYS, errs);
            RouteConfig::Null
        }
        "error" => {
            check_keys(t, path, ERROR_ROUTE_KEYS, errs);
            let message = match get_str(t, "message", path, errs) {
                None => defaults::ERROR_ROUTE_MESSAGE.to_string(),
                Some(m) => {
                    // The message is written into a reply line; a line break would
                    // end the reply early and desynchronise the client.
                    if m.is_empty() || m.contains(['\r', '\n']) {
                        errs.push(
                            ErrorKind::Invalid,
                            &join(path, "message"),
                            "must be non-empty and on one line (no \\r or \\n)",
                        );
                    }
                    m.to_string()
                }
            };
            RouteConfig::Error { message }
        }
        other => {
            errs.push(
                ErrorKind::Invalid,
                &join(path, "type"),
                format!(
                    "unknown route type \"{other}\" (expected one of: {})",
                    ROUTE_TYPES.join(", ")
                ),
            );
            return None;
        }
    };
    (errs.0.len() == before).then_some(route)
}

fn check_prefix_route(t: &Table, path: &str, errs: &mut Errors) -> RouteConfig {
    check_keys(t, path, PREFIX_ROUTE_KEYS, errs);
    let ppath = join(path, "prefixes");
    let mut prefixes = Vec::new();
    match t.get("prefixes") {
        None => errs.push(
            ErrorKind::Missing,
            &ppath,
            "a prefix route needs at least one prefix",
        ),
        Some(Value::Table(pt)) => {
            if pt.is_empty() {
                errs.push(
                    ErrorKind::Missing,
                    &ppath,
                    "a prefix route needs at least one prefix",
                );
            }
            for (prefix, target) in pt {
                let kp = join(&ppath, prefix);
                if prefix.is_empty() {
                    errs.push(
                        ErrorKind::Invalid,
                        &kp,
                        "a prefix must not be empty (use `default` for other keys)",
                    );
                }
                match target {
                    Value::String(s) => prefixes.push((prefix.clone(), s.clone())),
                    other => wrong_type(errs, &kp, "a target name (string)", other),
                }
            }
        }
        Some(other) => wrong_type(errs, &ppath, "a table of prefix = target", other),
    }
    // Longest prefix first, so the first match is the most specific one;
    // ties (impossible for distinct keys of equal length to both match) by name.
    prefixes.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    let default = required_target(
        t,
        "default",
        path,
        "the target for keys no prefix matches",
        errs,
    );
    RouteConfig::Prefix { prefixes, default }
}

fn check_operation_route(t: &Table, path: &str, errs: &mut Errors) -> RouteConfig {
    let op_names: Vec<&str> = Operation::ALL.iter().map(|o| o.as_str()).collect();
    let allowed: Vec<&str> = ["type", "default"]
        .into_iter()
        .chain(op_names.clone())
        .collect();
    check_keys(t, path, &allowed, errs);
    // In Operation::ALL order, not file order, so equal configs compare equal.
    let mut operations = Vec::new();
    for op in Operation::ALL {
        if let Some(target) = get_str(t, op.as_str(), path, errs) {
            operations.push((op, target.to_string()));
        }
    }
    let named = Operation::ALL.iter().any(|op| t.contains_key(op.as_str()));
    if !named {
        errs.push(
            ErrorKind::Missing,
            path,
            format!(
                "an operation route needs at least one operation (one of: {})",
                op_names.join(", ")
            ),
        );
    }
    let default = required_target(
        t,
        "default",
        path,
        "the target for operations not named here",
        errs,
    );
    RouteConfig::Operation {
        operations,
        default,
    }
}

fn check_shadow_route(t: &Table, path: &str, errs: &mut Errors) -> RouteConfig {
    check_keys(t, path, SHADOW_ROUTE_KEYS, errs);
    let primary = required_target(t, "primary", path, "the target that answers clients", errs);
    let shadow = required_target(
        t,
        "shadow",
        path,
        "the target that gets a copy of the selected requests",
        errs,
    );
    if !primary.is_empty() && primary == shadow {
        errs.push(
            ErrorKind::Conflict,
            &join(path, "shadow"),
            format!("must differ from primary (both are \"{primary}\")"),
        );
    }
    let fraction = t
        .get("fraction")
        .and_then(|v| check_unit_number(v, &join(path, "fraction"), errs));
    let key_range = t
        .get("key_range")
        .and_then(|v| check_key_range(v, &join(path, "key_range"), errs));
    let select = match (t.contains_key("fraction"), t.contains_key("key_range")) {
        (true, true) => {
            errs.push(ErrorKind::Conflict,
                path,
                "set either fraction or key_range, not both (they both choose which keys are shadowed)",
            );
            None
        }
        (false, false) => {
            errs.push(
                ErrorKind::Missing,
                path,
                "required: fraction = f or key_range = [a, b] (which keys are shadowed)",
            );
            None
        }
        _ => fraction
            .map(ShadowSelect::Fraction)
            .or(key_range.map(|(a, b)| ShadowSelect::KeyRange(a, b))),
    };
    let max_in_flight: usize = get_int(
        t,
        "max_in_flight",
        path,
        1,
        usize_max(),
        defaults::SHADOW_MAX_IN_FLIGHT,
        errs,
    );
    RouteConfig::Shadow {
        primary,
        shadow,
        // Only a placeholder when an error was reported, so never used.
        select: select.unwrap_or(ShadowSelect::Fraction(0.0)),
        max_in_flight,
    }
}

/// `key_range = [a, b]` with 0 <= a <= b <= 1.
fn check_key_range(v: &Value, path: &str, errs: &mut Errors) -> Option<(f64, f64)> {
    let Value::Array(items) = v else {
        wrong_type(errs, path, "an array [a, b] of two numbers", v);
        return None;
    };
    let [a, b] = items.as_slice() else {
        errs.push(
            ErrorKind::Invalid,
            path,
            format!("must be two numbers [a, b] (found {})", v),
        );
        return None;
    };
    let a = check_unit_number(a, &format!("{path}[0]"), errs);
    let b = check_unit_number(b, &format!("{path}[1]"), errs);
    let (a, b) = (a?, b?);
    if a > b {
        errs.push(
            ErrorKind::Invalid,
            path,
            format!("the range must not be reversed: need a <= b (found [{a}, {b}])"),
        );
        return None;
    }
    Some((a, b))
}

use crate::checked::FailoverErrors;

fn check_failover_route(t: &Table, path: &str, errs: &mut Errors) -> RouteConfig {
    check_keys(t, path, FAILOVER_ROUTE_KEYS, errs);
    // 0 is mcrouter's "no cap" (its FailoverWithExptimeRoute caps only above 0).
    let exptime_cap = t
        .get("failover_exptime")
        .and_then(|v| check_ttl(v, &join(path, "failover_exptime"), errs))
        .filter(|&secs| secs > 0);
    RouteConfig::Failover {
        children: get_children(t, path, errs),
        on: get_choice(t, "on", path, FAILOVER_ON, FailoverOn::Error, errs),
        errors: check_failover_errors(t, path, errs),
        exptime_cap,
    }
}

/// `failover_errors = ["tko", "connect_error", ...]`: mcrouter's names (every error by
/// default). A name mcrouter does not know is an error, as in mcrouter.
fn check_failover_errors(t: &Table, path: &str, errs: &mut Errors) -> FailoverErrors {
    use crate::checked::ErrorClass;
    let Some(value) = t.get("failover_errors") else {
        return FailoverErrors::ALL;
    };
    let path = join(path, "failover_errors");
    let Value::Array(items) = value else {
        wrong_type(errs, &path, "an array of error names", value);
        return FailoverErrors::ALL;
    };
    let mut classes = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match item
            .as_str()
            .map(|name| (name, ErrorClass::from_name(name)))
        {
            Some((_, Some(class))) => classes.push(class),
            Some((name, None)) => {
                let known: Vec<&str> = ErrorClass::NAMES.iter().map(|&(n, _)| n).collect();
                errs.push(
                    ErrorKind::Invalid,
                    &at,
                    format!("unknown error \"{name}\" (one of: {})", known.join(", ")),
                );
            }
            None => wrong_type(errs, &at, "a string", item),
        }
    }
    FailoverErrors::of(classes)
}

fn check_warm_up_route(t: &Table, path: &str, errs: &mut Errors) -> RouteConfig {
    check_keys(t, path, WARM_UP_ROUTE_KEYS, errs);
    let cold = required_target(
        t,
        "cold",
        path,
        "the target that is read first and filled",
        errs,
    );
    let warm = required_target(t, "warm", path, "the target read on a miss in cold", errs);
    if !cold.is_empty() && cold == warm {
        errs.push(
            ErrorKind::Conflict,
            &join(path, "warm"),
            format!("must differ from cold (both are \"{cold}\")"),
        );
    }
    let ttl = t
        .get("ttl")
        .and_then(|v| check_ttl(v, &join(path, "ttl"), errs))
        .unwrap_or(0);
    RouteConfig::WarmUp { cold, warm, ttl }
}

/// A memcached exptime in whole seconds: an integer number of **seconds** (as memcached
/// itself takes it) or a duration string; 0 means never expire.
fn check_ttl(v: &Value, path: &str, errs: &mut Errors) -> Option<u32> {
    let d = match v {
        Value::Integer(n) => match u64::try_from(*n) {
            Ok(secs) => Duration::from_secs(secs),
            Err(_) => {
                errs.push(ErrorKind::OutOfRange, path, "must be >= 0");
                return None;
            }
        },
        Value::String(_) => match parse_duration(v) {
            Ok(d) => d,
            Err(m) => {
                errs.push(ErrorKind::Invalid, path, m);
                return None;
            }
        },
        other => {
            wrong_type(
                errs,
                path,
                "a duration such as \"1h\" or an integer number of seconds",
                other,
            );
            return None;
        }
    };
    if !d.is_zero() && d < Duration::from_secs(1) {
        errs.push(
            ErrorKind::OutOfRange,
            path,
            "must be at least 1s (memcached expiry is in whole seconds; 0 = never)",
        );
        return None;
    }
    let secs = d.as_secs();
    // memcached reads a larger exptime as an absolute unix time, so a warm-up fill
    // would store items that are already expired.
    if secs > MAX_RELATIVE_EXPTIME {
        errs.push(ErrorKind::OutOfRange,
            path,
            format!("must be at most 30 days ({MAX_RELATIVE_EXPTIME}s): memcached reads a larger expiry as a unix timestamp (found {secs}s)"),
        );
        return None;
    }
    u32::try_from(secs).ok()
}

/// A target name that must be present; empty (never a valid name) when missing or wrong.
fn required_target(t: &Table, key: &str, path: &str, what: &str, errs: &mut Errors) -> String {
    match get_str(t, key, path, errs) {
        Some(s) => s.to_string(),
        None => {
            if !t.contains_key(key) {
                errs.push(
                    ErrorKind::Missing,
                    &join(path, key),
                    format!("required ({what})"),
                );
            }
            String::new()
        }
    }
}

/// `children = ["a", "b"]`: a non-empty list of distinct target names.
fn get_children(t: &Table, path: &str, errs: &mut Errors) -> Vec<String> {
    let cpath = join(path, "children");
    let items = match t.get("children") {
        None => {
            errs.push(
                ErrorKind::Missing,
                &cpath,
                "required (a non-empty array of target names)",
            );
            return Vec::new();
        }
        Some(Value::Array(items)) => items,
        Some(other) => {
            wrong_type(errs, &cpath, "an array of target names", other);
            return Vec::new();
        }
    };
    if items.is_empty() {
        errs.push(ErrorKind::Missing, &cpath, "needs at least one child");
    }
    let mut children: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = format!("{cpath}[{i}]");
        match item {
            Value::String(s) => {
                // The same child twice would get every write twice and count twice
                // towards a majority: always a mistake.
                if let Some(first) = children.iter().position(|c| c == s) {
                    errs.push(
                        ErrorKind::Conflict,
                        &p,
                        format!("duplicate child \"{s}\" (also children[{first}])"),
                    );
                }
                children.push(s.clone());
            }
            other => wrong_type(errs, &p, "a target name (string)", other),
        }
    }
    children
}

/// One of a fixed set of spellings, or `default` when absent.
fn get_choice<T: Copy>(
    t: &Table,
    key: &str,
    path: &str,
    choices: &[(&str, T)],
    default: T,
    errs: &mut Errors,
) -> T {
    let Some(s) = get_str(t, key, path, errs) else {
        return default;
    };
    match choices.iter().find(|(name, _)| *name == s) {
        Some((_, v)) => *v,
        None => {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            errs.push(
                ErrorKind::Invalid,
                &join(path, key),
                format!(
                    "unknown value \"{s}\" (expected one of: {})",
                    names.join(", ")
                ),
            );
            default
        }
    }
}

/// `workers = 0`: the worker count for `cores` CPUs available to the process (the standard
/// library counts the cgroup CPU quota and the affinity mask). One core is left to the
/// kernel's network stack, memcached and whatever shares the machine: most of a proxy's CPU
/// is spent in the kernel (80-90% in the profiles, docs/benchmarks.md), and on a
/// 2-core machine a second worker cost 20-25% more CPU per request for no more ops/s. A
/// dedicated larger machine still gets a worker on all but one core.
pub fn default_workers(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

#[cfg(test)]
mod default_workers_tests {
    use super::default_workers;

    #[test]
    fn leaves_one_core_and_never_goes_below_one() {
        assert_eq!(default_workers(0), 1);
        assert_eq!(default_workers(1), 1);
        assert_eq!(default_workers(2), 1);
        assert_eq!(default_workers(4), 3);
        assert_eq!(default_workers(16), 15);
    }
}
