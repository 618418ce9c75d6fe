//! Routes: one module per route kind, each owning whether a request through it can start
//! as plain legs (the fast path), what happens when its first answer returns, and its
//! single- and multi-key execution. This module is the walk over the route tree that
//! hands each node to its kind's module.
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
//!   multi-get: multi_get_pool plans keys over a pool as a plain pool's keys (the kinds'
//!     first pools); what goes on afterwards is `FollowUp` (failover::rest_multi,
//!     warm_up::ask_warm_multi); the rest `start_multi` -> `run_multi`.
//!
//!   during a resize window (any pool's): every request and multi-get takes the general
//!     walk; a pool's step there is resize::send / resize::run_multi.
//!
//!   run(node, job) / run_multi(node, keys): walk::walk, one match over `Node` for both,
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
use memroute_config::{Operation, ReadPolicy};
use memroute_protocol::{Command, ReplyKind, Request, RequestBytes};
use memroute_routing::{Node, NodeId};

mod failover;
mod fixed;
mod in_place;
mod job;
mod leg;
mod multi_get;
mod nearest;
mod pool;
mod random;
mod replicated;
mod resize;
mod select;
mod shadow;
mod then;
mod walk;
mod warm_up;

use in_place::InPlace;
pub(crate) use in_place::{Routed, RoutedKeys};
pub(crate) use job::MultiReply;
use job::{multi_reply, BoxedKeyReplies, BoxedReply, KeyReplies};
use job::{Job, MultiJob};
pub(crate) use leg::{Leg, Legs};
pub(crate) use multi_get::start_multi_get;

use random::RandomPicks;
use random::{only_pools, pick as pick_random};
pub(crate) use then::{Finished, Start, Then};

use crate::reply::Reply;
use crate::snapshot::RouteSnapshot;

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
            return pool::start_flush_all(routing, pool, parts, slot, started);
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
        &Node::Pool(pool) => return pool::start(routing, pool, single),
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
    let future = run(routing.clone(), node, Rc::new(job));
    InPlace::started(future, node, started)
}

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
        let replies = run_multi(routing, node, job.clone(), (0..count).collect()).await;
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

/// What a multi-get planned over failover or warm-up routes' first pools (`multi_get_pool`)
/// needs to send keys on from there once its legs have answered: a failed batch's keys to
/// a failover's later children, a warm-up's cold misses to warm.
#[derive(Debug)]
pub(crate) struct FollowUp {
    /// Where the keys' routes are selected from (`RouteTable::select`): the route table's
    /// root, or a policy root itself.
    pub root: NodeId,
    pub operation: Operation,
    /// The batch line's start before its keys.
    pub head: Bytes,
    pub slot: usize,
    pub byte_cap: usize,
    /// Whether a warm-up route's keys are among the legs' (their misses must be looked for
    /// in every answered batch; otherwise only failed batches are looked at).
    pub misses: bool,
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

/// Runs `job` from `node` down to the servers and back (`walk::walk`).
fn run(routing: Rc<RouteSnapshot>, node: NodeId, job: Rc<Job>) -> BoxedReply {
    walk::walk(routing, node, job)
}

/// Runs `job` from a child node, awaited in place: a pool child (the common case) without
/// the boxed future a nested route needs.
async fn run_child(routing: &Rc<RouteSnapshot>, node: NodeId, job: &Rc<Job>) -> Reply {
    match routing.routes.node(node) {
        Node::Pool(pool) if job.operation != Operation::FlushAll => {
            resize::send(routing, *pool, job).await
        }
        _ => run(routing.clone(), node, job.clone()).await,
    }
}

/// `run_child` for a multi-key job.
async fn run_multi_child(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: &Rc<MultiJob>,
    keys: Vec<u32>,
) -> KeyReplies {
    match routing.routes.node(node) {
        Node::Pool(pool) => resize::run_multi(routing, *pool, job, &keys).await,
        _ => run_multi(routing.clone(), node, job.clone(), keys).await,
    }
}

/// Runs the keys `keys` (indexes into `job.keys`) from `node`; one outcome per key, in
/// the order of `keys` (`walk::walk`).
fn run_multi(
    routing: Rc<RouteSnapshot>,
    node: NodeId,
    job: Rc<MultiJob>,
    keys: Vec<u32>,
) -> BoxedKeyReplies {
    walk::walk(routing, node, walk::Keys { job, keys })
}
