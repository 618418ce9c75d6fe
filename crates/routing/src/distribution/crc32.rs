//! mcrouter's `Crc32`: `(crc32(routing key) & 0x7FFFFFFF) % n` with the standard CRC-32.
//! Not libmemcached's 15-bit "crc32" that the pool `hash = "crc32"` names (twemproxy's).
//! Pinned by `tests/golden/mcrouter/mcrouter-crc32.tsv`.
use super::member::Distribution;
use crate::mcrouter_hash::crc32_index;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Crc32 {
    servers: usize,
}

impl Crc32 {
    pub(crate) fn build(servers: usize) -> Crc32 {
        Crc32 { servers }
    }
}

impl Distribution for Crc32 {
    #[inline]
    fn pick(&self, routing_key: &[u8]) -> usize {
        crc32_index(routing_key, self.servers as u64) as usize
    }
}
