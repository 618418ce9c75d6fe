//! memroute's `ring`: a consistent-hash circle of xxh3 points, `vnodes * weight` per
//! server. Pinned by `tests/golden/memroute/ring-jump.tsv`.
use crate::spec::ServerSpec;

use super::continuum::Continuum;
use super::member::{twemproxy_key_hash, Distribution, ServerIdentity};
use crate::hash::HashFn;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ring {
    hash: HashFn,
    continuum: Continuum,
}

impl Ring {
    /// Each point is the low 32 bits of xxh3_64(`identity-i`). The identity is the same as
    /// ketama's, so renumbering servers or reordering the list does not move keys, and a
    /// server's points do not depend on the others: losing one moves only its keys.
    /// Keys are hashed with the pool's `hash` (use `xxh3` for the intended ring).
    pub(crate) fn build(servers: &[&ServerSpec], hash: HashFn, vnodes: u32) -> Ring {
        let vnodes = vnodes.max(1);
        let mut points = Vec::new();
        let mut label = String::new();
        for (member, server) in servers.iter().enumerate() {
            let identity = ServerIdentity::of(server);
            let count = vnodes.saturating_mul(server.weight.max(1));
            for i in 0..count {
                label.clear();
                label.push_str(&identity.0);
                label.push('-');
                label.push_str(&i.to_string());
                let point = xxhash_rust::xxh3::xxh3_64(label.as_bytes()) as u32;
                points.push((point, member as u32));
            }
        }
        Ring {
            hash,
            continuum: Continuum::new(points),
        }
    }
}

impl Distribution for Ring {
    #[inline]
    fn pick(&self, part: &[u8]) -> usize {
        self.continuum.lookup(twemproxy_key_hash(self.hash, part))
    }
}
