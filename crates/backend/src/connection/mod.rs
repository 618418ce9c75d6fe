//! One pipelined connection to one memcached server, owned by one worker thread.
//!
//! ```text
//!   handle.rs      BackendHandle / RequestWriter: sessions append requests
//!   outgoing.rs    Shared: the outgoing buffer, the queue, gets joined into runs
//!   mod.rs         run: connect, serve, back off, repeat
//!   in_flight.rs   Link: the requests written and awaiting replies, shared by both halves
//!   link.rs        serve: one established connection's writer and reader halves
//!   run_reader.rs  RunReader: a coalesced get's reply split back per request
//! ```
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use memroute_net::{Connector, NetError};
use memroute_protocol::Limits;
use tokio::time::Instant;

use crate::hello::Refusal;
use crate::{BackendError, ServerHealth};

mod handle;
mod in_flight;
mod link;
mod notify;
mod outgoing;
mod run_reader;

pub use handle::{BackendHandle, RequestWriter};
use link::serve;
use outgoing::Shared;

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
        let opened = crate::hello::open(
            &settings.connector,
            settings.connect_timeout,
            settings.timeout,
        )
        .await;
        let reason: Arc<str> = match opened {
            Ok((stream, greeting)) => {
                tracing::debug!(server = %settings.address, tls = stream.is_tls(), ?greeting, "backend connected");
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
            Err(Refusal::Connect(NetError::ConnectRefused)) => {
                let reason: Arc<str> = Arc::from(CONNECTION_REFUSED);
                health.mark_down(&reason);
                reason
            }
            Err(Refusal::Connect(error)) => {
                // A TLS failure (a certificate that does not verify) names its cause here,
                // and so in the SERVER_ERROR clients get.
                let reason: Arc<str> = Arc::from(error.to_string());
                if matches!(error, NetError::Handshake(_)) {
                    tracing::warn!(server = %settings.address, %reason, "backend TLS handshake failed");
                }
                health.record_failure(&reason);
                reason
            }
            // A server that wants a login memroute lacks, or refuses memroute's, must not
            // serve anyone: down at once, until a probe (with the login a reload may have
            // fixed) gets in.
            Err(Refusal::Login(reason)) => {
                let reason: Arc<str> = Arc::from(reason);
                if health.login_refused(&reason) {
                    tracing::error!(server = %settings.address, %reason, "backend login failed; server marked down");
                }
                reason
            }
            Err(Refusal::Exchange(reason)) => {
                let reason: Arc<str> = Arc::from(reason);
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

const CONNECTION_REFUSED: &str = "connection refused";

#[cfg(test)]
mod tests;
