//! The route executor: runs one request (a single key, a flush_all, or the keys of a
//! multi-get that reach the same policy route) through the policy nodes of the route
//! tree: shadow, replicated, failover, warm-up, random, null, error.
//!
//! ```text
//!   dispatch: route is a plain pool? --yes--> fast path (dispatch.rs, no task, no allocation)
//!                 | no
//!             a write through a replicated route whose children are all pools
//!             (replicated_write_servers)?
//!                 --yes--> sent to every replica as plain requests, judged in place by
//!                 | no     write_decision (pending::ReplicatedWrite); not here
//!             a read through a failover/replicated route over a pool first (first_pool),
//!             or a write through a failover route over a pool first (failover_write_pool)?
//!                 --yes--> sent to that pool as a plain request; here only on a failure
//!                 | no     (start_after_first: the later children)
//!             a request through shadow/random routes down to a pool (single_pool)?
//!                 --yes--> sent to that pool as a plain request; the shadow copy on a task
//!             a request through a warm-up route whose cold is a pool (warm_up_cold)?
//!                 --yes--> sent to cold as a plain request; here only a read cold missed
//!                          (start_after_cold: ask warm, fill cold)
//!             a multi-get's keys through failover, replicated, warm-up, shadow or random
//!             routes down to a pool (multi_get_pool)?
//!                 --yes--> planned over that pool as a plain pool's keys (dispatch); here
//!                 | no     only the keys that go on (FollowUp: a failed batch's keys to the
//!                 |        later children, a warm-up's misses to warm) and shadow copies
//!                 v
//!   start(node, job) -> Routed: run(node) polled once now (sends go out in the client's
//!                         |     order), then in place by the session from its pending entry
//!                         |  Prefix/Operation: select a child and go on
//!                         |  Shadow: copy to the shadow target (its own task), go on with primary
//!                         |  Replicated/Failover/WarmUp: run children, decide (routing::policy)
//!                         |  Pool: send to the server that owns the key, await its reply
//!   start_multi(node, keys) -> Routed: the same walk for many keys at once (run_multi):
//!                         a pool gets its keys batched per server (multiget::plan), a policy
//!                         decides per key (failover re-asks only the keys that failed or
//!                         missed, warm-up asks warm only for cold's misses), and the reply is
//!                         the group's hits in key order then END, for multiget::merge.
//! ```
//!
//! A request's own future never outlives its reply: work that goes on after it (async
//! replicated writes, the slower replicas of all-initial/all-majority, shadow copies,
//! warm-up fills) runs on tasks of its own, so the session may drop a `Routed` once answered.
//!
//! The decisions themselves (which child, whether a write policy was met, what counts as
//! a miss) are sans-I/O functions in `memroute_routing`; this module only does the waiting.
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use memroute_backend::{ReplyReceiver, RequestWriter};
use memroute_config::{FailoverOn, Operation, ReadPolicy, WritePolicy};
use memroute_protocol::{retrieval_error, value_block_at, Command, ReplyKind};
use memroute_routing::{classify_reply, write_decision, Node, NodeId, ReplyClass, WriteDecision};
use rand::Rng;
use smallvec::SmallVec;

use crate::multiget::{self, KeyTarget, Step};
use crate::reply::{connection_gone, immediate_ack, null_reply, FlushAllMerge, Reply};
use crate::snapshot::RouteSnapshot;

/// One request as the executor sees it: enough to send it anywhere and to judge its reply.
#[derive(Debug)]
pub(crate) struct Job {
    pub operation: Operation,
    pub command: Command,
    /// The key the route and the placement use (a base64 meta key decoded); empty for flush_all.
    pub key: Bytes,
    /// The bytes to send to a server (noreply/q already stripped).
    pub parts: (Bytes, Option<Bytes>),
    pub kind: ReplyKind,
    /// The client session's connection slot (keeps one client's requests on one connection).
    pub slot: usize,
    /// For meta commands: the flags a reply without data echoes (` O123 kfoo`).
    pub echo: Option<Bytes>,
}

/// The keys of one multi-get (get/gets/gat/gats) that reach the same policy route.
#[derive(Debug)]
pub(crate) struct MultiJob {
    pub operation: Operation,
    /// The batch line's start before its keys (`get `, `gat 300 `).
    pub head: Bytes,
    /// The keys, in the client's order (views of the client's frame).
    pub keys: Vec<Bytes>,
    pub slot: usize,
    /// The longest batch line a server may be sent (gat lines stay under memcached's limit).
    pub byte_cap: usize,
}

/// A policy route's work in flight: its future, polled in place by the session that holds
/// it in its pending queue (no task, no channel), then its output.
pub(crate) struct InPlace<T> {
    state: InPlaceState<T>,
    /// The route node the request reached and when it was read (its latency sample).
    pub route: NodeId,
    pub started: Instant,
}

// Inline on purpose: a multi-get's group lives in its pooled entry, so its size costs no
// single-key request anything.
#[allow(clippy::large_enum_variant)]
enum InPlaceState<T> {
    Running(Pin<Box<dyn Future<Output = T>>>),
    Done(Option<T>),
}

/// A single-key (or flush_all) request through a policy route.
pub(crate) type Routed = InPlace<Reply>;

/// The keys of a multi-get that reach one policy route, their outcome kept unmerged.
pub(crate) type RoutedKeys = InPlace<MultiReply>;

/// What a multi-key job answers, for the session's merge.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per job, in its pending entry; never in bulk
pub(crate) enum MultiReply {
    /// A pool answered every batch (the common case): the servers' replies as they are,
    /// with each of the job's keys' batch (`key_leg`, in the job's key order). The
    /// session merges them straight into the client's reply: one parse, one copy.
    Batches {
        replies: SmallVec<[Bytes; 4]>,
        key_leg: multiget::KeyLegs,
    },
    /// Built per key: the hits as `VALUE` blocks in key order then `END` (or the failure
    /// that fails the multi-get), and how many keys hit.
    Built(Reply, u32),
}

impl MultiReply {
    /// The job's reply as bytes (hits in key order then `END`) and its hit count; `keys`
    /// are the job's keys, in its order.
    pub(crate) fn into_reply<'k>(self, keys: impl Iterator<Item = &'k [u8]>) -> (Reply, u32) {
        match self {
            MultiReply::Built(reply, hits) => (reply, hits),
            MultiReply::Batches { replies, key_leg } => {
                let length = replies.iter().map(Bytes::len).sum::<usize>() + 5;
                let mut out = BytesMut::with_capacity(length);
                match multiget::merge(&replies, keys, &key_leg, &mut out) {
                    Some((hits, _)) => (Ok(out.freeze()), hits as u32),
                    // An error line (never in Batches): it is the whole reply.
                    None => (Ok(out.freeze()), 0),
                }
            }
        }
    }
}

impl<T> std::fmt::Debug for InPlace<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            InPlaceState::Running(_) => "running",
            InPlaceState::Done(_) => "done",
        };
        f.debug_struct("InPlace")
            .field("state", &state)
            .field("route", &self.route)
            .finish()
    }
}

