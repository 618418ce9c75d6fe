//! The DNS sources: A/AAAA of a host name, and SRV records with their targets' addresses,
//! asked through hickory-resolver (no glibc NSS), keeping each record's TTL.
//!
//! A resolver is built for every lookup: it re-reads /etc/resolv.conf (a pod's search
//! domains and nameserver can change under a long-running process), and its cache is new,
//! so an answer is never older than the records' TTL says it may be.
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{Name, RData, Record};
use hickory_resolver::TokioResolver;
use memroute_config::DiscoveryConfig;

use super::found::{Found, FoundServer};

/// How long one query waits for a nameserver, and how often it is tried: a lookup made
/// while a generation is built (a new DNS pool at start or reload) holds that build up.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
const QUERY_ATTEMPTS: usize = 2;

/// A resolver for `[discovery]`: its `nameservers` when given, else /etc/resolv.conf.
fn resolver(settings: &DiscoveryConfig) -> Result<TokioResolver, String> {
    let mut builder = if settings.nameservers.is_empty() {
        TokioResolver::builder_tokio()
            .map_err(|e| format!("cannot read the system resolver config (/etc/resolv.conf): {e}; set [discovery] nameservers"))?
    } else {
        let servers = settings
            .nameservers
            .iter()
            .map(|address| {
                let on_port = |mut connection: ConnectionConfig| {
                    connection.port = address.port();
                    connection
                };
                NameServerConfig::new(
                    address.ip(),
                    true,
                    vec![
                        on_port(ConnectionConfig::udp()),
                        on_port(ConnectionConfig::tcp()),
                    ],
                )
            })
            .collect();
        TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(servers),
            TokioRuntimeProvider::default(),
        )
    };
    let options = builder.options_mut();
    // Every address of the name, v4 and v6: a pool is every server behind it.
    options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    // A large headless service's SRV answer (one record and one address per pod) outgrows
    // 512 bytes: let it come over UDP with EDNS(0) (a truncated answer is retried over TCP).
    options.edns0 = true;
    options.timeout = QUERY_TIMEOUT;
    options.attempts = QUERY_ATTEMPTS;
    builder.build().map_err(|e| e.to_string())
}

/// The smallest TTL among `records`.
fn smallest_ttl<'a>(records: impl IntoIterator<Item = &'a Record>) -> Option<Duration> {
    records
        .into_iter()
        .map(|record| Duration::from_secs(u64::from(record.ttl)))
        .min()
}

/// Every A and AAAA address of `host`, each with `port`.
pub(super) async fn addresses(
    host: &str,
    port: u16,
    settings: &DiscoveryConfig,
) -> Result<Found, String> {
    let resolver = resolver(settings)?;
    let answer = resolver.lookup_ip(host).await.map_err(|e| e.to_string())?;
    Ok(Found {
        servers: answer
            .iter()
            .map(|ip| FoundServer {
                address: SocketAddr::new(ip, port),
                name: None,
            })
            .collect(),
        ttl: smallest_ttl(answer.as_lookup().answers()),
    })
}

/// Every SRV record of `name`: its target's addresses with the record's port. A target the
/// answer carries addresses for (additional records, as Kubernetes' DNS sends for a headless
/// service) is not looked up again. A target that cannot be resolved is left out with a
/// warning (a pod going away between the two answers); none at all is an error.
pub(super) async fn srv(name: &str, settings: &DiscoveryConfig) -> Result<Found, String> {
    let resolver = resolver(settings)?;
    let lookup = resolver.srv_lookup(name).await.map_err(|e| e.to_string())?;
    let mut ttl = smallest_ttl(lookup.answers());
    let mut servers = Vec::new();
    for record in lookup.answers() {
        let RData::SRV(srv) = &record.data else {
            continue;
        };
        let mut ips: Vec<IpAddr> = addresses_in(lookup.additionals(), &srv.target);
        if ips.is_empty() {
            match resolver.lookup_ip(srv.target.clone()).await {
                Ok(found) => {
                    ips = found.iter().collect();
                    ttl = smallest_ttl(found.as_lookup().answers())
                        .into_iter()
                        .chain(ttl)
                        .min();
                }
                Err(error) => {
                    tracing::warn!(srv = name, target = %srv.target, %error, "SRV target has no address; left out");
                    continue;
                }
            }
        }
        ips.sort();
        ips.dedup();
        // One address per target is the StatefulSet case: name the server after the pod.
        let target = (ips.len() == 1).then(|| target_name(&srv.target));
        servers.extend(ips.into_iter().map(|ip| FoundServer {
            address: SocketAddr::new(ip, srv.port),
            name: target.clone(),
        }));
    }
    if servers.is_empty() {
        return Err("no SRV target has an address".to_string());
    }
    Ok(Found { servers, ttl })
}

/// The A/AAAA addresses `records` give `target`.
fn addresses_in(records: &[Record], target: &Name) -> Vec<IpAddr> {
    records
        .iter()
        .filter(|record| record.name == *target)
        .filter_map(|record| record.data.ip_addr())
        .collect()
}

/// A target name as a server name: without the root's trailing dot, lower case.
fn target_name(target: &Name) -> String {
    let text = target.to_string().to_ascii_lowercase();
    text.strip_suffix('.').map(str::to_string).unwrap_or(text)
}
