//! memroute-routing: where does a key go. Sans-I/O.
//!
//! ```text
//!   key --RouteTable::pool_for(key)--> pool index --Placement::server_for(key)--> server index
//!                                               (hash_tag -> hash fn -> distribution)
//! ```
//!
//! Placement for `ketama`, `modula` and `random` is byte-compatible with
//! twemproxy (nutcracker 0.5.0) and pinned by golden files recorded from it.
#![forbid(unsafe_code)]

mod distribution;
mod error;
pub mod hash;
mod route;

pub use distribution::{Placement, ServerIdentity};
pub use error::RoutingError;
pub use hash::{hash_key_part, HashFn};
pub use route::RouteTable;
