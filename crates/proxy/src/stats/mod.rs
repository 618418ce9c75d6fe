//! Every number memroute reports comes from one `prometheus::Registry`: `/metrics` encodes
//! it in the text exposition format, and the `stats` command renders the same gathered
//! families as memcached's `STAT name value` lines, so the two cannot drift apart.
//!
//! ```text
//!  worker (hot path, no atomics): Cell<u64> counters + LocalHistogram per route / server
//!     | flush: every FLUSH_INTERVAL, and on demand (a scrape or `stats` asks every worker)
//!     v                                                      (worker_cells, flush_barrier)
//!  Metrics.registry  <- shared IntCounter / Histogram families (atomics, touched on flush)
//!                    |                                                          (registry)
//!                    <- StateCollector: health, policy routes, shadows, DNS, pools (read on
//!                       gather)                                          (state_collector)
//!     | gather()
//!     +--> admin `/metrics` (TextEncoder: label values escaped)
//!     +--> `stats` (render_stats: legacy STAT names for memcached tools)     (stats_reply)
//! ```
//!
//! Metric names follow `memroute_<component>_<event>_<unit>`; `families` defines and
//! registers them.
//!
//! The plain shared counters (`ServerStats`, `RouteStats`, `ShadowStats`, `ReplyBudget`,
//! `ReloadCounts`) are in `counters`, which this module reads on gather; this module
//! imports nothing of the request path (see docs/architecture.md, "Modules of
//! memroute-proxy").
mod families;
mod flush_barrier;
mod registry;
mod state_collector;
mod stats_reply;
mod worker_cells;

pub(crate) use flush_barrier::FLUSH_WAIT;
pub use registry::Metrics;
pub(crate) use worker_cells::{round_trip_observer, RouteMetrics, WorkerMetrics};
