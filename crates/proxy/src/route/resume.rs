//! Resuming a route's continuation (`Then`) once its entry's legs have answered: each
//! variant handed to its kind's own step (`AfterFirst::go_on`, `ReplicatedWrite::decide`,
//! `MultiGet::advance`, `pool::merge_flush_all`, ...). Above the kinds, as the walk is:
//! the data it matches on is then.rs's, below them. The session polls an entry with
//! `advance` until it says the reply is decided, then takes the reply with `finish`.
use std::rc::Rc;
use std::task::Context;

use bytes::BytesMut;

use super::leg::Legs;
use super::pool;
use super::then::{Finished, MultiGet, Then};
use crate::buffers::Homed;
use crate::reply::{connection_gone, Reply};
use crate::snapshot::RouteSnapshot;

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
