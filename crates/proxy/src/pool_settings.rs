//! What a pool's config says about its servers beyond where they are: the health
//! settings their probers and connections share, and how many may be ejected at once.
//! A leaf: the controller (health objects), the per-generation snapshot (ejecting rings)
//! and the stats renderer (`pool_servers_ejectable`) all read the same answer.
use memroute_backend::HealthSettings;
use memroute_config::PoolConfig;

/// The health settings of a pool's servers.
pub(crate) fn health_settings(pool: &PoolConfig) -> HealthSettings {
    HealthSettings {
        failure_limit: pool.failure_limit.max(1),
        probe_interval: pool.probe_interval,
        probe_interval_max: pool.probe_interval_max,
        connect_timeout: pool.connect_timeout,
        timeout: pool.timeout,
    }
}

/// How many of `pool`'s servers may be out of its ring at once.
pub(crate) fn max_ejected(pool: &PoolConfig) -> usize {
    let fraction = pool.max_ejected_fraction.clamp(0.0, 1.0);
    // Never all of them: a pool with every server ejected would have no ring at all.
    ((pool.servers.len() as f64 * fraction).floor() as usize)
        .min(pool.servers.len().saturating_sub(1))
}
