//! Collapsing: a get whose identical request is already queued or in flight on the same
//! backend connection waits for that request's reply instead of being sent again, so a
//! hot key costs its server one get per round trip per connection, not one per client.
//!
//! ```text
//!   leg_to(get K) --collapsible bytes?--> table[hash(K)]: same connection, same bytes,
//!        |                                 leader still waiting?  yes -> join (a copy of
//!        |                                 its reply: `ReplyFollow::join`), nothing sent
//!        no -> sent as ever, and becomes table[hash(K)]'s leader
//!   multi-get of `get `/`gets ` --MultiGetKeys::new (once)--> the prints of the keys
//!        whose `get K`/`gets K` waits on this worker, and of the keys hot here
//!   its key K whose print is one of them --join_key--> table[hash(K)] holds that
//!        connection's `get K`/`gets K`, still waiting? yes -> a leg of its own, its reply
//!        that get's (the merge takes K's block from it)
//!        no, and K is hot (the sampler's `is_hot`) --lead_key--> `get K` sent alone,
//!        after the batches, as table[hash(K)]'s leader (later gets and keys join it)
//!   dispatch(any write, delete, touch, mg with side effects of K) --> forget(K)
//!   dispatch(flush_all) --> forget_all
//! ```
//!
//! Exactness:
//! - only requests that ask the server the same collapse: text `get K` with `get K`,
//!   `gets K` with `gets K`, binary get/getk (which go out as `mg K v f c`) with each
//!   other, and `mg` with `mg` of the same flags in the same order but for its opaque
//!   (`O`) and key echo (`k`, unless the key is base64), which change only how the reply
//!   is shown. What memroute writes to each client (its own opaque and key echo in
//!   binary, `q`/`noreply` suppression) is rendered per client from that reply as
//!   before; an `mg` follower whose opaque or key echo differs from its leader's gets the
//!   leader's reply with the leader's `O`/`k` return flags replaced by its own, where
//!   memcached puts them (`render_echo`: in the order of its request's flags);
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
//! collapse). Its memory is allocated once, on the worker's first get (or first key led).
//!
//! A multi-get's keys cost next to nothing when none can join or lead: the slots whose
//! leader may still wait are marked (`Table::live`), so a multi-get finds the few leaders
//! waiting now once, and compares each key's print (`KeyPrint`: length, first and last
//! eight bytes) with theirs and with the hot keys' before it hashes or looks up anything.
//! With no slot marked and no hot key's print kept (uniform load, no single gets), a
//! multi-get learns so from those two and builds nothing: its keys cost a compare each.
use std::cell::RefCell;

use bytes::{BufMut, Bytes, BytesMut};
use memroute_backend::{BackendHandle, Render, ReplyFollow, ReplyReceiver};
use memroute_protocol::{Command, ReplyKind, RequestBytes};
use smallvec::SmallVec;

use crate::hot_keys::{KeyPrint, WorkerHotKeys, HOT_PRINTS};

/// Entries per worker.
const SLOTS: usize = 256;
/// Requests longer than this (bytes to the server) are never collapsed: a get line is a
/// verb, a key of at most 250 bytes and, for `mg`, a few flags.
const MAX_REQUEST: usize = 320;

/// `mg` flags that neither change the item nor report per-access state: base64 key, CAS,
/// client flags, key echo, opaque, quiet (cut from what the server gets; each client's
/// miss is suppressed for it alone), size, TTL left, no LRU bump, value.
const READ_ONLY_FLAGS: &[u8] = b"bcfkOqstuv";

/// The longest opaque memcached echoes; a longer one is its error to give, so such a
/// request only collapses with identical ones.
const MAX_OPAQUE: usize = 32;

/// One key's leader.
struct Entry {
    /// `BackendHandle::id` of the leader's connection (0: empty).
    connection: usize,
    key_hash: u64,
    /// Length of the leader's request bytes as compared (`without_echo`), the start of
    /// `line`.
    len: usize,
    /// The leader asked for an opaque or key echo: a follower renders its own.
    echo: bool,
    leader: ReplyFollow,
    /// In the entry, not an array beside the entries: one index and one check of the
    /// table's length find both.
    line: [u8; MAX_REQUEST],
}

impl Default for Entry {
    fn default() -> Entry {
        Entry {
            connection: 0,
            key_hash: 0,
            len: 0,
            echo: false,
            leader: ReplyFollow::default(),
            line: [0; MAX_REQUEST],
        }
    }
}

