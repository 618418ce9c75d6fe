//! memroute-proxy, the data plane: workers, listeners, client sessions, fan-out and merge.
//!
//! ```text
//!  worker thread (one per core, current-thread tokio runtime + LocalSet)
//!    accept loop (SO_REUSEPORT socket of its own per listen address)
//!      -> session task per client: parse -> dispatch -> ordered replies
//!    backend connections: pools x servers x `connections`, owned by this worker
//! ```
//!
//! Nothing on the request path takes a lock shared across workers: the route table
//! is an `Arc` snapshot, counters are per-worker cells moved into the shared registry
//! every second and whenever `stats` or a scrape asks (`stats`).
//!
//! The control plane (memroute-control) starts the workers ([`worker::Worker`]), decides
//! the generations they serve (a [`publisher::Plan`] per config, which the
//! [`publisher::Publisher`] completes with its counters and hands to every worker over a
//! watch channel as a [`generation::Generation`]; each worker builds its own
//! `snapshot::RouteSnapshot` from it) and reads what they count ([`stats::Metrics`]). This
//! crate imports nothing from it.
//!
//! Modules follow a request downwards (worker -> session -> dispatch -> pending -> route
//! -> snapshot -> stats) and never import upwards; docs/architecture.md has the layers and
//! tests/tests/layers.rs keeps the import graph free of circles.
#![forbid(unsafe_code)]

mod binary;
mod budget;
mod buffers;
mod client_auth;
mod client_log;
mod collapse;
mod context;
mod counters;
mod dispatch;
mod error;
mod framing;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod generation;
mod hot_cache;
pub mod hot_keys;
mod key_turns;
mod mcrouter_admin;
mod multiget;
mod pending;
mod pool_settings;
pub mod publisher;
pub mod read_order;
mod reply;
pub mod request_watch;
pub mod resize_window;
mod route;
pub mod routing_prefix;
mod session;
mod session_wakers;
mod snapshot;
pub mod stats;
pub mod transport;
mod version;
mod watch_tap;
pub mod worker;

pub use counters::{ReloadCounts, ReloadRecord};
pub use error::ProxyError;
pub use mcrouter_admin::set_config_file;
pub use version::VERSION;
