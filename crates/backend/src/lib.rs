//! memroute-backend: long-lived, pipelined connections to one memcached server.
//!
//! Each worker thread owns its own connections (thread-per-core): nothing here is
//! shared across threads. One connection is one task with two halves joined by a
//! FIFO of requests in flight:
//!
//! ```text
//!  sessions --mpsc--> writer: batch queued requests into one write()  --> memcached
//!                        | push InFlight (reply kind, reply slot, sent-at)
//!                        v
//!                     in_flight FIFO
//!                        ^
//!  sessions <-oneshot- reader: frame replies in FIFO order (protocol::parse_reply) <-- memcached
//! ```
//!
//! A reply that does not come within the pool's timeout breaks the connection: every
//! request in flight on it gets a `Timeout` error (the stream cannot be resynchronised
//! without its reply), and the connection is re-opened with backoff. While a server is
//! unreachable, requests fail at once with `Unavailable` instead of waiting.
#![forbid(unsafe_code)]

mod connection;
mod error;

pub use connection::{spawn_connection, BackendHandle, ConnectionSettings, ReplySlot};
pub use error::BackendError;
