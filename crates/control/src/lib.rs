//! memroute-control, the control plane: starts the data plane (memroute-proxy) and keeps
//! it configured, and answers operators.
//!
//! ```text
//!  start(config): bind listeners, build the first generation, spawn workers (data plane)
//!     |
//!     +--> control thread (control_thread): health probes, DNS, resize windows
//!     +--> admin thread (admin): /metrics, /ready, /state and the panel, /route, /watch, /reload
//!     |
//!  ProxyHandle: reload (reload.rs: one path for SIGHUP, file watch and POST /reload; the
//!               restart-only settings keep their running values, restart_only.rs),
//!               route lookups (route_lookup.rs, route_reads.rs), drain and shutdown
//! ```
//!
//! The control plane decides what the data plane runs (controller.rs: each generation's
//! routes, health, connectors (connectors.rs), logins (credentials.rs) and resize windows
//! (resize_decision.rs), handed to `memroute_proxy::publisher::Publisher`) and reads what
//! it counts (`memroute_proxy::stats::Metrics`); the data plane imports nothing from here.
#![forbid(unsafe_code)]

mod admin;
mod connectors;
mod control_thread;
mod controller;
mod credentials;
mod reload;
mod resize_decision;
mod restart_only;
mod route_lookup;
mod route_reads;
mod transport_setup;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memroute_config::Config;
use memroute_net::effective_backlog;
use memroute_proxy::ReloadCounts;
use memroute_proxy::{stats, worker, ProxyError};
use tokio::sync::watch;

pub use admin::ReloadRequest;
pub use credentials::check_logins;
pub use reload::{ReloadOutcome, ReloadTrigger};
pub use route_lookup::{
    describe_routes, listener_list, listener_named, operation_named, route_key, RouteTarget,
};
pub use route_reads::describe_reads;
pub use transport_setup::check_transport;

/// A running proxy: its worker threads and the switch that stops them.
#[derive(Debug)]
pub struct ProxyHandle {
    shutdown: watch::Sender<bool>,
    workers: Vec<JoinHandle<()>>,
    /// The control thread (health probes, DNS, reload builds) and the admin endpoint's.
    helpers: Vec<JoinHandle<()>>,
    /// Builds the generations the workers serve (reloads, DNS changes).
    controller: Arc<controller::Controller>,
    /// Serialises reloads (the restart-only settings are compared against the last one).
    reloading: Mutex<()>,
    /// What the admin endpoint serves (readiness, config, reload requests).
    admin: Arc<admin::AdminState>,
    /// Reloads from the config file: the last bytes read, and the ok/failed counters.
    reload_state: reload::ReloadState,
    /// Addresses actually bound (useful when a config asks for port 0).
    pub local_addresses: Vec<String>,
    /// The admin endpoint's address, when `[admin]` is configured.
    pub admin_address: Option<String>,
    /// The TLS listeners (their certificates reload with the config).
    tls_listeners: Vec<transport_setup::TlsListener>,
}

impl ProxyHandle {
    /// Stop accepting, then close each client connection as it goes idle (nothing in
    /// flight, nothing buffered), within `shutdown_timeout`; then let workers exit.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// The first step of a graceful stop: from now on the admin endpoint answers not ready
    /// (503), while memroute keeps accepting and serving. The caller waits `drain_delay()`
    /// (for load balancers to stop sending new clients) and then calls `shutdown()`.
    pub fn start_draining(&self) {
        if !self.admin.draining.swap(true, Ordering::Relaxed) {
            tracing::info!(drain_delay = ?self.drain_delay(), "draining: reporting not ready, still accepting and serving");
        }
    }

    /// Whether `start_draining` was called.
    pub fn is_draining(&self) -> bool {
        self.admin.draining.load(Ordering::Relaxed)
    }

    /// `proxy.drain_delay` of the running config.
    pub fn drain_delay(&self) -> Duration {
        self.controller.base().proxy.drain_delay
    }

