//! A failover route: its children in order, each asked only when every one before it
//! failed (or, with `error-or-miss`, missed a read). A replicated route reading with
//! `failover` (or from its `first` replica) reads as one. Everything such a route does is
//! here:
//!
//! - single key: `start` sends a request as a plain leg to the first child's pool when it
//!   is one (`first_pool`, `write_pool`); `AfterFirst` is its continuation (a failure goes
//!   on, through `start_after_first`, to the later children);
//!   `run` is the whole walk when the first child is not a pool;
//! - many keys: `multi_get_first_pool` and `goes_on` say whether a multi-get is planned
//!   over the first pool as a plain pool's keys; `rest_multi` takes the keys of a failed
//!   batch (and, with `error-or-miss`, the misses) on; `run_multi` is the whole walk.
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use memroute_backend::BackendError;
use memroute_config::{FailoverOn, ReadPolicy};
use memroute_protocol::{cap_exptime, cap_multi_head};
use memroute_routing::{ErrorClass, FailoverErrors, Node, NodeId, ReplyClass};

use super::children::{RunChild, Walker};
use super::in_place::{BoxedMultiReply, InPlace, Routed};
use super::job::{class_of, multi_reply, BoxedReply, Job, KeyReplies, KeyReply, MultiJob};
use super::leg::{Leg, Legs};
use super::nearest::{self, ChildOrder};
use super::pool;
use super::then::{AfterFirst, Start, Then};
use super::vocabulary::GoesOn;
use crate::buffers::Homed;
use crate::reply::{connection_gone, Reply};
use crate::snapshot::RouteSnapshot;

/// The children after the first of a `first_pool` route, and what moves a read on to them.
/// For a route reading `nearest`: its read order without `tried`, the child it tried
/// first. (Only on a failure: the copy costs nothing on the way of a read that answered.)
fn after_first(routing: &RouteSnapshot, node: NodeId, tried: NodeId) -> (ChildOrder, FailoverOn) {
    let rest = |children: &[NodeId]| ChildOrder::from(children.get(1..).unwrap_or_default());
    match routing.routes.node(node) {
        Node::Failover { children, on, .. } => (rest(children), *on),
        Node::Replicated {
            reads: ReadPolicy::Nearest,
            ..
        } => match routing.nearest.of(node) {
            Some(order) => (order.after(tried), FailoverOn::Error),
            None => (ChildOrder::new(), FailoverOn::Error),
        },
        Node::Replicated { children, .. } => (rest(children), FailoverOn::Error),
        _ => (ChildOrder::new(), FailoverOn::Error),
    }
}

/// Starts a read whose first try, on the first child of failover (or replicated) route
/// `node` (a pool: `first_pool`), failed: through the later children, as `run` goes on
/// after its first child. `tried`: the child the first try went to.
pub(crate) fn start_after_first(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    tried: NodeId,
    job: Job,
    started: Instant,
) -> Routed {
    routing.route_stats(node).failovers.fetch_add(1, Relaxed);
    let routing = routing.clone();
    let future: BoxedReply = Box::pin(async move {
        // Every child from here on is a failover child: the cap applies to each.
        let job = capped(&routing, node, Rc::new(job));
        let (children, on) = after_first(&routing, node, tried);
        run(&routing, node, &children, on, &job).await
    });
    InPlace::started(future, node, started)
}

/// What failover route `node` moves on for (`failover_errors`) and the cap on the exptime
/// of what it writes to its later children (`failover_exptime`). A replicated route
/// reading as a failover moves on for every error and caps nothing.
fn gutter(routing: &RouteSnapshot, node: NodeId) -> (FailoverErrors, Option<u32>) {
    match routing.routes.node(node) {
        Node::Failover {
            errors,
            exptime_cap,
            ..
        } => (*errors, *exptime_cap),
        _ => (FailoverErrors::ALL, None),
    }
}

