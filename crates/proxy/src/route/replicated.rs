//! A replicated route: writes go to every child (the write policy decides when the client
//! is answered: `routing::write_decision`), reads to one child (`first`, `random`,
//! `failover` as a failover route reads, the `fastest`, or the `nearest`: `nearest.rs`).
//! Here:
//!
//! - single-key writes: `start_write` sends a write as one plain leg per replica when every
//!   child is a pool (`write_servers`); `ReplicatedWrite` (held by the session's pending
//!   entry) judges those legs in place with `write_decision` and answers as `run` would;
//!   `write_failed` is the reply both give when the policy fails;
//! - reads start as a failover route's (`failover::first_pool`; `nearest` from the child
//!   its read order puts first) or a random route's;
//! - `run` and `run_multi`: the whole walk when the children are not all pools.
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;

use bytes::Bytes;
use memroute_config::{FailoverOn, ReadPolicy, WritePolicy};
use memroute_routing::{write_decision, Node, NodeId, WriteDecision};
use smallvec::SmallVec;

use super::children::{RunChild, Walker};
use super::in_place::start_all;
use super::job::{answered, BoxedKeyReplies, Job, KeyReplies, MultiJob};
use super::leg::LegList;
use super::leg::{Leg, Legs};
use super::then::{Decided, ReplicatedWrite, Start, Then};
use super::vocabulary::Single;
use super::{failover, nearest, pool, random};
use crate::reply::{connection_gone, immediate_ack, Reply};
use crate::snapshot::RouteSnapshot;

/// A single-key request through replicated route `node`: a write to every child, a read
/// from the one its read policy picks.
pub(super) async fn run(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    writes: WritePolicy,
    reads: ReadPolicy,
    job: &Rc<Job>,
) -> Reply {
    match job.operation.is_write() {
        true => write(routing, node, children, writes, job).await,
        false => read(routing, node, children, reads, job).await,
    }
}

/// The keys of a multi-get (a read) through replicated route `node`: from the replica its
/// read policy picks.
pub(super) async fn run_multi(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    reads: ReadPolicy,
    job: &Rc<MultiJob>,
    keys: Vec<u32>,
) -> KeyReplies {
    match reads {
        ReadPolicy::First => Walker::run_multi_child(routing, children[0], job, keys).await,
        ReadPolicy::Random => {
            let child = random::pick(children);
            Walker::run_multi_child(routing, child, job, keys).await
        }
        ReadPolicy::Failover => {
            failover::run_multi(routing, node, children, FailoverOn::Error, job, keys).await
        }
        ReadPolicy::Fastest => fastest_multi(routing, children, job, keys).await,
        ReadPolicy::Nearest => {
            let order = nearest_order(routing, node);
            failover::run_multi(routing, node, &order, FailoverOn::Error, job, keys).await
        }
    }
}

