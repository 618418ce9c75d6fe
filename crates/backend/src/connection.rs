//! One pipelined connection to one memcached server, owned by one worker thread.
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use memroute_net::{Connector, NetError, Stream};
use memroute_protocol::{
    parse_reply_counting, parse_retrieval_blocks, retrieval_error, Limits, ReplyKind, ReplyParse,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, MissedTickBehavior};

use crate::reply::{reply_slot, ReplyReceiver, ReplySender};
use crate::{BackendError, ServerHealth};

/// How one connection behaves; built from the pool's config.
#[derive(Debug, Clone)]
pub struct ConnectionSettings {
    /// `host:port` of the server.
    pub address: Arc<str>,
    /// How to reach it (TCP Fast Open, TLS and its session store), shared by every
    /// worker's connections to the server and by its prober.
    pub connector: Arc<Connector>,
    /// A reply must start arriving within this long, or the connection is broken.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// First reconnect delay after a failure; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Limits used to frame replies (value size).
    pub limits: Limits,
    /// The server's health, shared with every other connection to it (all workers) and
    /// its prober: this connection reports failures and successes to it, and fails
    /// requests fast while it says the server is down.
    pub health: Arc<ServerHealth>,
    /// Told the time from writing each request to reading its reply (metrics).
    pub round_trips: Option<RoundTrips>,
    /// Consecutive `get`s (or `gets`) queued between two writes go out as one command of
    /// at most this many keys (the pool's `max_keys_per_request`); 0 or 1 sends every
    /// request as it came (`coalesce_gets = false`). See [`coalesce`](Shared::queue).
    pub coalesce_keys: usize,
}

/// Where a connection reports each request's round trip (write to reply read). The
/// connection task and its observer live on one worker thread, so no atomics are needed.
#[derive(Clone)]
pub struct RoundTrips(std::rc::Rc<dyn Fn(Duration)>);

impl RoundTrips {
    pub fn new(observe: impl Fn(Duration) + 'static) -> RoundTrips {
        RoundTrips(std::rc::Rc::new(observe))
    }
}

impl std::fmt::Debug for RoundTrips {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoundTrips")
    }
}

/// First reconnect delay after a connection broke while its server is not marked down.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Reconnect delays double up to this. Kept low: a server that is not marked down is one
/// that may well answer again now, and its requests fail while this connection waits.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// While the server is marked down, its prober (one per server for the whole process) is
/// what finds it back and wakes every connection at once; connections themselves retry
/// only this rarely, as a safety net, so a down server sees the prober's bounded, jittered
/// rate rather than one connect per connection per backoff from every worker.
const DOWN_RETRY: Duration = Duration::from_secs(30);

/// A request written into the outgoing buffer whose bytes the writer has not taken yet.
#[derive(Debug)]
struct Queued {
    kind: ReplyKind,
    reply: ReplySender,
    run: RunPart,
}

/// A request written to the server whose reply has not been read yet.
#[derive(Debug)]
struct InFlight {
    kind: ReplyKind,
    reply: ReplySender,
    sent_at: Instant,
    run: RunPart,
}

/// A request's place in a run of coalesced gets (one command on the wire, one reply to
/// split back per request).
#[derive(Debug, Clone, Copy, Default)]
struct RunPart {
    /// On a run's first request: how many requests share its command (1: not coalesced).
    /// 0 on the others.
    legs: u32,
    /// How many bytes of the key journal are this request's keys, as they were written
    /// (space-separated); 0 when the request is not part of a run of two or more.
    keys: u32,
}

impl RunPart {
    const SINGLE: RunPart = RunPart { legs: 1, keys: 0 };
}

