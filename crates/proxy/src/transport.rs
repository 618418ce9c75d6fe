//! The data plane's side of memroute-net: the sockets a worker is handed and the TLS
//! handshake counters `stats` reads. Binding listeners, reloading certificates and building
//! the backend connectors (kept across reloads) are memroute-control's (`transport_setup`,
//! `connectors`).
use std::sync::atomic::Ordering::Relaxed;

use memroute_net::{BoundListener, TlsCounters};

/// A bound socket and the place of its address in `proxy.listen` (which root its clients
/// are served by). Only the first worker serves a unix socket, so a later worker's
/// sockets are not numbered by their position in its list.
pub type IndexedListener = (usize, BoundListener);

/// A TLS endpoint's handshake counters by outcome, as `stats` and `/metrics` label them.
pub(crate) fn handshake_counts(c: &TlsCounters) -> [(&'static str, u64); 4] {
    [
        ("full", c.full.load(Relaxed)),
        ("resumed", c.resumed.load(Relaxed)),
        ("failed", c.failed.load(Relaxed)),
        ("timeout", c.timed_out.load(Relaxed)),
    ]
}
