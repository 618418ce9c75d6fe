//! One client connection, whatever protocol it speaks: frame requests, dispatch them,
//! write replies in request order.
//!
//! ```text
//!   read -> framing (text/meta: framing::text; binary: binary::Translator) -> dispatch
//!             -> pending FIFO (one entry per request)
//!                  | head completes (backend reply, merge, local answer)
//!   write <- framing renders each finished head <- one flush per batch of completed replies
//! ```
//!
//! The protocol is chosen per connection from its first byte (0x80 is binary, as memcached
//! decides), and only framing differs: the loop below, with the pipelining cap, the reply
//! budget, the buffer pool, the stats clock, the idle state and shutdown, serves them all.
//!
//! At most `max_client_pending` requests are outstanding per client: past that we stop
//! reading, so a client that pipelines without reading its replies cannot grow our memory.
//!
//! A central tier holds tens of thousands of connections, nearly all idle, so an idle
//! session is kept small (see docs/benchmarks.md, "Memory per client connection"):
//!
//! ```text
//!   Session (the task's future, ~130 bytes)        busy future (~1 KiB, pooled per worker)
//!   Idle(stream) --bytes arrive--> Busy(home) ---- the loop below: parse, dispatch, wait,
//!        ^                                          write; returns the stream when nothing
//!        +--------- Outcome::Idle(stream) <-------- is in flight and nothing is buffered
//! ```
//!
//! The idle wait reads into a buffer borrowed from the worker's pool (see `buffers`) and
//! gives it straight back when nothing arrives; the busy state (pending queue, buffers, the
//! reply budget's charge, the futures of a request in flight) lives in a home taken from a
//! per-worker pool while a request is in flight, and goes back when the session is idle
//! again: no buffer and no busy state per idle connection, no heap allocation per request.
//! Shutdown reaches idle sessions through the worker's `SessionWakers` (one waker per
//! session) rather than a watch-channel future pinned in every session.
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::binary::Translator;
use crate::budget::{Charge, ChargeMemory};
use crate::buffers::{self, QueuePool, CHUNK};
use crate::client_auth::LoginGate;
use crate::client_log::{ClientEvent, Peer};
use crate::context::WorkerContext;
use crate::dispatch::Origin;
use crate::framing::{Framed, Inbound};
use crate::pending::{Flow, Pending};

/// A client connection as accepted: it becomes a byte stream (after a TLS handshake, for
/// a TLS listener) inside the session's own task, so a slow handshake holds up nobody.
pub(crate) trait ClientConnection: Unpin + Sized + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + 'static;
    /// The stream at once when no handshake is needed, or the connection back.
    fn into_plain(self) -> Result<Self::Stream, Self>;
    /// The stream to serve, or `None` when the connection ended before it was usable.
    fn establish(self) -> impl Future<Output = Option<Self::Stream>> + 'static;
    /// The peer as client error logs name it (`ip:port`, `unix-socket`, ...): asked when a
    /// line is written, not stored with every connection.
    fn describe(stream: &Self::Stream) -> String;
}

impl ClientConnection for memroute_net::Incoming {
    type Stream = memroute_net::Stream;

    fn into_plain(self) -> Result<memroute_net::Stream, Self> {
        memroute_net::Incoming::into_plain(self)
    }

    async fn establish(self) -> Option<memroute_net::Stream> {
        let peer = self.peer.clone();
        match memroute_net::Incoming::establish(self).await {
            Ok(stream) => Some(stream),
            Err(error) => {
                // Counted on the listener (failed / timeout handshakes).
                tracing::debug!(%error, peer, "client connection closed before its TLS handshake finished");
                None
            }
        }
    }

    fn describe(stream: &memroute_net::Stream) -> String {
        stream.peer_description()
    }
}