async fn write(
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
pub(crate) fn write_servers(
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

/// A write through replicated route `node` whose children are all pools with a server for
/// the key (`write_servers`): sent to every replica as a plain pool's request is, the
/// replies judged in place (`ReplicatedWrite`). `None` for any other replicated route.
pub(super) fn start_write(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    single: &Single<'_>,
) -> Option<Start> {
    let (policy, servers) = write_servers(routing, node, single.key)?;
    let command = single.request.command;
    // all-async answers at once when the command has an answer to give without a server.
    let acks = match policy {
        WritePolicy::AllAsync => immediate_ack(command).map(|_| command),
        _ => None,
    };
    let started = single.started;
    let mut legs = Legs::many(LegList::new());
    // The legs go straight into their home (not moved there afterwards).
    if let Legs::Many(home) = &mut legs {
        if let Some(list) = home.get_mut() {
            for &(pool, server) in &servers {
                routing.sent_to(pool, single.key, server);
                let connection = routing.pools[pool].servers[server].pick(single.slot);
                let receiver = pool::send_copy(connection, &single.parts, single.kind);
                list.push(Leg::new(receiver, pool, server, started).on_route(node));
            }
        }
    }
    let then = Then::Replicated(ReplicatedWrite {
        node,
        policy,
        acks,
        decision: None,
    });
    Some(Start::Sent { legs, then })
}

/// Per replica of a replicated write, (pool, server).
pub(crate) type ReplicaServers = SmallVec<[(usize, usize); 3]>;

async fn read(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    policy: ReadPolicy,
    job: &Rc<Job>,
) -> Reply {
    match policy {
        ReadPolicy::First => Walker::run_child(routing, children[0], job).await,
        ReadPolicy::Random => Walker::run_child(routing, random::pick(children), job).await,
        ReadPolicy::Failover => {
            failover::run(routing, node, children, FailoverOn::Error, job).await
        }
        ReadPolicy::Nearest => {
            let order = nearest_order(routing, node);
            failover::run(routing, node, &order, FailoverOn::Error, job).await
        }
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

/// The children of nearest-reading route `node` in the order a read tries them, the
/// order recomputed first when due.
fn nearest_order(routing: &RouteSnapshot, node: NodeId) -> nearest::ChildOrder {
    match routing.nearest.of(node) {
        Some(order) => {
            order.refresh(routing.metrics.now());
            order.order()
        }
        None => nearest::ChildOrder::new(),
    }
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
        .map(|&child| {
            Some(Walker::run_multi(
                routing.clone(),
                child,
                job.clone(),
                keys.clone(),
            ))
        })
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

impl Decided {
    /// `None` for `Wait`. (A count past `u16::MAX` saturates: no route has that many
    /// replicas, and an answer from a child that does not exist is a failure.)
    fn of(decision: WriteDecision) -> Option<Decided> {
        let small = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
        match decision {
            WriteDecision::Wait => None,
            WriteDecision::Answer { child } => Some(Decided::Answer {
                child: small(child),
            }),
            WriteDecision::Fail { failed, total } => Some(Decided::Fail {
                failed: small(failed),
                total: small(total),
            }),
        }
    }
}

impl ReplicatedWrite {
    /// Takes in the replies of `legs` (one per replica, in child order) that `arrived`
    /// until the policy decides; true once it has (or nothing is awaited: all-async's ack).
    pub(crate) fn decide(
        &mut self,
        legs: &mut [Leg],
        mut arrived: impl FnMut(&mut Leg) -> bool,
    ) -> bool {
        if self.decision.is_some() || self.acks.is_some() {
            return true;
        }
        if self.policy == WritePolicy::AllSync {
            // all-sync decides only once every replica has answered (`write_decision`
            // waits until then), so the order the replies are taken in cannot change its
            // answer: wait for all (as a fan-out does), then judge once.
            if !legs
                .iter_mut()
                .all(|leg| leg.reply.is_some() || arrived(leg))
            {
                return false;
            }
            self.decision = Decided::of(write_decision(self.policy, &outcomes(legs)));
            return self.decision.is_some();
        }
        for at in 0..legs.len() {
            // A reply taken in on an earlier look was judged then.
            if legs[at].reply.is_some() || !arrived(&mut legs[at]) {
                continue;
            }
            self.decision = Decided::of(write_decision(self.policy, &outcomes(legs)));
            if self.decision.is_some() {
                return true;
            }
        }
        false
    }

    /// The client's reply; the other replicas' failures counted against their servers, and
    /// those still writing left to finish on a task (their replies dropped).
    pub(crate) fn finish(&mut self, routing: &Rc<RouteSnapshot>, legs: &mut [Leg]) -> Reply {
        let started = legs.first().map(|leg| leg.started);
        let started = started.unwrap_or_else(|| routing.metrics.now());
        routing.metrics.observe_since(self.node as usize, started);
        let (reply, answer) = match (self.acks.and_then(immediate_ack), self.decision) {
            (Some(ack), _) => (Ok(Bytes::from_static(ack)), None),
            (None, Some(Decided::Answer { child })) => match legs.get_mut(usize::from(child)) {
                Some(leg) => (leg.take(routing), Some(usize::from(child))),
                None => (Err(connection_gone()), None),
            },
            (None, Some(Decided::Fail { failed, total })) => {
                let (failed, total) = (usize::from(failed), usize::from(total));
                let failed = write_failed(routing, self.node, self.policy, failed, total);
                (Ok(failed), None)
            }
            // Not reached: finished only once decided.
            (None, None) => (Err(connection_gone()), None),
        };
        // In place, no move of the legs (the common case: every replica answered). A leg
        // whose reply is taken loses its receiver too: a leg that keeps one is still writing.
        let mut writing = false;
        for (at, leg) in legs.iter_mut().enumerate() {
            if Some(at) == answer {
                leg.receiver = None;
            } else if leg.reply.is_some() {
                drop(leg.take(routing));
                leg.receiver = None;
            } else {
                writing = true;
            }
        }
        if writing {
            let writing: SmallVec<[Leg; 3]> = legs
                .iter_mut()
                .filter(|leg| leg.receiver.is_some())
                .map(|leg| std::mem::replace(leg, Leg::writing(0, 0, started)))
                .collect();
            let routing = routing.clone();
            tokio::task::spawn_local(async move {
                for mut leg in writing {
                    leg.wait().await;
                    let _ = leg.take(&routing);
                }
            });
        }
        reply
    }
}

/// Per leg, whether its reply (if in) met the request.
fn outcomes(legs: &[Leg]) -> SmallVec<[Option<bool>; 3]> {
    let outcome = |leg: &Leg| leg.reply.as_ref().map(answered);
    legs.iter().map(outcome).collect()
}
