//! Counters behind the `stats` command. Each worker writes only its own shard
//! (uncontended atomics); `stats` sums the shards.
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use memroute_backend::ServerHealth;
use memroute_config::Config;

use crate::execute::{RouteStats, ShadowStats};

/// One worker's counters. Aligned to two cache lines so that neighbouring workers'
/// shards never share a line (no false sharing on the per-request increments).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct WorkerStats {
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub cmd_flush: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub client_errors: AtomicU64,
}

/// Errors and timeouts of one server (counted by whichever worker saw them). Workers
/// reach these through their routing snapshot, never through the list below.
#[derive(Debug)]
pub(crate) struct ServerStats {
    pub pool: String,
    pub address: String,
    pub errors: AtomicU64,
    pub timeouts: AtomicU64,
}

/// Everything `stats` reports, shared by all workers.
#[derive(Debug)]
pub(crate) struct SharedStats {
    pub started: Instant,
    pub workers: Vec<WorkerStats>,
    /// Every server of the running config, in `Config::pools` order. Replaced on reload;
    /// only the renderers and `for_config` lock it (never the request path).
    servers: Mutex<Vec<Arc<ServerStats>>>,
    /// The running config's pools and how many servers each has (DNS pools change).
    pools: Mutex<Vec<(String, usize)>>,
    /// Health of every server of the running config.
    health: Mutex<Vec<Arc<ServerHealth>>>,
    /// Policy routes (failover, replicated, warm-up) and shadow routes, by name.
    routes: Mutex<Vec<(String, Arc<RouteStats>)>>,
    shadows: Mutex<Vec<(String, Arc<ShadowStats>)>>,
    /// DNS lookups per pool: (succeeded, failed).
    lookups: Mutex<std::collections::BTreeMap<String, (u64, u64)>>,
    /// Reply bytes held for clients, process-wide (`max_buffered_replies`).
    pub replies: crate::budget::ReplyBudget,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// One config's server counters, indexed [pool id][server index].
pub(crate) type ServerStatsTable = Vec<Vec<Arc<ServerStats>>>;

impl SharedStats {
    pub(crate) fn new(workers: usize) -> SharedStats {
        SharedStats {
            started: Instant::now(),
            workers: (0..workers).map(|_| WorkerStats::default()).collect(),
            servers: Mutex::new(Vec::new()),
            pools: Mutex::new(Vec::new()),
            health: Mutex::new(Vec::new()),
            routes: Mutex::new(Vec::new()),
            shadows: Mutex::new(Vec::new()),
            lookups: Mutex::new(Default::default()),
            replies: Default::default(),
        }
    }

    pub(crate) fn set_health(&self, health: Vec<Arc<ServerHealth>>) {
        *lock(&self.health) = health;
    }

    pub(crate) fn set_policy_stats(
        &self,
        routes: Vec<(String, Arc<RouteStats>)>,
        shadows: Vec<(String, Arc<ShadowStats>)>,
    ) {
        *lock(&self.routes) = routes;
        *lock(&self.shadows) = shadows;
    }

    pub(crate) fn count_lookup(&self, pool: &str, succeeded: bool) {
        let mut lookups = lock(&self.lookups);
        let entry = lookups.entry(pool.to_string()).or_default();
        match succeeded {
            true => entry.0 += 1,
            false => entry.1 += 1,
        }
    }

