//! Which keys are hot, per pool. A server melting under one key is the most common
//! memcached incident, and only the proxy sees every key. Each worker samples the keys it
//! places (about one in `sample_every`, at random so a client cycling through a fixed set
//! of keys cannot alias with the sampling) into a small space-saving sketch per pool:
//! [`CAPACITY`] counters, the least counted one replaced by a new key. A key's count is
//! over-estimated by at most the sketch's smallest count (its `error`), so any key with
//! more than 1/CAPACITY of a pool's samples is always listed.
//!
//! The sketches live behind one mutex per worker that only the worker takes on a sampled
//! request (uncontended) and the admin thread takes when asked: nothing is shared per
//! request. Counts cover the interval in progress and the one before it, so a report
//! always spans between one and two intervals.
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

/// Keys counted per pool per worker.
pub const CAPACITY: usize = 64;
/// Key bytes kept per counter: memcached's key limit.
const KEY_BYTES: usize = memroute_protocol::MAX_KEY_LEN;

/// One counted key.
#[derive(Clone)]
struct Counter {
    hash: u64,
    len: u8,
    key: [u8; KEY_BYTES],
    count: u64,
    /// How much of `count` may belong to the keys this counter replaced.
    error: u64,
    /// The server the key was last placed on.
    server: u32,
}

impl Counter {
    fn key(&self) -> &[u8] {
        &self.key[..usize::from(self.len)]
    }
}

/// Slots of a sketch's index: twice its counters, so a probe ends at an empty slot soon.
const SLOTS: usize = 2 * CAPACITY;
// A slot holds a counter's position + 1 in a byte, and a home slot is a hash's top bits.
const _: () = assert!(CAPACITY < u8::MAX as usize && SLOTS.is_power_of_two());

/// A space-saving sketch of one pool's sampled keys.
///
/// Most samples of a real load are keys not counted yet, which replace the least counted
/// key, so neither "is it counted" nor "which is least" reads every counter. The first is an
/// open-addressed index from a key's hash to its counter; the second a cursor that walks
/// the counters for one at `least` (a bound never above the least count, as counts only
/// grow), read anew from every counter only when a whole turn finds none.
#[derive(Clone)]
struct Sketch {
    samples: u64,
    counters: Vec<Counter>,
    /// Each slot a counter's position + 1 (0: empty), found from its hash by linear probing.
    index: [u8; SLOTS],
    /// Never above the least count.
    least: u64,
    /// Where the walk for a least counter goes on from.
    cursor: usize,
}

impl Default for Sketch {
    fn default() -> Sketch {
        Sketch {
            samples: 0,
            counters: Vec::new(),
            index: [0; SLOTS],
            least: 0,
            cursor: 0,
        }
    }
}

impl Sketch {
    /// Counts a sample of `key`; returns whether the key is now hot: sampled for certain
    /// (its count less its error) at least twice in this interval and more than
    /// 1/[`CAPACITY`] of the pool's samples in it (so it is always among the keys
    /// `/hotkeys` lists).
    fn add(&mut self, key: &[u8], server: u32) -> bool {
        self.samples += 1;
        let key = &key[..key.len().min(KEY_BYTES)];
        let hash = hash(key);
        if let Some(at) = self.find(hash, key) {
            let counter = &mut self.counters[at];
            counter.count += 1;
            counter.server = server;
            // Its own samples for certain: a counter's count includes the keys it replaced.
            let count = counter.count - counter.error;
            return count >= 2 && count.saturating_mul(CAPACITY as u64) > self.samples;
        }
        let (at, error) = match self.counters.len() < CAPACITY {
            true => {
                if self.counters.capacity() == 0 {
                    self.counters.reserve_exact(CAPACITY);
                }
                self.counters.push(Counter {
                    hash,
                    len: 0,
                    key: [0; KEY_BYTES],
                    count: 0,
                    error: 0,
                    server,
                });
                (self.counters.len() - 1, 0)
            }
            false => {
                let at = self.least_counted();
                self.unindex(at);
                (at, self.counters[at].count)
            }
        };
        // Written in place: the key's bytes only (`len` says how many count), no copy of
        // the whole counter.
        let counter = &mut self.counters[at];
        counter.hash = hash;
        counter.len = key.len() as u8;
        counter.key[..key.len()].copy_from_slice(key);
        counter.count = error + 1;
        counter.error = error;
        counter.server = server;
        self.index_at(hash, at);
        // A replacement's count is mostly other keys' (its error): not hot on that.
        false
    }

