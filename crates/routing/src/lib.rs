//! memroute-routing: where does a request go. Sans-I/O: no sockets, no clocks, no tokio.
//!
//! ```text
//!   RoutingSpec (spec.rs: pools, routes, the default root and each listener's root;
//!                memroute-config builds it from TOML)
//!     --RouteTable::build-->
//!
//!   Request --operation_of--> Operation (meta commands as their classic equivalent)
//!
//!   RouteTable (built per config load; an arena of Nodes with one root per listener,
//!               root_of(listener), and proxy.route's as the default, root())
//!     select(root, operation, key): follow Prefix / Operation nodes
//!       |-- Pool(id) ................ one pool: placement picks the server
//!       '-- Shadow / Replicated / Failover / WarmUp / Random / Null / Error
//!             executed by the proxy, which calls select again from each child it uses,
//!             helped by KeyRange::contains_key (shadow keys), write_decision (replicated
//!             writes) and classify_reply (failover, warm-up, replicated reads)
//!
//!   pool id --placements[id].server_for(key)--> server index (config order)
//!              (hash_tag -> hash fn -> distribution; mcrouter's distributions hash its
//!               routing key, see mcrouter_hash; one file per distribution)
//!   Placement::new(pool) over every server; Placement::with_live(pool, live) over the
//!   live ones when the pool ejects down servers (built by the proxy on health changes)
//! ```
//!
//! Placement for `ketama`, `modula` and `random` is byte-compatible with twemproxy
//! (nutcracker 0.5.0), and `ch3`, `wch3` and `crc32` with mcrouter; each is pinned by golden
//! files recorded from the real program (`tests/golden/`), and memroute's own `ring` and
//! `jump` by a file recorded from memroute itself.
#![forbid(unsafe_code)]

mod distribution;
mod error;
mod failover_errors;
pub mod hash;
pub mod mcrouter_hash;
mod operation;
mod policy;
mod route;
pub mod routing_prefix;
pub mod spec;

pub use distribution::{Placement, ServerIdentity};
pub use error::RoutingError;
pub use failover_errors::{gutter_description, ErrorClass, FailoverErrors};
pub use hash::{hash_key_part, HashFn};
pub use operation::operation_of;
pub use policy::{classify_reply, write_decision, ReplyClass, WriteDecision};
pub use route::{KeyRange, Node, NodeId, RouteTable};
pub use spec::{
    DistributionName, FailoverOn, HashName, Operation, PoolSpec, ReadPolicy, RouteSpec,
    RoutingSpec, ServerSpec, ShadowSelect, WritePolicy,
};
