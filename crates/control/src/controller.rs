//! The controller: turns a config into the generation the workers serve (a `Plan` handed
//! to memroute-proxy's `Publisher`, which adds the counters and sends it), and keeps what
//! outlives one generation (health, discovered addresses, connectors, resize windows).
//!
//! ```text
//!   start / SIGHUP reload --apply(config)--> Controller --Plan--> Publisher --watch--> workers
//!                                                |
//!                                                +--events--> control thread (control_thread:
//!                                                             probers, DNS watchers; it calls
//!                                                             back rediscovered() and
//!                                                             end_windows())
//! ```
//!
//! Health objects are shared by every worker and live across reloads for servers that
//! stay (same pool, address and health settings), so a reload never forgets that a server
//! is down.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use memroute_backend::{FoundServer, HealthSettings, ServerHealth};
use memroute_config::{Config, DnsDiscovery, ServerConfig};
use memroute_proxy::generation::Generation;
use memroute_proxy::publisher::{Plan, Publisher};
use memroute_proxy::resize_window::Window;
use memroute_proxy::stats::Metrics;
use memroute_proxy::ProxyError;
use memroute_routing::RouteTable;
use tokio::sync::{mpsc, watch};

use crate::connectors::Connectors;
use crate::resize_decision::{self, Decision};

/// What makes two configs' health objects for a server the same one.
#[derive(Debug, Clone, PartialEq)]
struct HealthKey {
    pool: String,
    address: String,
    settings: HealthSettings,
}

/// The servers last found for a DNS pool, and the spec they were found with.
#[derive(Debug, Clone)]
struct Discovered {
    spec: DnsDiscovery,
    servers: Vec<FoundServer>,
    /// When the lookup that found them was made, and the records' TTL: the pool's watcher
    /// starts by waiting out what is left of it.
    found_at: std::time::Instant,
    ttl: Option<std::time::Duration>,
}

/// Messages to the control thread.
#[derive(Debug)]
pub enum Event {
    /// A new generation is being served: reconcile probers and DNS watchers with it.
    Serving(Arc<Generation>),
}

/// Decides generations and owns what outlives one: health, discovered addresses,
/// connectors, resize windows (the counters are the publisher's).
#[derive(Debug)]
pub struct Controller {
    /// The config as the operator wrote it (DNS pools without servers). Its own lock, so
    /// reading it never waits for an apply (which may be doing a DNS lookup).
    base: Mutex<Arc<Config>>,
    /// What outlives a generation. One lock, held for a whole apply: a reload and a DNS
    /// change never build generations at once.
    known: Mutex<Known>,
    publisher: Publisher,
    events: mpsc::UnboundedSender<Event>,
}

/// The state one generation hands to the next, kept by name or address across reloads.
#[derive(Debug, Default)]
struct Known {
    discovered: BTreeMap<String, Discovered>,
    health: Vec<(HealthKey, Arc<ServerHealth>)>,
    connectors: Connectors,
    epochs: HashMap<String, Arc<AtomicU64>>,
    /// The resize windows running now, by pool name.
    windows: HashMap<String, Arc<Window>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing here is left half-written by a panic in a way that matters: take it anyway.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What `Controller::new` hands back: the controller, the receiver the workers start
/// from, and the control thread's inbox.
pub type Started = (
    Arc<Controller>,
    watch::Receiver<Arc<Generation>>,
    ControlInbox,
);

/// The running control thread's receiving end, handed to it once (`control_thread`).
#[derive(Debug)]
pub struct ControlInbox(mpsc::UnboundedReceiver<Event>);

impl ControlInbox {
    /// The next event; `None` once the controller is gone.
    pub async fn recv(&mut self) -> Option<Event> {
        self.0.recv().await
    }
}

impl Controller {
    /// Builds the first generation of `config`. Returns the controller, the receiver the
    /// workers start from, and the control thread's inbox.
    pub fn new(config: Config, shared: Arc<Metrics>) -> Result<Started, ProxyError> {
        let (events, inbox) = mpsc::unbounded_channel();
        let config = Arc::new(config);
        // What the first apply replaces (its resize windows compare against it): the
        // config's routes, no pool.
        let mut placeholder = Plan::bare((*config).clone())?;
        placeholder.config = Arc::new(Config {
            pools: BTreeMap::new(),
            routes: BTreeMap::new(),
            ..(*config).clone()
        });
        // Never looser than the config: a client served by this generation logs in.
        placeholder.client_logins = crate::credentials::listener_authfiles(&config)?;
        let (publisher, receiver) = Publisher::new(shared, placeholder);
        let controller = Arc::new(Controller {
            base: Mutex::new(config.clone()),
            known: Mutex::new(Known::default()),
            publisher,
            events,
        });
        // Nobody waits for the workers to acknowledge the first generation.
        controller.apply((*config).clone())?;
        Ok((controller, receiver, ControlInbox(inbox)))
    }