impl Entry {
    /// Empty again (its line is left: `len` and `connection` say it is no one's).
    fn clear(&mut self) {
        self.connection = 0;
        self.key_hash = 0;
        self.len = 0;
        self.leader = ReplyFollow::default();
    }

    /// The leader's request bytes as compared.
    fn stored(&self) -> &[u8] {
        &self.line[..self.len.min(MAX_REQUEST)]
    }
}

struct Table {
    entries: Vec<Entry>,
    /// One bit per slot whose leader may still wait: set as a leader takes the slot,
    /// cleared when a multi-get finds it answered (`waiting_gets`).
    live: [u64; SLOTS / 64],
    /// The request being looked up, copied out of its pieces (reused).
    scratch: Vec<u8>,
    /// The same, as compared (`without_echo`; reused).
    compared: Vec<u8>,
}

impl Table {
    const fn new() -> Table {
        Table {
            entries: Vec::new(),
            live: [0; SLOTS / 64],
            scratch: Vec::new(),
            compared: Vec::new(),
        }
    }

    /// The entries, as an array (a slot's index needs no bounds check), allocated on the
    /// worker's first get.
    #[inline]
    fn slots(&mut self) -> Option<&mut [Entry; SLOTS]> {
        if self.entries.len() != SLOTS {
            self.allocate();
        }
        self.entries.as_mut_slice().try_into().ok()
    }

    /// Once per worker, out of the way of every get's path.
    #[cold]
    #[inline(never)]
    fn allocate(&mut self) {
        self.entries.resize_with(SLOTS, Entry::default);
    }
}

thread_local! {
    static TABLE: RefCell<Table> = const { RefCell::new(Table::new()) };
}