/// mcrouter's class of a failure (its `failover_errors` names), for what memroute sees: a
/// server marked down is `tko`; a refused connect (or a name that does not resolve)
/// `connect_error`, one that timed out `connect_timeout`; no reply in time `timeout`; a
/// `SERVER_ERROR` reply, or a connection that broke after the request was written,
/// `remote_error` (as mcrouter's client gives them); a `CLIENT_ERROR` `client_error`; a
/// reply memroute cannot read, or a task inside it that ended, `local_error`; a connection
/// memroute itself was closing `aborted`.
pub(crate) fn error_class(reply: &Reply) -> ErrorClass {
    match reply {
        Ok(bytes) => ErrorClass::of_reply(bytes),
        Err(error) => match error {
            BackendError::Down { .. } => ErrorClass::Tko,
            BackendError::NotConnected { reason, .. } if reason.contains("timed out") => {
                ErrorClass::ConnectTimeout
            }
            BackendError::NotConnected { .. } | BackendError::Resolve { .. } => {
                ErrorClass::ConnectError
            }
            BackendError::Timeout { .. } => ErrorClass::Timeout,
            BackendError::Unavailable { .. } => ErrorClass::RemoteError,
            BackendError::Closed { .. } => ErrorClass::Aborted,
            BackendError::BadReply { .. } | BackendError::Lost => ErrorClass::LocalError,
        },
    }
}

/// Whether an error `reply` (one `class_of` calls an error) moves a route that fails over
/// on `errors` on.
fn fails_over(errors: FailoverErrors, reply: &Reply) -> bool {
    errors.is_all() || errors.contains(error_class(reply))
}

/// `job` as failover route `node` sends it to its later children: with its exptime capped
/// by the route's `failover_exptime` (mcrouter's rule, in memroute-protocol's
/// `cap_exptime`); the same job when the route has no cap or the request keeps its own.
fn capped(routing: &RouteSnapshot, node: NodeId, job: Rc<Job>) -> Rc<Job> {
    let Some(cap) = gutter(routing, node).1 else {
        return job;
    };
    match cap_exptime(job.command, &job.parts, cap) {
        Some(parts) => Rc::new(job.with_parts(parts)),
        None => job,
    }
}

/// The keys of a multi-key job as failover route `node` sends them to its later
/// children: a `gat`/`gats` with its exptime capped as `capped` caps a single key's
/// (mcrouter's `ModifyExptimeRoute` sees each key of a multi-get as a request of its own,
/// with the exptime they share); the same job otherwise.
fn capped_multi(routing: &RouteSnapshot, node: NodeId, job: &Rc<MultiJob>) -> Rc<MultiJob> {
    let Some(head) = gutter(routing, node)
        .1
        .and_then(|cap| cap_multi_head(&job.head, cap))
    else {
        return job.clone();
    };
    Rc::new(MultiJob {
        operation: job.operation,
        head,
        keys: job.keys.clone(),
        slot: job.slot,
        byte_cap: job.byte_cap,
    })
}

/// For a multi-get through policy route `node`: the pool every key goes to first, when the
/// route is a failover (on errors) or a replicated route reading with failover or from its
/// first replica, and its first child is a pool with servers; and whether later children
/// take the keys of a batch that failed. Such a multi-get is planned over that pool as a
/// plain pool's (the session's own legs, merged once), without the executor: only the
/// keys of a failed batch go through it, to the later children (`rest_multi`).
pub(crate) fn first_pool(routing: &RouteSnapshot, node: NodeId) -> Option<(usize, bool)> {
    let routes = &routing.routes;
    let (first, more) = match routes.node(node) {
        Node::Failover {
            children,
            on: FailoverOn::Error,
            ..
        }
        | Node::Replicated {
            children,
            reads: ReadPolicy::Failover,
            ..
        } => (*children.first()?, children.len() > 1),
        Node::Replicated {
            children,
            reads: ReadPolicy::First,
            ..
        } => (*children.first()?, false),
        Node::Replicated {
            children,
            reads: ReadPolicy::Nearest,
            ..
        } => (routing.nearest.of(node)?.first(), children.len() > 1),
        _ => return None,
    };
    match routes.node(first) {
        Node::Pool(pool) if !routing.pools[*pool].servers.is_empty() => Some((*pool, more)),
        _ => None,
    }
}

