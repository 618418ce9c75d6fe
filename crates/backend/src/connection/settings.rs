//! What a connection is told and what its parts share: its settings, where it reports round
//! trips, and the errors and reasons both the starter (mod.rs) and the halves (handle.rs,
//! link.rs) speak. Below all of them, so none imports back up.
use std::sync::Arc;
use std::time::Duration;

use memroute_net::Connector;
use memroute_protocol::Limits;

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
pub struct RoundTrips(pub(super) std::rc::Rc<dyn Fn(Duration)>);

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
pub(super) fn down_error(address: &Arc<str>, health: &ServerHealth) -> BackendError {
    BackendError::Down {
        server: address.clone(),
        reason: health.down_reason(),
    }
}

/// The reason a refused connect (nothing listens at the address) gives.
pub(super) const CONNECTION_REFUSED: &str = "connection refused";
