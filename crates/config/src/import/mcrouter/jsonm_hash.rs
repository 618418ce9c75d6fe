//! The JSONM built-ins whose results come from a hash or a random engine, computed as
//! mcrouter's preprocessor computes them (`mcrouter/lib/config/ConfigPreprocessor.cpp`,
//! `RendezvousHash.cpp`), so that a config using them imports to the choice mcrouter makes:
//!
//! - `@hash(v)`: an integer through Thomas Wang's 64-bit mix (folly's `twang_mix64`), a
//!   string through SpookyHash V2 `Hash64` with seed 0; the 64-bit result read as a signed
//!   integer, as folly's `dynamic` stores it.
//! - `@weightedHash(dictionary, key)`: mcrouter's rendezvous hash over the dictionary's
//!   names (folly's `fnv64_buf_BROKEN` of each) and their normalized weights, for the key
//!   (an integer as it is, a string by `Hash64`); the name with the largest
//!   `(twang_mix64(name hash + key) / u64::MAX) ^ (1 / weight)`.
//! - `@shuffle(list, seed)`: `std::shuffle` of libstdc++ (GCC's, what mcrouter is built
//!   with on Linux) driven by `std::minstd_rand(seed)`.
use memroute_routing::mcrouter_hash::spooky128;

/// folly's `twang_mix64`.
pub(super) fn twang_mix64(key: u64) -> u64 {
    let mut key = (!key).wrapping_add(key << 21);
    key ^= key >> 24;
    key = key.wrapping_add(key << 3).wrapping_add(key << 8);
    key ^= key >> 14;
    key = key.wrapping_add(key << 2).wrapping_add(key << 4);
    key ^= key >> 28;
    key.wrapping_add(key << 31)
}

/// folly's `fnv64_buf_BROKEN`: FNV-1 64 whose bytes are xored in sign-extended (the
/// "broken" part, kept by folly for compatibility).
pub(super) fn fnv64_broken(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |hash, &byte| {
        let hash = hash
            .wrapping_add(hash << 1)
            .wrapping_add(hash << 4)
            .wrapping_add(hash << 5)
            .wrapping_add(hash << 7)
            .wrapping_add(hash << 8)
            .wrapping_add(hash << 40);
        hash ^ (byte as i8 as i64 as u64)
    })
}

/// folly's FNV-64 start value.
const FNV64_START: u64 = 14_695_981_039_346_656_037;

/// SpookyHash V2 `Hash64` with seed 0: the preprocessor's hash of a string.
pub(super) fn spooky64(text: &str) -> u64 {
    spooky128(text.as_bytes(), 0, 0).0
}

/// mcrouter's `RendezvousHash::get`: the index of the chosen name among `weights` (name,
/// weight), or `Err` when the weights sum to zero.
pub(super) fn rendezvous(weights: &[(&str, f64)], key: u64) -> Result<usize, String> {
    let sum: f64 = weights.iter().map(|(_, w)| w).sum();
    if sum < f64::EPSILON {
        return Err("@weightedHash: the weights sum to 0".to_string());
    }
    let mut best = (0, -1.0);
    for (i, (name, weight)) in weights.iter().enumerate() {
        let weight = weight / sum;
        let combined = twang_mix64(fnv64_broken(name.as_bytes(), FNV64_START).wrapping_add(key));
        let scaled = combined as f64 / u64::MAX as f64;
        let score = match weight > f64::EPSILON {
            true => scaled.powf(1.0 / weight),
            false => 0.0,
        };
        if score > best.1 {
            best = (i, score);
        }
    }
    Ok(best.0)
}

/// C++'s `std::minstd_rand`: Lehmer's generator, multiplier 48271 modulo 2^31 - 1.
struct MinStd(u64);

impl MinStd {
    const MODULUS: u64 = 2_147_483_647;
    /// Its `min()`; `max()` is `MODULUS - 1`.
    const MIN: u64 = 1;

    fn new(seed: u32) -> MinStd {
        match u64::from(seed) % Self::MODULUS {
            0 => MinStd(1),
            state => MinStd(state),
        }
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0 * 48_271 % Self::MODULUS;
        self.0
    }

