//! memroute-backend: long-lived, pipelined connections to memcached servers, their
//! health, and DNS discovery of a pool's servers.
//!
//! Each worker thread owns its own connections (thread-per-core). One connection is one
//! task with two halves joined by a FIFO of requests in flight; sessions of the same
//! worker write their requests straight into the connection's outgoing buffer (no
//! channel, no copy of a frame into a batch later). What is shared across threads is one
//! `ServerHealth` per server (atomics on the hot path), read by every worker's
//! connections to that server and by the server's prober:
//!
//! ```text
//!              is_down() or between connections? -> Err at once, nothing queued
//!  sessions --append bytes + (kind, reply slot)--> outgoing buffer + queued FIFO (Rc<Shared>)
//!                        | writer: swap the buffer with its own, write() it all
//!                        | move each slot to InFlight (reply kind, reply slot, sent-at)
//!                        v
//!                     in_flight FIFO
//!                        ^
//!  sessions <-reply slot- reader: frame replies in FIFO order (protocol::parse_reply) <-- memcached
//!                        |
//!       record_success / record_failure (once per broken connection) / mark_down (refused)
//!                        v
//!  ServerHealth (per server, shared by all workers: atomics + a watch for transitions)
//!     | down: bump the pool's epoch, wake the prober       ^ up: bump the epoch, wake
//!     v                                                    | connections in backoff
//!  run_prober (control thread): after probe_interval, x1.5 +-20% up to probe_interval_max,
//!     connect + the greeting below -> "VERSION ..." (or a login taken) within timeout -> mark_up
//! ```
//!
//! Every connection (and every probe) is greeted before it carries a request (`hello`):
//! `version`, and the pool's login when memcached wants one. A server that wants a login
//! memroute lacks, or refuses memroute's, is marked down at once with that reason: no
//! client's bytes are ever the first thing a connection hears.
//!
//! A reply that does not come within the pool's timeout breaks the connection: every
//! request in flight on it gets a `Timeout` error (the stream cannot be resynchronised
//! without its reply), and the connection is re-opened with backoff. While a server is
//! unreachable, requests fail at once (`NotConnected`, or `Down` once health checking has
//! marked it down) instead of waiting; both are `never_sent()`, so safe to retry
//! elsewhere. A server is marked down after `failure_limit` consecutive failures
//! (timeouts, broken connections, failed connects) or at once when its connect is
//! refused; only a successful probe marks it up again.
#![forbid(unsafe_code)]

mod connection;
mod discovery;
mod error;
mod health;
mod hello;
mod reply;

pub use connection::{
    spawn_connection, BackendHandle, ConnectionSettings, RequestWriter, RoundTrips,
    RECONNECT_BACKOFF_MAX, RECONNECT_BACKOFF_MIN,
};
pub use discovery::{
    hosts_file_addresses, lookup, lookup_blocking, next_refresh, Found, FoundServer,
    MIN_TTL_REFRESH,
};
pub use error::BackendError;
pub use health::{run_prober, HealthSettings, ServerHealth};
pub use reply::{
    free_reply_slots, reply_slot, RecvError, Render, Reply, ReplyFollow, ReplyReceiver,
    ReplySender, TryRecvError,
};
