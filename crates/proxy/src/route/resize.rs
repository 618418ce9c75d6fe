//! A pool during its resize window (`resize_window`): its server list changed, and a key
//! whose owner changed may still be on its old owner (`snapshot::Previous`). Everything
//! the window changes about a request is here; keys that did not move pay one placement
//! on the previous ring more than a plain pool's.
//!
//! Moving a key: `mg KEY v f t c` on the old owner; a hit is `add`ed to the new owner (meta
//! set in add mode, with the item's flags and remaining TTL, so a value written there
//! meanwhile wins; a TTL over 30 days goes as the Unix time it ends at, as memcached reads
//! one) and then deleted from the old owner only if it is still the item looked at (`md
//! KEY C<cas>`, so it cannot come back). When that delete finds it gone or changed, a
//! delete reached the old owner after the look: the copy is taken back from the new owner
//! (`md KEY C<copy's cas>`, sparing a value written there since).
//!
//! - reads (get, gets, gat, gats, mg; the binary protocol's arrive as mg): the new owner
//!   first; on a miss the key is moved and, if it was, read again from the new owner (a
//!   CAS is the new owner's, a gat touches the copy);
//! - writes that depend on the current value or existence (add, replace, append, prepend,
//!   cas, incr, decr, touch, ma, ms in a mode other than set or with a CAS, md with a CAS):
//!   the key is moved first, then the write goes to the new owner, which answers as if the
//!   pool had never changed;
//! - unconditional writes (set, delete, ms, md): the new owner, and a delete on the old
//!   owner, both awaited (a delete found by either is a delete); a delete asks the new
//!   owner only once the old copy is gone, so a move racing with it either copied before
//!   (the delete then removes the copy) or takes its copy back;
//! - multi-gets: every key from its new owner; the misses that moved asked of their old
//!   owners (one pipelined burst per server), moved, then read again per new owner.
//!
//! An old owner marked down is not asked: its keys are plain misses. Requests on a
//! moved key take turns on it (`key_turns`): on one worker they run one after another, in
//! the order they arrived, so pipelined requests on one key answer as memcached would. A
//! read that finds the key on neither owner while some key was moved meanwhile reads its
//! new owner again: another worker's request may have moved this very key.
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::{BufMut, Bytes, BytesMut};
use memroute_config::Operation;
use memroute_protocol::meta::{MetaReply, MetaRequest};
use memroute_protocol::{
    Command, ReplyKind, RequestBytes, MAX_RELATIVE_EXPTIME as MAX_RELATIVE_TTL,
};
use memroute_routing::ReplyClass;
use smallvec::SmallVec;

use super::job::{class_of, Job, KeyReplies, KeyReply, MultiJob};
use super::pool;
use crate::counters::ResizeStats;
use crate::reply::{connection_gone, Reply};
use crate::snapshot::{Previous, RouteSnapshot, ServerConnections};

/// What a request needs from a key's old owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// A read: the old owner's copy on a miss.
    Read,
    /// A write that depends on the current value or existence: the key moved first.
    Current,
    /// A write that replaces or removes the value: the old copy deleted.
    Overwrite,
    /// Nothing (a command without a key's value).
    Nothing,
}

fn needs(job: &Job) -> Needs {
    match job.command {
        command if command.is_read() => Needs::Read,
        Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas
        | Command::Incr
        | Command::Decr
        | Command::Touch
        | Command::MetaArithmetic => Needs::Current,
        Command::Set | Command::Delete => Needs::Overwrite,
        Command::MetaSet | Command::MetaDelete => match meta_conditional(&job.parts.head) {
            true => Needs::Current,
            false => Needs::Overwrite,
        },
        _ => Needs::Nothing,
    }
}

/// Whether a meta set or delete line depends on the item: a CAS (`C`), or a mode other
/// than set (`MS`, the default).
fn meta_conditional(frame: &[u8]) -> bool {
    let line_end = frame
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(frame.len());
    frame[..line_end]
        .split(|&b| b == b' ')
        .skip(2)
        .any(|token| match token {
            [b'C', ..] => true,
            [b'M', mode, ..] => !matches!(mode, b'S' | b's'),
            _ => false,
        })
}

