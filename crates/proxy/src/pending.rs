//! A session's pending replies: one [`Pending`] entry per request, in the client's order.
//! A request a route started is its legs in flight (the backend requests whose replies
//! are awaited) plus its route's continuation (`route::Then`), holding the snapshot it was
//! routed with. This module only polls (`try_complete`, `wait`, and `wait_head` for the
//! entries behind the head) and writes the finished bytes (hit/miss counts, noreply);
//! what the legs' answers lead to is the route's.
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use memroute_protocol::{quiet_suppresses, Command};
use memroute_routing::{classify_reply, ReplyClass};

use crate::context::WorkerContext;
use crate::hot_cache::WriteMark;
use crate::reply::{first_line, server_error, Reply};
use crate::request_watch::Sampled;
use crate::route::{Finished, Legs, Start, Then};
use crate::snapshot::RouteSnapshot;
use crate::stats::{Metrics, WorkerMetrics};

/// Whether the session goes on after this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Close,
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
        metrics: Arc<Metrics>,
        ticket: u64,
        deadline: Instant,
    },
    /// A request its route started.
    Routed(InFlight),
    /// A request sampled for a live watch (`request_watch`): the entry, and its line.
    Watched(Box<(Pending, Box<Sampled>)>),
    /// A request routed by its key's routing prefix, the prefix cut from the key the
    /// server got: the prefix goes back into the keys its reply carries.
    Restored(Box<Restored>),
    /// A multi-get whose keys' routing prefixes name several routes: one part per route,
    /// merged in the client's key order.
    Split(Box<Split>),
}

/// A request whose reply gets its routing prefix back (`routing_prefix::restore_keys`).
#[derive(Debug)]
pub(crate) struct Restored {
    pub inner: Pending,
    pub command: Command,
    pub prefix: Bytes,
}

/// A multi-get over several routes (`Pending::Split`).
#[derive(Debug)]
pub(crate) struct Split {
    /// Per route: its keys' request, and the prefix its keys' replies get back (empty
    /// for keys sent as the client wrote them).
    pub parts: Vec<(Pending, Bytes)>,
    pub command: Command,
    /// The client's keys, in order.
    pub request: memroute_protocol::Request,
    /// For each client key, its part.
    pub key_part: crate::multiget::KeyLegs,
}

/// A routed request's legs in flight and what its route does once they answered. Holds
/// the routing it was sent with: its connections stay open until it is answered.
#[derive(Debug)]
pub(crate) struct InFlight {
    routing: Rc<RouteSnapshot>,
    legs: Legs,
    then: Then,
    command: Command,
    noreply: bool,
    /// A write's (or flush_all's) mark on the hot cache's epochs, dropped (bumping them
    /// again) once its reply was handled or its client left.
    written: Option<WriteMark>,
}

// An entry in flight (the routing, its legs, what its route does next) stays under 128
// bytes: every pipelined request of every client holds one.
const _: () = assert!(std::mem::size_of::<InFlight>() <= 128);

impl InFlight {
    fn advance(&mut self, context: Option<&mut Context<'_>>) -> bool {
        self.then.advance(&self.routing, &mut self.legs, context)
    }

    /// Waits until its legs answered and its route is done. A `poll_fn`, not an `async fn`:
    /// awaited without a state machine of its own around it.
    fn wait(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|context| match self.advance(Some(context)) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
    }
}

impl Pending {
    /// The entry for a request its route started (`route::start_single`,
    /// `route::start_multi_get`, `route::start_flush_all`), holding `routing` until it is
    /// answered.
    pub(crate) fn started(
        routing: &Rc<RouteSnapshot>,
        start: Start,
        command: Command,
        noreply: bool,
    ) -> Pending {
        match start {
            Start::Sent { legs, then } => Pending::Routed(InFlight {
                routing: routing.clone(),
                legs,
                then,
                command,
                noreply,
                written: None,
            }),
            Start::NoServers(pool) => no_servers_reply(routing, pool),
        }
    }

