//! The per-worker state every session of a worker reads: which snapshot new requests use,
//! the connection slot the next session gets, and the worker's counters. Built by the
//! worker (`worker`) and swapped to a new snapshot on each reload.
//!
//! A new generation is picked up when a batch of requests starts (`routing`) as well as by
//! the worker's reload task, so a request read after the publisher sent a generation is
//! routed by it. The publisher tells the stats what a generation changes (a DNS
//! pool's server count) only after sending it: an operator or a test that reads the new
//! count and then sends a request sees that request routed by the set the count describes.
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::watch;

use crate::generation::Generation;
use crate::request_watch::WatchHub;
use crate::session_wakers::SessionWakers;
use crate::snapshot::RouteSnapshot;
#[cfg(any(test, feature = "fuzzing"))]
use crate::stats::Metrics;
use crate::stats::WorkerMetrics;

/// Per-worker state every session of the worker reads.
#[derive(Debug)]
pub(crate) struct WorkerContext {
    pub index: usize,
    /// The routing new requests use; replaced (never mutated) on reload.
    routing: RefCell<Rc<RouteSnapshot>>,
    /// The publisher's generations, marked seen up to the one `routing` was built from;
    /// `None` for a context that serves one generation only (the fuzzing harness).
    generations: RefCell<Option<watch::Receiver<Arc<Generation>>>>,
    /// The slot the next client session gets (which of `connections` it uses).
    next_slot: Cell<usize>,
    pub metrics: Rc<WorkerMetrics>,
    /// The live watches of requests: every request asks `watch.open()` (one relaxed load).
    pub watch: Arc<WatchHub>,
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
        shared: Arc<Metrics>,
    ) -> WorkerContext {
        let metrics = Rc::new(WorkerMetrics::new(index, shared));
        WorkerContext {
            index,
            routing: RefCell::new(Rc::new(RouteSnapshot::build(generation, None, &metrics))),
            generations: RefCell::new(None),
            next_slot: Cell::new(0),
            watch: metrics.shared.watch.clone(),
            metrics,
            sessions: SessionWakers::default(),
        }
    }

    /// A context whose sessions start on `snapshot`, built from the generation `generations`
    /// last marked seen, and follow the generations sent after it.
    pub(crate) fn new(
        index: usize,
        snapshot: RouteSnapshot,
        generations: watch::Receiver<Arc<Generation>>,
        metrics: Rc<WorkerMetrics>,
    ) -> WorkerContext {
        WorkerContext {
            index,
            routing: RefCell::new(Rc::new(snapshot)),
            generations: RefCell::new(Some(generations)),
            next_slot: Cell::new(0),
            watch: metrics.shared.watch.clone(),
            metrics,
            sessions: SessionWakers::default(),
        }
    }

    /// Serves new requests with the newest generation if the publisher sent one since the
    /// last look (one atomic load when it did not); the old snapshot lives on in the requests
    /// in flight. Tells the publisher's caller once the new one is in use.
    pub(crate) fn follow_generations(&self) {
        let next = {
            let mut generations = self.generations.borrow_mut();
            let Some(receiver) = generations.as_mut() else {
                return;
            };
            // An error is a publisher gone at shutdown: the routing in use stays.
            if !receiver.has_changed().unwrap_or(false) {
                return;
            }
            let next = receiver.borrow_and_update().clone();
            next
        };
        let old = self.routing.borrow().clone();
        let routing = RouteSnapshot::build(&next, Some(&old), &self.metrics);
        drop(old);
        *self.routing.borrow_mut() = Rc::new(routing);
        tracing::debug!(worker = self.index, "worker switched to the new config");
        let _ = next.applied.send(self.index);
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

    /// A snapshot of the newest routing (a generation sent since the last call is swapped
    /// in first). Do not hold it across an idle wait: a snapshot keeps the connections of
    /// servers a reload removed open.
    pub(crate) fn routing(&self) -> Rc<RouteSnapshot> {
        self.follow_generations();
        self.routing.borrow().clone()
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::sync::Arc;

    use super::WorkerContext;
    use crate::publisher::{Plan, Publisher};
    use crate::snapshot::RouteSnapshot;
    use crate::stats::{Metrics, WorkerMetrics};

    fn config(max_client_pending: usize) -> memroute_config::Config {
        let toml = format!(
            "[proxy]\nlisten = [\"127.0.0.1:1\"]\nworkers = 1\nroute = \"main\"\n\
             max_client_pending = {max_client_pending}\n\
             [pools.main]\nservers = [\"127.0.0.1:1\"]\n"
        );
        memroute_config::parse(&toml).expect("test config")
    }

    /// A generation the publisher sent routes the next batch of requests even before the
    /// worker's reload task runs (stats published after the send must not run ahead of the
    /// routing), and the publisher's caller hears once that it is in use.
    #[test]
    fn the_next_batch_is_routed_by_the_generation_sent_last() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        tokio::task::LocalSet::new().block_on(&runtime, async {
            let shared = Arc::new(Metrics::new(1));
            let plan = |pending| Plan::bare(config(pending)).expect("routes");
            let (publisher, mut generations) = Publisher::new(shared.clone(), plan(7));
            let first = generations.borrow_and_update().clone();
            let metrics = Rc::new(WorkerMetrics::new(0, shared));
            let snapshot = RouteSnapshot::build(&first, None, &metrics);
            let context = WorkerContext::new(0, snapshot, generations, metrics);
            assert_eq!(context.routing().max_client_pending, 7);

            let (_, acks) = publisher.publish(plan(9));
            assert_eq!(context.routing().max_client_pending, 9);
            assert_eq!(acks.try_recv().ok(), Some(0), "the switch is acknowledged");
            assert_eq!(context.routing().max_client_pending, 9);
            assert!(acks.try_recv().is_err(), "acknowledged once");
        });
    }
}