/// A counted client connection: taken when the session is spawned, released (the
/// connection counts of the process and of its listener decremented, the worker's drain
/// signal dropped, its place in the worker's `SessionWakers` freed) when it ends.
#[derive(Debug)]
pub(crate) struct OpenSession {
    context: Rc<WorkerContext>,
    /// Every session holds a clone; the worker's drain wait ends when all are dropped.
    _alive: tokio::sync::mpsc::Sender<()>,
    /// The listener it came in on (its root route and counters), shared by the listener's
    /// sessions.
    listener: Option<Rc<crate::client_log::ListenerEvents>>,
    /// Its place in `context.sessions`.
    index: u32,
}

impl OpenSession {
    pub(crate) fn new(
        context: Rc<WorkerContext>,
        alive: tokio::sync::mpsc::Sender<()>,
        listener: Option<Rc<crate::client_log::ListenerEvents>>,
    ) -> OpenSession {
        let index = context.sessions.enter();
        if let Some(listener) = &listener {
            listener.open_connections.inc();
        }
        OpenSession {
            context,
            _alive: alive,
            listener,
            index,
        }
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.context.sessions.leave(self.index);
        self.context.metrics.shared.connection_closed();
        if let Some(listener) = &self.listener {
            listener.open_connections.dec();
        }
    }
}

/// The reply bytes rendered into one write before the session yields to the worker's other
/// sessions. Rendering every complete reply at once made one poll of a client that pipelines
/// gets of large values copy tens of MB (a window of 100 KB values), the other sessions of
/// its worker waiting milliseconds; a batch this size also stays small enough for the
/// worker's buffer pool to keep (`buffers::KEEP_AT_MOST`) rather than allocate and free.
const MAX_WRITE_BATCH: usize = 128 * 1024;

thread_local! {
    /// Storage of pending queues of this worker's idle sessions, reused by the busy ones.
    static QUEUES: QueuePool<Pending> = const { QueuePool::new() };
}

/// Serves one client connection; this future is the whole task (see
/// `worker::spawn_session`), so nothing wraps it.
pub(crate) fn run<C: ClientConnection>(
    open: OpenSession,
    connection: C,
) -> impl Future<Output = ()> {
    let slot = open.context.session_slot();
    Session {
        open,
        slot,
        memory: ChargeMemory::default(),
        protocol: Protocol::Text,
        logged_in: false,
        start: busy::<C>,
        state: State::Accepted(connection),
    }
}

/// The session task: a state machine written out by hand so that what an idle connection
/// stores is exactly the fields below (an `async` block would keep its arguments, the
/// accepted connection among them, for its whole life next to the stream they became).
struct Session<C: ClientConnection, M, B> {
    open: OpenSession,
    /// Which of a server's connections this session's requests use.
    slot: usize,
    /// What the reply budget learnt about this client, kept while idle.
    memory: ChargeMemory,
    /// Chosen from the first byte; until then `Text`.
    protocol: Protocol,
    /// Whether the client has logged in (kept while idle; see `client_auth`).
    logged_in: bool,
    /// `busy::<C>`: a function item, so no bytes; it names the busy future's type `B`.
    start: M,
    state: State<C, B>,
}

enum State<C: ClientConnection, B> {
    /// Not polled yet.
    Accepted(C),
    /// A TLS handshake (boxed: only TLS clients pay for it, and only while it runs).
    Handshake(Pin<Box<dyn Future<Output = Option<C::Stream>>>>),
    /// Established; no byte read yet, so the protocol is not known.
    Fresh(C::Stream),
    /// Nothing in flight and nothing buffered.
    Idle(C::Stream),
    /// A request in flight: the busy future, in a pooled home.
    Busy(Pin<Box<Option<B>>>),
    /// Draining or at the client's end: our side's shutdown (a TLS close_notify).
    Closing(C::Stream),
    Done,
}

/// What a busy spell ended with.
enum Outcome<S> {
    /// Nothing in flight, nothing buffered: the session waits idle for its next bytes
    /// (with what the budget learnt, and whether the client has logged in).
    Idle(S, ChargeMemory, bool),
    /// The connection is over.
    Closed,
}

