//! Key distributions over one pool's servers.
use memroute_config::PoolConfig;

/// What a server is hashed as by ketama: twemproxy uses the server's `name` when given,
/// else `host` when the port is 11211, else `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity(pub String);

/// A pool's placement: key -> index into the pool's `servers` (config order).
#[derive(Debug, Clone)]
pub struct Placement {}

impl Placement {
    /// Builds the placement for all of the pool's servers.
    pub fn new(pool: &PoolConfig) -> Placement {
        let _ = pool;
        todo!("routing helper implements")
    }
    /// Index of the server (in config order) that owns `key` (hash_tag applied here).
    pub fn server_for(&self, key: &[u8]) -> usize {
        let _ = key;
        todo!("routing helper implements")
    }
    pub fn server_count(&self) -> usize {
        todo!("routing helper implements")
    }
}