impl<T> InPlace<T> {
    /// Polled once now, so that every request it can send without waiting goes out before
    /// the client's next request is dispatched (a `set` through a replicated route reaches
    /// the servers before the `get` pipelined behind it; a multi-get's batches leave in
    /// the client's order).
    fn started(future: Pin<Box<dyn Future<Output = T>>>, node: NodeId, started: Instant) -> Self {
        let mut in_place = InPlace {
            state: InPlaceState::Running(future),
            route: node,
            started,
        };
        in_place.try_complete();
        in_place
    }

    /// Polls the work on; `Ready` once its output is in.
    pub(crate) fn poll(&mut self, context: &mut Context<'_>) -> Poll<()> {
        let InPlaceState::Running(future) = &mut self.state else {
            return Poll::Ready(());
        };
        match future.as_mut().poll(context) {
            Poll::Ready(output) => {
                self.state = InPlaceState::Done(Some(output));
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Polls without a waker (the session's "what is complete now" pass); the session's
    /// wait polls it again with its own waker before it sleeps.
    pub(crate) fn try_complete(&mut self) -> bool {
        let mut context = Context::from_waker(std::task::Waker::noop());
        self.poll(&mut context).is_ready()
    }

    pub(crate) async fn wait(&mut self) {
        std::future::poll_fn(|context| self.poll(context)).await
    }

    /// The output (once complete), or `lost()` when there is none.
    fn take_or(&mut self, lost: impl FnOnce() -> T) -> T {
        match &mut self.state {
            InPlaceState::Done(output) => output.take(),
            InPlaceState::Running(_) => None,
        }
        .unwrap_or_else(lost)
    }
}

impl InPlace<Reply> {
    /// The reply (once complete).
    pub(crate) fn take(&mut self) -> Reply {
        self.take_or(|| Err(connection_gone()))
    }
}

impl InPlace<MultiReply> {
    /// The outcome (once complete).
    pub(crate) fn take(&mut self) -> MultiReply {
        self.take_or(|| MultiReply::Built(Err(connection_gone()), 0))
    }
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

/// The children after the first of a `first_pool` route, and what moves a read on to them.
fn after_first(routing: &RouteSnapshot, node: NodeId) -> (&[NodeId], FailoverOn) {
    match routing.routes.node(node) {
        Node::Failover { children, on } => (children.get(1..).unwrap_or_default(), *on),
        Node::Replicated { children, .. } => {
            (children.get(1..).unwrap_or_default(), FailoverOn::Error)
        }
        _ => (&[], FailoverOn::Error),
    }
}

/// Starts a read whose first try, on the first child of failover (or replicated) route
/// `node` (a pool: `first_pool`), failed: through the later children, as `failover` goes on
/// after its first child.
pub(crate) fn start_after_first(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: Job,
    started: Instant,
) -> Routed {
    routing.route_stats(node).failovers.fetch_add(1, Relaxed);
    let routing = routing.clone();
    let future: BoxedReply = Box::pin(async move {
        let job = Rc::new(job);
        let (children, on) = after_first(&routing, node);
        failover(&routing, node, children, on, &job).await
    });
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

fn multi_reply(replies: KeyReplies) -> MultiReply {
    match replies {
        KeyReplies::Batches { replies, key_leg } => MultiReply::Batches { replies, key_leg },
        KeyReplies::Keys(replies) => {
            let (reply, hits) = retrieval_reply(replies);
            MultiReply::Built(reply, hits)
        }
    }
}

/// For a multi-get through policy route `node`: the pool every key goes to first, when the
/// route is a failover (on errors) or a replicated route reading with failover or from its
/// first replica, and its first child is a pool with servers; and whether later children
/// take the keys of a batch that failed. Such a multi-get is planned over that pool as a
/// plain pool's (the session's own legs, merged once), without the executor: only the
/// keys of a failed batch go through it, to the later children (`FailoverRest`).
pub(crate) fn first_pool(routing: &RouteSnapshot, node: NodeId) -> Option<(usize, bool)> {
    let routes = &routing.routes;
    let (first, more) = match routes.node(node) {
        Node::Failover {
            children,
            on: FailoverOn::Error,
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
        _ => return None,
    };
    match routes.node(first) {
        Node::Pool(pool) if !routing.pools[*pool].servers.is_empty() => Some((*pool, more)),
        _ => None,
    }
}

/// The random choices of one multi-get: every key that reaches a random route goes to the
/// same child, as a group run by the executor would (one pick per route per multi-get).
pub(crate) type RandomPicks = SmallVec<[(NodeId, NodeId); 1]>;

/// Where the multi-get keys that reach a policy route are planned (`multi_get_pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planned {
    /// The pool whose servers the keys are batched on, as a plain pool's keys are.
    pub pool: usize,
    /// What goes on after the pool's answer (a failover's failed batches, a warm-up's
    /// misses); `GoesOn::Never` for routes reached under a shadow or random route.
    pub goes_on: GoesOn,
    /// The shadow route on the way, if any: the keys in its range are also copied to its
    /// shadow target (the caller's to send, `shadow_copy_keys`).
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
        Node::Failover {
            children,
            on: FailoverOn::ErrorOrMiss,
        } => return first(pool_with_servers(routing, *children.first()?)),
        Node::Failover { .. }
        | Node::Replicated {
            reads: ReadPolicy::First | ReadPolicy::Failover,
            ..
        } => return first(first_pool(routing, node).map(|(pool, _)| pool)),
        Node::WarmUp { cold, .. } => return first(pool_with_servers(routing, *cold)),
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
/// `shadow_copy_single`). `None` for every other route (the executor, or `first_pool`).
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

/// Whether every child of a random route is a pool: only then is its pick made on the fast
/// path (`single_pool`, `multi_get_pool`). A pick that led to another route would be
/// discarded there and drawn again by the executor, so children that are routes would be
/// chosen less often than 1/n; the executor draws once for those.
fn only_pools(routing: &RouteSnapshot, children: &[NodeId]) -> bool {
    children
        .iter()
        .all(|&child| matches!(routing.routes.node(child), Node::Pool(_)))
}

/// Copies `job` to shadow route `node`'s shadow target when its key is in the route's
/// range, as `run` does for a shadow route (on a task of its own; replies dropped).
pub(crate) fn shadow_copy_single(routing: &Rc<RouteSnapshot>, node: NodeId, job: Job) {
    if let Node::Shadow {
        shadow,
        range,
        max_in_flight,
        shadow_index,
        ..
    } = routing.routes.node(node)
    {
        if range.contains_key(&job.key) {
            shadow_copy(
                routing,
                *shadow,
                *shadow_index,
                *max_in_flight,
                &Rc::new(job),
            );
        }
    }
}

/// Whether `key` is in shadow route `node`'s range (is copied to its shadow target).
pub(crate) fn shadows_key(routing: &RouteSnapshot, node: NodeId, key: &[u8]) -> bool {
    match routing.routes.node(node) {
        Node::Shadow { range, .. } => range.contains_key(key),
        _ => false,
    }
}

fn pool_with_servers(routing: &RouteSnapshot, node: NodeId) -> Option<usize> {
    match routing.routes.node(node) {
        Node::Pool(pool) if !routing.pools[*pool].servers.is_empty() => Some(*pool),
        _ => None,
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
        Node::Pool(_) => GoesOn::Never,
        Node::WarmUp { .. } => GoesOn::Missed,
        Node::Failover {
            children,
            on: FailoverOn::ErrorOrMiss,
        } if children.len() > 1 => GoesOn::FailedOrMissed,
        _ => match first_pool(routing, node) {
            Some((_, true)) => GoesOn::Failed,
            _ => GoesOn::Never,
        },
    }
}

/// The keys of a multi-get that go on from route `node`'s first pool (`GoesOn`), in the
/// client's order.
#[derive(Debug)]
pub(crate) struct GoingOn {
    pub node: NodeId,
    pub keys: Vec<Bytes>,
    /// For an `error-or-miss` failover (empty otherwise): per key, whether the first pool
    /// answered it with a miss, which beats a later child's error.
    pub missed: Vec<bool>,
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
    /// children, as `failover_multi` goes on after its first child, or to a warm-up's
    /// warm, as `warm_up_multi` asks it for cold's misses.
    pub(crate) fn start(
        &self,
        routing: &Rc<RouteSnapshot>,
        going: GoingOn,
        started: Instant,
    ) -> RoutedKeys {
        let GoingOn { node, keys, missed } = going;
        let job = MultiJob {
            operation: self.operation,
            head: self.head.clone(),
            keys,
            slot: self.slot,
            byte_cap: self.byte_cap,
        };
        let count = job.keys.len() as u32;
        let routing = routing.clone();
        let future: Pin<Box<dyn Future<Output = MultiReply>>> = match *routing.routes.node(node) {
            Node::WarmUp { cold, warm, ttl } => Box::pin(async move {
                let job = Rc::new(job);
                let keys = (0..count).collect();
                let replies = warm_misses(&routing, node, cold, warm, ttl, &job, keys).await;
                multi_reply(KeyReplies::Keys(replies))
            }),
            _ => {
                routing
                    .route_stats(node)
                    .failovers
                    .fetch_add(u64::from(count), Relaxed);
                Box::pin(async move {
                    let job = Rc::new(job);
                    let keys: Vec<u32> = (0..count).collect();
                    let (children, on) = after_first(&routing, node);
                    let replies = failover_multi(&routing, node, children, on, &job, keys.clone());
                    let replies = replies.await;
                    if missed.is_empty() {
                        return multi_reply(replies);
                    }
                    let mut replies = replies.into_keys(&job, &keys);
                    for (reply, missed) in replies.iter_mut().zip(missed) {
                        if missed && reply.class() == ReplyClass::Error {
                            *reply = KeyReply::Miss;
                        }
                    }
                    multi_reply(KeyReplies::Keys(replies))
                })
            }
        };
        InPlace::started(future, node, started)
    }
}

/// Copies `job`'s keys (the keys of a multi-get in shadow route `node`'s range, planned
/// by the session) to the shadow target, as `run_multi` does for a shadow route's keys.
pub(crate) fn shadow_copy_keys(routing: &Rc<RouteSnapshot>, node: NodeId, job: MultiJob) {
    if let Node::Shadow {
        shadow,
        max_in_flight,
        shadow_index,
        ..
    } = *routing.routes.node(node)
    {
        let keys = (0..job.keys.len() as u32).collect();
        shadow_copy_multi(
            routing,
            shadow,
            shadow_index,
            max_in_flight,
            &Rc::new(job),
            keys,
        );
    }
}

/// Polls `future` once, right now, before it becomes a task. A task spawned with
/// `spawn_local` first runs on the worker's next turn, after the session has dispatched
/// the client's following requests: a `set` through a replicated route would then reach
/// the servers after the `get` the client pipelined behind it. Polling once here sends
/// every request the future can send without waiting, in the client's order; the task
/// then polls it again with its real waker.
fn eager<F: Future + 'static>(future: F) -> Eager<F> {
    let mut future = Box::pin(future);
    let mut context = Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        Poll::Ready(output) => Eager::Ready(Some(output)),
        Poll::Pending => Eager::Pending(future),
    }
}

enum Eager<F: Future> {
    Ready(Option<F::Output>),
    Pending(Pin<Box<F>>),
}

impl<F: Future> Future for Eager<F>
where
    F::Output: Unpin,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        match self.get_mut() {
            Eager::Ready(output) => match output.take() {
                Some(output) => Poll::Ready(output),
                // Polled again after completing: a bug in the caller, never in tokio's tasks.
                None => Poll::Pending,
            },
            Eager::Pending(future) => future.as_mut().poll(context),
        }
    }
}

type BoxedReply = Pin<Box<dyn Future<Output = Reply>>>;

/// Runs `job` from `node` down to the servers and back. Boxed: routes nest.
fn run(routing: Rc<RouteSnapshot>, node: NodeId, job: Rc<Job>) -> BoxedReply {
    Box::pin(async move {
        let routes = routing.routes.clone();
        let mut node = node;
        loop {
            match routes.node(node) {
                // flush_all has no key: it goes to every target of a prefix route, so
                // that the pools behind the other prefixes are flushed too.
                Node::Prefix { prefixes, default } if job.operation == Operation::FlushAll => {
                    let mut targets: Vec<NodeId> = prefixes.iter().map(|(_, t)| *t).collect();
                    targets.push(*default);
                    targets.sort_unstable();
                    targets.dedup();
                    return flush_all_of(&routing, &targets, &job).await;
                }
                Node::Prefix { .. } | Node::Operation { .. } => {
                    node = routes.select(node, job.operation, &job.key);
                }
                Node::Pool(pool) => return send_to_pool(&routing, *pool, &job).await,
                Node::Shadow {
                    primary,
                    shadow,
                    range,
                    max_in_flight,
                    shadow_index,
                } => {
                    // flush_all has no key to select by: it is not shadowed.
                    if job.operation != Operation::FlushAll && range.contains_key(&job.key) {
                        shadow_copy(&routing, *shadow, *shadow_index, *max_in_flight, &job);
                    }
                    node = *primary;
                }
                Node::Replicated {
                    children,
                    writes,
                    reads,
                } => {
                    return match job.operation.is_write() {
                        true => replicated_write(&routing, node, children, *writes, &job).await,
                        false => replicated_read(&routing, node, children, *reads, &job).await,
                    };
                }
                Node::Failover { children, on } => {
                    return failover(&routing, node, children, *on, &job).await;
                }
                Node::WarmUp { cold, warm, ttl } => {
                    return warm_up(&routing, node, *cold, *warm, *ttl, &job).await;
                }
                Node::Random { children } => node = pick_random(children),
                Node::Null => return Ok(null_answer(&job)),
                Node::Error { message } => {
                    return Ok(Bytes::from(format!("SERVER_ERROR {message}\r\n")));
                }
            }
        }
    })
}

/// Runs `job` from a child node, awaited in place: a pool child (the common case) without
/// the boxed future a nested route needs.
async fn run_child(routing: &Rc<RouteSnapshot>, node: NodeId, job: &Rc<Job>) -> Reply {
    match routing.routes.node(node) {
        Node::Pool(pool) if job.operation != Operation::FlushAll => {
            send_to_pool(routing, *pool, job).await
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
        Node::Pool(pool) => pool_multi(routing, *pool, job, &keys).await,
        _ => run_multi(routing.clone(), node, job.clone(), keys).await,
    }
}

/// One child at random. A route table never holds a random or replicated route without
/// children (the routing crate refuses to build one: `route ... has no children`), which
/// `children[0]` for `reads = "first"` relies on too: no fallback to make up.
fn pick_random(children: &[NodeId]) -> NodeId {
    match children.len() {
        1 => children[0],
        n => children[rand::thread_rng().gen_range(0..n)],
    }
}

/// A reply that met the request: anything but a transport failure or an error line.
pub(crate) fn answered(reply: &Reply) -> bool {
    matches!(reply, Ok(bytes) if classify_reply(bytes) != ReplyClass::Error)
}

fn class_of(reply: &Reply) -> ReplyClass {
    match reply {
        Ok(bytes) => classify_reply(bytes),
        Err(_) => ReplyClass::Error,
    }
}

async fn send_to_pool(routing: &Rc<RouteSnapshot>, pool: usize, job: &Job) -> Reply {
    if job.operation == Operation::FlushAll {
        return flush_pool(routing, pool, job).await;
    }
    let Some(server) = routing.server_for(pool, &job.key) else {
        return Err(routing.no_servers(pool));
    };
    let connections = &routing.pools[pool].servers[server];
    let reply = connections
        .pick(job.slot)
        .send(job.parts.clone(), job.kind)
        .await
        .unwrap_or_else(|_| Err(connection_gone()));
    if let Err(error) = &reply {
        connections.count_failure(error);
    }
    reply
}

/// flush_all to every server of a pool: `OK` only if every server said so.
async fn flush_pool(routing: &Rc<RouteSnapshot>, pool: usize, job: &Job) -> Reply {
    let receivers: Vec<_> = routing.pools[pool]
        .servers
        .iter()
        .map(|s| s.pick(job.slot).send(job.parts.clone(), ReplyKind::Line))
        .collect();
    if receivers.is_empty() {
        return Err(routing.no_servers(pool));
    }
    let mut merge = FlushAllMerge::default();
    for receiver in receivers {
        merge.add(receiver.await.unwrap_or_else(|_| Err(connection_gone())));
    }
    merge.finish()
}

/// flush_all through several routes at once: `OK` only if every one said so.
async fn flush_all_of(routing: &Rc<RouteSnapshot>, targets: &[NodeId], job: &Rc<Job>) -> Reply {
    let mut set = start_all(routing, targets, job);
    let mut merge = FlushAllMerge::default();
    while let Some((_, reply)) = set.next().await {
        merge.add(reply);
    }
    merge.finish()
}

/// Copies a request to a shadow target. Never awaited by the client's request: the copy
/// runs on its own task, its reply is dropped, and past `max_in_flight` copies (per
/// worker) new ones are dropped and counted rather than queued.
fn shadow_copy(
    routing: &Rc<RouteSnapshot>,
    shadow: NodeId,
    index: usize,
    max_in_flight: usize,
    job: &Rc<Job>,
) {
    let Some(state) = routing.shadows.get(index) else {
        return;
    };
    if state.in_flight.get() >= max_in_flight {
        state.stats.dropped.fetch_add(1, Relaxed);
        return;
    }
    state.in_flight.set(state.in_flight.get() + 1);
    state.stats.sent.fetch_add(1, Relaxed);
    let (routing, job) = (routing.clone(), job.clone());
    tokio::task::spawn_local(eager(async move {
        let reply = run(routing.clone(), shadow, job).await;
        if let Some(state) = routing.shadows.get(index) {
            let counter = match answered(&reply) {
                true => &state.stats.completed,
                false => &state.stats.errors,
            };
            counter.fetch_add(1, Relaxed);
            state.in_flight.set(state.in_flight.get().saturating_sub(1));
        }
    }));
}

/// Starts `job` on every child, polled in place by the request's own future (no task
/// per child); `next` yields (child index, reply) as they arrive.
fn start_all(routing: &Rc<RouteSnapshot>, children: &[NodeId], job: &Rc<Job>) -> Children {
    Children {
        running: children
            .iter()
            .map(|&child| Some(run(routing.clone(), child, job.clone())))
            .collect(),
    }
}

/// Children's requests in flight, polled by whoever awaits `next`. Dropping it cancels
/// their waits (the servers' replies are read and dropped); `detach` lets them finish
/// on tasks of their own instead.
struct Children {
    running: Vec<Option<BoxedReply>>,
}

impl Children {
    /// The next child to answer, or `None` once every child has.
    async fn next(&mut self) -> Option<(usize, Reply)> {
        std::future::poll_fn(|context| {
            let mut any = false;
            for (index, slot) in self.running.iter_mut().enumerate() {
                let Some(future) = slot else { continue };
                any = true;
                if let Poll::Ready(reply) = future.as_mut().poll(context) {
                    *slot = None;
                    return Poll::Ready(Some((index, reply)));
                }
            }
            match any {
                true => Poll::Pending,
                false => Poll::Ready(None),
            }
        })
        .await
    }

    /// The children still running go on in the background (their replies dropped).
    /// Polled once now: a child never polled yet sends its request at once.
    fn detach(self) {
        for future in self.running.into_iter().flatten() {
            tokio::task::spawn_local(eager(future));
        }
    }
}

async fn replicated_write(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    policy: WritePolicy,
    job: &Rc<Job>,
) -> Reply {
    if policy == WritePolicy::AllAsync {
        if let Some(ack) = immediate_ack(job.command) {
            start_all(routing, children, job).detach();
            return Ok(Bytes::from_static(ack));
        }
    }
    let mut set = start_all(routing, children, job);
    let mut outcomes: Vec<Option<bool>> = vec![None; children.len()];
    let mut replies: Vec<Option<Reply>> = vec![None; children.len()];
    loop {
        match write_decision(policy, &outcomes) {
            WriteDecision::Wait => match set.next().await {
                Some((index, reply)) => {
                    outcomes[index] = Some(answered(&reply));
                    replies[index] = Some(reply);
                }
                // Every child answered and the policy still waits: cannot happen
                // (write_decision decides once every outcome is in); never wait forever.
                None => return Err(connection_gone()),
            },
            WriteDecision::Answer { child } => {
                // The rest finish in the background (all-initial, all-majority).
                set.detach();
                return replies[child]
                    .take()
                    .unwrap_or_else(|| Err(connection_gone()));
            }
            WriteDecision::Fail { failed, total } => {
                set.detach();
                return Ok(write_failed(routing, node, policy, failed, total));
            }
        }
    }
}

/// The reply to a replicated write whose policy failed (`WriteDecision::Fail`), counted in
/// the route's `write_failures`: the same for the executor and the session's legs
/// (`replicated_write_servers`).
pub(crate) fn write_failed(
    routing: &RouteSnapshot,
    node: NodeId,
    policy: WritePolicy,
    failed: usize,
    total: usize,
) -> Bytes {
    routing
        .route_stats(node)
        .write_failures
        .fetch_add(1, Relaxed);
    Bytes::from(format!(
        "SERVER_ERROR replicated write failed on {failed} of {total} replicas ({})\r\n",
        policy.as_str()
    ))
}

/// The servers a single-key write through replicated route `node` goes to, one per child
/// in the route's order, when every child is a pool with a server for `key`: such a write
/// is sent to them as a plain pool's request is (the session's own legs, their replies
/// judged in place by `write_decision`), without the executor. `None` for any other
/// replicated route (a child that is a route, a pool without servers, whose error the
/// executor words) and every other node. At most a few replicas: on the stack.
pub(crate) fn replicated_write_servers(
    routing: &RouteSnapshot,
    node: NodeId,
    key: &[u8],
) -> Option<(WritePolicy, ReplicaServers)> {
    let Node::Replicated {
        children, writes, ..
    } = routing.routes.node(node)
    else {
        return None;
    };
    let mut servers = ReplicaServers::new();
    for &child in children.iter() {
        let Node::Pool(pool) = *routing.routes.node(child) else {
            return None;
        };
        servers.push((pool, routing.server_for(pool, key)?));
    }
    Some((*writes, servers))
}

/// Per replica of a replicated write, (pool, server).
pub(crate) type ReplicaServers = SmallVec<[(usize, usize); 3]>;

/// For a single-key write through failover route `node` whose first child is a pool with
/// servers: that pool, and whether there is a later child. Sent to that pool as a plain
/// pool's request is (`pending::FirstTry`); the executor runs only for the later children,
/// on a failure, and only when the request may be repeated (`FirstTry::fail_over`). A
/// write moves on on an error only (never on a miss, whatever `on` says), as `failover`.
pub(crate) fn failover_write_pool(routing: &RouteSnapshot, node: NodeId) -> Option<(usize, bool)> {
    let Node::Failover { children, .. } = routing.routes.node(node) else {
        return None;
    };
    let pool = pool_with_servers(routing, *children.first()?)?;
    Some((pool, children.len() > 1))
}

async fn replicated_read(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    policy: ReadPolicy,
    job: &Rc<Job>,
) -> Reply {
    match policy {
        ReadPolicy::First => run_child(routing, children[0], job).await,
        ReadPolicy::Random => run_child(routing, pick_random(children), job).await,
        ReadPolicy::Failover => failover(routing, node, children, FailoverOn::Error, job).await,
        ReadPolicy::Fastest => {
            let mut set = start_all(routing, children, job);
            let mut last = Err(connection_gone());
            while let Some((_, reply)) = set.next().await {
                if answered(&reply) {
                    // The slower children's replies are not needed: dropping the set
                    // cancels their waits (the servers' replies are read and dropped).
                    return reply;
                }
                last = reply;
            }
            last
        }
    }
}

/// Children in order until one answers. A request that changes data in a way that must not
/// be repeated (incr, decr, append, prepend, cas) moves on only when the failed child never
/// received it.
async fn failover(
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
    for (index, &child) in children.iter().enumerate() {
        let reply = run_child(routing, child, job).await;
        let class = class_of(&reply);
        let try_next = match class {
            ReplyClass::Error => true,
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

/// Get from cold; on a miss get from warm and, for a classic get that hit, fill cold with
/// the value (asynchronously). Everything else goes to cold.
async fn warm_up(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: &Rc<Job>,
) -> Reply {
    if !warms_up(job.command) {
        return run_child(routing, cold, job).await;
    }
    let from_cold = run_child(routing, cold, job).await;
    after_cold(routing, node, cold, warm, ttl, job, from_cold).await
}

/// Whether a warm-up route asks warm for `command` when cold missed it: reads (the
/// classic retrievals and meta get); everything else goes to cold only.
pub(crate) fn warms_up(command: Command) -> bool {
    matches!(
        command,
        Command::Get | Command::Gets | Command::Gat | Command::Gats | Command::MetaGet
    )
}

/// For a single-key request that reached policy route `node`: when it is a warm-up route
/// whose cold is a pool with servers, that pool. The request is sent to it as a plain
/// pool's request is; a read cold missed goes on to warm (`start_after_cold`).
pub(crate) fn warm_up_cold(routing: &RouteSnapshot, node: NodeId) -> Option<usize> {
    match routing.routes.node(node) {
        Node::WarmUp { cold, .. } => pool_with_servers(routing, *cold),
        _ => None,
    }
}

/// Starts a read that warm-up route `node`'s cold pool (`warm_up_cold`) answered with
/// `from_cold`, a miss: asked of warm (and filled into cold), as `warm_up` goes on after
/// cold.
pub(crate) fn start_after_cold(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: Job,
    from_cold: Reply,
    started: Instant,
) -> Routed {
    let routing = routing.clone();
    let future: BoxedReply = Box::pin(async move {
        let Node::WarmUp { cold, warm, ttl } = *routing.routes.node(node) else {
            return from_cold;
        };
        let job = Rc::new(job);
        after_cold(&routing, node, cold, warm, ttl, &job, from_cold).await
    });
    InPlace::started(future, node, started)
}

/// A warm-up read once cold answered `from_cold`: a hit (or a failure) is the answer; a
/// miss is asked of warm, and warm's hit filled into cold.
async fn after_cold(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: &Rc<Job>,
    from_cold: Reply,
) -> Reply {
    if class_of(&from_cold) != ReplyClass::Miss {
        return from_cold;
    }
    let from_warm = run_child(routing, warm, job).await;
    if class_of(&from_warm) != ReplyClass::Hit {
        // Warm had nothing (or failed): the cold miss is the honest answer.
        return from_cold;
    }
    // A meta get's hit is not filled (its reply is not a `VALUE` block to `add` from).
    let classic = job.command != Command::MetaGet;
    if classic {
        if let Some(fill) = from_warm
            .as_ref()
            .ok()
            .and_then(|r| fill_job(r, ttl, job.slot))
        {
            routing.route_stats(node).fills.fetch_add(1, Relaxed);
            let (routing, fill) = (routing.clone(), Rc::new(fill));
            tokio::task::spawn_local(async move {
                let _ = run(routing, cold, fill).await;
            });
        }
    }
    from_warm
}

/// `add <key> <flags> <ttl> <bytes>` built from the first `VALUE` block of a retrieval reply.
/// `add`, not `set`: a client's write that reached cold while warm was being asked must win
/// over the older value from warm.
fn fill_job(reply: &Bytes, ttl: u32, slot: usize) -> Option<Job> {
    let line_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&reply[..line_end]).ok()?;
    let mut tokens = line.split(' ');
    if tokens.next()? != "VALUE" {
        return None;
    }
    let key = tokens.next()?;
    let flags: u32 = tokens.next()?.parse().ok()?;
    let length: usize = tokens.next()?.parse().ok()?;
    let data_start = line_end + 2;
    let data = reply.get(data_start..data_start.checked_add(length)?)?;
    let mut frame = BytesMut::with_capacity(data.len() + key.len() + 48);
    frame.put_slice(format!("add {key} {flags} {ttl} {length}\r\n").as_bytes());
    frame.put_slice(data);
    frame.put_slice(b"\r\n");
    Some(Job {
        operation: Operation::Add,
        command: Command::Add,
        key: Bytes::copy_from_slice(key.as_bytes()),
        parts: (frame.freeze(), None),
        kind: ReplyKind::Line,
        slot,
        echo: None,
    })
}

/// A null route's reply, with the flags a meta client asked to have echoed.
fn null_answer(job: &Job) -> Bytes {
    let reply = null_reply(job.command);
    match &job.echo {
        Some(echo) if !echo.is_empty() => {
            let line = reply.strip_suffix(b"\r\n").unwrap_or(reply);
            let mut out = BytesMut::with_capacity(line.len() + echo.len() + 2);
            out.put_slice(line);
            out.put_slice(echo);
            out.put_slice(b"\r\n");
            out.freeze()
        }
        _ => Bytes::from_static(reply),
    }
}

/// One key's outcome in a multi-key job.
#[derive(Debug, Clone)]
enum KeyReply {
    /// The key's whole `VALUE` block (a view of the server's reply).
    Hit(Bytes),
    Miss,
    /// A transport failure, or the error line a server (or an error route) answered.
    Failed(Reply),
}

impl KeyReply {
    fn class(&self) -> ReplyClass {
        match self {
            KeyReply::Hit(_) => ReplyClass::Hit,
            KeyReply::Miss => ReplyClass::Miss,
            KeyReply::Failed(_) => ReplyClass::Error,
        }
    }
}

/// A multi-key job's outcome: per key, or (the common case: a pool whose every batch was
/// answered without an error) the servers' replies as they are with each key's batch, so
/// that the client's reply is merged from them once, as a plain pool's is. One per job,
/// returned and dropped, never stored in bulk: the inline batches are worth their size.
#[allow(clippy::large_enum_variant)]
enum KeyReplies {
    Keys(Vec<KeyReply>),
    Batches {
        replies: SmallVec<[Bytes; 4]>,
        key_leg: multiget::KeyLegs,
    },
}

impl KeyReplies {
    /// Per key (`keys` as asked), walking the batches when that is what came back.
    fn into_keys(self, job: &MultiJob, keys: &[u32]) -> Vec<KeyReply> {
        let (replies, key_leg) = match self {
            KeyReplies::Keys(replies) => return replies,
            KeyReplies::Batches { replies, key_leg } => (replies, key_leg),
        };
        let replies: SmallVec<[Reply; 4]> = replies.into_iter().map(Ok).collect();
        per_key(&replies, &key_leg, job, keys)
    }

    /// Whether every key was answered (hit or miss), none failed.
    fn all_answered(&self) -> bool {
        match self {
            KeyReplies::Batches { .. } => true,
            KeyReplies::Keys(replies) => replies.iter().all(|r| !matches!(r, KeyReply::Failed(_))),
        }
    }

    fn failed(count: usize, failure: Reply) -> KeyReplies {
        KeyReplies::Keys(vec![KeyReply::Failed(failure); count])
    }
}

type BoxedKeyReplies = Pin<Box<dyn Future<Output = KeyReplies>>>;

/// Each key's outcome from the batch replies that carried it (`key_leg[i]`: the batch of
/// `keys[i]`): its batch's failure, or its `VALUE` block, or a miss. Servers answer in the
/// order they were asked, skipping misses.
fn per_key(replies: &[Reply], key_leg: &[u32], job: &MultiJob, keys: &[u32]) -> Vec<KeyReply> {
    let mut cursor: SmallVec<[usize; 4]> = smallvec::smallvec![0; replies.len()];
    keys.iter()
        .enumerate()
        .map(|(i, &key)| {
            let leg = key_leg.get(i).copied().unwrap_or(u32::MAX) as usize;
            let Some(reply) = replies.get(leg) else {
                return KeyReply::Failed(Err(connection_gone()));
            };
            let bytes = match reply {
                Ok(bytes) => bytes,
                Err(error) => return KeyReply::Failed(Err(error.clone())),
            };
            if let Some(line) = retrieval_error(bytes) {
                return KeyReply::Failed(Ok(bytes.slice(line)));
            }
            match value_block_at(bytes, cursor[leg]) {
                Some(block) if bytes[block.key.clone()] == job.keys[key as usize][..] => {
                    cursor[leg] = block.block.end;
                    KeyReply::Hit(bytes.slice(block.block))
                }
                _ => KeyReply::Miss,
            }
        })
        .collect()
}

/// The reply of a multi-key job answered per key: the hits in key order then `END`, and
/// their count; the first failure instead when a key failed (one failed key fails a
/// multi-get, as a failed server does). (A pool's batches, the other outcome, reach the
/// session unmerged: `MultiReply::Batches`.)
fn retrieval_reply(replies: Vec<KeyReply>) -> (Reply, u32) {
    let (mut length, mut hits) = (5, 0);
    for reply in &replies {
        match reply {
            KeyReply::Hit(block) => {
                length += block.len();
                hits += 1;
            }
            KeyReply::Miss => {}
            KeyReply::Failed(failure) => return (failure.clone(), 0),
        }
    }
    let mut out = BytesMut::with_capacity(length);
    for reply in &replies {
        if let KeyReply::Hit(block) = reply {
            out.put_slice(block);
        }
    }
    out.put_slice(b"END\r\n");
    (Ok(out.freeze()), hits)
}

/// Runs the keys `keys` (indexes into `job.keys`) from `node`; one outcome per key, in
/// the order of `keys`. Boxed: routes nest.
fn run_multi(
    routing: Rc<RouteSnapshot>,
    node: NodeId,
    job: Rc<MultiJob>,
    keys: Vec<u32>,
) -> BoxedKeyReplies {
    Box::pin(async move {
        let routes = routing.routes.clone();
        let mut node = node;
        loop {
            if keys.is_empty() {
                return KeyReplies::Keys(Vec::new());
            }
            match routes.node(node) {
                Node::Prefix { .. } | Node::Operation { .. } => {
                    // The keys may part ways here: one group per child, run side by side.
                    let mut groups: SmallVec<[(NodeId, Vec<usize>); 2]> = SmallVec::new();
                    for (position, &key) in keys.iter().enumerate() {
                        let child = routes.select(node, job.operation, &job.keys[key as usize]);
                        match groups.iter_mut().find(|(node, _)| *node == child) {
                            Some((_, positions)) => positions.push(position),
                            None => groups.push((child, vec![position])),
                        }
                    }
                    if let [(child, _)] = groups.as_slice() {
                        node = *child;
                        continue;
                    }
                    let subsets: Vec<Vec<u32>> = groups
                        .iter()
                        .map(|(_, positions)| positions.iter().map(|&p| keys[p]).collect())
                        .collect();
                    let futures = groups
                        .iter()
                        .zip(&subsets)
                        .map(|((child, _), subset)| {
                            run_multi(routing.clone(), *child, job.clone(), subset.clone())
                        })
                        .collect();
                    let mut out = vec![KeyReply::Miss; keys.len()];
                    let answers = join_all(futures).await;
                    for (((_, positions), subset), replies) in
                        groups.iter().zip(&subsets).zip(answers)
                    {
                        let replies = replies.into_keys(&job, subset);
                        for (&position, reply) in positions.iter().zip(replies) {
                            out[position] = reply;
                        }
                    }
                    return KeyReplies::Keys(out);
                }
                Node::Pool(pool) => return pool_multi(&routing, *pool, &job, &keys).await,
                Node::Shadow {
                    primary,
                    shadow,
                    range,
                    max_in_flight,
                    shadow_index,
                } => {
                    let copied: Vec<u32> = keys
                        .iter()
                        .copied()
                        .filter(|&key| range.contains_key(&job.keys[key as usize]))
                        .collect();
                    if !copied.is_empty() {
                        shadow_copy_multi(
                            &routing,
                            *shadow,
                            *shadow_index,
                            *max_in_flight,
                            &job,
                            copied,
                        );
                    }
                    node = *primary;
                }
                // A multi-get is a read (get/gets/gat/gats): replicated routes pick a replica.
                Node::Replicated {
                    children, reads, ..
                } => {
                    return match reads {
                        ReadPolicy::First => {
                            run_multi_child(&routing, children[0], &job, keys).await
                        }
                        ReadPolicy::Random => {
                            let child = pick_random(children);
                            run_multi_child(&routing, child, &job, keys).await
                        }
                        ReadPolicy::Failover => {
                            failover_multi(&routing, node, children, FailoverOn::Error, &job, keys)
                                .await
                        }
                        ReadPolicy::Fastest => fastest_multi(&routing, children, &job, keys).await,
                    };
                }
                Node::Failover { children, on } => {
                    return failover_multi(&routing, node, children, *on, &job, keys).await;
                }
                Node::WarmUp { cold, warm, ttl } => {
                    return warm_up_multi(&routing, node, *cold, *warm, *ttl, &job, keys).await;
                }
                Node::Random { children } => node = pick_random(children),
                Node::Null => return KeyReplies::Keys(vec![KeyReply::Miss; keys.len()]),
                Node::Error { message } => {
                    let line = Bytes::from(format!("SERVER_ERROR {message}\r\n"));
                    return KeyReplies::failed(keys.len(), Ok(line));
                }
            }
        }
    })
}

/// The batch lines of a multi-get being planned (`multiget::plan`), one per leg, written
/// straight into each server connection's outgoing buffer and sent when the plan closes
/// them. Dropped with lines still open (the plan stopped), those take their bytes back out.
pub(crate) struct BatchLines<'r> {
    routing: &'r RouteSnapshot,
    head: &'r [u8],
    slot: usize,
    /// Indexed by leg; taken when the leg is sent.
    writers: SmallVec<[Option<RequestWriter<'r>>; 4]>,
}

impl<'r> BatchLines<'r> {
    /// Lines that start with `head` (`get `, `gets `...), on the client's connection `slot`.
    pub(crate) fn new(routing: &'r RouteSnapshot, head: &'r [u8], slot: usize) -> Self {
        BatchLines {
            routing,
            head,
            slot,
            writers: SmallVec::new(),
        }
    }

    /// Starts the next leg's line, to `server` of `pool`, with its first key.
    pub(crate) fn open(&mut self, pool: usize, server: usize, key: &[u8]) {
        let mut writer = self.routing.pools[pool].servers[server]
            .pick(self.slot)
            .writer();
        writer.append(self.head);
        writer.append_key(key);
        self.writers.push(Some(writer));
    }

    /// Adds `key` to leg `leg`'s open line.
    pub(crate) fn add(&mut self, leg: usize, key: &[u8]) {
        if let Some(writer) = &mut self.writers[leg] {
            writer.append_word(key);
        }
    }

    /// Ends leg `leg`'s line and sends it; its reply's receiver.
    pub(crate) fn close(&mut self, leg: usize) -> Option<ReplyReceiver> {
        let mut writer = self.writers[leg].take()?;
        writer.append(b"\r\n");
        Some(writer.finish(ReplyKind::Retrieval))
    }
}

/// A pool's share of a multi-get: its keys batched per server exactly as a plain pool's
/// are (`multiget::plan`), every batch sent before any reply is awaited.
async fn pool_multi(
    routing: &Rc<RouteSnapshot>,
    pool: usize,
    job: &MultiJob,
    keys: &[u32],
) -> KeyReplies {
    let targets = keys.iter().map(|&key| {
        let key = &job.keys[key as usize][..];
        let target = match routing.server_for(pool, key) {
            Some(server) => KeyTarget::Server(pool as u32, server as u32),
            None => KeyTarget::Nowhere(pool as u32),
        };
        (key, target)
    });
    let mut key_leg = multiget::KeyLegs::new();
    key_leg.reserve_exact(keys.len());
    // Per batch: its server, then the reply's receiver once sent.
    let mut lines = BatchLines::new(routing, &job.head, job.slot);
    let mut servers: SmallVec<[usize; 4]> = SmallVec::new();
    let mut receivers: SmallVec<[Option<ReplyReceiver>; 4]> = SmallVec::new();
    let planned = multiget::plan(
        targets,
        job.head.len(),
        job.byte_cap,
        |pool| routing.pools[pool].max_keys_per_request,
        &mut key_leg,
        |step| match step {
            Step::Open {
                pool, server, key, ..
            } => {
                lines.open(pool, server, key);
                servers.push(server);
                receivers.push(None);
            }
            Step::Add { leg, key } => lines.add(leg, key),
            Step::Close { leg } => receivers[leg] = lines.close(leg),
            // Every target here is a server of this pool.
            Step::Executor { .. } => {}
        },
    );
    drop(lines);
    if planned.is_err() {
        return KeyReplies::failed(keys.len(), Err(routing.no_servers(pool)));
    }
    let batches = servers.into_iter().zip(receivers);
    let mut replies: SmallVec<[Reply; 4]> = SmallVec::new();
    for (server, receiver) in batches {
        let reply = match receiver {
            Some(receiver) => receiver.await.unwrap_or_else(|_| Err(connection_gone())),
            None => Err(connection_gone()),
        };
        if let Err(error) = &reply {
            routing.pools[pool].servers[server].count_failure(error);
        }
        replies.push(reply);
    }
    if replies
        .iter()
        .all(|reply| matches!(reply, Ok(bytes) if retrieval_error(bytes).is_none()))
    {
        let replies = replies.into_iter().flatten().collect();
        return KeyReplies::Batches { replies, key_leg };
    }
    // A batch failed: per key, its batch's failure or its own answer.
    let outcomes = per_key(&replies, &key_leg, job, keys);
    KeyReplies::Keys(outcomes)
}

/// Children in order; each asked only for the keys every child before it failed (or,
/// with `error-or-miss`, missed). A key's miss from an earlier child beats an error from
/// a later one, as for a single key.
async fn failover_multi(
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
    let moves_on = |reply: &KeyReply| match reply.class() {
        ReplyClass::Error => true,
        ReplyClass::Miss => on == FailoverOn::ErrorOrMiss,
        ReplyClass::Hit => false,
    };
    // The common case: the first child answers every key (no bookkeeping per key).
    let first_replies = run_multi_child(routing, first, job, keys.clone()).await;
    if children.len() == 1 || (on == FailoverOn::Error && first_replies.all_answered()) {
        return first_replies;
    }
    let first_replies = first_replies.into_keys(job, &keys);
    if !first_replies.iter().any(moves_on) {
        return KeyReplies::Keys(first_replies);
    }
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
                let replies = run_multi_child(routing, child, job, asked.clone()).await;
                replies.into_keys(job, &asked)
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

/// Every replica asked at once; the first whose every key answered wins (the slower
/// replicas' waits are dropped), else the last to answer.
async fn fastest_multi(
    routing: &Rc<RouteSnapshot>,
    children: &[NodeId],
    job: &Rc<MultiJob>,
    keys: Vec<u32>,
) -> KeyReplies {
    let mut futures: Vec<Option<BoxedKeyReplies>> = children
        .iter()
        .map(|&child| Some(run_multi(routing.clone(), child, job.clone(), keys.clone())))
        .collect();
    let mut last: Option<KeyReplies> = None;
    std::future::poll_fn(|context| {
        for slot in futures.iter_mut() {
            let Some(future) = slot else { continue };
            if let Poll::Ready(replies) = future.as_mut().poll(context) {
                *slot = None;
                if replies.all_answered() {
                    return Poll::Ready(Some(replies));
                }
                last = Some(replies);
            }
        }
        match futures.iter().all(Option::is_none) {
            true => Poll::Ready(None),
            false => Poll::Pending,
        }
    })
    .await
    .or(last)
    .unwrap_or_else(|| KeyReplies::failed(keys.len(), Err(connection_gone())))
}

/// Every key from cold; cold's misses from warm; warm's hits filled into cold (`add`,
/// asynchronously, on one task for the whole batch).
async fn warm_up_multi(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: &Rc<MultiJob>,
    keys: Vec<u32>,
) -> KeyReplies {
    let mut replies = run_multi_child(routing, cold, job, keys.clone())
        .await
        .into_keys(job, &keys);
    let missed: Vec<usize> = (0..replies.len())
        .filter(|&p| replies[p].class() == ReplyClass::Miss)
        .collect();
    if missed.is_empty() {
        return KeyReplies::Keys(replies);
    }
    let asked: Vec<u32> = missed.iter().map(|&p| keys[p]).collect();
    let from_warm = warm_misses(routing, node, cold, warm, ttl, job, asked).await;
    for (&position, reply) in missed.iter().zip(from_warm) {
        // Warm had nothing (or failed): cold's miss is the honest answer.
        if let KeyReply::Hit(_) = reply {
            replies[position] = reply;
        }
    }
    KeyReplies::Keys(replies)
}

/// Cold's misses `asked` (indexes into `job.keys`) asked of warm: per key, warm's hit
/// (filled into cold with an `add`, asynchronously, on one task for the whole batch) or a
/// miss (warm had nothing, or failed: cold's miss is the honest answer).
async fn warm_misses(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: &Rc<MultiJob>,
    asked: Vec<u32>,
) -> Vec<KeyReply> {
    let from_warm = run_multi_child(routing, warm, job, asked.clone())
        .await
        .into_keys(job, &asked);
    let mut fills: Vec<BoxedReply> = Vec::new();
    let replies = from_warm
        .into_iter()
        .map(|reply| match reply {
            KeyReply::Hit(block) => {
                if let Some(fill) = fill_job(&block, ttl, job.slot) {
                    fills.push(run(routing.clone(), cold, Rc::new(fill)));
                }
                KeyReply::Hit(block)
            }
            _ => KeyReply::Miss,
        })
        .collect();
    if !fills.is_empty() {
        routing
            .route_stats(node)
            .fills
            .fetch_add(fills.len() as u64, Relaxed);
        tokio::task::spawn_local(eager(async move {
            join_all(fills).await;
        }));
    }
    replies
}

/// Copies the keys of a multi-get in the shadow range to the shadow target, on a task of
/// its own (replies dropped). One copy (one `max_in_flight` slot) per batch of keys;
/// `sent`, `completed` and `errors` count keys, as they do for single-key copies.
fn shadow_copy_multi(
    routing: &Rc<RouteSnapshot>,
    shadow: NodeId,
    index: usize,
    max_in_flight: usize,
    job: &Rc<MultiJob>,
    keys: Vec<u32>,
) {
    let Some(state) = routing.shadows.get(index) else {
        return;
    };
    let count = keys.len() as u64;
    if state.in_flight.get() >= max_in_flight {
        state.stats.dropped.fetch_add(count, Relaxed);
        return;
    }
    state.in_flight.set(state.in_flight.get() + 1);
    state.stats.sent.fetch_add(count, Relaxed);
    let (routing, job) = (routing.clone(), job.clone());
    tokio::task::spawn_local(eager(async move {
        let replies = run_multi_child(&routing, shadow, &job, keys).await;
        if let Some(state) = routing.shadows.get(index) {
            let errors = match &replies {
                KeyReplies::Batches { .. } => 0,
                KeyReplies::Keys(replies) => replies
                    .iter()
                    .filter(|r| matches!(r, KeyReply::Failed(_)))
                    .count() as u64,
            };
            state.stats.errors.fetch_add(errors, Relaxed);
            state.stats.completed.fetch_add(count - errors, Relaxed);
            state.in_flight.set(state.in_flight.get().saturating_sub(1));
        }
    }));
}

/// Polls every future in place until all are done; their outputs in order.
async fn join_all<T>(mut futures: Vec<Pin<Box<dyn Future<Output = T>>>>) -> Vec<T> {
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut done = true;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => done = false,
                }
            }
        }
        match done {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_built_from_the_first_value_block() {
        let reply = Bytes::from_static(b"VALUE k 7 5 99\r\nhello\r\nEND\r\n");
        let job = fill_job(&reply, 3600, 0).expect("fill");
        assert_eq!(&job.parts.0[..], b"add k 7 3600 5\r\nhello\r\n");
        assert_eq!(&job.key[..], b"k");
        assert!(fill_job(&Bytes::from_static(b"END\r\n"), 0, 0).is_none());
        // A reply cut short is never filled.
        assert!(fill_job(&Bytes::from_static(b"VALUE k 0 10\r\nabc"), 0, 0).is_none());
    }
}