/// What a busy spell starts from.
struct BusyStart<S> {
    context: Rc<WorkerContext>,
    listener: Option<Rc<crate::client_log::ListenerEvents>>,
    stream: S,
    /// The bytes that ended the idle wait.
    input: BytesMut,
    slot: usize,
    memory: ChargeMemory,
    protocol: Protocol,
    logged_in: bool,
}

/// The protocol a connection speaks: chosen from its first byte, kept while idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// Text and meta commands (one parser tells them apart per request).
    Text,
    Binary,
}

/// A busy spell's framing: how bytes become dispatched requests and replies become bytes.
enum Framing {
    Text,
    Binary(Translator),
}

impl Framing {
    fn new(protocol: Protocol) -> Framing {
        match protocol {
            Protocol::Text => Framing::Text,
            Protocol::Binary => Framing::Binary(Translator::default()),
        }
    }

    /// Frames and dispatches the next request in `input`.
    fn frame(
        &mut self,
        at: &Inbound<'_>,
        input: &mut BytesMut,
        swallow: &mut usize,
        pending: &mut VecDeque<Pending>,
    ) -> Framed {
        match self {
            Framing::Text => crate::framing::text(at, input, swallow, pending),
            Framing::Binary(translator) => translator.frame(at, input, swallow, pending),
        }
    }

    /// Writes the reply of `head`, the oldest pending entry (complete), to `out`.
    fn finish(&mut self, head: Pending, context: &WorkerContext, out: &mut BytesMut) -> Flow {
        match self {
            Framing::Text => head.finish(context, out),
            Framing::Binary(translator) => translator.finish(head, context, out),
        }
    }

    /// Nothing is pending: what framing borrowed goes back to the worker's pools.
    fn rest(&mut self) {
        if let Framing::Binary(translator) = self {
            translator.rest();
        }
    }
}

impl<C, M, B> Future for Session<C, M, B>
where
    C: ClientConnection,
    M: Fn(BusyStart<C::Stream>) -> B + Unpin,
    B: Future<Output = Outcome<C::Stream>> + 'static,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let context = &this.open.context;
        context.sessions.register(this.open.index, cx.waker());
        loop {
            match &mut this.state {
                State::Accepted(_) => {
                    let State::Accepted(connection) =
                        std::mem::replace(&mut this.state, State::Done)
                    else {
                        return Poll::Ready(());
                    };
                    this.state = match connection.into_plain() {
                        Ok(stream) => State::Fresh(stream),
                        Err(connection) => State::Handshake(Box::pin(connection.establish())),
                    };
                }
                State::Handshake(handshake) => match handshake.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(stream)) => this.state = State::Fresh(stream),
                    Poll::Ready(None) => this.state = State::Done,
                },
                State::Fresh(stream) | State::Idle(stream) => {
                    if context.sessions.draining() {
                        let (State::Fresh(stream) | State::Idle(stream)) =
                            std::mem::replace(&mut this.state, State::Done)
                        else {
                            return Poll::Ready(());
                        };
                        this.state = State::Closing(stream);
                        continue;
                    }
                    let input = match poll_read_fresh(stream, cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(input)) if !input.is_empty() => input,
                        // The client's end (or a failed socket) with nothing in flight.
                        Poll::Ready(_) => {
                            this.state = match std::mem::replace(&mut this.state, State::Done) {
                                State::Idle(stream) => State::Closing(stream),
                                _ => State::Done,
                            };
                            continue;
                        }
                    };
                    let (fresh, stream) = match std::mem::replace(&mut this.state, State::Done) {
                        State::Fresh(stream) => (true, stream),
                        State::Idle(stream) => (false, stream),
                        _ => return Poll::Ready(()),
                    };
                    // memcached picks the protocol per connection from its first byte:
                    // 0x80 is binary.
                    if fresh && input.first() == Some(&memroute_protocol::binary::REQUEST_MAGIC) {
                        this.protocol = Protocol::Binary;
                        crate::client_log::count_for(
                            context,
                            this.open.listener.as_deref(),
                            ClientEvent::BinaryConnection,
                        );
                    }
                    this.state = State::Busy(buffers::start_busy((this.start)(BusyStart {
                        context: context.clone(),
                        listener: this.open.listener.clone(),
                        stream,
                        input,
                        slot: this.slot,
                        memory: this.memory,
                        protocol: this.protocol,
                        logged_in: this.logged_in,
                    })));
                }
                State::Busy(home) => {
                    let Some(busy) = home.as_mut().as_pin_mut() else {
                        return Poll::Ready(());
                    };
                    let outcome = match busy.poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(outcome) => outcome,
                    };
                    if let State::Busy(home) = std::mem::replace(&mut this.state, State::Done) {
                        buffers::end_busy(home);
                    }
                    if let Outcome::Idle(stream, memory, logged_in) = outcome {
                        this.memory = memory;
                        this.logged_in = logged_in;
                        this.state = State::Idle(stream);
                    }
                }
                State::Closing(stream) => {
                    return Pin::new(stream).poll_shutdown(cx).map(|_| ());
                }
                State::Done => return Poll::Ready(()),
            }
        }
    }
}

