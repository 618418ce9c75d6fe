//! One client connection: frame requests, dispatch them, write replies in request order.
//!
//! ```text
//!   read -> parse_request -> dispatch -> pending FIFO (one entry per request)
//!                                            | head completes (backend reply, merge, local answer)
//!   write <- one flush per batch of completed replies
//! ```
//!
//! At most `max_client_pending` requests are outstanding per client: past that we stop
//! reading, so a client that pipelines without reading its replies cannot grow our memory.
//!
//! An idle session holds no buffer: reads go into a buffer borrowed from the worker's pool
//! (see `buffers`) and handed back when the read would block or everything read was
//! parsed; replies are gathered in a pooled buffer only while they are being written; the
//! pending queue's storage goes back to a per-worker pool whenever the queue is empty.
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use memroute_protocol::{parse_request, Parse};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::budget::Charge;
use crate::buffers::{self, QueuePool, CHUNK};
use crate::context::WorkerContext;
use crate::dispatch::dispatch;
use crate::pending::{Flow, Pending};

/// A client connection as accepted: it becomes a byte stream (after a TLS handshake, for
/// a TLS listener) inside the session's own task, so a slow handshake holds up nobody.
pub(crate) trait ClientConnection {
    type Stream: AsyncRead + AsyncWrite + Unpin;
    /// The peer as client error logs name it (`ip:port`, `unix-socket`, ...).
    fn peer(&self) -> String;
    /// The stream to serve, or `None` when the connection ended before it was usable.
    fn establish(self) -> impl Future<Output = Option<Self::Stream>>;
}

impl ClientConnection for memroute_net::Incoming {
    type Stream = memroute_net::Stream;

    fn peer(&self) -> String {
        self.peer.clone()
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
}

/// A counted client connection: taken when the session is spawned, released (the
/// connection count decremented, the worker's drain signal dropped) when it ends.
#[derive(Debug)]
pub(crate) struct OpenSession {
    pub context: Rc<WorkerContext>,
    /// Every session holds a clone; the worker's drain wait ends when all are dropped.
    pub _alive: tokio::sync::mpsc::Sender<()>,
    /// The client error counters of the listener it came in on.
    pub listener: Option<Rc<crate::client_log::ListenerEvents>>,
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.context.metrics.shared.connections_current.dec();
    }
}

thread_local! {
    /// Storage of pending queues of this worker's idle sessions, reused by the busy ones.
    static QUEUES: QueuePool<Pending> = const { QueuePool::new() };
}

