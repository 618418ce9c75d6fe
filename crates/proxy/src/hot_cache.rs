//! The hot-key cache (pool option `hot_cache`, off by default): a get of a key the
//! worker's hot-key sketch names hot is answered from a copy of an earlier identical
//! get's reply, at most `ttl` old, instead of going to the server.
//!
//! ```text
//!   leg_to(get K) --cacheable bytes?--> worker's table: same server, same bytes, copy
//!        |                               younger than ttl, K's write epoch unchanged?
//!        |                               yes -> that copy (a hit), nothing sent
//!        no -> sent as ever (a miss); K hot? the reply is kept for the next lookup
//!   dispatch(write, delete, touch of K) --> EPOCHS[hash(K)] += 1, again once answered
//!   dispatch(flush_all)                 --> FLUSHES += 1, again once answered
//! ```
//!
//! Exactness:
//! - only requests whose bytes to the server are identical share a copy (as `collapse`:
//!   text `get K`, `gets K`, binary get/getk as the `mg` they are sent as, `mg` with
//!   read-only flags other than `t`, whose answer changes with time): memcached would
//!   have sent each the same bytes, and each client's reply is rendered from them as
//!   before (its opaque, key echo, `q` suppression);
//! - only hits are kept (a value), never a miss or an error: a miss kept would hide a
//!   fill made elsewhere for up to `ttl`, and misses are what fills follow;
//! - a copy's age counts from when its get was *sent*: the value was current at some
//!   moment after that, so a copy is never served more than `ttl` after memcached last
//!   held it;
//! - a write of K through this memroute, any worker, bumps K's epoch (one of [`SLOTS`]
//!   process-wide counters, by the key's hash) when dispatched and again when its reply
//!   is handled (`WriteMark`); a get records the epoch before it is sent and its reply
//!   is kept only if the epoch is still the same; a copy is served only while it is. So
//!   a get that memcached answered before a concurrent write landed (another connection)
//!   is never kept past the write's reply, and a write drops every worker's copy at once;
//! - a write that did not go through this memroute (another proxy, a client straight to
//!   memcached) is seen once the copy expires: within `ttl`.
//!
//! The table is per worker per pool (no locks on the request path), at most `keys`
//! entries, each reply at most [`MAX_REPLY`] bytes (copied out of the connection's
//! buffer, so a copy pins nothing else), counted in `memroute_hot_cache_bytes`.
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use memroute_backend::{ReplyReceiver, TryRecvError};
use memroute_protocol::{ReplyKind, RequestBytes};
use memroute_routing::{classify_reply, ReplyClass};
use prometheus::{IntCounter, IntGauge};

use crate::hot_keys::hash;

/// Process-wide write epochs, indexed by key hash: a collision only drops a copy early.
const SLOTS: usize = 4096;
/// Largest reply kept (a 1 MiB value and its header line).
pub(crate) const MAX_REPLY: usize = (1 << 20) + 512;
/// Longest request bytes that may be cached (as `collapse`: one key, a few flags).
const MAX_REQUEST: usize = 320;

static EPOCHS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static FLUSHES: AtomicU64 = AtomicU64::new(0);
/// Whether any pool of the running config has a hot cache: writes bump epochs only then.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Called as a worker builds a config's routing: whether any of its pools caches.
pub(crate) fn set_enabled(on: bool) {
    // Epochs were not bumped while off: copies from before (none survive a rebuild, but
    // a worker still on the old routing may hold some) must not match.
    if on && !ENABLED.swap(true, Ordering::SeqCst) {
        FLUSHES.fetch_add(1, Ordering::SeqCst);
    } else if !on {
        ENABLED.store(false, Ordering::SeqCst);
    }
}

fn slot_of(key: &[u8]) -> usize {
    hash(key) as usize % SLOTS
}

/// A request that may change a key (or, for flush_all, every key) was dispatched: bumped
/// again when dropped, once its reply was handled (or its client left).
#[derive(Debug)]
pub(crate) struct WriteMark(u16);

const ALL: u16 = u16::MAX;

impl WriteMark {
    fn bump(slot: u16) {
        match slot {
            ALL => FLUSHES.fetch_add(1, Ordering::SeqCst),
            slot => EPOCHS[usize::from(slot)].fetch_add(1, Ordering::SeqCst),
        };
    }
}

