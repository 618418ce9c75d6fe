//! The per-worker state every session of a worker reads: which snapshot new requests use,
//! the connection slot the next session gets, and the worker's counters. Built by the
//! worker (`worker`) and swapped to a new snapshot on each reload.
use std::cell::{Cell, RefCell};
use std::rc::Rc;
#[cfg(any(test, feature = "fuzzing"))]
use std::sync::Arc;

#[cfg(any(test, feature = "fuzzing"))]
use crate::generation::Generation;
use crate::session_wakers::SessionWakers;
use crate::snapshot::RouteSnapshot;
#[cfg(any(test, feature = "fuzzing"))]
use crate::stats::SharedStats;
use crate::stats::WorkerMetrics;

/// Per-worker state every session of the worker reads.
#[derive(Debug)]
pub(crate) struct WorkerContext {
    pub index: usize,
    /// The routing new requests use; replaced (never mutated) on reload.
    routing: RefCell<Rc<RouteSnapshot>>,
    /// The slot the next client session gets (which of `connections` it uses).
    next_slot: Cell<usize>,
    pub metrics: Rc<WorkerMetrics>,
    /// The worker's client sessions, for shutdown to reach the idle ones.
    pub sessions: SessionWakers,
}

impl WorkerContext {
    /// A context serving `generation` from the start, outside a `Worker` (the session
    /// fuzzing harness builds one per case).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn for_generation(
        index: usize,
        generation: &Generation,
        shared: Arc<SharedStats>,
    ) -> WorkerContext {
        let metrics = Rc::new(WorkerMetrics::new(index, shared));
        WorkerContext {
            index,
            routing: RefCell::new(Rc::new(RouteSnapshot::build(generation, None, &metrics))),
            next_slot: Cell::new(0),
            metrics,
            sessions: SessionWakers::default(),
        }
    }

    /// A context whose sessions start on `snapshot`.
    pub(crate) fn new(
        index: usize,
        snapshot: RouteSnapshot,
        metrics: Rc<WorkerMetrics>,
    ) -> WorkerContext {
        WorkerContext {
            index,
            routing: RefCell::new(Rc::new(snapshot)),
            next_slot: Cell::new(0),
            metrics,
            sessions: SessionWakers::default(),
        }
    }

    /// Serves new requests with `snapshot`; the old one lives on in the requests in flight.
    pub(crate) fn replace_routing(&self, snapshot: Rc<RouteSnapshot>) {
        *self.routing.borrow_mut() = snapshot;
    }

    pub(crate) fn stats(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// A connection slot for a new client session: sessions take turns.
    pub(crate) fn session_slot(&self) -> usize {
        let slot = self.next_slot.get();
        self.next_slot.set(slot.wrapping_add(1));
        slot
    }

    /// A snapshot of the current routing. Do not hold it across an idle wait: a snapshot
    /// keeps the connections of servers a reload removed open.
    pub(crate) fn routing(&self) -> Rc<RouteSnapshot> {
        self.routing.borrow().clone()
    }
}
