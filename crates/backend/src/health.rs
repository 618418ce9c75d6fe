//! One server's health, shared by every worker thread, and the prober that brings a
//! down server back.
//!
//! The hot path only reads atomics: `is_down()` before a request is queued,
//! `record_success()` after each reply (a load, and a store only when failures were
//! counted). Transitions are rare and serialised by the `watch` channel's lock, which
//! also wakes whoever waits for one (the prober for down, reconnecting connections for up).
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use memroute_net::Connector;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::hello::{Greeting, Refusal};

/// How a pool's servers are judged and probed; built from the pool's config.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSettings {
    /// Consecutive failures that mark a server down.
    pub failure_limit: u32,
    /// First probe this long after the server was marked down.
    pub probe_interval: Duration,
    /// Probe intervals grow up to this.
    pub probe_interval_max: Duration,
    pub connect_timeout: Duration,
    /// A probe's `version` must be answered within this.
    pub timeout: Duration,
}

impl HealthSettings {
    /// The health settings of `pool`'s servers (the controller's health objects and a
    /// worker's standalone ones read the same answer).
    pub fn of_pool(pool: &memroute_config::PoolConfig) -> HealthSettings {
        HealthSettings {
            failure_limit: pool.failure_limit.max(1),
            probe_interval: pool.probe_interval,
            probe_interval_max: pool.probe_interval_max,
            connect_timeout: pool.connect_timeout,
            timeout: pool.timeout,
        }
    }
}

/// What changes on a transition; read rarely (reason for an error text, wait_* calls).
#[derive(Debug, Clone)]
struct Transition {
    down: bool,
    reason: Arc<str>,
    since: Instant,
}

/// One server's health, shared by every worker (Send + Sync, atomics on the hot path).
#[derive(Debug)]
pub struct ServerHealth {
    pool: Arc<str>,
    address: Arc<str>,
    settings: HealthSettings,
    pool_epoch: Arc<AtomicU64>,
    /// Mirrors `state.down` so the hot path needs no lock; written only under the
    /// `state` lock, so the two never disagree for longer than one transition.
    down: AtomicBool,
    failures: AtomicU32,
    state: watch::Sender<Transition>,
    marked_down_total: AtomicU64,
    marked_up_total: AtomicU64,
    /// Connections and probes the server would not let in: it wants a login memroute
    /// lacks, or refused memroute's.
    login_failures_total: AtomicU64,
    /// Connections to this server open now, over every worker (readiness, metrics).
    open_connections: AtomicU64,
    /// The last failure and when it happened (the admin panel shows it). Written only on
    /// failures, never on the request path of a healthy server.
    last_failure: Mutex<Option<(SystemTime, Arc<str>)>>,
}

impl ServerHealth {
    /// `pool_epoch` is bumped (fetch_add) on every down/up transition of this server, so a
    /// worker can notice cheaply (one Relaxed load per request) that its pool's live set changed.
    pub fn new(
        pool: Arc<str>,
        address: Arc<str>,
        settings: HealthSettings,
        pool_epoch: Arc<AtomicU64>,
    ) -> Arc<ServerHealth> {
        let (state, _) = watch::channel(Transition {
            down: false,
            reason: Arc::from(""),
            since: Instant::now(),
        });
        Arc::new(ServerHealth {
            pool,
            address,
            settings,
            pool_epoch,
            down: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            state,
            marked_down_total: AtomicU64::new(0),
            login_failures_total: AtomicU64::new(0),
            marked_up_total: AtomicU64::new(0),
            open_connections: AtomicU64::new(0),
            last_failure: Mutex::new(None),
        })
    }

    pub fn pool(&self) -> &Arc<str> {
        &self.pool
    }

    pub fn address(&self) -> &Arc<str> {
        &self.address
    }

    pub fn settings(&self) -> &HealthSettings {
        &self.settings
    }

    /// Cheap: one atomic load.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// Why the server was last marked down (for the SERVER_ERROR text).
    pub fn down_reason(&self) -> Arc<str> {
        self.state.borrow().reason.clone()
    }