    /// The generation being served now (DNS pools with their servers).
    pub fn current(&self) -> Arc<Generation> {
        self.publisher.current()
    }

    /// The registry the workers count into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.publisher.metrics()
    }

    /// The config the operator gave last (DNS pools without servers).
    pub fn base(&self) -> Arc<Config> {
        lock(&self.base).clone()
    }

    /// Serves `config` from now on: resolves DNS pools not known yet, builds the route table,
    /// the health table and the connectors, decides the resize windows, and hands the plan to
    /// the publisher. Returns the receiver of the workers' acknowledgements.
    pub fn apply(&self, config: Config) -> Result<std::sync::mpsc::Receiver<usize>, ProxyError> {
        self.apply_locked(&mut lock(&self.known), config)
    }

    /// apply() for a caller that holds `known`.
    fn apply_locked(
        &self,
        known: &mut Known,
        config: Config,
    ) -> Result<std::sync::mpsc::Receiver<usize>, ProxyError> {
        // Read first: an authfile that cannot be used fails the reload before anything
        // changes.
        let client_logins = crate::credentials::listener_authfiles(&config)?;
        let effective = with_discovered_servers(&mut known.discovered, &config);
        let routes = Arc::new(RouteTable::build(&effective.routing_spec())?);
        let effective = Arc::new(effective);
        let connectors = known
            .connectors
            .for_config(&routes.pool_names, &effective)?;
        let (health, pool_epochs) = health_for(known, &routes, &effective);
        let windows = self.windows_for(known, &routes, &effective);
        let plan = Plan {
            config: effective,
            routes,
            health,
            connectors,
            pool_epochs,
            windows,
            client_logins,
        };
        *lock(&self.base) = Arc::new(config);
        let (generation, acks) = self.publisher.publish(plan);
        let _ = self.events.send(Event::Serving(generation));
        Ok(acks)
    }

    /// Per pool id of `routes`: the resize window the next generation carries (a pool
    /// whose placement changed starts one from the generation served now; one whose
    /// placement did not keeps its running window until it ends). Logs every window's
    /// start and end.
    fn windows_for(
        &self,
        known: &mut Known,
        routes: &RouteTable,
        config: &Config,
    ) -> Vec<Option<Arc<Window>>> {
        let before = self.current();
        let now = Instant::now();
        let mut running = HashMap::new();
        let table = routes
            .pool_names
            .iter()
            .map(|name| {
                let after = config.pools.get(name)?;
                let before_pool = before.config.pools.get(name);
                let ends = known.windows.get(name).map(|w| w.ends);
                let window = match resize_decision::decide(before_pool, after, ends, now) {
                    Decision::None => return None,
                    Decision::Keep => known.windows.get(name)?.clone(),
                    Decision::Start => {
                        let ends = resize_decision::end_of(after, now);
                        let window = self.publisher.keep_placement(name, ends)?;
                        let placement = &routes.placements[routes
                            .pool_names
                            .iter()
                            .position(|n| n == name)?];
                        let moved = resize_decision::moved_share(&window.placement, placement);
                        tracing::info!(
                            pool = %name,
                            servers_before = window.servers.len(),
                            servers_after = after.servers.len(),
                            keys_moved = format!("{:.1}%", moved * 100.0),
                            window = ?after.resize_window,
                            "resize window started: keys whose owner changed are looked for on their old owner until it ends"
                        );
                        Arc::new(window)
                    }
                };
                running.insert(name.clone(), window.clone());
                Some(window)
            })
            .collect();
        for name in known.windows.keys() {
            if !running.contains_key(name) {
                tracing::info!(pool = %name, "resize window ended: the previous servers are no longer asked");
            }
        }
        known.windows = running;
        table
    }

    /// Publishes a generation without the windows that have ended, if any has.
    pub fn end_windows(&self) {
        let mut known = lock(&self.known);
        let now = Instant::now();
        if !known.windows.values().any(|w| w.ends <= now) {
            return;
        }
        let base = (*self.base()).clone();
        if let Err(error) = self.apply_locked(&mut known, base) {
            tracing::error!(%error, "cannot end a resize window; keeping the running config");
        }
    }