/// Whether `line` (a whole request as sent to a server) may collapse: one `get`/`gets`
/// of one key, or an `mg` with read-only flags only. `key`, when the caller knows it, is
/// the key the line was written for: a `get`/`gets` of exactly that key (a parsed key
/// holds no space or line end) is one key without scanning the line, which is most of
/// what this check costs a get.
pub(crate) fn collapsible(line: &[u8], key: Option<&[u8]>) -> bool {
    let Some(body) = line.strip_suffix(b"\r\n") else {
        return false;
    };
    if let Some(rest) = body
        .strip_prefix(b"get ")
        .or_else(|| body.strip_prefix(b"gets "))
    {
        if key.is_some_and(|key| !key.is_empty() && rest == key) {
            return true;
        }
        return !rest.is_empty() && !rest.contains(&b' ') && !rest.contains(&b'\n');
    }
    if body.contains(&b'\n') {
        return false;
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

/// Copies `line` (a collapsible request) into `out` as the table compares it: an `mg`'s
/// opaque and key echo flags left out (the key echo kept for a base64 key, whose echo
/// memcached renders its own way). True when any was left out.
fn without_echo(line: &[u8], out: &mut Vec<u8>) -> bool {
    out.clear();
    let Some(rest) = line.strip_prefix(b"mg ") else {
        out.extend_from_slice(line);
        return false;
    };
    let body = rest.strip_suffix(b"\r\n").unwrap_or(rest);
    let mut tokens = body.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let key = tokens.next().unwrap_or_default();
    let base64 = body.split(|&b| b == b' ').skip(1).any(|t| t == b"b");
    out.extend_from_slice(b"mg ");
    out.extend_from_slice(key);
    let mut left_out = false;
    for flag in tokens {
        let echo = match flag[0] {
            b'O' => flag.len() <= MAX_OPAQUE + 1,
            b'k' => !base64,
            _ => false,
        };
        if echo {
            left_out = true;
        } else {
            out.push(b' ');
            out.extend_from_slice(flag);
        }
    }
    out.extend_from_slice(b"\r\n");
    left_out
}

/// A follower's copy of its leader's `mg` reply, rendered for its own `request`: the
/// leader's opaque and key echo return flags out, the follower's in, each where its
/// request names it (memcached returns flags in the order they were asked). Anything but
/// a `VA`/`HD`/`EN` reply (an error line) is as the leader got it.
fn render_echo(reply: &Bytes, request: &RequestBytes) -> Bytes {
    let Some(end) = reply.windows(2).position(|pair| pair == b"\r\n") else {
        return reply.clone();
    };
    let mut tokens = reply[..end].split(|&b| b == b' ').filter(|t| !t.is_empty());
    let code = tokens.next().unwrap_or_default();
    if !matches!(code, b"VA" | b"HD" | b"EN") {
        return reply.clone();
    }
    let mut out = BytesMut::with_capacity(reply.len() + 64);
    out.put_slice(code);
    if code == b"VA" {
        if let Some(size) = tokens.next() {
            out.put_u8(b' ');
            out.put_slice(size);
        }
    }
    let key_echo = tokens.clone().find(|t| t[0] == b'k');
    let mut leader = tokens.filter(|t| !matches!(t[0], b'O' | b'k')).peekable();
    // The request's words: `mg`, the key, its flags (the pieces around a cut `q` split
    // at spaces, so no word spans two).
    let mut words = request.pieces().flat_map(|piece| {
        let line = piece.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        line.split(|&b| b == b' ').filter(|t| !t.is_empty())
    });
    let key = words.nth(1).unwrap_or_default();
    for flag in words {
        match flag[0] {
            b'O' => {
                out.put_u8(b' ');
                out.put_slice(flag);
            }
            b'k' => {
                out.put_u8(b' ');
                match key_echo {
                    Some(echo) => out.put_slice(echo),
                    None => {
                        out.put_u8(b'k');
                        out.put_slice(key);
                    }
                }
            }
            letter => {
                if let Some(token) = leader.next_if(|t| t[0] == letter) {
                    out.put_u8(b' ');
                    out.put_slice(token);
                }
            }
        }
    }
    for token in leader {
        out.put_u8(b' ');
        out.put_slice(token);
    }
    out.put_slice(&reply[end..]);
    out.freeze()
}

/// The hash a key's entry is found by: eight bytes at a time (the last word overlapping
/// the one before it), a rotate, an xor and a multiply each, so a 14-byte key costs two
/// rounds where a byte-wise FNV took 14. Entries are compared byte for byte, so a weak
/// hash only loses chances to collapse (two keys in one slot), never mixes replies.
#[inline]
fn hash(key: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let round = |h: u64, word: u64| (h.rotate_left(5) ^ word).wrapping_mul(K);
    let word = |at: usize| {
        let bytes: [u8; 8] = key[at..at + 8].try_into().unwrap_or_default();
        u64::from_le_bytes(bytes)
    };
    let len = key.len();
    if len < 8 {
        let word = key.iter().fold(0u64, |w, &b| (w << 8) | u64::from(b));
        return round(len as u64, word);
    }
    // The first word, any whole words after it, and the last eight bytes (up to 16 bytes,
    // the common key, two loads and no loop).
    let mut h = round(len as u64, word(0));
    let mut at = 8;
    while at + 8 < len {
        h = round(h, word(at));
        at += 8;
    }
    round(h, word(len - 8))
}

/// The entry of a key's hash: the top bits, which the last multiply mixed most.
fn slot(key_hash: u64) -> usize {
    (key_hash >> (64 - SLOTS.trailing_zeros())) as usize
}

/// Whether `line` is `get K\r\n` or `gets K\r\n` of `key` as the parser leaves it: the
/// key a view of the line itself (a client's get forwarded whole), so where the key starts
/// in the line says the verb and none of its bytes needs comparing. A key held anywhere
/// else (copied, cut) is not this: such a get is looked up as any other request is
/// (`send_or_join_scanned`), to the same entry.
#[inline]
fn get_of_key(line: &[u8], key: &[u8]) -> bool {
    // Addresses as numbers: a key outside the line starts at no verb's end.
    let at = (key.as_ptr() as usize).wrapping_sub(line.as_ptr() as usize);
    let len = line.len();
    // Each verb its own arm, so its lengths are constants: the line is the verb, the key
    // and a line end, the key is not empty and the line not too long to keep; then the
    // verb's bytes need no check of the line's length.
    match at {
        4 => {
            len == key.len() + 6
                && (7..=MAX_REQUEST).contains(&len)
                && line.starts_with(b"get ")
                && line.ends_with(b"\r\n")
        }
        5 => {
            len == key.len() + 7
                && (8..=MAX_REQUEST).contains(&len)
                && line.starts_with(b"gets ")
                && line.ends_with(b"\r\n")
        }
        _ => false,
    }
}

/// Sends `parts` (a single-key request for `key`, whose reply is of `kind`) on
/// `connection` as `send(connection, parts, kind)` does, unless it is a collapsible get
/// identical to one still waiting for its reply there: then it waits for that one's reply.
/// True when it joined. A client's `get K` (most gets) is looked up as it is, without a
/// copy or a scan. `send` is a plain function of what this takes anyway: a closure over
/// them would be one more thing this path carries in registers and on the stack.
pub(crate) fn send_or_join(
    connection: &BackendHandle,
    key: &[u8],
    parts: &RequestBytes,
    kind: ReplyKind,
    send: fn(&BackendHandle, &RequestBytes, ReplyKind) -> ReplyReceiver,
) -> (ReplyReceiver, bool) {
    if !matches!(kind, ReplyKind::Retrieval | ReplyKind::MetaGet) {
        return (send(connection, parts, kind), false);
    }
    if parts.tail.is_none() && get_of_key(&parts.head, key) {
        let lookup = Lookup {
            connection: connection.id(),
            key_hash: hash(key),
            echo: false,
        };
        return TABLE.with(|table| {
            table
                .borrow_mut()
                .send_or_join(lookup, &parts.head, parts, || send(connection, parts, kind))
        });
    }
    send_or_join_scanned(connection, key, parts, kind, send)
}

/// `send_or_join` of any other request: copied out of its pieces, checked, and compared
/// without an `mg`'s echo flags. Out of line: a client's plain get never comes here, and
/// inlined, this loop's registers crowded that get's path.
#[inline(never)]
fn send_or_join_scanned(
    connection: &BackendHandle,
    key: &[u8],
    parts: &RequestBytes,
    kind: ReplyKind,
    send: fn(&BackendHandle, &RequestBytes, ReplyKind) -> ReplyReceiver,
) -> (ReplyReceiver, bool) {
    let send = || send(connection, parts, kind);
    let may = matches!(parts.pieces().next(), Some([b'g' | b'm', ..]))
        && parts.pieces().map(<[u8]>::len).sum::<usize>() <= MAX_REQUEST;
    if !may {
        return (send(), false);
    }
    TABLE.with(|table| {
        let mut table = table.borrow_mut();
        let mut scratch = std::mem::take(&mut table.scratch);
        let mut compared = std::mem::take(&mut table.compared);
        scratch.clear();
        // Once per worker: the longest line collapsed fits from then on.
        scratch.reserve(MAX_REQUEST);
        compared.reserve(MAX_REQUEST);
        for piece in parts.pieces() {
            scratch.extend_from_slice(piece);
        }
        let sent = if !collapsible(&scratch, Some(key)) {
            (send(), false)
        } else {
            // Only an `mg` can carry echo flags to leave out; any other line compares as sent.
            let (line, echo): (&[u8], bool) = if scratch.starts_with(b"mg ") {
                let echo = without_echo(&scratch, &mut compared);
                (&compared[..], echo)
            } else {
                (&scratch[..], false)
            };
            let lookup = Lookup {
                connection: connection.id(),
                key_hash: hash(key),
                echo,
            };
            table.send_or_join(lookup, line, parts, send)
        };
        (table.scratch, table.compared) = (scratch, compared);
        sent
    })
}

/// Leaders' keys a multi-get keeps as prints; more waiting leaders look every key up.
const WAITING_PRINTS: usize = 4;

/// What a multi-get's `get `/`gets ` keys may do, found once per multi-get
/// (`MultiGetKeys::new`): the prints of the keys whose single-key get of the same verb
/// waits on some connection of this worker, and of the keys lately found hot.
pub(crate) struct MultiGetKeys {
    /// The batch lines' start: `get ` or `gets `.
    head: &'static [u8],
    waiting: SmallVec<[KeyPrint; WAITING_PRINTS]>,
    /// More leaders wait than `waiting` holds: every key may join.
    every: bool,
    hot: SmallVec<[KeyPrint; HOT_PRINTS]>,
}

/// What one key of a multi-get may do (`MultiGetKeys::chance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chance {
    /// Its print is a waiting leader's: look it up (`join_key`).
    pub(crate) join: bool,
    /// Its print is a hot key's: ask the sampler (`is_hot`), then lead (`lead_key`).
    pub(crate) lead: bool,
}

impl MultiGetKeys {
    /// For a multi-get whose batch lines start with `head`, on a worker whose hot keys
    /// `hot_keys` has found. `None` when no key can join or lead (another verb, no get
    /// waiting, no hot key): then its keys cost nothing here. Most multi-gets are that, and
    /// learn it from two loads (any print kept, any slot marked), before anything is built.
    #[inline(always)]
    pub(crate) fn new(head: &[u8], hot_keys: &WorkerHotKeys) -> Option<MultiGetKeys> {
        let head: &'static [u8] = match head {
            b"get " => b"get ",
            b"gets " => b"gets ",
            _ => return None,
        };
        let live = TABLE
            .try_with(|table| table.borrow().any_live())
            .unwrap_or(false);
        match live || hot_keys.any_hot_prints() {
            true => MultiGetKeys::found(head, hot_keys),
            false => None,
        }
    }

    /// `new`'s finding once a get may wait or a key is hot: the prints of the gets still
    /// waiting and of the hot keys.
    #[inline(never)]
    fn found(head: &'static [u8], hot_keys: &WorkerHotKeys) -> Option<MultiGetKeys> {
        let mut keys = MultiGetKeys {
            head,
            waiting: SmallVec::new(),
            every: false,
            hot: SmallVec::new(),
        };
        hot_keys.hot_prints(&mut keys.hot);
        keys.every = TABLE
            .try_with(|table| table.borrow_mut().waiting_gets(head, &mut keys.waiting))
            .unwrap_or(false);
        match keys.waiting.is_empty() && !keys.every && keys.hot.is_empty() {
            true => None,
            false => Some(keys),
        }
    }

    /// What `key` may do; most keys: nothing (no print matches).
    #[inline]
    pub(crate) fn chance(&self, key: &[u8]) -> Chance {
        let print = KeyPrint::of(key);
        Chance {
            join: self.every || self.waiting.contains(&print),
            lead: self.hot.contains(&print),
        }
    }

    /// The batch lines' start, `get ` or `gets `.
    pub(crate) fn head(&self) -> &'static [u8] {
        self.head
    }
}

