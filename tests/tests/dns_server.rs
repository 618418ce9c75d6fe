//! DNS discovery against a real DNS server: dnsmasq (Debian's `dnsmasq-base`, installed by
//! scripts/test) started by each test on a loopback port, serving names from a hosts file
//! and SRV records, with a chosen TTL. memroute asks it through `[discovery] nameservers`
//! (hickory-resolver, the same path a static binary in a scratch image takes).
//!
//! ```text
//!   test rewrites records (hosts file + SIGHUP, or a restart with new SRV records)
//!     -> dnsmasq 127.0.0.1:DNSPORT -> memroute (refresh or TTL, whichever is sooner)
//!     -> ring over memcached 127.0.0.X:PORT
//! ```
//!
//! Every wait is on memroute's stats or log, bounded.
use std::time::{Duration, Instant};

use memroute_tests::*;

#[path = "common/dnsmasq.rs"]
mod dnsmasq;
use dnsmasq::Dnsmasq;

/// A change must show within this. The A-record test's `refresh` is an hour, so only the
/// records' TTL (1 s) can make memroute look again in time.
const DEADLINE: Duration = Duration::from_secs(15);

fn discovery_config(servers: &str, dns: &Dnsmasq) -> String {
    format!(
        "{}[pools.d]\nservers = {servers}\ndistribution = \"ketama\"\nhash = \"md5\"\n\
         timeout = \"500ms\"\n\n[discovery]\nnameservers = [\"127.0.0.1:{}\"]\n",
        proxy_section(&format!("127.0.0.1:{}", free_port()), "d"),
        dns.port
    )
}

fn wait_pool_size(proxy: &Memroute, n: u64) {
    proxy.wait_stats(&format!("pool:d:servers == {n}"), DEADLINE, |s| {
        stat_u64(s, "pool:d:servers") == Some(n)
    });
}

fn value_of(key: &str) -> String {
    format!("v-{key}")
}

/// Sets batches of new keys through `proxy` until every server in `servers` holds some of
/// them (the rebuilt ring may reach the worker just after the stats show it). Returns the
/// keys set and how many each server holds.
fn spread_over(proxy: &Memroute, servers: &[&Memcached], tag: &str) -> (Vec<String>, Vec<usize>) {
    let mut c = proxy.connect();
    let mut keys: Vec<String> = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let round: Vec<String> = (0..100)
            .map(|i| format!("{tag}{}-{i}", keys.len()))
            .collect();
        c.set_many(&round, value_of);
        keys.extend(round);
        let held: Vec<usize> = servers.iter().map(|m| m.held(&keys).len()).collect();
        if held.iter().all(|&n| n > 0) {
            assert_eq!(
                held.iter().sum::<usize>(),
                keys.len(),
                "some keys are on no server of the set"
            );
            return (keys, held);
        }
        assert!(
            Instant::now() < deadline,
            "new keys do not reach every server ({held:?})\n{}",
            proxy.log_text()
        );
    }
}

#[test]
fn a_records_change_the_ring_when_their_ttl_runs_out() {
    let port = free_port();
    let m1 = Memcached::start_on(&free_loopback_host(port), port, 8);
    let m2 = Memcached::start_on(&free_loopback_host(port), port, 8);
    let entry = |m: &Memcached| format!("{} mc.test", m.host);
    let dns = Dnsmasq::start(&[entry(&m1)], &[], 1);
    // refresh is an hour: every change below is noticed because the TTL (1 s) ran out.
    let proxy = Memroute::start(&discovery_config(
        &format!("{{ dns = \"mc.test:{port}\", refresh = \"1h\" }}"),
        &dns,
    ));
    wait_pool_size(&proxy, 1);
    let (keys, held) = spread_over(&proxy, &[&m1], "one");
    assert_eq!(held, [keys.len()]);

    let changed = Instant::now();
    dns.set_hosts(&[entry(&m1), entry(&m2)]);
    wait_pool_size(&proxy, 2);
    let noticed = changed.elapsed();
    let (keys, held) = spread_over(&proxy, &[&m1, &m2], "two");
    println!(
        "dns: A record added -> ring of 2 in {:.0} ms (TTL 1 s, refresh 1 h); {} keys spread {held:?}",
        noticed.as_secs_f64() * 1000.0,
        keys.len()
    );

    // m1 leaves the name: its keys' new home is m2, the only server left. A key the
    // two-server ring puts on m1 shows below when the worker stops using that ring (keys
    // spread_over set before the worker took it do not: all went to m1).
    let mut c = proxy.connect();
    let fresh: Vec<String> = (0..50).map(|i| format!("fresh{i}")).collect();
    c.set_many(&fresh, value_of);
    let on_m1 = m1
        .held(&fresh)
        .into_keys()
        .next()
        .expect("the two-server ring puts some of 50 keys on m1");
    dns.set_hosts(&[entry(&m2)]);
    wait_pool_size(&proxy, 1);
    // The stats show the new set as soon as it is built; the worker swaps its ring in a
    // moment later, and until then places keys on m1 still. Set a key of m1's again until m2
    // takes it: from then on the worker places every request with the one-server ring.
    assert!(
        poll_until(DEADLINE, || {
            c.set(&on_m1, b"moved");
            m2.held(std::slice::from_ref(&on_m1))
                .get(&on_m1)
                .map(Vec::as_slice)
                == Some(&b"moved"[..])
        }),
        "{on_m1} never reached m2 after m1 left the name\n{}",
        proxy.log_text()
    );
    let stats = proxy.stats();
    assert!(
        stats
            .iter()
            .any(|(k, _)| k == &format!("server:d:{}:errors", m2.addr()))
            && !stats.iter().any(|(k, _)| k.contains(&m1.addr())),
        "the pool is not exactly m2: {stats:?}"
    );
    let before = m2.stat("curr_items");
    let gone: Vec<String> = (0..50).map(|i| format!("after{i}")).collect();
    c.set_many(&gone, value_of);
    assert_eq!(m2.stat("curr_items") - before, 50, "every new key on m2");
    assert!(
        dns.log().contains("query[A] mc.test"),
        "memroute did not ask dnsmasq\n{}",
        dns.log()
    );
}

