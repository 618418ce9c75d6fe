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

use crate::{BackendError, ServerHealth};

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
    /// The server's health, shared with every other connection to it (all workers) and
    /// its prober: this connection reports failures and successes to it, and fails
    /// requests fast while it says the server is down.
    pub health: Arc<ServerHealth>,
    /// Told the time from writing each request to reading its reply (metrics).
    pub round_trips: Option<RoundTrips>,
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
    health: Arc<ServerHealth>,
}

impl BackendHandle {
    /// Queues a request; its reply (or the reason there is none) arrives on the receiver.
    pub fn send(
        &self,
        parts: (Bytes, Option<Bytes>),
        kind: ReplyKind,
    ) -> oneshot::Receiver<Result<Bytes, BackendError>> {
        let (reply, receiver) = oneshot::channel();
        if self.health.is_down() {
            let _ = reply.send(Err(self.down_error()));
            return receiver;
        }
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

    pub fn health(&self) -> &Arc<ServerHealth> {
        &self.health
    }

    fn down_error(&self) -> BackendError {
        down_error(&self.address, &self.health)
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
    let (queue, receiver) = mpsc::unbounded_channel();
    let handle = BackendHandle {
        queue,
        address: settings.address.clone(),
        health: settings.health.clone(),
    };
    tokio::task::spawn_local(run(settings, receiver));
    handle
}

/// Connect, serve until the connection breaks, fail fast during backoff, repeat.
async fn run(settings: ConnectionSettings, mut queue: mpsc::UnboundedReceiver<Queued>) {
    let health = &settings.health;
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
                health.connection_opened();
                let (outcome, answered) = serve(&settings, stream, &mut queue).await;
                health.connection_closed();
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
            // Nothing listens there: the server is not running, and waiting for more
            // failures would only fail more requests slowly.
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                let reason: Arc<str> = Arc::from("connection refused");
                health.mark_down(&reason);
                reason
            }
            Ok(Err(error)) => {
                let reason: Arc<str> = Arc::from(error.to_string());
                health.record_failure(&reason);
                reason
            }
            Err(_) => {
                let reason: Arc<str> = Arc::from("connect timed out");
                health.record_failure(&reason);
                reason
            }
        };
        tracing::debug!(server = %settings.address, %reason, retry_in = ?backoff, "backend down");
        // Until the next attempt, requests fail at once rather than queue behind a dead
        // server. A server the prober brings back is reconnected at once, not after the
        // rest of a backoff that may have grown to seconds.
        let retry_at = Instant::now()
            + match health.is_down() {
                true => DOWN_RETRY,
                false => backoff,
            };
        let recovered = health.wait_recovered();
        tokio::pin!(recovered);
        let woke_early = loop {
            tokio::select! {
                _ = tokio::time::sleep_until(retry_at) => break false,
                _ = &mut recovered => break true,
                queued = queue.recv() => match queued {
                    Some(queued) => {
                        let error = match health.is_down() {
                            true => down_error(&settings.address, health),
                            false => BackendError::NotConnected {
                                server: settings.address.clone(),
                                reason: reason.clone(),
                            },
                        };
                        let _ = queued.reply.send(Err(error));
                    }
                    None => return,
                },
            }
        };
        backoff = match woke_early {
            true => settings.backoff_min,
            false => (backoff * 2).min(settings.backoff_max),
        };
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
        if settings.health.is_down() {
            // Queued before the server was marked down (maybe by another worker): fail
            // them unsent rather than write them to a server judged dead.
            fail_down(settings, first);
            while let Ok(queued) = queue.try_recv() {
                fail_down(settings, queued);
            }
            continue;
        }
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

fn fail_down(settings: &ConnectionSettings, queued: Queued) {
    let _ = queued
        .reply
        .send(Err(down_error(&settings.address, &settings.health)));
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
                        // No clock read of its own: the batch's write time and the time
                        // the bytes were read are already known.
                        if let Some(round_trips) = &settings.round_trips {
                            (round_trips.0)(
                                last_progress.saturating_duration_since(request.sent_at),
                            );
                        }
                        let _ = request.reply.send(Ok(reply));
                    }
                    link.answered.set(true);
                    settings.health.record_success();
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
                // A worker that was busy elsewhere for longer than the timeout finds the
                // tick and the socket ready at once, and select! may pick the tick: look at
                // the socket before blaming the server for bytes it has already sent.
                if overdue && matches!(socket.try_read_buf(&mut buffer), Ok(n) if n > 0) {
                    last_progress = Instant::now();
                } else if overdue {
                    return Err(BackendError::Timeout { server: settings.address.clone() });
                }
            }
            _ = link.wake_reader.notified(), if idle => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            // Far longer than any test waits: a reconnect seen in a test came from the
            // health waking the connection, not from the backoff running out.
            backoff_min: Duration::from_secs(60),
            backoff_max: Duration::from_secs(60),
            limits: Limits::default(),
            health,
            round_trips: None,
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

    fn get(handle: &BackendHandle) -> oneshot::Receiver<Result<Bytes, BackendError>> {
        handle.send(
            (Bytes::from_static(b"get key\r\n"), None),
            ReplyKind::Retrieval,
        )
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
}
