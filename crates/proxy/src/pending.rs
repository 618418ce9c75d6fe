//! A session's pending replies: one [`Pending`] entry per request, in the client's order,
//! each holding the snapshot its request was routed with and the backend legs its reply
//! comes from. `try_complete`/`wait` collect the legs' replies; `finish` turns a completed
//! entry into the client's bytes (hit/miss counts, a multi-get merged in client order by
//! `multiget`, flush_all's replies merged by `reply::FlushAllMerge`). What a leg's answer
//! leads to is its route kind's (`route::FirstTry::go_on`, `route::ReplicatedWrite::decide`,
//! `route::MultiGet::fail_over`); this module only polls and writes.
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use memroute_protocol::{quiet_suppresses, retrieval_error, Command};
use memroute_routing::{classify_reply, ReplyClass};
use smallvec::SmallVec;

use crate::buffers::Homed;
use crate::context::WorkerContext;
use crate::multiget;
use crate::reply::{first_line, server_error, FlushAllMerge, Reply};
use crate::route::{FirstTry, MultiReply, ReplicatedWrite, Routed, RoutedKeys, Start};
pub(crate) use crate::route::{Leg, MultiGet};
use crate::snapshot::RouteSnapshot;
use crate::stats::{SharedStats, WorkerMetrics};

/// Whether the session goes on after this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Close,
}

/// The same request sent to every server of a pool (flush_all).
#[derive(Debug)]
pub(crate) struct Fanout {
    pub routing: Rc<RouteSnapshot>,
    pub legs: Vec<Leg>,
    pub noreply: bool,
}

/// One entry of a session's reply FIFO.
#[derive(Debug)]
pub(crate) enum Pending {
    /// Answered by memroute itself (or an error reply).
    Ready(Bytes),
    /// Close the connection once everything before it is written (quit, unframeable input).
    Close,
    /// `stats`: rendered when its turn comes, so it counts every request before it, and
    /// once every worker flushed its counts (or `deadline` passed).
    Stats {
        metrics: Arc<SharedStats>,
        ticket: u64,
        deadline: Instant,
    },
    /// Holds the routing it was sent with: its connections stay open until it is answered.
    Single {
        routing: Rc<RouteSnapshot>,
        leg: Leg,
        command: Command,
        noreply: bool,
    },
    /// A request through a policy route (or a flush_all through a route): the route
    /// executor's future, polled in place.
    Routed {
        routing: Rc<RouteSnapshot>,
        routed: Routed,
        command: Command,
        noreply: bool,
    },
    /// A read through a failover route (or a write through one), its first try sent as a
    /// plain request. In a pooled home: no allocation per request.
    FirstTry(Homed<FirstTry>),
    /// A single-key write through a replicated route over pools, one leg per replica.
    Replicated(Homed<ReplicatedWrite>),
    /// In a pooled home: most entries are smaller, and a multi-get allocates no box.
    MultiGet(Homed<MultiGet>),
    Fanout(Box<Fanout>),
}

impl Pending {
    /// The entry for a request its route started (`route::start_single`,
    /// `route::start_flush_all`), holding `routing` until it is answered.
    pub(crate) fn started(
        routing: &Rc<RouteSnapshot>,
        start: Start,
        command: Command,
        noreply: bool,
    ) -> Pending {
        match start {
            Start::Leg(leg) => Pending::Single {
                routing: routing.clone(),
                leg,
                command,
                noreply,
            },
            Start::FirstTry(first) => Pending::FirstTry(first),
            Start::Replicated(write) => Pending::Replicated(write),
            Start::Routed(routed) => Pending::Routed {
                routing: routing.clone(),
                routed,
                command,
                noreply,
            },
            Start::Legs(legs) => Pending::Fanout(Box::new(Fanout {
                routing: routing.clone(),
                legs,
                noreply,
            })),
            Start::NoServers(pool) => no_servers_reply(routing, pool),
        }
    }