    /// The slot a hash's probe starts at: its top bits after a multiply (FNV's low bits
    /// differ little between keys that differ in one late byte).
    fn home(hash: u64) -> usize {
        (hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros())) as usize
    }

    /// The position of `key`'s counter, if it is counted.
    fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let mut slot = Sketch::home(hash);
        loop {
            let at = usize::from(self.index[slot]).checked_sub(1)?;
            let counter = &self.counters[at];
            if counter.hash == hash && counter.key() == key {
                return Some(at);
            }
            slot = (slot + 1) % SLOTS;
        }
    }

    fn index_at(&mut self, hash: u64, at: usize) {
        let mut slot = Sketch::home(hash);
        while self.index[slot] != 0 {
            slot = (slot + 1) % SLOTS;
        }
        self.index[slot] = at as u8 + 1;
    }

    /// Takes counter `at` out of the index, moving back the entries probed past it so
    /// that every entry stays reachable from its home slot.
    fn unindex(&mut self, at: usize) {
        let mut hole = Sketch::home(self.counters[at].hash);
        while usize::from(self.index[hole]) != at + 1 {
            hole = (hole + 1) % SLOTS;
        }
        let mut next = (hole + 1) % SLOTS;
        while let Some(entry) = usize::from(self.index[next]).checked_sub(1) {
            let home = Sketch::home(self.counters[entry].hash);
            // The entry may fill the hole when the hole lies on its probe (home ..= next).
            if (next + SLOTS - home) % SLOTS >= (next + SLOTS - hole) % SLOTS {
                self.index[hole] = self.index[next];
                hole = next;
            }
            next = (next + 1) % SLOTS;
        }
        self.index[hole] = 0;
    }

    /// A least counted counter of a full sketch (any of them, when several tie).
    fn least_counted(&mut self) -> usize {
        let mut walked = 0;
        loop {
            let at = self.cursor % CAPACITY;
            self.cursor = at + 1;
            if self.counters[at].count <= self.least {
                return at;
            }
            walked += 1;
            if walked == CAPACITY {
                // A whole turn found none at the bound: the least count has grown.
                self.least = self.counters.iter().map(|c| c.count).min().unwrap_or(0);
                walked = 0;
            }
        }
    }
}

/// How many hot keys' prints a worker keeps ([`WorkerHotKeys::hot_prints`]).
pub(crate) const HOT_PRINTS: usize = 8;

/// A key's print: its length and its first and last eight bytes (a shorter key's bytes,
/// packed). Two loads where a hash reads every byte: what a multi-get compares each of its
/// keys with to find the few that may be hot or may join a get in flight. Keys of at most
/// 16 bytes have prints of their own; longer keys may share one (a match is then checked
/// as the key's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct KeyPrint {
    len: usize,
    head: u64,
    tail: u64,
}

impl KeyPrint {
    #[inline]
    pub(crate) fn of(key: &[u8]) -> KeyPrint {
        let len = key.len();
        let word = |at: usize| {
            let bytes: [u8; 8] = key[at..at + 8].try_into().unwrap_or_default();
            u64::from_le_bytes(bytes)
        };
        if len < 8 {
            let head = key.iter().fold(0u64, |w, &b| (w << 8) | u64::from(b));
            return KeyPrint { len, head, tail: 0 };
        }
        KeyPrint {
            len,
            head: word(0),
            tail: word(len - 8),
        }
    }
}

