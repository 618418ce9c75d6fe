//! The admin endpoint, served with hyper (HTTP/1.1) on a thread and runtime of its own, so
//! nothing here competes with the workers:
//!
//! ```text
//!   GET  /              the panel: a page that shows /state, refreshed every 2 s
//!   GET  /state         pools, servers, listeners, routes, hot keys, reloads (JSON)
//!   GET  /metrics       Prometheus text (every worker flushes first, bounded wait)
//!   GET  /healthz       the process is up
//!   GET  /ready         200 once every pool has live connections (admin.ready_fraction),
//!                       503 before that and while draining
//!   GET  /config        the running config, secrets redacted, and its md5 hash
//!   POST /reload        re-read the config file and reload (the binary does the reading);
//!                       a loopback peer only, or anyone with admin.token (`access`)
//!   GET  /hotkeys       the hottest keys of each pool, JSON (`hot_keys`; top=N)
//!   GET  /route?key=K   where a key goes (repeat key=; op=set for another operation;
//!                       listener=ADDRESS for another listener than the first)
//!   GET  /watch         sampled requests as they are answered, JSON lines (`watch`;
//!                       key_prefix=, route=, limit=, rate=); the same access as /reload
//! ```
//!
//! Each connection is a task: a slow or silent client holds only its own task, never the
//! scrapes behind it. A request head must arrive within [`HEADER_TIMEOUT`] (of accept, or of
//! the previous answer), a connection lives at most [`CONNECTION_LIMIT`], and a newcomer
//! is always admitted: when its address or the port holds its share, the connection idle
//! longest is closed instead (`admission`), so nobody who reaches the port, from any
//! address, can crowd out the kubelet's probes, and the port's memory stays bounded.
mod access;
mod admission;
mod hot_keys;
mod panel;
mod query;
mod state;
mod watch;

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{mpsc, oneshot};

use memroute_proxy::stats::Metrics;
use memroute_proxy::ProxyError;

use crate::controller::Controller;

/// A request's head must arrive within this long of accept or of the previous answer (a
/// silent, slow or idle keep-alive client is closed). A probe or a scraper sends its
/// request at once; a person's browser reopens a closed keep-alive connection unnoticed.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// No admin connection lives longer than this, however busy.
const CONNECTION_LIMIT: Duration = Duration::from_secs(60);
/// How long `POST /reload` waits for the reload to finish.
const RELOAD_WAIT: Duration = Duration::from_secs(30);

/// A `POST /reload` handed to whoever reads the config file (the binary).
#[derive(Debug)]
pub struct ReloadRequest {
    /// `Ok(summary)` once the new config serves, `Err(reason)` when it was rejected.
    pub reply: oneshot::Sender<Result<String, String>>,
}

/// The running config as `/config` shows it.
#[derive(Debug, Clone)]
struct ConfigSource {
    redacted: String,
    hash: String,
}