/// For a single-key write through failover route `node` whose first child is a pool with
/// servers: that pool, and whether there is a later child. Sent to that pool as a plain
/// pool's request is (`start`); the executor runs only for the later children, on a
/// failure, and only when the request may be repeated (`AfterFirst::go_on`). A
/// write moves on on an error only (never on a miss, whatever `on` says), as `run`.
pub(crate) fn write_pool(routing: &RouteSnapshot, node: NodeId) -> Option<(usize, bool)> {
    let Node::Failover { children, .. } = routing.routes.node(node) else {
        return None;
    };
    let pool = pool::with_servers(routing, *children.first()?)?;
    Some((pool, children.len() > 1))
}

/// Children in order until one answers. A request that changes data in a way that must not
/// be repeated (incr, decr, append, prepend, cas) moves on only when the failed child never
/// received it.
pub(super) async fn run(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    on: FailoverOn,
    job: &Rc<Job>,
) -> Reply {
    let mut last = Err(connection_gone());
    // With `error-or-miss`, a miss from an earlier child beats an error from a later one:
    // the key is absent where it could be looked up.
    let mut first_miss: Option<Reply> = None;
    let errors = gutter(routing, node).0;
    let mut job = job.clone();
    for (index, &child) in children.iter().enumerate() {
        if index == 1 {
            job = capped(routing, node, job);
        }
        nearest::count_reads(routing, node, child, 1);
        let reply = Walker::run_child(routing, child, &job).await;
        let class = class_of(&reply);
        let try_next = match class {
            ReplyClass::Error => fails_over(errors, &reply),
            ReplyClass::Miss => on == FailoverOn::ErrorOrMiss && !job.operation.is_write(),
            ReplyClass::Hit => false,
        };
        if !try_next || index + 1 == children.len() {
            return match (class, first_miss) {
                (ReplyClass::Error, Some(miss)) => miss,
                _ => reply,
            };
        }
        let safe_to_repeat =
            job.operation.is_idempotent() || matches!(&reply, Err(error) if error.never_sent());
        if !safe_to_repeat {
            return reply;
        }
        routing.route_stats(node).failovers.fetch_add(1, Relaxed);
        if class == ReplyClass::Miss && first_miss.is_none() {
            first_miss = Some(reply);
        } else {
            last = reply;
        }
    }
    last
}

