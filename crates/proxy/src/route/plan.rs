//! How the keys of a multi-get that reach a policy route are planned (`multi_get_pool`):
//! over a pool's servers as a plain pool's keys are, and what goes on from there once the
//! legs have answered (`FollowUp`); or on the general walk (`start_multi`).
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use memroute_config::ReadPolicy;
use memroute_routing::{Node, NodeId};

use super::children::{RunChild, Walker};
use super::in_place::{InPlace, RoutedKeys};
use super::job::{multi_reply, MultiJob};
use super::random::{only_pools, pick as pick_random, RandomPicks};
use super::then::FollowUp;
use super::vocabulary::GoesOn;
use super::{failover, nearest, pool, warm_up};
use crate::snapshot::RouteSnapshot;

/// Starts the keys of a multi-get that reach policy route `node`; the reply is their hits
/// as `VALUE` blocks in key order then `END` (or the failure that fails the multi-get):
/// when they are all of the multi-get's keys, the client's reply as it is.
pub(crate) fn start_multi(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: MultiJob,
    started: Instant,
) -> RoutedKeys {
    let routing = routing.clone();
    let future = Box::pin(async move {
        let count = job.keys.len() as u32;
        let job = Rc::new(job);
        let replies = Walker::run_multi(routing, node, job.clone(), (0..count).collect()).await;
        multi_reply(replies)
    });
    InPlace::started(future, node, started)
}

/// Where the multi-get keys that reach a policy route are planned (`multi_get_pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planned {
    /// The pool whose servers the keys are batched on, as a plain pool's keys are.
    pub pool: usize,
    /// What goes on after the pool's answer (a failover's failed batches, a warm-up's
    /// misses); `GoesOn::Never` for routes reached under a shadow or random route.
    pub goes_on: GoesOn,
    /// The shadow route on the way, if any: the keys in its range are also copied to its
    /// shadow target (the caller's to send, `shadow::copy_planned_keys`).
    pub shadow: Option<NodeId>,
}

/// For the multi-get keys that reach policy route `node` (the first node after prefix and
/// operation routes): the pool whose servers they are planned on as a plain pool's keys
/// are (the session's own legs, merged once), when the route's multi-get semantics allow
/// it; `None` when they go through the executor. The same for every key: a caller looks
/// it up once per route node and multi-get.
///
/// - failover (on errors) / replicated (reads `failover`/`first`) over a pool first:
///   that pool (`first_pool`); a failed batch's keys go on later (`FollowUp`);
/// - replicated reading `nearest`: the same, from the child its read order puts first
///   (the order recomputed here when due);
/// - failover on `error-or-miss` over a pool first: that pool; a failed batch's keys and
///   the keys a batch missed go on later;
/// - warm-up whose `cold` is a pool with servers: cold; the misses go on to `warm` later;
/// - at most one shadow route and any random routes over pools only (or replicated routes
///   reading from a random replica of pools; see `only_pools`) down to a pool: that pool, with the shadow route to copy the keys in
///   its range to; a random route's child is the one picked in `picks` for this multi-get.
///
/// What a failover or warm-up does after the first answers is looked up again from the
/// route node at that point (`goes_on`), so only routes reached directly (not under a
/// shadow or a random route) take that path.
pub(crate) fn multi_get_pool(
    routing: &RouteSnapshot,
    node: NodeId,
    picks: &mut RandomPicks,
) -> Option<Planned> {
    let routes = &routing.routes;
    let first = |pool: Option<usize>| {
        pool.map(|pool| Planned {
            pool,
            goes_on: goes_on(routing, node),
            shadow: None,
        })
    };
    match routes.node(node) {
        Node::Replicated {
            reads: ReadPolicy::Nearest,
            ..
        } => {
            nearest::refresh(routing, node);
            return first(failover::multi_get_first_pool(routing, node));
        }
        Node::Failover { .. }
        | Node::Replicated {
            reads: ReadPolicy::First | ReadPolicy::Failover,
            ..
        } => return first(failover::multi_get_first_pool(routing, node)),
        Node::WarmUp { cold, .. } => return first(pool::with_servers(routing, *cold)),
        _ => {}
    }
    let mut shadow = None;
    let mut at = node;
    loop {
        match routes.node(at) {
            Node::Pool(pool) => {
                return Some(Planned {
                    pool: *pool,
                    goes_on: GoesOn::Never,
                    shadow,
                })
            }
            // A second shadow route on the way: the executor copies for both.
            Node::Shadow { .. } if shadow.is_some() => return None,
            Node::Shadow { primary, .. } => {
                shadow = Some(at);
                at = *primary;
            }
            // A replicated route reading from a random replica: one replica per multi-get.
            // Only over pools: a pick that led elsewhere would be thrown away and drawn
            // again by the executor, favouring the pools (`only_pools`).
            Node::Random { children }
            | Node::Replicated {
                children,
                reads: ReadPolicy::Random,
                ..
            } if only_pools(routing, children) => {
                at = match picks.iter().find(|(random, _)| *random == at) {
                    Some(&(_, child)) => child,
                    None => {
                        let child = pick_random(children);
                        picks.push((at, child));
                        child
                    }
                };
            }
            _ => return None,
        }
    }
}

/// `GoesOn` for keys planned over the first pool of route `node`.
pub(crate) fn goes_on(routing: &RouteSnapshot, node: NodeId) -> GoesOn {
    match routing.routes.node(node) {
        Node::WarmUp { .. } => GoesOn::Missed,
        Node::Failover { .. } | Node::Replicated { .. } => failover::goes_on(routing, node),
        _ => GoesOn::Never,
    }
}

/// The keys of a multi-get that go on from route `node`'s first pool (`GoesOn`), in the
/// client's order.
#[derive(Debug)]
pub(crate) struct GoingOn {
    pub node: NodeId,
    /// The child (a pool's node) the keys were asked of first: the ones after it come next.
    pub tried: NodeId,
    pub keys: Vec<Bytes>,
    /// For an `error-or-miss` failover: the keys the first pool missed.
    pub missed: failover::FirstMisses,
}

impl FollowUp {
    /// Starts the keys of `going` (in the client's order), which reached route
    /// `going.node` and went on from its first pool (`goes_on`): through a failover's later
    /// children, as `failover::run_multi` goes on after its first child, or to a warm-up's
    /// warm, as `warm_up::run_multi` asks it for cold's misses.
    pub(crate) fn start(
        &self,
        routing: &Rc<RouteSnapshot>,
        going: GoingOn,
        started: Instant,
    ) -> RoutedKeys {
        let GoingOn {
            node,
            tried,
            keys,
            missed,
        } = going;
        let job = MultiJob {
            operation: self.operation,
            head: self.head.clone(),
            keys,
            slot: self.slot,
            byte_cap: self.byte_cap,
        };
        let future = match *routing.routes.node(node) {
            Node::WarmUp { cold, warm, ttl } => {
                warm_up::ask_warm_multi(routing, node, cold, warm, ttl, job)
            }
            _ => failover::rest_multi(routing, node, tried, job, missed),
        };
        InPlace::started(future, node, started)
    }
}
