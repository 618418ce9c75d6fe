//! One twemproxy pool read from its YAML mapping: each key carried over as a line of the
//! memroute pool table, or named in a `# NOTE:` saying what memroute does instead, or an
//! error at its path (`alpha.timeout`). Below twemproxy.rs (which reads the file) and
//! render.rs (which writes the pools out), so both import it and neither imports the other.
use serde_yaml::{Mapping, Value};

use crate::raw::check_host_port;
use crate::{ConfigError, DistributionName, ErrorKind, HashName};

/// Pool keys twemproxy 0.5.0 accepts (plus `reuseport` from later releases).
const TWEMPROXY_KEYS: &[&str] = &[
    "listen",
    "hash",
    "hash_tag",
    "distribution",
    "timeout",
    "backlog",
    "client_connections",
    "redis",
    "redis_auth",
    "redis_db",
    "tcpkeepalive",
    "reuseport",
    "preconnect",
    "auto_eject_hosts",
    "server_connections",
    "server_retry_timeout",
    "server_failure_limit",
    "servers",
];

/// twemproxy's defaults for the keys that only matter with `auto_eject_hosts: true`.
const TWEMPROXY_FAILURE_LIMIT: i64 = 2;
const TWEMPROXY_RETRY_TIMEOUT_MS: i64 = 30_000;

/// One twemproxy pool, with what could be read of it.
#[derive(Debug, Default)]
pub(super) struct Pool {
    pub(super) name: String,
    /// memroute's spelling: `host:port` or `unix:/path`.
    pub(super) listen: Option<String>,
    pub(super) redis: bool,
    pub(super) backlog: Option<i64>,
    pub(super) client_connections: Option<i64>,
    /// `key = value` lines for the `[pools.NAME]` table, already rendered.
    pub(super) lines: Vec<String>,
    /// `# NOTE:` comments for the pool table.
    pub(super) notes: Vec<String>,
    pub(super) servers: Vec<String>,
}

/// What twemproxy does with a server that fails, as its pool wrote it: the three keys act
/// together (retry and limit only with `auto_eject_hosts`), so they are kept until every key
/// is read and then carried over, or noted, as one.
#[derive(Debug, Default)]
struct Ejection {
    auto_eject: Option<bool>,
    retry_timeout: Option<i64>,
    failure_limit: Option<i64>,
}

/// Reads one pool; every problem goes to `errs` at its path, and what could be read is kept.
pub(super) fn read_pool(name: &str, m: &Mapping, errs: &mut Vec<ConfigError>) -> Pool {
    let mut pool = Pool {
        name: name.to_string(),
        ..Pool::default()
    };
    let mut ejection = Ejection::default();
    for (k, v) in m {
        let Some(key) = scalar_string(k) else {
            errs.push(ConfigError::new(
                ErrorKind::WrongType,
                name,
                format!("a key must be a string, found {k:?}"),
            ));
            continue;
        };
        read_key(&mut pool, &mut ejection, &key, v, errs);
    }

    if !m.contains_key("timeout") {
        pool.notes.push(
            "twemproxy had no timeout here (it waits forever) -> memroute uses its default, 250ms; \
             set `timeout` if replies can take longer"
                .to_string(),
        );
    }
    ejection.carry_over(&mut pool, errs);
    if !m.contains_key("servers") {
        errs.push(ConfigError::new(
            ErrorKind::Missing,
            format!("{name}.servers"),
            "a pool needs at least one server",
        ));
    }
    pool
}

/// One key of a pool: carried over, kept for later, noted, or an error.
fn read_key(
    pool: &mut Pool,
    ejection: &mut Ejection,
    key: &str,
    v: &Value,
    errs: &mut Vec<ConfigError>,
) {
    let p = format!("{}.{key}", pool.name);
    match key {
        "listen" | "hash" | "hash_tag" | "distribution" | "timeout" | "server_connections" => {
            read_pool_line(pool, key, &p, v, errs)
        }
        "backlog" => pool.backlog = read_int(&p, v, errs),
        "client_connections" => pool.client_connections = read_int(&p, v, errs),
        "redis" => pool.redis = read_bool(&p, v, errs).unwrap_or(false),
        "redis_auth" | "redis_db" | "preconnect" | "tcpkeepalive" | "reuseport" => {
            note_not_carried(pool, key, &p, v, errs)
        }
        "auto_eject_hosts" => ejection.auto_eject = read_bool(&p, v, errs),
        "server_retry_timeout" => ejection.retry_timeout = read_int(&p, v, errs),
        "server_failure_limit" => ejection.failure_limit = read_int(&p, v, errs),
        "servers" => pool.servers = read_servers(&p, v, errs),
        _ => errs.push(ConfigError::new(
            ErrorKind::UnknownKey,
            p,
            format!(
                "unknown twemproxy key (expected one of: {})",
                TWEMPROXY_KEYS.join(", ")
            ),
        )),
    }
}

