//! Validated configuration: every value here has been checked and defaulted.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use crate::defaults;
use crate::walk::join;

/// The whole, validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub proxy: ProxyConfig,
    pub admin: Option<AdminConfig>,
    /// Pools by name (sorted, so output is deterministic).
    pub pools: BTreeMap<String, PoolConfig>,
    /// Routes by name.
    pub routes: BTreeMap<String, RouteConfig>,
    /// How pools with `servers = { dns = ... }` find their servers.
    pub discovery: DiscoveryConfig,
    /// mcrouter's routing prefixes (`routing_prefixes`, `routing_prefix`,
    /// `keep_routing_prefix`); empty when the config declares none.
    pub routing_prefixes: RoutingPrefixConfig,
}

impl Config {
    /// Makes every relative file path in the config (TLS certificates, keys and CAs, the
    /// hosts file, the admin token file) relative to `base`, the config file's folder, so
    /// `cert = "server.pem"` next to the config works whatever the working directory.
    pub fn resolve_paths(&mut self, base: &std::path::Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        for tls in self.proxy.transport.listen_tls.values_mut() {
            resolve(&mut tls.cert);
            resolve(&mut tls.key);
            tls.client_ca.iter_mut().for_each(resolve);
        }
        for auth in self.proxy.listen_auth.values_mut() {
            resolve(&mut auth.authfile);
        }
        for pool in self.pools.values_mut() {
            if let Some(Password::File(path)) = pool.auth.as_mut().map(|a| &mut a.password) {
                resolve(path);
            }
            if let Some(tls) = pool.tls.as_mut() {
                tls.ca.iter_mut().for_each(resolve);
                tls.cert.iter_mut().for_each(resolve);
                tls.key.iter_mut().for_each(resolve);
            }
        }
        self.discovery.hosts_file.iter_mut().for_each(resolve);
        if let Some(AdminToken::File(path)) = self.admin.as_mut().and_then(|a| a.token.as_mut()) {
            resolve(path);
        }
    }

    /// Gives the proxy the zone `from_environment` names (the value of
    /// [`ZONE_VARIABLE`]) when the file sets no `proxy.zone`: one config file then serves
    /// proxies in every zone, each told its zone by its environment. The file wins. Unset
    /// or empty: no zone.
    pub fn resolve_zone(&mut self, from_environment: Option<String>) {
        if self.proxy.zone.is_some() {
            return;
        }
        self.proxy.zone = from_environment
            .filter(|name| !name.trim().is_empty())
            .map(|name| ProxyZone {
                name: name.trim().to_string(),
                source: ZoneSource::Environment,
            });
    }

    /// The zone of target `name` as a replicated route reading `nearest` sees its child:
    /// a pool's `zone`; for a route, the zone every pool beneath it shares (`None` when
    /// they differ or one has none).
    pub fn zone_of(&self, name: &str) -> Option<&str> {
        let mut zone: Option<&str> = None;
        let mut stack = vec![name];
        let mut seen: Vec<&str> = Vec::new();
        while let Some(at) = stack.pop() {
            if seen.contains(&at) {
                continue;
            }
            seen.push(at);
            if let Some(pool) = self.pools.get(at) {
                let pool_zone = pool.zone.as_deref()?;
                match zone {
                    Some(known) if known != pool_zone => return None,
                    _ => zone = Some(pool_zone),
                }
            } else if let Some(route) = self.routes.get(at) {
                for (_, target) in route_edges("", route) {
                    let target = self
                        .pools
                        .get_key_value(&target)
                        .map(|(k, _)| k.as_str())
                        .or_else(|| self.routes.get_key_value(&target).map(|(k, _)| k.as_str()));
                    stack.extend(target);
                }
            }
        }
        zone
    }

    /// [`Config::resolve_zone`] with this process's [`ZONE_VARIABLE`].
    pub fn resolve_zone_from_environment(&mut self) {
        self.resolve_zone(std::env::var(ZONE_VARIABLE).ok());
    }
}

