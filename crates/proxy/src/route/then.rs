//! What a route does once the legs of a request's pending entry have answered: the
//! continuation the session's entry holds beside its legs (`Legs`). Each kind's own lives
//! in its module (`failover::AfterFirst`, `warm_up::AfterCold`, `replicated::ReplicatedWrite`,
//! `multi_get::MultiGet`, `pool::merge_flush_all`); this enum only hands the legs to it.
//! The session polls an entry with `advance` until it says the reply is decided, then takes
//! the reply with `finish`.
use std::rc::Rc;
use std::task::Context;

use bytes::BytesMut;

use super::failover::AfterFirst;
use super::in_place::Routed;
use super::leg::{Leg, Legs};
use super::multi_get::MultiGet;
use super::pool;
use super::replicated::ReplicatedWrite;
use super::warm_up::AfterCold;
use crate::buffers::Homed;
use crate::reply::{connection_gone, Reply};
use crate::snapshot::RouteSnapshot;

/// A route's continuation: what its entry's legs' answers lead to. Every one larger than
/// a few bytes lives in a pooled home, so that an entry stays small enough to move without
/// a call to memcpy (it is moved into the session's queue and out of it once per request).
#[derive(Debug)]
pub(crate) enum Then {
    /// The one leg's reply is the client's (a pool; shadow and random routes down to one).
    Reply,
    /// A failover's first try: a failure goes on to the later children.
    Failover(Homed<AfterFirst>),
    /// A warm-up's read of cold: a miss goes on to warm.
    WarmUp(Homed<AfterCold>),
    /// A replicated write, one leg per replica, judged as the replies arrive.
    Replicated(ReplicatedWrite),
    /// A multi-get's batches (and policy routes' groups), merged in the client's order.
    MultiGet(Homed<MultiGet>),
    /// A flush_all to every server of a pool, the replies merged into one.
    FlushAll,
    /// The general walk's future, polled in place; it sends its own requests (no legs).
    Executor(Homed<Routed>),
}

// What a route does next is at most two words, so an entry (`pending::InFlight`: the
// routing, its legs, this) stays small; pending.rs holds the entry itself to its bound.
const _: () = assert!(std::mem::size_of::<Then>() <= 16);

/// A finished entry's answer for the session to write.
pub(crate) enum Finished {
    /// One reply (the session counts a retrieval's hit or miss and honours noreply).
    Reply(Reply),
    /// Already written (a multi-get's merge); its (hits, misses) when it was no failure.
    Written(Option<(u64, u64)>),
}

impl Then {
    /// Whether an entry behind the head of the session's queue has anything to move on
    /// (a next try, a follow-up, an executor's next step); plain legs just wait.
    pub(crate) fn moves_on(&self) -> bool {
        match self {
            Then::Reply | Then::FlushAll | Then::Replicated(_) => false,
            Then::Failover(_) | Then::WarmUp(_) | Then::Executor(_) => true,
            Then::MultiGet(multi) => multi.get().is_some_and(MultiGet::moves_on),
        }
    }

    /// Takes in what arrived on `legs` (looked for now with `None`, or polled with the
    /// session's waker) and moves the route on; true once the client's reply is decided.
    #[inline]
    pub(crate) fn advance(
        &mut self,
        routing: &Rc<RouteSnapshot>,
        legs: &mut Legs,
        context: Option<&mut Context<'_>>,
    ) -> bool {
        match self {
            // The common case, inline: one plain leg.
            Then::Reply => legs.arrived(context),
            _ => self.advance_route(routing, legs, context),
        }
    }

