//! Key distributions over one pool's servers.
//!
//! ```text
//!   key --hash_tag--> part --HashFn--> u32 --+-- ketama / ring: first point >= hash on a sorted
//!                                            |                  Vec<(point, server)>, wrapping
//!                                            +-- modula: slots[hash % slots.len()]
//!   key --hash_tag--> part --xxh3_64--> u64 --- jump: Lamping-Veach jump hash
//!   (nothing) --------------------------------- random: a uniformly random server
//! ```
//!
//! `ketama`, `modula` and `random` follow nutcracker 0.5.0 (`src/hashkit/nc_ketama.c`,
//! `nc_modula.c`, `nc_random.c`). [`Placement::new`] places over every server (twemproxy's
//! `auto_eject_hosts: false`); [`Placement::with_live`] places over the live subset only,
//! the way nutcracker rebuilds its continuum from live servers when it ejects one. Either
//! way the index returned is the server's index in the pool's *config* order, so callers
//! never translate. Everything is computed once; [`Placement::server_for`] never allocates.
//!
//! What losing a server moves, per distribution (the reason `eject` suits some only):
//! ketama (equal weights) and ring move only the dead server's keys; modula and jump
//! renumber the survivors and move most keys; random has nothing to move.
//!
//! A twemproxy quirk that decides modula placement: while checking for duplicates,
//! nutcracker sorts each pool's servers by identity (shorter identity first, then
//! bytewise) and builds its continuum in that order, so modula slot `i` is the `i`-th
//! server in *that* order, not in config order. [`twemproxy_order`] reproduces it; the
//! index we return is still the config-order index.
use memroute_config::{DistributionName, PoolConfig, ServerConfig};
use rand::Rng;

use crate::hash::{hash_key_part, HashFn};

/// twemproxy's ketama: 160 points per server at equal weights, 4 per MD5 digest.
const KETAMA_POINTS_PER_SERVER: f32 = 160.0;
const KETAMA_POINTS_PER_HASH: u32 = 4;
/// memcached's default port: twemproxy leaves it out of a server's ketama identity, for
/// compatibility with libmemcached.
const KETAMA_DEFAULT_PORT: u16 = 11211;

/// What a server is hashed as by ketama: twemproxy uses the server's `name` when given,
/// else `host` when the port is 11211, else `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity(pub String);

impl ServerIdentity {
    /// The identity twemproxy would give this server.
    pub fn of(server: &ServerConfig) -> ServerIdentity {
        if let Some(name) = &server.name {
            return ServerIdentity(name.clone());
        }
        // twemproxy compares the parsed port number, so "h:11211" is "h".
        match server.address.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>() == Ok(KETAMA_DEFAULT_PORT) => {
                ServerIdentity(host.to_string())
            }
            _ => ServerIdentity(server.address.clone()),
        }
    }
}

/// A pool's placement: key -> index into the pool's `servers` (config order).
#[derive(Debug, Clone)]
pub struct Placement {
    hash: HashFn,
    hash_tag: Option<[u8; 2]>,
    /// Servers placed over (the live ones for [`Placement::with_live`]).
    servers: usize,
    /// Config index of the first server placed over (0 when there is none): the answer
    /// whenever there is at most one, which skips hashing as twemproxy does.
    first: usize,
    kind: Kind,
}

/// Every server index stored here is a config-order index, so a placement over a live
/// subset answers in the same numbering as one over the whole pool.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// ketama and ring: (point, server index), sorted by point; ties keep insertion order.
    Continuum(Vec<(u32, u32)>),
    /// modula: each server repeated `weight` times, in twemproxy's server order.
    Slots(Vec<u32>),
    /// random: a uniformly random member (twemproxy 0.5.0 ignores weights here).
    Random(Vec<u32>),
    /// jump consistent hash over xxh3_64 of the key, bucket `b` being `members[b]`; the
    /// pool's `hash` and the servers' weights are not used (jump needs a 64-bit key and has
    /// no notion of weight).
    Jump(Vec<u32>),
}

