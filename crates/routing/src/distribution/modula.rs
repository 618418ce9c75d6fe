//! twemproxy's modula (nutcracker 0.5.0 `src/hashkit/nc_modula.c`): `hash % slots`, each
//! server holding `weight` slots in twemproxy's server order (see `twemproxy_order`).
use crate::spec::ServerSpec;

use super::{twemproxy_key_hash, twemproxy_order, Distribution};
use crate::hash::HashFn;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Modula {
    hash: HashFn,
    /// Member position of each slot.
    slots: Vec<u32>,
}

impl Modula {
    pub(crate) fn build(servers: &[&ServerSpec], hash: HashFn) -> Modula {
        let mut slots = Vec::new();
        for (member, _) in twemproxy_order(servers) {
            for _ in 0..servers[member].weight {
                slots.push(member as u32);
            }
        }
        Modula { hash, slots }
    }
}

impl Distribution for Modula {
    #[inline]
    fn pick(&self, part: &[u8]) -> usize {
        if self.slots.is_empty() {
            return 0;
        }
        let slot = twemproxy_key_hash(self.hash, part) as usize % self.slots.len();
        self.slots[slot] as usize
    }
}