/// The targets a route refers to, each with the key path that names it (validation names
/// a missing target by it; `zone_of` walks the targets).
pub(crate) fn route_edges(path: &str, route: &RouteConfig) -> Vec<(String, String)> {
    match route {
        RouteConfig::Prefix { prefixes, default } => {
            let mut edges: Vec<(String, String)> = prefixes
                .iter()
                .map(|(p, t)| (join(&join(path, "prefixes"), p), t.clone()))
                .collect();
            edges.push((join(path, "default"), default.clone()));
            edges
        }
        RouteConfig::Operation {
            operations,
            default,
        } => {
            let mut edges: Vec<(String, String)> = operations
                .iter()
                .map(|(op, t)| (join(path, op.as_str()), t.clone()))
                .collect();
            edges.push((join(path, "default"), default.clone()));
            edges
        }
        RouteConfig::Shadow {
            primary, shadow, ..
        } => vec![
            (join(path, "primary"), primary.clone()),
            (join(path, "shadow"), shadow.clone()),
        ],
        RouteConfig::Replicated { children, .. }
        | RouteConfig::Failover { children, .. }
        | RouteConfig::Random { children } => {
            let cpath = join(path, "children");
            children
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("{cpath}[{i}]"), c.clone()))
                .collect()
        }
        RouteConfig::WarmUp { cold, warm, .. } => vec![
            (join(path, "cold"), cold.clone()),
            (join(path, "warm"), warm.clone()),
        ],
        RouteConfig::Null | RouteConfig::Error { .. } => Vec::new(),
    }
}

/// The pool names reachable from `target` (a pool or a route), each once.
pub(crate) fn pools_reached(
    target: &str,
    routes: &BTreeMap<String, RouteConfig>,
) -> BTreeSet<String> {
    let mut pools = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut stack = vec![target.to_string()];
    while let Some(name) = stack.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        match routes.get(&name) {
            Some(route) => stack.extend(route_edges("", route).into_iter().map(|(_, t)| t)),
            None => {
                pools.insert(name);
            }
        }
    }
    pools
}

/// The routing prefixes a config declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingPrefixConfig {
    /// Each prefix and the pool or route that carries it.
    pub prefixes: BTreeMap<String, String>,
    /// The pools whose requests keep the prefix in the key sent to memcached.
    pub keep: BTreeSet<String>,
    /// `proxy.routing_prefix`: the default routing prefix.
    pub default: Option<String>,
    /// Listeners with their own `routing_prefix`, by address.
    pub listeners: BTreeMap<ListenAddress, String>,
}

impl RoutingPrefixConfig {
    /// The default routing prefix of the listener at `address` (its own, else the proxy's).
    pub fn of_listener(&self, address: &ListenAddress) -> Option<&str> {
        self.listeners
            .get(address)
            .or(self.default.as_ref())
            .map(String::as_str)
    }

    /// Whether requests reaching `target` (a pool or route carrying a prefix) keep the
    /// prefix in their key: every pool it reaches has `keep_routing_prefix`.
    pub fn keeps(&self, target: &str, routes: &BTreeMap<String, RouteConfig>) -> bool {
        pools_reached(target, routes)
            .iter()
            .all(|pool| self.keep.contains(pool))
    }
}

/// The environment variable a proxy learns its zone from when `proxy.zone` is absent.
pub const ZONE_VARIABLE: &str = "MEMROUTE_ZONE";

/// The zone this proxy runs in: replicated routes reading `nearest` read from the child in
/// it first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyZone {
    pub name: String,
    pub source: ZoneSource,
}

/// Where the proxy's zone came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneSource {
    /// `proxy.zone` in the config file.
    Config,
    /// The [`ZONE_VARIABLE`] environment variable.
    Environment,
}

