//! One worker thread: its own current-thread runtime, its listeners' accept loops and a
//! session task per client (`session`). Workers share only the route table and the stats
//! shards; the per-worker state sessions read is in `context`.
//!
//! With `proxy.io = "io_uring"` the worker also runs an io_uring driver task
//! (`memroute_net::uring`): the sockets it accepts and connects are then read and written
//! through the worker's ring instead of tokio's epoll reactor; everything above the
//! stream is the same.
//!
//! A reload arrives as a new [`Generation`] on a watch channel. The worker builds a new
//! [`RouteSnapshot`] off to the side (`snapshot`: keeping the connections of servers whose
//! connection settings did not change) and swaps it in, when a batch of requests starts or,
//! for an idle worker, on its reload task (`context`); every request takes one `Rc` of
//! the snapshot current when it was read, so requests in flight finish on the routing
//! they started with, and a removed server's connections close once the last request
//! holding them is answered.
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use memroute_config::IoMode;
use memroute_net::uring::{Driver, UringOptions};
use memroute_net::{BoundListener, Listener};
use tokio::sync::{mpsc, watch};

use crate::context::WorkerContext;
use crate::generation::Generation;
use crate::snapshot::RouteSnapshot;
use crate::stats::{Metrics, WorkerMetrics};

/// Everything a worker needs, handed over from the main thread.
#[derive(Debug)]
pub struct Worker {
    pub index: usize,
    pub generation: watch::Receiver<Arc<Generation>>,
    /// This worker's sockets, each with its address's index in `proxy.listen`.
    pub listeners: Vec<crate::transport::IndexedListener>,
    /// `proxy.io` at start.
    pub io: IoMode,
    pub shared: Arc<Metrics>,
    pub shutdown: watch::Receiver<bool>,
}

impl Worker {
    pub fn run(self) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::error!(worker = self.index, %error, "cannot build the worker runtime");
                return;
            }
        };
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, self.serve());
        // The tasks (and the streams they hold) go first, then the io_uring driver, while
        // the runtime its eventfd is registered with still exists.
        drop(local);
        Driver::uninstall();
    }

    async fn serve(mut self) {
        // Before anything opens a socket: every stream of this worker uses the same mode.
        let uring = match self.io {
            IoMode::IoUring => start_uring(self.index),
            IoMode::Epoll => None,
        };
        let first = self.generation.borrow_and_update().clone();
        let metrics = Rc::new(WorkerMetrics::new(self.index, self.shared.clone()));
        let context = Rc::new(WorkerContext::new(
            self.index,
            RouteSnapshot::build(&first, None, &metrics),
            self.generation.clone(),
            metrics.clone(),
        ));
        // A reload published before this worker started is the generation it starts with:
        // say it switched, or that reload would wait out its acknowledgement timeout.
        let _ = first.applied.send(self.index);
        drop(first);
        let flusher = tokio::task::spawn_local(metrics.run_flusher());
        let trimmer = tokio::task::spawn_local(trim_pools());
        let reloads =
            tokio::task::spawn_local(apply_reloads(context.clone(), self.generation.clone()));
        // Every session holds a clone of `alive`; when all are dropped, `all_done` yields None.
        let (alive, mut all_done) = mpsc::channel::<()>(1);
        let mut accepts = Vec::new();
        for (index, listener) in self.listeners {
            let context = context.clone();
            let shutdown = self.shutdown.clone();
            let alive = alive.clone();
            accepts.push(tokio::task::spawn_local(accept_loop(
                index, listener, context, shutdown, alive,
            )));
        }
        drop(alive);
        for accept in accepts {
            let _ = accept.await;
        }
        // Every accept loop ended on shutdown: idle sessions close, busy ones once idle.
        context.sessions.drain();
        // Listeners are closed; wait for sessions to finish what they have in flight, but
        // not forever: a client that stopped reading would hold the process hostage.
        let shutdown_timeout = context.routing().shutdown_timeout;
        tokio::select! {
            _ = all_done.recv() => {}
            _ = tokio::time::sleep(shutdown_timeout) => {
                tracing::warn!(worker = self.index, timeout = ?shutdown_timeout, "shutdown_timeout passed; closing connections still in use");
            }
        }
        reloads.abort();
        flusher.abort();
        trimmer.abort();
        if let Some(driver) = uring {
            driver.abort();
        }
        context.metrics.flush();
        tracing::debug!(worker = self.index, "worker stopped");
    }
}