impl Table {
    /// Whether any slot's leader may still wait (`live`).
    #[inline]
    fn any_live(&self) -> bool {
        self.live != [0; SLOTS / 64]
    }

    /// Appends to `out` the prints of the keys whose get of `head`'s verb (`get K` for
    /// `get `) still waits, clearing the marks of the slots whose leader was answered. True
    /// when more wait than `out` holds.
    fn waiting_gets(
        &mut self,
        head: &[u8],
        out: &mut SmallVec<[KeyPrint; WAITING_PRINTS]>,
    ) -> bool {
        let mut every = false;
        for (word, live) in self.live.iter_mut().enumerate() {
            let mut bits = *live;
            while bits != 0 {
                let bit = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let slot = word * 64 + bit;
                let Some(entry) = self.entries.get(slot) else {
                    continue;
                };
                if !entry.leader.waiting() {
                    *live &= !(1 << bit);
                    continue;
                }
                let key = entry
                    .stored()
                    .strip_prefix(head)
                    .and_then(|rest| rest.strip_suffix(b"\r\n"));
                match key {
                    Some(_) if out.len() == WAITING_PRINTS => every = true,
                    Some(key) => out.push(KeyPrint::of(key)),
                    None => {}
                }
            }
        }
        every
    }
}

/// A multi-get's `key`, on its way to `connection` in a batch line starting with `head`:
/// the reply of a single-key get still waiting there that asks the server exactly what
/// this key would alone (`get K` for `get `, `gets K` for `gets `), or `None`. Asked only
/// of a key whose `MultiGetKeys::chance` says it may join.
pub(crate) fn join_key(
    connection: &BackendHandle,
    head: &[u8],
    key: &[u8],
) -> Option<ReplyReceiver> {
    if head.len() + key.len() + 2 > MAX_REQUEST {
        return None;
    }
    let key_hash = hash(key);
    let table = TABLE.try_with(|table| {
        let table = table.borrow();
        let slot = slot(key_hash);
        let entry = table.entries.get(slot)?;
        if entry.key_hash != key_hash
            || entry.connection != connection.id()
            || entry.len != head.len() + key.len() + 2
        {
            return None;
        }
        let (verb, rest) = entry.stored().split_at(head.len());
        if verb != head || !rest.starts_with(key) || !rest.ends_with(b"\r\n") {
            return None;
        }
        entry.leader.join()
    });
    table.ok().flatten()
}

