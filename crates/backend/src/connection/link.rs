//! One established connection: the writer half sends what is queued, the reader half
//! answers the requests in flight in order.
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use memroute_net::Stream;
use memroute_protocol::{parse_reply_counting, ReplyKind, ReplyParse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, MissedTickBehavior};

use crate::BackendError;

use super::in_flight::{InFlight, Link};
use super::outgoing::Shared;
use super::run_reader::RunReader;
use super::settings::{down_error, ConnectionSettings, CONNECTION_REFUSED};

/// Runs one established connection. Returns `None` when every handle is gone (shut down),
/// or the error that broke the connection (every request in flight gets that error), and
/// whether the server answered anything on it.
pub(super) async fn serve(
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

pub(super) fn outcome_is_shutdown(error: &BackendError) -> bool {
    matches!(error, BackendError::Closed { .. })
}

/// A write buffer grown past this by a burst is not kept for the next one.
pub(super) const KEEP_WRITE_BUFFER: usize = 1024 * 1024;

pub(super) async fn write_requests(
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
pub(super) fn socket_error(settings: &ConnectionSettings, error: std::io::Error) -> BackendError {
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

pub(super) async fn read_replies(
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
    // The reply to a run of coalesced gets is handed out request by request as its
    // blocks arrive (`RunReader`).
    let mut run_reader = RunReader::default();
    loop {
        answer_complete(settings, link, &mut buffer, &mut run_reader, last_progress)?;
        make_room(&mut buffer);
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
                let overdue = oldest_overdue(settings, link, last_progress);
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

/// Answers, in order, every request in flight whose reply `buffer` holds complete (a
/// coalesced run's requests as their blocks arrive), leaving a partial reply in `buffer`.
/// Fails on a reply that does not parse, or on bytes no request asked for.
#[inline]
fn answer_complete(
    settings: &ConnectionSettings,
    link: &Link,
    buffer: &mut BytesMut,
    run_reader: &mut RunReader,
    last_progress: Instant,
) -> Result<(), BackendError> {
    let in_flight = &link.in_flight;
    let bad_reply = || BackendError::BadReply {
        server: settings.address.clone(),
    };
    loop {
        let Some((kind, run)) = in_flight.borrow().front().map(|f| (f.kind, f.run)) else {
            break;
        };
        if run.legs > 1 || run_reader.left > 0 {
            let answer = |request: InFlight, reply: Bytes, value_blocks: u32| {
                observe_round_trip(settings, &request, last_progress);
                request.reply.send_retrieval(reply, value_blocks);
                answered(settings, link);
            };
            match run_reader.read(buffer, run.legs, &settings.limits, link, answer) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(()) => return Err(bad_reply()),
            }
        }
        match parse_reply_counting(buffer, kind, &settings.limits) {
            Ok((ReplyParse::Complete(len), value_blocks)) => {
                let reply = buffer.split_to(len).freeze();
                if let Some(request) = in_flight.borrow_mut().pop_front() {
                    observe_round_trip(settings, &request, last_progress);
                    // A retrieval's count of VALUE blocks goes with it: a warm-up
                    // knows from it whether cold missed a key of the batch.
                    match kind {
                        ReplyKind::Retrieval => request.reply.send_retrieval(reply, value_blocks),
                        _ => request.reply.send(Ok(reply)),
                    }
                }
                answered(settings, link);
            }
            Ok((ReplyParse::Incomplete, _)) => break,
            Err(_) => return Err(bad_reply()),
        }
    }
    if !buffer.is_empty() && in_flight.borrow().is_empty() {
        // Bytes nobody asked for: the stream is out of step with our FIFO.
        return Err(bad_reply());
    }
    Ok(())
}

/// Tells the round-trip observer how long `request` took. No clock read of its own: the
/// batch's write time and the time the bytes were read are already known.
#[inline]
fn observe_round_trip(settings: &ConnectionSettings, request: &InFlight, last_progress: Instant) {
    if let Some(round_trips) = &settings.round_trips {
        (round_trips.0)(last_progress.saturating_duration_since(request.sent_at));
    }
}

/// A reply was read: the server answers.
#[inline]
fn answered(settings: &ConnectionSettings, link: &Link) {
    link.answered.set(true);
    settings.health.record_success();
}

/// Room to read into. Replies split off this buffer are usually still on their way to
/// the client now (the session runs after this task yields), so reserving here would
/// allocate a fresh block every ~16 KiB of replies. Reclaim in place when they are gone;
/// else read into the room left and retry next time, allocating only when nearly full.
#[inline]
fn make_room(buffer: &mut BytesMut) {
    let room = buffer.capacity() - buffer.len();
    if room < 4096 && !buffer.try_reclaim(16 * 1024) && room < 1024 {
        buffer.reserve(16 * 1024);
    }
}

/// Whether the oldest request in flight has waited past the timeout, counted from the
/// later of its send and the last bytes read.
fn oldest_overdue(settings: &ConnectionSettings, link: &Link, last_progress: Instant) -> bool {
    link.in_flight
        .borrow()
        .front()
        .is_some_and(|f| f.sent_at.max(last_progress).elapsed() > settings.timeout)
}