/// The keys that become lines of the pool table (with a NOTE where the meaning shifts).
fn read_pool_line(pool: &mut Pool, key: &str, p: &str, v: &Value, errs: &mut Vec<ConfigError>) {
    match key {
        "listen" => {
            if let Some(s) = read_str(p, v, errs) {
                pool.listen = Some(convert_listen(p, &s, &mut pool.notes, errs));
            }
        }
        "hash" => {
            if let Some(s) = read_str(p, v, errs) {
                if HashName::parse(&s).is_none() {
                    errs.push(ConfigError::new(
                        ErrorKind::Invalid,
                        p,
                        format!("unknown hash \"{s}\""),
                    ));
                }
                pool.lines.push(format!("hash = {}", quote(&s)));
            }
        }
        "hash_tag" => {
            if let Some(s) = read_str(p, v, errs) {
                pool.lines.push(format!("hash_tag = {}", quote(&s)));
            }
        }
        "distribution" => {
            if let Some(s) = read_str(p, v, errs) {
                if DistributionName::parse(&s).is_none() {
                    errs.push(ConfigError::new(
                        ErrorKind::Invalid,
                        p,
                        format!("unknown distribution \"{s}\""),
                    ));
                }
                pool.lines.push(format!("distribution = {}", quote(&s)));
            }
        }
        "timeout" => {
            if let Some(ms) = read_int(p, v, errs) {
                if ms == 0 {
                    pool.notes.push(
                        "twemproxy timeout: 0 -> memroute needs a timeout; left at the default 250ms".to_string(),
                    );
                } else {
                    pool.lines.push(format!("timeout = \"{ms}ms\""));
                }
            }
        }
        "server_connections" => {
            if let Some(n) = read_int(p, v, errs) {
                if n == 0 {
                    errs.push(ConfigError::new(ErrorKind::OutOfRange, p, "must be > 0"));
                } else {
                    pool.lines.push(format!("connections = {n}"));
                    pool.notes.push(format!(
                        "twemproxy server_connections: {n} -> connections = {n}, which memroute opens \
                         per worker thread (workers x {n} per server in all)"
                    ));
                }
            }
        }
        // read_key sends only the keys above here.
        _ => {}
    }
}

/// The keys memroute has no use for: each named in a NOTE saying why.
fn note_not_carried(pool: &mut Pool, key: &str, p: &str, v: &Value, errs: &mut Vec<ConfigError>) {
    match key {
        "redis_auth" | "redis_db" => {
            pool.notes.push(format!(
                "twemproxy {key} -> not carried over: memroute speaks memcached only"
            ));
        }
        "preconnect" => {
            if let Some(b) = read_bool(p, v, errs) {
                pool.notes.push(format!(
                    "twemproxy preconnect: {b} -> not needed: memroute always connects to every server at start"
                ));
            }
        }
        "tcpkeepalive" => {
            if let Some(b) = read_bool(p, v, errs) {
                pool.notes.push(format!(
                    "twemproxy tcpkeepalive: {b} -> not carried over: memroute has no keepalive setting; \
                     its connections are long-lived and reopened with backoff when they fail"
                ));
            }
        }
        "reuseport" => {
            if let Some(b) = read_bool(p, v, errs) {
                pool.notes.push(format!(
                    "twemproxy reuseport: {b} -> not needed: memroute always listens with SO_REUSEPORT, \
                     one socket per worker"
                ));
            }
        }
        // read_key sends only the keys above here.
        _ => {}
    }
}

