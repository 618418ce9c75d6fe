//! A single-key request that started as a plain leg to a policy route's first pool and may
//! go on once that leg answers: a failover's first child (`failover::first_pool`,
//! `failover::write_pool`) or a warm-up's cold (`warm_up::cold_pool`). The leg lives in the
//! session's pending entry; what its answer leads to is the route kind's
//! (`failover::after_first_answer`, `warm_up::after_cold_answer`).
use std::rc::Rc;

use memroute_protocol::Command;
use memroute_routing::NodeId;

use super::{failover, warm_up, Job, Leg, Routed};
use crate::snapshot::RouteSnapshot;

#[derive(Debug)]
pub(crate) struct FirstTry {
    pub routing: Rc<RouteSnapshot>,
    /// To the first pool; its latency is recorded under the route.
    pub leg: Leg,
    /// The request again, for what comes after the first answer (`None`: nothing comes
    /// after it, or the first answer was judged to be the client's).
    pub rest: Option<Job>,
    pub node: NodeId,
    pub command: Command,
    pub noreply: bool,
    /// Whose continuation judges the first answer.
    pub then: Then,
}

/// The route kind whose continuation judges a `FirstTry`'s first answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// A failure goes on to the failover's later children.
    Failover,
    /// A miss goes on to the warm-up's warm.
    WarmUp,
}

impl FirstTry {
    /// Whether an answer may still lead somewhere (the session moves such an entry on
    /// while it waits for the head of its queue).
    pub(crate) fn may_go_on(&self) -> bool {
        self.rest.is_some()
    }

    /// Once the first answer is in: the request on its way onwards when the route kind
    /// says it goes on, else `None` (the first answer is the client's). Judged once.
    pub(crate) fn go_on(&mut self) -> Option<Routed> {
        self.rest.as_ref()?;
        let onwards = match self.then {
            Then::Failover => failover::after_first_answer(self),
            Then::WarmUp => warm_up::after_cold_answer(self),
        };
        // Judged: the request is not needed again.
        self.rest = None;
        onwards
    }
}