    /// Serves `config` from now on, without dropping a connection or a request: builds its
    /// route table off to the side (an error leaves the running config in place) and hands
    /// it to every worker, then waits (bounded) until each worker uses it for new requests.
    ///
    /// Settings that need a restart (which addresses `proxy.listen` binds and whether each
    /// speaks TLS, `proxy.workers`, `proxy.backlog`, `proxy.io`, `proxy.fastopen`,
    /// `admin.listen`, adding or removing `[admin]`) keep their running values; each changed
    /// one is logged as a warning. A listener's route and the other `[admin]` keys follow
    /// the new config.
    pub fn reload(&self, config: Config) -> Result<(), ProxyError> {
        self.reload_inner(config).map(drop)
    }

    /// Records the text of the config file now running: `GET /config` shows it (secrets
    /// redacted) with its md5, and `memroute_config_info{hash}` exports the hash.
    pub fn set_config_source(&self, text: &str) {
        self.admin.set_source(text);
    }

    /// Where `POST /reload` requests arrive: the caller reads the config file, reloads,
    /// and answers each. Without a receiver, `POST /reload` answers 501.
    pub fn reload_requests(&self) -> tokio::sync::mpsc::UnboundedReceiver<ReloadRequest> {
        self.admin.reload_requests()
    }

    /// From now on `/ready` answers 503 (call it when a graceful stop begins, so load
    /// balancers stop sending new clients before the listeners close).
    pub fn set_not_ready(&self) {
        self.admin
            .draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Why `/ready` would answer 503 now; empty when ready.
    pub fn not_ready_reasons(&self) -> Vec<String> {
        self.admin.not_ready_reasons()
    }

    /// Every target `operation` on `key` reaches in the running config, for a client of
    /// the `listener`-th listener.
    pub fn route(
        &self,
        listener: usize,
        operation: memroute_config::Operation,
        key: &[u8],
    ) -> Vec<RouteTarget> {
        route_lookup::route_running(
            &self.controller.current(),
            &self.admin.metrics,
            listener,
            operation,
            key,
        )
    }

    /// [`ProxyHandle::reload`]; answers the restart-only settings the new config changed
    /// and that kept their running values, as `key: why`.
    fn reload_inner(&self, mut config: Config) -> Result<Vec<String>, ProxyError> {
        let _reloading = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.controller.base();
        let mut kept = Vec::new();
        for change in restart_only::changes(&current, &config) {
            let key = change.key;
            tracing::warn!(key, "config reload: {key}: {}", change.message);
            kept.push(format!("{key}: {}", change.message));
        }
        // Certificates first: a bad one fails the reload and leaves everything running.
        let listen_tls =
            transport_setup::reload_certificates(&self.tls_listeners, &current, &config)?;
        config.proxy.listen = current.proxy.listen.clone();
        config.proxy.transport.listen_tls = listen_tls;
        config.proxy.transport.fastopen = current.proxy.transport.fastopen;
        config.proxy.workers = current.proxy.workers;
        config.proxy.backlog = current.proxy.backlog;
        config.proxy.io = current.proxy.io;
        config.admin = restart_only::admin_on_reload(current.admin.as_ref(), config.admin.take());
        let acks = self.controller.apply(config)?;
        let deadline = Instant::now() + RELOAD_ACK_TIMEOUT;
        let mut waiting = self.workers.len();
        while waiting > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if acks.recv_timeout(left).is_err() {
                tracing::warn!(
                    workers = waiting,
                    "config reload: some workers have not switched yet; they will on their next turn"
                );
                break;
            }
            waiting -= 1;
        }
        Ok(kept)
    }

    /// Reads `path` and serves it, unless it holds what the last reload read. Logs the
    /// outcome (every config error with its key path) and counts applied and rejected
    /// reloads. Never changes the running config on failure.
    pub fn reload_file(&self, path: &Path, trigger: ReloadTrigger) -> ReloadOutcome {
        self.reload_state.reload_file(self, path, trigger)
    }

    /// Applied and rejected reloads since start.
    pub fn reload_counts(&self) -> Arc<ReloadCounts> {
        self.reload_state.counts.clone()
    }

