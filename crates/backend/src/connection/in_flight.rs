//! What the writer and reader halves of one connection share: the requests written and
//! waiting for their replies, in order. Below both halves (link.rs) and the reader of
//! coalesced runs (run_reader.rs), which each take requests from it.
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use bytes::BytesMut;
use memroute_protocol::ReplyKind;
use tokio::time::Instant;

use crate::reply::ReplySender;

use super::notify::LocalNotify;
use super::outgoing::RunPart;

/// A request written to the server whose reply has not been read yet.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) kind: ReplyKind,
    pub(super) reply: ReplySender,
    pub(super) sent_at: Instant,
    pub(super) run: RunPart,
}

/// What the writer and reader halves of one connection share.
#[derive(Default)]
pub(super) struct Link {
    pub(super) in_flight: RefCell<VecDeque<InFlight>>,
    /// Wakes an idle reader when the writer sends the first request after a quiet spell,
    /// so an idle connection needs no timer at all.
    pub(super) wake_reader: LocalNotify,
    /// At least one reply was read on this connection.
    pub(super) answered: Cell<bool>,
    /// The keys of the runs in flight (`Shared::run_keys`, moved here as they are sent).
    pub(super) run_keys: RefCell<BytesMut>,
}