/// The run of coalescable gets at the end of the outgoing buffer, which the next `get`
/// (or `gets`) may join.
#[derive(Debug, Clone, Copy)]
struct Run {
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
const MAX_COALESCED_LINE: usize = memroute_protocol::MAX_SHORT_LINE;

/// When `request` is one `get`/`gets` line ending in `\r\n`: whether it is `gets`, and
/// where its keys start. A frame that ends in a bare `\n` (or, from a caller's bug, holds
/// another line) is sent as it came.
fn coalescable(request: &[u8]) -> Option<(bool, usize)> {
    memroute_protocol::single_get_line(request)
}

/// The number of keys in a line's space-separated key text, or more when keys are
/// separated by several spaces (a bound, for `coalesce_keys`).
fn keys_at_most(keys: &[u8]) -> usize {
    match memchr::memchr(b' ', keys) {
        // A single-key get, the usual request sent whole: no count needed.
        None => 1,
        Some(first) => keys[first..].iter().filter(|&&b| b == b' ').count() + 1,
    }
}

/// The keys of a key-journal entry (space-separated key text), in order.
fn journal_keys(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    memchr::memchr_iter(b' ', text)
        .chain(std::iter::once(text.len()))
        .filter_map(move |end| {
            let key = &text[start..end];
            start = end + 1;
            (!key.is_empty()).then_some(key)
        })
}

/// What the handles of one connection (every session of its worker) share with its task.
/// One thread: plain cells, and no borrow is ever held across an `.await`.
#[derive(Default)]
struct Shared {
    /// Requests not written yet, back to back, exactly as they go on the wire. Sessions
    /// append to it; the writer swaps it for its own (empty) buffer and writes that, so
    /// two buffers take turns and steady traffic allocates nothing.
    outgoing: RefCell<BytesMut>,
    /// The reply kind and slot of each request in `outgoing`, in the same order.
    queued: RefCell<VecDeque<Queued>>,
    /// A `RequestWriter` is appending a request: the writer leaves `outgoing` alone until
    /// it is finished, and nothing else may be queued meanwhile.
    open: Cell<bool>,
    /// Wakes the connection task: requests were queued, or the last handle went.
    wake: LocalNotify,
    /// Live `BackendHandle`s; at 0 the task ends.
    handles: Cell<usize>,
    /// Set between connections (connect failed, connection lost, waiting out the
    /// backoff): requests fail at once with this reason instead of queueing.
    not_connected: RefCell<Option<Arc<str>>>,
    /// `ConnectionSettings::coalesce_keys`.
    coalesce_keys: usize,
    /// The run of gets the next `get` may join.
    run: Cell<Option<Run>>,
    /// The keys of every queued request that is part of a run (each a length byte and its
    /// bytes, in queue order): what splits the run's reply back per request.
    run_keys: RefCell<BytesMut>,
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
    fn queue(&self, kind: ReplyKind, reply: ReplySender, start: usize, keys: u32) {
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
    fn fail_queued(&self, error: impl Fn() -> BackendError) {
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

/// A single-thread `Notify` for one waiting task: a flag and the task's waker.
#[derive(Default)]
struct LocalNotify {
    notified: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl LocalNotify {
    fn notify(&self) {
        self.notified.set(true);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Completes once `notify` was called since the last completion.
    fn notified(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |context| {
            if self.notified.replace(false) {
                return Poll::Ready(());
            }
            let waker = match self.waker.take() {
                Some(waker) if waker.will_wake(context.waker()) => waker,
                _ => context.waker().clone(),
            };
            self.waker.set(Some(waker));
            Poll::Pending
        })
    }
}

/// The sending side of a connection, cloned into every session of the worker (it is not
/// `Send`: a connection belongs to its worker thread).
pub struct BackendHandle {
    shared: Rc<Shared>,
    address: Arc<str>,
    health: Arc<ServerHealth>,
}

impl Clone for BackendHandle {
    fn clone(&self) -> BackendHandle {
        self.shared.handles.set(self.shared.handles.get() + 1);
        BackendHandle {
            shared: self.shared.clone(),
            address: self.address.clone(),
            health: self.health.clone(),
        }
    }
}

impl Drop for BackendHandle {
    fn drop(&mut self) {
        let handles = self.shared.handles.get().saturating_sub(1);
        self.shared.handles.set(handles);
        if handles == 0 {
            self.shared.wake.notify();
        }
    }
}

impl std::fmt::Debug for BackendHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendHandle")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl BackendHandle {
    /// Queues a request (a frame, possibly in two pieces: a `noreply` token cut out); its
    /// reply (or the reason there is none) arrives on the receiver.
    pub fn send(&self, parts: (Bytes, Option<Bytes>), kind: ReplyKind) -> ReplyReceiver {
        let mut request = self.writer();
        request.append(&parts.0);
        if let Some(rest) = &parts.1 {
            request.append(rest);
        }
        request.finish(kind)
    }

    /// Queues a request whose bytes `write` appends to the connection's outgoing buffer
    /// (nothing else may be sent on this handle from inside `write`).
    pub fn send_with(&self, kind: ReplyKind, write: impl FnOnce(&mut BytesMut)) -> ReplyReceiver {
        let mut request = self.writer();
        if let Some(outgoing) = request.outgoing() {
            write(&mut outgoing.borrow_mut());
        }
        request.finish(kind)
    }

    /// Starts a request written piece by piece straight into the connection's outgoing
    /// buffer (a multi-get appends its keys as it routes them). Until it is finished or
    /// dropped nothing else may be sent on this handle; the writer will not take a
    /// request half written. Sending again meanwhile fails that other request (with
    /// `Closed`: a bug in the caller, never interleaved bytes on the wire).
    pub fn writer(&self) -> RequestWriter<'_> {
        let refused = match () {
            _ if self.health.is_down() => Some(self.down_error()),
            _ if self.shared.open.get() => Some(BackendError::Closed {
                server: self.address.clone(),
            }),
            _ => self.shared.not_connected.borrow().as_ref().map(|reason| {
                BackendError::NotConnected {
                    server: self.address.clone(),
                    reason: reason.clone(),
                }
            }),
        };
        let start = match refused {
            Some(_) => 0,
            None => {
                self.shared.open.set(true);
                self.shared.outgoing.borrow().len()
            }
        };
        RequestWriter {
            shared: &self.shared,
            refused,
            start,
            keys: 0,
            finished: false,
        }
    }

    pub fn address(&self) -> &Arc<str> {
        &self.address
    }

    pub fn health(&self) -> &Arc<ServerHealth> {
        &self.health
    }

    fn down_error(&self) -> BackendError {
        down_error(&self.address, &self.health)
    }
}

/// One request being appended to a connection's outgoing buffer; see
/// [`BackendHandle::writer`]. Dropped unfinished, its bytes are taken back out.
pub struct RequestWriter<'a> {
    shared: &'a Shared,
    /// Why the request fails at once (server down, no connection): appends are dropped
    /// and `finish` returns this error.
    refused: Option<BackendError>,
    /// Where this request's bytes start in the outgoing buffer.
    start: usize,
    /// Keys appended with `append_key`/`append_word` (a multi-get's), so a coalesced
    /// command's key count needs no scan of its line.
    keys: u32,
    finished: bool,
}

impl std::fmt::Debug for RequestWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestWriter")
            .field("refused", &self.refused)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl RequestWriter<'_> {
    /// Appends bytes of the request.
    #[inline]
    pub fn append(&mut self, bytes: &[u8]) {
        if self.refused.is_none() {
            self.shared.outgoing.borrow_mut().extend_from_slice(bytes);
        }
    }

    /// Appends a retrieval's first key (after its verb and space), counting it.
    #[inline]
    pub fn append_key(&mut self, key: &[u8]) {
        self.keys += 1;
        self.append(key);
    }

    /// Appends a space and `word` (a multi-get's next key, counted): one borrow, one
    /// reserve.
    #[inline]
    pub fn append_word(&mut self, word: &[u8]) {
        self.keys += 1;
        if self.refused.is_none() {
            let mut outgoing = self.shared.outgoing.borrow_mut();
            outgoing.reserve(1 + word.len());
            outgoing.put_u8(b' ');
            outgoing.extend_from_slice(word);
        }
    }