impl Placement {
    /// Builds the placement for all of the pool's servers.
    ///
    /// An empty pool (a DNS pool before its first lookup) gives a placement whose
    /// `server_count()` is 0 and whose `server_for` answers 0: callers check the count
    /// before using the answer as an index.
    pub fn new(pool: &PoolConfig) -> Placement {
        let members: Vec<usize> = (0..pool.servers.len()).collect();
        Placement::over(pool, &members)
    }

    /// Placement over the servers of `pool` whose `live[i]` is true, answering indices in
    /// the pool's config order. Weights, names and hash are those of the pool; ketama and
    /// modula are rebuilt from the live servers exactly as nutcracker does on ejection.
    /// A server without an entry in `live` (a stale vector after the pool grew) counts as
    /// live: leaving a server in is the safe mistake. With no live server, this behaves like
    /// an empty pool (see [`Placement::new`]).
    pub fn with_live(pool: &PoolConfig, live: &[bool]) -> Placement {
        let members: Vec<usize> = (0..pool.servers.len())
            .filter(|&i| live.get(i).copied().unwrap_or(true))
            .collect();
        Placement::over(pool, &members)
    }

    /// `members`: config indices of the servers to place over, ascending.
    fn over(pool: &PoolConfig, members: &[usize]) -> Placement {
        let servers = &pool.servers;
        let as_u32 = || members.iter().map(|&i| i as u32).collect::<Vec<u32>>();
        let kind = match pool.distribution {
            DistributionName::Ketama => Kind::Continuum(ketama_continuum(servers, members)),
            DistributionName::Ring => {
                Kind::Continuum(ring_continuum(servers, members, pool.vnodes))
            }
            DistributionName::Modula => Kind::Slots(modula_slots(servers, members)),
            DistributionName::Random => Kind::Random(as_u32()),
            DistributionName::Jump => Kind::Jump(as_u32()),
        };
        Placement {
            hash: HashFn(pool.hash),
            hash_tag: pool.hash_tag,
            servers: members.len(),
            first: members.first().copied().unwrap_or(0),
            kind,
        }
    }

    /// Index of the server (in config order) that owns `key` (hash_tag applied here).
    #[inline]
    pub fn server_for(&self, key: &[u8]) -> usize {
        // twemproxy skips hashing altogether for a single server; so do we (and an empty
        // pool answers 0 rather than panicking on a modulo by zero).
        if self.servers <= 1 {
            return self.first;
        }
        let part = hash_key_part(key, self.hash_tag);
        match &self.kind {
            Kind::Continuum(points) => {
                let h = self.key_hash(part);
                // First point >= h; past the last point wraps to the first.
                let i = points.partition_point(|&(p, _)| p < h);
                let (_, server) = if i == points.len() {
                    points[0]
                } else {
                    points[i]
                };
                server as usize
            }
            Kind::Slots(slots) => slots[(self.key_hash(part) as usize) % slots.len()] as usize,
            Kind::Random(members) => {
                members[rand::thread_rng().gen_range(0..members.len())] as usize
            }
            Kind::Jump(members) => {
                members[jump_hash(xxhash_rust::xxh3::xxh3_64(part), members.len())] as usize
            }
        }
    }

    /// How many servers this placement chooses among: the pool's size for
    /// [`Placement::new`], the live servers for [`Placement::with_live`].
    pub fn server_count(&self) -> usize {
        self.servers
    }