/// What the admin endpoint reads; shared with [`crate::ProxyHandle`].
#[derive(Debug)]
pub(crate) struct AdminState {
    pub metrics: Arc<Metrics>,
    pub controller: Arc<Controller>,
    /// Set when the process is stopping: `/ready` answers 503 from then on.
    pub draining: AtomicBool,
    source: Mutex<Option<ConfigSource>>,
    reloads: Mutex<Option<mpsc::UnboundedSender<ReloadRequest>>>,
    /// What the last `GET /state` saw, for per-server rates.
    rates: state::RateMemory,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl AdminState {
    pub(crate) fn new(metrics: Arc<Metrics>, controller: Arc<Controller>) -> AdminState {
        AdminState {
            metrics,
            controller,
            draining: AtomicBool::new(false),
            source: Mutex::new(None),
            reloads: Mutex::new(None),
            rates: state::RateMemory::default(),
        }
    }

    /// Records the text of the config now running (shown redacted, hashed as given).
    pub(crate) fn set_source(&self, text: &str) {
        use md5::Digest as _;
        let hash: String = md5::Md5::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.metrics.set_config_hash(&hash);
        *lock(&self.source) = Some(ConfigSource {
            redacted: memroute_config::redacted(text),
            hash,
        });
    }

    /// A new channel for `POST /reload`; replaces any earlier one.
    pub(crate) fn reload_requests(&self) -> mpsc::UnboundedReceiver<ReloadRequest> {
        let (sender, receiver) = mpsc::unbounded_channel();
        *lock(&self.reloads) = Some(sender);
        receiver
    }

    /// Why memroute is not ready, or nothing when it is.
    pub(crate) fn not_ready_reasons(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        if self.draining.load(Relaxed) {
            reasons.push("draining: shutting down".to_string());
        }
        let generation = self.controller.current();
        let fraction = generation
            .config
            .admin
            .as_ref()
            .map_or(0.0, |a| a.ready_fraction);
        for (id, name) in generation.routes.pool_names.iter().enumerate() {
            let servers = generation.health.get(id).map_or(&[][..], |h| &h[..]);
            let live = servers
                .iter()
                .filter(|h| h.open_connections() > 0 && !h.is_down())
                .count();
            let needed = ((servers.len() as f64 * fraction).ceil() as usize).max(1);
            if servers.is_empty() {
                reasons.push(format!("pool {name}: no servers (DNS found none yet)"));
            } else if live < needed {
                reasons.push(format!(
                    "pool {name}: {live} of {} servers connected, {needed} needed",
                    servers.len()
                ));
            }
        }
        reasons
    }
}

/// Binds the admin address and serves it on its own thread until `shutdown` is set;
/// returns the bound address and the thread.
pub(crate) fn start(
    address: &str,
    state: Arc<AdminState>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<(String, std::thread::JoinHandle<()>), ProxyError> {
    let listen_error = |error| ProxyError::Listen {
        address: address.to_string(),
        error,
    };
    let listener = std::net::TcpListener::bind(address).map_err(listen_error)?;
    listener.set_nonblocking(true).map_err(listen_error)?;
    let bound = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| address.to_string());
    let thread = std::thread::Builder::new()
        .name("memroute-admin".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    tracing::error!(%error, "cannot build the admin runtime: no admin endpoint");
                    return;
                }
            };
            // Connections still open when the loop ends go with the runtime.
            runtime.block_on(serve(listener, state, shutdown));
        })
        .map_err(ProxyError::Thread)?;
    Ok((bound, thread))
}

async fn serve(
    listener: std::net::TcpListener,
    state: Arc<AdminState>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "cannot attach the admin listener");
            return;
        }
    };
    let admission = Arc::new(admission::Admission::default());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        };
        let (stream, peer) = match accepted {
            Ok((stream, peer)) => (stream, peer.ip()),
            Err(error) => {
                tracing::warn!(%error, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // The newcomer is admitted; an idle connection in its way is closed instead.
        let admitted = match admission.admit(peer) {
            Ok(admitted) => admitted,
            Err(limit) => {
                tracing::debug!(%peer, limit = limit.label(), "admin connection refused: every connection in the way is answering a request");
                state.metrics.count_admin_refusal(limit.label());
                continue;
            }
        };
        for limit in admitted.evicted {
            state.metrics.count_admin_eviction(limit.label());
        }
        let slot = Arc::new(admitted.slot);
        let state = state.clone();
        tokio::spawn(async move {
            let service = {
                let slot = slot.clone();
                hyper::service::service_fn(move |request| {
                    let (state, slot) = (state.clone(), slot.clone());
                    async move {
                        slot.busy();
                        let response = answer(&state, peer, request).await;
                        // A watch streams on after its head: its connection stays busy
                        // (never closed to make room) until it ends, at most 60 s.
                        if matches!(response.body(), Either::Left(_)) {
                            slot.idle();
                        }
                        Ok::<_, Infallible>(response)
                    }
                })
            };
            // hyper's header deadline runs from accept and again after each answer (hyper
            // 1.12, proto/h1/conn.rs `poll_read_head`), so it closes a silent connection,
            // a slow-header one, and an idle keep-alive one alike.
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                // First: a connection closed to make room is closed even if its request
                // arrived in the same turn (it was the idle-longest; a client retries).
                biased;
                () = slot.evicted() => {
                    tracing::debug!(%peer, "admin connection idle longest; closed to admit a newer one");
                }
                finished = tokio::time::timeout(CONNECTION_LIMIT, connection) => match finished {
                    Ok(Err(error)) => tracing::debug!(%error, "admin connection failed"),
                    Err(_) => tracing::debug!("admin connection open too long; closed"),
                    Ok(Ok(())) => {}
                },
            }
        });
    }
}

