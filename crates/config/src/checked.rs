//! Validated configuration: every value here has been checked and defaulted.
use std::collections::BTreeMap;
use std::time::Duration;

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
}

/// `[discovery]`: settings shared by every DNS-discovered pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// An /etc/hosts-style file consulted before the system resolver (re-read on every
    /// refresh). For tests and for operators who render host lists from another system.
    pub hosts_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// Addresses to listen on: `host:port` or `unix:/path`.
    pub listen: Vec<ListenAddress>,
    /// Worker threads; 0 in the file means one per core, resolved here to the real count.
    pub workers: usize,
    /// Listen backlog asked for (capped by the kernel's somaxconn).
    pub backlog: u32,
    /// Name of the root target (a pool or a route).
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
    /// TLS of listeners, session resumption, TCP Fast Open.
    pub transport: crate::transport::TransportConfig,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ListenAddress {
    Tcp(String),
    Unix(std::path::PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    pub listen: String,
}

/// twemproxy's hash functions, plus xxh3. Variant names follow twemproxy's spelling.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashName {
    OneAtATime,
    Md5,
    Crc16,
    Crc32,
    Crc32a,
    Fnv1_64,
    Fnv1a_64,
    Fnv1_32,
    Fnv1a_32,
    Hsieh,
    Murmur,
    Jenkins,
    Xxh3,
}

impl HashName {
    pub const ALL: [HashName; 13] = [
        HashName::OneAtATime,
        HashName::Md5,
        HashName::Crc16,
        HashName::Crc32,
        HashName::Crc32a,
        HashName::Fnv1_64,
        HashName::Fnv1a_64,
        HashName::Fnv1_32,
        HashName::Fnv1a_32,
        HashName::Hsieh,
        HashName::Murmur,
        HashName::Jenkins,
        HashName::Xxh3,
    ];
    /// The config spelling (twemproxy's, for the shared ones).
    pub fn as_str(self) -> &'static str {
        match self {
            HashName::OneAtATime => "one_at_a_time",
            HashName::Md5 => "md5",
            HashName::Crc16 => "crc16",
            HashName::Crc32 => "crc32",
            HashName::Crc32a => "crc32a",
            HashName::Fnv1_64 => "fnv1_64",
            HashName::Fnv1a_64 => "fnv1a_64",
            HashName::Fnv1_32 => "fnv1_32",
            HashName::Fnv1a_32 => "fnv1a_32",
            HashName::Hsieh => "hsieh",
            HashName::Murmur => "murmur",
            HashName::Jenkins => "jenkins",
            HashName::Xxh3 => "xxh3",
        }
    }
    pub fn parse(s: &str) -> Option<HashName> {
        HashName::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DistributionName {
    /// twemproxy-compatible ketama.
    Ketama,
    /// hash % n, as twemproxy.
    Modula,
    /// a random server per request, as twemproxy.
    Random,
    /// xxh3 consistent ring with `vnodes` points per weight unit.
    Ring,
    /// jump consistent hash over xxh3.
    Jump,
}

impl DistributionName {
    pub const ALL: [DistributionName; 5] = [
        DistributionName::Ketama,
        DistributionName::Modula,
        DistributionName::Random,
        DistributionName::Ring,
        DistributionName::Jump,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            DistributionName::Ketama => "ketama",
            DistributionName::Modula => "modula",
            DistributionName::Random => "random",
            DistributionName::Ring => "ring",
            DistributionName::Jump => "jump",
        }
    }
    pub fn parse(s: &str) -> Option<DistributionName> {
        DistributionName::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

/// One memcached server of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// `host:port` to connect to.
    pub address: String,
    /// Relative weight (> 0). Default 1.
    pub weight: u32,
    /// Optional name; when set, ketama hashes the name instead of the address (twemproxy rule).
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// The servers, in config order. For a DNS pool (`discovery` is set) this is empty
    /// after validation; the proxy fills it with the resolved addresses.
    pub servers: Vec<ServerConfig>,
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
    /// First probe of a down server after this long (default 1s); each failed probe
    /// grows the interval by half, with jitter, up to `probe_interval_max` (default 30s).
    pub probe_interval: Duration,
    pub probe_interval_max: Duration,
    pub distribution: DistributionName,
    pub hash: HashName,
    /// twemproxy's hash_tag: two bytes, e.g. `{}`; only the part between them is hashed.
    pub hash_tag: Option<[u8; 2]>,
    /// Virtual nodes per server for `ring` (default 256).
    pub vnodes: u32,
    /// Connections per worker per server (default 1).
    pub connections: usize,
    /// Request timeout (default 250ms).
    pub timeout: Duration,
    /// Connect timeout (default = timeout).
    pub connect_timeout: Duration,
    /// Largest number of keys in one backend get; larger multi-gets are split into
    /// batches sent in parallel (default 100).
    pub max_keys_per_request: usize,
    /// TLS to this pool's servers (`None`: plaintext).
    pub tls: Option<crate::transport::BackendTls>,
}

impl PoolConfig {
    /// A pool of `servers` with every other setting at its default (for tests and tools).
    pub fn new(servers: Vec<ServerConfig>) -> PoolConfig {
        use crate::raw::defaults;
        let timeout = Duration::from_millis(defaults::TIMEOUT_MS);
        PoolConfig {
            servers,
            discovery: None,
            failure_limit: defaults::FAILURE_LIMIT,
            eject: false,
            max_ejected_fraction: defaults::MAX_EJECTED_FRACTION,
            probe_interval: Duration::from_millis(defaults::PROBE_INTERVAL_MS),
            probe_interval_max: Duration::from_millis(defaults::PROBE_INTERVAL_MAX_MS),
            distribution: DistributionName::Ketama,
            hash: HashName::Fnv1a_64,
            hash_tag: None,
            vnodes: defaults::VNODES,
            connections: defaults::CONNECTIONS,
            timeout,
            connect_timeout: timeout,
            max_keys_per_request: defaults::MAX_KEYS_PER_REQUEST,
            tls: None,
        }
    }
}

/// `servers = { dns = "memcached.cache.svc.cluster.local:11211", refresh = "5s" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsDiscovery {
    /// Host name to resolve (every A and AAAA record).
    pub host: String,
    pub port: u16,
    /// How often to resolve again (default 5s).
    pub refresh: Duration,
}

