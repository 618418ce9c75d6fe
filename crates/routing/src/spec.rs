//! What routing is built from: a small spec of pools and routes, in routing's own terms.
//!
//! ```text
//!   memroute-config: TOML --check--> Config --routing_spec()--> RoutingSpec --RouteTable::build
//! ```
//!
//! The names and policies here are also the config's vocabulary (memroute-config
//! re-exports them), so there is one spelling of each; connection, timeout and health
//! settings stay in memroute-config because placement and route selection never read them.
use std::collections::BTreeMap;

pub use crate::failover_errors::FailoverErrors;

/// `vnodes` of a `ring` pool when none is given.
pub const DEFAULT_VNODES: u32 = 256;

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
    /// mcrouter's Ch3 (furc over MurmurHash64A of mcrouter's routing key).
    Ch3,
    /// mcrouter's WeightedCh3: Ch3 with the pool's `weights` in [0, 1].
    WeightedCh3,
    /// mcrouter's Crc32: standard CRC-32 of the routing key, 31 bits, modulo n.
    Crc32,
}

impl DistributionName {
    pub const ALL: [DistributionName; 8] = [
        DistributionName::Ketama,
        DistributionName::Modula,
        DistributionName::Random,
        DistributionName::Ring,
        DistributionName::Jump,
        DistributionName::Ch3,
        DistributionName::WeightedCh3,
        DistributionName::Crc32,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            DistributionName::Ketama => "ketama",
            DistributionName::Modula => "modula",
            DistributionName::Random => "random",
            DistributionName::Ring => "ring",
            DistributionName::Jump => "jump",
            DistributionName::Ch3 => "ch3",
            DistributionName::WeightedCh3 => "wch3",
            DistributionName::Crc32 => "crc32",
        }
    }
    pub fn parse(s: &str) -> Option<DistributionName> {
        DistributionName::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

/// One memcached server of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// `host:port` to connect to.
    pub address: String,
    /// Relative weight (> 0). Default 1.
    pub weight: u32,
    /// Optional name; when set, ketama hashes the name instead of the address (twemproxy rule).
    pub name: Option<String>,
}

/// One pool as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    /// The servers, in config order (empty for a DNS pool before its first answer).
    pub servers: Vec<ServerSpec>,
    pub distribution: DistributionName,
    pub hash: HashName,
    /// twemproxy's hash_tag: two bytes, e.g. `{}`; only the part between them is hashed.
    pub hash_tag: Option<[u8; 2]>,
    /// Virtual nodes per server for `ring`.
    pub vnodes: u32,
    /// `wch3` only: one weight in [0, 1] per server (missing ones weigh 0.5, as in mcrouter).
    pub weights: Vec<f64>,
    /// `ch3`, `wch3`, `crc32` only: mcrouter's hash `salt`, appended to the routing key
    /// before hashing (empty: none).
    pub salt: String,
    /// Servers are found by DNS: an empty server list is not an error.
    pub discovered: bool,
}

impl PoolSpec {
    /// A ketama / fnv1a_64 pool of `servers` (twemproxy's defaults).
    pub fn new(servers: Vec<ServerSpec>) -> PoolSpec {
        PoolSpec {
            servers,
            distribution: DistributionName::Ketama,
            hash: HashName::Fnv1a_64,
            hash_tag: None,
            vnodes: DEFAULT_VNODES,
            weights: Vec::new(),
            salt: String::new(),
            discovered: false,
        }
    }
}

/// Everything a route table is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingSpec {
    /// Pools by name (sorted: pool ids follow this order).
    pub pools: BTreeMap<String, PoolSpec>,
    /// Routes by name.
    pub routes: BTreeMap<String, RouteSpec>,
    /// Name of the default root target (a pool or a route).
    pub root: String,
    /// The root target of each listener, in the order of the proxy's listeners (empty: every
    /// listener serves `root`).
    pub listener_roots: Vec<String>,
    /// mcrouter's routing prefixes: (`/region/cluster/`, the pool or route it names).
    /// Empty: keys are never looked at for a prefix.
    pub routing_prefixes: Vec<(String, String)>,
    /// The pools whose requests keep the routing prefix in the key (`keep_routing_prefix`).
    pub keep_routing_prefix: Vec<String>,
    /// Each listener's default routing prefix (mcrouter's `--route-prefix`), in the order
    /// of `listener_roots`: the route a wildcard sends to first.
    pub listener_prefixes: Vec<Option<String>>,
}

/// Routes beyond a single pool; semantics follow mcrouter's route handles of the same idea.
/// Every `String` target names a pool or a route.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteSpec {
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
        /// The errors it moves on for (`failover_errors`; default every error).
        errors: FailoverErrors,
        /// The cap on the exptime of writes to the children after the first
        /// (`failover_exptime`, seconds, above 0; `None`: no cap).
        exptime_cap: Option<u32>,
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
    /// The child in the proxy's zone, then the others by measured latency (children in the
    /// proxy's zone first), each asked only when every one before it failed.
    Nearest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverOn {
    /// Try the next child on an error (default).
    Error,
    /// Also on a miss (reads only).
    ErrorOrMiss,
}

/// The config spelling of each policy, in one place (the config parser, `--check` and the
/// proxy's logs all use it).
macro_rules! spelled {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            /// Every value with its config spelling.
            pub const NAMES: &'static [(&'static str, $name)] = &[$(($text, $name::$variant)),+];

            /// The config spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }
    };
}

spelled!(WritePolicy {
    AllSync => "all-sync",
    AllAsync => "all-async",
    AllInitial => "all-initial",
    AllMajority => "all-majority",
});
spelled!(ReadPolicy {
    First => "first",
    Failover => "failover",
    Random => "random",
    Fastest => "fastest",
    Nearest => "nearest",
});
spelled!(FailoverOn {
    Error => "error",
    ErrorOrMiss => "error-or-miss",
});

/// What an `operation` route (and a replicated route's read/write split) chooses by: the
/// routed words of the protocol's [`Command`](memroute_protocol::Command), one per classic
/// keyed command and `flush_all`, spelled as the config spells them. Two vocabularies on
/// purpose: a `Command` is what the wire said (meta commands, keyless and local commands
/// included), an `Operation` is what a route decides by, and a meta command counts as its
/// classic equivalent by its flags. The mapping has one home,
/// [`operation_of`](crate::operation_of) (routing/src/operation.rs), which says how each
/// command counts.
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