/// Children in order; each asked only for the keys every child before it failed (or,
/// with `error-or-miss`, missed). A key's miss from an earlier child beats an error from
/// a later one, as for a single key.
pub(super) async fn run_multi(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    on: FailoverOn,
    job: &Rc<MultiJob>,
    keys: Vec<u32>,
) -> KeyReplies {
    let Some((&first, _)) = children.split_first() else {
        return KeyReplies::failed(keys.len(), Err(connection_gone()));
    };
    let errors = gutter(routing, node).0;
    let moves_on = |reply: &KeyReply| match reply.class() {
        ReplyClass::Error => match reply {
            KeyReply::Failed(failed) => fails_over(errors, failed),
            _ => errors.is_all(),
        },
        ReplyClass::Miss => on == FailoverOn::ErrorOrMiss,
        ReplyClass::Hit => false,
    };
    nearest::count_reads(routing, node, first, keys.len() as u64);
    // The common case: the first child answers every key (no bookkeeping per key).
    let first_replies = Walker::run_multi_child(routing, first, job, keys.clone()).await;
    if children.len() == 1 || (on == FailoverOn::Error && first_replies.all_answered()) {
        return first_replies;
    }
    let first_replies = first_replies.into_keys(job, &keys);
    if !first_replies.iter().any(moves_on) {
        return KeyReplies::Keys(first_replies);
    }
    // Every child from the second on is a failover child: the cap applies to each.
    let later = capped_multi(routing, node, job);
    // Final outcomes; for a key still being asked, its first miss (if any).
    let mut outcomes: Vec<Option<KeyReply>> = vec![None; keys.len()];
    let mut remaining: Vec<usize> = (0..keys.len()).collect();
    let mut first_replies = Some(first_replies);
    for (index, &child) in children.iter().enumerate() {
        let last_child = index + 1 == children.len();
        let replies = match first_replies.take() {
            Some(replies) => replies,
            None => {
                let asked: Vec<u32> = remaining.iter().map(|&p| keys[p]).collect();
                nearest::count_reads(routing, node, child, asked.len() as u64);
                let replies = Walker::run_multi_child(routing, child, &later, asked.clone()).await;
                replies.into_keys(&later, &asked)
            }
        };
        let mut next = Vec::new();
        for (&position, reply) in remaining.iter().zip(replies) {
            let class = reply.class();
            // Retrievals only reach here: a miss may be asked again.
            let try_next = moves_on(&reply);
            let outcome = &mut outcomes[position];
            if !try_next || last_child {
                *outcome = match (class, outcome.take()) {
                    (ReplyClass::Error, Some(miss)) => Some(miss),
                    _ => Some(reply),
                };
            } else {
                if class == ReplyClass::Miss && outcome.is_none() {
                    *outcome = Some(reply);
                }
                next.push(position);
            }
        }
        if next.is_empty() {
            break;
        }
        routing
            .route_stats(node)
            .failovers
            .fetch_add(next.len() as u64, Relaxed);
        remaining = next;
    }
    let outcomes = outcomes
        .into_iter()
        .map(|outcome| outcome.unwrap_or(KeyReply::Failed(Err(connection_gone()))))
        .collect();
    KeyReplies::Keys(outcomes)
}

/// A request through failover route `node` (or a read through a replicated route that
/// reads as one) whose first child is a pool with servers: sent to that pool as a plain
/// pool's request is; when there is a later child, the request is kept beside the leg
/// (`AfterFirst`) for a failure to go on with. `Err(job)` otherwise.
// `Err` hands the request back, unboxed (no allocation), to the general walk.
#[allow(clippy::result_large_err)]
pub(super) fn start(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: Job,
    started: Instant,
) -> Result<Start, Job> {
    // A replicated route reading `nearest`: its read order, brought up to date first.
    let nearest = match job.operation.is_write() {
        false => routing.nearest.of(node),
        true => None,
    };
    if let Some(order) = nearest {
        order.refresh(routing.metrics.now());
    }
    let first = match job.operation.is_write() {
        false => first_pool(routing, node),
        true => write_pool(routing, node),
    };
    let Some((pool, more)) = first else {
        return Err(job);
    };
    let request = (&job.parts, job.kind, job.slot);
    let Some(leg) = pool::leg_to(routing, pool, &job.key, request, started) else {
        return Err(job);
    };
    if let Some(order) = nearest {
        let local = order.is_local(pool as NodeId);
        routing.metrics.count_zone_reads(node, local, 1);
    }
    let leg = leg.on_route(node);
    if !more {
        return Ok(Start::leg(leg));
    }
    Ok(Start::Sent {
        legs: Legs::One(leg),
        then: Then::Failover(Homed::new(AfterFirst {
            job: Some(job),
            node,
        })),
    })
}

impl AfterFirst {
    /// Once the first pool answered on `first`: a failure goes on to the later children,
    /// the failure counted against its server. A request whose repetition changes the
    /// result (incr, decr, append, prepend, cas) goes on only when the first pool never
    /// received it, as `run` decides; otherwise the client gets that failure. (Every read
    /// is repeatable.) `None`: the first answer is the client's.
    pub(super) fn go_on(&mut self, routing: &Rc<RouteSnapshot>, first: &mut Leg) -> Option<Routed> {
        let job = self.job.as_ref()?;
        let repeatable = job.operation.is_idempotent() || first.never_sent();
        if first.class() != ReplyClass::Error || !repeatable {
            return None;
        }
        let errors = gutter(routing, self.node).0;
        if !first
            .reply
            .as_ref()
            .is_some_and(|reply| fails_over(errors, reply))
        {
            return None;
        }
        let job = self.job.take()?;
        let _failure = first.take(routing);
        let tried = first.pool() as NodeId;
        Some(start_after_first(
            routing,
            self.node,
            tried,
            job,
            first.started,
        ))
    }
}