    /// When the first window of the generation served now ends (read from the generation,
    /// not `known`: an apply holds that during DNS lookups).
    pub fn next_window_end(&self) -> Option<Instant> {
        let generation = self.current();
        generation.windows.iter().flatten().map(|w| w.ends).min()
    }

    /// How long a new watcher of `pool` waits before its first lookup: what is left of the
    /// last lookup's refresh (or TTL); at most the TTL floor when the pool has no servers
    /// yet (its lookup at start failed), so an empty pool is retried soon.
    pub fn first_wait(&self, pool: &str, spec: &DnsDiscovery) -> std::time::Duration {
        match lock(&self.known)
            .discovered
            .get(pool)
            .filter(|d| &d.spec == spec)
        {
            Some(known) => memroute_backend::next_refresh(spec, known.ttl)
                .saturating_sub(known.found_at.elapsed()),
            None => spec.refresh.min(memroute_backend::MIN_TTL_REFRESH),
        }
    }

    /// Records a DNS pool's new server set and serves it. Called by the DNS watchers.
    pub fn rediscovered(
        &self,
        pool: &str,
        spec: &DnsDiscovery,
        servers: Vec<FoundServer>,
        ttl: Option<std::time::Duration>,
    ) {
        // `known` is held from before the base config is read until the generation is sent: a reload
        // applied meanwhile would otherwise be undone by this older base.
        let mut known = lock(&self.known);
        {
            let discovered = &mut known.discovered;
            if let Some(same) = discovered
                .get_mut(pool)
                .filter(|d| &d.spec == spec && d.servers == servers)
            {
                same.found_at = std::time::Instant::now();
                same.ttl = ttl;
                return;
            }
            tracing::info!(pool, host = %spec.host, servers = ?shown(&servers), "discovered servers changed");
            discovered.insert(
                pool.to_string(),
                Discovered {
                    spec: spec.clone(),
                    servers,
                    found_at: std::time::Instant::now(),
                    ttl,
                },
            );
        }
        let base = (*self.base()).clone();
        if let Err(error) = self.apply_locked(&mut known, base) {
            tracing::error!(pool, %error, "cannot serve the discovered servers; keeping the running config");
        }
    }
}

/// `config` with every DNS pool's servers filled in: the last addresses found for the
/// same spec, else a lookup now (a failed one leaves the pool empty until a refresh
/// finds servers).
fn with_discovered_servers(
    discovered: &mut BTreeMap<String, Discovered>,
    config: &Config,
) -> Config {
    let mut effective = config.clone();
    discovered.retain(|pool, d| {
        config
            .pools
            .get(pool)
            .is_some_and(|p| p.discovery.as_ref() == Some(&d.spec))
    });
    for (name, pool) in effective.pools.iter_mut() {
        let Some(spec) = &pool.discovery else {
            continue;
        };
        let servers = match discovered.get(name) {
            Some(known) => known.servers.clone(),
            None => match memroute_backend::lookup_blocking(spec, &config.discovery) {
                Ok(found) => {
                    tracing::info!(pool = %name, host = %spec.host, servers = ?shown(&found.servers), ttl = ?found.ttl, "discovered servers");
                    discovered.insert(
                        name.clone(),
                        Discovered {
                            spec: spec.clone(),
                            servers: found.servers.clone(),
                            found_at: std::time::Instant::now(),
                            ttl: found.ttl,
                        },
                    );
                    found.servers
                }
                Err(error) => {
                    tracing::warn!(pool = %name, host = %spec.host, %error, "discovery lookup failed; the pool has no servers until a lookup succeeds");
                    Vec::new()
                }
            },
        };
        pool.servers = servers.iter().map(server_of).collect();
    }
    effective
}

