//! What a lookup finds: the servers and the records' TTL. Below the sources (dns.rs,
//! hosts) that build it and the entry point (mod.rs) that sorts and returns it.
use std::net::SocketAddr;
use std::time::Duration;

/// One server found for a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundServer {
    pub address: SocketAddr,
    /// The SRV target the address came from (`memcached-0.memcached.ns.svc.cluster.local`),
    /// when it has exactly one address: a StatefulSet pod keeps its name across restarts
    /// while its IP changes, so the ring hashes the name and keys stay where they were.
    pub name: Option<String>,
}

/// What one lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Sorted (IPv4 before IPv6, then by address and port), deduplicated, never empty.
    pub servers: Vec<FoundServer>,
    /// The smallest TTL of the records used; `None` for the hosts file (no TTL).
    pub ttl: Option<Duration>,
}
