//! Collapsing: a get whose identical request is already queued or in flight on the same
//! backend connection waits for that request's reply instead of being sent again, so a
//! hot key costs its server one get per round trip per connection, not one per client.
//!
//! ```text
//!   leg_to(get K) --collapsible bytes?--> table[hash(K)]: same connection, same bytes,
//!        |                                 leader still waiting?  yes -> join (a copy of
//!        |                                 its reply: `ReplyFollow::join`), nothing sent
//!        no -> sent as ever, and becomes table[hash(K)]'s leader
//!   dispatch(any write, delete, touch, mg with side effects of K) --> forget(K)
//!   dispatch(flush_all) --> forget_all
//! ```
//!
//! Exactness, by construction rather than by re-rendering replies:
//! - only requests whose bytes to the server are identical collapse (text `get K` with
//!   `get K`, `gets K` with `gets K`, binary get/getk, which go out as `mg K v f c`, with
//!   each other, `mg` with `mg` of the same flags and opaque): memcached would have sent
//!   each of them the same bytes, and what memroute writes to each client (its own
//!   opaque and key echo in binary, `q`/`noreply` suppression) is rendered per client
//!   from that reply as before;
//! - only retrievals without side effects a client could see: `get`, `gets`, and `mg`
//!   whose flags are all in [`READ_ONLY_FLAGS`] (not `h`/`l`, which report the previous
//!   access, nor N R T E or anything else that vivifies, touches or hands out a win);
//! - only on one connection: memcached keeps one connection's order, not two's, and a
//!   session always uses the same connection to a server;
//! - read-your-writes: every request of this worker that may change K (dispatch calls
//!   `forget`) ends K's entry, so a get dispatched after it never joins a get sent
//!   before it;
//! - a leader's error (timeout, broken connection, server down) reaches every follower
//!   as the same error; a leader whose client left still delivers to its followers.
//!
//! The table is per worker thread, [`SLOTS`] entries indexed by the key's hash, one leader
//! each (a newer leader replaces an older one; a collision only loses a chance to
//! collapse). Its memory is allocated once, on the worker's first get.
use std::cell::RefCell;

use memroute_backend::{BackendHandle, ReplyFollow, ReplyReceiver};
use memroute_protocol::{Command, ReplyKind, RequestBytes};

/// Entries per worker.
const SLOTS: usize = 256;
/// Requests longer than this (bytes to the server) are never collapsed: a get line is a
/// verb, a key of at most 250 bytes and, for `mg`, a few flags.
const MAX_REQUEST: usize = 320;

/// `mg` flags that neither change the item nor report per-access state: base64 key, CAS,
/// client flags, key echo, opaque, size, TTL left, no LRU bump, value.
const READ_ONLY_FLAGS: &[u8] = b"bcfkOstuv";

/// One key's leader.
#[derive(Default)]
struct Entry {
    /// `BackendHandle::id` of the leader's connection (0: empty).
    connection: usize,
    key_hash: u64,
    /// Length of the leader's request bytes, kept at `Table::bytes[slot * MAX_REQUEST..]`.
    len: usize,
    leader: ReplyFollow,
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    bytes: Vec<u8>,
    /// The request being looked up, copied out of its pieces (reused).
    scratch: Vec<u8>,
}

impl Table {
    fn ready(&mut self) {
        if self.entries.is_empty() {
            self.entries.resize_with(SLOTS, Entry::default);
            self.bytes.resize(SLOTS * MAX_REQUEST, 0);
            self.scratch.reserve(MAX_REQUEST);
        }
    }
}

thread_local! {
    static TABLE: RefCell<Table> = RefCell::new(Table::default());
}

/// Whether `line` (a whole request as sent to a server) may collapse: one `get`/`gets`
/// of one key, or an `mg` with read-only flags only.
pub(crate) fn collapsible(line: &[u8]) -> bool {
    let Some(body) = line.strip_suffix(b"\r\n") else {
        return false;
    };
    if body.contains(&b'\n') {
        return false;
    }
    if let Some(key) = body
        .strip_prefix(b"get ")
        .or_else(|| body.strip_prefix(b"gets "))
    {
        return !key.is_empty() && !key.contains(&b' ');
    }
    match body.strip_prefix(b"mg ") {
        Some(rest) => meta_read_only(rest),
        None => false,
    }
}

/// Whether an `mg`'s key and flags (`rest`, after `mg `) ask for nothing but reads.
pub(crate) fn meta_read_only(rest: &[u8]) -> bool {
    let mut tokens = rest.split(|&b| b == b' ').filter(|t| !t.is_empty());
    if tokens.next().is_none() {
        return false;
    }
    tokens.all(|flag| READ_ONLY_FLAGS.contains(&flag[0]))
}

