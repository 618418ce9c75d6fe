//! The shared counters the request path and the side bump directly (atomics and prometheus
//! counter handles, no registry logic): a server's errors and timeouts, a policy route's
//! failovers / write failures / fills, a shadow route's copies, the reply budget, reloads.
//! A leaf: `stats` renders them on gather, `publisher` and `generation` hand them out,
//! the snapshot, executor and sessions bump them.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::SystemTime;

use prometheus::IntCounter;

/// Counters of one server (counted by whichever worker saw a failure; not per request).
#[derive(Debug, Clone)]
pub(crate) struct ServerStats {
    pub errors: IntCounter,
    pub timeouts: IntCounter,
}

/// One config's server counters, indexed [pool id][server index].
pub(crate) type ServerStatsTable = Vec<Vec<ServerStats>>;

/// Counters of one policy route, shared by every worker.
#[derive(Debug, Default)]
pub(crate) struct RouteStats {
    /// Requests a failover (or replicated read) moved to the next child.
    pub failovers: std::sync::atomic::AtomicU64,
    /// Replicated writes whose policy was not met.
    pub write_failures: std::sync::atomic::AtomicU64,
    /// Values a warm-up route copied from warm into cold.
    pub fills: std::sync::atomic::AtomicU64,
}

/// Counters of one shadow route, shared by every worker.
#[derive(Debug, Default)]
pub(crate) struct ShadowStats {
    pub sent: std::sync::atomic::AtomicU64,
    pub completed: std::sync::atomic::AtomicU64,
    pub errors: std::sync::atomic::AtomicU64,
    pub dropped: std::sync::atomic::AtomicU64,
}

/// The shared counters; one per process (in `Metrics`).
#[derive(Debug)]
pub(crate) struct ReplyBudget {
    /// Sum of every session's charge.
    pub(crate) used: AtomicUsize,
    /// Sessions whose charge is not zero: the share is the limit divided among them.
    pub(crate) holders: AtomicUsize,
    /// Times a session stopped reading because it held more than its share.
    pub paused_total: AtomicU64,
    /// Sessions closed for holding more than their share past `slow_client_timeout`.
    pub slow_closed_total: AtomicU64,
}

impl Default for ReplyBudget {
    fn default() -> Self {
        ReplyBudget {
            used: AtomicUsize::new(0),
            holders: AtomicUsize::new(0),
            paused_total: AtomicU64::new(0),
            slow_closed_total: AtomicU64::new(0),
        }
    }
}

impl ReplyBudget {
    /// Reply bytes held for clients right now (estimated for unanswered requests).
    pub(crate) fn used(&self) -> usize {
        self.used.load(Relaxed)
    }
}

/// Reloads counted since start (for `/metrics`; shared with whoever renders them), and
/// the last few (for the admin panel).
#[derive(Debug, Default)]
pub struct ReloadCounts {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    recent: Mutex<VecDeque<ReloadRecord>>,
}

/// One reload of the config file, as the admin panel lists it.
#[derive(Debug, Clone)]
pub struct ReloadRecord {
    pub at: SystemTime,
    /// What started it: `SIGHUP`, `file change` or `admin request`.
    pub trigger: &'static str,
    pub applied: bool,
    /// What was applied, or every error (with its key path) that rejected it.
    pub detail: String,
}

/// Reloads the panel remembers.
const RECENT_RELOADS: usize = 10;

impl ReloadCounts {
    /// Remembers a reload (the oldest of [`RECENT_RELOADS`] goes).
    pub fn record(&self, trigger: &'static str, applied: bool, detail: String) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == RECENT_RELOADS {
            recent.pop_front();
        }
        recent.push_back(ReloadRecord {
            at: SystemTime::now(),
            trigger,
            applied,
            detail,
        });
    }

    /// The last few reloads, newest first.
    pub fn recent(&self) -> Vec<ReloadRecord> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.iter().rev().cloned().collect()
    }

    /// Reloads that were applied.
    pub fn ok(&self) -> u64 {
        self.ok.load(Relaxed)
    }

    /// Reloads that were rejected (unreadable, invalid or unroutable config).
    pub fn failed(&self) -> u64 {
        self.failed.load(Relaxed)
    }
}

/// Counters of one pool's resize windows, shared by every worker and kept across windows.
#[derive(Debug, Default)]
pub(crate) struct ResizeStats {
    /// Whether a window runs now (set by the publisher).
    pub active: std::sync::atomic::AtomicBool,
    /// Requests for a key whose owner changed that asked the key's old owner.
    pub fallback_reads: AtomicU64,
    /// Keys copied from their old owner to their new one.
    pub keys_moved: AtomicU64,
    /// Failed requests to old owners (lookups, copies, deletes); the key reads as a miss.
    pub errors: AtomicU64,
}
