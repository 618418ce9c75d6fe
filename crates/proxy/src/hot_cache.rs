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
//!   process-wide words, by the key's hash) when dispatched and again when its reply
//!   is handled (`WriteMark`); a get records the epoch before it is sent and its reply
//!   is kept only if the epoch is still the same; a copy is served only while it is. So
//!   a get that memcached answered before a concurrent write landed (another connection)
//!   is never kept past the write's reply, and a write drops every worker's copy at once;
//! - a slot's word names the key whose copies it guards (its owner: a 20-bit tag of the
//!   key's hash; the high half) beside the epoch (the low half), and a write bumps it only
//!   when its key is the owner: a write of one of the other keys that share the slot (1
//!   in [`SLOTS`] of all keys) must not drop a hot key's copy, or a storm's 10% of sets to
//!   other keys costs its server an extra get or two each time one lands in the hot key's
//!   slot. A fill claims the slot before its get is sent (`claim`): a free slot becomes
//!   its key's, a slot owned by another key becomes shared (every write of the slot bumps
//!   it, as if there were no owners), and either change bumps the epoch, so a copy is
//!   valid only while the owner it was filled under is unchanged;
//! - a write that did not go through this memroute (another proxy, a client straight to
//!   memcached) is seen once the copy expires: within `ttl`.
//!
//! The table is per worker per pool (no locks on the request path), at most `keys`
//! entries, each reply at most [`MAX_REPLY`] bytes (copied out of the connection's
//! buffer, so a copy pins nothing else), counted in `memroute_hot_cache_bytes`.
use std::cell::RefCell;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use memroute_backend::{ReplyReceiver, TryRecvError};
use memroute_protocol::{ReplyKind, RequestBytes};
use memroute_routing::{classify_reply, ReplyClass};
use prometheus::{IntCounter, IntGauge};

use crate::hot_keys::hash;

/// Process-wide write epochs, indexed by key hash (the low 12 bits): a collision of two
/// cached keys only drops copies early.
const SLOTS: usize = 4096;
/// Largest reply kept (a 1 MiB value and its header line).
pub(crate) const MAX_REPLY: usize = (1 << 20) + 512;
/// Longest request bytes that may be cached (as `collapse`: one key, a few flags).
const MAX_REQUEST: usize = 320;

/// Per slot: the owner in the high 32 bits ([`FREE`], [`SHARED`] or a key's tag,
/// `slot_and_tag`), the epoch in the low 32 (a carry into the owner after 2^32 bumps
/// only changes the word, which drops copies, and the next claim makes the slot shared:
/// safe).
static EPOCHS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// A slot no fill has claimed yet.
const FREE: u32 = 0;
/// A slot two keys claimed: every write of a key of the slot bumps it.
const SHARED: u32 = TAGS;
/// Tags are 20 bits (with a 12-bit slot, a `WriteMark` is one `u32`), never `FREE` or
/// `SHARED`.
const TAGS: u32 = (1 << 20) - 1;
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

/// A key's slot and owner tag, from its hash (`hot_keys::hash`).
fn slot_and_tag(key_hash: u64) -> (usize, u32) {
    let tag = match (key_hash >> 44) as u32 & TAGS {
        FREE | SHARED => 1,
        tag => tag,
    };
    (key_hash as usize % SLOTS, tag)
}

fn owner(word: u64) -> u32 {
    (word >> 32) as u32
}

/// A request that may change a key (or, for flush_all, every key) was dispatched: bumped
/// again when dropped, once its reply was handled (or its client left). The key's tag
/// above its slot in one `u32` (never 0: a tag is at least 1), or [`ALL`].
#[derive(Debug)]
pub(crate) struct WriteMark(NonZeroU32);

const ALL: u32 = u32::MAX;

impl WriteMark {
    fn of(key: &[u8]) -> WriteMark {
        let (slot, tag) = slot_and_tag(hash(key));
        // At least 1 << 12 (a tag is at least 1), and below `ALL` (a tag is below `TAGS`).
        let mark = WriteMark(NonZeroU32::new((tag << 12) | slot as u32).unwrap_or(NonZeroU32::MIN));
        mark.bump();
        mark
    }

