//! Jump consistent hash (Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash
//! Algorithm", 2014) over xxh3_64 of the key. The pool's `hash` and the servers' weights
//! are not used: jump needs a 64-bit key and has no notion of weight. Moves only ~1/n of
//! keys when the n-th server is appended; removing one from the middle renumbers the rest.
//! Pinned by `tests/golden/memroute/ring-jump.tsv`.
use super::member::Distribution;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Jump {
    buckets: usize,
}

impl Jump {
    pub(crate) fn build(servers: usize) -> Jump {
        Jump { buckets: servers }
    }
}

impl Distribution for Jump {
    #[inline]
    fn pick(&self, part: &[u8]) -> usize {
        jump_hash(xxhash_rust::xxh3::xxh3_64(part), self.buckets)
    }
}

pub(crate) fn jump_hash(mut key: u64, buckets: usize) -> usize {
    let buckets = buckets as i64;
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < buckets {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b.max(0) as usize
}
