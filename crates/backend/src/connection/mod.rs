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

use memroute_net::{NetError, Stream};
use tokio::time::Instant;

use crate::hello::Refusal;
use crate::BackendError;

mod handle;
mod in_flight;
mod link;
mod notify;
mod outgoing;
mod run_reader;
mod settings;

pub use handle::{BackendHandle, RequestWriter};
use link::serve;
use outgoing::Shared;
use settings::{down_error, CONNECTION_REFUSED};
pub use settings::{ConnectionSettings, RoundTrips, RECONNECT_BACKOFF_MAX, RECONNECT_BACKOFF_MIN};

/// While the server is marked down, its prober (one per server for the whole process) is
/// what finds it back and wakes every connection at once; connections themselves retry
/// only this rarely, as a safety net, so a down server sees the prober's bounded, jittered
/// rate rather than one connect per connection per backoff from every worker.
const DOWN_RETRY: Duration = Duration::from_secs(30);

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

/// Connect, serve until the connection breaks, fail fast during backoff, repeat. `serve`
/// is awaited here, not inside a helper's future: every reply read goes through one
/// state machine less.
async fn run(settings: ConnectionSettings, shared: Rc<Shared>) {
    let mut backoff = settings.backoff_min;
    loop {
        let reason = match connect(&settings).await {
            Ok(stream) => {
                let served = serve(&settings, stream, &shared).await;
                match closed(&settings, &shared, served, &mut backoff) {
                    Some(reason) => reason,
                    None => return,
                }
            }
            Err(reason) => reason,
        };
        let Some(woke_early) = wait_to_retry(&settings, &shared, reason, backoff).await else {
            return;
        };
        backoff = match woke_early {
            true => settings.backoff_min,
            false => (backoff * 2).min(settings.backoff_max),
        };
    }
}

/// One attempt to connect (and greet): the stream to serve, or why the server is
/// unreachable now.
async fn connect(settings: &ConnectionSettings) -> Result<Stream, Arc<str>> {
    let opened = crate::hello::open(
        &settings.connector,
        settings.connect_timeout,
        settings.timeout,
    )
    .await;
    let (stream, greeting) = opened.map_err(|refusal| refused(settings, refusal))?;
    tracing::debug!(server = %settings.address, tls = stream.is_tls(), ?greeting, "backend connected");
    settings.health.connection_opened();
    Ok(stream)
}

/// A connection `serve` gave up (`served`: why, and whether the server answered): why the
/// server is unreachable now, or `None` once every handle is gone and the connection
/// closed for good. A server that answered resets `backoff`.
fn closed(
    settings: &ConnectionSettings,
    shared: &Shared,
    (outcome, answered): (Option<BackendError>, bool),
    backoff: &mut Duration,
) -> Option<Arc<str>> {
    let health = &settings.health;
    health.connection_closed();
    // Only a server that answered is healthy: one that accepts connections but
    // never replies (stopped, overloaded) keeps backing off.
    if answered {
        *backoff = settings.backoff_min;
    }
    match outcome {
        None => {
            shared.fail_queued(|| BackendError::Closed {
                server: settings.address.clone(),
            });
            None
        }
        Some(error) => {
            tracing::warn!(server = %settings.address, %error, "backend connection lost");
            let reason = error.reason();
            // A deferred (TCP Fast Open) connect refused at its first write is
            // a refused connect: the server is not running, as below.
            if matches!(error, BackendError::NotConnected { .. }) {
                health.mark_down(&reason);
            }
            Some(reason)
        }
    }
}

/// A connect or greeting that failed: told to the server's health, and its reason.
fn refused(settings: &ConnectionSettings, refusal: Refusal) -> Arc<str> {
    let health = &settings.health;
    match refusal {
        // Nothing listens there: the server is not running, and waiting for more
        // failures would only fail more requests slowly.
        Refusal::Connect(NetError::ConnectRefused) => {
            let reason: Arc<str> = Arc::from(CONNECTION_REFUSED);
            health.mark_down(&reason);
            reason
        }
        Refusal::Connect(error) => {
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
        Refusal::Login(reason) => {
            let reason: Arc<str> = Arc::from(reason);
            if health.login_refused(&reason) {
                tracing::error!(server = %settings.address, %reason, "backend login failed; server marked down");
            }
            reason
        }
        Refusal::Exchange(reason) => {
            let reason: Arc<str> = Arc::from(reason);
            health.record_failure(&reason);
            reason
        }
    }
}

/// Fails requests at once until the next attempt, which comes after `backoff` (or the
/// rare safety-net retry while the server is down), or as soon as the prober finds the
/// server back. Returns whether it woke early for that, or `None` once every handle is
/// gone.
async fn wait_to_retry(
    settings: &ConnectionSettings,
    shared: &Rc<Shared>,
    reason: Arc<str>,
    backoff: Duration,
) -> Option<bool> {
    let health = &settings.health;
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
            return None;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(retry_at) => break false,
            _ = &mut recovered => break true,
            // The last handle went (requests themselves fail in `writer()` now).
            _ = shared.wake.notified() => {}
        }
    };
    *shared.not_connected.borrow_mut() = None;
    Some(woke_early)
}

#[cfg(test)]
mod tests;