    /// Failures counted since the last success (or since the server came back up).
    pub fn consecutive_failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Resets the consecutive-failure count. Called for every reply, from every worker:
    /// it writes only when there is something to reset, so a healthy server's cache line
    /// stays shared rather than bouncing between cores.
    pub fn record_success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Counts one failure; reaching `failure_limit` marks the server down.
    pub fn record_failure(&self, reason: &str) {
        self.remember_failure(reason);
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if failures >= self.settings.failure_limit.max(1) {
            self.mark_down(reason);
        }
    }

    /// Marks the server down and wakes the prober; returns whether it was up before.
    pub fn mark_down(&self, reason: &str) -> bool {
        self.remember_failure(reason);
        let changed = self.state.send_if_modified(|state| {
            if state.down {
                return false;
            }
            state.down = true;
            state.reason = Arc::from(reason);
            state.since = Instant::now();
            self.down.store(true, Ordering::Release);
            true
        });
        if changed {
            self.marked_down_total.fetch_add(1, Ordering::Relaxed);
            // After the store above: a worker that sees the new epoch sees the server down.
            self.pool_epoch.fetch_add(1, Ordering::Release);
            tracing::warn!(pool = %self.pool, server = %self.address, reason, "server marked down");
        }
        changed
    }

    /// The server would not let a connection or a probe in (`hello`): it must serve nobody
    /// until it does, so it is marked down at once with the reason. Returns whether it was
    /// up before.
    pub fn login_refused(&self, reason: &str) -> bool {
        self.login_failures_total.fetch_add(1, Ordering::Relaxed);
        self.mark_down(reason)
    }

    /// Connections and probes refused at login since start.
    pub fn login_failures_total(&self) -> u64 {
        self.login_failures_total.load(Ordering::Relaxed)
    }

    fn remember_failure(&self, reason: &str) {
        let mut last = self.last_failure.lock().unwrap_or_else(|e| e.into_inner());
        // One allocation per distinct reason, not per failure.
        let reason = match &*last {
            Some((_, previous)) if &**previous == reason => previous.clone(),
            _ => Arc::from(reason),
        };
        *last = Some((SystemTime::now(), reason));
    }

    /// The last failure (of a request, a connect or a probe) and when it happened.
    pub fn last_failure(&self) -> Option<(SystemTime, Arc<str>)> {
        self.last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Marks the server up and wakes connections waiting to reconnect; returns whether it
    /// was down before.
    pub fn mark_up(&self) -> bool {
        let mut down_for = Duration::ZERO;
        let changed = self.state.send_if_modified(|state| {
            if !state.down {
                return false;
            }
            down_for = state.since.elapsed();
            state.down = false;
            state.since = Instant::now();
            // A server just back starts with a clean slate, not one failure from the limit.
            self.failures.store(0, Ordering::Relaxed);
            self.down.store(false, Ordering::Release);
            true
        });
        if changed {
            self.marked_up_total.fetch_add(1, Ordering::Relaxed);
            self.pool_epoch.fetch_add(1, Ordering::Release);
            tracing::info!(pool = %self.pool, server = %self.address, down_for = ?down_for, "server back up");
        }
        changed
    }

    /// Returns when the server is down (at once if it already is).
    pub async fn wait_down(&self) {
        let mut changes = self.state.subscribe();
        // Err only when the sender is gone, and `self` owns it.
        let _ = changes.wait_for(|state| state.down).await;
    }

    /// Returns when the server is up (at once if it already is).
    pub async fn wait_up(&self) {
        let mut changes = self.state.subscribe();
        let _ = changes.wait_for(|state| !state.down).await;
    }

    /// Returns at the next time the server comes back up after being down: at once if it
    /// is down now and comes up, or after a whole down-then-up cycle if it is up now.
    ///
    /// The state is noted when this is called, not when it is first polled: a server
    /// marked up in between (a quick probe) still counts as recovered.
    pub(crate) fn wait_recovered(&self) -> impl std::future::Future<Output = ()> + '_ {
        let mut changes = self.state.subscribe();
        let down_now = changes.borrow_and_update().down;
        async move {
            if !down_now {
                let _ = changes.wait_for(|state| state.down).await;
            }
            let _ = changes.wait_for(|state| !state.down).await;
        }
    }

    pub fn marked_down_total(&self) -> u64 {
        self.marked_down_total.load(Ordering::Relaxed)
    }