impl ZoneSource {
    /// The key or variable the zone was read from.
    pub fn name(self) -> &'static str {
        match self {
            ZoneSource::Config => "proxy.zone",
            ZoneSource::Environment => ZONE_VARIABLE,
        }
    }
}

impl std::fmt::Display for ProxyZone {
    /// As `--check` shows it: `zone b (from MEMROUTE_ZONE)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "zone {} (from {})", self.name, self.source.name())
    }
}

/// `[discovery]`: settings shared by every DNS-discovered pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// An /etc/hosts-style file consulted before the system resolver (re-read on every
    /// refresh). For tests and for operators who render host lists from another system.
    pub hosts_file: Option<std::path::PathBuf>,
    /// DNS servers to ask (`[discovery] nameservers = ["10.96.0.10:53"]`); empty means the
    /// ones in /etc/resolv.conf, read at each lookup.
    pub nameservers: Vec<std::net::SocketAddr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// Addresses to listen on: `host:port` or `unix:/path`.
    pub listen: Vec<ListenAddress>,
    /// The listeners that name their own root (`{ address = "...", route = "x" }`), by
    /// address; every other listener serves `route`. Kept apart from `listen` because a
    /// reload may change a listener's root but not its address.
    pub listen_routes: BTreeMap<ListenAddress, String>,
    /// Worker threads; 0 in the file means one per core, resolved here to the real count.
    pub workers: usize,
    /// Listen backlog asked for (capped by the kernel's somaxconn).
    pub backlog: u32,
    /// Name of the default root target (a pool or a route): the root of every listener
    /// that does not name its own.
    pub route: String,
    /// Largest value accepted from clients (bytes). Default 1 MiB.
    pub max_value_size: usize,
    /// Longest request line accepted (bytes). Default 64 KiB.
    pub max_line_size: usize,
    /// Requests a single client connection may have outstanding before memroute
    /// stops reading from it. Default 256.
    pub max_client_pending: usize,
    /// Largest number of client connections across the process (0 = unlimited).
    pub max_connections: usize,
    /// On SIGINT/SIGTERM, how long client connections may take to finish what they have
    /// in flight before they are closed anyway (default 10s).
    pub shutdown_timeout: Duration,
    /// On SIGTERM, how long memroute keeps accepting and serving while it reports itself
    /// not ready, before it stops accepting (default 5s; 0 = stop at once).
    pub drain_delay: Duration,
    /// Bytes of replies buffered for clients that have not read them, across the process,
    /// before memroute stops reading from the clients holding the most (default 64 MiB;
    /// 0 = no process-wide bound).
    pub max_buffered_replies: usize,
    /// A client holding more than its share of `max_buffered_replies` this long is closed
    /// (default 10s).
    pub slow_client_timeout: Duration,
    /// TLS of listeners, session resumption, TCP Fast Open.
    pub transport: TransportConfig,
    /// How workers do socket I/O (`proxy.io`); needs a restart to change.
    pub io: IoMode,
    /// The zone this proxy runs in: `proxy.zone`, else [`ZONE_VARIABLE`] once
    /// [`Config::resolve_zone`] has looked (parsing alone never reads the environment).
    pub zone: Option<ProxyZone>,
    /// The listeners whose clients must log in (`{ address, auth = { authfile } }`), by
    /// address; the others take every client, as memcached without `-Y` does.
    pub listen_auth: BTreeMap<ListenAddress, ListenerAuth>,
}

impl ProxyConfig {
    /// The root target the clients of the listener at `address` are served by.
    pub fn route_of(&self, address: &ListenAddress) -> &str {
        self.listen_routes.get(address).unwrap_or(&self.route)
    }

    /// Each listener with its root target, in `proxy.listen` order.
    pub fn listener_roots(&self) -> impl Iterator<Item = (&ListenAddress, &str)> {
        self.listen
            .iter()
            .map(|address| (address, self.route_of(address)))
    }
}

