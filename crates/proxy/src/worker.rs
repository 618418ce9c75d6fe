//! One worker thread: its own current-thread runtime, listeners, sessions and
//! backend connections. Workers share only the route table and the stats shards.
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use memroute_backend::{spawn_connection, BackendHandle, ConnectionSettings};
use memroute_config::Config;
use memroute_protocol::Limits;
use memroute_routing::RouteTable;
use tokio::sync::{mpsc, watch};

use crate::listener::BoundListener;
use crate::stats::SharedStats;

/// Everything a worker needs, handed over from the main thread.
pub(crate) struct Worker {
    pub index: usize,
    pub config: Arc<Config>,
    pub routes: Arc<RouteTable>,
    pub listeners: Vec<BoundListener>,
    pub shared: Arc<SharedStats>,
    pub shutdown: watch::Receiver<bool>,
}

/// The connections of one server, owned by one worker.
#[derive(Debug)]
pub(crate) struct ServerConnections {
    connections: Vec<BackendHandle>,
    next: Cell<usize>,
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

/// Per-worker state every session of the worker reads.
#[derive(Debug)]
pub(crate) struct WorkerContext {
    pub index: usize,
    pub routes: Arc<RouteTable>,
    /// Indexed by pool id (the route table's order).
    pub pools: Vec<PoolConnections>,
    pub limits: Limits,
    pub max_client_pending: usize,
    pub max_connections: usize,
    pub shared: Arc<SharedStats>,
}

impl WorkerContext {
    pub(crate) fn stats(&self) -> &crate::stats::WorkerStats {
        &self.shared.workers[self.index]
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

    async fn serve(self) {
        let limits = Limits {
            max_key_len: 250,
            max_line_len: self.config.proxy.max_line_size,
            max_value_len: self.config.proxy.max_value_size,
        };
        // Pool ids follow the route table's pool order (Config::pools is a BTreeMap, sorted).
        let pools = self
            .routes
            .pool_names
            .iter()
            .filter_map(|name| self.config.pools.get(name))
            .map(|pool| PoolConnections {
                servers: pool
                    .servers
                    .iter()
                    .map(|server| {
                        let settings = ConnectionSettings {
                            address: Arc::from(server.address.as_str()),
                            timeout: pool.timeout,
                            connect_timeout: pool.connect_timeout,
                            backoff_min: Duration::from_millis(100),
                            backoff_max: Duration::from_secs(5),
                            limits,
                        };
                        ServerConnections {
                            connections: (0..pool.connections.max(1))
                                .map(|_| spawn_connection(settings.clone()))
                                .collect(),
                            next: Cell::new(0),
                        }
                    })
                    .collect(),
                max_keys_per_request: pool.max_keys_per_request.max(1),
            })
            .collect();
        let context = Rc::new(WorkerContext {
            index: self.index,
            routes: self.routes.clone(),
            pools,
            limits,
            max_client_pending: self.config.proxy.max_client_pending.max(1),
            max_connections: self.config.proxy.max_connections,
            shared: self.shared.clone(),
        });
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
        tokio::select! {
            _ = all_done.recv() => {}
            _ = tokio::time::sleep(self.config.proxy.shutdown_timeout) => {
                tracing::warn!(worker = self.index, timeout = ?self.config.proxy.shutdown_timeout, "shutdown_timeout passed; closing connections still in use");
            }
        }
        tracing::debug!(worker = self.index, "worker stopped");
    }
}

async fn accept_loop(
    listener: BoundListener,
    context: Rc<WorkerContext>,
    mut shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    let name = listener.describe();
    let result = match listener {
        BoundListener::Tcp(std_listener) => match tokio::net::TcpListener::from_std(std_listener) {
            Ok(listener) => {
                loop {
                    tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _peer)) => {
                                let _ = stream.set_nodelay(true);
                                spawn_session(&context, &shutdown, &alive, move |ctx, sd| async move {
                                    let mut stream = stream;
                                    let (reader, writer) = stream.split();
                                    crate::session::run(ctx, reader, writer, sd).await;
                                });
                            }
                            Err(error) => accept_error(&name, error).await,
                        },
                        _ = shutdown.changed() => break,
                    }
                }
                Ok(())
            }
            Err(error) => Err(error),
        },
        BoundListener::Unix(std_listener) => match tokio::net::UnixListener::from_std(std_listener)
        {
            Ok(listener) => {
                loop {
                    tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _peer)) => {
                                spawn_session(&context, &shutdown, &alive, move |ctx, sd| async move {
                                    let mut stream = stream;
                                    let (reader, writer) = stream.split();
                                    crate::session::run(ctx, reader, writer, sd).await;
                                });
                            }
                            Err(error) => accept_error(&name, error).await,
                        },
                        _ = shutdown.changed() => break,
                    }
                }
                Ok(())
            }
            Err(error) => Err(error),
        },
    };
    if let Err(error) = result {
        tracing::error!(listener = %name, %error, "cannot attach listener to the runtime");
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
    if context.max_connections > 0 && open >= context.max_connections as u64 {
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
