//! Key distributions over one pool's servers, one file each behind [`Distribution`].
//!
//! ```text
//!   key --hash_tag--> part --HashFn--> u32 --+-- ketama / ring: first point >= hash on a
//!                                            |                  sorted circle, wrapping
//!                                            +-- modula: slots[hash % slots.len()]
//!   key --hash_tag--> part --xxh3_64--> u64 --- jump: Lamping-Veach jump hash
//!   (nothing) --------------------------------- random: a uniformly random server
//!   key --mcrouter routing key (+hash_tag)--+-- ch3: furc over MurmurHash64A
//!                                           +-- wch3: furc + SpookyHash coin, 32 tries
//!                                           '-- crc32: (crc32 & 0x7FFFFFFF) % n
//! ```
//!
//! `ketama`, `modula` and `random` follow nutcracker 0.5.0; `ch3`, `wch3` and `crc32`
//! follow mcrouter; `ring` and `jump` are memroute's own. Each is pinned by golden files
//! (`tests/golden/`). [`Placement::new`] places over every server (twemproxy's
//! `auto_eject_hosts: false`); [`Placement::with_live`] places over the live subset only,
//! the way nutcracker rebuilds its continuum from live servers when it ejects one. A
//! distribution answers a *member position* (among the servers it was built over);
//! `Placement` turns that into the server's index in the pool's *config* order, so callers
//! never translate. Everything is computed once; [`Placement::server_for`] never
//! allocates (wch3 keeps its retry key on the stack).
//!
//! What losing a server moves, per distribution (the reason `eject` suits some only):
//! ketama (equal weights) and ring move only the dead server's keys; modula, jump, ch3,
//! wch3 and crc32 renumber the survivors and move most keys; random has nothing to move.
//!
//! A twemproxy quirk that decides modula placement: while checking for duplicates,
//! nutcracker sorts each pool's servers by identity (shorter identity first, then
//! bytewise) and builds its continuum in that order, so modula slot `i` is the `i`-th
//! server in *that* order, not in config order. `member::twemproxy_order` reproduces it.
use crate::spec::{DistributionName, PoolSpec, ServerSpec};

use smallvec::SmallVec;

use crate::hash::{hash_key_part, HashFn};
use crate::mcrouter_hash::routing_key;

mod ch3;
mod continuum;
mod crc32;
mod jump;
mod ketama;
mod member;
mod modula;
mod random;
mod ring;
mod wch3;

#[cfg(test)]
use ketama::ketama_points;
#[cfg(test)]
use member::twemproxy_order;
use member::Distribution;
pub use member::ServerIdentity;
use wch3::WCH3_MISSING_WEIGHT;

/// A pool's placement: key -> index into the pool's `servers` (config order).
#[derive(Debug, Clone)]
pub struct Placement {
    hash_tag: Option<[u8; 2]>,
    /// mcrouter's hash salt (its distributions only; empty: none).
    salt: Box<[u8]>,
    /// Config index of each member (the servers placed over, ascending): the live ones
    /// for [`Placement::with_live`].
    members: Vec<u32>,
    kind: Kind,
}

/// The distributions, dispatched by `match` (no virtual call on the request path).
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Ketama(ketama::Ketama),
    Modula(modula::Modula),
    Random(random::Random),
    Ring(ring::Ring),
    Jump(jump::Jump),
    Ch3(ch3::Ch3),
    WeightedCh3(wch3::WeightedCh3),
    Crc32(crc32::Crc32),
}

impl Kind {
    #[inline]
    fn pick(&self, part: &[u8]) -> usize {
        match self {
            Kind::Ketama(d) => d.pick(part),
            Kind::Modula(d) => d.pick(part),
            Kind::Random(d) => d.pick(part),
            Kind::Ring(d) => d.pick(part),
            Kind::Jump(d) => d.pick(part),
            Kind::Ch3(d) => d.pick(part),
            Kind::WeightedCh3(d) => d.pick(part),
            Kind::Crc32(d) => d.pick(part),
        }
    }

    /// mcrouter's distributions hash its routing key (see [`routing_key`]).
    #[inline]
    fn uses_mcrouter_routing_key(&self) -> bool {
        matches!(self, Kind::Ch3(_) | Kind::WeightedCh3(_) | Kind::Crc32(_))
    }
}

impl Placement {
    /// Builds the placement for all of the pool's servers.
    ///
    /// An empty pool (a DNS pool before its first lookup) gives a placement whose
    /// `server_count()` is 0 and whose `server_for` answers 0: callers check the count
    /// before using the answer as an index.
    pub fn new(pool: &PoolSpec) -> Placement {
        let members: Vec<usize> = (0..pool.servers.len()).collect();
        Placement::over(pool, &members)
    }