    /// Collects whatever replies have arrived, without waiting. True when complete.
    pub(crate) fn try_complete(&mut self) -> bool {
        match self {
            Pending::Ready(_) | Pending::Close => true,
            Pending::Stats {
                metrics,
                ticket,
                deadline,
            } => metrics.flush.reached(*ticket) || Instant::now() >= *deadline,
            Pending::Single { leg, .. } => leg.try_complete(),
            Pending::Routed { routed, .. } => routed.try_complete(),
            Pending::FirstTry(first) => {
                let Some(first) = first.get_mut() else {
                    return true;
                };
                if !first.leg.try_complete() {
                    return false;
                }
                match go_on(first) {
                    Some(next) => {
                        self.replace(next);
                        self.try_complete()
                    }
                    None => true,
                }
            }
            Pending::MultiGet(multi) => match multi.get_mut() {
                Some(multi) => {
                    multi.legs.iter_mut().all(Leg::try_complete) && {
                        multi.fail_over();
                        multi.routed.iter_mut().all(RoutedKeys::try_complete)
                    }
                }
                None => true,
            },
            Pending::Fanout(fanout) => fanout.legs.iter_mut().all(Leg::try_complete),
            Pending::Replicated(write) => match write.get_mut() {
                Some(write) => write.decide(Leg::try_complete),
                None => true,
            },
        }
    }

    /// Waits until complete.
    pub(crate) async fn wait(&mut self) {
        match self {
            Pending::Ready(_) | Pending::Close => {}
            Pending::Stats {
                metrics,
                ticket,
                deadline,
            } => metrics.flush.wait(*ticket, *deadline).await,
            Pending::Single { leg, .. } => leg.wait().await,
            Pending::Routed { routed, .. } => routed.wait().await,
            Pending::FirstTry(first) => {
                let Some(first) = first.get_mut() else {
                    return;
                };
                first.leg.wait().await;
                if let Some(next) = go_on(first) {
                    self.replace(next);
                    if let Pending::Routed { routed, .. } = self {
                        routed.wait().await;
                    }
                }
            }
            Pending::MultiGet(multi) => {
                let Some(multi) = multi.get_mut() else {
                    return;
                };
                loop {
                    wait_legs_and_groups(multi).await;
                    // A failed batch of a failover's first pool: its keys go on, waited for too.
                    if !multi.fail_over() {
                        break;
                    }
                }
            }
            Pending::Fanout(fanout) => {
                for leg in &mut fanout.legs {
                    leg.wait().await;
                }
            }
            Pending::Replicated(write) => {
                let Some(write) = write.get_mut() else {
                    return;
                };
                std::future::poll_fn(|context| {
                    match write.decide(|leg| leg.poll_complete(context)) {
                        true => std::task::Poll::Ready(()),
                        false => std::task::Poll::Pending,
                    }
                })
                .await
            }
        }
    }

    /// Replaces this entry with `next` (a first try gone on to the executor), giving a
    /// pooled home back.
    fn replace(&mut self, next: Pending) {
        match std::mem::replace(self, next) {
            Pending::FirstTry(home) => home.release(),
            Pending::Replicated(home) => home.release(),
            _ => {}
        }
    }

    /// Moves a policy-route request on that is not at the head of the queue (a failover's
    /// next child, a warm-up's ask of warm): it is polled by the session, not by a task.
    fn poll_progress(&mut self, context: &mut std::task::Context<'_>) {
        match self {
            Pending::Routed { routed, .. } => {
                let _ = routed.poll(context);
            }
            Pending::FirstTry(first) => {
                let Some(first) = first.get_mut() else {
                    return;
                };
                // Only an entry with a later child to ask has anything to move on.
                let answered = first.may_go_on() && first.leg.poll_complete(context);
                if let Some(next) = answered.then(|| go_on(first)).flatten() {
                    self.replace(next);
                    if let Pending::Routed { routed, .. } = self {
                        let _ = routed.poll(context);
                    }
                }
            }
            Pending::MultiGet(multi) => {
                let Some(multi) = multi.get_mut() else {
                    return;
                };
                if multi.follow_up.is_some()
                    && multi.legs.iter_mut().all(|leg| leg.poll_complete(context))
                {
                    multi.fail_over();
                }
                for routed in &mut multi.routed {
                    let _ = routed.poll(context);
                }
            }
            _ => {}
        }
    }