/// A hot multi-get `key` that joined nothing (`join_key`), sent alone to `connection` as
/// `get K` (`gets K` for `head` `gets `) once its multi-get's batch lines are sent, as that
/// connection's leader of K: later gets of K, and later multi-gets' copies of it, join it.
/// Should a get of K have become the leader meanwhile (the same multi-get asked for K
/// twice), the key joins it instead. True when it joined.
pub(crate) fn lead_key(
    connection: &BackendHandle,
    head: &[u8],
    key: &[u8],
) -> (ReplyReceiver, bool) {
    let send = || {
        let mut request = connection.writer();
        request.append(head);
        request.append(key);
        request.append(b"\r\n");
        request.finish(ReplyKind::Retrieval)
    };
    if head.len() + key.len() + 2 > MAX_REQUEST {
        return (send(), false);
    }
    let lookup = Lookup {
        connection: connection.id(),
        key_hash: hash(key),
        echo: false,
    };
    // Only an echo render reads the request's bytes, and a `get` has none: no copy.
    let parts = RequestBytes::whole(Bytes::new());
    TABLE.with(|table| {
        let mut table = table.borrow_mut();
        let mut line = std::mem::take(&mut table.scratch);
        line.clear();
        line.reserve(MAX_REQUEST);
        line.extend_from_slice(head);
        line.extend_from_slice(key);
        line.extend_from_slice(b"\r\n");
        let sent = table.send_or_join(lookup, &line, &parts, send);
        table.scratch = line;
        sent
    })
}

