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
use std::collections::VecDeque;
use std::rc::Rc;

use bytes::{Buf, Bytes, BytesMut};
use memroute_protocol::{parse_request, Parse};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::budget::Charge;
use crate::dispatch::{dispatch, Flow, Pending};
use crate::worker::WorkerContext;

const READ_CHUNK: usize = 16 * 1024;

pub(crate) async fn run<R, W>(
    context: Rc<WorkerContext>,
    mut reader: R,
    mut writer: W,
    mut shutdown: watch::Receiver<bool>,
    peer: String,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let slot = context.session_slot();
    // This session's share of the process-wide reply budget, and whether it is paused.
    let mut charge = Charge::new(context.metrics.shared.clone());
    let mut paused = false;
    let mut input = BytesMut::with_capacity(READ_CHUNK);
    // memcached picks the protocol per connection from its first byte: 0x80 is binary.
    if !*shutdown.borrow() {
        tokio::select! {
            read = reader.read_buf(&mut input) => if !matches!(read, Ok(n) if n > 0) { return },
            _ = shutdown.changed() => return,
        }
    }
    if input.first() == Some(&memroute_protocol::binary::REQUEST_MAGIC) {
        let binary = crate::binary::run(context, slot, input, reader, writer, shutdown, peer);
        return binary.await;
    }
    let mut output = BytesMut::with_capacity(READ_CHUNK);
    let mut pending: VecDeque<Pending> = VecDeque::new();
    // Bytes of a rejected data block still to be discarded as they arrive.
    let mut swallow = 0usize;
    let mut reading = true;
    // Shutting down: keep serving, but close as soon as the connection is idle (nothing in
    // flight, nothing buffered), so no request the client already sent is lost.
    let mut draining = *shutdown.borrow();
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
                    if dispatch(&context, &routing, slot, request, &mut pending) == Flow::Close {
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
                    crate::client_log::text_error(&context, &peer, &reply, close);
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
            finished += 1;
            if head.finish(&context, &mut output) == Flow::Close {
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
            let written = charge.write_all(&mut writer, &output, pending.len(), &budget);
            // flush: a TLS stream holds encrypted records until asked (no-op for plain TCP).
            if written.await.is_err() || writer.flush().await.is_err() {
                return;
            }
            output.clear();
            if output.capacity() > 4 * READ_CHUNK {
                // A huge multi-get reply should not pin its buffer for the connection's life.
                output = BytesMut::with_capacity(READ_CHUNK);
            }
        }
        let idle = pending.is_empty() && input.is_empty() && swallow == 0;
        if closing || (!reading && pending.is_empty()) || (draining && idle) {
            let _ = writer.shutdown().await;
            return;
        }
        if reading && !need_input && pending.len() < max_pending && !paused {
            // Parsing stopped at the pending cap and replies have drained since: parse the
            // requests already buffered before waiting for anything.
            continue;
        }

        let can_read = reading && need_input;
        if can_read && input.capacity() - input.len() < READ_CHUNK / 4 {
            input.reserve(READ_CHUNK);
        }
        tokio::select! {
            _ = wait_head(&mut pending), if !pending.is_empty() => {}
            read = reader.read_buf(&mut input), if can_read => match read {
                Ok(0) | Err(_) => reading = false,
                Ok(_) => {}
            },
            _ = &mut stop, if reading && !draining => draining = true,
        }
    }
}

async fn wait_head(pending: &mut VecDeque<Pending>) {
    if let Some(head) = pending.front_mut() {
        head.wait().await;
    }
}
