//! Counters behind the `stats` command. Each worker writes only its own shard
//! (uncontended atomics); `stats` sums the shards.
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use memroute_config::Config;

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
}

/// One config's server counters, indexed [pool id][server index].
pub(crate) type ServerStatsTable = Vec<Vec<Arc<ServerStats>>>;

impl SharedStats {
    pub(crate) fn new(workers: usize) -> SharedStats {
        SharedStats {
            started: Instant::now(),
            workers: (0..workers).map(|_| WorkerStats::default()).collect(),
            servers: Mutex::new(Vec::new()),
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
        out.push_str("END\r\n");
        out
    }
}