/// Every answer is a whole body but a watch's, which streams.
type Reply = Response<Either<Full<Bytes>, watch::WatchBody>>;

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Either::Left(Full::new(body.into())));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

fn json(value: serde_json::Value) -> Reply {
    reply(StatusCode::OK, "application/json", value.to_string())
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    reply(status, "text/plain; charset=utf-8", body)
}

async fn answer(state: &AdminState, peer: IpAddr, request: Request<Incoming>) -> Reply {
    let path = request.uri().path();
    let query = request.uri().query().unwrap_or("");
    match (request.method(), path) {
        (&Method::GET, "/metrics") => {
            let families = state.metrics.gather_fresh().await;
            reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                Metrics::encode(&families),
            )
        }
        (&Method::GET, "/") => reply(StatusCode::OK, "text/html; charset=utf-8", panel::PAGE),
        (&Method::GET, "/state") => {
            let families = state.metrics.gather_fresh().await;
            json(state::state(
                &state.metrics,
                &state.controller.current(),
                &state.rates,
                state.not_ready_reasons(),
                &families,
            ))
        }
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/ready") => {
            let reasons = state.not_ready_reasons();
            match reasons.is_empty() {
                true => text(StatusCode::OK, "ready\n"),
                false => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready:\n{}\n", reasons.join("\n")),
                ),
            }
        }
        (&Method::GET, "/config") => match lock(&state.source).clone() {
            Some(source) => {
                let mut response = text(
                    StatusCode::OK,
                    format!("# md5 {}\n{}", source.hash, source.redacted),
                );
                if let Ok(value) = hyper::header::HeaderValue::from_str(&source.hash) {
                    response
                        .headers_mut()
                        .insert("x-memroute-config-hash", value);
                }
                response
            }
            None => text(
                StatusCode::NOT_FOUND,
                "no config file: memroute was started without one\n",
            ),
        },
        (&Method::POST, "/reload") => match refusal(state, peer, &request) {
            None => reload(state).await,
            Some(refused) => refused,
        },
        (&Method::GET, "/route") => route(state, query),
        (&Method::GET, "/hotkeys") => {
            json(hot_keys::report(&state.metrics, hot_keys::top_of(query)))
        }
        (&Method::GET, "/watch") => match refusal(state, peer, &request) {
            None => watch(state, query),
            Some(refused) => refused,
        },
        (
            _,
            "/" | "/state" | "/metrics" | "/healthz" | "/ready" | "/config" | "/route" | "/hotkeys"
            | "/watch" | "/reload",
        ) => {
            text(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed (POST /reload, GET for the rest)\n",
            )
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "try /, /state, /metrics, /healthz, /ready, /config, /hotkeys, /route?key=K, /watch or POST /reload\n",
        ),
    }
}