impl Ejection {
    /// The pool's ejection lines and NOTE (none when the pool set none of the three keys).
    fn carry_over(&self, pool: &mut Pool, errs: &mut Vec<ConfigError>) {
        let Ejection {
            auto_eject,
            retry_timeout,
            failure_limit,
        } = *self;
        if auto_eject.is_none() && retry_timeout.is_none() && failure_limit.is_none() {
            return;
        }
        let path = |key: &str| format!("{}.{key}", pool.name);
        let mut said = Vec::new();
        if let Some(b) = auto_eject {
            said.push(format!("auto_eject_hosts: {b}"));
        }
        if let Some(n) = retry_timeout {
            said.push(format!("server_retry_timeout: {n}"));
        }
        if let Some(n) = failure_limit {
            said.push(format!("server_failure_limit: {n}"));
        }
        let said = said.join(", ");
        if auto_eject == Some(true) {
            // twemproxy counts failures and retries only with auto_eject_hosts; its
            // defaults then are 2 failures and a 30s retry, at a fixed interval.
            let limit = failure_limit.unwrap_or(TWEMPROXY_FAILURE_LIMIT);
            let retry_ms = retry_timeout.unwrap_or(TWEMPROXY_RETRY_TIMEOUT_MS);
            if limit == 0 {
                errs.push(ConfigError::new(
                    ErrorKind::OutOfRange,
                    path("server_failure_limit"),
                    "must be > 0",
                ));
            }
            if retry_ms == 0 {
                errs.push(ConfigError::new(
                    ErrorKind::OutOfRange,
                    path("server_retry_timeout"),
                    "must be > 0",
                ));
            }
            pool.lines.push("eject = true".to_string());
            pool.lines.push(format!("failure_limit = {limit}"));
            pool.lines
                .push(format!("probe_interval = \"{retry_ms}ms\""));
            pool.lines
                .push(format!("probe_interval_max = \"{retry_ms}ms\""));
            pool.notes.push(format!(
                "twemproxy {said} -> eject = true, failure_limit = {limit}, probe_interval = \
                 probe_interval_max = \"{retry_ms}ms\" (twemproxy retries at a fixed interval). \
                 Unlike twemproxy, memroute ejects at most half the pool at once \
                 (max_ejected_fraction = 0.5); servers down beyond that fail fast with SERVER_ERROR"
            ));
        } else {
            pool.notes.push(format!(
                "twemproxy {said} -> eject = false (memroute's default): a failed server keeps its \
                 keys. Unlike twemproxy, memroute still marks a server down after failure_limit \
                 (3) failed requests and answers its requests SERVER_ERROR at once until a probe \
                 finds it back"
            ));
        }
    }
}

/// twemproxy listen: `host:port`, or `/path/to.sock [mode]` for a unix socket, where
/// twemproxy takes the mode from after the last space (so `/a.sock:0600` is a path).
fn convert_listen(
    path: &str,
    s: &str,
    notes: &mut Vec<String>,
    errs: &mut Vec<ConfigError>,
) -> String {
    let s = s.trim();
    if s.starts_with('/') {
        let (socket, mode) = match s.rsplit_once(' ') {
            Some((socket, mode)) => (socket.trim_end(), Some(mode)),
            None => (s, None),
        };
        if let Some(mode) = mode {
            notes.push(format!(
                "twemproxy listen mode {mode} for {socket} -> not carried over: memroute creates the socket \
                 with the process umask; set permissions on its directory"
            ));
        }
        format!("unix:{socket}")
    } else {
        if let Err(m) = check_host_port(s) {
            errs.push(ConfigError::new(ErrorKind::Invalid, path, m));
        }
        s.to_string()
    }
}

/// Servers are kept in twemproxy's own `host:port:weight [name]` form, which memroute
/// reads as it is; only the whitespace is normalised.
fn read_servers(path: &str, v: &Value, errs: &mut Vec<ConfigError>) -> Vec<String> {
    let Value::Sequence(items) = v else {
        errs.push(ConfigError::new(
            ErrorKind::WrongType,
            path,
            "expected a list of \"host:port:weight [name]\"",
        ));
        return Vec::new();
    };
    let mut servers = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let Some(s) = read_str(&p, item, errs) else {
            continue;
        };
        let words: Vec<&str> = s.split_whitespace().collect();
        if words.first().is_some_and(|w| w.starts_with('/')) {
            errs.push(ConfigError::new(
                ErrorKind::Invalid,
                p,
                format!(
                    "unix socket servers are not supported by memroute (\"{s}\"); use host:port"
                ),
            ));
            continue;
        }
        servers.push(words.join(" "));
    }
    servers
}

/// A YAML scalar as text (twemproxy reads every value as a string).
pub(super) fn scalar_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn read_int(path: &str, v: &Value, errs: &mut Vec<ConfigError>) -> Option<i64> {
    match scalar_string(v).and_then(|s| s.trim().parse::<i64>().ok()) {
        Some(n) if n >= 0 => Some(n),
        _ => {
            errs.push(ConfigError::new(
                ErrorKind::WrongType,
                path,
                format!("expected a non-negative integer, found {}", show(v)),
            ));
            None
        }
    }
}

fn read_bool(path: &str, v: &Value, errs: &mut Vec<ConfigError>) -> Option<bool> {
    match scalar_string(v).as_deref() {
        Some("true") => Some(true),
        Some("false") => Some(false),
        _ => {
            errs.push(ConfigError::new(
                ErrorKind::WrongType,
                path,
                format!("expected true or false, found {}", show(v)),
            ));
            None
        }
    }
}

fn read_str(path: &str, v: &Value, errs: &mut Vec<ConfigError>) -> Option<String> {
    let s = scalar_string(v);
    if s.is_none() {
        errs.push(ConfigError::new(
            ErrorKind::WrongType,
            path,
            format!("expected a string, found {}", show(v)),
        ));
    }
    s
}

fn show(v: &Value) -> String {
    match scalar_string(v) {
        Some(s) => format!("\"{s}\""),
        None => "a list or mapping".to_string(),
    }
}

/// A TOML string literal.
pub(super) fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}