/// Whether a single-key request of `command` (its command line `line`) may change its
/// key, as far as a get that joins another can tell: anything but a `get`, `gets`, or an
/// `mg` with read-only flags (a touch changes when the item expires, so it counts).
pub(crate) fn changes_key(command: Command, line: &[u8]) -> bool {
    match command {
        Command::Get | Command::Gets => false,
        Command::MetaGet => {
            let line = line.strip_suffix(b"\n").unwrap_or(line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            !line.strip_prefix(b"mg ").is_some_and(meta_read_only)
        }
        _ => true,
    }
}

/// The hash a key's entry is found by.
fn hash(key: &[u8]) -> u64 {
    // FNV-1a, as the hot-key sketch: short keys, no allocation.
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Sends `parts` (a single-key request for `key`, whose reply is of `kind`) on
/// `connection` as `send` does, unless it is a collapsible get identical to one still
/// waiting for its reply there: then it waits for that one's reply. True when it joined.
pub(crate) fn send_or_join(
    connection: &BackendHandle,
    key: &[u8],
    parts: &RequestBytes,
    kind: ReplyKind,
    send: impl FnOnce() -> ReplyReceiver,
) -> (ReplyReceiver, bool) {
    let may = matches!(kind, ReplyKind::Retrieval | ReplyKind::MetaGet)
        && matches!(parts.pieces().next(), Some([b'g' | b'm', ..]))
        && parts.pieces().map(<[u8]>::len).sum::<usize>() <= MAX_REQUEST;
    if !may {
        return (send(), false);
    }
    TABLE.with(|table| {
        let mut table = table.borrow_mut();
        table.ready();
        let Table {
            entries,
            bytes,
            scratch,
        } = &mut *table;
        scratch.clear();
        for piece in parts.pieces() {
            scratch.extend_from_slice(piece);
        }
        if !collapsible(scratch) {
            return (send(), false);
        }
        let key_hash = hash(key);
        let slot = key_hash as usize % SLOTS;
        let entry = &mut entries[slot];
        let stored = &mut bytes[slot * MAX_REQUEST..][..MAX_REQUEST];
        let id = connection.id();
        if entry.connection == id && entry.key_hash == key_hash && stored[..entry.len] == **scratch
        {
            if let Some(receiver) = entry.leader.join() {
                return (receiver, true);
            }
        }
        let receiver = send();
        stored[..scratch.len()].copy_from_slice(scratch);
        *entry = Entry {
            connection: id,
            key_hash,
            len: scratch.len(),
            leader: receiver.follow(),
        };
        (receiver, false)
    })
}

/// A request that may change `key` is being sent: no later get of `key` may join a get
/// sent before it.
pub(crate) fn forget(key: &[u8]) {
    let key_hash = hash(key);
    let _ = TABLE.try_with(|table| {
        let mut table = table.borrow_mut();
        if let Some(entry) = table.entries.get_mut(key_hash as usize % SLOTS) {
            if entry.key_hash == key_hash {
                *entry = Entry::default();
            }
        }
    });
}

/// A flush_all is being sent: no later get may join one sent before it.
pub(crate) fn forget_all() {
    let _ = TABLE.try_with(|table| {
        for entry in &mut table.borrow_mut().entries {
            *entry = Entry::default();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_side_effect_free_single_key_retrievals_collapse() {
        for line in [
            &b"get k\r\n"[..],
            b"gets k\r\n",
            b"mg k v f c\r\n",
            b"mg k\r\n",
            b"mg k s t v k O123\r\n",
            b"mg a2V5 b v\r\n",
        ] {
            assert!(collapsible(line), "{}", String::from_utf8_lossy(line));
        }
        for line in [
            &b"get a b\r\n"[..],
            b"get k\n",
            b"get \r\n",
            b"gat 0 k\r\n",
            b"gats 0 k\r\n",
            b"touch k 0\r\n",
            b"mg k v N30\r\n",
            b"mg k v R30\r\n",
            b"mg k v T30\r\n",
            b"mg k v E5\r\n",
            b"mg k v h\r\n",
            b"mg k v l\r\n",
            b"mg k v q\r\n",
            b"mg k v I\r\n",
            b"mg\r\n",
            b"ms k 1\r\nx\r\n",
            b"md k\r\n",
            b"set k 0 0 1\r\nx\r\n",
            b"get k\r\nget k\r\n",
        ] {
            assert!(!collapsible(line), "{}", String::from_utf8_lossy(line));
        }
    }
}