/// How a worker reads and writes its sockets (`proxy.io`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IoMode {
    /// Readiness through epoll (tokio's reactor), a recv / send syscall per operation.
    Epoll,
    /// One io_uring per worker: the recvs and sends of a turn in one `io_uring_enter`;
    /// falls back to epoll (logged once) where io_uring cannot be set up. The default:
    /// 0.82-0.87x epoll's proxy CPU per request in scenarios (a) and (b)
    /// (docs/benchmarks.md, "io_uring").
    #[default]
    IoUring,
}

impl IoMode {
    /// The spelling of each mode in `proxy.io`, also what `--check` and the logs print.
    pub const NAMES: &'static [(&'static str, IoMode)] =
        &[("epoll", IoMode::Epoll), ("io_uring", IoMode::IoUring)];

    /// This mode as `proxy.io` spells it.
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Epoll => "epoll",
            IoMode::IoUring => "io_uring",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ListenAddress {
    Tcp(String),
    Unix(std::path::PathBuf),
}

/// As written in `proxy.listen`: `host:port` or `unix:/path`.
impl std::fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddress::Tcp(address) => f.write_str(address),
            ListenAddress::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    pub listen: String,
    /// `/ready` answers 200 once every pool has a live connection to at least this
    /// fraction of its servers (and always at least one); 0 means "one server".
    pub ready_fraction: f64,
    /// Who may change state (`POST /reload`): with neither, a loopback peer only.
    pub token: Option<AdminToken>,
    /// Hot-key detection samples about one key sent to a pool in this many; 0 turns it off.
    pub hot_keys_sample: u32,
    /// Hot keys are counted over the interval in progress and the one before.
    pub hot_keys_interval: Duration,
    /// Whether `/hotkeys`, `stats` and the panel name the keys (else `<hidden>`).
    pub show_keys: bool,
}

impl AdminConfig {
    /// About one key in this many is sampled for hot keys unless `admin` says otherwise.
    pub const HOT_KEYS_SAMPLE: u32 = 16;
    pub const HOT_KEYS_INTERVAL: Duration = Duration::from_secs(10);
}

/// The secret a state-changing admin request must carry as `Authorization: Bearer ...`.
#[derive(Debug, Clone, PartialEq)]
pub enum AdminToken {
    /// `admin.token`: written in the config file.
    Inline(String),
    /// `admin.token_file`: read at each request, so a rotated secret (a Kubernetes Secret
    /// volume) applies without a reload.
    File(PathBuf),
}

/// The names, policies and route shapes routing is built from: one spelling each,
/// defined by memroute-routing (see [`memroute_routing::spec`]).
pub use memroute_routing::spec::{
    DistributionName, FailoverErrors, FailoverOn, HashName, Operation, PoolSpec, ReadPolicy,
    RouteSpec as RouteConfig, ServerSpec as ServerConfig, ShadowSelect, WritePolicy,
};
pub use memroute_routing::{gutter_description, ErrorClass};

