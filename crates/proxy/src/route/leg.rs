//! One backend sub-request of a session's pending entry and, once it arrived, its reply:
//! the plain leg every fast path starts with (a pool's request, a failover's first try, a
//! replica's write, a multi-get's batch); and the legs of one entry (`Legs`).
use std::future::Future;
use std::task::Context;
use std::time::Instant;

use memroute_backend::{ReplyReceiver, TryRecvError};
use memroute_protocol::retrieval_error;
use memroute_routing::{classify_reply, NodeId, ReplyClass};

use smallvec::SmallVec;

use crate::buffers::Homed;
use crate::reply::{connection_gone, Reply};
use crate::snapshot::RouteSnapshot;

/// The backend legs a session's pending entry awaits: none (the executor sends its own),
/// one inline (the common case: no allocation, no indirection), or several in a pooled
/// home (a replicated write's replicas, a multi-get's batches, a flush_all's servers).
#[derive(Debug)]
pub(crate) enum Legs {
    None,
    One(Leg),
    Many(Homed<LegList>),
}

/// Several legs of one entry, in their pooled home.
pub(crate) type LegList = SmallVec<[Leg; 4]>;

impl Legs {
    /// Several legs, moved into a pooled home.
    pub(crate) fn many(legs: LegList) -> Legs {
        Legs::Many(Homed::new(legs))
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [Leg] {
        match self {
            Legs::None => &mut [],
            Legs::One(leg) => std::slice::from_mut(leg),
            Legs::Many(home) => match home.get_mut() {
                Some(legs) => legs,
                None => &mut [],
            },
        }
    }

    /// Whether every leg's reply is in (`Leg::arrived`).
    #[inline]
    pub(crate) fn arrived(&mut self, mut context: Option<&mut Context<'_>>) -> bool {
        match self {
            Legs::One(leg) => leg.arrived(context),
            _ => self
                .as_mut_slice()
                .iter_mut()
                .all(|leg| leg.arrived(context.as_deref_mut())),
        }
    }

    /// Drops the legs, giving a pooled home back.
    pub(crate) fn release(self) {
        if let Legs::Many(home) = self {
            home.release();
        }
    }
}

/// One backend sub-request and, once it arrived, its reply.
#[derive(Debug)]
pub(crate) struct Leg {
    /// Where the reply comes; `None` only while a multi-get still writes this leg's batch
    /// (it is set before the request is dispatched).
    pub(super) receiver: Option<ReplyReceiver>,
    /// The reply once it arrived (a multi-get's follow-up may stand one in for a failed batch).
    pub(crate) reply: Option<Reply>,
    pool: u32,
    server: u32,
    /// The route node the request reached (a pool's node id is its pool id) and when it
    /// was read: its latency is recorded under that node's name.
    route: u32,
    pub(crate) started: Instant,
}

impl Leg {
    pub(crate) fn new(
        receiver: ReplyReceiver,
        pool: usize,
        server: usize,
        started: Instant,
    ) -> Leg {
        Leg {
            receiver: Some(receiver),
            reply: None,
            pool: pool as u32,
            server: server as u32,
            route: pool as u32,
            started,
        }
    }

    /// A leg to `server` of `pool` whose request is still being written; see `sent`.
    pub(crate) fn writing(pool: usize, server: usize, started: Instant) -> Leg {
        Leg {
            receiver: None,
            reply: None,
            pool: pool as u32,
            server: server as u32,
            route: pool as u32,
            started,
        }
    }

    /// The leg's request was queued; its reply comes on `receiver`.
    pub(crate) fn sent(&mut self, receiver: ReplyReceiver) {
        self.receiver = Some(receiver);
    }

    /// The pool the request went to (its node id is the same number).
    pub(crate) fn pool(&self) -> usize {
        self.pool as usize
    }

    /// The server of its pool the request went to.
    pub(crate) fn server(&self) -> usize {
        self.server as usize
    }

    /// Records the leg's latency under route node `route` (a policy route it went through)
    /// rather than under its pool.
    pub(crate) fn on_route(mut self, route: NodeId) -> Leg {
        self.route = route;
        self
    }

    /// Whether the reply is in: looked for now (`None`), or polled registering the
    /// session's waker.
    #[inline]
    pub(crate) fn arrived(&mut self, context: Option<&mut Context<'_>>) -> bool {
        match context {
            Some(context) => self.poll_complete(context),
            None => self.try_complete(),
        }
    }

    /// `try_complete`, registering the session's waker for the reply.
    pub(crate) fn poll_complete(&mut self, context: &mut std::task::Context<'_>) -> bool {
        if self.reply.is_some() {
            return true;
        }
        let Some(receiver) = &mut self.receiver else {
            self.reply = Some(Err(connection_gone()));
            return true;
        };
        match std::pin::Pin::new(receiver).poll(context) {
            std::task::Poll::Ready(reply) => {
                self.reply = Some(reply.unwrap_or_else(|_| Err(connection_gone())));
                true
            }
            std::task::Poll::Pending => false,
        }
    }

    /// For a retrieval reply from a connection: how many VALUE blocks it holds.
    pub(crate) fn value_blocks(&self) -> Option<u32> {
        self.receiver.as_ref().and_then(ReplyReceiver::value_blocks)
    }

    /// Whether the (complete) leg failed: no reply, or an error line for a retrieval.
    pub(crate) fn failed(&self) -> bool {
        match &self.reply {
            Some(Ok(bytes)) => retrieval_error(bytes).is_some(),
            _ => true,
        }
    }

    /// Records this leg's latency, as of the worker's clock.
    pub(crate) fn observe(&self, routing: &RouteSnapshot) {
        routing
            .metrics
            .observe_since(self.route as usize, self.started);
    }

    pub(crate) fn try_complete(&mut self) -> bool {
        if self.reply.is_some() {
            return true;
        }
        let Some(receiver) = &mut self.receiver else {
            self.reply = Some(Err(connection_gone()));
            return true;
        };
        match receiver.try_recv() {
            Ok(reply) => self.reply = Some(reply),
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Closed) => self.reply = Some(Err(connection_gone())),
        }
        true
    }

    pub(crate) async fn wait(&mut self) {
        if self.reply.is_none() {
            self.reply = Some(match &mut self.receiver {
                Some(receiver) => receiver.await.unwrap_or_else(|_| Err(connection_gone())),
                None => Err(connection_gone()),
            });
        }
    }

    /// The reply, counting a failure against its server (in the routing it was sent with).
    /// Legs run by the route executor count their own failures.
    pub(crate) fn take(&mut self, routing: &RouteSnapshot) -> Reply {
        let reply = self.reply.take().unwrap_or_else(|| Err(connection_gone()));
        if let Err(error) = &reply {
            if let Some(server) = routing
                .pools
                .get(self.pool as usize)
                .and_then(|p| p.servers.get(self.server as usize))
            {
                server.count_failure(error);
            }
        }
        reply
    }

    /// The (complete) leg's reply as the routes judge it: no reply is an error.
    pub(crate) fn class(&self) -> ReplyClass {
        match &self.reply {
            Some(Ok(bytes)) => classify_reply(bytes),
            _ => ReplyClass::Error,
        }
    }

    /// Whether the (complete) leg failed before its request reached the server, so that
    /// even a request that must not be repeated may go elsewhere.
    pub(crate) fn never_sent(&self) -> bool {
        matches!(&self.reply, Some(Err(error)) if error.never_sent())
    }
}