/// What a request is looked up by, beside its bytes as compared.
struct Lookup {
    /// `BackendHandle::id` of its connection.
    connection: usize,
    key_hash: u64,
    /// Its echo flags were left out of the bytes compared.
    echo: bool,
}

impl Table {
    /// Joins the leader of `lookup`'s entry when it asked the same (`compared`, the
    /// request's bytes as compared) on the same connection and still waits; otherwise
    /// sends and becomes the entry's leader. A leader replacing an equal one (a hot key's
    /// next round trip) keeps its bytes, already there. The entry is written before the
    /// request is sent (nothing sending does looks at the table), so that the request's
    /// bytes need not be kept across the call.
    #[inline(always)]
    fn send_or_join(
        &mut self,
        lookup: Lookup,
        compared: &[u8],
        parts: &RequestBytes,
        send: impl FnOnce() -> ReplyReceiver,
    ) -> (ReplyReceiver, bool) {
        let slot = slot(lookup.key_hash);
        // Marked first (a joiner finds it marked already): `slots` holds the table after.
        self.live[slot / 64] |= 1 << (slot % 64);
        let Some(entries) = self.slots() else {
            return (send(), false);
        };
        let entry = &mut entries[slot];
        let same = entry.connection == lookup.connection
            && entry.key_hash == lookup.key_hash
            && entry.stored() == compared;
        if same {
            let render = (lookup.echo || entry.echo).then(|| Render {
                render: render_echo,
                request: parts.clone(),
            });
            if let Some(receiver) = entry.leader.join_rendered(render) {
                return (receiver, true);
            }
        }
        if !same {
            copy_line(&mut entry.line, compared);
            entry.connection = lookup.connection;
            entry.key_hash = lookup.key_hash;
            entry.len = compared.len();
        }
        entry.echo = lookup.echo;
        let receiver = send();
        entry.leader = receiver.follow();
        (receiver, false)
    }
}

/// Copies `line` (at most `MAX_REQUEST` bytes) to the start of `stored`. A line of 8 to
/// 32 bytes (a get of a key of up to 26 bytes: most) in two overlapping moves of 8 or 16
/// bytes, inline: the call to memcpy cost more than the copy.
#[inline(always)]
fn copy_line(stored: &mut [u8], line: &[u8]) {
    let len = line.len();
    if (16..=32).contains(&len) && stored.len() >= 32 {
        stored[..16].copy_from_slice(&line[..16]);
        stored[len - 16..len].copy_from_slice(&line[len - 16..]);
    } else if (8..16).contains(&len) && stored.len() >= 16 {
        stored[..8].copy_from_slice(&line[..8]);
        stored[len - 8..len].copy_from_slice(&line[len - 8..]);
    } else if let Some(to) = stored.get_mut(..len) {
        to.copy_from_slice(line);
    }
}

/// A request that may change `key` is being sent: no later get of `key` may join a get
/// sent before it.
pub(crate) fn forget(key: &[u8]) {
    let key_hash = hash(key);
    let _ = TABLE.try_with(|table| {
        let mut table = table.borrow_mut();
        if let Some(entry) = table.entries.get_mut(slot(key_hash)) {
            if entry.key_hash == key_hash {
                entry.clear();
            }
        }
    });
}