impl Drop for WriteMark {
    fn drop(&mut self) {
        WriteMark::bump(self.0);
    }
}

/// A request that may change `key` is being dispatched (`None` when no pool caches).
pub(crate) fn written(key: &[u8]) -> Option<WriteMark> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let slot = slot_of(key) as u16;
    WriteMark::bump(slot);
    Some(WriteMark(slot))
}

/// A flush_all is being dispatched (`None` when no pool caches).
pub(crate) fn flushed() -> Option<WriteMark> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    WriteMark::bump(ALL);
    Some(WriteMark(ALL))
}

/// Where the writes of a key stand: its slot's epoch and the flush count.
fn epoch(slot: usize) -> (u64, u64) {
    (
        EPOCHS[slot].load(Ordering::SeqCst),
        FLUSHES.load(Ordering::SeqCst),
    )
}

/// Whether `line` (a whole request as sent to a server) may be answered from a copy: a
/// get collapsing would share, except an `mg` asking for the TTL left (`t`).
fn cacheable(line: &[u8]) -> bool {
    if !crate::collapse::collapsible(line, None) {
        return false;
    }
    match line.strip_prefix(b"mg ") {
        Some(rest) => !rest
            .split(|&b| b == b' ')
            .skip(1)
            .any(|f| f.first() == Some(&b't')),
        None => true,
    }
}

/// One key's copy.
struct Entry {
    key_hash: u64,
    server: usize,
    request: Vec<u8>,
    /// The reply kept (a hit), and its length as counted in `bytes`.
    reply: Option<Bytes>,
    /// The reply of the get sent to fill this entry, not yet looked at.
    filling: Option<ReplyReceiver>,
    /// When that get was sent, and the epoch before it.
    sent: Instant,
    epoch: (u64, u64),
}

/// A pool's cache on one worker.
pub(crate) struct HotCache {
    ttl: Duration,
    keys: usize,
    hits: IntCounter,
    misses: IntCounter,
    bytes: IntGauge,
    table: RefCell<Table>,
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    /// The request being looked up, copied out of its pieces (reused).
    scratch: Vec<u8>,
}

impl std::fmt::Debug for HotCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotCache")
            .field("ttl", &self.ttl)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Drop for HotCache {
    fn drop(&mut self) {
        // The gauge is shared by every worker and snapshot: give back what this one held.
        let held: usize = self.table.get_mut().entries.iter().map(Entry::held).sum();
        self.bytes.sub(held as i64);
    }
}

impl Entry {
    fn held(&self) -> usize {
        self.reply.as_ref().map_or(0, Bytes::len)
    }

    /// Takes the fill's reply if it arrived: kept when it is a value, small enough, and
    /// no write of the key was dispatched or answered since its get was sent.
    fn settle(&mut self, slot: usize, bytes: &IntGauge) {
        let Some(filling) = &mut self.filling else {
            return;
        };
        let reply = match filling.try_recv() {
            Err(TryRecvError::Empty) => return,
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) | Err(TryRecvError::Closed) => {
                self.filling = None;
                return;
            }
        };
        self.filling = None;
        if reply.len() <= MAX_REPLY
            && classify_reply(&reply) == ReplyClass::Hit
            && epoch(slot) == self.epoch
        {
            bytes.add(reply.len() as i64);
            self.reply = Some(Bytes::copy_from_slice(&reply));
        }
    }

    /// The copy, when it is younger than `ttl` and no write of the key came since.
    fn fresh(&self, slot: usize, now: Instant, ttl: Duration) -> Option<&Bytes> {
        let reply = self.reply.as_ref()?;
        (now.saturating_duration_since(self.sent) < ttl && epoch(slot) == self.epoch)
            .then_some(reply)
    }

    fn drop_reply(&mut self, bytes: &IntGauge) {
        bytes.sub(self.held() as i64);
        self.reply = None;
    }
}

impl HotCache {
    pub(crate) fn new(
        config: memroute_config::HotCache,
        (hits, misses, bytes): (IntCounter, IntCounter, IntGauge),
    ) -> HotCache {
        HotCache {
            ttl: config.ttl,
            keys: config.keys.max(1),
            hits,
            misses,
            bytes,
            table: RefCell::new(Table::default()),
        }
    }