    /// `advance` for every continuation but the plain reply's.
    #[inline(never)]
    fn advance_route(
        &mut self,
        routing: &Rc<RouteSnapshot>,
        legs: &mut Legs,
        mut context: Option<&mut Context<'_>>,
    ) -> bool {
        match self {
            Then::Reply | Then::FlushAll => legs.arrived(context),
            Then::Executor(routed) => match routed.get_mut() {
                Some(routed) => routed.advance(context),
                None => true,
            },
            Then::Replicated(write) => write.decide(legs.as_mut_slice(), |leg| {
                leg.arrived(context.as_deref_mut())
            }),
            Then::MultiGet(multi) => match multi.get_mut() {
                Some(multi) => multi.advance(routing, legs.as_mut_slice(), context),
                None => true,
            },
            Then::Failover(_) | Then::WarmUp(_) => {
                if !legs.arrived(context.as_deref_mut()) {
                    return false;
                }
                let Legs::One(first) = legs else {
                    return true;
                };
                let onwards = match self {
                    Then::Failover(after) => after.get_mut().and_then(|a| a.go_on(routing, first)),
                    Then::WarmUp(after) => after.get_mut().and_then(|a| a.go_on(routing, first)),
                    _ => None,
                };
                // Judged once: the entry becomes what the answer led to.
                let judged = match onwards {
                    Some(routed) => {
                        *legs = Legs::None;
                        std::mem::replace(self, Then::Executor(Homed::new(routed)))
                    }
                    None => std::mem::replace(self, Then::Reply),
                };
                judged.release();
                self.advance(routing, legs, context)
            }
        }
    }

    /// The client's answer once `advance` said it is decided, giving pooled homes back
    /// (the legs' own is the caller's). One latency sample per request.
    pub(crate) fn finish(
        self,
        routing: &Rc<RouteSnapshot>,
        legs: &mut Legs,
        out: &mut BytesMut,
    ) -> Finished {
        match self {
            Then::Reply => Finished::Reply(one_leg(routing, legs)),
            Then::Executor(mut home) => {
                let reply = match home.get_mut() {
                    Some(routed) => {
                        routing
                            .metrics
                            .observe_since(routed.route as usize, routed.started);
                        routed.take()
                    }
                    None => Err(connection_gone()),
                };
                home.release();
                Finished::Reply(reply)
            }
            Then::Replicated(mut write) => {
                Finished::Reply(write.finish(routing, legs.as_mut_slice()))
            }
            Then::MultiGet(mut home) => {
                let counts = home
                    .get_mut()
                    .and_then(|multi| multi.finish(routing, legs.as_mut_slice(), out));
                home.release();
                Finished::Written(counts)
            }
            Then::FlushAll => Finished::Reply(pool::merge_flush_all(routing, legs.as_mut_slice())),
            // A first try is judged before it is finished; its leg is the answer.
            then @ (Then::Failover(_) | Then::WarmUp(_)) => {
                then.release();
                Finished::Reply(one_leg(routing, legs))
            }
        }
    }

    /// Drops the continuation, giving a pooled home back.
    fn release(self) {
        match self {
            Then::Failover(home) => home.release(),
            Then::WarmUp(home) => home.release(),
            Then::MultiGet(home) => home.release(),
            Then::Executor(home) => home.release(),
            Then::Reply | Then::FlushAll | Then::Replicated(_) => {}
        }
    }
}

/// The reply of an entry's one leg, its latency recorded.
fn one_leg(routing: &RouteSnapshot, legs: &mut Legs) -> Reply {
    match legs.as_mut_slice().first_mut() {
        Some(leg) => {
            leg.observe(routing);
            leg.take(routing)
        }
        None => Err(connection_gone()),
    }
}

/// How a request starts: its legs in flight and its route's continuation, or a pool
/// without servers yet (DNS discovery).
pub(crate) enum Start {
    Sent { legs: Legs, then: Then },
    NoServers(usize),
}

impl Start {
    /// A plain leg whose reply is the client's.
    pub(crate) fn leg(leg: Leg) -> Start {
        Start::Sent {
            legs: Legs::One(leg),
            then: Then::Reply,
        }
    }

    /// The general walk, polled in place.
    pub(crate) fn executor(routed: Routed) -> Start {
        Start::Sent {
            legs: Legs::None,
            then: Then::Executor(Homed::new(routed)),
        }
    }
}
