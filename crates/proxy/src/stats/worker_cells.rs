//! One worker's counts, kept in plain cells (no atomics, no sharing) and moved into the
//! shared registry on every flush.
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memroute_protocol::Command;
use memroute_routing::{NodeId, RouteTable};
use prometheus::local::LocalHistogram;
use prometheus::IntCounter;

use super::families::lock;
use super::flush_barrier::FLUSH_INTERVAL;
use super::registry::{
    command_index, Metrics, COMMANDS, COMMAND_NAMES, LOCAL_ROUTE, ZONE_LOCALITIES,
};
use crate::hot_keys::WorkerHotKeys;

/// One worker's counts, kept in plain cells (no atomics, no sharing) and moved into the
/// registry by [`WorkerMetrics::flush`].
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    index: usize,
    pub shared: Arc<Metrics>,
    pub get_keys: Cell<u64>,
    pub set_requests: Cell<u64>,
    pub touch_keys: Cell<u64>,
    pub flush_requests: Cell<u64>,
    pub get_hits: Cell<u64>,
    pub get_misses: Cell<u64>,
    pub client_errors: Cell<u64>,
    /// Storage requests refused for a value over `max_value_size` (text and binary).
    pub oversized_values: Cell<u64>,
    /// Connections closed because their input could no longer be framed.
    pub framing_closes: Cell<u64>,
    /// Connections that spoke the binary protocol (first byte 0x80).
    pub binary_connections: Cell<u64>,
    /// Logins tried, and refused, on listeners that want one.
    pub auth_cmds: Cell<u64>,
    pub auth_errors: Cell<u64>,
    /// This worker's hot-key sampler (each routing it builds places keys through it).
    pub hot_keys: Rc<WorkerHotKeys>,
    /// The per-route tables of every routing this worker still serves requests with.
    routes: RefCell<Vec<Rc<RouteMetrics>>>,
    /// Backend round trips per (pool, address), shared with that server's connections.
    round_trips: RefCell<HashMap<(String, String), Rc<LocalHistogram>>>,
    /// The time this worker last woke a session: one clock read per batch of requests,
    /// not per request (see [`WorkerMetrics::tick`]). Shared with the route tables.
    clock: Rc<Cell<Instant>>,
}

/// Request counts and latency by route node for one routing (one config) of one worker.
#[derive(Debug)]
pub(crate) struct RouteMetrics {
    /// [node * COMMANDS + command]; the last row is [`LOCAL_ROUTE`].
    counts: Vec<Cell<u64>>,
    counters: Vec<IntCounter>,
    /// Per node; plus [`LOCAL_ROUTE`] last.
    latency: Vec<LocalHistogram>,
    /// Requests per listener, by its place in `proxy.listen`.
    listener_counts: Vec<Cell<u64>>,
    listener_counters: Vec<IntCounter>,
    nodes: usize,
    clock: Rc<Cell<Instant>>,
    /// Per route node reading `nearest` (few): its reads by locality, [local, cross_zone].
    zone_reads: Vec<(NodeId, [Cell<u64>; 2], [IntCounter; 2])>,
}

impl RouteMetrics {
    /// The worker's clock as of the last [`WorkerMetrics::tick`].
    #[inline]
    pub(crate) fn now(&self) -> Instant {
        self.clock.get()
    }

    /// Records the latency of a request to `node` started at `started`, as of now.
    #[inline]
    pub(crate) fn observe_since(&self, node: usize, started: Instant) {
        self.observe(node, self.now().saturating_duration_since(started));
    }

    /// Counts one request (or key) of `command` that reached route node `node`.
    #[inline]
    pub(crate) fn count(&self, node: usize, command: Command) {
        let node = node.min(self.nodes);
        if let Some(cell) = self.counts.get(node * COMMANDS + command_index(command)) {
            cell.set(cell.get() + 1);
        }
    }

