//! The words the route kinds share, below all of them: the single-key request dispatch
//! hands a node (`Single`), and which of a multi-get's keys go on from a route's first
//! pool (`GoesOn`).
use std::time::Instant;

use memroute_config::Operation;
use memroute_protocol::{ReplyKind, Request, RequestBytes};

/// A single-key request as dispatch hands it to the node it selected.
pub(crate) struct Single<'r> {
    pub request: &'r Request,
    /// The key the request is placed by (a base64 meta key decoded).
    pub key: &'r [u8],
    /// The bytes to send to a server (noreply/q stripped, padding squeezed out).
    pub parts: RequestBytes,
    pub kind: ReplyKind,
    pub operation: Operation,
    /// The client session's connection slot.
    pub slot: usize,
    /// When the request was read (its latency sample).
    pub started: Instant,
}

/// Which keys of a multi-get's legs planned over route `node`'s first pool
/// (`multi_get_pool`) go on once the legs have answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GoesOn {
    /// Nothing: a plain pool, a shadow or random route, or a route without a later child.
    Never,
    /// The keys of a batch that failed, to a failover's (or replicated read's) later children.
    Failed,
    /// The keys a batch answered as misses, to a warm-up's `warm` (filled into `cold`).
    Missed,
    /// Both: an `error-or-miss` failover's.
    FailedOrMissed,
}

impl GoesOn {
    /// Whether a key whose batch failed (`Failed`) or missed it (`Missed`) goes on.
    pub(crate) fn takes(self, outcome: GoesOn) -> bool {
        self == outcome || (self == GoesOn::FailedOrMissed && outcome != GoesOn::Never)
    }
}
