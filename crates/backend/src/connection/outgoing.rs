//! The requests a connection's handles queue and its writer takes: one outgoing buffer,
//! and the gets joined into one command on their way in.
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

use bytes::BytesMut;
use memroute_protocol::ReplyKind;

use crate::reply::ReplySender;
use crate::BackendError;

use super::notify::LocalNotify;

/// A request written into the outgoing buffer whose bytes the writer has not taken yet.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) kind: ReplyKind,
    pub(super) reply: ReplySender,
    pub(super) run: RunPart,
}

/// A request's place in a run of coalesced gets (one command on the wire, one reply to
/// split back per request).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RunPart {
    /// On a run's first request: how many requests share its command (1: not coalesced).
    /// 0 on the others.
    pub(super) legs: u32,
    /// How many bytes of the key journal are this request's keys, as they were written
    /// (space-separated); 0 when the request is not part of a run of two or more.
    pub(super) keys: u32,
}

impl RunPart {
    pub(super) const SINGLE: RunPart = RunPart { legs: 1, keys: 0 };
}

/// The run of coalescable gets at the end of the outgoing buffer, which the next `get`
/// (or `gets`) may join.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    gets: bool,
    /// Where the run's command line starts in the outgoing buffer, and where its first
    /// key starts.
    line_start: usize,
    keys_start: usize,
    /// Where the line ends (after its `\r\n`): the next request joins only if it starts
    /// right there.
    line_end: usize,
    /// The run's first request in `queued`.
    head: usize,
    legs: u32,
    /// At most this many keys in the command so far.
    keys: u32,
}

/// A coalesced command line is kept under memcached's short-line size, so memcached reads
/// it as it reads any short line rather than on its slower large-multiget path.
pub(super) const MAX_COALESCED_LINE: usize = memroute_protocol::MAX_SHORT_LINE;

/// When `request` is one `get`/`gets` line ending in `\r\n`: whether it is `gets`, and
/// where its keys start. A frame that ends in a bare `\n` (or, from a caller's bug, holds
/// another line) is sent as it came.
pub(super) fn coalescable(request: &[u8]) -> Option<(bool, usize)> {
    memroute_protocol::single_get_line(request)
}

/// The number of keys in a line's space-separated key text, or more when keys are
/// separated by several spaces (a bound, for `coalesce_keys`).
pub(super) fn keys_at_most(keys: &[u8]) -> usize {
    match memchr::memchr(b' ', keys) {
        // A single-key get, the usual request sent whole: no count needed.
        None => 1,
        Some(first) => keys[first..].iter().filter(|&&b| b == b' ').count() + 1,
    }
}

/// What the handles of one connection (every session of its worker) share with its task.
/// One thread: plain cells, and no borrow is ever held across an `.await`.
#[derive(Default)]
pub(super) struct Shared {
    /// Requests not written yet, back to back, exactly as they go on the wire. Sessions
    /// append to it; the writer swaps it for its own (empty) buffer and writes that, so
    /// two buffers take turns and steady traffic allocates nothing.
    pub(super) outgoing: RefCell<BytesMut>,
    /// The reply kind and slot of each request in `outgoing`, in the same order.
    pub(super) queued: RefCell<VecDeque<Queued>>,
    /// A `RequestWriter` is appending a request: the writer leaves `outgoing` alone until
    /// it is finished, and nothing else may be queued meanwhile.
    pub(super) open: Cell<bool>,
    /// Wakes the connection task: requests were queued, or the last handle went.
    pub(super) wake: LocalNotify,
    /// Live `BackendHandle`s; at 0 the task ends.
    pub(super) handles: Cell<usize>,
    /// Set between connections (connect failed, connection lost, waiting out the
    /// backoff): requests fail at once with this reason instead of queueing.
    pub(super) not_connected: RefCell<Option<Arc<str>>>,
    /// `ConnectionSettings::coalesce_keys`.
    pub(super) coalesce_keys: usize,
    /// The run of gets the next `get` may join.
    pub(super) run: Cell<Option<Run>>,
    /// The keys of every queued request that is part of a run (each a length byte and its
    /// bytes, in queue order): what splits the run's reply back per request.
    pub(super) run_keys: RefCell<BytesMut>,
}