    pub fn marked_up_total(&self) -> u64 {
        self.marked_up_total.load(Ordering::Relaxed)
    }

    /// A connection to this server was established (it stays counted until closed).
    pub fn connection_opened(&self) {
        self.open_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection counted by `connection_opened` closed.
    pub fn connection_closed(&self) {
        let _ = self
            .open_connections
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Connections to this server open now, over every worker.
    pub fn open_connections(&self) -> u64 {
        self.open_connections.load(Ordering::Relaxed)
    }
}

/// Each failed probe waits this much longer than the last.
const PROBE_GROWTH: f64 = 1.5;
/// ± this fraction of random jitter, so proxies that saw a server go down together do
/// not probe it in lockstep.
const PROBE_JITTER: f64 = 0.2;

/// The probe schedule, pure so it can be tested: from the current (unjittered) interval,
/// returns the next unjittered interval (`current` x1.5, at most `max`) and the wait to
/// use for it (that, ±20% by `random_unit` in [0, 1), still at most `max`).
pub(crate) fn next_probe_interval(
    current: Duration,
    max: Duration,
    random_unit: f64,
) -> (Duration, Duration) {
    let next = current.mul_f64(PROBE_GROWTH).min(max);
    let factor = 1.0 - PROBE_JITTER + 2.0 * PROBE_JITTER * random_unit.clamp(0.0, 1.0);
    (next, next.mul_f64(factor).min(max))
}

/// Runs until aborted: whenever `health` is down, probes it (connect within
/// connect_timeout, send "version\r\n", expect a line starting "VERSION " within timeout)
/// first after probe_interval, then at intervals growing x1.5 with ±20% random jitter up
/// to probe_interval_max; a successful probe marks it up. Runs on any tokio runtime (the
/// proxy spawns it on a control thread). Logs each failed probe at debug.
pub async fn run_prober(health: Arc<ServerHealth>, connector: Arc<Connector>) {
    let settings = health.settings().clone();
    let max = settings.probe_interval_max.max(settings.probe_interval);
    loop {
        health.wait_down().await;
        let mut interval = settings.probe_interval;
        let mut wait = interval;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                // Something else (a reload, an operator) brought it back: stop probing.
                _ = health.wait_up() => break,
            }
            match probe(&connector, &health).await {
                Ok(()) => {
                    health.mark_up();
                    break;
                }
                Err(reason) => {
                    tracing::debug!(
                        pool = %health.pool,
                        server = %health.address,
                        %reason,
                        "probe failed"
                    );
                }
            }
            if !health.is_down() {
                break;
            }
            (interval, wait) = next_probe_interval(interval, max, rand::random::<f64>());
        }
    }
}

