//! The control thread: its own current-thread runtime, beside the workers, running what
//! keeps the served generation true to the world and is on no request's path.
//!
//! ```text
//!   Controller --events (a generation is served)--> serve
//!                                                     probers: one per server, `version`
//!                                                              probes while it is down
//!                                                     DNS watchers: one per DNS pool; a
//!                                                       changed address set calls
//!                                                       Controller::rediscovered (apply)
//!                                                     resize windows: at the first one's
//!                                                       end, Controller::end_windows
//! ```
use std::sync::Arc;
use std::time::Instant;

use memroute_backend::ServerHealth;
use memroute_config::{DiscoveryConfig, DnsDiscovery};
use memroute_net::Connector;
use memroute_proxy::generation::Generation;
use tokio::sync::watch;

use crate::controller::{ControlInbox, Controller, Event};

/// A DNS watcher's identity: pool name, DNS spec and the `[discovery]` settings.
type WatchKey = (String, DnsDiscovery, DiscoveryConfig);

/// Runs the control thread until `shutdown` turns true.
pub fn run(controller: Arc<Controller>, inbox: ControlInbox, shutdown: watch::Receiver<bool>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot build the control runtime: no health probes or DNS refresh");
            return;
        }
    };
    runtime.block_on(serve(controller, inbox, shutdown));
}

/// One prober per server (health and connector: a new connector, e.g. new TLS settings,
/// gets a new prober).
type Prober = (
    Arc<ServerHealth>,
    Arc<Connector>,
    tokio::task::JoinHandle<()>,
);

async fn serve(
    controller: Arc<Controller>,
    mut inbox: ControlInbox,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut probers: Vec<Prober> = Vec::new();
    let mut watchers: Vec<(WatchKey, tokio::task::JoinHandle<()>)> = Vec::new();
    // When the last attempt to end a window was made: a failed one is retried a second
    // later, not in a loop.
    let mut ending_tried: Option<Instant> = None;
    loop {
        let window_end = controller.next_window_end().map(|end| match ending_tried {
            Some(tried) => end.max(tried + std::time::Duration::from_secs(1)),
            None => end,
        });
        let event = tokio::select! {
            event = inbox.recv() => event,
            _ = shutdown.changed() => None,
            _ = until(window_end) => {
                ending_tried = Some(Instant::now());
                let controller = controller.clone();
                // apply() builds rings and takes locks: off the control runtime's thread.
                let _ = tokio::task::spawn_blocking(move || controller.end_windows()).await;
                continue;
            }
        };
        let Some(Event::Serving(generation)) = event else {
            break;
        };
        probe(&mut probers, &generation);
        watch_pools(&mut watchers, &controller);
    }
    for (_, _, task) in probers {
        task.abort();
    }
    for (_, task) in watchers {
        task.abort();
    }
}

/// Probers: one per server of `generation`; stops those of servers that left. A resize
/// window's servers that left are still read from: probed too.
fn probe(probers: &mut Vec<Prober>, generation: &Generation) {
    let current: Vec<(&Arc<ServerHealth>, &Arc<Connector>)> = generation
        .health
        .iter()
        .zip(&generation.connectors)
        .flat_map(|(h, c)| h.iter().zip(c))
        .chain(
            generation
                .windows
                .iter()
                .flatten()
                .flat_map(|w| w.servers.iter().map(|s| (&s.health, &s.connector))),
        )
        .collect();
    probers.retain(|(health, connector, task)| {
        let keep = current
            .iter()
            .any(|(h, c)| Arc::ptr_eq(h, health) && Arc::ptr_eq(c, connector));
        if !keep {
            task.abort();
        }
        keep
    });
    for (health, connector) in current {
        if !probers
            .iter()
            .any(|(h, c, _)| Arc::ptr_eq(h, health) && Arc::ptr_eq(c, connector))
        {
            let task = tokio::spawn(memroute_backend::run_prober(
                health.clone(),
                connector.clone(),
            ));
            probers.push((health.clone(), connector.clone(), task));
        }
    }
}

/// DNS watchers: one per DNS pool of the base config (by name, spec and hosts file).
fn watch_pools(
    watchers: &mut Vec<(WatchKey, tokio::task::JoinHandle<()>)>,
    controller: &Arc<Controller>,
) {
    let base = controller.base();
    let wanted: Vec<WatchKey> = base
        .pools
        .iter()
        .filter_map(|(name, pool)| {
            pool.discovery
                .clone()
                .map(|spec| (name.clone(), spec, base.discovery.clone()))
        })
        .collect();
    watchers.retain(|(key, task)| {
        let keep = wanted.contains(key);
        if !keep {
            task.abort();
        }
        keep
    });
    for key in wanted {
        if !watchers.iter().any(|(k, _)| *k == key) {
            let task = tokio::spawn(watch_dns(controller.clone(), key.clone()));
            watchers.push((key, task));
        }
    }
}

/// Resolves at `end`, or never.
async fn until(end: Option<Instant>) {
    match end {
        Some(end) => tokio::time::sleep_until(end.into()).await,
        None => std::future::pending().await,
    }
}

/// Looks one DNS pool up again when its `refresh` or its records' TTL says so (whichever
/// is sooner, see `next_refresh`); a changed server set is served at once, a failed lookup
/// keeps the last good set and is retried after `refresh`.
async fn watch_dns(controller: Arc<Controller>, (pool, spec, settings): WatchKey) {
    // The first lookup was made when the generation was built: wait out what it left.
    let mut wait = controller.first_wait(&pool, &spec);
    loop {
        tokio::time::sleep(wait).await;
        match memroute_backend::lookup(&spec, &settings).await {
            Ok(found) => {
                wait = memroute_backend::next_refresh(&spec, found.ttl);
                controller.metrics().count_lookup(&pool, true);
                let controller = controller.clone();
                let (pool, spec) = (pool.clone(), spec.clone());
                // apply() builds rings and takes locks: off the control runtime's thread.
                let _ = tokio::task::spawn_blocking(move || {
                    controller.rediscovered(&pool, &spec, found.servers, found.ttl)
                })
                .await;
            }
            Err(error) => {
                wait = memroute_backend::next_refresh(&spec, None);
                controller.metrics().count_lookup(&pool, false);
                tracing::warn!(pool = %pool, host = %spec.host, %error, "discovery lookup failed; keeping the last servers found");
            }
        }
    }
}