/// One busy spell of a session: from the bytes that ended an idle wait until nothing is in
/// flight or buffered again (or the connection ends).
async fn busy<C: ClientConnection>(start: BusyStart<C::Stream>) -> Outcome<C::Stream> {
    let BusyStart {
        context,
        listener,
        mut stream,
        input,
        slot,
        memory,
        protocol,
        mut logged_in,
    } = start;
    let context = &*context;
    let origin = Origin {
        slot,
        listener: listener_index(&listener),
    };
    let mut framing = Framing::new(protocol);
    let mut inbox = Inbox::new(input);
    let mut output = BytesMut::new();
    let mut pending: VecDeque<Pending> = VecDeque::new();
    // Shutting down: keep serving, but close as soon as the connection is idle (nothing in
    // flight, nothing buffered), so no request the client already sent is lost.
    let mut draining = context.sessions.draining();
    // This session's share of the process-wide reply budget, and whether it is paused.
    let mut charge = Charge::resume(&context.metrics.shared, memory);
    let mut paused = false;
    loop {
        // One clock read per wake-up: every request parsed and every reply finished below
        // is timed against it (no per-request clock reads).
        context.stats().tick();
        // One routing snapshot per batch of requests parsed: a reload applies from the next
        // batch. Dropped before any wait, so an idle session keeps no old connections open.
        let routing = context.routing();
        let max_pending = routing.max_client_pending;
        let budget = routing.reply_budget;
        let peer = || Peer {
            address: C::describe(&stream),
            listener: listener.clone(),
        };
        let login = LoginGate::new(routing.login_of(origin.listener), logged_in);
        let at = Inbound {
            context,
            routing: &routing,
            origin,
            peer: &peer,
            login: &login,
        };
        let need_input =
            framing.frame_batch(&at, &mut inbox, &mut pending, &mut charge, &mut paused);
        logged_in = login.logged_in();
        drop(routing);
        inbox.give_back_if_parsed();
        let rendered =
            framing.render_complete(context, &mut pending, &mut output, &mut charge, &mut paused);
        if !output.is_empty() {
            let written = charge.write_all(&mut stream, &output, pending.len(), &budget);
            // flush: a TLS stream holds encrypted records until asked (no-op for plain TCP).
            if written.await.is_err() || stream.flush().await.is_err() {
                return Outcome::Closed;
            }
        }
        give_back_written(&mut output);
        let idle = pending.is_empty() && inbox.is_empty();
        if rendered.closing || (!inbox.reading && pending.is_empty()) || (draining && idle) {
            let _ = stream.shutdown().await;
            return Outcome::Closed;
        }
        if rendered.batch_full {
            // More replies are complete than one batch holds: the worker's other sessions
            // run before the next batch is rendered.
            tokio::task::yield_now().await;
            continue;
        }
        if inbox.reading && !need_input && pending.len() < max_pending && !paused {
            // Parsing stopped at the pending cap and replies have drained since: parse the
            // requests already buffered before waiting for anything.
            continue;
        }
        let can_read = inbox.reading && need_input;
        if pending.is_empty() {
            QUEUES.with(|queues| queues.give(&mut pending));
            framing.rest();
            if can_read && idle {
                // Nothing in flight, nothing buffered: the next bytes are waited for by the
                // small idle session, and this state goes back to the worker's pool.
                return Outcome::Idle(stream, charge.memory(), logged_in);
            }
        }
        let input = &mut inbox.input;
        tokio::select! {
            _ = wait_head(&mut pending), if !pending.is_empty() => {}
            read = std::future::poll_fn(|cx| poll_read_some(&mut stream, input, cx)), if can_read => match read {
                Ok(0) | Err(_) => inbox.reading = false,
                Ok(_) => {}
            },
            _ = crate::session_wakers::drained(&context.sessions), if inbox.reading && !draining => draining = true,
        }
    }
}