impl Shared {
    /// Queues a request whose bytes are `outgoing[start..]`.
    ///
    /// Coalescing: a `get` that comes right after a `get` (a `gets` after a `gets`) joins
    /// its command line, so memcached gets `get a b c` once instead of `get a b` and
    /// `get c`: memcached spends about 2 µs per key on 5-key gets and 0.6 µs per key on
    /// 50-key gets (one lookup pass, one response, one send instead of one per command).
    /// Its one reply (VALUE blocks in key order, misses absent, one END) is split back
    /// per request by the reader, which matches VALUE keys against the journaled keys in
    /// order. Anything else queued in between ends the run, so the order of requests on
    /// the wire is unchanged.
    ///
    /// `keys` is how many keys the request's writer counted (0: not counted, so they are
    /// counted here from its line if it may join a run).
    pub(super) fn queue(&self, kind: ReplyKind, reply: ReplySender, start: usize, keys: u32) {
        let mut queued = self.queued.borrow_mut();
        let mut outgoing = self.outgoing.borrow_mut();
        let candidate = match kind {
            ReplyKind::Retrieval if self.coalesce_keys > 1 => {
                coalescable(outgoing.get(start..).unwrap_or_default())
            }
            _ => None,
        };
        let Some((gets, keys_at)) = candidate else {
            self.run.set(None);
            queued.push_back(Queued {
                kind,
                reply,
                run: RunPart::SINGLE,
            });
            return;
        };
        let end = outgoing.len();
        if let Some(mut run) = self
            .run
            .get()
            .filter(|run| run.gets == gets && run.line_end == start)
        {
            let head_keys = start - 2 - run.keys_start;
            let count = run.keys as usize
                + match keys {
                    0 => keys_at_most(&outgoing[start + keys_at..end - 2]),
                    counted => counted as usize,
                };
            let keys = end - 2 - (start + keys_at);
            // The line loses this request's `\r\n` and verb; it keeps the space.
            let line = end - run.line_start - (2 + keys_at - 1);
            if count <= self.coalesce_keys && line <= MAX_COALESCED_LINE {
                let mut journal = self.run_keys.borrow_mut();
                if let Some(head) = queued.get_mut(run.head) {
                    if run.legs == 1 {
                        journal.extend_from_slice(&outgoing[run.keys_start..start - 2]);
                        head.run.keys = head_keys as u32;
                    }
                    head.run.legs += 1;
                }
                journal.extend_from_slice(&outgoing[start + keys_at..end - 2]);
                let cut = start - 2..start + keys_at - 1;
                outgoing.copy_within(cut.end.., cut.start);
                outgoing.truncate(end - cut.len());
                run.legs += 1;
                run.keys = count as u32;
                run.line_end = outgoing.len();
                self.run.set(Some(run));
                queued.push_back(Queued {
                    kind,
                    reply,
                    run: RunPart {
                        legs: 0,
                        keys: keys as u32,
                    },
                });
                return;
            }
        }
        queued.push_back(Queued {
            kind,
            reply,
            run: RunPart::SINGLE,
        });
        self.run.set(Some(Run {
            gets,
            line_start: start,
            keys_start: start + keys_at,
            line_end: end,
            head: queued.len() - 1,
            legs: 1,
            keys: match keys {
                0 => keys_at_most(&outgoing[start + keys_at..end - 2]) as u32,
                counted => counted,
            },
        }));
    }

    /// Fails every queued, unwritten request with `error()` and drops their bytes.
    pub(super) fn fail_queued(&self, error: impl Fn() -> BackendError) {
        self.outgoing.borrow_mut().clear();
        self.run.set(None);
        self.run_keys.borrow_mut().clear();
        loop {
            // Popped in a borrow of its own: answering wakes a session, never re-enters.
            let Some(queued) = self.queued.borrow_mut().pop_front() else {
                break;
            };
            queued.reply.send(Err(error()));
        }
    }
}