    /// Everything the renderers show beyond the per-worker counters, read in one place.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            pools: lock(&self.pools).clone(),
            health: lock(&self.health).clone(),
            routes: lock(&self.routes).clone(),
            shadows: lock(&self.shadows).clone(),
            lookups: lock(&self.lookups).clone(),
        }
    }

    /// The counters for `config`'s servers, indexed [pool id][server index]. A server
    /// (same pool name, same address) already counted keeps its counters; servers no
    /// longer configured stop being reported. Replaces the list the renderers read.
    pub(crate) fn for_config(&self, config: &Config) -> ServerStatsTable {
        let mut current = self.servers();
        let known: HashMap<(&str, &str), Arc<ServerStats>> = current
            .iter()
            .map(|s| ((s.pool.as_str(), s.address.as_str()), s.clone()))
            .collect();
        let table: ServerStatsTable = config
            .pools
            .iter()
            .map(|(pool, p)| {
                p.servers
                    .iter()
                    .map(|s| {
                        known
                            .get(&(pool.as_str(), s.address.as_str()))
                            .cloned()
                            .unwrap_or_else(|| {
                                Arc::new(ServerStats {
                                    pool: pool.clone(),
                                    address: s.address.clone(),
                                    errors: AtomicU64::new(0),
                                    timeouts: AtomicU64::new(0),
                                })
                            })
                    })
                    .collect()
            })
            .collect();
        drop(known);
        *current = table.iter().flatten().cloned().collect();
        *lock(&self.pools) = config
            .pools
            .iter()
            .map(|(name, pool)| (name.clone(), pool.servers.len()))
            .collect();
        table
    }

    /// The running config's server counters (for rendering).
    pub(crate) fn servers(&self) -> MutexGuard<'_, Vec<Arc<ServerStats>>> {
        // A panic while holding this lock cannot leave the list half-written in a way
        // that matters for counters: take it anyway.
        self.servers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One counter summed over every worker's shard (`stats` and `/metrics` both use it).
    pub(crate) fn total(&self, counter: fn(&WorkerStats) -> &AtomicU64) -> u64 {
        self.workers.iter().map(|w| counter(w).load(Relaxed)).sum()
    }

    /// The reply to `stats`, in memcached's `STAT name value` format.
    pub(crate) fn render(&self) -> String {
        let sum = |f: fn(&WorkerStats) -> &AtomicU64| self.total(f);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut out = String::with_capacity(1024);
        let mut stat = |name: &str, value: &dyn std::fmt::Display| {
            let _ = write!(out, "STAT {name} {value}\r\n");
        };
        stat("pid", &std::process::id());
        stat("uptime", &self.started.elapsed().as_secs());
        stat("time", &now);
        stat("version", &format_args!("memroute-{}", crate::VERSION));
        stat("threads", &self.workers.len());
        stat("curr_connections", &sum(|w| &w.curr_connections));
        stat("total_connections", &sum(|w| &w.total_connections));
        stat("rejected_connections", &sum(|w| &w.rejected_connections));
        stat("cmd_get", &sum(|w| &w.cmd_get));
        stat("cmd_set", &sum(|w| &w.cmd_set));
        stat("cmd_flush", &sum(|w| &w.cmd_flush));
        stat("cmd_touch", &sum(|w| &w.cmd_touch));
        stat("get_hits", &sum(|w| &w.get_hits));
        stat("get_misses", &sum(|w| &w.get_misses));
        stat("client_errors", &sum(|w| &w.client_errors));
        stat("buffered_reply_bytes", &self.replies.used());
        stat("reads_paused", &self.replies.paused_total.load(Relaxed));
        stat(
            "slow_clients_closed",
            &self.replies.slow_closed_total.load(Relaxed),
        );
        for server in self.servers().iter() {
            stat(
                &format!("server:{}:{}:errors", server.pool, server.address),
                &server.errors.load(Relaxed),
            );
            stat(
                &format!("server:{}:{}:timeouts", server.pool, server.address),
                &server.timeouts.load(Relaxed),
            );
        }
        let snapshot = self.snapshot();
        for (pool, servers) in &snapshot.pools {
            stat(&format!("pool:{pool}:servers"), servers);
        }
        for health in &snapshot.health {
            let prefix = format!("server:{}:{}", health.pool(), health.address());
            stat(&format!("{prefix}:down"), &u8::from(health.is_down()));
            stat(
                &format!("{prefix}:marked_down"),
                &health.marked_down_total(),
            );
            stat(&format!("{prefix}:marked_up"), &health.marked_up_total());
        }
        for (route, counters) in &snapshot.routes {
            stat(
                &format!("route:{route}:failovers"),
                &counters.failovers.load(Relaxed),
            );
            stat(
                &format!("route:{route}:write_failures"),
                &counters.write_failures.load(Relaxed),
            );
            stat(
                &format!("route:{route}:fills"),
                &counters.fills.load(Relaxed),
            );
        }
        for (route, counters) in &snapshot.shadows {
            stat(
                &format!("shadow:{route}:sent"),
                &counters.sent.load(Relaxed),
            );
            stat(
                &format!("shadow:{route}:completed"),
                &counters.completed.load(Relaxed),
            );
            stat(
                &format!("shadow:{route}:errors"),
                &counters.errors.load(Relaxed),
            );
            stat(
                &format!("shadow:{route}:dropped"),
                &counters.dropped.load(Relaxed),
            );
        }
        for (pool, (ok, failed)) in &snapshot.lookups {
            stat(&format!("pool:{pool}:dns_lookups"), ok);
            stat(&format!("pool:{pool}:dns_failures"), failed);
        }
        out.push_str("END\r\n");
        out
    }
}

/// The shared, config-dependent parts of the stats, copied out of their locks.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub pools: Vec<(String, usize)>,
    pub health: Vec<Arc<ServerHealth>>,
    pub routes: Vec<(String, Arc<RouteStats>)>,
    pub shadows: Vec<(String, Arc<ShadowStats>)>,
    pub lookups: std::collections::BTreeMap<String, (u64, u64)>,
}