pub(crate) fn hash(key: &[u8]) -> u64 {
    // FNV-1a: short keys, no allocation, good enough to skip most byte compares.
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A worker's sketches: the interval in progress and the one before.
struct Windows {
    started: Instant,
    current: HashMap<Arc<str>, Sketch>,
    previous: HashMap<Arc<str>, Sketch>,
    /// How long `previous` lasted (zero when there is none).
    previous_length: Duration,
}

impl Windows {
    fn new() -> Windows {
        Windows {
            started: Instant::now(),
            current: HashMap::new(),
            previous: HashMap::new(),
            previous_length: Duration::ZERO,
        }
    }

    /// Starts a new interval once `interval` has passed; drops what is two intervals old.
    fn rotate(&mut self, now: Instant, interval: Duration) {
        let age = now.saturating_duration_since(self.started);
        if age < interval {
            return;
        }
        if age < 2 * interval {
            self.previous = std::mem::take(&mut self.current);
            self.previous_length = age;
        } else {
            self.previous.clear();
            self.current.clear();
            self.previous_length = Duration::ZERO;
        }
        self.started = now;
    }
}

/// Sampling settings, from `[admin]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// About one key in this many is sampled; 0 turns detection off.
    pub sample_every: u32,
    pub interval: Duration,
    /// Whether reports name the keys (`admin.show_keys`).
    pub show_keys: bool,
}

impl Settings {
    /// `config`'s settings (`[admin]`), or the defaults without an admin table.
    pub(crate) fn of(config: &memroute_config::Config) -> Settings {
        match &config.admin {
            Some(admin) => Settings {
                sample_every: admin.hot_keys_sample,
                interval: admin.hot_keys_interval,
                show_keys: admin.show_keys,
            },
            None => Settings::default(),
        }
    }
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            sample_every: memroute_config::AdminConfig::HOT_KEYS_SAMPLE,
            interval: memroute_config::AdminConfig::HOT_KEYS_INTERVAL,
            show_keys: true,
        }
    }
}

/// One pool's sketches merged over workers: its samples, and each key's counts.
type Merged = (u64, HashMap<Vec<u8>, HotKey>);

/// Every worker's sketches, for the admin thread to merge.
#[derive(Default)]
pub struct HotKeyRegistry {
    workers: Mutex<Vec<Arc<Mutex<Windows>>>>,
    settings: Mutex<Settings>,
}

impl std::fmt::Debug for HotKeyRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotKeyRegistry").finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl HotKeyRegistry {
    /// A new worker's sampler.
    pub(crate) fn worker(&self, seed: u64) -> WorkerHotKeys {
        let windows = Arc::new(Mutex::new(Windows::new()));
        lock(&self.workers).push(windows.clone());
        let settings = *lock(&self.settings);
        WorkerHotKeys {
            windows,
            sample_every: Cell::new(settings.sample_every),
            interval: Cell::new(settings.interval),
            countdown: Cell::new(settings.sample_every),
            random: Cell::new(seed | 1),
            hot: RefCell::new(Vec::new()),
            prints: RefCell::new(SmallVec::new()),
        }
    }

    /// The settings new workers start with (workers take a config's settings as they
    /// build its routing: [`WorkerHotKeys::configure`]).
    pub(crate) fn set_settings(&self, settings: Settings) {
        *lock(&self.settings) = settings;
    }

    /// The hottest keys of each pool over every worker, hottest first, at most `top` each.
    pub fn report(&self, top: usize) -> Report {
        let settings = *lock(&self.settings);
        let now = Instant::now();
        let mut merged: HashMap<Arc<str>, Merged> = HashMap::new();
        let mut span = Duration::ZERO;
        for windows in lock(&self.workers).iter() {
            let mut windows = lock(windows);
            windows.rotate(now, settings.interval);
            span = span.max(windows.previous_length + now.duration_since(windows.started));
            for sketches in [&windows.previous, &windows.current] {
                for (pool, sketch) in sketches {
                    let (samples, keys) = merged.entry(pool.clone()).or_default();
                    *samples += sketch.samples;
                    for counter in &sketch.counters {
                        let key = keys.entry(counter.key().to_vec()).or_insert(HotKey {
                            key: counter.key().to_vec(),
                            samples: 0,
                            error: 0,
                            server: counter.server,
                        });
                        key.samples += counter.count;
                        key.error += counter.error;
                        key.server = counter.server;
                    }
                }
            }
        }
        let mut pools: Vec<PoolHotKeys> = merged
            .into_iter()
            .map(|(pool, (samples, keys))| {
                let mut keys: Vec<HotKey> = keys.into_values().collect();
                keys.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.key.cmp(&b.key)));
                keys.truncate(top);
                PoolHotKeys {
                    pool: pool.to_string(),
                    samples,
                    keys,
                }
            })
            .collect();
        pools.sort_by(|a, b| a.pool.cmp(&b.pool));
        Report {
            settings,
            span,
            pools,
        }
    }
}