/// One health object per server, reused for servers that stay with the same settings.
fn health_for(
    known: &mut Known,
    routes: &RouteTable,
    config: &Config,
) -> (Vec<Vec<Arc<ServerHealth>>>, Vec<Arc<AtomicU64>>) {
    let Known {
        health: known,
        epochs,
        ..
    } = known;
    let mut next = Vec::new();
    let mut table = Vec::with_capacity(routes.pool_names.len());
    let mut pool_epochs = Vec::with_capacity(routes.pool_names.len());
    for name in &routes.pool_names {
        let Some(pool) = config.pools.get(name) else {
            table.push(Vec::new());
            pool_epochs.push(Arc::default());
            continue;
        };
        let epoch = epochs.entry(name.clone()).or_default().clone();
        let settings = HealthSettings::of_pool(pool);
        let servers = pool
            .servers
            .iter()
            .map(|server| {
                let key = HealthKey {
                    pool: name.clone(),
                    address: server.address.clone(),
                    settings: settings.clone(),
                };
                let health = known
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, h)| h.clone())
                    .unwrap_or_else(|| {
                        ServerHealth::new(
                            Arc::from(name.as_str()),
                            Arc::from(server.address.as_str()),
                            settings.clone(),
                            epoch.clone(),
                        )
                    });
                next.push((key, health.clone()));
                health
            })
            .collect();
        table.push(servers);
        pool_epochs.push(epoch);
    }
    *known = next;
    epochs.retain(|name, _| config.pools.contains_key(name));
    (table, pool_epochs)
}

/// A discovered server as a pool's server: `ip:port` (IPv6 in brackets) is its address; its
/// identity on the ring is the SRV target's name when it has one (a pod's name outlives
/// its IP), else the address, so every instance orders and hashes them the same.
fn server_of(found: &FoundServer) -> ServerConfig {
    ServerConfig {
        address: found.address.to_string(),
        weight: 1,
        name: found.name.clone(),
    }
}

/// Servers as log lines show them: `ip:port` or `name=ip:port`.
fn shown(servers: &[FoundServer]) -> Vec<String> {
    servers
        .iter()
        .map(|s| match &s.name {
            Some(name) => format!("{name}={}", s.address),
            None => s.address.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use memroute_proxy::stats::Metrics;

    use super::Controller;

    fn config(servers: &[u16], window: &str) -> memroute_config::Config {
        let servers: Vec<String> = servers
            .iter()
            .map(|port| format!("\"127.0.0.1:{port}\""))
            .collect();
        let toml = format!(
            "[proxy]\nlisten = [\"127.0.0.1:1\"]\nworkers = 1\nroute = \"main\"\n\
             [pools.main]\nservers = [{}]\nresize_window = \"{window}\"\n",
            servers.join(", ")
        );
        memroute_config::parse(&toml).expect("test config")
    }

    /// The old servers' addresses of the window the generation served now carries.
    fn window_servers(controller: &Controller) -> Option<Vec<String>> {
        let generation = controller.current();
        let window = generation.windows.first()?.as_ref()?;
        Some(
            window
                .config
                .servers
                .iter()
                .map(|s| s.address.clone())
                .collect(),
        )
    }

    #[test]
    fn windows_start_on_a_change_carry_on_without_one_and_restart_from_the_last_placement() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let shared = Arc::new(Metrics::new(1));
            let (controller, _generations, _inbox) =
                Controller::new(config(&[1, 2, 3, 4], "10m"), shared).expect("controller");
            assert_eq!(
                window_servers(&controller),
                None,
                "nothing before the start"
            );

            controller
                .apply(config(&[1, 2, 3, 4, 5], "10m"))
                .expect("grow");
            let four: Vec<String> = (1..=4).map(|p| format!("127.0.0.1:{p}")).collect();
            assert_eq!(window_servers(&controller), Some(four.clone()));
            let first = controller.current().windows[0].clone().expect("a window");

            // A reload that moves no key keeps the window as it is.
            controller
                .apply(config(&[1, 2, 3, 4, 5], "10m"))
                .expect("same");
            let kept = controller.current().windows[0].clone().expect("kept");
            assert!(Arc::ptr_eq(&first, &kept));

            // A second change starts from the placement just before it (five servers).
            controller
                .apply(config(&[1, 2, 3, 4, 5, 6], "10m"))
                .expect("grow again");
            let five: Vec<String> = (1..=5).map(|p| format!("127.0.0.1:{p}")).collect();
            assert_eq!(window_servers(&controller), Some(five));

            // "0s" ends it; ending a window publishes a generation without it.
            controller
                .apply(config(&[1, 2, 3, 4, 5, 6], "0s"))
                .expect("off");
            assert_eq!(window_servers(&controller), None);
            controller.apply(config(&[1, 2, 3], "1ms")).expect("shrink");
            let ends = controller.next_window_end().expect("a window");
            // Past its end (a known instant, not a guess), the window is ended.
            std::thread::sleep(ends.saturating_duration_since(std::time::Instant::now()));
            controller.end_windows();
            assert_eq!(window_servers(&controller), None);
        });
    }
}