    /// Counts one request read from a client of the `listener`-th listener.
    #[inline]
    pub(crate) fn count_listener(&self, listener: usize) {
        if let Some(cell) = self.listener_counts.get(listener) {
            cell.set(cell.get() + 1);
        }
    }

    /// Counts `n` reads (keys) nearest-reading replicated route `node` sent to a child in
    /// the proxy's zone (`local`) or to any other child.
    #[inline]
    pub(crate) fn count_zone_reads(&self, node: NodeId, local: bool, n: u64) {
        if let Some((_, counts, _)) = self.zone_reads.iter().find(|(at, ..)| *at == node) {
            let cell = &counts[usize::from(!local)];
            cell.set(cell.get() + n);
        }
    }

    /// Counts one request memroute answered itself.
    #[inline]
    pub(crate) fn count_local(&self, command: Command) {
        self.count(self.nodes, command);
    }

    /// Records the latency of a request that reached route node `node`.
    #[inline]
    pub(crate) fn observe(&self, node: usize, elapsed: Duration) {
        if let Some(histogram) = self.latency.get(node.min(self.nodes)) {
            histogram.observe(elapsed.as_secs_f64());
        }
    }

    fn flush(&self) {
        let counts = self.counts.iter().chain(&self.listener_counts);
        for (cell, counter) in counts.zip(self.counters.iter().chain(&self.listener_counters)) {
            let n = cell.take();
            if n > 0 {
                counter.inc_by(n);
            }
        }
        for histogram in &self.latency {
            histogram.flush();
        }
        for (_, counts, counters) in &self.zone_reads {
            for (cell, counter) in counts.iter().zip(counters) {
                let n = cell.take();
                if n > 0 {
                    counter.inc_by(n);
                }
            }
        }
    }
}

impl WorkerMetrics {
    pub(crate) fn new(index: usize, shared: Arc<Metrics>) -> WorkerMetrics {
        WorkerMetrics {
            index,
            hot_keys: Rc::new(shared.hot_keys.worker(index as u64 + 0x9e37_79b9)),
            shared,
            get_keys: Cell::new(0),
            set_requests: Cell::new(0),
            touch_keys: Cell::new(0),
            flush_requests: Cell::new(0),
            get_hits: Cell::new(0),
            get_misses: Cell::new(0),
            client_errors: Cell::new(0),
            oversized_values: Cell::new(0),
            framing_closes: Cell::new(0),
            binary_connections: Cell::new(0),
            auth_cmds: Cell::new(0),
            auth_errors: Cell::new(0),
            routes: RefCell::new(Vec::new()),
            round_trips: RefCell::new(HashMap::new()),
            clock: Rc::new(Cell::new(Instant::now())),
        }
    }

    /// Reads the clock once for everything a session does until it waits again.
    #[inline]
    pub(crate) fn tick(&self) {
        self.clock.set(Instant::now());
    }

    /// Adds one to a local counter.
    #[inline]
    pub(crate) fn add(cell: &Cell<u64>, n: u64) {
        cell.set(cell.get() + n);
    }