    /// Placement over the servers of `pool` whose `live[i]` is true, answering indices in
    /// the pool's config order. Weights, names and hash are those of the pool; ketama and
    /// modula are rebuilt from the live servers exactly as nutcracker does on ejection.
    /// A server without an entry in `live` (a stale vector after the pool grew) counts as
    /// live: leaving a server in is the safe mistake. With no live server, this behaves like
    /// an empty pool (see [`Placement::new`]).
    pub fn with_live(pool: &PoolSpec, live: &[bool]) -> Placement {
        let members: Vec<usize> = (0..pool.servers.len())
            .filter(|&i| live.get(i).copied().unwrap_or(true))
            .collect();
        Placement::over(pool, &members)
    }

    /// `members`: config indices of the servers to place over, ascending.
    fn over(pool: &PoolSpec, members: &[usize]) -> Placement {
        let servers: Vec<&ServerSpec> = members.iter().map(|&i| &pool.servers[i]).collect();
        let hash = HashFn(pool.hash);
        let kind = match pool.distribution {
            DistributionName::Ketama => Kind::Ketama(ketama::Ketama::build(&servers, hash)),
            DistributionName::Ring => Kind::Ring(ring::Ring::build(&servers, hash, pool.vnodes)),
            DistributionName::Modula => Kind::Modula(modula::Modula::build(&servers, hash)),
            DistributionName::Random => Kind::Random(random::Random::build(servers.len())),
            DistributionName::Jump => Kind::Jump(jump::Jump::build(servers.len())),
            DistributionName::Ch3 => Kind::Ch3(ch3::Ch3::build(servers.len())),
            DistributionName::Crc32 => Kind::Crc32(crc32::Crc32::build(servers.len())),
            // mcrouter's rules for a list of the wrong length: extra weights are ignored,
            // missing ones are 0.5.
            DistributionName::WeightedCh3 => Kind::WeightedCh3(wch3::WeightedCh3::build(
                members
                    .iter()
                    .map(|&i| pool.weights.get(i).copied().unwrap_or(WCH3_MISSING_WEIGHT)),
            )),
        };
        Placement {
            hash_tag: pool.hash_tag,
            salt: pool.salt.as_bytes().into(),
            members: members.iter().map(|&i| i as u32).collect(),
            kind,
        }
    }

    /// Index of the server (in config order) that owns `key` (hash_tag applied here).
    #[inline]
    pub fn server_for(&self, key: &[u8]) -> usize {
        // twemproxy and mcrouter skip hashing altogether for a single server; so do we
        // (and an empty pool answers 0 rather than panicking on a modulo by zero).
        if self.members.len() <= 1 {
            return self.members.first().map_or(0, |&m| m as usize);
        }
        let member = if self.kind.uses_mcrouter_routing_key() {
            let part = hash_key_part(routing_key(key), self.hash_tag);
            if self.salt.is_empty() {
                self.kind.pick(part)
            } else {
                // mcrouter hashes `routing key ++ salt` (wch3 appends its retry suffixes
                // after the salt). Keys are at most 250 bytes: the buffer stays on the stack.
                let mut salted: SmallVec<[u8; 320]> = SmallVec::from_slice(part);
                salted.extend_from_slice(&self.salt);
                self.kind.pick(&salted)
            }
        } else {
            self.kind.pick(hash_key_part(key, self.hash_tag))
        };
        self.members.get(member).map_or(0, |&m| m as usize)
    }

    /// [`Placement::server_for`] of each of `keys`, into `servers` (as long as `keys`).
    /// twemproxy's ketama and modula hash four keys at once ([`HashFn::hash4`]): a
    /// multi-get places all its keys together.
    pub fn servers_for(&self, keys: &[&[u8]], servers: &mut [u32]) {
        let hash = match &self.kind {
            Kind::Ketama(ketama) if self.members.len() > 1 => ketama.hash,
            Kind::Modula(modula) if self.members.len() > 1 => modula.hash,
            _ => {
                for (key, server) in keys.iter().zip(servers.iter_mut()) {
                    *server = self.server_for(key) as u32;
                }
                return;
            }
        };
        let mut keys4 = keys.chunks_exact(4);
        let mut servers4 = servers.chunks_exact_mut(4);
        for (keys, servers) in (&mut keys4).zip(&mut servers4) {
            let parts = [0, 1, 2, 3].map(|i| hash_key_part(keys[i], self.hash_tag));
            let hashes = hash.hash4(parts);
            for ((server, part), hashed) in servers.iter_mut().zip(parts).zip(hashes) {
                // twemproxy hashes an empty key to 0 (see `member::twemproxy_key_hash`).
                let hashed = if part.is_empty() { 0 } else { hashed };
                let member = match &self.kind {
                    Kind::Ketama(ketama) => ketama.continuum.lookup(hashed),
                    Kind::Modula(modula) => modula.slot(hashed),
                    _ => 0,
                };
                *server = self.members.get(member).copied().unwrap_or(0);
            }
        }
        for (key, server) in keys4.remainder().iter().zip(servers4.into_remainder()) {
            *server = self.server_for(key) as u32;
        }
    }