/// The answer that says why `request` may not change state, or nothing when it may.
fn refusal(state: &AdminState, peer: IpAddr, request: &Request<Incoming>) -> Option<Reply> {
    let generation = state.controller.current();
    let token = generation
        .config
        .admin
        .as_ref()
        .and_then(|a| a.token.as_ref());
    let denied = match access::may_change_state(token, peer, request.headers()) {
        Ok(()) => return None,
        Err(denied) => denied,
    };
    let (status, reason) = match &denied {
        access::Denied::NotLoopback => (StatusCode::FORBIDDEN, "not_loopback"),
        access::Denied::CrossSite => (StatusCode::FORBIDDEN, "cross_site"),
        access::Denied::BadToken => (StatusCode::UNAUTHORIZED, "bad_token"),
        access::Denied::TokenFile(_) => (StatusCode::INTERNAL_SERVER_ERROR, "token_file"),
    };
    tracing::warn!(%peer, reason, "admin request refused: {}", denied.reason());
    state.metrics.count_admin_refusal(reason);
    let mut answer = text(status, format!("{}\n", denied.reason()));
    if status == StatusCode::UNAUTHORIZED {
        answer.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    Some(answer)
}

async fn reload(state: &AdminState) -> Reply {
    let sender = lock(&state.reloads).clone();
    let Some(sender) = sender else {
        return text(
            StatusCode::NOT_IMPLEMENTED,
            "reload is not available: memroute was started without a config file\n",
        );
    };
    let (reply, done) = oneshot::channel();
    if sender.send(ReloadRequest { reply }).is_err() {
        return text(StatusCode::SERVICE_UNAVAILABLE, "memroute is stopping\n");
    }
    match tokio::time::timeout(RELOAD_WAIT, done).await {
        Ok(Ok(Ok(summary))) => text(StatusCode::OK, format!("reloaded: {summary}\n")),
        Ok(Ok(Err(reason))) => text(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("reload rejected; the running config stays:\n{reason}\n"),
        ),
        Ok(Err(_)) => text(StatusCode::SERVICE_UNAVAILABLE, "memroute is stopping\n"),
        Err(_) => text(
            StatusCode::GATEWAY_TIMEOUT,
            "reload still running after 30 s\n",
        ),
    }
}

/// `GET /watch`: a stream of the sampled requests `query` asks for (`watch`).
fn watch(state: &AdminState, query: &str) -> Reply {
    let filter = match watch::filter_of(query, &state.controller) {
        Ok(filter) => filter,
        Err(reason) => return text(StatusCode::BAD_REQUEST, format!("{reason}\n")),
    };
    let Some(body) = watch::WatchBody::open(&state.metrics.watch, state.controller.clone(), filter)
    else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} watches are open already; close one first\n",
                memroute_proxy::request_watch::MAX_WATCHERS
            ),
        );
    };
    let mut response = Response::new(Either::Right(body));
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-ndjson"),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache"),
    );
    response
}

fn route(state: &AdminState, query: &str) -> Reply {
    let mut keys = Vec::new();
    let mut operation = memroute_config::Operation::Get;
    let mut listener = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let Some(value) = query::percent_decode(value) else {
            return text(
                StatusCode::BAD_REQUEST,
                "bad percent-encoding in the query\n",
            );
        };
        match name {
            "key" => keys.push(value),
            "op" => match std::str::from_utf8(&value)
                .ok()
                .and_then(crate::route_lookup::operation_named)
            {
                Some(op) => operation = op,
                None => return text(StatusCode::BAD_REQUEST, "unknown op\n"),
            },
            "listener" => listener = Some(String::from_utf8_lossy(&value).into_owned()),
            _ => {}
        }
    }
    if keys.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "usage: /route?key=K[&key=K2][&op=set][&listener=ADDRESS]\n",
        );
    }
    let generation = state.controller.current();
    // A listener as written in proxy.listen, or as bound (the port a `:0` got).
    let listener = match listener {
        None => 0,
        Some(address) => match crate::route_lookup::listener_named(&generation.config, &address)
            .or_else(|| state.metrics.listener_index(&address))
        {
            Some(index) => index,
            None => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "no listener {address:?} (proxy.listen: {})\n",
                        crate::route_lookup::listener_list(&generation.config)
                    ),
                )
            }
        },
    };
    let mut out = String::new();
    for key in &keys {
        let targets = crate::route_lookup::route_running(
            &generation,
            &state.metrics,
            listener,
            operation,
            key,
        );
        out.push_str(&crate::route_lookup::describe_routes(
            &String::from_utf8_lossy(key),
            &targets,
        ));
    }
    text(StatusCode::OK, out)
}
