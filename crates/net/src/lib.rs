//! memroute-net: the transport. Everything between a socket and a byte stream lives
//! here, so the proxy and the backend connections never see a socket option or rustls:
//!
//! ```text
//!  clients ──TCP / unix / TLS──> Listener ─accept─> Incoming ─establish─> Stream ──> session
//!                                 (SO_REUSEPORT, backlog, TFO queue,  (TLS handshake,
//!                                  one ServerTls per address)          bounded, counted)
//!  backend connection / prober ──> Connector ─connect─> Stream ──TCP (TFO) / TLS──> memcached
//!                                  (one per server: TLS config + session store)
//! ```
//!
//! A [`Stream`] is plain or TLS; callers split it into halves and read and write bytes.
//! kTLS would plug in behind [`Stream`] (a TLS stream whose record layer the kernel
//! runs after the handshake); see docs/architecture.md.
#![deny(unsafe_code)]

mod connector;
mod error;
mod listener;
pub mod sockopt;
mod stream;
mod tls;
pub mod uring;

pub use connector::{BackendLogin, Connector};
pub use error::NetError;
pub use listener::{bind, effective_backlog, BoundListener, Incoming, ListenOptions, Listener};
pub use stream::{ReadHalf, Stream, WriteHalf};
pub use tls::{check_listener_tls, FileStamp, ServerTls, TlsCounters};