/// A pool's request: to the server that owns its key (flush_all: to every server), and
/// during a resize window the steps the window adds (`send_in_window`). Every pool's
/// request starts here, so the window is a layer over `pool`, never its callee.
pub(super) async fn send(routing: &Rc<RouteSnapshot>, pool: usize, job: &Job) -> Reply {
    match &routing.pools[pool].previous {
        None => pool::send_plain(routing, pool, job).await,
        Some(previous) => send_in_window(routing, pool, previous, job).await,
    }
}

/// A pool's share of a multi-get (`pool::run_multi_plain`), and during a resize window the
/// steps the window adds (`run_multi_in_window`).
pub(super) async fn run_multi(
    routing: &Rc<RouteSnapshot>,
    pool: usize,
    job: &MultiJob,
    keys: &[u32],
) -> KeyReplies {
    match &routing.pools[pool].previous {
        None => pool::run_multi_plain(routing, pool, job, keys).await,
        Some(previous) => run_multi_in_window(routing, pool, previous, job, keys).await,
    }
}

/// A request to `pool` (which has a window, `previous`) for a key: see the module's
/// description. flush_all also reaches the servers that left.
async fn send_in_window(
    routing: &Rc<RouteSnapshot>,
    pool: usize,
    previous: &Previous,
    job: &Job,
) -> Reply {
    if job.operation == Operation::FlushAll {
        return flush_all_in_window(routing, pool, previous, job).await;
    }
    let Some(new) = new_owner(routing, pool, &job.key) else {
        return pool::send_plain(routing, pool, job).await;
    };
    let (old, stays) = previous.owner(&job.key);
    if stays == Some(new) {
        return pool::send_plain(routing, pool, job).await;
    }
    let stats = &previous.window.stats;
    let old_server = &previous.servers[old];
    let new_server = &routing.pools[pool].servers[new];
    let needs = needs(job);
    if needs == Needs::Nothing {
        return pool::send_plain(routing, pool, job).await;
    }
    // Taken before the first await, so in the client's order: moving a key takes several
    // round trips, and a request pipelined behind this one on the same key must not reach
    // the new owner before this one is done.
    let turn = previous.turns.take(&job.key, previous.turns.request());
    if let Some(turn) = &turn {
        turn.come().await;
    }
    match needs {
        Needs::Nothing => pool::send_plain(routing, pool, job).await,
        Needs::Read => {
            // Keys moved so far: a request pipelined ahead of this one may move this key
            // between its miss on the new owner and its look on the old one.
            let moved_before = stats.keys_moved.load(Relaxed);
            let reply = pool::send_plain(routing, pool, job).await;
            if class_of(&reply) != ReplyClass::Miss {
                return reply;
            }
            let found = move_key(old_server, new_server, &job.key, job.slot, stats).await;
            if found || stats.keys_moved.load(Relaxed) != moved_before {
                return pool::send_plain(routing, pool, job).await;
            }
            reply
        }
        Needs::Current => {
            move_key(old_server, new_server, &job.key, job.slot, stats).await;
            pool::send_plain(routing, pool, job).await
        }
        Needs::Overwrite => overwrite(routing, pool, old_server, job, stats).await,
    }
}

/// flush_all to `pool`'s servers and to those that left it in the window.
async fn flush_all_in_window(
    routing: &Rc<RouteSnapshot>,
    pool: usize,
    previous: &Previous,
    job: &Job,
) -> Reply {
    let left: Vec<_> = previous
        .servers
        .iter()
        .zip(&previous.stays)
        .filter(|(_, stays)| stays.is_none())
        .map(|(server, _)| server.pick(job.slot).send(job.parts.clone(), job.kind))
        .collect();
    let reply = pool::send_plain(routing, pool, job).await;
    for receiver in left {
        let _ = receiver.await;
    }
    reply
}

