//! Finding a DNS-discovered pool's servers. One entry point, one source per kind of record:
//!
//! ```text
//!   lookup(spec, [discovery])
//!     dns = "name:port"  -> hosts file ([discovery] hosts_file), if it names the host
//!                           else A + AAAA through hickory (dns.rs)        -> ip:port each
//!     srv = "_s._p.name" -> SRV through hickory; each target's A/AAAA     -> ip:record port,
//!                           (the answer's additional records, else a lookup) named by target
//!   -> Found { servers (sorted, deduplicated), ttl (smallest record TTL) }
//!   next_refresh(spec, ttl) = min(refresh, max(ttl, MIN_TTL_REFRESH))
//! ```
//!
//! DNS goes through `hickory-resolver` rather than glibc's getaddrinfo: a static binary in
//! a `FROM scratch` image has no NSS modules to load, and the records' TTLs (which decide
//! when to look again) are only visible to a resolver that returns records. Servers come
//! back in an order that does not depend on the resolver (IPv4 before IPv6, then by
//! address), so every instance builds the same ring from the same set.
mod dns;
mod found;
mod hosts;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use memroute_config::{DiscoveryConfig, DnsDiscovery, DnsKind};

use crate::BackendError;

pub use found::{Found, FoundServer};
pub use hosts::hosts_file_addresses;

/// The shortest wait between two lookups that a TTL can ask for: a TTL of 0 (or 1 s on a
/// busy zone) must not turn discovery into a query loop. An explicit `refresh` below this
/// still applies (tests use 100 ms with a hosts file).
pub const MIN_TTL_REFRESH: Duration = Duration::from_secs(1);

/// Looks up the servers of `spec` with the `[discovery]` settings. No servers is an error,
/// so a failed or empty answer never empties a pool.
pub async fn lookup(
    spec: &DnsDiscovery,
    settings: &DiscoveryConfig,
) -> Result<Found, BackendError> {
    let error = |reason| resolve_error(spec, reason);
    let mut found = match spec.kind {
        DnsKind::Address => {
            let from_file = match &settings.hosts_file {
                Some(path) => hosts::lookup(path, &spec.host).map_err(error)?,
                None => Vec::new(),
            };
            if from_file.is_empty() {
                dns::addresses(&spec.host, spec.port, settings)
                    .await
                    .map_err(error)?
            } else {
                Found {
                    servers: from_file
                        .into_iter()
                        .map(|ip| FoundServer {
                            address: SocketAddr::new(ip, spec.port),
                            name: None,
                        })
                        .collect(),
                    ttl: None,
                }
            }
        }
        DnsKind::Srv => dns::srv(&spec.host, settings).await.map_err(error)?,
    };
    sort_servers(&mut found.servers);
    if found.servers.is_empty() {
        return Err(error("no addresses".to_string()));
    }
    Ok(found)
}

/// [`lookup`] for callers outside any runtime or inside one they must not block (building
/// a generation happens on the main thread, a blocking-pool thread or an admin handler):
/// runs the lookup on a thread of its own with a small runtime, and waits for it.
pub fn lookup_blocking(
    spec: &DnsDiscovery,
    settings: &DiscoveryConfig,
) -> Result<Found, BackendError> {
    let error = |reason| resolve_error(spec, reason);
    std::thread::scope(|scope| {
        let looking = std::thread::Builder::new()
            .name("memroute-dns".to_string())
            .spawn_scoped(scope, || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| error(format!("cannot start a lookup runtime: {e}")))?;
                runtime.block_on(lookup(spec, settings))
            })
            .map_err(|e| error(format!("cannot start a lookup thread: {e}")))?;
        looking
            .join()
            .unwrap_or_else(|_| Err(error("the lookup thread panicked".to_string())))
    })
}

fn resolve_error(spec: &DnsDiscovery, reason: String) -> BackendError {
    BackendError::Resolve {
        host: Arc::from(spec.host.as_str()),
        reason: Arc::from(reason),
    }
}

/// How long to wait before looking `spec` up again: its `refresh`, or sooner when the
/// records' TTL is shorter (never sooner than [`MIN_TTL_REFRESH`] for a TTL).
pub fn next_refresh(spec: &DnsDiscovery, ttl: Option<Duration>) -> Duration {
    match ttl {
        Some(ttl) => spec.refresh.min(ttl.max(MIN_TTL_REFRESH)),
        None => spec.refresh,
    }
}

