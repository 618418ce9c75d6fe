//! The live watch of requests (`GET /watch`, `memroute watch`): which requests are sampled
//! for whom, and the line each one becomes.
//!
//! ```text
//!   framing::dispatch_framed ── hub.open()? (one relaxed load; false: nothing else) ──> dispatch
//!        │ someone watches (cold path)
//!        └─ watch_tap::sample: each key's route; hub.takers(): each watcher's filter (key
//!           prefix, route), its lines left (`limit`) and its rate cap
//!           -> Sampled (boxed, in the pending entry: Pending::Watched)
//!   Pending::Watched finished ── Sampled::finish(result, servers) ──try_send──> watcher's channel
//!   admin thread ── the /watch body renders the lines as JSON ──> the watcher's HTTP client
//! ```
//!
//! Nobody watching costs one relaxed atomic load per request. While someone watches, every
//! request takes the watcher list's read lock, and a request a watcher takes costs a box
//! and a few strings; each watcher gets at most `rate` lines a second. A watcher whose
//! channel is full (its client reads more slowly than lines come) is dropped at once: its
//! channel closes, the lines already in it are the last it gets, then a notice.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use memroute_protocol::Command;
use prometheus::{IntCounter, IntCounterVec, IntGauge};
use smallvec::SmallVec;
use tokio::sync::mpsc;

/// Lines waiting for one watcher's HTTP client; a watcher that falls this far behind is dropped.
pub(crate) const CHANNEL_LINES: usize = 256;
/// Watchers open at once (more are refused): each costs every request a filter check.
pub const MAX_WATCHERS: usize = 8;
/// Lines per second per watcher unless `rate=` asks for another number.
pub const DEFAULT_RATE: u32 = 100;
/// The most `rate=` may ask for.
pub const MAX_RATE: u32 = 10_000;

/// What one watcher wants to see.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only requests with a key that starts with these bytes (empty: every request).
    pub key_prefix: Vec<u8>,
    /// Only requests routed to this route or pool, or coming in on a listener whose root it is.
    pub route: Option<String>,
    /// At most this many lines, then the watch ends.
    pub limit: Option<u64>,
    /// At most this many lines a second.
    pub rate: u32,
}

/// One sampled request, as a watcher's HTTP client gets it.
#[derive(Debug, Clone)]
pub struct WatchLine {
    /// When memroute read the request.
    pub time: SystemTime,
    pub client: String,
    pub command: &'static str,
    /// The (first matching) key, raw; empty for a request without one.
    pub key: Vec<u8>,
    /// The request's number of keys (a multi-get's several).
    pub keys: usize,
    pub route: String,
    /// The servers its legs went to, comma-separated; `-` for one answered by memroute or
    /// by the route executor (a policy route's later tries).
    pub server: String,
    /// hit, miss, stored, deleted, ..., or the error line the client got.
    pub result: String,
    pub latency: Duration,
}

/// The counts `/metrics` shows (defined in `stats`, with the other families).
#[derive(Debug, Clone)]
pub(crate) struct WatchCounters {
    pub watchers: IntGauge,
    pub examined: IntCounter,
    pub lines_sent: IntCounter,
    /// Label `reason`: `rate_cap` or `slow_watcher`.
    pub lines_dropped: IntCounterVec,
    pub slow_watchers: IntCounter,
}

/// One open watch.
#[derive(Debug)]
pub struct Watcher {
    id: u64,
    filter: Filter,
    /// Lines this watcher may still be given (`limit`); u64::MAX without one.
    left: AtomicU64,
    /// The rate cap: when the next line is due, in nanoseconds after the hub's epoch
    /// (a GCRA's theoretical arrival time, allowing a second's worth of burst).
    due: AtomicU64,
    /// Taken (and so closed) when the watcher is dropped for being slow.
    sender: Mutex<Option<mpsc::Sender<Arc<WatchLine>>>>,
    /// Set when it was dropped for being slow (its stream ends with a notice).
    dropped: AtomicBool,
}