/// One pool: its placement as routing sees it (servers, distribution, hash, hash_tag,
/// vnodes, weights, salt: [`PoolSpec`], written once) and how memroute reaches and watches
/// its servers. The placement's fields read as the pool's own (`pool.servers`,
/// `pool.hash`) through `Deref`.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// Where keys go. Its servers are in config order; for a DNS pool (`discovery` is set)
    /// they are empty after validation and the proxy fills them with the resolved
    /// addresses (`placement.discovered` is set exactly when `discovery` is).
    pub placement: PoolSpec,
    /// `servers = { dns = "name:port", refresh = "5s" }`: find the servers by DNS.
    pub discovery: Option<DnsDiscovery>,
    /// Consecutive failed requests (timeouts, broken connections) after which a server is
    /// marked down; one refused connect marks it down at once. Default 3.
    pub failure_limit: u32,
    /// `true`: a down server leaves the ring and its keys move to the others (twemproxy's
    /// auto_eject_hosts). `false` (default): it keeps its slots and its requests fail fast.
    pub eject: bool,
    /// At most this fraction of the pool's servers is ejected at once (default 0.5); a
    /// server marked down beyond it fails fast instead.
    pub max_ejected_fraction: f64,
    /// First probe of a down server after this long (default 200ms); each failed probe
    /// grows the interval by half, with jitter, up to `probe_interval_max` (default 500ms).
    pub probe_interval: Duration,
    pub probe_interval_max: Duration,
    /// Connections per worker per server (default 1).
    pub connections: usize,
    /// Request timeout (default 250ms).
    pub timeout: Duration,
    /// Connect timeout (default = timeout).
    pub connect_timeout: Duration,
    /// Largest number of keys in one backend get; larger multi-gets are split into
    /// batches sent in parallel (default 100).
    pub max_keys_per_request: usize,
    /// Consecutive `get`s (or `gets`) waiting for the same connection's next write go to
    /// the server as one command of at most `max_keys_per_request` keys (default true).
    pub coalesce_gets: bool,
    /// A get identical to one already queued or in flight on the same connection waits
    /// for that one's reply instead of being sent (default true).
    pub collapse_gets: bool,
    /// The opt-in hot-key cache (`None`: off, the default).
    pub hot_cache: Option<HotCache>,
    /// TLS to this pool's servers (`None`: plaintext).
    pub tls: Option<BackendTls>,
    /// When the server list changes, the previous placement is kept this long: a key
    /// whose owner changed is looked for on its old owner and moved (default 10m; zero
    /// turns it off).
    pub resize_window: Duration,
    /// The zone (availability zone, rack) the pool's servers run in: a replicated route
    /// reading `nearest` reads from the child in the proxy's own zone first.
    pub zone: Option<String>,
    /// The login the pool's servers want (`None`: none; a server that wants one is then
    /// marked down, never used).
    pub auth: Option<BackendAuth>,
}

/// A pool's hot-key cache: each worker answers gets of the keys its hot-key sketch names
/// hot from a copy at most `ttl` old, for at most `keys` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotCache {
    pub ttl: Duration,
    pub keys: usize,
}

impl HotCache {
    pub const TTL: Duration = Duration::from_millis(500);
    pub const KEYS: usize = 32;
}

impl PoolConfig {
    /// A pool of `servers` with every other setting at its default (for tests and tools).
    pub fn new(servers: Vec<ServerConfig>) -> PoolConfig {
        let timeout = Duration::from_millis(defaults::TIMEOUT_MS);
        PoolConfig {
            placement: PoolSpec::new(servers),
            discovery: None,
            failure_limit: defaults::FAILURE_LIMIT,
            eject: false,
            max_ejected_fraction: defaults::MAX_EJECTED_FRACTION,
            probe_interval: Duration::from_millis(defaults::PROBE_INTERVAL_MS),
            probe_interval_max: Duration::from_millis(defaults::PROBE_INTERVAL_MAX_MS),
            connections: defaults::CONNECTIONS,
            timeout,
            connect_timeout: timeout,
            max_keys_per_request: defaults::MAX_KEYS_PER_REQUEST,
            coalesce_gets: true,
            collapse_gets: true,
            hot_cache: None,
            tls: None,
            resize_window: Duration::from_millis(defaults::RESIZE_WINDOW_MS),
            zone: None,
            auth: None,
        }
    }
}

impl std::ops::Deref for PoolConfig {
    type Target = PoolSpec;

    fn deref(&self) -> &PoolSpec {
        &self.placement
    }
}

impl std::ops::DerefMut for PoolConfig {
    fn deref_mut(&mut self) -> &mut PoolSpec {
        &mut self.placement
    }
}

/// `servers = { dns = "memcached.cache.svc.cluster.local:11211", refresh = "5s" }` or
/// `servers = { srv = "_memcache._tcp.memcached.cache.svc.cluster.local" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsDiscovery {
    /// The name to resolve: a host name (every A and AAAA record) or an SRV name.
    pub host: String,
    /// The servers' port for `dns`; 0 for `srv`, whose records carry the ports.
    pub port: u16,
    /// Resolve again at least this often (default 5s); sooner when the records' TTL says so.
    pub refresh: Duration,
    /// Which records name the servers.
    pub kind: DnsKind,
}