    /// This entry holds `written` until it is finished (`hot_cache::WriteMark`); an entry
    /// answered at once lets it go now.
    pub(crate) fn holding(mut self, written: Option<WriteMark>) -> Pending {
        if let Pending::Routed(entry) = &mut self {
            entry.written = written;
        }
        self
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
            Pending::Routed(entry) => entry.advance(None),
            Pending::Watched(watched) => watched.0.try_complete(),
            Pending::Restored(entry) => entry.inner.try_complete(),
            // Every part looked at (not only up to the first incomplete one).
            Pending::Split(split) => split
                .parts
                .iter_mut()
                .fold(true, |done, (part, _)| part.try_complete() && done),
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
            Pending::Routed(entry) => entry.wait().await,
            Pending::Watched(watched) => Box::pin(watched.0.wait()).await,
            // A routed entry inside (a single-key request's, always) is waited for without
            // the box a recursive wait needs: no allocation per prefixed request for it.
            Pending::Restored(entry) => match &mut entry.inner {
                Pending::Routed(inner) => inner.wait().await,
                inner => Box::pin(inner.wait()).await,
            },
            Pending::Split(split) => {
                for (part, _) in &mut split.parts {
                    Box::pin(part.wait()).await;
                }
            }
        }
    }

    /// Moves a policy-route request on that is not at the head of the queue (a failover's
    /// next child, a warm-up's ask of warm): it is polled by the session, not by a task.
    fn poll_progress(&mut self, context: &mut Context<'_>) {
        match self {
            Pending::Routed(entry) if entry.then.moves_on() => {
                entry.advance(Some(context));
            }
            Pending::Watched(watched) => watched.0.poll_progress(context),
            Pending::Restored(entry) => entry.inner.poll_progress(context),
            Pending::Split(split) => {
                for (part, _) in &mut split.parts {
                    part.poll_progress(context);
                }
            }
            _ => {}
        }
    }

    /// Lets a request go on without the client (mcrouter's routeToAll: the routes after
    /// the first): driven to its end on a task of its own, its reply dropped.
    pub(crate) fn run_in_background(mut self) {
        if !matches!(self, Pending::Routed(_)) {
            return;
        }
        tokio::task::spawn_local(async move {
            self.wait().await;
            if let Pending::Routed(InFlight {
                routing,
                mut legs,
                then,
                ..
            }) = self
            {
                let mut dropped = BytesMut::new();
                let _ = then.finish(&routing, &mut legs, &mut dropped);
                legs.release();
            }
        });
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
            Pending::Routed(InFlight {
                routing,
                mut legs,
                then,
                command,
                noreply,
                written,
            }) => {
                match then.finish(&routing, &mut legs, out) {
                    Finished::Reply(reply) => finish_single(context, reply, command, noreply, out),
                    Finished::Written(Some((hits, misses))) => {
                        WorkerMetrics::add(&context.stats().get_hits, hits);
                        WorkerMetrics::add(&context.stats().get_misses, misses);
                    }
                    Finished::Written(None) => {}
                }
                legs.release();
                // After the reply was handled: the write has landed (or failed).
                drop(written);
            }
            Pending::Watched(watched) => return finish_watched(*watched, context, out),
            Pending::Restored(entry) => {
                let Restored {
                    inner,
                    command,
                    prefix,
                } = *entry;
                let start = out.len();
                let flow = inner.finish(context, out);
                crate::routing_prefix::restore_keys(command, out, start, &prefix);
                return flow;
            }
            Pending::Split(split) => split.finish(context, out),
        }
        Flow::Continue
    }
}

/// Writes a watched entry's reply, then hands its line the reply, the keys it found and
/// missed, and the servers its legs went to.
fn finish_watched(
    (mut entry, sampled): (Pending, Box<Sampled>),
    context: &WorkerContext,
    out: &mut BytesMut,
) -> Flow {
    let mut servers = String::new();
    if let Pending::Routed(routed) = &mut entry {
        let routing = &routed.routing;
        for leg in routed.legs.as_mut_slice() {
            let address = routing
                .pools
                .get(leg.pool())
                .and_then(|pool| pool.servers.get(leg.server()));
            if let Some(address) = address.map(|server| server.health.address()) {
                if !servers.split(',').any(|known| known == &**address) {
                    if !servers.is_empty() {
                        servers.push(',');
                    }
                    servers.push_str(address);
                }
            }
        }
    }
    let counted = |stats: &WorkerMetrics| (stats.get_hits.get(), stats.get_misses.get());
    let (hits, misses) = counted(context.stats());
    let start = out.len();
    let flow = entry.finish(context, out);
    let (hits_now, misses_now) = counted(context.stats());
    let found = (hits_now.wrapping_sub(hits), misses_now.wrapping_sub(misses));
    sampled.finish(&out[start..], found, servers);
    flow
}

impl Split {
    /// Each part's reply with its keys' prefix back, merged in the client's key order; a
    /// part's error line is the whole reply (one failed key fails a multi-get). Each part
    /// counted its hits and misses when finished.
    fn finish(self, context: &WorkerContext, out: &mut BytesMut) {
        let Split {
            parts,
            command,
            request,
            key_part,
        } = self;
        let mut replies = Vec::with_capacity(parts.len());
        let mut scratch = BytesMut::new();
        for (part, prefix) in parts {
            part.finish(context, &mut scratch);
            crate::routing_prefix::restore_keys(command, &mut scratch, 0, &prefix);
            replies.push(scratch.split().freeze());
        }
        let _ = crate::multiget::merge(&replies, request.keys(), &key_part, out);
    }
}

/// A pool without servers yet (DNS discovery), answered as memcached answers a failure.
fn no_servers_reply(routing: &RouteSnapshot, pool: usize) -> Pending {
    Pending::Ready(Bytes::from(format!(
        "SERVER_ERROR {}\r\n",
        routing.no_servers(pool)
    )))
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
            if command.is_read() {
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