impl Watcher {
    fn wants(&self, key: &[u8], route: &str, root: &str) -> bool {
        key.starts_with(&self.filter.key_prefix)
            && self
                .filter
                .route
                .as_deref()
                .is_none_or(|r| r == route || r == root)
    }

    /// Takes one of the lines left and a place under the rate cap, if both are free.
    fn take_line(&self, now_ns: u64, counters: &WatchCounters) -> bool {
        if self.left.load(Relaxed) == 0 {
            return false;
        }
        let interval = 1_000_000_000 / u64::from(self.filter.rate.max(1));
        let burst = 1_000_000_000u64;
        let mut due = self.due.load(Relaxed);
        loop {
            if due > now_ns + burst {
                counters
                    .lines_dropped
                    .with_label_values(&["rate_cap"])
                    .inc();
                return false;
            }
            let next = due.max(now_ns) + interval;
            match self.due.compare_exchange_weak(due, next, Relaxed, Relaxed) {
                Ok(_) => break,
                Err(seen) => due = seen,
            }
        }
        // A limit reached by another worker meanwhile: give the place back unused.
        self.left
            .fetch_update(Relaxed, Relaxed, |left| left.checked_sub(1))
            .is_ok()
    }
}

/// The watchers, shared by the workers and the admin thread.
#[derive(Debug)]
pub struct WatchHub {
    /// Whether anyone watches: the one thing every request reads.
    open: AtomicBool,
    watchers: RwLock<Vec<Arc<Watcher>>>,
    next_id: AtomicU64,
    epoch: Instant,
    pub(crate) counters: WatchCounters,
}

impl WatchHub {
    pub(crate) fn new(counters: WatchCounters) -> WatchHub {
        WatchHub {
            open: AtomicBool::new(false),
            watchers: RwLock::new(Vec::new()),
            next_id: AtomicU64::new(1),
            epoch: Instant::now(),
            counters,
        }
    }

    /// Whether anyone watches (a relaxed load: a watch opened meanwhile sees requests from
    /// the worker's next look on).
    #[inline]
    pub(crate) fn open(&self) -> bool {
        self.open.load(Relaxed)
    }