    /// Writes the client's reply for a completed entry.
    pub(crate) fn finish(self, context: &WorkerContext, out: &mut BytesMut) -> Flow {
        match self {
            Pending::Ready(bytes) => out.extend_from_slice(&bytes),
            Pending::Close => return Flow::Close,
            Pending::Stats { metrics, .. } => {
                context.metrics.flush();
                let families = metrics.registry.gather();
                out.extend_from_slice(metrics.render_stats(&families).as_bytes());
            }
            Pending::Single {
                routing,
                mut leg,
                command,
                noreply,
            } => {
                leg.observe(&routing);
                finish_single(context, leg.take(&routing), command, noreply, out)
            }
            Pending::Routed {
                routing,
                mut routed,
                command,
                noreply,
            } => {
                routing
                    .metrics
                    .observe_since(routed.route as usize, routed.started);
                finish_single(context, routed.take(), command, noreply, out)
            }
            Pending::FirstTry(mut home) => {
                // Finished where it lives (no move out of its home).
                if let Some(first) = home.get_mut() {
                    let routing = &first.routing;
                    first.leg.observe(routing);
                    let reply = first.leg.take(routing);
                    finish_single(context, reply, first.command, first.noreply, out);
                }
                home.release();
            }
            Pending::MultiGet(mut multi) => {
                // Finished where it lives (it is ~620 bytes: no moves out of its home).
                if let Some(multi) = multi.get_mut() {
                    finish_multi_get(context, multi, out);
                }
                multi.release();
            }
            Pending::Fanout(fanout) => finish_fanout(*fanout, out),
            Pending::Replicated(mut write) => {
                if let Some(write) = write.get_mut() {
                    let reply = write.finish();
                    finish_single(context, reply, write.command, write.noreply, out);
                }
                write.release();
            }
        }
        Flow::Continue
    }
}

/// A first try whose answer goes on (`FirstTry::go_on`): the entry that replaces it.
fn go_on(first: &mut FirstTry) -> Option<Pending> {
    let routed = first.go_on()?;
    Some(Pending::Routed {
        routing: first.routing.clone(),
        routed,
        command: first.command,
        noreply: first.noreply,
    })
}

/// A pool without servers yet (DNS discovery), answered as memcached answers a failure.
pub(crate) fn no_servers_reply(routing: &RouteSnapshot, pool: usize) -> Pending {
    Pending::Ready(Bytes::from(format!(
        "SERVER_ERROR {}\r\n",
        routing.no_servers(pool)
    )))
}

/// Waits until every leg of a multi-get has answered and every group is complete.
async fn wait_legs_and_groups(multi: &mut MultiGet) {
    let MultiGet { legs, routed, .. } = multi;
    let mut legs = std::pin::pin!(async {
        for leg in legs.iter_mut() {
            leg.wait().await;
        }
    });
    // The routed groups are polled alongside the legs, not after them: a failover's next
    // child must not wait for the plain pools' batches.
    let mut legs_done = false;
    std::future::poll_fn(|context| {
        let mut done = true;
        for routed in routed.iter_mut() {
            done &= routed.poll(context).is_ready();
        }
        if !legs_done {
            legs_done = legs.as_mut().poll(context).is_ready();
        }
        match done && legs_done {
            true => std::task::Poll::Ready(()),
            false => std::task::Poll::Pending,
        }
    })
    .await
}

fn finish_single(
    context: &WorkerContext,
    reply: Reply,
    command: Command,
    noreply: bool,
    out: &mut BytesMut,
) {
    let is_meta = command.is_keyed_meta();
    match reply {
        Ok(bytes) => {
            if matches!(
                command,
                Command::Get | Command::Gets | Command::Gat | Command::Gats | Command::MetaGet
            ) {
                // Judged as the routes judge it; an error line counts as a miss.
                let hit = classify_reply(&bytes) == ReplyClass::Hit;
                let counter = if hit {
                    &context.stats().get_hits
                } else {
                    &context.stats().get_misses
                };
                WorkerMetrics::add(counter, 1);
            }
            if noreply && quiet_suppresses(command, first_line(&bytes)) {
                return;
            }
            out.extend_from_slice(&bytes);
        }
        // A text-protocol noreply client reads no replies at all: an error line would
        // be taken as the reply to its next request. Meta quiet mode does show errors.
        Err(_) if noreply && !is_meta => {}
        Err(error) => server_error(out, &error),
    }
}