/// A busy session's side of the client's bytes.
struct Inbox {
    /// Read and not yet framed.
    input: BytesMut,
    /// Bytes of a rejected data block still to be discarded as they arrive.
    swallow: usize,
    /// Whether the client may still send: false once it closed, or a request closed the
    /// connection (its earlier requests are still answered).
    reading: bool,
}

impl Inbox {
    fn new(input: BytesMut) -> Inbox {
        Inbox {
            input,
            swallow: 0,
            reading: true,
        }
    }

    /// Everything read was parsed: the buffer goes back for the next reader.
    #[inline]
    fn give_back_if_parsed(&mut self) {
        if self.input.is_empty() && self.input.capacity() > 0 {
            buffers::give(std::mem::take(&mut self.input));
        }
    }

    /// Nothing buffered and nothing left to discard.
    fn is_empty(&self) -> bool {
        self.input.is_empty() && self.swallow == 0
    }
}

/// The rendered replies are written: the buffer goes back (or is freed if a huge reply grew
/// it). Written inline in `busy`, not in an async helper: a nested future there cost a plain
/// get 1-2% more instructions (callgrind).
#[inline]
fn give_back_written(output: &mut BytesMut) {
    if output.capacity() > 0 {
        buffers::give(std::mem::take(output));
    }
}

/// What rendering the complete replies came to.
struct Rendered {
    /// How many replies were written to the output.
    finished: usize,
    /// A reply closes the connection (written; nothing after it is).
    closing: bool,
    /// The output holds a batch's worth; more replies may be complete.
    batch_full: bool,
}

impl Framing {
    /// Frames and dispatches the requests buffered in `inbox` while the client may send
    /// more (under the pending cap and the reply budget). Read more only when what is
    /// buffered holds no whole request: stopping at the pending cap alone is not enough, as
    /// the input buffer would keep growing with requests that are read but not yet parsed.
    /// Returns whether it stopped for want of bytes.
    #[inline]
    fn frame_batch(
        &mut self,
        at: &Inbound<'_>,
        inbox: &mut Inbox,
        pending: &mut VecDeque<Pending>,
        charge: &mut Charge<'_>,
        paused: &mut bool,
    ) -> bool {
        let max_pending = at.routing.max_client_pending;
        let budget = &at.routing.reply_budget;
        while inbox.reading
            && pending.len() < max_pending
            && charge.may_read(budget, pending.len(), paused)
        {
            if pending.capacity() == 0 {
                QUEUES.with(|queues| queues.fill(pending));
            }
            if inbox.swallow > 0 && buffers::skip_refused(&mut inbox.input, &mut inbox.swallow) {
                return true;
            }
            match self.frame(at, &mut inbox.input, &mut inbox.swallow, pending) {
                Framed::Next => {}
                Framed::Incomplete => return true,
                Framed::Close => inbox.reading = false,
            }
        }
        false
    }

