//! The version strings memroute reports (`version`, `stats`, the mcrouter admin `version`
//! query): a leaf, so the request path can answer them without importing the crate root.

/// memroute's version as reported by `version` and `stats`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The memcached version memroute reports first in `version` (and as `STAT version`).
/// Clients parse it: libmemcached reads `major.minor.micro` with strtol and fails the call
/// (memcstat, memcping, PHP `getVersion()`) on anything else. 1.6.0 is the protocol level
/// memroute speaks (text, meta, binary as in memcached 1.6), not any backend's version.
pub const MEMCACHED_COMPAT_VERSION: &str = "1.6.0";

/// The whole `version` reply: the numeric version first, memroute's own after it
/// (libmemcached stops parsing at the space).
pub(crate) fn version_line() -> String {
    format!("VERSION {MEMCACHED_COMPAT_VERSION} memroute-{VERSION}\r\n")
}