#[test]
fn srv_records_give_servers_with_their_ports_named_by_target() {
    let (m1, m2, m3) = (Memcached::start(), Memcached::start(), Memcached::start());
    let hosts = [
        "127.0.0.1 m1.mc.test".to_string(),
        "127.0.0.1 m2.mc.test".to_string(),
        "127.0.0.1 m3.mc.test".to_string(),
    ];
    let srv = |target: &str, m: &Memcached| format!("_memcache._tcp.mc.test,{target},{}", m.port);
    // A TTL of an hour and a refresh of 300 ms: refresh bounds how long an answer is kept.
    let mut dns = Dnsmasq::start(
        &hosts,
        &[srv("m1.mc.test", &m1), srv("m2.mc.test", &m2)],
        3600,
    );
    let proxy = Memroute::start(&discovery_config(
        "{ srv = \"_memcache._tcp.mc.test\", refresh = \"300ms\" }",
        &dns,
    ));
    wait_pool_size(&proxy, 2);
    let stats = proxy.stats();
    for m in [&m1, &m2] {
        assert!(
            stats
                .iter()
                .any(|(k, _)| k == &format!("server:d:{}:errors", m.addr())),
            "{} (port from its SRV record) is not a server: {stats:?}",
            m.addr()
        );
    }
    // Each server is named by its SRV target (the ring hashes the name, which a pod keeps
    // across restarts while its IP changes).
    let log = proxy.log_text();
    assert!(
        log.contains(&format!("m1.mc.test={}", m1.addr()))
            && log.contains(&format!("m2.mc.test={}", m2.addr())),
        "servers are not named after their SRV targets\n{log}"
    );
    spread_over(&proxy, &[&m1, &m2], "srv2-");

    // A third record (a StatefulSet scaled up): dnsmasq restarts with it on the same port.
    dns.set_srv(&[
        srv("m1.mc.test", &m1),
        srv("m2.mc.test", &m2),
        srv("m3.mc.test", &m3),
    ]);
    wait_pool_size(&proxy, 3);
    let (keys, held) = spread_over(&proxy, &[&m1, &m2, &m3], "srv3-");
    println!(
        "dns: SRV record added -> ring of 3; {} keys spread {held:?}",
        keys.len()
    );
    assert!(
        dns.log().contains("query[SRV] _memcache._tcp.mc.test"),
        "memroute did not ask for SRV records\n{}",
        dns.log()
    );
}

#[test]
fn a_large_srv_answer_is_read_whole() {
    // 40 pods behind one headless service: the answer (40 SRV records and their addresses)
    // is far beyond 512 bytes, so it needs EDNS(0) or the retry over TCP after truncation.
    // Nothing listens on these addresses: the test counts the servers memroute puts in
    // the pool, not their replies.
    let port = free_port();
    let hosts: Vec<String> = (0..40)
        .map(|i| format!("127.0.1.{} pod-{i}.memcached.test", i + 1))
        .collect();
    let srv: Vec<String> = (0..40)
        .map(|i| format!("_memcache._tcp.memcached.test,pod-{i}.memcached.test,{port}"))
        .collect();
    let dns = Dnsmasq::start(&hosts, &srv, 30);
    let proxy = Memroute::start(&discovery_config(
        "{ srv = \"_memcache._tcp.memcached.test\", refresh = \"10s\" }",
        &dns,
    ));
    wait_pool_size(&proxy, 40);
    let stats = proxy.stats();
    for i in 0..40 {
        let server = format!("server:d:127.0.1.{}:{port}:errors", i + 1);
        assert!(
            stats.iter().any(|(k, _)| *k == server),
            "{server} missing: {stats:?}"
        );
    }
}