    fn list(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Watcher>>> {
        self.watchers.read().unwrap_or_else(|e| e.into_inner())
    }

    fn list_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<Watcher>>> {
        self.watchers.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a watch with `filter`: the watcher and the lines it will get. `None` when
    /// [`MAX_WATCHERS`] are open already.
    pub fn watch(&self, filter: Filter) -> Option<(Arc<Watcher>, mpsc::Receiver<Arc<WatchLine>>)> {
        let (sender, receiver) = mpsc::channel(CHANNEL_LINES);
        let mut list = self.list_mut();
        if list.len() >= MAX_WATCHERS {
            return None;
        }
        let watcher = Arc::new(Watcher {
            id: self.next_id.fetch_add(1, Relaxed),
            left: AtomicU64::new(filter.limit.unwrap_or(u64::MAX)),
            filter,
            due: AtomicU64::new(0),
            sender: Mutex::new(Some(sender)),
            dropped: AtomicBool::new(false),
        });
        list.push(watcher.clone());
        self.counters.watchers.set(list.len() as i64);
        self.open.store(true, Relaxed);
        Some((watcher, receiver))
    }

    /// Ends `watcher`'s watch (its client went, or it was dropped); sampling stops with
    /// the last one.
    pub fn close(&self, watcher: &Watcher) {
        let mut list = self.list_mut();
        list.retain(|w| w.id != watcher.id);
        self.counters.watchers.set(list.len() as i64);
        self.open.store(!list.is_empty(), Relaxed);
    }

    /// Drops a watcher whose channel is full: its channel closes, it stops being sampled.
    fn drop_slow(&self, watcher: &Watcher) {
        if watcher.dropped.swap(true, Relaxed) {
            return;
        }
        if let Ok(mut sender) = watcher.sender.lock() {
            sender.take();
        }
        self.counters.slow_watchers.inc();
        self.close(watcher);
    }
}

/// A request sampled for some watchers, carried in its pending entry until it is answered.
#[derive(Debug)]
pub(crate) struct Sampled {
    hub: Arc<WatchHub>,
    watchers: Takers,
    started: Instant,
    line: WatchLine,
    command: Command,
    sent: bool,
}

impl WatchHub {
    /// The watchers that take a request for `key`, routed to `route` from the listener
    /// root `root`: their filters match, and each gives it one of its lines left and a
    /// place under its rate cap. Empty for a request nobody takes.
    pub(crate) fn takers(&self, key: &[u8], route: &str, root: &str, now: Instant) -> Takers {
        let now_ns = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        let mut takers = Takers::new();
        for watcher in self.list().iter() {
            if watcher.wants(key, route, root) && watcher.take_line(now_ns, &self.counters) {
                takers.push(watcher.clone());
            }
        }
        takers
    }
}

/// The watchers a request is shown to.
pub(crate) type Takers = SmallVec<[Arc<Watcher>; 2]>;

impl Sampled {
    /// A request read at `started` (`line` without its outcome yet) for `watchers`.
    pub(crate) fn new(
        hub: Arc<WatchHub>,
        watchers: Takers,
        started: Instant,
        command: Command,
        line: WatchLine,
    ) -> Box<Sampled> {
        Box::new(Sampled {
            hub,
            watchers,
            started,
            line,
            command,
            sent: false,
        })
    }
}

impl Sampled {
    /// The request was answered with `written` (the text reply as the client's framing got
    /// it; empty when nothing was written: noreply, quiet mode), `hits` and `misses` keys
    /// found and not (retrievals), its legs to `servers`: its line goes to its watchers.
    pub(crate) fn finish(mut self, written: &[u8], (hits, misses): (u64, u64), servers: String) {
        self.line.latency = self.started.elapsed();
        self.line.result = result(self.command, written, hits, misses);
        self.line.server = match servers.is_empty() {
            true => "-".to_string(),
            false => servers,
        };
        self.sent = true;
        // One line, shared by its watchers' channels.
        let line = Arc::new(self.line.clone());
        for watcher in &self.watchers {
            let full = {
                let sender = watcher.sender.lock().unwrap_or_else(|e| e.into_inner());
                match sender.as_ref().map(|s| s.try_send(line.clone())) {
                    Some(Ok(())) => {
                        self.hub.counters.lines_sent.inc();
                        false
                    }
                    Some(Err(mpsc::error::TrySendError::Full(_))) => true,
                    // Closed: the watch ended meanwhile.
                    Some(Err(mpsc::error::TrySendError::Closed(_))) | None => false,
                }
            };
            if full {
                self.hub
                    .counters
                    .lines_dropped
                    .with_label_values(&["slow_watcher"])
                    .inc();
                self.hub.drop_slow(watcher);
            }
        }
    }
}

impl Drop for Sampled {
    fn drop(&mut self) {
        // Never answered (the client went first): the line it held goes back, so a
        // `limit` is still reached.
        if !self.sent {
            for watcher in &self.watchers {
                if watcher.filter.limit.is_some() {
                    watcher.left.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

/// What a reply means for a watch line: an error line as it is, hit/miss for retrievals
/// (a multi-get's `H of N hit`), memcached's status word (`stored`, `not_found`, ...)
/// otherwise, meta statuses named the same way.
fn result(command: Command, written: &[u8], hits: u64, misses: u64) -> String {
    let line = written
        .split(|&b| b == b'\n')
        .next()
        .unwrap_or(b"")
        .strip_suffix(b"\r")
        .unwrap_or(written.split(|&b| b == b'\n').next().unwrap_or(b""));
    let text = String::from_utf8_lossy(&line[..line.len().min(256)]).into_owned();
    let word = text.split(' ').next().unwrap_or("");
    if matches!(word, "ERROR" | "CLIENT_ERROR" | "SERVER_ERROR") {
        return text;
    }
    if command.is_read() && hits + misses > 0 {
        return match (hits, misses) {
            (_, 0) => "hit".to_string(),
            (0, _) => "miss".to_string(),
            (hits, misses) => format!("{hits} of {} hit", hits + misses),
        };
    }
    if written.is_empty() {
        return "noreply".to_string();
    }
    let meta_ok = match command {
        Command::MetaSet => "stored",
        Command::MetaDelete => "deleted",
        _ => "ok",
    };
    match word {
        "HD" => meta_ok.to_string(),
        "NS" => "not_stored".to_string(),
        "EX" => "exists".to_string(),
        "NF" => "not_found".to_string(),
        "EN" => "miss".to_string(),
        "MN" => "ok".to_string(),
        _ => text.to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters() -> WatchCounters {
        WatchCounters {
            watchers: IntGauge::new("w", "w").expect("gauge"),
            examined: IntCounter::new("e", "e").expect("counter"),
            lines_sent: IntCounter::new("s", "s").expect("counter"),
            lines_dropped: IntCounterVec::new(prometheus::Opts::new("d", "d"), &["reason"])
                .expect("counter"),
            slow_watchers: IntCounter::new("x", "x").expect("counter"),
        }
    }

    #[test]
    fn replies_become_results() {
        assert_eq!(
            result(Command::Get, b"VALUE k 0 1\r\nx\r\nEND\r\n", 1, 0),
            "hit"
        );
        assert_eq!(result(Command::Get, b"END\r\n", 0, 1), "miss");
        assert_eq!(result(Command::Get, b"", 1, 2), "1 of 3 hit");
        assert_eq!(result(Command::Set, b"STORED\r\n", 0, 0), "stored");
        assert_eq!(result(Command::MetaSet, b"HD\r\n", 0, 0), "stored");
        assert_eq!(result(Command::MetaDelete, b"HD\r\n", 0, 0), "deleted");
        assert_eq!(result(Command::Delete, b"NOT_FOUND\r\n", 0, 0), "not_found");
        assert_eq!(result(Command::Set, b"", 0, 0), "noreply");
        assert_eq!(
            result(Command::Get, b"SERVER_ERROR timeout\r\n", 0, 1),
            "SERVER_ERROR timeout"
        );
    }

    #[test]
    fn the_rate_cap_allows_a_second_of_burst_then_the_rate() {
        let hub = WatchHub::new(counters());
        let (watcher, _lines) = hub
            .watch(Filter {
                rate: 10,
                ..Filter::default()
            })
            .expect("a watcher");
        let at = 5_000_000_000u64;
        let taken = (0..100)
            .filter(|_| watcher.take_line(at, &hub.counters))
            .count();
        // A second's worth ahead (10) plus the one due now.
        assert_eq!(taken, 11);
        // A tenth of a second later, one more.
        assert!(watcher.take_line(at + 100_000_000, &hub.counters));
        assert!(!watcher.take_line(at + 100_000_000, &hub.counters));
    }

    #[test]
    fn a_limit_stops_taking_lines_and_closing_the_last_watcher_stops_sampling() {
        let hub = WatchHub::new(counters());
        let (watcher, _lines) = hub
            .watch(Filter {
                rate: MAX_RATE,
                limit: Some(2),
                ..Filter::default()
            })
            .expect("a watcher");
        assert!(hub.open());
        assert!(watcher.take_line(1, &hub.counters));
        assert!(watcher.take_line(2, &hub.counters));
        assert!(!watcher.take_line(3, &hub.counters));
        hub.close(&watcher);
        assert!(!hub.open());
        assert_eq!(hub.counters.watchers.get(), 0);
    }

    #[test]
    fn filters_match_prefix_and_route() {
        let watcher = Watcher {
            id: 1,
            filter: Filter {
                key_prefix: b"user:".to_vec(),
                route: Some("main".into()),
                limit: None,
                rate: 1,
            },
            left: AtomicU64::new(u64::MAX),
            due: AtomicU64::new(0),
            sender: Mutex::new(None),
            dropped: AtomicBool::new(false),
        };
        assert!(watcher.wants(b"user:1", "main", "root"));
        assert!(watcher.wants(b"user:1", "pool", "main"));
        assert!(!watcher.wants(b"item:1", "main", "root"));
        assert!(!watcher.wants(b"user:1", "other", "root"));
    }
}
