//! Defaults, in one place so docs/configuration.md and the code agree. Its own module
//! so that raw.rs and transport.rs (which apply them) and checked.rs (`PoolConfig::new`,
//! `TransportConfig::default`) all use it without importing each other.

/// Listen address when `proxy.listen` is absent: local only, memcached's port.
pub const LISTEN: &str = "127.0.0.1:11211";
pub const BACKLOG: u32 = 65535;
/// The protocol's scanning limits are the defaults (protocol owns them: `Limits::default`).
pub const MAX_VALUE_SIZE: usize = memroute_protocol::DEFAULT_MAX_VALUE_LEN;
pub const MAX_LINE_SIZE: usize = memroute_protocol::DEFAULT_MAX_LINE_LEN;
/// Smallest accepted `max_line_size`: a `set` line with a 250-byte key must fit.
pub const MIN_LINE_SIZE: usize = 1024;
/// With 1 MiB values this bounds one client's replies in memory at 256 MiB.
pub const MAX_CLIENT_PENDING: usize = 256;
pub const MAX_CONNECTIONS: usize = 0;
pub const SHUTDOWN_TIMEOUT_MS: u64 = 10_000;
/// Long enough for a load balancer (a Kubernetes Service's endpoints) to stop sending
/// new clients after the SIGTERM that marked memroute not ready.
pub const DRAIN_DELAY_MS: u64 = 5_000;
/// Replies buffered for clients that do not read them, across the whole process.
pub const MAX_BUFFERED_REPLIES: usize = 64 * 1024 * 1024;
/// How long a client may hold more than its share of that budget before it is closed.
pub const SLOW_CLIENT_TIMEOUT_MS: u64 = 10_000;
pub const VNODES: u32 = memroute_routing::spec::DEFAULT_VNODES;
pub const CONNECTIONS: usize = 1;
pub const TIMEOUT_MS: u64 = 250;
pub const MAX_KEYS_PER_REQUEST: usize = 100;
pub const WEIGHT: u32 = 1;
pub const FAILURE_LIMIT: u32 = 3;
/// How long a pool whose servers changed keeps its previous placement: ten minutes moves
/// every key read at least once in that time (the keys whose misses would reach a
/// database together), and costs one extra lookup only for misses of keys that moved.
pub const RESIZE_WINDOW_MS: u64 = 600_000;
pub const MAX_EJECTED_FRACTION: f64 = 0.5;
/// A down server is probed often enough that it serves again within a second of its
/// return (probes are one connect and `version`, from one prober per server for the
/// whole process, so at most 5 a second per server).
pub const PROBE_INTERVAL_MS: u64 = 200;
/// The interval stops growing here, however long the outage: the recovery bound
/// (this plus one probe's round trip) does not depend on how long the server was away.
pub const PROBE_INTERVAL_MAX_MS: u64 = 500;
pub const DNS_REFRESH_MS: u64 = 5_000;
pub const SHADOW_MAX_IN_FLIGHT: usize = 1000;
pub const ERROR_ROUTE_MESSAGE: &str = "error route";

// Transport (`[proxy]` TLS and TCP Fast Open keys).
/// Listener TCP Fast Open queue (pending TFO connections per listener); 0 = off.
pub const FASTOPEN: u32 = 1024;
/// On where the kernel allows it (`net.ipv4.tcp_fastopen` bit 1, the kernel default).
/// It changes nothing until a server hands out a TFO cookie (memcached does not unless
/// the sysctl has 0x400); see docs/configuration.md for what a deferred connect means.
pub const FASTOPEN_CONNECT: bool = true;
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// How long one ticket key encrypts new tickets; tickets are accepted for twice this.
/// rustls's ring ticketer rotates its own keys every 6 hours, which caps it.
pub const TLS_TICKET_LIFETIME_SECS: u64 = 6 * 3600;
/// TLS 1.2 sessions remembered for resumption by session id (TLS 1.3 uses tickets).
pub const TLS_SESSION_CACHE: usize = 4096;
