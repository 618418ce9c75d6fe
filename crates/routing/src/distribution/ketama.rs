//! twemproxy's ketama (nutcracker 0.5.0 `src/hashkit/nc_ketama.c`), byte-compatible and
//! pinned by the golden files recorded from nutcracker.
use crate::spec::ServerSpec;

use super::continuum::Continuum;
use super::member::{twemproxy_key_hash, twemproxy_order, Distribution};
use crate::hash::HashFn;

/// twemproxy's ketama: 160 points per server at equal weights, 4 per MD5 digest.
const KETAMA_POINTS_PER_SERVER: f32 = 160.0;
const KETAMA_POINTS_PER_HASH: u32 = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ketama {
    pub(crate) hash: HashFn,
    pub(crate) continuum: Continuum,
}

impl Ketama {
    /// For server `s` with identity `id`, for k in 0..points/4, the MD5 digest of `id-k`
    /// gives 4 little-endian u32 points. Point counts use the total weight and number of
    /// `servers` (the live ones, as nutcracker's `ketama_update` does).
    ///
    /// Known difference: nutcracker formats `id-k` into an 86-byte buffer but hashes the
    /// untruncated length, reading past the buffer for identities longer than about 80
    /// bytes; that undefined behaviour is not reproduced (we hash the whole label).
    pub(crate) fn build(servers: &[&ServerSpec], hash: HashFn) -> Ketama {
        let total_weight: u32 = servers.iter().map(|s| s.weight).sum();
        let live = servers.len() as u32;
        let mut points = Vec::with_capacity(servers.len() * 160);
        let mut label = String::new();
        if total_weight > 0 {
            // Insertion order only matters for equal points (see Continuum::new).
            for (member, identity) in twemproxy_order(servers) {
                let weight = servers[member].weight;
                let digests = ketama_points(weight, total_weight, live) / KETAMA_POINTS_PER_HASH;
                for k in 0..digests {
                    label.clear();
                    label.push_str(&identity.0);
                    label.push('-');
                    label.push_str(&k.to_string());
                    let digest = md5_digest(label.as_bytes());
                    for chunk in digest.chunks_exact(4) {
                        let point = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                        points.push((point, member as u32));
                    }
                }
            }
        }
        Ketama {
            hash,
            continuum: Continuum::new(points),
        }
    }
}

impl Distribution for Ketama {
    #[inline]
    fn pick(&self, part: &[u8]) -> usize {
        self.continuum.lookup(twemproxy_key_hash(self.hash, part))
    }
}

/// Points twemproxy gives one server, computed in 32-bit float exactly as nc_ketama.c:
/// `floorf((float)(pct * 160 / 4 * (float)n + 1e-10)) * 4` where `pct` is a float
/// `weight / total_weight` and the `1e-10` addition happens in double.
///
/// The float rounding is load-bearing: at 25 equal servers `0.04f * 160 / 4 * 25` is just
/// under 40, so each server gets 156 points, not 160, and we must do the same.
pub fn ketama_points(weight: u32, total_weight: u32, live_servers: u32) -> u32 {
    let pct = weight as f32 / total_weight as f32;
    let per_server: f32 = pct * KETAMA_POINTS_PER_SERVER / 4.0 * live_servers as f32;
    let nudged = (f64::from(per_server) + 0.000_000_000_1) as f32;
    (nudged.floor() * 4.0) as u32
}

fn md5_digest(bytes: &[u8]) -> [u8; 16] {
    use md5::{Digest, Md5};
    Md5::digest(bytes).into()
}