    /// How many bytes of the request are written so far (0 when it is refused).
    pub fn len(&self) -> usize {
        match self.refused {
            Some(_) => 0,
            None => self.shared.outgoing.borrow().len() - self.start,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The outgoing buffer, for writing into directly; `None` when the request is refused.
    fn outgoing(&mut self) -> Option<&RefCell<BytesMut>> {
        match self.refused {
            Some(_) => None,
            None => Some(&self.shared.outgoing),
        }
    }

    /// Queues the request as written; its reply comes on the receiver.
    pub fn finish(mut self, kind: ReplyKind) -> ReplyReceiver {
        self.finished = true;
        if let Some(error) = self.refused.take() {
            return ReplyReceiver::ready(Err(error));
        }
        let (reply, receiver) = reply_slot();
        self.shared.queue(kind, reply, self.start, self.keys);
        self.shared.open.set(false);
        // Only the first request of a batch finds the task's waker; the rest set a flag.
        self.shared.wake.notify();
        receiver
    }
}

impl Drop for RequestWriter<'_> {
    fn drop(&mut self) {
        if !self.finished && self.refused.is_none() {
            self.shared.outgoing.borrow_mut().truncate(self.start);
            self.shared.open.set(false);
        }
    }
}

fn down_error(address: &Arc<str>, health: &ServerHealth) -> BackendError {
    BackendError::Down {
        server: address.clone(),
        reason: health.down_reason(),
    }
}

/// Starts the connection task on the current `LocalSet` and returns its handle.
/// The task connects at once and lives until every handle is dropped.
pub fn spawn_connection(settings: ConnectionSettings) -> BackendHandle {
    let shared = Rc::new(Shared {
        coalesce_keys: settings.coalesce_keys,
        ..Shared::default()
    });
    shared.handles.set(1);
    let handle = BackendHandle {
        shared: shared.clone(),
        address: settings.address.clone(),
        health: settings.health.clone(),
    };
    tokio::task::spawn_local(run(settings, shared));
    handle
}

/// Connect, serve until the connection breaks, fail fast during backoff, repeat.
async fn run(settings: ConnectionSettings, shared: Rc<Shared>) {
    let health = &settings.health;
    let mut backoff = settings.backoff_min;
    loop {
        let reason: Arc<str> = match settings.connector.connect(settings.connect_timeout).await {
            Ok(stream) => {
                tracing::debug!(server = %settings.address, tls = stream.is_tls(), "backend connected");
                health.connection_opened();
                let (outcome, answered) = serve(&settings, stream, &shared).await;
                health.connection_closed();
                // Only a server that answered is healthy: one that accepts connections but
                // never replies (stopped, overloaded) keeps backing off.
                if answered {
                    backoff = settings.backoff_min;
                }
                match outcome {
                    None => {
                        shared.fail_queued(|| BackendError::Closed {
                            server: settings.address.clone(),
                        });
                        return;
                    }
                    Some(error) => {
                        tracing::warn!(server = %settings.address, %error, "backend connection lost");
                        let reason = error.reason();
                        // A deferred (TCP Fast Open) connect refused at its first write is
                        // a refused connect: the server is not running, as below.
                        if matches!(error, BackendError::NotConnected { .. }) {
                            health.mark_down(&reason);
                        }
                        reason
                    }
                }
            }
            // Nothing listens there: the server is not running, and waiting for more
            // failures would only fail more requests slowly.
            Err(NetError::ConnectRefused) => {
                let reason: Arc<str> = Arc::from(CONNECTION_REFUSED);
                health.mark_down(&reason);
                reason
            }
            Err(error) => {
                // A TLS failure (a certificate that does not verify) names its cause here,
                // and so in the SERVER_ERROR clients get.
                let reason: Arc<str> = Arc::from(error.to_string());
                if matches!(error, NetError::Handshake(_)) {
                    tracing::warn!(server = %settings.address, %reason, "backend TLS handshake failed");
                }
                health.record_failure(&reason);
                reason
            }
        };
        tracing::debug!(server = %settings.address, %reason, retry_in = ?backoff, "backend down");
        // Until the next attempt, requests fail at once rather than queue behind a dead
        // server: those queued while connecting (or not yet written when the connection
        // broke) now, later ones as they are sent. A server the prober brings back is
        // reconnected at once, not after the rest of a backoff that may have grown to
        // seconds.
        *shared.not_connected.borrow_mut() = Some(reason.clone());
        shared.fail_queued(|| match health.is_down() {
            true => down_error(&settings.address, health),
            false => BackendError::NotConnected {
                server: settings.address.clone(),
                reason: reason.clone(),
            },
        });
        let retry_at = Instant::now()
            + match health.is_down() {
                true => DOWN_RETRY,
                false => backoff,
            };
        let recovered = health.wait_recovered();
        tokio::pin!(recovered);
        let woke_early = loop {
            if shared.handles.get() == 0 {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(retry_at) => break false,
                _ = &mut recovered => break true,
                // The last handle went (requests themselves fail in `writer()` now).
                _ = shared.wake.notified() => {}
            }
        };
        *shared.not_connected.borrow_mut() = None;
        backoff = match woke_early {
            true => settings.backoff_min,
            false => (backoff * 2).min(settings.backoff_max),
        };
    }
}

/// What the writer and reader halves of one connection share.
#[derive(Default)]
struct Link {
    in_flight: RefCell<VecDeque<InFlight>>,
    /// Wakes an idle reader when the writer sends the first request after a quiet spell,
    /// so an idle connection needs no timer at all.
    wake_reader: LocalNotify,
    /// At least one reply was read on this connection.
    answered: Cell<bool>,
    /// The keys of the runs in flight (`Shared::run_keys`, moved here as they are sent).
    run_keys: RefCell<BytesMut>,
}

/// Runs one established connection. Returns `None` when every handle is gone (shut down),
/// or the error that broke the connection (every request in flight gets that error), and
/// whether the server answered anything on it.
async fn serve(
    settings: &ConnectionSettings,
    mut stream: Stream,
    shared: &Shared,
) -> (Option<BackendError>, bool) {
    let link = Link::default();
    let in_flight = &link.in_flight;
    let (read_half, write_half) = stream.split();
    let outcome = tokio::select! {
        outcome = write_requests(settings, write_half, shared, &link) => outcome,
        outcome = read_replies(settings, read_half, &link) => outcome,
    };
    let error = match outcome {
        Ok(()) => BackendError::Closed {
            server: settings.address.clone(),
        },
        Err(error) => error,
    };
    // Once per broken connection, however many requests were in flight on it: they all
    // failed for one reason. Before they are answered, so whoever sees the error also sees
    // it counted. An idle connection the server (or a NAT, or memcached's idle_timeout)
    // closed failed no request: it is reconnected, not held against the server.
    let failed_requests = !in_flight.borrow().is_empty()
        || matches!(
            error,
            BackendError::Timeout { .. } | BackendError::BadReply { .. }
        );
    if !outcome_is_shutdown(&error) && failed_requests {
        settings.health.record_failure(&error.reason());
    }
    for request in in_flight.take() {
        request.reply.send(Err(error.clone()));
    }
    let answered = link.answered.get();
    match outcome_is_shutdown(&error) {
        true => (None, answered),
        false => (Some(error), answered),
    }
}

fn outcome_is_shutdown(error: &BackendError) -> bool {
    matches!(error, BackendError::Closed { .. })
}

/// A write buffer grown past this by a burst is not kept for the next one.
const KEEP_WRITE_BUFFER: usize = 1024 * 1024;

async fn write_requests(
    settings: &ConnectionSettings,
    mut socket: memroute_net::WriteHalf<'_>,
    shared: &Shared,
    link: &Link,
) -> Result<(), BackendError> {
    let in_flight = &link.in_flight;
    // Swapped with `shared.outgoing` for each write: the two buffers take turns.
    let mut batch = BytesMut::new();
    loop {
        loop {
            if shared.handles.get() == 0 {
                return Ok(());
            }
            // A request half written (a writer held across an await) is never taken.
            if !shared.open.get() && !shared.queued.borrow().is_empty() {
                break;
            }
            shared.wake.notified().await;
        }
        if settings.health.is_down() {
            // Queued before the server was marked down (maybe by another worker): fail
            // them unsent rather than write them to a server judged dead.
            shared.fail_queued(|| down_error(&settings.address, &settings.health));
            continue;
        }
        // Everything queued since the last write goes out in this one: this is the
        // pipelining. write_all takes as many syscalls as the socket needs.
        std::mem::swap(&mut batch, &mut *shared.outgoing.borrow_mut());
        let sent_at = Instant::now();
        {
            let mut in_flight = in_flight.borrow_mut();
            if in_flight.is_empty() {
                link.wake_reader.notify();
            }
            let mut queued = shared.queued.borrow_mut();
            in_flight.extend(queued.drain(..).map(|queued| InFlight {
                kind: queued.kind,
                reply: queued.reply,
                sent_at,
                run: queued.run,
            }));
            // The runs in this batch are closed: nothing joins a line already taken.
            shared.run.set(None);
            let mut run_keys = shared.run_keys.borrow_mut();
            if !run_keys.is_empty() {
                link.run_keys.borrow_mut().extend_from_slice(&run_keys);
                run_keys.clear();
            }
        }
        // flush: a TLS stream holds encrypted records until asked (no-op for plain TCP).
        let written = match socket.write_all(&batch).await {
            Ok(()) => socket.flush().await,
            Err(error) => Err(error),
        };
        written.map_err(|e| socket_error(settings, e))?;
        batch.clear();
        if batch.capacity() > KEEP_WRITE_BUFFER {
            batch = BytesMut::new();
        }
    }
}

/// What a failed read or write on an established connection means for its requests.
/// `ECONNREFUSED` there comes from a TCP Fast Open connect, which the kernel defers to the
/// first write: the server is gone, and nothing written reached it (an established
/// connection that breaks gets a reset, never a refusal).
fn socket_error(settings: &ConnectionSettings, error: std::io::Error) -> BackendError {
    match error.kind() {
        std::io::ErrorKind::ConnectionRefused => BackendError::NotConnected {
            server: settings.address.clone(),
            reason: Arc::from(CONNECTION_REFUSED),
        },
        _ => BackendError::Unavailable {
            server: settings.address.clone(),
            reason: Arc::from(error.to_string()),
        },
    }
}

const CONNECTION_REFUSED: &str = "connection refused";

async fn read_replies(
    settings: &ConnectionSettings,
    mut socket: memroute_net::ReadHalf<'_>,
    link: &Link,
) -> Result<(), BackendError> {
    let in_flight = &link.in_flight;
    let mut buffer = BytesMut::with_capacity(16 * 1024);
    // While requests are in flight, the oldest one's age is checked on a steady tick
    // rather than by arming a timer per request. A server that is still sending (a large
    // reply streaming in) is making progress: the timeout counts from the later of the
    // request's send and the last bytes read.
    let period = (settings.timeout / 4).max(Duration::from_millis(5));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_progress = Instant::now();
    let bad_reply = || BackendError::BadReply {
        server: settings.address.clone(),
    };
    // The reply to a run of coalesced gets is handed out request by request as its
    // blocks arrive (`RunReader`).
    let mut run_reader = RunReader::default();
    loop {
        loop {
            let Some((kind, run)) = in_flight.borrow().front().map(|f| (f.kind, f.run)) else {
                break;
            };
            if run.legs > 1 || run_reader.left > 0 {
                let answer = |request: InFlight, reply: Bytes, value_blocks: u32| {
                    // No clock read of its own, as below.
                    if let Some(round_trips) = &settings.round_trips {
                        (round_trips.0)(last_progress.saturating_duration_since(request.sent_at));
                    }
                    request.reply.send_retrieval(reply, value_blocks);
                    link.answered.set(true);
                    settings.health.record_success();
                };
                match run_reader.read(&mut buffer, run.legs, &settings.limits, link, answer) {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(()) => return Err(bad_reply()),
                }
            }
            match parse_reply_counting(&buffer, kind, &settings.limits) {
                Ok((ReplyParse::Complete(len), value_blocks)) => {
                    let reply = buffer.split_to(len).freeze();
                    if let Some(request) = in_flight.borrow_mut().pop_front() {
                        // No clock read of its own: the batch's write time and the time
                        // the bytes were read are already known.
                        if let Some(round_trips) = &settings.round_trips {
                            (round_trips.0)(
                                last_progress.saturating_duration_since(request.sent_at),
                            );
                        }
                        // A retrieval's count of VALUE blocks goes with it: a warm-up
                        // knows from it whether cold missed a key of the batch.
                        match kind {
                            ReplyKind::Retrieval => {
                                request.reply.send_retrieval(reply, value_blocks)
                            }
                            _ => request.reply.send(Ok(reply)),
                        }
                    }
                    link.answered.set(true);
                    settings.health.record_success();
                }
                Ok((ReplyParse::Incomplete, _)) => break,
                Err(_) => return Err(bad_reply()),
            }
        }
        if !buffer.is_empty() && in_flight.borrow().is_empty() {
            // Bytes nobody asked for: the stream is out of step with our FIFO.
            return Err(bad_reply());
        }
        let room = buffer.capacity() - buffer.len();
        // Replies split off this buffer are usually still on their way to the client now
        // (the session runs after this task yields), so reserving here would allocate a
        // fresh block every ~16 KiB of replies. Reclaim in place when they are gone; else
        // read into the room left and retry next time, allocating only when nearly full.
        if room < 4096 && !buffer.try_reclaim(16 * 1024) && room < 1024 {
            buffer.reserve(16 * 1024);
        }
        let idle = in_flight.borrow().is_empty();
        tokio::select! {
            read = socket.read_buf(&mut buffer) => match read {
                Ok(0) => return Err(BackendError::Unavailable {
                    server: settings.address.clone(),
                    reason: Arc::from("connection closed by server"),
                }),
                Ok(_) => last_progress = Instant::now(),
                Err(e) => return Err(socket_error(settings, e)),
            },
            _ = tick.tick(), if !idle => {
                let overdue = in_flight
                    .borrow()
                    .front()
                    .is_some_and(|f| f.sent_at.max(last_progress).elapsed() > settings.timeout);
                // A worker that was busy elsewhere for longer than the timeout finds the
                // tick and the socket ready at once, and select! may pick the tick: look at
                // the socket before blaming the server for bytes it has already sent.
                // A zero timeout polls the read once (tokio polls the inner future first);
                // read_buf is cancel-safe, and this works for plain and TLS streams alike.
                let ready = overdue
                    && matches!(
                        tokio::time::timeout(Duration::ZERO, socket.read_buf(&mut buffer)).await,
                        Ok(Ok(n)) if n > 0
                    );
                if ready {
                    last_progress = Instant::now();
                } else if overdue {
                    return Err(BackendError::Timeout { server: settings.address.clone() });
                }
            }
            () = link.wake_reader.notified(), if idle => {}
        }
    }
}

/// The reader's way through the reply to a run of coalesced gets: one `get` on the wire
/// for several requests (`Shared::queue`), whose blocks are handed to each request as soon
/// as its keys are settled, so a run of large values is never held whole (memory, and the
/// first request's latency, stay what they were with one command per request).
///
/// memcached answers a `get` with a `VALUE` block for each key it has, in the order the
/// keys were asked, then `END`. Walking a request's keys (its text in the key journal)
/// against the blocks framed so far, each key either owns the next block or missed; a key
/// is settled once the block after the last one matched has arrived (or `END`). A request
/// gets its blocks and an `END` of its own (copied; the run's last one takes the bytes as
/// they are, with the run's `END`). A reply that does not fit the walk (a block for a key
/// nobody asked, blocks out of order: blocks left when the last request is settled) is a
/// server out of step: an error, and the connection is reset; the requests answered before
/// it got blocks of the keys they asked. An error line where blocks were expected answers
/// every request of the run still waiting.
#[derive(Default)]
struct RunReader {
    /// Requests of the run under way not answered yet (0: none under way).
    left: u32,
    /// Where each block framed but not handed out yet ends, in the read buffer.
    block_ends: Vec<usize>,
    /// Where requests' blocks are copied, each with its own `END`: reclaimed in place once
    /// earlier copies are gone, so steady traffic allocates nothing here.
    copies: BytesMut,
}

impl RunReader {
    /// Hands out what the bytes in `buffer` settle. `head_legs` is the front request's
    /// `RunPart::legs` (a run starts when it is more than 1). `Ok(true)`: the run is done
    /// (the next request is at the front); `Ok(false)`: more bytes are needed.
    fn read(
        &mut self,
        buffer: &mut BytesMut,
        head_legs: u32,
        limits: &Limits,
        link: &Link,
        mut answer: impl FnMut(InFlight, Bytes, u32),
    ) -> Result<bool, ()> {
        if self.left == 0 {
            self.left = head_legs;
            self.block_ends.clear();
        }
        let from = self.block_ends.last().copied().unwrap_or(0);
        let ends = &mut self.block_ends;
        let mut complete =
            match parse_retrieval_blocks(buffer, from, limits, &mut |end| ends.push(end)) {
                Ok((ReplyParse::Complete(len), _)) => Some(len),
                Ok((ReplyParse::Incomplete, _)) => None,
                Err(_) => return Err(()),
            };
        // Popped in a borrow of its own: answering wakes a session, never re-enters.
        let next = || link.in_flight.borrow_mut().pop_front();
        if let Some(len) = complete.filter(|_| self.block_ends.is_empty()) {
            if retrieval_error(&buffer[..len]).is_some() {
                let error = buffer.split_to(len).freeze();
                while self.left > 0 {
                    let keys = link.in_flight.borrow().front().map(|r| r.run.keys);
                    link.run_keys
                        .borrow_mut()
                        .advance(keys.unwrap_or(0) as usize);
                    let request = next().ok_or(())?;
                    answer(request, error.clone(), 0);
                    self.left -= 1;
                }
                return Ok(true);
            }
        }
        while self.left > 0 {
            // Settle the front request's keys against the blocks framed so far.
            let (pos, settled, blocks, text_len) = {
                let journal = link.run_keys.borrow();
                let in_flight = link.in_flight.borrow();
                let text_len = in_flight.front().ok_or(())?.run.keys as usize;
                let text = journal.get(..text_len).ok_or(())?;
                let (mut pos, mut settled, mut blocks) = (0, true, 0usize);
                for key in journal_keys(text) {
                    match self.block_ends.get(blocks) {
                        Some(&end) => {
                            if memroute_protocol::framed_block_is_for(buffer, pos, key) {
                                pos = end;
                                blocks += 1;
                            }
                        }
                        None if complete.is_some() => {}
                        None => {
                            settled = false;
                            break;
                        }
                    }
                }
                (pos, settled, blocks, text_len)
            };
            if !settled {
                return Ok(false);
            }
            let reply = if self.left == 1 {
                // The last request: its blocks and the run's END, once all are there and
                // nothing is left over.
                let Some(len) = complete else {
                    return Ok(false);
                };
                if blocks != self.block_ends.len() || buffer.get(pos..len) != Some(b"END\r\n") {
                    return Err(());
                }
                self.block_ends.clear();
                buffer.split_to(len).freeze()
            } else if blocks == 0 {
                Bytes::from_static(b"END\r\n")
            } else {
                let copies = &mut self.copies;
                let len = pos + 5;
                // Small copies share 16 KiB blocks; large values share blocks of at least
                // 256 KiB, as large replies share the read buffer's (grown by doubling):
                // a block that size is its own mapping, given back to the system when its
                // last reply goes, where 100 KiB copies one by one would fragment the heap
                // and stay (tests/reply_budget.rs measures it).
                let block = match len > 16 * 1024 {
                    true => len.max(256 * 1024),
                    false => 16 * 1024,
                };
                if copies.capacity() - copies.len() < len && !copies.try_reclaim(block) {
                    copies.reserve(block);
                }
                copies.extend_from_slice(&buffer[..pos]);
                copies.extend_from_slice(b"END\r\n");
                buffer.advance(pos);
                self.block_ends.drain(..blocks);
                for end in &mut self.block_ends {
                    *end -= pos;
                }
                complete = complete.map(|len| len - pos);
                copies.split().freeze()
            };
            link.run_keys.borrow_mut().advance(text_len);
            let request = next().ok_or(())?;
            answer(request, reply, blocks as u32);
            self.left -= 1;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::TryRecvError;
    use crate::HealthSettings;
    use std::sync::atomic::AtomicU64;
    use tokio::net::TcpListener;
    use tokio::task::LocalSet;

    fn settings(address: &str, failure_limit: u32) -> ConnectionSettings {
        let health = ServerHealth::new(
            Arc::from("main"),
            Arc::from(address),
            HealthSettings {
                failure_limit,
                probe_interval: Duration::from_millis(10),
                probe_interval_max: Duration::from_millis(40),
                connect_timeout: Duration::from_secs(1),
                timeout: Duration::from_millis(50),
            },
            Arc::new(AtomicU64::new(0)),
        );
        ConnectionSettings {
            address: Arc::from(address),
            connector: Arc::new(Connector::plain(address)),
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            // Far longer than any test waits: a reconnect seen in a test came from the
            // health waking the connection, not from the backoff running out.
            backoff_min: Duration::from_secs(60),
            backoff_max: Duration::from_secs(60),
            limits: Limits::default(),
            health,
            round_trips: None,
            coalesce_keys: 100,
        }
    }

    /// A port on loopback that nobody listens on (bound, noted, released).
    fn refused_address() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("local addr").to_string()
    }

    /// Bounds every wait in these tests: a hang is a failure, not a stuck CI job.
    /// How a fake server (for faults a real memcached will not produce on demand) behaves.
    enum Fake {
        /// Accepts and closes at once: each connection breaks without a reply.
        CloseAtOnce,
        /// Accepts, reads, never answers.
        Silent,
        /// Answers every read with this reply.
        Answer(&'static [u8]),
    }

    /// A fake that answers `END` to every `\r\n`-terminated line and records every byte
    /// it received, for tests of what exactly went on the wire.
    async fn recording_server() -> (String, Rc<RefCell<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local addr").to_string();
        let received = Rc::new(RefCell::new(Vec::new()));
        let log = received.clone();
        tokio::task::spawn_local(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let log = log.clone();
                tokio::task::spawn_local(async move {
                    let mut request = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut request).await {
                        if n == 0 {
                            break;
                        }
                        log.borrow_mut().extend_from_slice(&request[..n]);
                        let lines = request[..n].windows(2).filter(|w| w == b"\r\n").count();
                        let _ = stream.write_all(&b"END\r\n".repeat(lines)).await;
                    }
                });
            }
        });
        (address, received)
    }