    /// libstdc++'s `uniform_int_distribution(0, range)` over this generator (whose range
    /// is always the wider here): downscaling with rejection.
    fn uniform(&mut self, range: u64) -> u64 {
        let engine_range = Self::MODULUS - 1 - Self::MIN;
        let buckets = range + 1;
        let scaling = engine_range / buckets;
        let past = buckets * scaling;
        loop {
            let draw = self.next() - Self::MIN;
            if draw < past {
                return draw / scaling;
            }
        }
    }
}

/// libstdc++'s `std::shuffle` of `items` with `std::minstd_rand(seed)`: two swap positions
/// from one draw while the engine's range allows (every list a config holds), one per
/// element otherwise.
pub(super) fn shuffle<T>(items: &mut [T], seed: u32) {
    let n = items.len() as u64;
    if n < 2 {
        return;
    }
    let mut engine = MinStd::new(seed);
    let engine_range = MinStd::MODULUS - 1 - MinStd::MIN;
    if engine_range / n < n {
        for i in 1..items.len() {
            let j = engine.uniform(i as u64);
            items.swap(i, j as usize);
        }
        return;
    }
    let mut i = 1;
    if n.is_multiple_of(2) {
        let j = engine.uniform(1);
        items.swap(i, j as usize);
        i += 1;
    }
    while i < items.len() {
        let first_range = i as u64 + 1;
        let both = engine.uniform(first_range * (first_range + 1) - 1);
        items.swap(i, (both / (first_range + 1)) as usize);
        items.swap(i + 1, (both % (first_range + 1)) as usize);
        i += 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folly_hashes_match_their_published_values() {
        // folly's golden vectors (fnv64_buf_BROKEN with a seed, and one byte appended).
        let seed = 0x0123_4567_89ab_cdef;
        assert_eq!(
            fnv64_broken(b"hello\x00\x80world", seed),
            8_948_791_659_412_961_051
        );
        assert_eq!(fnv64_broken(&[0x80], seed), 7_296_713_277_966_455_453);
        // twang_mix64 is a bijection that moves 0 and 1 far apart.
        assert_ne!(twang_mix64(0), twang_mix64(1));
        assert_eq!(twang_mix64(0), 0x77cf_a1ee_f01b_ca90);
    }

    #[test]
    fn shuffle_is_libstdcxx_with_minstd_rand() {
        // Printed by g++ 12 (libstdc++): std::shuffle(v, std::minstd_rand(seed)) of 0..n.
        let cases: &[(u32, &[usize])] = &[
            (0, &[5, 7, 1, 4, 0, 2, 6, 9, 8, 3]),
            (1, &[5, 7, 1, 4, 0, 2, 6, 9, 8, 3]),
            (42, &[1, 7, 3, 6, 2, 8, 0, 5, 9, 4]),
            (12345, &[3, 0, 5, 8, 7, 2, 6, 9, 4, 1]),
            (42, &[2, 4, 3, 1, 0]),
            (12345, &[1, 2, 0]),
            (42, &[1, 0]),
            (12345, &[3, 0, 5, 4, 7, 2, 6, 1]),
        ];
        for (seed, expected) in cases {
            let mut items: Vec<usize> = (0..expected.len()).collect();
            shuffle(&mut items, *seed);
            assert_eq!(&items, expected, "seed {seed}");
        }
    }

    #[test]
    fn rendezvous_follows_the_weights() {
        // A zero weight is never chosen; all weight on one name always is.
        for key in 0..200 {
            assert_eq!(rendezvous(&[("a", 0.0), ("b", 1.0)], key), Ok(1));
        }
        assert!(rendezvous(&[("a", 0.0)], 1).is_err());
        // Even weights share the keys about evenly.
        let a = (0..2000)
            .filter(|&k| rendezvous(&[("a", 1.0), ("b", 1.0)], k) == Ok(0))
            .count();
        assert!((800..1200).contains(&a), "{a}");
    }
}