/// The DNS records a pool's servers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DnsKind {
    /// `dns = "name:port"`: every A and AAAA record of the name, each with the given port.
    Address,
    /// `srv = "_service._proto.name"`: every SRV record, its target's addresses with the
    /// record's port (a Kubernetes headless service publishes one per ready pod).
    Srv,
}

/// Process-wide transport settings (`[proxy]`) and the TLS of each listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    /// TCP Fast Open queue length of every TCP listener; 0 turns listener TFO off.
    pub fastopen: u32,
    /// TCP Fast Open on backend connects (`TCP_FASTOPEN_CONNECT`).
    pub fastopen_connect: bool,
    /// A client must finish its TLS handshake within this long, or it is closed (counted).
    pub tls_handshake_timeout: Duration,
    /// Ticket key rotation period; a ticket is accepted for up to twice this long.
    pub tls_ticket_lifetime: Duration,
    /// TLS 1.2 sessions kept for resumption by session id, per listener.
    pub tls_session_cache: usize,
    /// The listeners that speak TLS, by address (the others are plaintext).
    pub listen_tls: BTreeMap<ListenAddress, ListenerTls>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            fastopen: defaults::FASTOPEN,
            fastopen_connect: defaults::FASTOPEN_CONNECT,
            tls_handshake_timeout: Duration::from_millis(defaults::TLS_HANDSHAKE_TIMEOUT_MS),
            tls_ticket_lifetime: Duration::from_secs(defaults::TLS_TICKET_LIFETIME_SECS),
            tls_session_cache: defaults::TLS_SESSION_CACHE,
            listen_tls: BTreeMap::new(),
        }
    }
}

/// `tls = { cert, key, client_ca }` on a listen entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs (PEM).
    pub client_ca: Option<PathBuf>,
    /// Where this table is in the config (`proxy.listen[1].tls`), for error messages.
    pub key_path: String,
}

/// `auth = { authfile }` on a listen entry: its clients log in as memcached's `-Y` (text)
/// and `-S` (binary SASL PLAIN) clients do, against memcached's authfile format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerAuth {
    /// `user:password` lines, read at start and on every reload.
    pub authfile: PathBuf,
    /// Where the setting is in the config (`proxy.listen[0].auth.authfile`).
    pub key_path: String,
}

/// `[pools.X] auth = { username, password | password_file }`: the login memroute gives
/// each of the pool's servers (memcached `-Y`) on every connection it opens, before any
/// request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendAuth {
    pub username: String,
    pub password: Password,
    /// Where this table is in the config (`pools.main.auth`), for error messages.
    pub key_path: String,
}

/// A secret: written in the config, or the path of a file that holds it (read at start and
/// on every reload; a Kubernetes Secret mounted as a file).
#[derive(Clone, PartialEq, Eq)]
pub enum Password {
    Inline(String),
    File(PathBuf),
}

/// The secret itself is never printed (logs, `--check`, panics).
impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Password::Inline(_) => f.write_str("Inline(<redacted>)"),
            Password::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// `[pools.X] tls = { ca, server_name, cert, key, insecure_skip_verify }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendTls {
    /// CAs that sign the servers' certificates (PEM). Required unless
    /// `insecure_skip_verify` is set.
    pub ca: Option<PathBuf>,
    /// Name the servers' certificates must carry; default: each server's host.
    pub server_name: Option<String>,
    /// Client certificate and key, for memcached's `ssl_verify_mode`.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Accept any server certificate. Loud on purpose: logged at every start and reload.
    pub insecure_skip_verify: bool,
    /// Where this table is in the config (`pools.main.tls`), for error messages.
    pub key_path: String,
}
