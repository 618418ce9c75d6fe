//! Lets a scrape (or `stats`) have every worker flush its local counts first, and the
//! intervals a worker flushes at on its own.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

/// How often a worker moves its local counts into the shared registry on its own.
/// Scrapes and `stats` do not wait for it: they ask every worker to flush first.
pub(super) const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// How long a scrape or `stats` waits for busy workers to flush before it answers anyway.
pub(crate) const FLUSH_WAIT: Duration = Duration::from_millis(200);

/// Lets a scrape (or `stats`) have every worker flush its local counts first.
///
/// Each worker's flush task waits on its own `Notify` (a permit is kept if it is busy);
/// after flushing it records the highest request it served and bumps `flushed`.
#[derive(Debug)]
pub(crate) struct FlushBarrier {
    pub(super) requested: AtomicU64,
    wake: Vec<Notify>,
    done: Vec<AtomicU64>,
    flushed: watch::Sender<u64>,
}

impl FlushBarrier {
    pub(super) fn new(workers: usize) -> FlushBarrier {
        FlushBarrier {
            requested: AtomicU64::new(0),
            wake: (0..workers).map(|_| Notify::new()).collect(),
            done: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            flushed: watch::channel(0).0,
        }
    }

    /// Asks every worker to flush; returns the request number to wait for.
    pub(crate) fn request(&self) -> u64 {
        let ticket = self.requested.fetch_add(1, Relaxed) + 1;
        for wake in &self.wake {
            wake.notify_one();
        }
        ticket
    }

    /// True once every worker flushed after request `ticket` was made.
    pub(crate) fn reached(&self, ticket: u64) -> bool {
        self.done.iter().all(|d| d.load(Relaxed) >= ticket)
    }

    /// Waits until `ticket` is reached or `deadline` passes.
    pub(crate) async fn wait(&self, ticket: u64, deadline: Instant) {
        let mut flushed = self.flushed.subscribe();
        while !self.reached(ticket) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, flushed.changed()).await.is_err() {
                return;
            }
        }
    }

    pub(super) async fn flush_all(&self, wait: Duration) {
        let ticket = self.request();
        self.wait(ticket, Instant::now() + wait).await;
    }

    /// Worker `index` waits for a flush request (or nothing: its timer flushes anyway).
    pub(super) async fn requested_for(&self, index: usize) {
        match self.wake.get(index) {
            Some(wake) => wake.notified().await,
            None => std::future::pending().await,
        }
    }

    /// Worker `index` has flushed everything counted before `seen` was read.
    pub(super) fn flushed(&self, index: usize, seen: u64) {
        if let Some(done) = self.done.get(index) {
            done.fetch_max(seen, Relaxed);
        }
        self.flushed.send_modify(|n| *n = n.wrapping_add(1));
    }
}