/// One worker's sampler: [`WorkerHotKeys::observe`] is called for every key placed.
pub(crate) struct WorkerHotKeys {
    windows: Arc<Mutex<Windows>>,
    sample_every: Cell<u32>,
    interval: Cell<Duration>,
    /// Keys to let pass before the next sample.
    countdown: Cell<u32>,
    random: Cell<u64>,
    /// Hashes of the keys a sample found hot (`Sketch::add`), and when: what the hot-key
    /// cache (`hot_cache`) may keep. At most [`CAPACITY`]; only sampled requests write it.
    hot: RefCell<Vec<(u64, Instant)>>,
    /// The prints of the keys a sample found hot within the last two intervals (the span
    /// `is_hot` answers for), the latest [`HOT_PRINTS`]: where a multi-get's key may lead
    /// (`collapse::MultiGetKeys`). Pruned as samples are taken.
    prints: RefCell<SmallVec<[(KeyPrint, Instant); HOT_PRINTS]>>,
}

impl std::fmt::Debug for WorkerHotKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHotKeys")
            .field("sample_every", &self.sample_every.get())
            .finish_non_exhaustive()
    }
}

impl WorkerHotKeys {
    /// Applies a config's settings (the worker's next routing is built with them).
    pub(crate) fn configure(&self, settings: Settings) {
        if self.sample_every.get() != settings.sample_every {
            self.countdown.set(settings.sample_every);
        }
        if settings.sample_every == 0 {
            // No sample will prune them: nothing is hot from now on.
            self.prints.borrow_mut().clear();
        }
        self.sample_every.set(settings.sample_every);
        self.interval.set(settings.interval);
    }

    /// Counts `key`, placed on `server` of `pool`, when it is sampled.
    #[inline]
    pub(crate) fn observe(&self, pool: &str, key: &[u8], server: usize) {
        let left = self.countdown.get();
        if left > 1 {
            self.countdown.set(left - 1);
            return;
        }
        if self.sample_every.get() == 0 {
            return;
        }
        self.sample(pool, key, server);
    }

    #[cold]
    fn sample(&self, pool: &str, key: &[u8], server: usize) {
        // The next sample after 1..=2n-1 keys: one in n on average, never in step with
        // a client's own cycle of keys.
        let every = u64::from(self.sample_every.get());
        let mut x = self.random.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random.set(x);
        self.countdown.set((1 + x % (2 * every - 1)) as u32);
        let now = Instant::now();
        self.prune_prints(now);
        let mut windows = lock(&self.windows);
        windows.rotate(now, self.interval.get());
        let hot = match windows.current.get_mut(pool) {
            Some(sketch) => sketch.add(key, server as u32),
            None => {
                let mut sketch = Sketch::default();
                let hot = sketch.add(key, server as u32);
                windows.current.insert(Arc::from(pool), sketch);
                hot
            }
        };
        if hot {
            let key = &key[..key.len().min(KEY_BYTES)];
            self.mark_hot(hash(key), now);
            self.mark_print(KeyPrint::of(key), now);
        }
    }

    fn mark_print(&self, print: KeyPrint, now: Instant) {
        let mut prints = self.prints.borrow_mut();
        if let Some(entry) = prints.iter_mut().find(|(p, _)| *p == print) {
            entry.1 = now;
        } else if prints.len() < HOT_PRINTS {
            prints.push((print, now));
        } else if let Some(oldest) = prints.iter_mut().min_by_key(|(_, at)| *at) {
            *oldest = (print, now);
        }
    }