/// Not an `async fn`: an async fn moves its arguments into locals and keeps the argument
/// slots too, so every idle session would store its stream and shutdown receiver twice.
/// The block below uses the captured values in place; this future is the whole task (see
/// `worker::spawn_session`), so nothing wraps it.
#[allow(clippy::manual_async_fn)] // on purpose, see above
pub(crate) fn run<C>(
    open: OpenSession,
    connection: C,
    mut shutdown: watch::Receiver<bool>,
) -> impl Future<Output = ()>
where
    C: ClientConnection,
{
    async move {
        let context = &open.context;
        let peer = crate::client_log::Peer {
            address: connection.peer(),
            listener: open.listener.clone(),
        };
        let Some(mut stream) = connection.establish().await else {
            return;
        };
        let slot = context.session_slot();
        // Both empty and unallocated while the session is idle.
        let mut input = BytesMut::new();
        let mut output = BytesMut::new();
        let mut pending: VecDeque<Pending> = VecDeque::new();
        // Bytes of a rejected data block still to be discarded as they arrive.
        let mut swallow = 0usize;
        let mut reading = true;
        // memcached picks the protocol per connection from its first byte: 0x80 is binary.
        // Waiting for it is the idle wait of a connection that has sent nothing yet (no
        // buffer held: the read borrows one from the worker's pool).
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            read = std::future::poll_fn(|cx| poll_read_some(&mut stream, &mut input, cx)) => {
                if !matches!(read, Ok(n) if n > 0) {
                    return;
                }
            }
            _ = shutdown.changed() => {
                let _ = stream.shutdown().await;
                return;
            }
        }
        if input.first() == Some(&memroute_protocol::binary::REQUEST_MAGIC) {
            let (reader, writer) = tokio::io::split(stream);
            let binary =
                crate::binary::run(context.clone(), slot, input, reader, writer, shutdown, peer);
            // Boxed: inline, the binary session's state would size every text session's task.
            return Box::pin(binary).await;
        }
        // Shutting down: keep serving, but close as soon as the connection is idle (nothing in
        // flight, nothing buffered), so no request the client already sent is lost.
        let mut draining = *shutdown.borrow();
        // This session's share of the process-wide reply budget, and whether it is paused.
        let mut charge = Charge::new(context.metrics.shared.clone());
        let mut paused = false;
        // One future for the whole session: re-creating it per loop would register and
        // unregister a waiter on the shared watch channel for every request.
        let mut stop = std::pin::pin!(shutdown.changed());
        loop {
            // Read more only when what is buffered holds no whole request. Stopping at the
            // pending cap alone is not enough: the input buffer would keep growing with
            // requests that are read but not yet parsed.
            let mut need_input = false;
            // One clock read per wake-up: every request parsed and every reply finished below
            // is timed against it (no per-request clock reads).
            context.stats().tick();
            // One routing snapshot per batch of requests parsed: a reload applies from the next
            // batch. Dropped before any wait, so an idle session keeps no old connections open.
            let routing = context.routing();
            let max_pending = routing.max_client_pending;
            let budget = routing.reply_budget;
            while reading
                && pending.len() < max_pending
                && charge.may_read(&budget, pending.len(), &mut paused)
            {
                if pending.capacity() == 0 {
                    QUEUES.with(|queues| queues.fill(&mut pending));
                }
                if swallow > 0 {
                    let skip = swallow.min(input.len());
                    input.advance(skip);
                    swallow -= skip;
                    if swallow > 0 {
                        need_input = true;
                        break;
                    }
                }
                match parse_request(&mut input, &routing.limits) {
                    Parse::Request(request) => {
                        if dispatch(context, &routing, slot, request, &mut pending) == Flow::Close {
                            reading = false;
                        }
                    }
                    Parse::Incomplete => {
                        need_input = true;
                        break;
                    }
                    Parse::Invalid {
                        reply,
                        swallow: rest,
                        close,
                    } => {
                        crate::client_log::text_error(context, &peer, &reply, close);
                        pending.push_back(Pending::Ready(Bytes::from(reply.to_bytes())));
                        swallow = rest;
                        if close {
                            pending.push_back(Pending::Close);
                            reading = false;
                        }
                    }
                }
            }
            drop(routing);
            if input.is_empty() && input.capacity() > 0 {
                // Everything read was parsed: the buffer goes back for the next reader.
                buffers::give(std::mem::take(&mut input));
            }

            // Every reply already complete goes out now, in order, in one write.
            let mut closing = false;
            let (written_before, mut finished) = (output.len(), 0);
            while let Some(head) = pending.front_mut() {
                if !head.try_complete() {
                    break;
                }
                let Some(head) = pending.pop_front() else {
                    break;
                };
                if output.capacity() == 0 {
                    output = buffers::take();
                }
                finished += 1;
                if head.finish(context, &mut output) == Flow::Close {
                    closing = true;
                    break;
                }
            }
            charge.observe(output.len() - written_before, finished);
            if finished > 0 {
                // A pause is decided against the replies outstanding then; some came back.
                paused = false;
            }
            if !output.is_empty() {
                let written = charge.write_all(&mut stream, &output, pending.len(), &budget);
                // flush: a TLS stream holds encrypted records until asked (no-op for plain TCP).
                if written.await.is_err() || stream.flush().await.is_err() {
                    return;
                }
            }
            if output.capacity() > 0 {
                // Written: the buffer goes back (or is freed if a huge reply grew it).
                buffers::give(std::mem::take(&mut output));
            }
            let idle = pending.is_empty() && input.is_empty() && swallow == 0;
            if closing || (!reading && pending.is_empty()) || (draining && idle) {
                let _ = stream.shutdown().await;
                return;
            }
            if reading && !need_input && pending.len() < max_pending && !paused {
                // Parsing stopped at the pending cap and replies have drained since: parse the
                // requests already buffered before waiting for anything.
                continue;
            }

            let can_read = reading && need_input;
            if pending.is_empty() {
                QUEUES.with(|queues| queues.give(&mut pending));
            }
            tokio::select! {
                _ = wait_head(&mut pending), if !pending.is_empty() => {}
                read = std::future::poll_fn(|cx| poll_read_some(&mut stream, &mut input, cx)), if can_read => match read {
                    Ok(0) | Err(_) => reading = false,
                    Ok(_) => {}
                },
                _ = &mut stop, if reading && !draining => draining = true,
            }
        }
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
    if let Some(head) = pending.front_mut() {
        head.wait().await;
    }
}
