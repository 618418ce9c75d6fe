//! Routes: one module per route kind, each owning whether a request through it can start
//! as plain legs (the fast path), what happens when its first answer returns, and its
//! single- and multi-key execution. This module hands a selected node to its kind's start;
//! walk.rs walks the tree below it, resume.rs resumes a started request's continuation.
//!
//! ```text
//!   dispatch: select the node (prefix and operation routes resolved), then
//!     Pool ---------------------------> a plain leg (no task, no allocation)
//!     Failover (first child a pool) --> failover::first_pool: a plain leg; on a failure,
//!                                       failover::start_after_first (the later children)
//!     Replicated write (all pools) ---> replicated::write_servers: one plain leg per replica,
//!                                       judged in place (write_decision)
//!     WarmUp (cold a pool) -----------> warm_up::cold_pool: a plain leg; a read cold missed,
//!                                       warm_up::start_after_cold (ask warm, fill cold)
//!     Shadow/Random down to a pool ---> single_pool: a plain leg (shadow::copy_single beside)
//!     anything else ------------------> start(node, job): `run`, polled in place
//!   multi-get: plan::multi_get_pool plans keys over a pool as a plain pool's keys (the kinds'
//!     first pools); what goes on afterwards is `FollowUp` (failover::rest_multi,
//!     warm_up::ask_warm_multi); the rest `plan::start_multi` -> `Walker::run_multi`.
//!
//!   during a resize window (any pool's): every request and multi-get takes the general
//!     walk; a pool's step there is resize::send / resize::run_multi.
//!
//!   Walker::run(node, job) / Walker::run_multi(node, keys) (children::RunChild, implemented
//!     in walk.rs): walk::walk, one match over `Node` for both,
//!     each arm its kind's single- or multi-key step (`walk::Walk`): select (prefix,
//!     operation) | pool | shadow | replicated | failover | warm_up | random | fixed
//!     (null, error)
//! ```
//!
//! A request's own future never outlives its reply: work that goes on after it (async
//! replicated writes, the slower replicas of all-initial/all-majority, shadow copies,
//! warm-up fills) runs on tasks of its own, so the session may drop a `Routed` once answered.
//!
//! The decisions themselves (which child, whether a write policy was met, what counts as
//! a miss) are sans-I/O functions in `memroute_routing`; these modules only do the waiting.
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use memroute_backend::ReplyReceiver;
use memroute_config::Operation;
use memroute_protocol::{Command, ReplyKind, RequestBytes};
use memroute_routing::{Node, NodeId};

mod children;
mod failover;
mod fixed;
mod in_place;
mod job;
mod leg;
mod multi_get;
mod nearest;
mod plan;
mod pool;
mod random;
mod replicated;
mod resize;
mod resume;
mod select;
mod shadow;
mod then;
mod vocabulary;
mod walk;
mod warm_up;

use children::{RunChild, Walker};
use in_place::{InPlace, Routed};
use job::Job;
use leg::Leg;
pub(crate) use leg::Legs;
pub(crate) use multi_get::start_multi_get;
use random::{only_pools, pick as pick_random};
pub(crate) use then::{Finished, Start, Then};
pub(crate) use vocabulary::Single;

use crate::snapshot::RouteSnapshot;

/// Starts a flush_all (`parts`) at `node`: a pool's servers all get it as plain legs; a
/// route decides where it goes (every target of a prefix route, every replica, the
/// operation route's flush_all target, ...) on the general walk.
pub(crate) fn start_flush_all(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    parts: RequestBytes,
    slot: usize,
    started: Instant,
) -> Start {
    if let Node::Pool(pool) = *routing.routes.node(node) {
        if !routing.resizing {
            return flush_all_to_pool(routing, pool, parts, slot, started);
        }
    }
    let job = Job {
        operation: Operation::FlushAll,
        command: Command::FlushAll,
        key: Bytes::new(),
        parts,
        kind: ReplyKind::Line,
        slot,
        echo: None,
    };
    Start::executor(start(routing, node, job, started))
}

/// A flush_all to a pool: the same request to every server, a plain leg each.
fn flush_all_to_pool(
    routing: &RouteSnapshot,
    pool: usize,
    parts: RequestBytes,
    slot: usize,
    started: Instant,
) -> Start {
    match pool::flush_all_legs(routing, pool, &parts, slot, started) {
        Some(legs) => Start::Sent {
            legs,
            then: Then::FlushAll,
        },
        None => Start::NoServers(pool),
    }
}