    /// The key's hash as the distribution sees it; twemproxy hashes an empty key to 0.
    #[inline]
    fn key_hash(&self, part: &[u8]) -> u32 {
        if part.is_empty() {
            0
        } else {
            self.hash.hash(part)
        }
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

/// Config-order indices and identities of the `members` of `servers`, in the order
/// nutcracker keeps them: sorted by identity length, then bytes (its `string_compare`).
/// Stable, so duplicate identities (which nutcracker would reject) keep config order.
fn twemproxy_order(servers: &[ServerConfig], members: &[usize]) -> Vec<(usize, ServerIdentity)> {
    let mut order: Vec<(usize, ServerIdentity)> = members
        .iter()
        .map(|&i| (i, ServerIdentity::of(&servers[i])))
        .collect();
    order.sort_by(|(_, a), (_, b)| {
        a.0.len()
            .cmp(&b.0.len())
            .then_with(|| a.0.as_bytes().cmp(b.0.as_bytes()))
    });
    order
}

/// twemproxy's ketama continuum: for server `s` with identity `id`, for k in
/// 0..points/4, the MD5 digest of `id-k` gives 4 little-endian u32 points.
///
/// Known difference: nutcracker formats `id-k` into an 86-byte buffer but hashes the
/// untruncated length, reading past the buffer for identities longer than about 80
/// bytes; that undefined behaviour is not reproduced (we hash the whole label).
///
/// Only `members` take part, and the point counts use their total weight and number, as
/// nutcracker's `ketama_update` does with its live servers.
fn ketama_continuum(servers: &[ServerConfig], members: &[usize]) -> Vec<(u32, u32)> {
    let total_weight: u32 = members.iter().map(|&i| servers[i].weight).sum();
    if total_weight == 0 {
        return Vec::new();
    }
    let live = members.len() as u32;
    let mut points = Vec::with_capacity(members.len() * 160);
    let mut label = String::new();
    // Insertion order only matters for equal points (see the sort below).
    for (index, identity) in twemproxy_order(servers, members) {
        let server = &servers[index];
        let digests = ketama_points(server.weight, total_weight, live) / KETAMA_POINTS_PER_HASH;
        for k in 0..digests {
            label.clear();
            label.push_str(&identity.0);
            label.push('-');
            label.push_str(&k.to_string());
            let digest = md5_digest(label.as_bytes());
            for chunk in digest.chunks_exact(4) {
                let point = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                points.push((point, index as u32));
            }
        }
    }
    // twemproxy sorts with glibc qsort, which is a stable merge sort for arrays this size;
    // equal points therefore keep insertion (twemproxy server) order, and lookup (first
    // point >= hash) picks the first of them. A stable sort by point does the same.
    points.sort_by_key(|&(point, _)| point);
    points
}

fn md5_digest(bytes: &[u8]) -> [u8; 16] {
    use md5::{Digest, Md5};
    Md5::digest(bytes).into()
}

/// memroute's `ring`: `vnodes * weight` points per server, each the low 32 bits of
/// xxh3_64(`identity-i`). The identity is the same as ketama's, so renumbering servers or
/// reordering the list does not move keys.
/// Keys are hashed with the pool's `hash` (use `xxh3` for the intended ring), and looked
/// up exactly like ketama: first point >= hash, wrapping.
/// A server's points do not depend on the other members, so losing one moves only its keys.
fn ring_continuum(servers: &[ServerConfig], members: &[usize], vnodes: u32) -> Vec<(u32, u32)> {
    let vnodes = vnodes.max(1);
    let mut points = Vec::new();
    let mut label = String::new();
    for &index in members {
        let server = &servers[index];
        let identity = ServerIdentity::of(server);
        let count = vnodes.saturating_mul(server.weight.max(1));
        for i in 0..count {
            label.clear();
            label.push_str(&identity.0);
            label.push('-');
            label.push_str(&i.to_string());
            let point = xxhash_rust::xxh3::xxh3_64(label.as_bytes()) as u32;
            points.push((point, index as u32));
        }
    }
    points.sort_by_key(|&(point, _)| point);
    points
}

/// twemproxy's modula continuum: every server repeated `weight` times, in twemproxy's
/// server order (see [`twemproxy_order`]).
fn modula_slots(servers: &[ServerConfig], members: &[usize]) -> Vec<u32> {
    let mut slots = Vec::new();
    for (index, _) in twemproxy_order(servers, members) {
        for _ in 0..servers[index].weight {
            slots.push(index as u32);
        }
    }
    slots
}

/// Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014).
/// Moves only ~1/n of keys when the n-th server is appended; servers cannot be removed
/// from the middle without renumbering, and weights are not supported.
fn jump_hash(mut key: u64, buckets: usize) -> usize {
    let buckets = buckets as i64;
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < buckets {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use memroute_config::HashName;

    fn pool(n: usize, distribution: DistributionName, hash: HashName) -> PoolConfig {
        PoolConfig {
            servers: (0..n)
                .map(|i| ServerConfig {
                    address: format!("10.0.0.{}:{}", i + 1, 11300 + i),
                    weight: 1,
                    name: None,
                })
                .collect(),
            distribution,
            hash,
            ..PoolConfig::new(Vec::new())
        }
    }

    fn keys(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("key:{i}:{}", i * 7919).into_bytes())
            .collect()
    }

    #[test]
    fn identity_follows_twemproxys_rule() {
        let s = |address: &str, name: Option<&str>| ServerConfig {
            address: address.to_string(),
            weight: 1,
            name: name.map(str::to_string),
        };
        assert_eq!(ServerIdentity::of(&s("10.0.0.1:11211", None)).0, "10.0.0.1");
        assert_eq!(
            ServerIdentity::of(&s("10.0.0.1:11212", None)).0,
            "10.0.0.1:11212"
        );
        assert_eq!(
            ServerIdentity::of(&s("10.0.0.1:11211", Some("mc-1"))).0,
            "mc-1"
        );
    }

    #[test]
    fn ketama_point_counts_use_float32_arithmetic() {
        // Equal weights: 160 points, except where f32 rounding lands just under 40.
        assert_eq!(ketama_points(1, 1, 1), 160);
        assert_eq!(ketama_points(1, 3, 3), 160);
        assert_eq!(ketama_points(1, 10, 10), 160);
        assert_eq!(ketama_points(1, 25, 25), 156);
        let p = pool(25, DistributionName::Ketama, HashName::Fnv1a_64);
        match Placement::new(&p).kind {
            Kind::Continuum(points) => assert_eq!(points.len(), 25 * 156),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn ketama_continuum_is_sorted_and_lookup_wraps() {
        let p = pool(3, DistributionName::Ketama, HashName::Md5);
        let placement = Placement::new(&p);
        let Kind::Continuum(points) = &placement.kind else {
            panic!("not a continuum")
        };
        assert!(points.windows(2).all(|w| w[0].0 <= w[1].0));
        // A hash above the last point goes to the first point's server.
        let last = points[points.len() - 1].0;
        assert!(last < u32::MAX);
        let i = points.partition_point(|&(pt, _)| pt < u32::MAX);
        assert_eq!(i, points.len());
    }

    #[test]
    fn single_server_pool_always_answers_zero() {
        for d in DistributionName::ALL {
            let placement = Placement::new(&pool(1, d, HashName::Fnv1a_64));
            for k in keys(50) {
                assert_eq!(placement.server_for(&k), 0);
            }
        }
    }

    #[test]
    fn every_distribution_stays_in_range() {
        for d in DistributionName::ALL {
            for n in [2, 3, 7] {
                let placement = Placement::new(&pool(n, d, HashName::Fnv1a_64));
                assert_eq!(placement.server_count(), n);
                for k in keys(200) {
                    assert!(placement.server_for(&k) < n, "{d:?}");
                }
            }
        }
    }

    #[test]
    fn modula_repeats_servers_by_weight() {
        let mut p = pool(2, DistributionName::Modula, HashName::Crc32a);
        p.servers[1].weight = 3;
        let placement = Placement::new(&p);
        for k in keys(200) {
            let expected = [0, 1, 1, 1][(crate::hash::crc32a(&k) % 4) as usize];
            assert_eq!(placement.server_for(&k), expected);
        }
    }

    #[test]
    fn twemproxy_orders_servers_by_identity_length_then_bytes() {
        let s = |address: &str, name: Option<&str>| ServerConfig {
            address: address.to_string(),
            weight: 1,
            name: name.map(str::to_string),
        };
        let servers = [
            s("10.0.0.1:11212", None),
            s("10.0.0.9:11211", None),
            s("10.0.0.2:11211", Some("zz")),
            s("10.0.0.3:11211", Some("b-long-name")),
            s("10.0.0.10:11211", None),
        ];
        let all: Vec<usize> = (0..servers.len()).collect();
        let order: Vec<usize> = twemproxy_order(&servers, &all)
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        // "zz" (2) < "10.0.0.9" (8) < "10.0.0.10" (9) < "b-long-name" (11) < "10.0.0.1:11212" (14)
        assert_eq!(order, [2, 1, 4, 3, 0]);
        // modula slot i is the i-th server in that order.
        let mut p = pool(5, DistributionName::Modula, HashName::Crc32a);
        p.servers = servers.to_vec();
        let placement = Placement::new(&p);
        for k in keys(100) {
            let slot = (crate::hash::crc32a(&k) % 5) as usize;
            assert_eq!(placement.server_for(&k), order[slot]);
        }
    }

    #[test]
    fn hash_tag_keeps_tagged_keys_together() {
        for d in [
            DistributionName::Ketama,
            DistributionName::Ring,
            DistributionName::Jump,
            DistributionName::Modula,
        ] {
            let mut p = pool(10, d, HashName::Fnv1a_64);
            p.hash_tag = Some(*b"{}");
            let placement = Placement::new(&p);
            let home = placement.server_for(b"user:{1234}:profile");
            for k in ["{1234}", "x{1234}y", "session:{1234}", "{1234}{other}"] {
                assert_eq!(placement.server_for(k.as_bytes()), home, "{d:?} {k}");
            }
        }
    }

    fn spread(placement: &Placement, n: usize, keys: &[Vec<u8>]) -> Vec<usize> {
        let mut counts = vec![0usize; n];
        for k in keys {
            counts[placement.server_for(k)] += 1;
        }
        counts
    }

    #[test]
    fn ring_and_jump_balance_keys() {
        let ks = keys(100_000);
        for d in [DistributionName::Ring, DistributionName::Jump] {
            let n = 10;
            let placement = Placement::new(&pool(n, d, HashName::Xxh3));
            let counts = spread(&placement, n, &ks);
            let mean = ks.len() / n;
            for c in counts {
                // 256 vnodes give a few percent of spread; allow 15%.
                assert!(c.abs_diff(mean) * 100 < mean * 15, "{d:?}: {c} vs {mean}");
            }
        }
    }

    #[test]
    fn adding_a_server_moves_about_one_nth_of_keys() {
        let ks = keys(50_000);
        for d in [
            DistributionName::Ring,
            DistributionName::Jump,
            DistributionName::Ketama,
        ] {
            let before = Placement::new(&pool(9, d, HashName::Xxh3));
            let after = Placement::new(&pool(10, d, HashName::Xxh3));
            let mut moved = 0usize;
            for k in &ks {
                let (a, b) = (before.server_for(k), after.server_for(k));
                if a != b {
                    moved += 1;
                    // Keys only move to the new server.
                    assert_eq!(b, 9, "{d:?}");
                }
            }
            // Ideal is 1/10 of keys; allow 7%..13%. (Ketama's point counts are fixed by
            // float arithmetic, so it lands near the ideal too.)
            let pct = moved * 100 / ks.len();
            assert!((7..=13).contains(&pct), "{d:?} moved {pct}%");
        }
    }

    #[test]
    fn ring_weights_scale_the_share() {
        let mut p = pool(2, DistributionName::Ring, HashName::Xxh3);
        p.servers[1].weight = 3;
        let placement = Placement::new(&p);
        let counts = spread(&placement, 2, &keys(40_000));
        // Expected 25% / 75%.
        assert!((8_000..12_000).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn jump_matches_published_vectors() {
        // Test vectors of the widely used Go port (dgryski/go-jump) of the paper's code.
        assert_eq!(jump_hash(1, 1), 0);
        assert_eq!(jump_hash(42, 57), 43);
        assert_eq!(jump_hash(0xDEAD_10CC, 1), 0);
        assert_eq!(jump_hash(0xDEAD_10CC, 666), 361);
        assert_eq!(jump_hash(256, 1024), 520);
    }

    #[test]
    fn random_uses_every_server() {
        let placement = Placement::new(&pool(4, DistributionName::Random, HashName::Md5));
        let mut seen = [false; 4];
        for _ in 0..1000 {
            seen[placement.server_for(b"same-key")] = true;
        }
        assert_eq!(seen, [true; 4]);
    }

    #[test]
    fn with_live_over_every_server_equals_new() {
        let ks = keys(2_000);
        for d in DistributionName::ALL {
            for n in [0, 1, 2, 3, 7, 25] {
                let mut p = pool(n, d, HashName::Fnv1a_64);
                if n > 2 {
                    p.servers[2].weight = 3;
                    p.servers[0].name = Some("named-0".into());
                }
                let all = Placement::new(&p);
                let live = Placement::with_live(&p, &vec![true; n]);
                assert_eq!(all.kind, live.kind, "{d:?} n={n}");
                assert_eq!(all.server_count(), live.server_count());
                assert_eq!(all.first, live.first);
                if d != DistributionName::Random {
                    for k in &ks {
                        assert_eq!(all.server_for(k), live.server_for(k), "{d:?} n={n}");
                    }
                }
            }
        }
    }

    #[test]
    fn ketama_and_ring_move_only_the_dead_servers_keys() {
        let ks = keys(20_000);
        for d in [DistributionName::Ketama, DistributionName::Ring] {
            let n = 10;
            let p = pool(n, d, HashName::Fnv1a_64);
            let all = Placement::new(&p);
            let dead = 4;
            let mut live = vec![true; n];
            live[dead] = false;
            let without = Placement::with_live(&p, &live);
            assert_eq!(without.server_count(), n - 1);
            let mut moved = 0;
            for k in &ks {
                let (before, after) = (all.server_for(k), without.server_for(k));
                assert_ne!(after, dead, "{d:?}: a dead server got a key");
                if before == dead {
                    moved += 1;
                } else {
                    assert_eq!(before, after, "{d:?}: a live server's key moved");
                }
            }
            // The dead server held about a tenth of the keys; they all went elsewhere.
            assert!(moved > ks.len() / 20, "{d:?} moved {moved}");
        }
    }

    #[test]
    fn with_live_answers_config_indices_and_never_a_dead_server() {
        let ks = keys(2_000);
        for d in DistributionName::ALL {
            let p = pool(6, d, HashName::Fnv1a_64);
            let live = [false, true, false, true, true, false];
            let placement = Placement::with_live(&p, &live);
            assert_eq!(placement.server_count(), 3);
            let mut seen = [false; 6];
            for k in &ks {
                let s = placement.server_for(k);
                assert!(live[s], "{d:?} chose dead server {s}");
                seen[s] = true;
            }
            assert_eq!(seen, live, "{d:?} left a live server unused");
        }
    }

    #[test]
    fn with_live_edge_cases() {
        let p = pool(3, DistributionName::Ketama, HashName::Fnv1a_64);
        // One live server: it gets everything, whatever its index.
        let one = Placement::with_live(&p, &[false, false, true]);
        assert_eq!(one.server_count(), 1);
        assert_eq!(one.server_for(b"k"), 2);
        // None live: an empty pool, which answers 0 without panicking.
        let none = Placement::with_live(&p, &[false, false, false]);
        assert_eq!(none.server_count(), 0);
        assert_eq!(none.server_for(b"k"), 0);
        // A short (stale) vector: servers without an entry count as live.
        let short = Placement::with_live(&p, &[false]);
        assert_eq!(short.server_count(), 2);
        assert_ne!(short.server_for(b"k"), 0);
        // An empty pool (DNS before its first answer) does not panic either.
        for d in DistributionName::ALL {
            let empty = Placement::new(&pool(0, d, HashName::Fnv1a_64));
            assert_eq!(empty.server_count(), 0);
            assert_eq!(empty.server_for(b"k"), 0);
        }
    }

    #[test]
    fn ketama_with_live_uses_live_weights_like_nutcracker() {
        // nutcracker recomputes points from the live servers' total weight and count:
        // 9 equal live servers get 160 points each, as a pool of 9 would.
        let p = pool(10, DistributionName::Ketama, HashName::Fnv1a_64);
        let mut live = vec![true; 10];
        live[9] = false;
        let without = Placement::with_live(&p, &live);
        let nine = Placement::new(&pool(9, DistributionName::Ketama, HashName::Fnv1a_64));
        assert_eq!(without.kind, nine.kind);
    }
}
