//! One worker thread: its own current-thread runtime, listeners, sessions and
//! backend connections. Workers share only the route table and the stats shards.
//!
//! A reload arrives as a new [`Generation`] on a watch channel. The worker builds a new
//! [`Routing`] off to the side (keeping the connections of servers whose connection
//! settings did not change) and swaps it in; every request takes one `Rc` snapshot of
//! the routing current when it was read, so requests in flight finish on the routing
//! they started with, and a removed server's connections close once the last request
//! holding them is answered.
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use memroute_backend::{spawn_connection, BackendHandle, ConnectionSettings};
use memroute_config::Config;
use memroute_protocol::Limits;
use memroute_routing::RouteTable;
use tokio::sync::{mpsc, watch};

use crate::listener::BoundListener;
use crate::stats::{ServerStats, ServerStatsTable, SharedStats};

/// One config as the workers receive it: built and checked on the main thread.
#[derive(Debug)]
pub(crate) struct Generation {
    pub config: Arc<Config>,
    pub routes: Arc<RouteTable>,
    /// Counters for `config`'s servers, indexed [pool id][server index].
    pub server_stats: ServerStatsTable,
    /// Each worker sends its index once it serves new requests with this generation.
    pub applied: std::sync::mpsc::Sender<usize>,
}

/// Everything a worker needs, handed over from the main thread.
pub(crate) struct Worker {
    pub index: usize,
    pub generation: watch::Receiver<Arc<Generation>>,
    pub listeners: Vec<BoundListener>,
    pub shared: Arc<SharedStats>,
    pub shutdown: watch::Receiver<bool>,
}

/// What makes two configs' connections to a server interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ConnectionKey {
    pool: String,
    address: String,
    timeout: Duration,
    connect_timeout: Duration,
    connections: usize,
    limits: (usize, usize, usize),
}

/// The connections of one server, owned by one worker.
#[derive(Debug)]
pub(crate) struct ServerConnections {
    connections: Vec<BackendHandle>,
    next: Cell<usize>,
    /// This server's error and timeout counters (touched only when a request fails).
    pub stats: Arc<ServerStats>,
    key: ConnectionKey,
}

impl ServerConnections {
    /// Round-robin over this worker's connections to the server.
    pub(crate) fn pick(&self) -> &BackendHandle {
        let i = self.next.get();
        self.next.set(if i + 1 >= self.connections.len() {
            0
        } else {
            i + 1
        });
        &self.connections[i]
    }
}

#[derive(Debug)]
pub(crate) struct PoolConnections {
    pub servers: Vec<ServerConnections>,
    pub max_keys_per_request: usize,
}

/// One config as a worker serves it: the route table and this worker's connections.
#[derive(Debug)]
pub(crate) struct Routing {
    pub routes: Arc<RouteTable>,
    /// Indexed by pool id (the route table's order).
    pub pools: Vec<PoolConnections>,
    pub limits: Limits,
    pub max_client_pending: usize,
    pub max_connections: usize,
    pub shutdown_timeout: Duration,
}

impl Routing {
    /// Builds the routing for `generation`, reusing `old`'s connections to every server
    /// whose pool, address and connection settings are unchanged.
    fn build(generation: &Generation, old: Option<&Routing>) -> Routing {
        let config = &generation.config;
        let limits = Limits {
            max_key_len: 250,
            max_line_len: config.proxy.max_line_size,
            max_value_len: config.proxy.max_value_size,
        };
        let mut reusable: HashMap<&ConnectionKey, Vec<&ServerConnections>> = HashMap::new();
        for server in old.iter().flat_map(|o| &o.pools).flat_map(|p| &p.servers) {
            reusable.entry(&server.key).or_default().push(server);
        }
        // Pool ids follow the route table's pool order (Config::pools is a BTreeMap, sorted).
        let pools = generation
            .routes
            .pool_names
            .iter()
            .enumerate()
            .filter_map(|(id, name)| Some((id, name, config.pools.get(name)?)))
            .map(|(id, name, pool)| PoolConnections {
                servers: pool
                    .servers
                    .iter()
                    .enumerate()
                    .map(|(index, server)| {
                        let key = ConnectionKey {
                            pool: name.clone(),
                            address: server.address.clone(),
                            timeout: pool.timeout,
                            connect_timeout: pool.connect_timeout,
                            connections: pool.connections.max(1),
                            limits: (
                                limits.max_key_len,
                                limits.max_line_len,
                                limits.max_value_len,
                            ),
                        };
                        let connections = match reusable.get_mut(&key).and_then(Vec::pop) {
                            Some(kept) => kept.connections.clone(),
                            None => {
                                let settings = ConnectionSettings {
                                    address: Arc::from(server.address.as_str()),
                                    timeout: pool.timeout,
                                    connect_timeout: pool.connect_timeout,
                                    backoff_min: Duration::from_millis(100),
                                    backoff_max: Duration::from_secs(5),
                                    limits,
                                };
                                (0..key.connections)
                                    .map(|_| spawn_connection(settings.clone()))
                                    .collect()
                            }
                        };
                        let stats = generation
                            .server_stats
                            .get(id)
                            .and_then(|p| p.get(index))
                            .cloned()
                            .unwrap_or_else(|| {
                                Arc::new(ServerStats {
                                    pool: name.clone(),
                                    address: server.address.clone(),
                                    errors: Default::default(),
                                    timeouts: Default::default(),
                                })
                            });
                        ServerConnections {
                            connections,
                            next: Cell::new(0),
                            stats,
                            key,
                        }
                    })
                    .collect(),
                max_keys_per_request: pool.max_keys_per_request.max(1),
            })
            .collect();
        Routing {
            routes: generation.routes.clone(),
            pools,
            limits,
            max_client_pending: config.proxy.max_client_pending.max(1),
            max_connections: config.proxy.max_connections,
            shutdown_timeout: config.proxy.shutdown_timeout,
        }
    }
}

