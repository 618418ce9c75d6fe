//! `keep_routing_prefix` where one routing prefix reaches pools that disagree on it.
//!
//! mcrouter keeps or cuts the routing prefix per pool, so `/a/a/` may reach one pool that
//! keeps it and one that does not. memroute decides once per routing prefix, at dispatch:
//! one request is sent with one key, and the prefix is cut unless every pool the prefix
//! reaches keeps it (the config refuses a disagreement rather than guess). mcrouter takes
//! such configs, so the import must too: the keeping pools reached from such a prefix are
//! written with `keep_routing_prefix` off and a NOTE, since their keys change name.
use std::collections::BTreeSet;

use super::*;
use crate::checked::pools_reached;

impl Importer {
    /// Turns `keep_prefix` off (with a NOTE) on every keeping pool that a routing prefix
    /// reaches together with a pool that cuts it, until no routing prefix disagrees (a pool
    /// turned off may make another prefix that reaches it disagree).
    ///
    /// Reachability is the config crate's ([`pools_reached`]) over the routes of this very
    /// import, loaded with every pool cutting the prefix (so the rule being fixed here does
    /// not refuse it). If that does not load, nothing is changed: the check of the final
    /// output reports why.
    pub(super) fn settle_kept_prefixes(&mut self, root: &str) {
        let keeping: BTreeSet<String> = self
            .out_pools
            .iter()
            .filter(|(_, pool)| pool.keep_prefix)
            .map(|(name, _)| name.clone())
            .collect();
        if keeping.is_empty() || self.prefixed.is_empty() {
            return;
        }
        self.set_keep(&keeping, false);
        let loaded = crate::parse(&self.render(root));
        self.set_keep(&keeping, true);
        let Ok(config) = loaded else {
            return;
        };
        let reached: Vec<(&String, BTreeSet<String>)> = config
            .routing_prefixes
            .prefixes
            .iter()
            .map(|(prefix, target)| (prefix, pools_reached(target, &config.routes)))
            .collect();
        let mut cut: BTreeSet<String> = BTreeSet::new();
        loop {
            let before = cut.len();
            for (_, pools) in &reached {
                let keeps = |pool: &String| keeping.contains(pool) && !cut.contains(pool);
                if !pools.iter().all(keeps) {
                    let newly: Vec<String> = pools.iter().filter(|p| keeps(p)).cloned().collect();
                    cut.extend(newly);
                }
            }
            if cut.len() == before {
                break;
            }
        }
        for pool in &cut {
            // Every prefix reaching the pool now sends its keys without the prefix.
            let mut prefixes = Vec::new();
            let mut cutting = BTreeSet::new();
            for (prefix, pools) in &reached {
                if pools.contains(pool) {
                    prefixes.push(quote(prefix));
                    cutting.extend(
                        pools
                            .iter()
                            .filter(|p| *p != pool && (!keeping.contains(*p) || cut.contains(*p))),
                    );
                }
            }
            let others = match cutting.first() {
                Some(other) => format!(" (\"{other}\" among them)"),
                None => String::new(),
            };
            let note = format!(
                "keep_routing_prefix: mcrouter sent this pool's keys with their routing prefix; \
                 memroute keeps or cuts a prefix per routing prefix, not per pool, and {} also \
                 reach{} pools that cut it{others}, so memroute sends this pool's keys without \
                 the prefix (keep_routing_prefix is off here). Keys mcrouter wrote to this pool \
                 are not found under their new name until they are written again: for those \
                 keys this is a cold pool.",
                prefixes.join(", "),
                if prefixes.len() == 1 { "es" } else { "" },
            );
            if let Some(out) = self.out_pools.get_mut(pool) {
                out.keep_prefix = false;
                out.notes.push(note);
            }
        }
    }

    fn set_keep(&mut self, pools: &BTreeSet<String>, keep: bool) {
        for name in pools {
            if let Some(pool) = self.out_pools.get_mut(name) {
                pool.keep_prefix = keep;
            }
        }
    }
}
