//! One pipelined connection to one memcached server, owned by one worker thread.
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use memroute_protocol::{parse_reply, Limits, ReplyKind, ReplyParse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::{Instant, MissedTickBehavior};

use crate::BackendError;

/// Where the reply to one request goes.
pub type ReplySlot = oneshot::Sender<Result<Bytes, BackendError>>;

/// How one connection behaves; built from the pool's config.
#[derive(Debug, Clone)]
pub struct ConnectionSettings {
    /// `host:port` of the server.
    pub address: Arc<str>,
    /// A reply must start arriving within this long, or the connection is broken.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// First reconnect delay after a failure; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Limits used to frame replies (value size).
    pub limits: Limits,
}

/// A request queued for the connection task.
#[derive(Debug)]
struct Queued {
    /// Bytes to send: a frame, possibly in two pieces (a `noreply` token cut out).
    parts: (Bytes, Option<Bytes>),
    kind: ReplyKind,
    reply: ReplySlot,
}

/// A request written to the server whose reply has not been read yet.
#[derive(Debug)]
struct InFlight {
    kind: ReplyKind,
    reply: ReplySlot,
    sent_at: Instant,
}

/// The sending side of a connection, cloned into every session of the worker.
#[derive(Debug, Clone)]
pub struct BackendHandle {
    queue: mpsc::UnboundedSender<Queued>,
    address: Arc<str>,
}

impl BackendHandle {
    /// Queues a request; its reply (or the reason there is none) arrives on the receiver.
    pub fn send(
        &self,
        parts: (Bytes, Option<Bytes>),
        kind: ReplyKind,
    ) -> oneshot::Receiver<Result<Bytes, BackendError>> {
        let (reply, receiver) = oneshot::channel();
        if let Err(mpsc::error::SendError(queued)) = self.queue.send(Queued { parts, kind, reply })
        {
            let _ = queued.reply.send(Err(BackendError::Closed {
                server: self.address.clone(),
            }));
        }
        receiver
    }

    pub fn address(&self) -> &Arc<str> {
        &self.address
    }
}

/// Starts the connection task on the current `LocalSet` and returns its handle.
/// The task connects at once and lives until every handle is dropped.
pub fn spawn_connection(settings: ConnectionSettings) -> BackendHandle {
    let (queue, receiver) = mpsc::unbounded_channel();
    let handle = BackendHandle {
        queue,
        address: settings.address.clone(),
    };
    tokio::task::spawn_local(run(settings, receiver));
    handle
}

/// Connect, serve until the connection breaks, fail fast during backoff, repeat.
async fn run(settings: ConnectionSettings, mut queue: mpsc::UnboundedReceiver<Queued>) {
    let mut backoff = settings.backoff_min;
    loop {
        let reason: Arc<str> = match tokio::time::timeout(
            settings.connect_timeout,
            TcpStream::connect(&*settings.address),
        )
        .await
        {
            Ok(Ok(stream)) => {
                // Small requests must not wait for Nagle: latency is the product.
                let _ = stream.set_nodelay(true);
                tracing::debug!(server = %settings.address, "backend connected");
                let (outcome, answered) = serve(&settings, stream, &mut queue).await;
                // Only a server that answered is healthy: one that accepts connections but
                // never replies (stopped, overloaded) keeps backing off.
                if answered {
                    backoff = settings.backoff_min;
                }
                match outcome {
                    None => return,
                    Some(error) => {
                        tracing::warn!(server = %settings.address, %error, "backend connection lost");
                        error.reason()
                    }
                }
            }
            Ok(Err(error)) => Arc::from(error.to_string()),
            Err(_) => Arc::from("connect timed out"),
        };
        tracing::debug!(server = %settings.address, %reason, retry_in = ?backoff, "backend down");
        // Until the next attempt, requests fail at once rather than queue behind a dead server.
        let retry_at = Instant::now() + backoff;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(retry_at) => break,
                queued = queue.recv() => match queued {
                    Some(queued) => {
                        let _ = queued.reply.send(Err(BackendError::Unavailable {
                            server: settings.address.clone(),
                            reason: reason.clone(),
                        }));
                    }
                    None => return,
                },
            }
        }
        backoff = (backoff * 2).min(settings.backoff_max);
    }
}