    fn bump(&self) {
        let mark = self.0.get();
        if mark == ALL {
            FLUSHES.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let (slot, tag) = (mark as usize % SLOTS, mark >> 12);
        let word = &EPOCHS[slot];
        // Only the owner's writes (or any, in a shared slot) can change a copy kept here.
        let held_by = owner(word.load(Ordering::SeqCst));
        if held_by == tag || held_by == SHARED {
            word.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for WriteMark {
    fn drop(&mut self) {
        self.bump();
    }
}

/// A request that may change `key` is being dispatched (`None` when no pool caches).
pub(crate) fn written(key: &[u8]) -> Option<WriteMark> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    Some(WriteMark::of(key))
}

/// A flush_all is being dispatched (`None` when no pool caches).
pub(crate) fn flushed() -> Option<WriteMark> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let mark = WriteMark(NonZeroU32::MAX);
    mark.bump();
    Some(mark)
}

/// Where the writes of a key stand: its slot's word and the flush count.
fn epoch(slot: usize) -> (u64, u64) {
    (
        EPOCHS[slot].load(Ordering::SeqCst),
        FLUSHES.load(Ordering::SeqCst),
    )
}

/// Makes the key of `tag` an owner of `slot` before a get that fills a copy is sent (so
/// every later write of it bumps the slot), and returns where the writes stand. A free
/// slot becomes the key's; another key's becomes shared; either change bumps the epoch
/// (copies kept under the old owner are dropped).
fn claim(slot: usize, tag: u32) -> (u64, u64) {
    let word = &EPOCHS[slot];
    let mut current = word.load(Ordering::SeqCst);
    // The word as claimed, not loaded again: a copy is then valid only while the slot is
    // still owned as it was here.
    let claimed = loop {
        let now = match owner(current) {
            o if o == tag || o == SHARED => break current,
            FREE => tag,
            _ => SHARED,
        };
        let next = (u64::from(now) << 32) | u64::from((current as u32).wrapping_add(1));
        match word.compare_exchange(current, next, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => break next,
            Err(actual) => current = actual,
        }
    };
    (claimed, FLUSHES.load(Ordering::SeqCst))
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
        let (slot, tag) = slot_and_tag(key_hash);
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
        // A fill on its way was sent earlier: its copy is the older one.
        let filling = found.is_some_and(|index| entries[index].filling.is_some());
        let hot = !filling && is_hot(key_hash, now);
        // Claimed before the get is sent: a write of the key from then on moves the epoch.
        let before = match hot {
            true => claim(slot, tag),
            false => (0, 0),
        };
        let (receiver, joined) = send();
        if filling || joined {
            // A joined get's reply answers a get sent before `now`: its age would be
            // understated.
            return receiver;
        }
        if !hot {
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

    fn slot_tag(key: &[u8]) -> (usize, u32) {
        slot_and_tag(hash(key))
    }

    /// A key other than `key` (`{prefix}{i}`) in `key`'s slot with another tag.
    fn sharing_slot_with(key: &[u8], prefix: &str) -> Vec<u8> {
        let (slot, tag) = slot_tag(key);
        (0u32..)
            .map(|i| format!("{prefix}{i}").into_bytes())
            .find(|other| slot_tag(other).0 == slot && slot_tag(other).1 != tag)
            .expect("some key shares the slot")
    }

    fn word(slot: usize) -> u64 {
        EPOCHS[slot].load(Ordering::SeqCst)
    }

    #[test]
    fn writes_move_the_epoch_twice_and_only_when_enabled() {
        let key = b"epoch-test";
        let (slot, tag) = slot_tag(key);
        set_enabled(false);
        let start = claim(slot, tag).0;
        assert!(written(key).is_none());
        assert_eq!(word(slot), start);
        set_enabled(true);
        let mark = WriteMark::of(key);
        let dispatched = word(slot);
        assert_ne!(dispatched, start, "the owner's write drops its copies");
        drop(mark);
        assert_ne!(word(slot), dispatched, "the write's reply bumps it again");
    }

    #[test]
    fn a_write_of_another_key_of_the_slot_leaves_the_owners_copies() {
        // The storm's sets of other keys: 1 in 4096 of them share the hot key's slot.
        let hot = b"owner-test";
        let other = sharing_slot_with(hot, "owner-other-");
        let (slot, tag) = slot_tag(hot);
        let before = claim(slot, tag).0;
        assert_eq!(owner(before), tag);
        drop(WriteMark::of(&other));
        assert_eq!(word(slot), before, "not the owner: no bump");
        assert_eq!(claim(slot, tag).0, before, "claimed again: unchanged");
        drop(WriteMark::of(hot));
        assert_eq!(word(slot), before + 2, "the owner's write: two bumps");
    }

    #[test]
    fn two_cached_keys_of_one_slot_share_it() {
        let first = b"shared-test";
        let second = sharing_slot_with(first, "shared-second-");
        let third = sharing_slot_with(first, "shared-third-");
        let (slot, first_tag) = slot_tag(first);
        let firsts = claim(slot, first_tag).0;
        let seconds = claim(slot, slot_tag(&second).1).0;
        assert_ne!(seconds, firsts, "the first key's copies are dropped");
        assert_eq!(owner(seconds), SHARED);
        assert_eq!(
            claim(slot, first_tag).0,
            seconds,
            "shared: claimed as it is"
        );
        drop(WriteMark::of(&third));
        assert_ne!(
            word(slot),
            seconds,
            "shared: any write of the slot bumps it"
        );
    }

    #[test]
    fn tags_are_never_free_or_shared_and_marks_never_all() {
        for hash in [0, u64::MAX, u64::from(TAGS) << 44, 1 << 44] {
            let (slot, tag) = slot_and_tag(hash);
            assert!(
                tag != FREE && tag != SHARED && tag < TAGS,
                "{hash:x}: {tag:x}"
            );
            assert_ne!((tag << 12) | slot as u32, ALL);
        }
    }
}