    /// How many servers this placement chooses among: the pool's size for
    /// [`Placement::new`], the live servers for [`Placement::with_live`].
    pub fn server_count(&self) -> usize {
        self.members.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::HashName;

    fn pool(n: usize, distribution: DistributionName, hash: HashName) -> PoolSpec {
        PoolSpec {
            servers: (0..n)
                .map(|i| ServerSpec {
                    address: format!("10.0.0.{}:{}", i + 1, 11300 + i),
                    weight: 1,
                    name: None,
                })
                .collect(),
            distribution,
            hash,
            ..PoolSpec::new(Vec::new())
        }
    }

    fn keys(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("key:{i}:{}", i * 7919).into_bytes())
            .collect()
    }

    #[test]
    fn identity_follows_twemproxys_rule() {
        let s = |address: &str, name: Option<&str>| ServerSpec {
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
            Kind::Ketama(k) => assert_eq!(k.continuum.points.len(), 25 * 156),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn ketama_continuum_is_sorted_and_lookup_wraps() {
        let p = pool(3, DistributionName::Ketama, HashName::Md5);
        let placement = Placement::new(&p);
        let Kind::Ketama(ketama) = &placement.kind else {
            panic!("not ketama")
        };
        let points = &ketama.continuum.points;
        assert!(points.windows(2).all(|w| w[0].0 <= w[1].0));
        // A hash above the last point goes to the first point's server.
        let last = points[points.len() - 1].0;
        assert!(last < u32::MAX);
        let i = points.partition_point(|&(pt, _)| pt < u32::MAX);
        assert_eq!(i, points.len());
    }

    /// Placing a multi-get's keys together answers what placing each key does, for every
    /// distribution and hash, any number of keys (four at a time and the rest), hash tags,
    /// an empty key, one server, and a placement over the live servers only.
    #[test]
    fn servers_for_places_keys_as_server_for_does() {
        let names: Vec<Vec<u8>> = (0..11)
            .map(|i| format!("user:{i:03}:{{t{}}}", i % 3).into_bytes())
            .chain([Vec::new(), b"\xe9\xff".to_vec()])
            .collect();
        let keys: Vec<&[u8]> = names.iter().map(|k| &k[..]).collect();
        for d in DistributionName::ALL {
            for h in [HashName::Fnv1a_64, HashName::Fnv1a_32, HashName::Md5] {
                for (servers, tag) in [(1, None), (5, None), (5, Some(*b"{}"))] {
                    let mut p = pool(servers, d, h);
                    p.hash_tag = tag;
                    let mut live = vec![true; servers];
                    live[servers - 1] = servers == 1;
                    for placement in [Placement::new(&p), Placement::with_live(&p, &live)] {
                        for n in 0..=keys.len() {
                            let mut placed = vec![u32::MAX; n];
                            placement.servers_for(&keys[..n], &mut placed);
                            let one_by_one: Vec<u32> = keys[..n]
                                .iter()
                                .map(|key| placement.server_for(key) as u32)
                                .collect();
                            if d == DistributionName::Random {
                                assert!(placed.iter().all(|&s| (s as usize) < servers));
                            } else {
                                assert_eq!(placed, one_by_one, "{d:?} {h:?} {servers} {n}");
                            }
                        }
                    }
                }
            }
        }
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
        let s = |address: &str, name: Option<&str>| ServerSpec {
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
        let refs: Vec<&ServerSpec> = servers.iter().collect();
        let order: Vec<usize> = twemproxy_order(&refs).into_iter().map(|(i, _)| i).collect();
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
        assert_eq!(jump::jump_hash(1, 1), 0);
        assert_eq!(jump::jump_hash(42, 57), 43);
        assert_eq!(jump::jump_hash(0xDEAD_10CC, 1), 0);
        assert_eq!(jump::jump_hash(0xDEAD_10CC, 666), 361);
        assert_eq!(jump::jump_hash(256, 1024), 520);
    }

    #[test]
    fn salt_is_hashed_after_the_routing_key() {
        let weights = vec![1.0, 0.5, 0.25, 1.0, 0.1];
        for d in [
            DistributionName::Ch3,
            DistributionName::WeightedCh3,
            DistributionName::Crc32,
        ] {
            let mut plain = pool(5, d, HashName::Fnv1a_64);
            plain.weights = weights.clone();
            let mut salted = plain.clone();
            salted.salt = "s@lt".into();
            let (plain, salted) = (Placement::new(&plain), Placement::new(&salted));
            let mut differ = 0;
            for k in keys(500) {
                let mut with_salt = k.clone();
                with_salt.extend_from_slice(b"s@lt");
                assert_eq!(salted.server_for(&k), plain.server_for(&with_salt), "{d:?}");
                // The routing prefix and hash stop apply before the salt.
                let mut routed = b"/r/c/".to_vec();
                routed.extend_from_slice(&k);
                routed.extend_from_slice(b"|#|tail");
                assert_eq!(salted.server_for(&routed), salted.server_for(&k), "{d:?}");
                differ += usize::from(salted.server_for(&k) != plain.server_for(&k));
            }
            assert!(
                differ > 100,
                "{d:?}: the salt moved only {differ} of 500 keys"
            );
        }
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
                assert_eq!(all.members, live.members);
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