/// What the writer and reader halves of one connection share.
#[derive(Debug, Default)]
struct Link {
    in_flight: RefCell<VecDeque<InFlight>>,
    /// Wakes an idle reader when the writer sends the first request after a quiet spell,
    /// so an idle connection needs no timer at all.
    wake_reader: Notify,
    /// At least one reply was read on this connection.
    answered: Cell<bool>,
}

/// Runs one established connection. Returns `None` when every handle is gone (shut down),
/// or the error that broke the connection (every request in flight gets that error), and
/// whether the server answered anything on it.
async fn serve(
    settings: &ConnectionSettings,
    mut stream: TcpStream,
    queue: &mut mpsc::UnboundedReceiver<Queued>,
) -> (Option<BackendError>, bool) {
    let link = Link::default();
    let in_flight = &link.in_flight;
    let (read_half, write_half) = stream.split();
    let outcome = tokio::select! {
        outcome = write_requests(settings, write_half, queue, &link) => outcome,
        outcome = read_replies(settings, read_half, &link) => outcome,
    };
    let error = match outcome {
        Ok(()) => BackendError::Closed {
            server: settings.address.clone(),
        },
        Err(error) => error,
    };
    for request in in_flight.take() {
        let _ = request.reply.send(Err(error.clone()));
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

/// Largest batch written with one syscall; more queued requests go in the next write.
const MAX_WRITE_BATCH: usize = 256 * 1024;

async fn write_requests(
    settings: &ConnectionSettings,
    mut socket: tokio::net::tcp::WriteHalf<'_>,
    queue: &mut mpsc::UnboundedReceiver<Queued>,
    link: &Link,
) -> Result<(), BackendError> {
    let in_flight = &link.in_flight;
    let mut batch = BytesMut::with_capacity(16 * 1024);
    loop {
        let Some(first) = queue.recv().await else {
            return Ok(());
        };
        let sent_at = Instant::now();
        if in_flight.borrow().is_empty() {
            link.wake_reader.notify_one();
        }
        enqueue(&mut batch, in_flight, first, sent_at);
        // Everything already queued goes out in the same write: this is the pipelining.
        while batch.len() < MAX_WRITE_BATCH {
            match queue.try_recv() {
                Ok(queued) => enqueue(&mut batch, in_flight, queued, sent_at),
                Err(_) => break,
            }
        }
        socket
            .write_all(&batch)
            .await
            .map_err(|e| BackendError::Unavailable {
                server: settings.address.clone(),
                reason: Arc::from(e.to_string()),
            })?;
        batch.clear();
    }
}

fn enqueue(
    batch: &mut BytesMut,
    in_flight: &RefCell<VecDeque<InFlight>>,
    queued: Queued,
    sent_at: Instant,
) {
    batch.extend_from_slice(&queued.parts.0);
    if let Some(rest) = &queued.parts.1 {
        batch.extend_from_slice(rest);
    }
    in_flight.borrow_mut().push_back(InFlight {
        kind: queued.kind,
        reply: queued.reply,
        sent_at,
    });
}

async fn read_replies(
    settings: &ConnectionSettings,
    mut socket: tokio::net::tcp::ReadHalf<'_>,
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
    loop {
        loop {
            let Some(kind) = in_flight.borrow().front().map(|f| f.kind) else {
                break;
            };
            match parse_reply(&buffer, kind, &settings.limits) {
                Ok(ReplyParse::Complete(len)) => {
                    let reply = buffer.split_to(len).freeze();
                    if let Some(request) = in_flight.borrow_mut().pop_front() {
                        let _ = request.reply.send(Ok(reply));
                    }
                    link.answered.set(true);
                }
                Ok(ReplyParse::Incomplete) => break,
                Err(_) => return Err(bad_reply()),
            }
        }
        if !buffer.is_empty() && in_flight.borrow().is_empty() {
            // Bytes nobody asked for: the stream is out of step with our FIFO.
            return Err(bad_reply());
        }
        if buffer.capacity() - buffer.len() < 4096 {
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
                Err(e) => return Err(BackendError::Unavailable {
                    server: settings.address.clone(),
                    reason: Arc::from(e.to_string()),
                }),
            },
            _ = tick.tick(), if !idle => {
                let overdue = in_flight
                    .borrow()
                    .front()
                    .is_some_and(|f| f.sent_at.max(last_progress).elapsed() > settings.timeout);
                if overdue {
                    return Err(BackendError::Timeout { server: settings.address.clone() });
                }
            }
            _ = link.wake_reader.notified(), if idle => {}
        }
    }
}