/// The fast path: a single-key request to a plain pool, straight to its server's
/// connection as a leg of the session's own (no task, no allocation).
#[inline]
fn start_pool(routing: &RouteSnapshot, pool: usize, single: Single<'_>) -> Start {
    let request = (&single.parts, single.kind, single.slot);
    match pool::leg_to(routing, pool, single.key, request, single.started) {
        Some(leg) => Start::leg(leg),
        None => Start::NoServers(pool),
    }
}

/// Starts a single-key request at `node`. Each kind first tries its fast path (plain legs,
/// as a pool's request is sent), and only then the general walk (`start`).
pub(crate) fn start_single(routing: &Rc<RouteSnapshot>, node: NodeId, single: Single<'_>) -> Start {
    let started = single.started;
    // A resize window: every request takes the general walk, where a pool's requests look
    // for moved keys on their old owners (`resize`).
    if routing.resizing {
        return Start::executor(start(routing, node, Job::single(single), started));
    }
    let job = match routing.routes.node(node) {
        // The fast path: a plain pool, straight to its server's connection.
        &Node::Pool(pool) => return start_pool(routing, pool, single),
        Node::Replicated { .. } if single.operation.is_write() => {
            match replicated::start_write(routing, node, &single) {
                Some(start) => return start,
                None => Job::single(single),
            }
        }
        Node::Shadow { .. } | Node::Random { .. } => {
            match start_through_shadow_or_random(routing, node, Job::single(single), started) {
                Ok(start) => return start,
                Err(job) => job,
            }
        }
        Node::WarmUp { .. } => match warm_up::start(routing, node, Job::single(single), started) {
            Ok(start) => return start,
            Err(job) => job,
        },
        Node::Failover { .. } | Node::Replicated { .. } => {
            match failover::start(routing, node, Job::single(single), started) {
                Ok(start) => return start,
                Err(job) => job,
            }
        }
        _ => Job::single(single),
    };
    Start::executor(start(routing, node, job, started))
}

/// Through shadow and random routes down to a pool (`single_pool`): sent to that pool as a
/// plain pool's request is, with the shadow copy (if the key is in its range) on a task of
/// its own, as the executor would send it. `Err(job)` when the way holds other routes.
// `Err` hands the request back, unboxed (no allocation), to the general walk.
#[allow(clippy::result_large_err)]
fn start_through_shadow_or_random(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: Job,
    started: Instant,
) -> Result<Start, Job> {
    let Some((pool, shadow)) = single_pool(routing, node) else {
        return Err(job);
    };
    // A pool without servers yet (DNS discovery) answers as the executor does for it; the
    // executor is not asked, as it would draw a random route's child again (favouring the
    // children with servers).
    let request = (&job.parts, job.kind, job.slot);
    let leg = match pool::leg_to(routing, pool, &job.key, request, started) {
        Some(leg) => leg,
        None => {
            let receiver = ReplyReceiver::ready(Err(routing.no_servers(pool)));
            Leg::new(receiver, pool, 0, started)
        }
    }
    .on_route(node);
    if let Some(shadow) = shadow {
        shadow::copy_single(routing, shadow, job);
    }
    Ok(Start::leg(leg))
}

/// Starts `job` from `node`: polled once now, so that every request it can send without
/// waiting goes out before the client's next request is dispatched (a `set` through a
/// replicated route reaches the servers before the `get` pipelined behind it).
pub(crate) fn start(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: Job,
    started: Instant,
) -> Routed {
    let future = Walker::run(routing.clone(), node, Rc::new(job));
    InPlace::started(future, node, started)
}

/// For a single-key request that reached policy route `node`: the pool it is sent to as a
/// plain pool's request is, when the way there is at most one shadow route and any random
/// routes over pools only (picked now, `only_pools`), and the shadow route on the way (its copy is the caller's to send,
/// `shadow::copy_single`). `None` for every other route (the executor, or `failover::first_pool`).
pub(crate) fn single_pool(
    routing: &RouteSnapshot,
    node: NodeId,
) -> Option<(usize, Option<NodeId>)> {
    let mut shadow = None;
    let mut at = node;
    loop {
        match routing.routes.node(at) {
            Node::Pool(pool) => return Some((*pool, shadow)),
            Node::Shadow { primary, .. } if shadow.is_none() => {
                shadow = Some(at);
                at = *primary;
            }
            Node::Random { children } if only_pools(routing, children) => {
                at = pick_random(children)
            }
            _ => return None,
        }
    }
}