    /// The per-route table for a routing built from `routes`.
    pub(crate) fn for_routes(&self, routes: &RouteTable) -> Rc<RouteMetrics> {
        let nodes = routes.node_count();
        let name = |node: usize| match node == nodes {
            true => LOCAL_ROUTE,
            false => routes.node_name(node as memroute_routing::NodeId),
        };
        let mut counters = Vec::with_capacity((nodes + 1) * COMMANDS);
        for node in 0..=nodes {
            for command in COMMAND_NAMES {
                counters.push(
                    self.shared
                        .requests
                        .with_label_values(&[command, name(node)]),
                );
            }
        }
        let latency = (0..=nodes)
            .map(|node| {
                self.shared
                    .request_duration
                    .with_label_values(&[name(node)])
                    .local()
            })
            .collect();
        let listener_counters: Vec<IntCounter> = lock(&self.shared.state)
            .listener_names
            .iter()
            .map(|name| self.shared.listener_requests.with_label_values(&[name]))
            .collect();
        let zone_reads = (0..nodes as NodeId)
            .filter(|&node| {
                matches!(
                    routes.node(node),
                    memroute_routing::Node::Replicated {
                        reads: memroute_config::ReadPolicy::Nearest,
                        ..
                    }
                )
            })
            .map(|node| {
                let counter = |locality: &str| {
                    self.shared
                        .zone_reads
                        .with_label_values(&[routes.node_name(node), locality])
                };
                (
                    node,
                    [Cell::new(0), Cell::new(0)],
                    ZONE_LOCALITIES.map(counter),
                )
            })
            .collect();
        let table = Rc::new(RouteMetrics {
            zone_reads,
            counts: counters.iter().map(|_| Cell::new(0)).collect(),
            counters,
            latency,
            listener_counts: listener_counters.iter().map(|_| Cell::new(0)).collect(),
            listener_counters,
            nodes,
            clock: self.clock.clone(),
        });
        self.routes.borrow_mut().push(table.clone());
        table
    }

    /// The round-trip histogram of `pool`'s server `address` for this worker's connections.
    pub(crate) fn round_trip(&self, pool: &str, address: &str) -> Rc<LocalHistogram> {
        self.round_trips
            .borrow_mut()
            .entry((pool.to_string(), address.to_string()))
            .or_insert_with(|| {
                Rc::new(
                    self.shared
                        .backend_round_trip
                        .with_label_values(&[pool, address])
                        .local(),
                )
            })
            .clone()
    }

    /// The process-wide round trips of `pool`'s server `address` (every worker's, as of
    /// their last flush): read now and then to learn a server's latency, never per request.
    pub(crate) fn round_trip_totals(&self, pool: &str, address: &str) -> prometheus::Histogram {
        self.shared.round_trip_totals(pool, address)
    }

    /// Moves every local count into the registry; forgets tables nobody uses any more.
    pub(crate) fn flush(&self) {
        let seen = self.shared.flush.requested.load(Relaxed);
        let shared = &self.shared;
        for (cell, counter) in [
            (&self.get_keys, &shared.get_keys),
            (&self.set_requests, &shared.set_requests),
            (&self.touch_keys, &shared.touch_keys),
            (&self.flush_requests, &shared.flush_requests),
            (&self.get_hits, &shared.get_hits),
            (&self.get_misses, &shared.get_misses),
            (&self.client_errors, &shared.client_errors),
            (&self.oversized_values, &shared.oversized_values),
            (&self.framing_closes, &shared.framing_closes),
            (&self.binary_connections, &shared.binary_connections),
            (&self.auth_cmds, &shared.auth_cmds),
            (&self.auth_errors, &shared.auth_errors),
        ] {
            let n = cell.take();
            if n > 0 {
                counter.inc_by(n);
            }
        }
        self.routes.borrow_mut().retain(|table| {
            table.flush();
            // Only this list holds it: its routing is gone and it was just flushed.
            Rc::strong_count(table) > 1
        });
        self.round_trips.borrow_mut().retain(|_, histogram| {
            histogram.flush();
            Rc::strong_count(histogram) > 1
        });
        shared.flush.flushed(self.index, seen);
    }

    /// Flushes every [`FLUSH_INTERVAL`] and whenever a scrape or `stats` asks.
    pub(crate) async fn run_flusher(self: Rc<Self>) {
        let mut interval = tokio::time::interval(FLUSH_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = self.shared.flush.requested_for(self.index) => {}
            }
            self.flush();
        }
    }
}

impl Drop for WorkerMetrics {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Observes backend round trips for one server's connections (see `ConnectionSettings`).
pub(crate) fn round_trip_observer(histogram: Rc<LocalHistogram>) -> memroute_backend::RoundTrips {
    memroute_backend::RoundTrips::new(move |elapsed: Duration| {
        histogram.observe(elapsed.as_secs_f64())
    })
}
