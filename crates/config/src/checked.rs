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
}

#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub servers: Vec<ServerConfig>,
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
}

/// Routes beyond a single pool. Issue 2 has `prefix`; more types come later.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteConfig {
    Prefix {
        /// (prefix, target), longest prefix first.
        prefixes: Vec<(String, String)>,
        default: String,
    },
}
