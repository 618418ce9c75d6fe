//! What a protocol's framing shares with the session loop, and the text (and meta)
//! protocol's framing itself.
//!
//! ```text
//!   session loop (session.rs, one for every protocol)
//!     input ──frame one request──> text: parse_request -> dispatch          (this module)
//!                                  binary: parse_binary -> translate -> dispatch (binary.rs)
//!     pending FIFO ──finish the head──> text: the reply as it is
//!                                       binary: the reply rendered as binary responses
//! ```
//!
//! A framing only turns bytes into dispatched requests and replies into bytes; reading,
//! writing, the pipelining cap, the reply budget and shutdown are the loop's, so every
//! protocol gets them alike.
use std::collections::VecDeque;
use std::rc::Rc;

use bytes::{Buf, Bytes, BytesMut};
use memroute_protocol::auth::{parse_login, Login, AUTHENTICATION_FAILURE, LOGGED_IN};
use memroute_protocol::{parse_request, Parse, Request, TooLarge};
use memroute_routing::operation_of;

use crate::client_auth::LoginGate;
use crate::client_log::{ClientEvent, Peer};
use crate::context::WorkerContext;
use crate::dispatch::{dispatch, Origin};
use crate::pending::{Flow, Pending};
use crate::snapshot::RouteSnapshot;

/// What framing one request needs besides the bytes.
pub(crate) struct Inbound<'a> {
    pub context: &'a WorkerContext,
    /// The batch's routing snapshot (its limits, and where the request goes).
    pub routing: &'a Rc<RouteSnapshot>,
    pub origin: Origin,
    /// The client as log lines name it; asked only when a line is written or counted.
    pub peer: &'a dyn Fn() -> Peer,
    /// Whether this client may send requests yet (its listener's login).
    pub login: &'a LoginGate<'a>,
}

/// What framing one request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framed {
    /// A request (or a refusal) joined the pending queue; frame the next.
    Next,
    /// The buffered bytes hold no whole request: read more first.
    Incomplete,
    /// The connection ends after what is queued: read nothing more.
    Close,
}

impl From<Flow> for Framed {
    fn from(flow: Flow) -> Framed {
        match flow {
            Flow::Continue => Framed::Next,
            Flow::Close => Framed::Close,
        }
    }
}

/// Dispatches a framed request (every protocol's). While someone watches requests live
/// (`request_watch`), a sampled request's pending entry carries its watch record; nobody
/// watching costs one relaxed load.
#[inline]
pub(crate) fn dispatch_framed(
    at: &Inbound<'_>,
    request: Request,
    pending: &mut VecDeque<Pending>,
) -> Flow {
    if !at.context.watch.open() {
        return dispatch(at.context, at.routing, at.origin, request, pending);
    }
    dispatch_watched(at, request, pending)
}

#[cold]
#[inline(never)]
fn dispatch_watched(at: &Inbound<'_>, request: Request, pending: &mut VecDeque<Pending>) -> Flow {
    let client = || (at.peer)().address;
    let sampled = crate::watch_tap::sample(
        &at.context.watch,
        at.routing,
        at.origin.listener,
        &client,
        &request,
    );
    let queued = pending.len();
    let flow = dispatch(at.context, at.routing, at.origin, request, pending);
    // One entry per request; a request that queued none (a noreply `verbosity`) or
    // several has no line.
    if let Some(sampled) = sampled {
        if pending.len() == queued + 1 {
            if let Some(entry) = pending.pop_back() {
                pending.push_back(Pending::Watched(Box::new((entry, sampled))));
            }
        }
    }
    flow
}

/// Frames and dispatches the next text or meta request in `input`. A request the parser
/// refuses is answered in its place (`swallow` set to the bytes of its data block still
/// to come), and closes the connection when the stream can no longer be framed.
pub(crate) fn text(
    at: &Inbound<'_>,
    input: &mut BytesMut,
    swallow: &mut usize,
    pending: &mut VecDeque<Pending>,
) -> Framed {
    if !at.login.open() {
        return login(at, input, pending);
    }
    match parse_request(input, &at.routing.limits) {
        Parse::Request(request) => dispatch_framed(at, request, pending).into(),
        Parse::Incomplete => Framed::Incomplete,
        Parse::Invalid {
            reply,
            swallow: rest,
            close,
        } => {
            crate::client_log::text_error(at.context, &(at.peer)(), &reply, close);
            pending.push_back(Pending::Ready(Bytes::from(reply.to_bytes())));
            *swallow = rest;
            if close {
                pending.push_back(Pending::Close);
                return Framed::Close;
            }
            Framed::Next
        }
        Parse::TooLarge(refused) => {
            let TooLarge {
                reply,
                swallow: rest,
                refused,
                unlink,
            } = *refused;
            let peer = (at.peer)();
            crate::client_log::count(at.context, &peer, ClientEvent::Error);
            crate::client_log::count(at.context, &peer, ClientEvent::OversizedValue);
            crate::client_log::protocol_error(&peer, "text", "value too large");
            let operation = operation_of(&refused);
            crate::dispatch::unlink(at.routing, at.origin, operation, unlink, pending);
            pending.push_back(Pending::Ready(Bytes::from(reply.to_bytes())));
            *swallow = rest;
            Framed::Next
        }
    }
}

/// Frames the next text request of a client that has not logged in: a login is checked,
/// anything else answered as memcached answers it before a login (see `client_auth`).
fn login(at: &Inbound<'_>, input: &mut BytesMut, pending: &mut VecDeque<Pending>) -> Framed {
    let (consumed, reply) = match parse_login(input) {
        Login::Incomplete => return Framed::Incomplete,
        Login::Close => {
            input.clear();
            pending.push_back(Pending::Close);
            return Framed::Close;
        }
        Login::Answer { consumed, reply } => (consumed, reply),
        Login::Attempt {
            consumed,
            user,
            password,
        } => match at.login.attempt(at.context, at.peer, user, password) {
            true => (consumed, LOGGED_IN),
            false => (consumed, AUTHENTICATION_FAILURE),
        },
    };
    input.advance(consumed);
    pending.push_back(Pending::Ready(Bytes::from_static(reply)));
    Framed::Next
}
