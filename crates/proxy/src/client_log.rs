//! Log lines for client misbehaviour (protocol errors, oversized values, framing closes),
//! rate-limited process-wide so a flood of bad input cannot fill a disk: at most
//! `LINES_PER_SECOND` lines a second, then one line saying how many were left out.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

const LINES_PER_SECOND: u64 = 10;

/// The second the current budget belongs to, and the lines logged (or dropped) in it.
static WINDOW: AtomicU64 = AtomicU64::new(0);
static IN_WINDOW: AtomicU64 = AtomicU64::new(0);

/// True when this line may be written; on a new second, reports the lines dropped before.
fn admit() -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let window = WINDOW.load(Relaxed);
    if window != now
        && WINDOW
            .compare_exchange(window, now, Relaxed, Relaxed)
            .is_ok()
    {
        let previous = IN_WINDOW.swap(0, Relaxed);
        if previous > LINES_PER_SECOND {
            tracing::warn!(
                suppressed = previous - LINES_PER_SECOND,
                "client error log lines suppressed in the last second"
            );
        }
    }
    IN_WINDOW.fetch_add(1, Relaxed) < LINES_PER_SECOND
}

/// Who a session serves: the peer address its log lines name, and the per-listener
/// counters of the listener it came in on (none for a connection made in-process).
#[derive(Debug)]
pub(crate) struct Peer {
    pub address: String,
    pub listener: Option<std::rc::Rc<ListenerEvents>>,
}

/// One listener's place and counters (`memroute_listener_events_total{listener,event}`
/// and `memroute_listener_connections_current{listener}`), made once per listener per
/// worker and shared by its sessions. Atomic, touched only on errors and once per
/// connection (a session counts itself open while it lives: `session::OpenSession`).
#[derive(Debug)]
pub(crate) struct ListenerEvents {
    /// The listener's place in `proxy.listen` (its root route: `RouteSnapshot::root_of`).
    pub index: usize,
    client_errors: prometheus::IntCounter,
    oversized_values: prometheus::IntCounter,
    framing_closes: prometheus::IntCounter,
    binary_connections: prometheus::IntCounter,
    auth_cmds: prometheus::IntCounter,
    auth_errors: prometheus::IntCounter,
    pub open_connections: prometheus::IntGauge,
}

impl ListenerEvents {
    pub(crate) fn new(
        metrics: &crate::stats::Metrics,
        index: usize,
        listener: &str,
    ) -> ListenerEvents {
        ListenerEvents {
            index,
            client_errors: metrics.listener_event(listener, "client_error"),
            oversized_values: metrics.listener_event(listener, "oversized_value"),
            framing_closes: metrics.listener_event(listener, "framing_close"),
            binary_connections: metrics.listener_event(listener, "binary_connection"),
            auth_cmds: metrics.listener_event(listener, "auth_command"),
            auth_errors: metrics.listener_event(listener, "auth_error"),
            open_connections: metrics.listener_connections(listener),
        }
    }
}

/// What a client did that an operator should be able to count.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ClientEvent {
    /// A request rejected as bad input.
    Error,
    /// A storage request over `max_value_size`.
    OversizedValue,
    /// A connection closed because its input could no longer be framed.
    FramingClose,
    /// A connection that speaks the binary protocol.
    BinaryConnection,
    /// A login tried on a listener that wants one (memcached's `auth_cmds`).
    AuthCommand,
    /// A login refused: a user or password the authfile does not hold (`auth_errors`).
    AuthError,
}

/// Counts `event` for the process (the worker's cells) and for the peer's listener.
pub(crate) fn count(context: &crate::context::WorkerContext, peer: &Peer, event: ClientEvent) {
    count_for(context, peer.listener.as_deref(), event);
}

/// Counts `event` for the process and for `listener` (none for an in-process connection).
pub(crate) fn count_for(
    context: &crate::context::WorkerContext,
    listener: Option<&ListenerEvents>,
    event: ClientEvent,
) {
    let stats = context.stats();
    let (cell, listener) = match event {
        ClientEvent::Error => (&stats.client_errors, listener.map(|l| &l.client_errors)),
        ClientEvent::OversizedValue => (
            &stats.oversized_values,
            listener.map(|l| &l.oversized_values),
        ),
        ClientEvent::FramingClose => (&stats.framing_closes, listener.map(|l| &l.framing_closes)),
        ClientEvent::BinaryConnection => (
            &stats.binary_connections,
            listener.map(|l| &l.binary_connections),
        ),
        ClientEvent::AuthCommand => (&stats.auth_cmds, listener.map(|l| &l.auth_cmds)),
        ClientEvent::AuthError => (&stats.auth_errors, listener.map(|l| &l.auth_errors)),
    };
    crate::stats::WorkerMetrics::add(cell, 1);
    if let Some(counter) = listener {
        counter.inc();
    }
}

/// A request answered with an error for bad input.
pub(crate) fn protocol_error(peer: &Peer, protocol: &str, what: &str) {
    if admit() {
        let peer = peer.address.as_str();
        tracing::warn!(peer, protocol, error = what, "client protocol error");
    }
}

/// A login refused: who tried, never the password.
pub(crate) fn login_refused(peer: &Peer, user: &[u8]) {
    if admit() {
        let peer = peer.address.as_str();
        let user = String::from_utf8_lossy(user);
        tracing::warn!(peer, %user, "client login refused");
    }
}

/// A connection closed because its input cannot be framed any more.
pub(crate) fn framing_close(peer: &Peer, protocol: &str, what: &str) {
    if admit() {
        let peer = peer.address.as_str();
        tracing::warn!(
            peer,
            protocol,
            error = what,
            "client connection closed: unframeable input"
        );
    }
}

/// Counts and logs a text-protocol request rejected by the parser.
pub(crate) fn text_error(
    context: &crate::context::WorkerContext,
    peer: &Peer,
    reply: &memroute_protocol::ErrorReply,
    close: bool,
) {
    use memroute_protocol::ErrorReply;
    count(context, peer, ClientEvent::Error);
    let what = match reply {
        ErrorReply::Error => "unknown command",
        ErrorReply::Client(message) | ErrorReply::Server(message) => message,
        ErrorReply::Silent => "rejected without reply",
    };
    if matches!(reply, ErrorReply::Server(m) if m.contains("too large")) {
        count(context, peer, ClientEvent::OversizedValue);
    }
    if close {
        count(context, peer, ClientEvent::FramingClose);
        framing_close(peer, "text", what);
    } else {
        protocol_error(peer, "text", what);
    }
}
