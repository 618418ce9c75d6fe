//! The hosts-file source: an /etc/hosts-style file (`IP name [aliases...]`, `#` comments),
//! re-read at every lookup. For tests and for operators who render host lists elsewhere.
use std::net::IpAddr;
use std::path::Path;

/// The addresses `path` gives `host`; an unreadable file is an error (a missing file must
/// not look like an empty pool).
pub(super) fn lookup(path: &Path, host: &str) -> Result<Vec<IpAddr>, String> {
    // A small local file read once per refresh: blocking for it is cheaper than a hop to
    // the blocking pool.
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read hosts file {}: {e}", path.display()))?;
    Ok(hosts_file_addresses(&text, host))
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
}
