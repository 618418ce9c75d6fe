//! mcrouter's `Ch3`: furc over MurmurHash64A of the routing key (see
//! [`crate::mcrouter_hash`]). Depends on the server's position in the list, not its name:
//! mcrouter users keep their servers in the same order to keep their keys in place.
//! Pinned by `tests/golden/mcrouter/mcrouter-ch3.tsv`.
use super::member::Distribution;
use crate::mcrouter_hash::furc;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ch3 {
    servers: u32,
}

impl Ch3 {
    pub(crate) fn build(servers: usize) -> Ch3 {
        Ch3 {
            servers: u32::try_from(servers).unwrap_or(u32::MAX),
        }
    }
}

impl Distribution for Ch3 {
    #[inline]
    fn pick(&self, routing_key: &[u8]) -> usize {
        furc(routing_key, self.servers) as usize
    }
}
