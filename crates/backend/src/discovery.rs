//! Finding a DNS-discovered pool's servers: every address of one host name, in an order
//! that does not depend on the resolver, so the same set always builds the same ring.
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use crate::BackendError;

/// Resolves `host` for a DNS-discovered pool: when `hosts_file` is given and it has entries
/// for `host` (an /etc/hosts-style file: `IP name [aliases...]`, `#` comments, re-read on
/// every call), those addresses; otherwise every address the system resolver gives
/// (tokio::net::lookup_host). Sorted (IPv4 before IPv6, then by address), deduplicated,
/// each with `port`. An unreadable hosts file is an error. No addresses is an error.
pub async fn resolve(
    host: &str,
    port: u16,
    hosts_file: Option<&Path>,
) -> Result<Vec<SocketAddr>, BackendError> {
    let error = |reason: String| BackendError::Resolve {
        host: Arc::from(host),
        reason: Arc::from(reason),
    };
    let mut addresses = Vec::new();
    if let Some(path) = hosts_file {
        // A small local file read once per refresh on the control thread: blocking for
        // it is cheaper than a hop to the blocking pool.
        let text = std::fs::read_to_string(path)
            .map_err(|e| error(format!("cannot read hosts file {}: {e}", path.display())))?;
        addresses = hosts_file_addresses(&text, host);
    }
    if addresses.is_empty() {
        addresses = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| error(e.to_string()))?
            .map(|address| address.ip())
            .collect();
    }
    // IpAddr orders every V4 before every V6, then by address: exactly the order wanted.
    let sorted: BTreeSet<IpAddr> = addresses.into_iter().collect();
    if sorted.is_empty() {
        return Err(error("no addresses".to_string()));
    }
    Ok(sorted
        .into_iter()
        .map(|ip| SocketAddr::new(ip, port))
        .collect())
}

/// The addresses an /etc/hosts-style text gives `host` (by canonical name or alias,
/// ignoring ASCII case), in file order. Lines whose first field is not an IP address
/// (including scoped IPv6 such as `fe80::1%eth0`) are skipped, as a resolver would.
pub fn hosts_file_addresses(text: &str, host: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let line = line.split('#').next().unwrap_or_default();
            let mut fields = line.split_whitespace();
            let ip: IpAddr = fields.next()?.parse().ok()?;
            fields
                .any(|name| name.eq_ignore_ascii_case(host))
                .then_some(ip)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    #[test]
    fn hosts_file_names_aliases_comments_and_ipv6() {
        let text = "\
# memcached pool
10.0.0.2   mc.cache.local mc     # second
10.0.0.1\tMC.Cache.Local
  2001:db8::1 other mc.cache.local
fe80::1%eth0 mc.cache.local
not-an-ip mc.cache.local
10.0.0.9 mc.cache.local.example
# 10.0.0.8 mc.cache.local
10.0.0.7 # mc.cache.local

";
        assert_eq!(
            hosts_file_addresses(text, "mc.cache.local"),
            vec![ip("10.0.0.2"), ip("10.0.0.1"), ip("2001:db8::1")]
        );
        assert_eq!(hosts_file_addresses(text, "MC"), vec![ip("10.0.0.2")]);
        assert_eq!(hosts_file_addresses(text, "other"), vec![ip("2001:db8::1")]);
        assert!(hosts_file_addresses(text, "missing").is_empty());
        assert!(hosts_file_addresses("", "mc").is_empty());
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
    async fn resolve_from_a_hosts_file_is_sorted_and_deduplicated() {
        let file = TempHostsFile::new(
            "::1 mc\n10.0.0.2 mc\n10.0.0.10 mc\n10.0.0.2 mc-alias mc\n2001:db8::1 mc\n10.0.0.1 mc\n",
        );
        let addresses = resolve("mc", 11211, Some(&file.0)).await.expect("resolve");
        let expected: Vec<SocketAddr> = [
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10)),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip("2001:db8::1"),
        ]
        .into_iter()
        .map(|ip| SocketAddr::new(ip, 11211))
        .collect();
        assert_eq!(addresses, expected);

        // Re-read on every call: a changed file gives the new set.
        std::fs::write(&file.0, "10.0.0.3 mc\n").expect("rewrite");
        let addresses = resolve("mc", 11211, Some(&file.0)).await.expect("resolve");
        assert_eq!(addresses, vec![SocketAddr::new(ip("10.0.0.3"), 11211)]);
    }

    #[tokio::test]
    async fn names_missing_from_the_hosts_file_go_to_the_system_resolver() {
        let file = TempHostsFile::new("10.0.0.1 mc\n");
        let addresses = resolve("localhost", 11211, Some(&file.0))
            .await
            .expect("resolve localhost");
        assert!(!addresses.is_empty());
        assert!(addresses
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 11211));
    }

    #[tokio::test]
    async fn localhost_resolves_without_a_hosts_file() {
        let addresses = resolve("localhost", 7, None)
            .await
            .expect("resolve localhost");
        assert!(!addresses.is_empty());
        assert!(addresses
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 7));
        let mut sorted = addresses.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(addresses, sorted);
    }

    #[tokio::test]
    async fn an_unreadable_hosts_file_is_an_error() {
        let file = TempHostsFile::new("");
        let missing = file.0.with_extension("missing");
        let error = resolve("localhost", 11211, Some(&missing))
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
        // `.invalid` is reserved (RFC 2606): no resolver answers it.
        let error = resolve("memroute-test.invalid", 11211, None)
            .await
            .expect_err("unknown name");
        assert!(matches!(error, BackendError::Resolve { .. }), "{error}");
    }
}
