//! memroute-proxy: workers, listeners, client sessions, fan-out and merge.
//!
//! ```text
//!  main thread: start(config) binds every listener, spawns N workers, returns a handle
//!
//!  worker thread (one per core, current-thread tokio runtime + LocalSet)
//!    accept loop (SO_REUSEPORT socket of its own per listen address)
//!      -> session task per client: parse -> dispatch -> ordered replies
//!    backend connections: pools x servers x `connections`, owned by this worker
//! ```
//!
//! Nothing on the request path takes a lock shared across workers: the route table
//! is an `Arc` snapshot, counters are per-worker atomics summed when `stats` asks.
#![forbid(unsafe_code)]

mod admin;
mod dispatch;
mod error;
mod listener;
mod session;
mod stats;
mod worker;

use std::sync::Arc;
use std::thread::JoinHandle;

use memroute_config::Config;
use memroute_routing::RouteTable;
use tokio::sync::watch;

pub use error::ProxyError;
pub use listener::effective_backlog;

/// memroute's version as reported by `version` and `stats`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A running proxy: its worker threads and the switch that stops them.
#[derive(Debug)]
pub struct ProxyHandle {
    shutdown: watch::Sender<bool>,
    workers: Vec<JoinHandle<()>>,
    /// Addresses actually bound (useful when a config asks for port 0).
    pub local_addresses: Vec<String>,
    /// The admin endpoint's address, when `[admin]` is configured.
    pub admin_address: Option<String>,
}

impl ProxyHandle {
    /// Stop accepting, let sessions finish what is in flight, then let workers exit.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Waits for every worker thread to exit.
    pub fn join(self) {
        for worker in self.workers {
            if worker.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
    }
}

/// Binds every listener and starts the workers. Errors (an address in use, a pool
/// that cannot be routed) are returned before any worker starts serving.
pub fn start(config: Config) -> Result<ProxyHandle, ProxyError> {
    let routes = Arc::new(RouteTable::build(&config)?);
    let workers = config.proxy.workers.max(1);
    let backlog = effective_backlog(config.proxy.backlog);
    let first = listener::bind_all(&config.proxy.listen, backlog, true)?;
    let local_addresses: Vec<String> = first.iter().map(|l| l.describe()).collect();
    // Later workers bind the ports the first one got, so `:0` in a config still means
    // one port shared by every worker.
    let same_ports: Vec<memroute_config::ListenAddress> = first
        .iter()
        .filter_map(|l| match l {
            listener::BoundListener::Tcp(_) => {
                Some(memroute_config::ListenAddress::Tcp(l.describe()))
            }
            listener::BoundListener::Unix(_) => None,
        })
        .collect();
    let mut listeners = Vec::with_capacity(workers);
    listeners.push(first);
    for _ in 1..workers {
        listeners.push(listener::bind_all(&same_ports, backlog, false)?);
    }
    let shared = Arc::new(stats::SharedStats::new(&config, workers));
    let admin_address = match &config.admin {
        Some(admin) => Some(admin::start(&admin.listen, shared.clone())?),
        None => None,
    };
    let config = Arc::new(config);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut threads = Vec::with_capacity(workers);
    for (index, bound) in listeners.into_iter().enumerate() {
        let worker = worker::Worker {
            index,
            config: config.clone(),
            routes: routes.clone(),
            listeners: bound,
            shared: shared.clone(),
            shutdown: shutdown_rx.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("memroute-worker-{index}"))
            .spawn(move || worker.run())
            .map_err(ProxyError::Thread)?;
        threads.push(thread);
    }
    Ok(ProxyHandle {
        shutdown,
        workers: threads,
        local_addresses,
        admin_address,
    })
}
