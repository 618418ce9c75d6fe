//! What a pool's config says about its servers beyond where they are: how many may be
//! ejected at once (their health settings are memroute-backend's `HealthSettings::of_pool`).
//! A leaf: the per-generation snapshot (ejecting rings) and the stats renderer
//! (`pool_servers_ejectable`) read the same answer.
use memroute_config::PoolConfig;

/// How many of `pool`'s servers may be out of its ring at once.
pub(crate) fn max_ejected(pool: &PoolConfig) -> usize {
    let fraction = pool.max_ejected_fraction.clamp(0.0, 1.0);
    // Never all of them: a pool with every server ejected would have no ring at all.
    ((pool.servers.len() as f64 * fraction).floor() as usize)
        .min(pool.servers.len().saturating_sub(1))
}
