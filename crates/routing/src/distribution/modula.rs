//! twemproxy's modula (nutcracker 0.5.0 `src/hashkit/nc_modula.c`): `hash % slots`, each
//! server holding `weight` slots in twemproxy's server order (see `twemproxy_order`).
use crate::spec::ServerSpec;

use super::member::{twemproxy_key_hash, twemproxy_order, Distribution};
use crate::hash::HashFn;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Modula {
    pub(crate) hash: HashFn,
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

    /// The member owning a key of hash `hash`.
    #[inline]
    pub(crate) fn slot(&self, hash: u32) -> usize {
        match self.slots.len() {
            0 => 0,
            slots => self.slots[hash as usize % slots] as usize,
        }
    }
}

impl Distribution for Modula {
    #[inline]
    fn pick(&self, part: &[u8]) -> usize {
        self.slot(twemproxy_key_hash(self.hash, part))
    }
}