/// For a multi-get through failover (or failover-reading replicated) route `node`: the
/// pool its keys are planned on first as a plain pool's keys are (`route::multi_get_pool`),
/// when the first child is a pool with servers.
///
/// Not for a route that fails over on some errors only: a failed batch's keys would all go
/// on whatever the error; its multi-gets take the general walk (`run_multi`), which judges
/// each key's failure.
pub(super) fn multi_get_first_pool(routing: &RouteSnapshot, node: NodeId) -> Option<usize> {
    if !gutter(routing, node).0.is_all() {
        return None;
    }
    match routing.routes.node(node) {
        Node::Failover {
            children,
            on: FailoverOn::ErrorOrMiss,
            ..
        } => pool::with_servers(routing, *children.first()?),
        _ => first_pool(routing, node).map(|(pool, _)| pool),
    }
}

/// Which keys of a multi-get planned over route `node`'s first pool go on to its later
/// children: a failed batch's, and with `error-or-miss` the misses too.
pub(super) fn goes_on(routing: &RouteSnapshot, node: NodeId) -> GoesOn {
    match routing.routes.node(node) {
        Node::Failover {
            children,
            on: FailoverOn::ErrorOrMiss,
            ..
        } if children.len() > 1 => GoesOn::FailedOrMissed,
        _ => match first_pool(routing, node) {
            Some((_, true)) => GoesOn::Failed,
            _ => GoesOn::Never,
        },
    }
}

/// For the keys of a multi-get going on from an `error-or-miss` failover's first pool:
/// per key (in the order they go on), whether the first pool answered it with a miss,
/// which beats a later child's error. Empty for every other route's keys.
#[derive(Debug, Default)]
pub(crate) struct FirstMisses(Vec<bool>);

impl FirstMisses {
    /// Notes the next key going on from a route whose keys go on when `route_goes`,
    /// because its batch failed or missed it (`why`).
    pub(crate) fn note(&mut self, route_goes: GoesOn, why: GoesOn) {
        if route_goes == GoesOn::FailedOrMissed {
            self.0.push(why == GoesOn::Missed);
        }
    }

    /// A later child's error for a key the first pool missed is that miss.
    fn overrule(self, replies: &mut [KeyReply]) {
        for (reply, missed) in replies.iter_mut().zip(self.0) {
            if missed && reply.class() == ReplyClass::Error {
                *reply = KeyReply::Miss;
            }
        }
    }
}

/// The keys of a multi-get (`job`, in the client's order) that went on from route
/// `node`'s first pool (`tried`, its node): through the later children, as `run_multi` goes
/// on after its first child; the first pool's misses beat the later children's errors
/// (`FirstMisses`).
pub(super) fn rest_multi(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    tried: NodeId,
    job: MultiJob,
    missed: FirstMisses,
) -> BoxedMultiReply {
    let count = job.keys.len() as u32;
    routing
        .route_stats(node)
        .failovers
        .fetch_add(u64::from(count), Relaxed);
    let routing = routing.clone();
    Box::pin(async move {
        // Every child from here on is a failover child: the cap applies to each.
        let job = capped_multi(&routing, node, &Rc::new(job));
        let keys: Vec<u32> = (0..count).collect();
        let (children, on) = after_first(&routing, node, tried);
        let replies = run_multi(&routing, node, &children, on, &job, keys.clone()).await;
        if missed.0.is_empty() {
            return multi_reply(replies);
        }
        let mut replies = replies.into_keys(&job, &keys);
        missed.overrule(&mut replies);
        multi_reply(KeyReplies::Keys(replies))
    })
}