/// How often a worker frees the pooled buffers a whole tick did not use. A burst's buffers
/// go back within two ticks, and the allocator returns their pages about half a second
/// later (crates/memroute/src/allocator.rs): within a second of the burst in all.
const TRIM_INTERVAL: Duration = Duration::from_millis(250);

/// Trims this worker's buffer pools (`buffers`, the io_uring driver's) on a steady tick,
/// so memory that a burst of connections took comes back once the burst ends.
async fn trim_pools() {
    let mut tick = tokio::time::interval(TRIM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        crate::buffers::trim();
        if let Some(driver) = memroute_net::uring::current() {
            driver.trim_pool();
        }
    }
}

/// Sets up this worker's io_uring and starts its driver task; `None` (epoll) where
/// io_uring is unavailable (an old kernel, a container's seccomp profile, the
/// `kernel.io_uring_disabled` sysctl), said once per process.
fn start_uring(worker: usize) -> Option<tokio::task::JoinHandle<()>> {
    static FALLBACK_LOGGED: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);
    let options = UringOptions {
        // A benchmarking aid (docs/benchmarks.md), not a setting: the ring without
        // DEFER_TASKRUN, for comparison.
        defer_taskrun: std::env::var_os("MEMROUTE_URING_NO_DEFER_TASKRUN").is_none(),
        // Likewise: sockets named by descriptor only, no table of fixed files.
        fixed_files: std::env::var_os("MEMROUTE_URING_NO_FIXED_FILES").is_none(),
    };
    match Driver::install(options) {
        Ok(driver) => {
            tracing::info!(
                worker,
                defer_taskrun = options.defer_taskrun,
                fixed_files = options.fixed_files,
                "worker serves its sockets through io_uring"
            );
            Some(tokio::task::spawn_local(driver.run()))
        }
        Err(error) => {
            if !FALLBACK_LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    %error,
                    "proxy.io = \"io_uring\" but io_uring cannot be set up here; serving with epoll"
                );
            }
            None
        }
    }
}

/// Swaps in each new generation's routing until the sender is gone, for a worker whose
/// sessions are idle (a busy one picks it up as its next batch of requests starts).
async fn apply_reloads(
    context: Rc<WorkerContext>,
    mut generation: watch::Receiver<Arc<Generation>>,
) {
    while generation.changed().await.is_ok() {
        generation.borrow_and_update();
        context.follow_generations();
    }
}

/// Accepts on the `index`-th listener of `proxy.listen` until shutdown.
async fn accept_loop(
    index: usize,
    listener: BoundListener,
    context: Rc<WorkerContext>,
    mut shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    let name = listener.describe();
    let accepted = context.metrics.shared.listener_event(&name, "accepted");
    let events = Rc::new(crate::client_log::ListenerEvents::new(
        &context.metrics.shared,
        index,
        &name,
    ));
    let listener = match Listener::attach(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(listener = %name, %error, "cannot attach listener to the runtime");
            return;
        }
    };
    loop {
        tokio::select! {
            outcome = listener.accept() => match outcome.inspect(|_| accepted.inc()) {
                // The TLS handshake runs in the session's task: a slow or silent client
                // holds up nobody else (bounded by tls_handshake_timeout, counted).
                Ok(incoming) => spawn_session(&context, &alive, &events, incoming),
                Err(error) => accept_error(&name, error).await,
            },
            _ = shutdown.changed() => break,
        }
    }
}

/// Out of file descriptors and similar: log, and pause briefly so a full fd table
/// does not become a busy loop.
async fn accept_error(name: &str, error: std::io::Error) {
    tracing::warn!(listener = %name, %error, "accept failed");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Starts the session of a client accepted on the listener `events` belong to.
fn spawn_session<C>(
    context: &Rc<WorkerContext>,
    alive: &mpsc::Sender<()>,
    events: &Rc<crate::client_log::ListenerEvents>,
    connection: C,
) where
    C: crate::session::ClientConnection + 'static,
{
    // Connection counts are shared atomics: touched per connection, never per request.
    if !context
        .metrics
        .shared
        .admit_connection(context.routing().max_connections)
    {
        // Dropping the connection closes it, as memcached does at its limit.
        return;
    }
    let open =
        crate::session::OpenSession::new(context.clone(), alive.clone(), Some(events.clone()));
    // The session future is the task itself, built here and stored once: wrapping it in
    // another async block (or capturing it and then awaiting it) stores its arguments or
    // the whole future twice in the task cell.
    tokio::task::spawn_local(crate::session::run(open, connection));
}