/// A flush_all is being sent: no later get may join one sent before it.
pub(crate) fn forget_all() {
    let _ = TABLE.try_with(|table| {
        for entry in &mut table.borrow_mut().entries {
            entry.clear();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compared(line: &[u8]) -> (String, bool) {
        let mut out = Vec::new();
        let echo = without_echo(line, &mut out);
        (String::from_utf8(out).expect("text"), echo)
    }

    #[test]
    fn an_mg_is_compared_without_its_opaque_and_key_echo() {
        assert_eq!(compared(b"get k\r\n"), ("get k\r\n".into(), false));
        assert_eq!(compared(b"mg k v f\r\n"), ("mg k v f\r\n".into(), false));
        assert_eq!(
            compared(b"mg k v O12 k t\r\n"),
            ("mg k v t\r\n".into(), true)
        );
        assert_eq!(
            compared(b"mg O1 O2\r\n"),
            ("mg O1\r\n".into(), true),
            "a key named O1"
        );
        assert_eq!(
            compared(b"mg k k\r\n"),
            ("mg k\r\n".into(), true),
            "a key named k"
        );
        // A base64 key's echo is the server's to render; a too long opaque its error.
        assert_eq!(
            compared(b"mg a2V5 b k v\r\n"),
            ("mg a2V5 b k v\r\n".into(), false)
        );
        let long = format!("mg k v O{}\r\n", "x".repeat(33));
        assert_eq!(compared(long.as_bytes()), (long.clone(), false));
    }

    fn rendered(reply: &'static [u8], request: &'static [u8]) -> String {
        let request = RequestBytes::whole(Bytes::from_static(request));
        let out = render_echo(&Bytes::from_static(reply), &request);
        String::from_utf8(out.to_vec()).expect("text")
    }

    #[test]
    fn a_follower_gets_its_own_opaque_and_key_echo_where_memcached_puts_them() {
        // As memcached 1.6.18 answers `mg foo v O12 k t f c`, `mg nope v O12 k t`.
        let leader = b"VA 3 O12 kfoo t-1 f5 c1\r\nbar\r\n";
        assert_eq!(
            rendered(leader, b"mg foo v t f c\r\n"),
            "VA 3 t-1 f5 c1\r\nbar\r\n"
        );
        assert_eq!(
            rendered(leader, b"mg foo k t O9 v f c\r\n"),
            "VA 3 kfoo t-1 O9 f5 c1\r\nbar\r\n"
        );
        assert_eq!(
            rendered(b"VA 3 t-1\r\nbar\r\n", b"mg foo v t k O1\r\n"),
            "VA 3 t-1 kfoo O1\r\nbar\r\n"
        );
        assert_eq!(
            rendered(b"EN O12 knope\r\n", b"mg nope v O7 t\r\n"),
            "EN O7\r\n"
        );
        assert_eq!(
            rendered(b"EN\r\n", b"mg nope v k O7\r\n"),
            "EN knope O7\r\n"
        );
        assert_eq!(rendered(b"HD O5\r\n", b"mg foo\r\n"), "HD\r\n");
        // A `q` cut out of the request leaves two pieces.
        let request = RequestBytes {
            head: Bytes::from_static(b"mg foo v "),
            tail: Some(Bytes::from_static(b" O3\r\n")),
        };
        let out = render_echo(&Bytes::from_static(b"VA 3\r\nbar\r\n"), &request);
        assert_eq!(&out[..], b"VA 3 O3\r\nbar\r\n");
        assert_eq!(
            rendered(b"SERVER_ERROR out of memory\r\n", b"mg foo v O1\r\n"),
            "SERVER_ERROR out of memory\r\n"
        );
    }

    #[test]
    fn only_side_effect_free_single_key_retrievals_collapse() {
        for line in [
            &b"get k\r\n"[..],
            b"gets k\r\n",
            b"mg k v f c\r\n",
            b"mg k\r\n",
            b"mg k s t v k O123\r\n",
            b"mg a2V5 b v\r\n",
            b"mg k v q\r\n",
        ] {
            assert!(collapsible(line, None), "{}", String::from_utf8_lossy(line));
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
            b"mg k v I\r\n",
            b"mg\r\n",
            b"ms k 1\r\nx\r\n",
            b"md k\r\n",
            b"set k 0 0 1\r\nx\r\n",
            b"get k\r\nget k\r\n",
        ] {
            assert!(
                !collapsible(line, None),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn a_clients_get_of_its_key_is_looked_up_as_it_is() {
        // The key as the parser leaves it: a view of the line, no compare needed.
        let of = |line: &'static [u8], key: std::ops::Range<usize>| get_of_key(line, &line[key]);
        assert!(of(b"get bench:00000042\r\n", 4..18));
        assert!(of(b"get k\r\n", 4..5));
        assert!(of(b"gets k\r\n", 5..6));
        let cases: [(&'static [u8], std::ops::Range<usize>); 10] = [
            (b"get /a/k\r\n", 7..8),
            (b"get a b\r\n", 4..5),
            (b"get k\r\nget k\r\n", 4..5),
            (b"get \r\n", 4..4),
            (b"gat k\r\n", 4..5),
            (b"getx k\r\n", 5..6),
            (b"get kk\n", 4..6),
            (b"get k \n", 4..5),
            (b"mg k v\r\n", 3..4),
            (b"gets k\r\n", 4..6),
        ];
        for (line, key) in cases {
            assert!(!of(line, key), "{}", String::from_utf8_lossy(line));
        }
        // A key held elsewhere is no view of the line: such a get takes the scanned
        // lookup, where it is the same collapsible line.
        assert!(!get_of_key(b"get k\r\n", b"k"));
        assert!(collapsible(b"get k\r\n", Some(b"k")));
    }

    #[test]
    fn a_line_is_copied_whole_at_every_length() {
        let line: Vec<u8> = (0..MAX_REQUEST).map(|i| (i % 251) as u8 + 1).collect();
        for len in 0..=MAX_REQUEST {
            let mut stored = [0u8; MAX_REQUEST];
            copy_line(&mut stored, &line[..len]);
            assert_eq!(&stored[..len], &line[..len], "{len} bytes");
            assert!(
                stored[len..].iter().all(|&b| b == 0),
                "{len} bytes: nothing after"
            );
        }
    }

    #[test]
    fn keys_spread_over_the_slots() {
        // Short keys, keys of whole words, keys with a word left over, keys that differ
        // only at their start or their middle.
        let mut used = [false; SLOTS];
        for i in 0..4096 {
            for key in [
                format!("{i}"),
                format!("bench:{i:08}"),
                format!("user:{i:06}:profile:v2"),
            ] {
                used[slot(hash(key.as_bytes()))] = true;
            }
        }
        assert!(used.iter().all(|&u| u), "every slot is reached");
        assert_ne!(hash(b"ab"), hash(b"ba"));
        assert_ne!(hash(b"a"), hash(b"\0a"), "the length counts");
        assert_ne!(hash(b"abcdefgh1"), hash(b"abcdefgh2"));
    }

    #[test]
    fn a_multi_get_builds_nothing_while_no_get_waits_and_no_key_is_hot() {
        use crate::hot_keys::{HotKeyRegistry, Settings};
        let registry = HotKeyRegistry::default();
        registry.set_settings(Settings {
            sample_every: 1,
            interval: std::time::Duration::from_secs(3600),
            show_keys: true,
        });
        let worker = registry.worker(5);
        // A fresh worker thread: no slot marked, no print kept.
        assert!(MultiGetKeys::new(b"get ", &worker).is_none());
        worker.observe("p", b"hot", 0);
        worker.observe("p", b"hot", 0);
        let keys = MultiGetKeys::new(b"get ", &worker).expect("a key is hot");
        let hot = Chance {
            join: false,
            lead: true,
        };
        assert_eq!(keys.chance(b"hot"), hot);
        assert_eq!(
            keys.chance(b"cold"),
            Chance {
                join: false,
                lead: false
            }
        );
        assert!(
            MultiGetKeys::new(b"gat ", &worker).is_none(),
            "gat keys never"
        );
    }

    #[test]
    fn a_get_of_its_own_key_is_one_key_and_anything_else_is_scanned() {
        assert!(collapsible(b"get k\r\n", Some(b"k")));
        assert!(collapsible(b"gets k\r\n", Some(b"k")));
        // A key the line was not written for (a routing prefix cut from it): scanned.
        assert!(collapsible(b"get k\r\n", Some(b"/a/b/k")));
        assert!(!collapsible(b"get a b\r\n", Some(b"a")));
        assert!(!collapsible(b"get k\r\nget k\r\n", Some(b"k")));
        assert!(!collapsible(b"get \r\n", Some(b"")));
    }
}