/// One probe: a fresh connection greeted as every connection is (`version`, and the
/// pool's login when memcached wants one), and a `VERSION ` line or a login taken back in
/// time. Through the server's connector: a TLS server is probed over TLS (resuming the
/// connections' session), so a certificate that no longer verifies keeps it down, and a
/// login that memcached refuses keeps it down too.
async fn probe(connector: &Connector, health: &ServerHealth) -> Result<(), String> {
    let settings = health.settings();
    let opened = crate::hello::open(connector, settings.connect_timeout, settings.timeout).await;
    match opened {
        Ok((_, Greeting::LoggedIn)) => Ok(()),
        Ok((_, Greeting::Answered(line))) if line.starts_with("VERSION ") => Ok(()),
        Ok((_, Greeting::Answered(line))) => Err(format!("unexpected reply {line:?}")),
        Err(Refusal::Connect(error)) => Err(error.to_string()),
        Err(Refusal::Login(reason)) => {
            // Counted, and the reason becomes the server's last failure: a probe that
            // still cannot log in keeps the panel saying why.
            health.login_refused(&reason);
            Err(reason)
        }
        Err(Refusal::Exchange(reason)) => Err(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn settings(failure_limit: u32) -> HealthSettings {
        HealthSettings {
            failure_limit,
            probe_interval: Duration::from_millis(10),
            probe_interval_max: Duration::from_millis(40),
            connect_timeout: Duration::from_millis(500),
            timeout: Duration::from_millis(50),
        }
    }

    fn health(address: &str, failure_limit: u32) -> (Arc<ServerHealth>, Arc<AtomicU64>) {
        let epoch = Arc::new(AtomicU64::new(0));
        let health = ServerHealth::new(
            Arc::from("main"),
            Arc::from(address),
            settings(failure_limit),
            epoch.clone(),
        );
        (health, epoch)
    }

    /// Bounds every wait in these tests: a hang is a failure, not a stuck CI job.
    async fn within<F: std::future::Future>(future: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(10), future)
            .await
            .expect("timed out waiting")
    }

    #[test]
    fn consecutive_failures_reach_the_limit() {
        let (health, epoch) = health("127.0.0.1:1", 3);
        health.record_failure("timed out");
        health.record_failure("timed out");
        assert!(!health.is_down());
        assert_eq!(epoch.load(Ordering::Relaxed), 0);
        health.record_failure("timed out");
        assert!(health.is_down());
        assert_eq!(&*health.down_reason(), "timed out");
        assert_eq!(health.marked_down_total(), 1);
        assert_eq!(epoch.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn success_resets_the_count() {
        let (health, _) = health("127.0.0.1:1", 3);
        health.record_failure("timed out");
        health.record_failure("timed out");
        health.record_success();
        assert_eq!(health.consecutive_failures(), 0);
        health.record_failure("timed out");
        health.record_failure("timed out");
        assert!(!health.is_down());
        health.record_failure("timed out");
        assert!(health.is_down());
    }

    #[test]
    fn transitions_count_once_and_bump_the_epoch() {
        let (health, epoch) = health("127.0.0.1:1", 3);
        assert!(!health.mark_up(), "already up");
        assert!(health.mark_down("connection refused"));
        assert!(!health.mark_down("again"), "already down");
        assert_eq!(&*health.down_reason(), "connection refused");
        assert_eq!(health.marked_down_total(), 1);
        assert_eq!(epoch.load(Ordering::Relaxed), 1);
        health.record_failure("timed out");
        assert!(health.mark_up());
        assert!(!health.mark_up());
        assert!(!health.is_down());
        assert_eq!(health.consecutive_failures(), 0, "up starts clean");
        assert_eq!(health.marked_up_total(), 1);
        assert_eq!(epoch.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn servers_of_one_pool_share_its_epoch() {
        let epoch = Arc::new(AtomicU64::new(0));
        let a = ServerHealth::new(
            Arc::from("main"),
            Arc::from("a:1"),
            settings(1),
            epoch.clone(),
        );
        let b = ServerHealth::new(
            Arc::from("main"),
            Arc::from("b:1"),
            settings(1),
            epoch.clone(),
        );
        a.record_failure("x");
        b.record_failure("x");
        a.mark_up();
        assert_eq!(epoch.load(Ordering::Relaxed), 3);
    }

    /// Polls `future` once and asserts it is still pending (so it is now waiting).
    async fn assert_pending<F: std::future::Future + Unpin>(future: &mut F) {
        tokio::select! {
            biased;
            _ = future => panic!("finished early"),
            _ = std::future::ready(()) => {}
        }
    }

    #[tokio::test]
    async fn waiters_wake_on_transitions() {
        let (health, _) = health("127.0.0.1:1", 1);
        within(health.wait_up()).await;
        let down = health.wait_down();
        tokio::pin!(down);
        assert_pending(&mut down).await;
        health.mark_down("x");
        within(down).await;
        within(health.wait_down()).await;
        // Down now: recovered means the next up.
        let recovered = health.wait_recovered();
        tokio::pin!(recovered);
        assert_pending(&mut recovered).await;
        health.mark_up();
        within(recovered).await;
        // Up now: recovered needs a whole down-then-up cycle.
        let recovered = health.wait_recovered();
        tokio::pin!(recovered);
        assert_pending(&mut recovered).await;
        health.mark_down("x");
        assert_pending(&mut recovered).await;
        health.mark_up();
        within(recovered).await;
    }

    #[test]
    fn probe_intervals_grow_with_bounded_jitter() {
        let ms = Duration::from_millis;
        let max = ms(30_000);
        // Middle of the jitter range: exactly x1.5.
        assert_eq!(
            next_probe_interval(ms(1000), max, 0.5),
            (ms(1500), ms(1500))
        );
        // Extremes: -20% and (just under) +20%.
        assert_eq!(
            next_probe_interval(ms(1000), max, 0.0),
            (ms(1500), ms(1200))
        );
        let (_, high) = next_probe_interval(ms(1000), max, 0.999_999);
        assert!(high > ms(1799) && high <= ms(1800), "{high:?}");
        // Capped at max, before and after jitter.
        assert_eq!(
            next_probe_interval(ms(25_000), max, 1.0),
            (ms(30_000), ms(30_000))
        );
        assert_eq!(
            next_probe_interval(ms(30_000), max, 0.0),
            (ms(30_000), ms(24_000))
        );
        // Out-of-range randomness cannot escape the bounds.
        assert_eq!(next_probe_interval(ms(1000), max, 7.0).1, ms(1800));
        // The unjittered interval grows monotonically to max whatever the jitter.
        let mut current = ms(1000);
        for step in 0..20 {
            let (next, wait) = next_probe_interval(current, max, (step % 3) as f64 / 3.0);
            assert!(next >= current && next <= max);
            assert!(wait <= max && wait >= next.mul_f64(0.8));
            current = next;
        }
        assert_eq!(current, max);
    }

    /// A listener that answers every connection's first line with `reply` (None: never
    /// answers, but holds the connection open). Each accepted connection is reported on
    /// the returned channel, so tests can count probes instead of sleeping.
    async fn fake_server(
        reply: Option<&'static [u8]>,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("local addr").to_string();
        let (accepted, accepts) = tokio::sync::mpsc::unbounded_channel();
        // Tasks on the test's runtime: they end with it.
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let _ = accepted.send(());
                tokio::spawn(async move {
                    let mut line = [0u8; 64];
                    let _ = stream.read(&mut line).await;
                    match reply {
                        Some(reply) => {
                            let _ = stream.write_all(reply).await;
                        }
                        // Hold the connection open, silent, until the peer closes it.
                        None => while matches!(stream.read(&mut line).await, Ok(n) if n > 0) {},
                    }
                });
            }
        });
        (address, accepts)
    }

    #[tokio::test]
    async fn prober_brings_an_answering_server_back() {
        let (address, _accepts) = fake_server(Some(b"VERSION 1.6.18\r\n")).await;
        let (health, _) = health(&address, 1);
        let prober = tokio::spawn(run_prober(
            health.clone(),
            Arc::new(Connector::plain(&address)),
        ));
        health.mark_down("connection refused");
        within(health.wait_up()).await;
        assert_eq!(health.marked_up_total(), 1);
        // It keeps watching: the next down is probed too.
        health.mark_down("timed out");
        within(health.wait_up()).await;
        assert_eq!(health.marked_up_total(), 2);
        prober.abort();
    }

    #[tokio::test]
    async fn prober_keeps_a_silent_server_down() {
        let (address, mut accepts) = fake_server(None).await;
        let (health, _) = health(&address, 1);
        health.mark_down("timed out");
        let prober = tokio::spawn(run_prober(
            health.clone(),
            Arc::new(Connector::plain(&address)),
        ));
        // Probes run one after another: once the third has connected, the first two have
        // failed on the 50 ms timeout, and the server must still be down.
        for _ in 0..3 {
            within(accepts.recv()).await.expect("listener alive");
        }
        assert!(health.is_down());
        assert_eq!(health.marked_up_total(), 0);
        prober.abort();
        let outcome = within(probe(&Connector::plain(&address), &health)).await;
        assert_eq!(outcome, Err("version timed out".to_string()));
    }

    #[tokio::test]
    async fn probe_rejects_a_reply_that_is_not_version() {
        let (address, _accepts) = fake_server(Some(b"ERROR\r\n")).await;
        let (health, _) = health(&address, 1);
        let outcome = within(probe(&Connector::plain(&address), &health)).await;
        assert_eq!(outcome, Err("unexpected reply \"ERROR\"".to_string()));
    }

    #[tokio::test]
    async fn probe_of_a_closed_port_fails() {
        let address = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("local addr").to_string()
        };
        let (health, _) = health(&address, 1);
        assert!(within(probe(&Connector::plain(&address), &health))
            .await
            .is_err());
    }
}