    /// Tells reloads what the running config was read from, so an event that leaves the
    /// file as it was (a touch, a ConfigMap resync) is not a reload.
    pub fn loaded_from(&self, bytes: Vec<u8>) {
        // `/config` shows it and `memroute_config_info` exports its hash.
        if let Ok(text) = std::str::from_utf8(&bytes) {
            self.set_config_source(text);
        }
        self.reload_state.loaded_from(bytes);
    }

    /// Waits for every worker thread to exit, then for the control and admin threads.
    pub fn join(self) {
        for worker in self.workers {
            if worker.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
        for helper in self.helpers {
            if helper.join().is_err() {
                tracing::error!("the control or admin thread panicked");
            }
        }
    }
}

impl reload::Reloadable for ProxyHandle {
    fn secrets_changed(&self) -> bool {
        credentials::changed_since(&self.controller.current())
    }

    /// Errors are logged; the running certificate stays.
    fn recheck_certificates(&self) {
        transport_setup::recheck_certificates(&self.tls_listeners);
    }

    fn apply(&self, config: Config) -> Result<Vec<String>, ProxyError> {
        self.reload_inner(config)
    }

    fn set_config_source(&self, text: &str) {
        ProxyHandle::set_config_source(self, text);
    }
}

/// How long `reload` waits for the workers to switch before it returns anyway.
const RELOAD_ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds every listener and starts the workers. Errors (an address in use, a pool
/// that cannot be routed) are returned before any worker starts serving.
pub fn start(config: Config) -> Result<ProxyHandle, ProxyError> {
    let workers = config.proxy.workers.max(1);
    let backlog = effective_backlog(config.proxy.backlog);
    let limits = transport_setup::kernel_limits(&config);
    if !limits.is_empty() {
        tracing::info!("kernel settings: {}", limits.join("; "));
    }
    let (listeners, tls_listeners) = transport_setup::bind_listeners(&config, backlog, workers)?;
    let local_addresses: Vec<String> = listeners[0].iter().map(|(_, l)| l.describe()).collect();
    let shared = Arc::new(stats::Metrics::new(workers));
    // Before the first generation, whose per-worker tables count requests per listener.
    shared.set_listener_names(local_addresses.clone());
    shared.set_tls_listeners(
        tls_listeners
            .iter()
            .map(|l| (l.name.clone(), l.tls.clone()))
            .collect(),
    );
    // Before the admin endpoint, which may render `reload_state.counts`.
    let reload_state = reload::ReloadState::default();
    let admin_listen = config.admin.as_ref().map(|a| a.listen.clone());
    let io = config.proxy.io;
    let (controller, generation_rx, inbox) = controller::Controller::new(config, shared.clone())?;
    shared.set_reload_counts(reload_state.counts.clone());
    let admin = Arc::new(admin::AdminState::new(shared, controller.clone()));
    let (shutdown, shutdown_rx) = watch::channel(false);
    // The control and admin threads end on shutdown too; `join` waits for them.
    let mut helpers = Vec::with_capacity(2);
    let admin_address = match admin_listen {
        Some(listen) => {
            let (address, thread) = admin::start(&listen, admin.clone(), shutdown_rx.clone())?;
            helpers.push(thread);
            Some(address)
        }
        None => None,
    };
    {
        let (controller, shutdown_rx) = (controller.clone(), shutdown_rx.clone());
        let control = std::thread::Builder::new()
            .name("memroute-control".to_string())
            .spawn(move || control_thread::run(controller, inbox, shutdown_rx))
            .map_err(ProxyError::Thread)?;
        helpers.push(control);
    }
    transport_setup::watch_certificates(&tls_listeners, shutdown_rx.clone())?;
    let mut threads = Vec::with_capacity(workers);
    for (index, bound) in listeners.into_iter().enumerate() {
        let worker = worker::Worker {
            index,
            generation: generation_rx.clone(),
            listeners: bound,
            io,
            shared: controller.metrics().clone(),
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
        helpers,
        controller,
        reloading: Mutex::new(()),
        admin,
        reload_state,
        local_addresses,
        admin_address,
        tls_listeners,
    })
}