fn finish_multi_get(context: &WorkerContext, multi: &mut MultiGet, out: &mut BytesMut) {
    // One latency sample per request, under the route of its first leg.
    if let Some(first) = multi.legs.first() {
        first.observe(&multi.routing);
    } else if let Some(first) = multi.routed.first() {
        multi
            .routing
            .metrics
            .observe_since(first.route as usize, first.started);
    }
    if let ([], [group]) = (&multi.legs[..], &mut multi.routed[..]) {
        // Every key went through one policy route, in the client's order: a pool's batches
        // are merged straight into the client's reply, a reply built per key is the client's.
        let (reply, hits) = match group.take() {
            MultiReply::Batches { replies, key_leg } => {
                let keys = multi.request.keys();
                if let Some((hits, misses)) = multiget::merge(&replies, keys, &key_leg, out) {
                    WorkerMetrics::add(&context.stats().get_hits, hits);
                    WorkerMetrics::add(&context.stats().get_misses, misses);
                }
                return;
            }
            MultiReply::Built(reply, hits) => (reply, u64::from(hits)),
        };
        match reply {
            Ok(bytes) => {
                out.extend_from_slice(&bytes);
                if retrieval_error(&bytes).is_none() {
                    let misses = (multi.request.keys.len() as u64).saturating_sub(hits);
                    WorkerMetrics::add(&context.stats().get_hits, hits);
                    WorkerMetrics::add(&context.stats().get_misses, misses);
                }
            }
            Err(error) => server_error(out, &error),
        }
        return;
    }
    let mut replies: SmallVec<[Bytes; 4]> = SmallVec::with_capacity(multi.legs.len());
    for leg in &mut multi.legs {
        match leg.take(&multi.routing) {
            Ok(bytes) => replies.push(bytes),
            // One failed server fails the whole reply: a partial answer would look like misses.
            Err(error) => return server_error(out, &error),
        }
    }
    let batches = multi.legs.len() as u32;
    for (group, routed) in multi.routed.iter_mut().enumerate() {
        // The group's keys: the client's keys its leg carries, in order.
        let leg = batches + group as u32;
        let keys = multi.request.keys().zip(&multi.key_leg);
        let keys = keys
            .filter(|(_, &key_leg)| key_leg == leg)
            .map(|(key, _)| key);
        match routed.take().into_reply(keys).0 {
            Ok(bytes) => replies.push(bytes),
            Err(error) => return server_error(out, &error),
        }
    }
    let Some((hits, misses)) = multiget::merge(&replies, multi.request.keys(), &multi.key_leg, out)
    else {
        return;
    };
    WorkerMetrics::add(&context.stats().get_hits, hits);
    WorkerMetrics::add(&context.stats().get_misses, misses);
}

fn finish_fanout(mut fanout: Fanout, out: &mut BytesMut) {
    if let Some(first) = fanout.legs.first() {
        first.observe(&fanout.routing);
    }
    let mut merge = FlushAllMerge::default();
    for leg in &mut fanout.legs {
        merge.add(leg.take(&fanout.routing));
    }
    if fanout.noreply {
        return;
    }
    match merge.finish() {
        Ok(bytes) => out.extend_from_slice(&bytes),
        Err(error) => server_error(out, &error),
    }
}

/// Waits until the head of a session's queue (`entry` finds the `Pending` in a queue item)
/// is complete, moving on the policy-route requests behind it meanwhile: they are polled
/// by the session, so a failover's second try or a warm-up's ask of warm must not wait
/// for the head. Only the first `PROGRESS_WINDOW` entries are looked at (a deep pipeline
/// of plain requests costs nothing per wake-up beyond that).
pub(crate) async fn wait_head<T>(queue: &mut VecDeque<T>, entry: fn(&mut T) -> &mut Pending) {
    let (front, back) = queue.as_mut_slices();
    let Some((head, rest)) = front.split_first_mut() else {
        return;
    };
    let mut head = std::pin::pin!(entry(head).wait());
    std::future::poll_fn(|context| {
        // The head first, then the rest in the client's order: when several first tries
        // failed in one wake-up, their retries must leave in the order the client sent
        // them (pipelined writes of one key through a failover: the last one must win on
        // the next pool too). A head that is done returns at once; the entries behind it
        // move on when the session waits for the next head.
        let head = head.as_mut().poll(context);
        if head.is_pending() {
            for item in rest.iter_mut().chain(back.iter_mut()).take(PROGRESS_WINDOW) {
                entry(item).poll_progress(context);
            }
        }
        head
    })
    .await
}

/// How many entries behind the head `wait_head` moves on.
const PROGRESS_WINDOW: usize = 64;
