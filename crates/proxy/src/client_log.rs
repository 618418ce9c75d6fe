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

/// A request answered with an error for bad input.
pub(crate) fn protocol_error(peer: &str, protocol: &str, what: &str) {
    if admit() {
        tracing::warn!(peer, protocol, error = what, "client protocol error");
    }
}

/// A connection closed because its input cannot be framed any more.
pub(crate) fn framing_close(peer: &str, protocol: &str, what: &str) {
    if admit() {
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
    context: &crate::worker::WorkerContext,
    peer: &str,
    reply: &memroute_protocol::ErrorReply,
    close: bool,
) {
    use memroute_protocol::ErrorReply;
    let stats = context.stats();
    crate::stats::WorkerMetrics::add(&stats.client_errors, 1);
    let what = match reply {
        ErrorReply::Error => "unknown command",
        ErrorReply::Client(message) | ErrorReply::Server(message) => message,
        ErrorReply::Silent => "rejected without reply",
    };
    if matches!(reply, ErrorReply::Server(m) if m.contains("too large")) {
        crate::stats::WorkerMetrics::add(&stats.oversized_values, 1);
    }
    if close {
        crate::stats::WorkerMetrics::add(&stats.framing_closes, 1);
        framing_close(peer, "text", what);
    } else {
        protocol_error(peer, "text", what);
    }
}