/// IPv4 before IPv6, then by address and port: the order every instance agrees on. One
/// entry per address (the first, i.e. named one wins when an address appears twice).
fn sort_servers(servers: &mut Vec<FoundServer>) {
    servers.sort_by(|a, b| {
        (a.address.is_ipv6(), a.address.ip(), a.address.port())
            .cmp(&(b.address.is_ipv6(), b.address.ip(), b.address.port()))
            .then_with(|| b.name.is_some().cmp(&a.name.is_some()))
    });
    servers.dedup_by(|later, earlier| later.address == earlier.address);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn address_spec(host: &str, port: u16) -> DnsDiscovery {
        DnsDiscovery {
            host: host.to_string(),
            port,
            refresh: Duration::from_secs(5),
            kind: DnsKind::Address,
        }
    }

    fn with_hosts_file(path: &std::path::Path) -> DiscoveryConfig {
        DiscoveryConfig {
            hosts_file: Some(path.to_path_buf()),
            ..DiscoveryConfig::default()
        }
    }

    fn addresses(found: &Found) -> Vec<String> {
        found
            .servers
            .iter()
            .map(|s| s.address.to_string())
            .collect()
    }

    /// A hosts file under the temp dir with a name no other test (or test run) uses,
    /// removed when dropped.
    struct TempHostsFile(PathBuf);

    impl TempHostsFile {
        fn new(text: &str) -> TempHostsFile {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "memroute-backend-hosts-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&path, text).expect("write temp hosts file");
            TempHostsFile(path)
        }
    }

    impl Drop for TempHostsFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[tokio::test]
    async fn hosts_file_answers_are_sorted_deduplicated_and_re_read() {
        let file = TempHostsFile::new(
            "::1 mc\n10.0.0.2 mc\n10.0.0.10 mc\n10.0.0.2 mc-alias mc\n2001:db8::1 mc\n10.0.0.1 mc\n",
        );
        let settings = with_hosts_file(&file.0);
        let found = lookup(&address_spec("mc", 11211), &settings)
            .await
            .expect("lookup");
        assert_eq!(
            addresses(&found),
            [
                "10.0.0.1:11211",
                "10.0.0.2:11211",
                "10.0.0.10:11211",
                "[::1]:11211",
                "[2001:db8::1]:11211"
            ]
        );
        assert_eq!(found.ttl, None, "a hosts file has no TTL");
        std::fs::write(&file.0, "10.0.0.3 mc\n").expect("rewrite");
        let found = lookup(&address_spec("mc", 11211), &settings)
            .await
            .expect("lookup");
        assert_eq!(addresses(&found), ["10.0.0.3:11211"]);
    }

    #[test]
    fn names_missing_from_the_hosts_file_go_to_dns_and_blocking_works_outside_a_runtime() {
        // localhost comes from /etc/hosts through hickory's own hosts handling (no NSS).
        let file = TempHostsFile::new("10.0.0.1 mc\n");
        let found = lookup_blocking(&address_spec("localhost", 7), &with_hosts_file(&file.0))
            .expect("resolve localhost");
        assert!(!found.servers.is_empty());
        assert!(found
            .servers
            .iter()
            .all(|s| s.address.ip().is_loopback() && s.address.port() == 7));
    }

    #[tokio::test]
    async fn an_unreadable_hosts_file_is_an_error() {
        let file = TempHostsFile::new("");
        let missing = file.0.with_extension("missing");
        let error = lookup(
            &address_spec("localhost", 11211),
            &with_hosts_file(&missing),
        )
        .await
        .expect_err("missing file");
        assert!(matches!(error, BackendError::Resolve { .. }), "{error}");
        assert!(
            error.to_string().contains("cannot read hosts file"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_name_nobody_knows_is_an_error() {
        // `.invalid` is reserved (RFC 2606): no resolver answers it. A nameserver on a
        // loopback port nobody serves keeps the test off the network.
        let settings = DiscoveryConfig {
            nameservers: vec![SocketAddr::new(IpAddr::from([127, 0, 0, 1]), 9)],
            ..DiscoveryConfig::default()
        };
        let error = lookup(&address_spec("memroute-test.invalid", 11211), &settings)
            .await
            .expect_err("unknown name");
        assert!(matches!(error, BackendError::Resolve { .. }), "{error}");
    }

    #[test]
    fn refresh_follows_the_ttl_within_bounds() {
        let spec = address_spec("mc", 1);
        assert_eq!(next_refresh(&spec, None), Duration::from_secs(5));
        assert_eq!(
            next_refresh(&spec, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(
            next_refresh(&spec, Some(Duration::from_secs(300))),
            Duration::from_secs(5),
            "refresh is the longest wait"
        );
        assert_eq!(
            next_refresh(&spec, Some(Duration::ZERO)),
            MIN_TTL_REFRESH,
            "a zero TTL does not mean a query loop"
        );
        let fast = DnsDiscovery {
            refresh: Duration::from_millis(100),
            ..spec
        };
        assert_eq!(
            next_refresh(&fast, Some(Duration::ZERO)),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn servers_sort_v4_first_and_keep_the_named_duplicate() {
        let server = |address: &str, name: Option<&str>| FoundServer {
            address: address.parse().expect("test address"),
            name: name.map(str::to_string),
        };
        let mut servers = vec![
            server("[::1]:1", None),
            server("127.0.0.3:1", None),
            server("127.0.0.2:2", None),
            server("127.0.0.2:1", None),
            server("127.0.0.3:1", Some("mc-0")),
        ];
        sort_servers(&mut servers);
        assert_eq!(
            servers,
            [
                server("127.0.0.2:1", None),
                server("127.0.0.2:2", None),
                server("127.0.0.3:1", Some("mc-0")),
                server("[::1]:1", None),
            ]
        );
    }
}