/// Routes beyond a single pool; semantics follow mcrouter's route handles of the same idea.
/// Every `String` target names a pool or a route.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteConfig {
    Prefix {
        /// (prefix, target), longest prefix first.
        prefixes: Vec<(String, String)>,
        default: String,
    },
    /// By command: (operation, target) for the operations named, `default` for the rest.
    Operation {
        operations: Vec<(Operation, String)>,
        default: String,
    },
    /// The client is answered by `primary`; the selected keys are also sent to `shadow`.
    Shadow {
        primary: String,
        shadow: String,
        select: ShadowSelect,
        /// Shadow requests in flight per worker beyond which more are dropped (default 1000).
        max_in_flight: usize,
    },
    Replicated {
        children: Vec<String>,
        writes: WritePolicy,
        reads: ReadPolicy,
    },
    Failover {
        children: Vec<String>,
        on: FailoverOn,
    },
    /// Get from `cold`; on a miss get from `warm` and fill `cold` with exptime `ttl`.
    WarmUp {
        cold: String,
        warm: String,
        /// Expiry of filled items in seconds (default 0: never).
        ttl: u32,
    },
    /// A random child per request.
    Random { children: Vec<String> },
    /// Answers every request as a miss / not stored, without a backend.
    Null,
    /// Answers every request with `SERVER_ERROR <message>`.
    Error { message: String },
}

/// Which keys a shadow route copies, by a hash of the key mapped onto [0, 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ShadowSelect {
    /// `fraction = f`: the keys whose hash falls in [0, f).
    Fraction(f64),
    /// `key_range = [a, b]`: the keys whose hash falls in [a, b).
    KeyRange(f64, f64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePolicy {
    /// Wait for every child; the write succeeds only if all did. (default)
    AllSync,
    /// Send to every child, answer at once (see docs/configuration.md for the reply).
    AllAsync,
    /// Send to every child, answer with the first child's reply.
    AllInitial,
    /// Answer once a majority succeeded (or could no longer succeed).
    AllMajority,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPolicy {
    /// Always the first child.
    First,
    /// Children in order until one answers without an error. (default)
    Failover,
    /// A random child.
    Random,
    /// Every child; the first reply that is not an error wins.
    Fastest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverOn {
    /// Try the next child on an error (default).
    Error,
    /// Also on a miss (reads only).
    ErrorOrMiss,
}

/// What an `operation` route chooses by. Meta commands count as their classic
/// equivalent: mg/me as get, ms as set (or add/replace/append/prepend by its mode flag),
/// md as delete, ma as incr (decr by its mode flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    Get,
    Gets,
    Gat,
    Gats,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Delete,
    Incr,
    Decr,
    Touch,
    FlushAll,
}

impl Operation {
    pub const COUNT: usize = 15;
    pub const ALL: [Operation; Operation::COUNT] = [
        Operation::Get,
        Operation::Gets,
        Operation::Gat,
        Operation::Gats,
        Operation::Set,
        Operation::Add,
        Operation::Replace,
        Operation::Append,
        Operation::Prepend,
        Operation::Cas,
        Operation::Delete,
        Operation::Incr,
        Operation::Decr,
        Operation::Touch,
        Operation::FlushAll,
    ];
    /// The config key (`get`, `flush_all`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Get => "get",
            Operation::Gets => "gets",
            Operation::Gat => "gat",
            Operation::Gats => "gats",
            Operation::Set => "set",
            Operation::Add => "add",
            Operation::Replace => "replace",
            Operation::Append => "append",
            Operation::Prepend => "prepend",
            Operation::Cas => "cas",
            Operation::Delete => "delete",
            Operation::Incr => "incr",
            Operation::Decr => "decr",
            Operation::Touch => "touch",
            Operation::FlushAll => "flush_all",
        }
    }
    pub fn parse(s: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.as_str() == s)
    }
    /// Index into a table of `COUNT` entries.
    pub fn index(self) -> usize {
        self as usize
    }
    /// Writes go to every child of a replicated route; everything else is a read.
    pub fn is_write(self) -> bool {
        !matches!(
            self,
            Operation::Get | Operation::Gets | Operation::Gat | Operation::Gats
        )
    }
    /// Commands whose repetition changes the result: never retried once sent.
    pub fn is_idempotent(self) -> bool {
        !matches!(
            self,
            Operation::Incr
                | Operation::Decr
                | Operation::Append
                | Operation::Prepend
                | Operation::Cas
        )
    }
}
