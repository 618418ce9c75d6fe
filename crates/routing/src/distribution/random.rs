//! twemproxy's random (nutcracker 0.5.0 `src/hashkit/nc_random.c`): a uniformly random
//! server per request; twemproxy 0.5.0 ignores weights here, and so do we.
use rand::Rng;

use super::member::Distribution;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Random {
    servers: usize,
}

impl Random {
    pub(crate) fn build(servers: usize) -> Random {
        Random { servers }
    }
}

impl Distribution for Random {
    #[inline]
    fn pick(&self, _part: &[u8]) -> usize {
        rand::thread_rng().gen_range(0..self.servers.max(1))
    }
}