/// Per-worker state every session of the worker reads.
#[derive(Debug)]
pub(crate) struct WorkerContext {
    pub index: usize,
    /// The routing new requests use; replaced (never mutated) on reload.
    routing: RefCell<Rc<Routing>>,
    pub shared: Arc<SharedStats>,
}

impl WorkerContext {
    pub(crate) fn stats(&self) -> &crate::stats::WorkerStats {
        &self.shared.workers[self.index]
    }

    /// A snapshot of the current routing. Do not hold it across an idle wait: a snapshot
    /// keeps the connections of servers a reload removed open.
    pub(crate) fn routing(&self) -> Rc<Routing> {
        self.routing.borrow().clone()
    }
}

impl Worker {
    pub(crate) fn run(self) {
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
    }

    async fn serve(mut self) {
        let first = self.generation.borrow_and_update().clone();
        let context = Rc::new(WorkerContext {
            index: self.index,
            routing: RefCell::new(Rc::new(Routing::build(&first, None))),
            shared: self.shared.clone(),
        });
        drop(first);
        let reloads =
            tokio::task::spawn_local(apply_reloads(context.clone(), self.generation.clone()));
        // Every session holds a clone of `alive`; when all are dropped, `all_done` yields None.
        let (alive, mut all_done) = mpsc::channel::<()>(1);
        let mut accepts = Vec::new();
        for listener in self.listeners {
            let context = context.clone();
            let shutdown = self.shutdown.clone();
            let alive = alive.clone();
            accepts.push(tokio::task::spawn_local(accept_loop(
                listener, context, shutdown, alive,
            )));
        }
        drop(alive);
        for accept in accepts {
            let _ = accept.await;
        }
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
        tracing::debug!(worker = self.index, "worker stopped");
    }
}

/// Swaps in each new generation's routing until the sender is gone.
async fn apply_reloads(
    context: Rc<WorkerContext>,
    mut generation: watch::Receiver<Arc<Generation>>,
) {
    while generation.changed().await.is_ok() {
        let next = generation.borrow_and_update().clone();
        let routing = Rc::new(Routing::build(&next, Some(&context.routing())));
        // The old routing lives on in the snapshots of requests still in flight.
        *context.routing.borrow_mut() = routing;
        tracing::debug!(worker = context.index, "worker switched to the new config");
        let _ = next.applied.send(context.index);
    }
}

/// A listener attached to this worker's runtime.
enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Listener {
    fn attach(bound: BoundListener) -> std::io::Result<Listener> {
        Ok(match bound {
            BoundListener::Tcp(l) => Listener::Tcp(tokio::net::TcpListener::from_std(l)?),
            BoundListener::Unix(l) => Listener::Unix(tokio::net::UnixListener::from_std(l)?),
        })
    }

    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => {
                let (stream, _peer) = l.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok(Accepted::Tcp(stream))
            }
            Listener::Unix(l) => Ok(Accepted::Unix(l.accept().await?.0)),
        }
    }
}

async fn accept_loop(
    listener: BoundListener,
    context: Rc<WorkerContext>,
    mut shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    let name = listener.describe();
    let listener = match Listener::attach(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(listener = %name, %error, "cannot attach listener to the runtime");
            return;
        }
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(Accepted::Tcp(mut stream)) => spawn_session(&context, &shutdown, &alive, move |ctx, sd| async move {
                    let (reader, writer) = stream.split();
                    crate::session::run(ctx, reader, writer, sd).await;
                }),
                Ok(Accepted::Unix(mut stream)) => spawn_session(&context, &shutdown, &alive, move |ctx, sd| async move {
                    let (reader, writer) = stream.split();
                    crate::session::run(ctx, reader, writer, sd).await;
                }),
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

fn spawn_session<F, Fut>(
    context: &Rc<WorkerContext>,
    shutdown: &watch::Receiver<bool>,
    alive: &mpsc::Sender<()>,
    session: F,
) where
    F: FnOnce(Rc<WorkerContext>, watch::Receiver<bool>) -> Fut,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let stats = context.stats();
    let open: u64 = context
        .shared
        .workers
        .iter()
        .map(|w| {
            w.curr_connections
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    let max_connections = context.routing.borrow().max_connections;
    if max_connections > 0 && open >= max_connections as u64 {
        stats
            .rejected_connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Dropping the stream (captured in `session`) closes it, as memcached does at its limit.
        return;
    }
    stats
        .curr_connections
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    stats
        .total_connections
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let future = session(context.clone(), shutdown.clone());
    let alive = alive.clone();
    let context = context.clone();
    tokio::task::spawn_local(async move {
        future.await;
        context
            .stats()
            .curr_connections
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        drop(alive);
    });
}