    /// Every reply already complete goes to `output`, in order, for one write (up to
    /// MAX_WRITE_BATCH; the rest after a yield), charged to the session's reply budget.
    #[inline]
    fn render_complete(
        &mut self,
        context: &WorkerContext,
        pending: &mut VecDeque<Pending>,
        output: &mut BytesMut,
        charge: &mut Charge<'_>,
        paused: &mut bool,
    ) -> Rendered {
        let written_before = output.len();
        let mut rendered = Rendered {
            finished: 0,
            closing: false,
            batch_full: false,
        };
        while let Some(head) = pending.front_mut() {
            if output.len() >= MAX_WRITE_BATCH {
                rendered.batch_full = true;
                break;
            }
            if !head.try_complete() {
                break;
            }
            let Some(head) = pending.pop_front() else {
                break;
            };
            if output.capacity() == 0 {
                *output = buffers::take();
            }
            rendered.finished += 1;
            if self.finish(head, context, output) == Flow::Close {
                rendered.closing = true;
                break;
            }
        }
        charge.observe(output.len() - written_before, rendered.finished);
        if rendered.finished > 0 {
            // A pause is decided against the replies outstanding then; some came back.
            *paused = false;
        }
        rendered
    }
}

/// The place in `proxy.listen` of the listener a client came in on (0, the first, for a
/// session not accepted by a listener).
fn listener_index(listener: &Option<Rc<crate::client_log::ListenerEvents>>) -> usize {
    listener.as_ref().map_or(0, |events| events.index)
}

/// The read that ends an idle wait, into a buffer borrowed from the worker's pool and
/// given back unless bytes arrived. Empty at the client's end.
fn poll_read_fresh<R: AsyncRead + Unpin>(
    reader: &mut R,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<BytesMut>> {
    let mut input = BytesMut::new();
    match poll_read_some(reader, &mut input, cx) {
        Poll::Ready(Ok(n)) if n > 0 => Poll::Ready(Ok(input)),
        Poll::Ready(Ok(_)) => Poll::Ready(Ok(BytesMut::new())),
        Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        Poll::Pending => Poll::Pending,
    }
}

/// One read. Into `input` when it holds partial bytes; otherwise into a buffer borrowed
/// from the worker's pool for this poll only, given back if nothing arrives.
fn poll_read_some<R: AsyncRead + Unpin>(
    reader: &mut R,
    input: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<usize>> {
    let borrowed = input.is_empty();
    if borrowed {
        *input = buffers::take();
    } else if input.capacity() - input.len() < CHUNK / 4 {
        input.reserve(CHUNK);
    }
    let read = std::pin::pin!(reader.read_buf(input)).poll(cx);
    if borrowed && !matches!(read, Poll::Ready(Ok(n)) if n > 0) {
        buffers::give(std::mem::take(input));
    }
    read
}

async fn wait_head(pending: &mut VecDeque<Pending>) {
    crate::pending::wait_head(pending, |entry| entry).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what a function returns, without calling it.
    fn output_size<A, R>(_: fn(A) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    fn output_size2<A, B, R>(_: fn(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// tokio stores a task as header (32 bytes) + scheduler handle and id (16) + the future
    /// behind an 8-byte stage tag + trailer (48), rounded up to its 128-byte alignment: a
    /// session future of at most 152 bytes keeps every idle connection's task in 256 bytes.
    /// Layout, not timing: this fails when a change makes idle connections bigger.
    #[test]
    fn an_idle_session_task_fits_in_256_bytes() {
        let session: fn(OpenSession, memroute_net::Incoming) -> _ = run;
        let session = output_size2(session);
        let busy: fn(BusyStart<memroute_net::Stream>) -> _ = busy::<memroute_net::Incoming>;
        let busy = output_size(busy);
        eprintln!("session future {session} bytes, busy future {busy} bytes (pooled)");
        assert!(session <= 152, "session future {session} bytes");
        // The stream is most of it; a TLS stream's state is boxed so plaintext does not pay.
        assert!(std::mem::size_of::<memroute_net::Stream>() <= 48);
    }
}