/// A write that replaces or removes a moved key's value: to the new owner, and a delete
/// on the old owner (`old_server`), both awaited; a delete found by either is a delete.
async fn overwrite(
    routing: &Rc<RouteSnapshot>,
    pool: usize,
    old_server: &ServerConnections,
    job: &Job,
    stats: &ResizeStats,
) -> Reply {
    let mut delete = (!old_server.health.is_down()).then(|| {
        old_server
            .pick(job.slot)
            .send(delete_line(&job.key), ReplyKind::Line)
    });
    // A delete reaches the new owner only once the old copy is gone: a read moving
    // the key meanwhile then either copies it before (and this delete removes the
    // copy) or finds the old item gone when it deletes it (and takes its copy
    // back, `settle`). A set needs no such order: it overwrites a copy.
    let mut answer_old = None;
    if matches!(job.command, Command::Delete | Command::MetaDelete) {
        if let Some(receiver) = delete.take() {
            answer_old = Some(receiver.await.unwrap_or_else(|_| Err(connection_gone())));
        }
    }
    let reply = pool::send_plain(routing, pool, job).await;
    if let Some(receiver) = delete {
        answer_old = Some(receiver.await.unwrap_or_else(|_| Err(connection_gone())));
    }
    let deleted_old = match answer_old {
        Some(answer) => {
            if answer.is_err() {
                stats.errors.fetch_add(1, Relaxed);
            }
            matches!(answer, Ok(line) if MetaReply::of(&line).is(b"HD"))
        }
        None => false,
    };
    match (job.command, &reply) {
        (Command::Delete, Ok(line)) if deleted_old && line.starts_with(b"NOT_FOUND") => {
            Ok(Bytes::from_static(b"DELETED\r\n"))
        }
        (Command::MetaDelete, Ok(line)) if deleted_old && MetaReply::of(line).is(b"NF") => {
            Ok(meta_line(b"HD", job.echo.as_deref()))
        }
        _ => reply,
    }
}

/// The new owner of `key` in `pool`, as a plain request places it. `None` when the pool
/// has no servers.
fn new_owner(routing: &RouteSnapshot, pool: usize, key: &[u8]) -> Option<usize> {
    routing.server_for(pool, key)
}

/// Whether `key`'s owner in `pool` is another server than its owner before the window.
fn moved_owner(routing: &RouteSnapshot, pool: usize, previous: &Previous, key: &[u8]) -> bool {
    new_owner(routing, pool, key).is_some_and(|new| previous.owner(key).1 != Some(new))
}

/// `HD`/`NF` with the flags a meta reply echoes.
fn meta_line(code: &[u8], echo: Option<&[u8]>) -> Bytes {
    let mut line = BytesMut::with_capacity(code.len() + echo.map_or(0, <[u8]>::len) + 2);
    line.put_slice(code);
    if let Some(echo) = echo {
        line.put_slice(echo);
    }
    line.put_slice(b"\r\n");
    line.freeze()
}