    /// Drops the prints no longer hot at `now`, so a multi-get compares its keys with the
    /// keys hot now only.
    fn prune_prints(&self, now: Instant) {
        let mut prints = self.prints.borrow_mut();
        // Most samples find none kept: nothing to compute.
        if prints.is_empty() {
            return;
        }
        let span = 2 * self.interval.get();
        if prints
            .iter()
            .any(|&(_, at)| now.saturating_duration_since(at) >= span)
        {
            prints.retain(|&mut (_, at)| now.saturating_duration_since(at) < span);
        }
    }

    /// Whether any key's print is kept (`hot_prints` would append some).
    #[inline]
    pub(crate) fn any_hot_prints(&self) -> bool {
        !self.prints.borrow().is_empty()
    }

    /// Appends the prints of the keys lately found hot (at most [`HOT_PRINTS`]; some may
    /// have cooled since: `is_hot` says).
    #[inline]
    pub(crate) fn hot_prints(&self, out: &mut SmallVec<[KeyPrint; HOT_PRINTS]>) {
        let prints = self.prints.borrow();
        if !prints.is_empty() {
            out.extend(prints.iter().map(|&(print, _)| print));
        }
    }

    fn mark_hot(&self, key_hash: u64, now: Instant) {
        let mut hot = self.hot.borrow_mut();
        if let Some(entry) = hot.iter_mut().find(|(h, _)| *h == key_hash) {
            entry.1 = now;
        } else if hot.len() < CAPACITY {
            hot.push((key_hash, now));
        } else if let Some(oldest) = hot.iter_mut().min_by_key(|(_, at)| *at) {
            *oldest = (key_hash, now);
        }
    }

    /// Whether the key of hash `key_hash` (`hash`) was found hot by a sample within the
    /// last two intervals (the span `/hotkeys` reports over).
    pub(crate) fn is_hot(&self, key_hash: u64, now: Instant) -> bool {
        let span = 2 * self.interval.get();
        self.hot
            .borrow()
            .iter()
            .any(|&(h, at)| h == key_hash && now.saturating_duration_since(at) < span)
    }
}

/// What [`HotKeyRegistry::report`] found.
#[derive(Debug)]
pub struct Report {
    pub settings: Settings,
    /// The time the counts cover.
    pub span: Duration,
    pub pools: Vec<PoolHotKeys>,
}

#[derive(Debug)]
pub struct PoolHotKeys {
    pub pool: String,
    /// Keys of this pool sampled over the span.
    pub samples: u64,
    pub keys: Vec<HotKey>,
}

#[derive(Debug, Clone)]
pub struct HotKey {
    pub key: Vec<u8>,
    pub samples: u64,
    /// At most this much of `samples` may be other keys' (space-saving's bound).
    pub error: u64,
    /// The server of the pool it was last placed on.
    pub server: u32,
}

impl Report {
    /// `key`'s fraction of its pool's requests.
    pub fn share(pool: &PoolHotKeys, key: &HotKey) -> f64 {
        match pool.samples {
            0 => 0.0,
            samples => key.samples as f64 / samples as f64,
        }
    }

    /// `key`'s estimated requests per second.
    pub fn rate(&self, key: &HotKey) -> f64 {
        match self.span.as_secs_f64() {
            secs if secs > 0.0 => key.samples as f64 * f64::from(self.settings.sample_every) / secs,
            _ => 0.0,
        }
    }

    /// `key` as reports show it: printable, or `<hidden>` with `admin.show_keys = false`.
    pub fn key_text(&self, key: &HotKey) -> String {
        match self.settings.show_keys {
            true => printable(&key.key),
            false => "<hidden>".to_string(),
        }
    }
}