    /// Starts a fake server on a free loopback port (on the current LocalSet); its address.
    async fn fake_server(fake: Fake) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local addr").to_string();
        tokio::task::spawn_local(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let reply = match fake {
                    Fake::CloseAtOnce => continue, // `stream` is dropped: closed
                    Fake::Silent => None,
                    Fake::Answer(reply) => Some(reply),
                };
                tokio::task::spawn_local(async move {
                    let mut request = [0u8; 1024];
                    while matches!(stream.read(&mut request).await, Ok(n) if n > 0) {
                        if let Some(reply) = reply {
                            let _ = stream.write_all(reply).await;
                        }
                    }
                });
            }
        });
        address
    }

    async fn within<F: std::future::Future>(future: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(10), future)
            .await
            .expect("timed out waiting")
    }

    fn get(handle: &BackendHandle) -> ReplyReceiver {
        handle.send(
            (Bytes::from_static(b"get key\r\n"), None),
            ReplyKind::Retrieval,
        )
    }

    #[tokio::test]
    async fn requests_written_in_pieces_go_out_whole_and_in_order() {
        LocalSet::new()
            .run_until(async {
                let (address, received) = recording_server().await;
                let handle = spawn_connection(settings(&address, 3));
                let other = handle.clone();
                // A request built key by key, one sent whole, one with a closure, and one
                // started and then abandoned (its bytes must not reach the server).
                let mut multi = handle.writer();
                multi.append(b"get a");
                multi.append(b" b");
                assert_eq!(multi.len(), 7);
                multi.append(b"\r\n");
                let first = multi.finish(ReplyKind::Retrieval);
                let mut abandoned = other.writer();
                abandoned.append(b"get never");
                drop(abandoned);
                let second = other.send(
                    (
                        Bytes::from_static(b"get c"),
                        Some(Bytes::from_static(b"\r\n")),
                    ),
                    ReplyKind::Retrieval,
                );
                let third = handle.send_with(ReplyKind::Retrieval, |buffer| {
                    buffer.extend_from_slice(b"get d\r\n")
                });
                for reply in [first, second, third] {
                    let reply = within(reply).await.expect("reply slot").expect("reply");
                    assert_eq!(&reply[..], b"END\r\n");
                }
                // Three gets queued together go out as one command (coalesced).
                assert_eq!(&received.borrow()[..], b"get a b c d\r\n");
            })
            .await;
    }

    #[tokio::test]
    async fn a_second_request_while_one_is_being_written_is_refused_not_interleaved() {
        LocalSet::new()
            .run_until(async {
                let (address, received) = recording_server().await;
                let handle = spawn_connection(settings(&address, 3));
                let mut open = handle.writer();
                open.append(b"get a");
                let error = within(get(&handle)).await.expect("reply slot");
                assert!(error.is_err());
                open.append(b"\r\n");
                within(open.finish(ReplyKind::Retrieval))
                    .await
                    .expect("reply slot")
                    .expect("reply");
                assert_eq!(&received.borrow()[..], b"get a\r\n");
            })
            .await;
    }

    #[tokio::test]
    async fn the_task_ends_when_every_handle_is_dropped() {
        LocalSet::new()
            .run_until(async {
                let (address, _received) = recording_server().await;
                let settings = settings(&address, 3);
                let health = settings.health.clone();
                let handle = spawn_connection(settings);
                let clone = handle.clone();
                within(get(&handle))
                    .await
                    .expect("reply slot")
                    .expect("reply");
                assert_eq!(health.open_connections(), 1);
                drop(handle);
                // One handle left: still serving.
                within(get(&clone))
                    .await
                    .expect("reply slot")
                    .expect("reply");
                drop(clone);
                within(async {
                    while health.open_connections() != 0 {
                        tokio::task::yield_now().await;
                    }
                })
                .await;
            })
            .await;
    }

    #[tokio::test]
    async fn queued_requests_fail_unsent_when_the_server_is_marked_down_before_the_write() {
        LocalSet::new()
            .run_until(async {
                let (address, received) = recording_server().await;
                let settings = settings(&address, 3);
                let health = settings.health.clone();
                let handle = spawn_connection(settings);
                within(get(&handle))
                    .await
                    .expect("reply slot")
                    .expect("reply");
                // Queued, then (before the writer runs) another worker marks it down.
                let queued = [get(&handle), get(&handle)];
                health.mark_down("timed out");
                for reply in queued {
                    let error = within(reply).await.expect("reply slot").expect_err("down");
                    assert!(matches!(error, BackendError::Down { .. }), "{error}");
                    assert!(error.never_sent());
                }
                assert_eq!(&received.borrow()[..], b"get key\r\n");
            })
            .await;
    }

    #[tokio::test]
    async fn a_refused_connect_marks_the_server_down_at_once() {
        LocalSet::new()
            .run_until(async {
                let settings = settings(&refused_address(), 3);
                let health = settings.health.clone();
                let _handle = spawn_connection(settings);
                within(health.wait_down()).await;
                assert_eq!(&*health.down_reason(), "connection refused");
                assert_eq!(health.marked_down_total(), 1);
            })
            .await;
    }

    #[tokio::test]
    async fn send_to_a_down_server_fails_at_once_unsent() {
        LocalSet::new()
            .run_until(async {
                let settings = settings(&refused_address(), 3);
                let health = settings.health.clone();
                let handle = spawn_connection(settings);
                health.mark_down("timed out");
                // No await between send and the check: the error is there at once.
                let mut reply = get(&handle);
                let error = match reply.try_recv() {
                    Ok(Err(error)) => error,
                    other => panic!("expected an immediate error, got {other:?}"),
                };
                assert!(matches!(error, BackendError::Down { .. }), "{error}");
                assert!(error.never_sent());
                assert!(error.to_string().ends_with("is marked down: timed out"));
            })
            .await;
    }

    #[tokio::test]
    async fn requests_during_backoff_fail_unsent() {
        LocalSet::new()
            .run_until(async {
                let address = fake_server(Fake::CloseAtOnce).await;
                let settings = settings(&address, 100);
                let health = settings.health.clone();
                let handle = spawn_connection(settings);
                // Whether it was written before the close was seen or not, it fails.
                let first = within(get(&handle)).await.expect("reply slot");
                assert!(first.is_err());
                // The connection is now in its (long) backoff.
                let error = within(get(&handle))
                    .await
                    .expect("reply slot")
                    .expect_err("no connection");
                assert!(
                    matches!(error, BackendError::NotConnected { .. }),
                    "{error}"
                );
                assert!(error.never_sent());
                assert_eq!(health.consecutive_failures(), 1);
                assert!(!health.is_down());
            })
            .await;
    }

    #[tokio::test]
    async fn a_timeout_counts_once_for_every_request_in_flight() {
        LocalSet::new()
            .run_until(async {
                let address = fake_server(Fake::Silent).await;
                let settings = settings(&address, 3);
                let health = settings.health.clone();
                let handle = spawn_connection(settings);
                let replies = [get(&handle), get(&handle), get(&handle)];
                for reply in replies {
                    let error = within(reply)
                        .await
                        .expect("reply slot")
                        .expect_err("silent server");
                    assert!(error.is_timeout(), "{error}");
                    assert!(!error.never_sent());
                }
                assert_eq!(health.consecutive_failures(), 1);
                assert!(!health.is_down());
            })
            .await;
    }

    #[tokio::test]
    async fn a_reply_resets_the_failure_count() {
        LocalSet::new()
            .run_until(async {
                let address = fake_server(Fake::Answer(b"VERSION 1.6.18\r\n")).await;
                let settings = settings(&address, 3);
                let health = settings.health.clone();
                let handle = spawn_connection(settings);
                health.record_failure("timed out");
                health.record_failure("timed out");
                let reply =
                    handle.send((Bytes::from_static(b"version\r\n"), None), ReplyKind::Line);
                let reply = within(reply).await.expect("reply slot").expect("reply");
                assert_eq!(&reply[..], b"VERSION 1.6.18\r\n");
                assert_eq!(health.consecutive_failures(), 0);
            })
            .await;
    }

    #[tokio::test]
    async fn a_server_brought_back_up_is_reconnected_at_once() {
        LocalSet::new()
            .run_until(async {
                let address = refused_address();
                let settings = settings(&address, 3);
                let health = settings.health.clone();
                let _handle = spawn_connection(settings);
                within(health.wait_down()).await;
                // The server starts again on the same port; the connection is in a 60 s
                // backoff, so only the health going up can make it connect now.
                let listener = TcpListener::bind(&address).await.expect("rebind the port");
                health.mark_up();
                within(listener.accept()).await.expect("accept");
            })
            .await;
    }

    /// A fake memcached for coalescing tests: answers each `get`/`gets` line with a VALUE
    /// block for every key of `items` in it, in order, and END (anything else: ERROR), and
    /// records every byte it received.
    async fn map_server(
        items: &'static [(&'static str, &'static str)],
    ) -> (String, Rc<RefCell<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local addr").to_string();
        let received = Rc::new(RefCell::new(Vec::new()));
        let log = received.clone();
        tokio::task::spawn_local(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let log = log.clone();
                tokio::task::spawn_local(async move {
                    let mut pending = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut chunk).await {
                        if n == 0 {
                            break;
                        }
                        log.borrow_mut().extend_from_slice(&chunk[..n]);
                        pending.extend_from_slice(&chunk[..n]);
                        let mut reply = Vec::new();
                        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                            let line: Vec<u8> = pending.drain(..end + 1).collect();
                            let line = line.strip_suffix(b"\n").unwrap_or(&line);
                            let line = line.strip_suffix(b"\r").unwrap_or(line);
                            let line = std::str::from_utf8(line).expect("ascii");
                            let mut words = line.split(' ').filter(|w| !w.is_empty());
                            let gets = match words.next() {
                                Some("get") => false,
                                Some("gets") => true,
                                _ => {
                                    reply.extend_from_slice(b"ERROR\r\n");
                                    continue;
                                }
                            };
                            for key in words {
                                if let Some((_, value)) = items.iter().find(|(k, _)| *k == key) {
                                    let cas = if gets { " 7" } else { "" };
                                    reply.extend_from_slice(
                                        format!(
                                            "VALUE {key} 0 {}{cas}\r\n{value}\r\n",
                                            value.len()
                                        )
                                        .as_bytes(),
                                    );
                                }
                            }
                            reply.extend_from_slice(b"END\r\n");
                        }
                        let _ = stream.write_all(&reply).await;
                    }
                });
            }
        });
        (address, received)
    }

    fn send_line(handle: &BackendHandle, line: &'static [u8]) -> ReplyReceiver {
        handle.send((Bytes::from_static(line), None), ReplyKind::Retrieval)
    }

    /// The reply and its VALUE-block count.
    async fn reply_of(receiver: ReplyReceiver) -> (Vec<u8>, Option<u32>) {
        let mut receiver = receiver;
        let reply = within(&mut receiver)
            .await
            .expect("reply slot")
            .expect("reply");
        (reply.to_vec(), receiver.value_blocks())
    }

    const ITEMS: &[(&str, &str)] = &[
        ("a", "1"),
        ("b", "22"),
        ("c", "333"),
        ("d", "END\r\nVALUE b 0 1"),
    ];

    #[tokio::test]
    async fn consecutive_gets_go_out_as_one_command_and_each_request_gets_its_own_reply() {
        LocalSet::new()
            .run_until(async {
                let (address, received) = map_server(ITEMS).await;
                let handle = spawn_connection(settings(&address, 3));
                // Queued before the connection's first write: one batch. A multi-key
                // request built in pieces, misses, a key twice, a key in two requests,
                // a value that looks like reply lines; `gets` breaks a run of `get`s and
                // starts its own; a line ending in a bare \n is sent as it came.
                let mut multi = handle.writer();
                multi.append(b"get a");
                multi.append_word(b"zz");
                multi.append_word(b"b");
                multi.append(b"\r\n");
                let replies = [
                    multi.finish(ReplyKind::Retrieval),
                    send_line(&handle, b"get c\r\n"),
                    send_line(&handle, b"get zz\r\n"),
                    send_line(&handle, b"get  a  a \r\n"),
                    send_line(&handle, b"get d b\r\n"),
                    send_line(&handle, b"gets a\r\n"),
                    send_line(&handle, b"gets b\r\n"),
                    send_line(&handle, b"get c\n"),
                    send_line(&handle, b"get c\r\n"),
                ];
                let mut got = Vec::new();
                for reply in replies {
                    got.push(reply_of(reply).await);
                }
                let value = |key: &str, value: &str| {
                    format!("VALUE {key} 0 {}\r\n{value}\r\n", value.len())
                };
                let expected: Vec<(String, Option<u32>)> = vec![
                    (
                        format!("{}{}END\r\n", value("a", "1"), value("b", "22")),
                        Some(2),
                    ),
                    (format!("{}END\r\n", value("c", "333")), Some(1)),
                    ("END\r\n".to_string(), Some(0)),
                    (
                        format!("{}{}END\r\n", value("a", "1"), value("a", "1")),
                        Some(2),
                    ),
                    (
                        format!(
                            "{}{}END\r\n",
                            value("d", "END\r\nVALUE b 0 1"),
                            value("b", "22")
                        ),
                        Some(2),
                    ),
                    ("VALUE a 0 1 7\r\n1\r\nEND\r\n".to_string(), Some(1)),
                    ("VALUE b 0 2 7\r\n22\r\nEND\r\n".to_string(), Some(1)),
                    (format!("{}END\r\n", value("c", "333")), Some(1)),
                    (format!("{}END\r\n", value("c", "333")), Some(1)),
                ];
                for (i, ((reply, blocks), (want, want_blocks))) in
                    got.iter().zip(&expected).enumerate()
                {
                    assert_eq!(String::from_utf8_lossy(reply), *want, "reply {i}");
                    assert_eq!(blocks, want_blocks, "block count of reply {i}");
                }
                assert_eq!(
                    String::from_utf8_lossy(&received.borrow()),
                    "get a zz b c zz  a  a  d b\r\ngets a b\r\nget c\nget c\r\n"
                );
            })
            .await;
    }

    #[tokio::test]
    async fn a_coalesced_command_keeps_to_the_key_limit_and_coalescing_can_be_turned_off() {
        LocalSet::new()
            .run_until(async {
                let (address, received) = map_server(ITEMS).await;
                let mut three = settings(&address, 3);
                three.coalesce_keys = 3;
                let handle = spawn_connection(three);
                let replies = [
                    send_line(&handle, b"get a b\r\n"),
                    send_line(&handle, b"get c\r\n"),
                    send_line(&handle, b"get d\r\n"),
                    send_line(&handle, b"get a b c d\r\n"),
                    send_line(&handle, b"get a\r\n"),
                ];
                for reply in replies {
                    reply_of(reply).await;
                }
                let wire = String::from_utf8_lossy(&received.borrow()).into_owned();
                assert_eq!(wire, "get a b c\r\nget d\r\nget a b c d\r\nget a\r\n");
            })
            .await;
        LocalSet::new()
            .run_until(async {
                let (address, received) = map_server(ITEMS).await;
                let mut off = settings(&address, 3);
                off.coalesce_keys = 0;
                let handle = spawn_connection(off);
                let replies = [
                    send_line(&handle, b"get a\r\n"),
                    send_line(&handle, b"get b\r\n"),
                ];
                for reply in replies {
                    reply_of(reply).await;
                }
                assert_eq!(&received.borrow()[..], b"get a\r\nget b\r\n");
            })
            .await;
    }

    #[tokio::test]
    async fn a_coalesced_line_stays_under_its_byte_limit() {
        LocalSet::new()
            .run_until(async {
                let (address, received) = map_server(ITEMS).await;
                let handle = spawn_connection(settings(&address, 3));
                // 100-byte keys: 20 fit in a 2 KB line ("get" and a space before each).
                let key = |i: usize| format!("{i:0>100}");
                let replies: Vec<_> = (0..25)
                    .map(|i| {
                        handle.send(
                            (Bytes::from(format!("get {}\r\n", key(i))), None),
                            ReplyKind::Retrieval,
                        )
                    })
                    .collect();
                for reply in replies {
                    assert_eq!(reply_of(reply).await, (b"END\r\n".to_vec(), Some(0)));
                }
                let wire = received.borrow().clone();
                let lines: Vec<&[u8]> = wire
                    .split(|&b| b == b'\n')
                    .filter(|l| !l.is_empty())
                    .collect();
                assert_eq!(lines.len(), 2, "25 keys: a full line and the rest");
                assert!(lines.iter().all(|line| line.len() < MAX_COALESCED_LINE));
                assert_eq!(lines[0].len() + 1, 3 + 20 * 101 + 2);
            })
            .await;
    }

    #[tokio::test]
    async fn an_error_line_answers_every_request_of_a_run() {
        LocalSet::new()
            .run_until(async {
                let address = fake_server(Fake::Answer(b"SERVER_ERROR out of memory\r\n")).await;
                let handle = spawn_connection(settings(&address, 3));
                let replies = [
                    send_line(&handle, b"get a\r\n"),
                    send_line(&handle, b"get b c\r\n"),
                ];
                for reply in replies {
                    assert_eq!(reply_of(reply).await.0, b"SERVER_ERROR out of memory\r\n");
                }
            })
            .await;
    }

    #[tokio::test]
    async fn a_reply_that_does_not_match_the_keys_asked_is_out_of_step() {
        // A key nobody asked, and the keys' blocks out of order. Requests are answered as
        // their keys are settled, so the first one takes its miss (the block before it is
        // not its key's); the blocks left over when the last request is settled make the
        // reply out of step: that request fails with BadReply and the connection is
        // reset. No request gets a block for a key it did not ask.
        for answer in [
            &b"VALUE zz 0 1\r\nx\r\nEND\r\n"[..],
            &b"VALUE b 0 1\r\nx\r\nVALUE a 0 1\r\ny\r\nEND\r\n"[..],
        ] {
            LocalSet::new()
                .run_until(async {
                    let address = fake_server(Fake::Answer(answer)).await;
                    let handle = spawn_connection(settings(&address, 3));
                    let first = send_line(&handle, b"get a\r\n");
                    let last = send_line(&handle, b"get b\r\n");
                    let first = within(first).await.expect("reply slot");
                    assert_eq!(
                        first.as_deref().ok(),
                        Some(&b"END\r\n"[..]),
                        "{:?}",
                        String::from_utf8_lossy(answer)
                    );
                    let last = within(last).await.expect("reply slot");
                    assert!(
                        matches!(last, Err(BackendError::BadReply { .. })),
                        "{:?} for {:?}",
                        last,
                        String::from_utf8_lossy(answer)
                    );
                })
                .await;
        }
    }

    #[tokio::test]
    async fn a_run_is_answered_request_by_request_as_its_blocks_arrive() {
        LocalSet::new()
            .run_until(async {
                // A server that answers the run's first blocks, then the rest when told.
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let address = listener.local_addr().expect("local addr").to_string();
                let (rest_tx, rest_rx) = tokio::sync::oneshot::channel::<()>();
                tokio::task::spawn_local(async move {
                    let (mut stream, _) = listener.accept().await.expect("accept");
                    let mut request = [0u8; 1024];
                    let n = stream.read(&mut request).await.expect("read");
                    assert_eq!(&request[..n], b"get a b c\r\n");
                    stream
                        .write_all(b"VALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nVAL")
                        .await
                        .expect("write");
                    let _ = rest_rx.await;
                    stream
                        .write_all(b"UE c 0 1\r\n3\r\nEND\r\n")
                        .await
                        .expect("write");
                    let _ = stream.read(&mut request).await;
                });
                let handle = spawn_connection(settings(&address, 3));
                let a = send_line(&handle, b"get a\r\n");
                let b = send_line(&handle, b"get b\r\n");
                let mut c = send_line(&handle, b"get c\r\n");
                // a and b are settled by the blocks that came; c's block is still partial.
                assert_eq!(
                    reply_of(a).await,
                    (b"VALUE a 0 1\r\n1\r\nEND\r\n".to_vec(), Some(1))
                );
                assert_eq!(
                    reply_of(b).await,
                    (b"VALUE b 0 1\r\n2\r\nEND\r\n".to_vec(), Some(1))
                );
                assert_eq!(c.try_recv().err(), Some(TryRecvError::Empty));
                rest_tx.send(()).expect("server waiting");
                assert_eq!(
                    reply_of(c).await,
                    (b"VALUE c 0 1\r\n3\r\nEND\r\n".to_vec(), Some(1))
                );
            })
            .await;
    }
}