/// A meta command for `key` (`verb KEY` and `flags`, the key as `meta::key_goes_raw` says).
fn meta_command(
    verb: &[u8],
    key: &[u8],
    flags: impl FnOnce(MetaRequest<'_, BytesMut>) -> MetaRequest<'_, BytesMut>,
) -> Bytes {
    let mut line = BytesMut::with_capacity(verb.len() + key.len() * 2 + 32);
    flags(MetaRequest::new(&mut line, verb, key)).finish();
    line.freeze()
}

fn delete_line(key: &[u8]) -> RequestBytes {
    RequestBytes::whole(meta_command(b"md", key, |md| md))
}

fn lookup_line(key: &[u8]) -> RequestBytes {
    let line = meta_command(b"mg", key, |mg| {
        mg.flag(b'v').flag(b'f').flag(b't').flag(b'c')
    });
    RequestBytes::whole(line)
}

/// `md KEY C<cas>`: deletes the item only if it is still the one with that CAS.
fn delete_if_line(key: &[u8], cas: u64) -> RequestBytes {
    RequestBytes::whole(meta_command(b"md", key, |md| md.number(b'C', cas)))
}

/// An item as the old owner holds it.
#[derive(Debug, PartialEq, Eq)]
struct Item {
    data: Bytes,
    flags: u64,
    /// Seconds it has left; 0: it never expires.
    ttl: u64,
    /// Its CAS on the old owner: the copy stands only if the old item is still this one
    /// when it is deleted there.
    cas: u64,
}

/// The item in an `mg KEY v f t c` reply (`VA <len> f<flags> t<ttl> c<cas>`); `None` for
/// a miss, an error, or an item with no time left.
fn parse_item(reply: &Bytes) -> Option<Item> {
    let meta = MetaReply::of(reply);
    if !meta.is(b"VA") {
        return None;
    }
    let numbers = meta.numbers();
    let ttl = match numbers.ttl {
        // t-1 (or no t): it never expires.
        None => 0,
        Some(0) => return None,
        Some(ttl) => ttl,
    };
    let start = reply.len() - meta.rest.len();
    let end = start.checked_add(numbers.size)?;
    if end > reply.len() {
        return None;
    }
    Some(Item {
        data: reply.slice(start..end),
        flags: u64::from(numbers.flags),
        ttl,
        cas: numbers.cas,
    })
}

/// `ms KEY <len> F<flags> T<ttl> ME c` and the data: stored only if the new owner has no
/// value for the key.
fn add_line(key: &[u8], item: &Item) -> RequestBytes {
    let line = meta_command(b"ms", key, |ms| {
        ms.size(item.data.len())
            .number(b'F', item.flags)
            .number(b'T', exptime(item.ttl, unix_now()))
            .mode(b'M', b'E')
            .flag(b'c')
    });
    let mut data = BytesMut::with_capacity(item.data.len() + 2);
    data.put_slice(&item.data);
    data.put_slice(b"\r\n");
    RequestBytes {
        head: line,
        tail: Some(data.freeze()),
    }
}

/// The expiry to store for an item with `ttl` seconds left (0: never expires) when the
/// Unix time is `now`: the seconds themselves, or the Unix time they end at when memcached
/// would read them as one (an item set with an absolute expiry more than 30 days ahead).
fn exptime(ttl: u64, now: u64) -> u64 {
    match ttl > MAX_RELATIVE_TTL {
        true => now.saturating_add(ttl),
        false => ttl,
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// Moves `key` from `old` to `new` (see the module's description). True when the old
/// owner had it (the new owner has a value for it now, copied or written meanwhile).
async fn move_key(
    old: &ServerConnections,
    new: &ServerConnections,
    key: &[u8],
    slot: usize,
    stats: &ResizeStats,
) -> bool {
    if old.health.is_down() {
        return false;
    }
    stats.fallback_reads.fetch_add(1, Relaxed);
    let found = old
        .pick(slot)
        .send(lookup_line(key), ReplyKind::MetaGet)
        .await
        .unwrap_or_else(|_| Err(connection_gone()));
    let item = match &found {
        Ok(reply) => parse_item(reply),
        Err(_) => {
            stats.errors.fetch_add(1, Relaxed);
            None
        }
    };
    let Some(item) = item else {
        return false;
    };
    copy(old, new, key, &item, slot, stats).await
}

/// Adds `item` to `new` and deletes it from `old` (`settle`); true when the add was
/// answered (the new owner holds what a read of it should find).
async fn copy(
    old: &ServerConnections,
    new: &ServerConnections,
    key: &[u8],
    item: &Item,
    slot: usize,
    stats: &ResizeStats,
) -> bool {
    let added = new
        .pick(slot)
        .send(add_line(key, item), ReplyKind::Line)
        .await
        .unwrap_or_else(|_| Err(connection_gone()));
    let added = judge_add(&added, stats);
    if added == Added::Failed {
        return false;
    }
    let forgot = old
        .pick(slot)
        .send(delete_if_line(key, item.cas), ReplyKind::Line)
        .await
        .unwrap_or_else(|_| Err(connection_gone()));
    if let Some(take_back) = settle(added, &forgot, key, stats) {
        let taken = new
            .pick(slot)
            .send(take_back, ReplyKind::Line)
            .await
            .unwrap_or_else(|_| Err(connection_gone()));
        judge_take_back(&taken, stats);
    }
    true
}

/// What the new owner answered a copy's add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Added {
    /// Stored, with this CAS.
    Copied(u64),
    /// It had a value (written meanwhile, which wins).
    Present,
    Failed,
}

/// Judges the add's answer, counting an error.
fn judge_add(added: &Reply, stats: &ResizeStats) -> Added {
    match added {
        Ok(line) if MetaReply::of(line).is(b"HD") => {
            Added::Copied(MetaReply::of(line).numbers().cas)
        }
        Ok(line) if MetaReply::of(line).is(b"NS") => Added::Present,
        _ => {
            stats.errors.fetch_add(1, Relaxed);
            Added::Failed
        }
    }
}

/// Judges the old owner's answer to deleting the item that was copied (`md KEY C<cas>`,
/// `forgot`), counting a moved key or an error. The copy stands only if that delete found
/// the very item copied: otherwise a delete (or a write) reached the old owner between the
/// look and this delete, and the client that sent it must not see the copy, so it is taken
/// back from the new owner (the returned `md KEY C<copy's cas>`, which spares a value
/// written there since).
fn settle(added: Added, forgot: &Reply, key: &[u8], stats: &ResizeStats) -> Option<RequestBytes> {
    let gone = matches!(forgot, Ok(line) if MetaReply::of(line).is(b"HD"));
    if forgot.is_err() {
        stats.errors.fetch_add(1, Relaxed);
    }
    match (added, gone) {
        (Added::Copied(_), true) => {
            stats.keys_moved.fetch_add(1, Relaxed);
            None
        }
        (Added::Copied(cas), false) => Some(delete_if_line(key, cas)),
        _ => None,
    }
}

/// Counts an error when taking a copy back failed.
fn judge_take_back(taken: &Reply, stats: &ResizeStats) {
    if taken.is_err() {
        stats.errors.fetch_add(1, Relaxed);
    }
}

/// A multi-get's keys `keys` (indexes into `job.keys`) in `pool`, which has a window
/// (`previous`): see the module's description.
async fn run_multi_in_window(
    routing: &Rc<RouteSnapshot>,
    pool: usize,
    previous: &Previous,
    job: &MultiJob,
    keys: &[u32],
) -> KeyReplies {
    // A turn on every key whose owner changed, taken before the first await (see `send_in_window`);
    // one per key (`take` gives none for a key asked twice).
    let request = previous.turns.request();
    let turns: SmallVec<[_; 8]> = keys
        .iter()
        .map(|&key| &job.keys[key as usize])
        .filter(|key| moved_owner(routing, pool, previous, key))
        .filter_map(|key| previous.turns.take(key, request))
        .collect();
    for turn in &turns {
        turn.come().await;
    }
    let mut replies = pool::run_multi_plain(routing, pool, job, keys)
        .await
        .into_keys(job, keys);
    let at = Window {
        routing,
        pool,
        previous,
        job,
        keys,
    };
    let moved = at.moved_misses(&replies);
    if moved.is_empty() {
        return KeyReplies::Keys(replies);
    }
    let found = at.look_up_old_owners(&moved).await;
    if found.is_empty() {
        return KeyReplies::Keys(replies);
    }
    let added = at.move_found(&found).await;
    // The moved keys read again from their new owners, batched per server.
    let again: Vec<(usize, u32)> = found
        .iter()
        .zip(added)
        .filter(|(_, added)| *added != Added::Failed)
        .map(|((position, ..), _)| (*position, keys[*position]))
        .collect();
    if again.is_empty() {
        return KeyReplies::Keys(replies);
    }
    let asked: Vec<u32> = again.iter().map(|(_, key)| *key).collect();
    let read = pool::run_multi_plain(routing, pool, job, &asked)
        .await
        .into_keys(job, &asked);
    for ((position, _), reply) in again.into_iter().zip(read) {
        replies[position] = reply;
    }
    KeyReplies::Keys(replies)
}

/// A multi-get's keys in a pool with a window, as `run_multi_in_window` moves them.
struct Window<'a> {
    routing: &'a Rc<RouteSnapshot>,
    pool: usize,
    previous: &'a Previous,
    job: &'a MultiJob,
    keys: &'a [u32],
}

impl Window<'_> {
    /// The key at `position` in `keys`.
    fn key(&self, position: usize) -> &Bytes {
        &self.job.keys[self.keys[position] as usize]
    }

    /// (position in `keys`, old owner, new owner) of every miss whose owner changed and
    /// whose old owner is not marked down.
    fn moved_misses(&self, replies: &[KeyReply]) -> Vec<(usize, usize, usize)> {
        let previous = self.previous;
        replies
            .iter()
            .enumerate()
            .filter(|(_, reply)| matches!(reply, KeyReply::Miss))
            .filter_map(|(position, _)| {
                let key = self.key(position);
                let new = new_owner(self.routing, self.pool, key)?;
                let (old, stays) = previous.owner(key);
                (stays != Some(new) && !previous.servers[old].health.is_down())
                    .then_some((position, old, new))
            })
            .collect()
    }

    /// Looks the `moved` misses up on their old owners, every lookup sent before any is
    /// awaited (one pipelined burst per old owner): (position, old, new, item) of those
    /// found.
    async fn look_up_old_owners(
        &self,
        moved: &[(usize, usize, usize)],
    ) -> Vec<(usize, usize, usize, Item)> {
        let stats = &self.previous.window.stats;
        stats.fallback_reads.fetch_add(moved.len() as u64, Relaxed);
        let lookups: Vec<_> = moved
            .iter()
            .map(|&(position, old, _)| {
                self.previous.servers[old]
                    .pick(self.job.slot)
                    .send(lookup_line(self.key(position)), ReplyKind::MetaGet)
            })
            .collect();
        let mut found = Vec::new();
        for (&(position, old, new), lookup) in moved.iter().zip(lookups) {
            match lookup.await.unwrap_or_else(|_| Err(connection_gone())) {
                Ok(reply) => {
                    if let Some(item) = parse_item(&reply) {
                        found.push((position, old, new, item));
                    }
                }
                Err(_) => {
                    stats.errors.fetch_add(1, Relaxed);
                }
            }
        }
        found
    }

    /// Moves the items `found` on old owners to their new owners: every copy sent before
    /// any is awaited, then every delete of what was copied, then every take-back of a
    /// copy whose old item had changed (`settle`). How each copy went, in `found`'s order.
    async fn move_found(&self, found: &[(usize, usize, usize, Item)]) -> Vec<Added> {
        let (stats, slot) = (&self.previous.window.stats, self.job.slot);
        let new_servers = &self.routing.pools[self.pool].servers;
        let adds: Vec<_> = found
            .iter()
            .map(|(position, _, new, item)| {
                new_servers[*new]
                    .pick(slot)
                    .send(add_line(self.key(*position), item), ReplyKind::Line)
            })
            .collect();
        let mut added = Vec::with_capacity(adds.len());
        for add in adds {
            let answer = add.await.unwrap_or_else(|_| Err(connection_gone()));
            added.push(judge_add(&answer, stats));
        }
        let deletes: Vec<_> = found
            .iter()
            .zip(&added)
            .filter(|(_, added)| **added != Added::Failed)
            .map(|((position, old, new, item), added)| {
                let key = self.key(*position);
                let receiver = self.previous.servers[*old]
                    .pick(slot)
                    .send(delete_if_line(key, item.cas), ReplyKind::Line);
                (key, *new, *added, receiver)
            })
            .collect();
        let mut take_backs = Vec::new();
        for (key, new, added, receiver) in deletes {
            let forgot = receiver.await.unwrap_or_else(|_| Err(connection_gone()));
            if let Some(take_back) = settle(added, &forgot, key, stats) {
                take_backs.push(new_servers[new].pick(slot).send(take_back, ReplyKind::Line));
            }
        }
        for receiver in take_backs {
            let taken = receiver.await.unwrap_or_else(|_| Err(connection_gone()));
            judge_take_back(&taken, stats);
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_parsed_with_its_flags_and_time_left() {
        let reply = Bytes::from_static(b"VA 5 f7 t120 c99\r\nhello\r\n");
        let item = parse_item(&reply).expect("item");
        assert_eq!(&item.data[..], b"hello");
        assert_eq!((item.flags, item.ttl, item.cas), (7, 120, 99));
        let forever = Bytes::from_static(b"VA 2 f0 t-1\r\nhi\r\n");
        assert_eq!(parse_item(&forever).map(|i| i.ttl), Some(0));
        assert!(parse_item(&Bytes::from_static(b"EN\r\n")).is_none());
        assert!(parse_item(&Bytes::from_static(b"VA 9 f0 t-1\r\nhi\r\n")).is_none());
        assert!(parse_item(&Bytes::from_static(b"VA 2 f0 t0\r\nhi\r\n")).is_none());
    }

    #[test]
    fn copies_and_deletes_carry_the_key_raw_or_in_base64() {
        let item = Item {
            data: Bytes::from_static(b"hello"),
            flags: 3,
            ttl: 0,
            cas: 1,
        };
        let RequestBytes {
            head: line,
            tail: data,
        } = add_line(b"k", &item);
        assert_eq!(&line[..], b"ms k 5 F3 T0 ME c\r\n");
        assert_eq!(data.as_deref(), Some(&b"hello\r\n"[..]));
        let line = add_line(b"a b", &item).head;
        assert_eq!(&line[..], b"ms YSBi 5 F3 T0 ME c b\r\n");
        // One text-key rule for every meta line memroute writes (protocol::meta).
        let long_control = [&[1u8][..], &[b'k'; 186]].concat();
        assert!(add_line(&long_control, &item).head.starts_with(b"ms \x01k"));
        assert_eq!(&delete_line(b"k").head[..], b"md k\r\n");
        assert_eq!(&delete_if_line(b"k", 12).head[..], b"md k C12\r\n");
        assert_eq!(&lookup_line(b"a b").head[..], b"mg YSBi v f t c b\r\n");
    }

    #[test]
    fn a_copy_stands_only_if_the_old_item_copied_was_still_there() {
        let stats = ResizeStats::default();
        let hd = |line: &'static [u8]| -> Reply { Ok(Bytes::from_static(line)) };
        assert_eq!(judge_add(&hd(b"HD c41\r\n"), &stats), Added::Copied(41));
        assert_eq!(judge_add(&hd(b"NS c0\r\n"), &stats), Added::Present);
        // The old item deleted there: the copy is taken back (unless rewritten since).
        let take_back = settle(Added::Copied(41), &hd(b"NF\r\n"), b"k", &stats);
        assert_eq!(
            take_back.map(|line| line.head),
            Some(Bytes::from_static(b"md k C41\r\n"))
        );
        assert!(settle(Added::Copied(41), &hd(b"EX\r\n"), b"k", &stats).is_some());
        assert!(settle(Added::Copied(41), &Err(connection_gone()), b"k", &stats).is_some());
        assert_eq!(stats.keys_moved.load(Relaxed), 0);
        // Deleted there as it was copied: moved.
        assert!(settle(Added::Copied(41), &hd(b"HD\r\n"), b"k", &stats).is_none());
        assert_eq!(stats.keys_moved.load(Relaxed), 1);
        // A value written on the new owner meanwhile is never taken back.
        assert!(settle(Added::Present, &hd(b"NF\r\n"), b"k", &stats).is_none());
    }

    #[test]
    fn a_time_left_over_30_days_is_stored_as_the_unix_time_it_ends_at() {
        let now = 1_800_000_000;
        assert_eq!(exptime(0, now), 0);
        assert_eq!(exptime(3600, now), 3600);
        assert_eq!(exptime(MAX_RELATIVE_TTL, now), MAX_RELATIVE_TTL);
        assert_eq!(
            exptime(MAX_RELATIVE_TTL + 1, now),
            now + MAX_RELATIVE_TTL + 1
        );
    }

    #[test]
    fn meta_sets_and_deletes_with_a_cas_or_another_mode_are_conditional() {
        assert!(!meta_conditional(b"ms k 5 T0\r\nhello\r\n"));
        assert!(!meta_conditional(b"ms k 5 MS\r\nhello\r\n"));
        assert!(meta_conditional(b"ms k 5 ME\r\nhello\r\n"));
        assert!(meta_conditional(b"ms k 5 MA\r\nhello\r\n"));
        assert!(meta_conditional(b"ms k 5 C99\r\nhello\r\n"));
        assert!(!meta_conditional(b"md k\r\n"));
        assert!(meta_conditional(b"md k C12\r\n"));
    }
}