/// A key as text: printable ASCII as is, anything else as `\xNN` (binary-protocol keys).
pub fn printable(key: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(key.len());
    for &b in key {
        match b {
            b'\\' => out.push_str("\\\\"),
            0x21..=0x7e => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hottest_keys_come_first_with_their_shares() {
        let registry = HotKeyRegistry::default();
        registry.set_settings(Settings {
            sample_every: 1,
            interval: Duration::from_secs(3600),
            show_keys: true,
        });
        let worker = registry.worker(7);
        let pool: Arc<str> = Arc::from("main");
        for i in 0..10_000u32 {
            let key = match i % 20 {
                0..=4 => "hot".to_string(),
                5..=6 => "warm".to_string(),
                _ => format!("cold{i}"),
            };
            worker.observe(&pool, key.as_bytes(), 3);
        }
        let report = registry.report(5);
        let main = &report.pools[0];
        assert_eq!(main.pool, "main");
        assert_eq!(main.samples, 10_000);
        assert_eq!(main.keys[0].key, b"hot");
        assert_eq!(main.keys[1].key, b"warm");
        assert_eq!(main.keys[0].server, 3);
        let hot = Report::share(main, &main.keys[0]);
        let warm = Report::share(main, &main.keys[1]);
        assert!((hot - 0.25).abs() < 0.02, "{hot}");
        assert!((warm - 0.10).abs() < 0.02, "{warm}");
    }

    /// Checks the index against the counters: each counter found at its own position,
    /// and no other entry.
    fn assert_indexed(sketch: &Sketch) {
        for (at, counter) in sketch.counters.iter().enumerate() {
            assert_eq!(sketch.find(counter.hash, counter.key()), Some(at));
        }
        let entries = sketch.index.iter().filter(|&&slot| slot != 0).count();
        assert_eq!(entries, sketch.counters.len());
    }

    #[test]
    fn the_sketch_keeps_space_savings_guarantees_under_churn() {
        // Mostly keys seen a few times (each replacing a least counted key), a few hot
        // ones, and keys of one length differing in one byte (probes that collide).
        let mut sketch = Sketch::default();
        let mut truth: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for i in 0..60_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = match x % 10 {
                0..=2 => format!("hot{}", x % 3),
                3 => format!("k{:04}", x % 10),
                _ => format!("cold{}", x % 5_000),
            }
            .into_bytes();
            let before = sketch.counters.iter().map(|c| c.count).min();
            let counted = sketch.counters.iter().any(|c| c.key() == key);
            let full = sketch.counters.len() == CAPACITY;
            sketch.add(&key, 0);
            *truth.entry(key.clone()).or_default() += 1;
            if full && !counted {
                let replaced = sketch.counters.iter().find(|c| c.key() == key);
                let replaced = replaced.expect("a new key replaces a counter");
                assert_eq!(Some(replaced.error), before, "a least counted one");
            }
            if i % 97 == 0 {
                assert_indexed(&sketch);
            }
        }
        assert_indexed(&sketch);
        let total: u64 = sketch.counters.iter().map(|c| c.count).sum();
        assert_eq!(total, sketch.samples);
        for counter in &sketch.counters {
            let seen = truth[counter.key()];
            assert!(counter.count - counter.error <= seen && seen <= counter.count);
        }
        for (key, &seen) in &truth {
            if seen * CAPACITY as u64 > sketch.samples {
                assert!(sketch.counters.iter().any(|c| c.key() == &key[..]));
            }
        }
    }

    #[test]
    fn sampling_is_about_one_in_n_and_off_at_zero() {
        let registry = HotKeyRegistry::default();
        registry.set_settings(Settings {
            sample_every: 16,
            interval: Duration::from_secs(3600),
            show_keys: true,
        });
        let worker = registry.worker(99);
        let pool: Arc<str> = Arc::from("p");
        for _ in 0..160_000 {
            worker.observe(&pool, b"k", 0);
        }
        let samples = registry.report(1).pools[0].samples;
        assert!((9_000..11_000).contains(&samples), "{samples}");
        worker.configure(Settings {
            sample_every: 0,
            interval: Duration::from_secs(3600),
            show_keys: true,
        });
        for _ in 0..1000 {
            worker.observe(&pool, b"k", 0);
        }
        assert!(registry.report(1).pools[0].samples <= samples + 1);
    }

    #[test]
    fn counts_older_than_two_intervals_are_dropped() {
        let mut windows = Windows::new();
        let start = windows.started;
        let mut sketch = Sketch::default();
        sketch.add(b"k", 0);
        windows.current.insert(Arc::from("p"), sketch);
        let interval = Duration::from_secs(10);
        windows.rotate(start + Duration::from_secs(12), interval);
        assert_eq!(windows.previous.len(), 1, "the last interval is kept");
        assert!(windows.current.is_empty());
        windows.rotate(start + Duration::from_secs(50), interval);
        assert!(windows.previous.is_empty() && windows.current.is_empty());
    }

    #[test]
    fn a_key_is_hot_from_its_second_sample_while_above_one_in_capacity() {
        let registry = HotKeyRegistry::default();
        registry.set_settings(Settings {
            sample_every: 1,
            interval: Duration::from_secs(3600),
            show_keys: true,
        });
        let worker = registry.worker(3);
        let now = Instant::now;
        worker.observe("p", b"hot", 0);
        assert!(!worker.is_hot(hash(b"hot"), now()), "one sample is not hot");
        worker.observe("p", b"hot", 0);
        assert!(worker.is_hot(hash(b"hot"), now()));
        // A key seen twice among many others is under 1/CAPACITY of the samples.
        for i in 0..(2 * CAPACITY as u32) {
            worker.observe("p", format!("cold{i}").as_bytes(), 0);
        }
        worker.observe("p", b"warm", 0);
        worker.observe("p", b"warm", 0);
        assert!(!worker.is_hot(hash(b"warm"), now()));
        let later = now() + Duration::from_secs(2 * 3600);
        assert!(
            !worker.is_hot(hash(b"hot"), later),
            "cooled after two intervals"
        );
    }

    fn prints_of(worker: &WorkerHotKeys) -> Vec<KeyPrint> {
        let mut out = SmallVec::new();
        worker.hot_prints(&mut out);
        out.to_vec()
    }

    #[test]
    fn the_hot_keys_prints_are_kept_while_they_may_be_hot() {
        let registry = HotKeyRegistry::default();
        let settings = Settings {
            sample_every: 1,
            interval: Duration::from_secs(3600),
            show_keys: true,
        };
        registry.set_settings(settings);
        let worker = registry.worker(5);
        worker.observe("p", b"bench:00000042", 0);
        assert!(prints_of(&worker).is_empty(), "one sample is not hot");
        worker.observe("p", b"bench:00000042", 0);
        assert_eq!(prints_of(&worker), [KeyPrint::of(b"bench:00000042")]);
        // A sample two intervals later drops it.
        worker.prune_prints(Instant::now() + Duration::from_secs(3600));
        assert_eq!(prints_of(&worker).len(), 1, "hot for two intervals");
        worker.prune_prints(Instant::now() + Duration::from_secs(2 * 3600));
        assert!(prints_of(&worker).is_empty());
        // Turned off, the sampler keeps no prints.
        worker.observe("p", b"k", 0);
        worker.observe("p", b"k", 0);
        assert_eq!(prints_of(&worker).len(), 1);
        worker.configure(Settings {
            sample_every: 0,
            ..settings
        });
        assert!(prints_of(&worker).is_empty());
    }

    #[test]
    fn prints_tell_keys_apart_by_length_and_both_ends() {
        let print = KeyPrint::of;
        assert_ne!(print(b"a"), print(b"\0a"), "the length counts");
        assert_ne!(print(b"ab"), print(b"ba"));
        assert_ne!(print(b"bench:00000042"), print(b"bench:00000043"));
        assert_ne!(print(b"bench:00000042"), print(b"xench:00000042"));
        assert_eq!(print(b"bench:00000042"), print(b"bench:00000042"));
        // Keys over 16 bytes may share a print: only their middles differ.
        assert_eq!(print(b"aaaaaaaa1bbbbbbbb"), print(b"aaaaaaaa2bbbbbbbb"));
    }

    #[test]
    fn keys_print_safely() {
        assert_eq!(printable(b"user:42"), "user:42");
        assert_eq!(printable(b"a b\x7f\\"), "a\\x20b\\x7f\\\\");
    }
}