    /// The reply to `parts` (a single-key request for `key` to `server`, whose reply is
    /// of `kind`): a fresh copy when there is one, else `send()`'s, kept for later gets
    /// when the key is hot (`is_hot(hash)`). `send` says whether it joined a get sent
    /// earlier (`collapse`): such a reply is not kept, its age being unknown here.
    pub(crate) fn answer(
        &self,
        (key, server): (&[u8], usize),
        parts: &RequestBytes,
        kind: ReplyKind,
        is_hot: impl FnOnce(u64, Instant) -> bool,
        send: impl FnOnce() -> (ReplyReceiver, bool),
    ) -> ReplyReceiver {
        let may = matches!(kind, ReplyKind::Retrieval | ReplyKind::MetaGet)
            && matches!(parts.pieces().next(), Some([b'g' | b'm', ..]))
            && parts.pieces().map(<[u8]>::len).sum::<usize>() <= MAX_REQUEST;
        if !may {
            return send().0;
        }
        let mut table = self.table.borrow_mut();
        let Table { entries, scratch } = &mut *table;
        scratch.clear();
        for piece in parts.pieces() {
            scratch.extend_from_slice(piece);
        }
        if !cacheable(scratch) {
            return send().0;
        }
        let key_hash = hash(key);
        let slot = key_hash as usize % SLOTS;
        let now = Instant::now();
        let found = entries
            .iter()
            .position(|e| e.key_hash == key_hash && e.server == server && e.request == **scratch);
        if let Some(index) = found {
            let entry = &mut entries[index];
            entry.settle(slot, &self.bytes);
            if let Some(reply) = entry.fresh(slot, now, self.ttl) {
                self.hits.inc();
                return ReplyReceiver::ready(Ok(reply.clone()));
            }
            entry.drop_reply(&self.bytes);
        }
        self.misses.inc();
        let before = epoch(slot);
        let (receiver, joined) = send();
        let filling = found.is_some_and(|index| entries[index].filling.is_some());
        if filling || joined {
            // A fill on its way was sent earlier: its copy is the older one. A joined
            // get's reply answers a get sent before `now`: its age would be understated.
            return receiver;
        }
        if !is_hot(key_hash, now) {
            if let Some(index) = found {
                let mut entry = entries.swap_remove(index);
                entry.drop_reply(&self.bytes);
            }
            return receiver;
        }
        let Some(follow) = receiver.follow().join() else {
            return receiver;
        };
        let entry = Entry {
            key_hash,
            server,
            request: scratch.clone(),
            reply: None,
            filling: Some(follow),
            sent: now,
            epoch: before,
        };
        match found {
            Some(index) => entries[index] = entry,
            None if entries.len() < self.keys => entries.push(entry),
            None => {
                // Full: the copy sent longest ago makes room.
                if let Some(oldest) = entries.iter_mut().min_by_key(|e| e.sent) {
                    oldest.drop_reply(&self.bytes);
                    *oldest = entry;
                }
            }
        }
        receiver
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_whose_answer_does_not_age_are_cached() {
        for line in [
            &b"get k\r\n"[..],
            b"gets k\r\n",
            b"mg k v f c\r\n",
            b"mg k s v k O123\r\n",
        ] {
            assert!(cacheable(line), "{}", String::from_utf8_lossy(line));
        }
        for line in [
            &b"mg k v t\r\n"[..],
            b"mg k v N30\r\n",
            b"gat 0 k\r\n",
            b"get a b\r\n",
            b"set k 0 0 1\r\nx\r\n",
        ] {
            assert!(!cacheable(line), "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn writes_move_the_epoch_twice_and_only_when_enabled() {
        set_enabled(false);
        let slot = slot_of(b"epoch-test");
        let start = epoch(slot);
        assert!(written(b"epoch-test").is_none());
        assert_eq!(epoch(slot), start);
        set_enabled(true);
        let enabled = epoch(slot);
        assert_ne!(enabled, start, "turning on drops every older copy");
        let mark = written(b"epoch-test");
        let dispatched = epoch(slot);
        assert_ne!(dispatched, enabled);
        drop(mark);
        assert_ne!(epoch(slot), dispatched, "the write's reply bumps it again");
    }
}
