//! DNS discovery against real memcached: `servers = { dns = "memcached.test:PORT" }` resolved
//! through a hosts file fixture (`[discovery] hosts_file`), so no network is needed. The
//! servers listen on the same port on different loopback addresses (127.0.0.X), as servers
//! behind one DNS name do.
//!
//! ```text
//!   hosts file (rewritten by the test) ──refresh──> memroute pool d ──> 127.0.0.X:PORT memcached
//! ```
//!
//! Every wait is on memroute's own log line or stats, bounded.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use memroute_tests::*;

const NAME: &str = "memcached.test";
/// Discovery refreshes every 100 ms in these tests; a change must show within this.
const DISCOVERY_DEADLINE: Duration = Duration::from_secs(10);

/// Two memcached servers on the same free port, on two loopback addresses.
fn two_servers_on_one_port() -> (u16, Memcached, Memcached) {
    let port = free_port();
    let a = Memcached::start_on(&free_loopback_host(port), port, 8);
    let b = Memcached::start_on(&free_loopback_host(port), port, 8);
    (port, a, b)
}

/// A hosts file in its own directory; rewrites are atomic (write a sibling, rename over it)
/// so memroute never reads half a file.
struct Hosts {
    dir: TempDir,
    path: PathBuf,
}

impl Hosts {
    fn new(lines: &[String]) -> Hosts {
        let dir = TempDir::new("discovery");
        let path = dir.path().join("hosts");
        let hosts = Hosts { dir, path };
        hosts.write(lines);
        hosts
    }

    fn write(&self, lines: &[String]) {
        let staged = self.dir.write(
            "hosts.new",
            &format!("# memroute test fixture\n{}\n", lines.join("\n")),
        );
        std::fs::rename(staged, &self.path).expect("replace the hosts file");
    }
}

fn entry(server: &Memcached) -> String {
    format!("{} {NAME}", server.host)
}

fn dns_config(port: u16, hosts: &Hosts, distribution: &str) -> String {
    format!(
        "{}[pools.d]\nservers = {{ dns = \"{NAME}:{port}\", refresh = \"100ms\" }}\n\
         distribution = \"{distribution}\"\nhash = \"md5\"\ntimeout = \"200ms\"\n\n\
         [discovery]\nhosts_file = {:?}\n",
        proxy_section(&format!("127.0.0.1:{}", free_port()), "d"),
        hosts.path.display().to_string()
    )
}

fn wait_pool_size(proxy: &Memroute, n: u64) {
    proxy.wait_stats(&format!("pool:d:servers == {n}"), DISCOVERY_DEADLINE, |s| {
        stat_u64(s, "pool:d:servers") == Some(n)
    });
}

fn value_of(key: &str) -> String {
    format!("v-{key}")
}

#[test]
fn pool_follows_the_hosts_file_and_keeps_the_last_good_set_when_lookup_fails() {
    let (port, m1, m2) = two_servers_on_one_port();
    let hosts = Hosts::new(&[entry(&m1)]);
    let proxy = Memroute::start(&dns_config(port, &hosts, "ketama"));
    wait_pool_size(&proxy, 1);

    let first: Vec<String> = (0..100).map(|i| format!("one{i}")).collect();
    let mut c = proxy.connect();
    c.set_many(&first, value_of);
    assert_eq!(
        m1.held(&first).len(),
        100,
        "with one address, every key is on it"
    );
    assert_eq!(m2.stat("curr_items"), 0);

    // The name now resolves to both. m1 stays, so memroute keeps its connection to it:
    // count what m1 opens from here on, minus this test's own direct connections.
    let m1_opened = m1.stat("total_connections");
    let mut own_connections_to_m1 = 0;
    let changes = proxy.log_count("discovered servers changed");
    let rewritten = Instant::now();
    hosts.write(&[entry(&m1), entry(&m2)]);
    assert!(
        proxy.wait_log_count(
            "discovered servers changed",
            changes + 1,
            DISCOVERY_DEADLINE
        ),
        "no `discovered servers changed` after the hosts file gained an address\n{}",
        proxy.log_text()
    );
    let noticed = rewritten.elapsed();
    wait_pool_size(&proxy, 2);

    // New keys spread over both: once the stats count 2 servers, a request sent after
    // is routed by those 2 on every worker (an operator reading the count is not misled).
    let spread: Vec<String> = (0..200).map(|i| format!("two{i}")).collect();
    c.set_many(&spread, value_of);
    let on_m1 = m1.held(&spread).len();
    own_connections_to_m1 += 1;
    let on_m2 = m2.held(&spread).len();
    assert!(
        on_m1 > 0 && on_m2 > 0,
        "with two servers, new keys all on one ({on_m1} / {on_m2})"
    );
    println!(
        "discovery: hosts file rewritten -> `discovered servers changed` in {:.0} ms (refresh 100ms); \
         {} new keys spread {on_m1} / {on_m2}",
        noticed.as_secs_f64() * 1000.0,
        spread.len()
    );
    assert_eq!(
        on_m1 + on_m2,
        spread.len(),
        "some new keys are on neither server"
    );
    own_connections_to_m1 += 1; // the stat below
    let opened = m1.stat("total_connections") - m1_opened;
    assert_eq!(
        opened, own_connections_to_m1,
        "memroute opened new connections to a server that stayed in the set"
    );

    // The name disappears: the lookup fails and the last good set stays in use.
    let failures = proxy.log_count("discovery lookup failed");
    hosts.write(&["127.0.0.1 other.test".to_string()]);
    assert!(
        proxy.wait_log_count("discovery lookup failed", failures + 1, DISCOVERY_DEADLINE),
        "no `discovery lookup failed` after the name left the hosts file\n{}",
        proxy.log_text()
    );
    assert_eq!(stat_u64(&proxy.stats(), "pool:d:servers"), Some(2));
    // (Keys set before the change are not checked: adding m2 moved some of them to it.)
    for k in &spread {
        assert_eq!(
            c.get(k).as_deref(),
            Some(value_of(k).as_bytes()),
            "{k} after a failed lookup"
        );
    }
    c.set("still", b"works");
    assert_eq!(c.get("still").as_deref(), Some(&b"works"[..]));

    // A missing hosts file is a failed lookup too, not an empty set.
    let failures = proxy.log_count("discovery lookup failed");
    std::fs::remove_file(&hosts.path).expect("delete the hosts file");
    assert!(
        proxy.wait_log_count("discovery lookup failed", failures + 1, DISCOVERY_DEADLINE),
        "no `discovery lookup failed` after the hosts file was deleted\n{}",
        proxy.log_text()
    );
    assert_eq!(stat_u64(&proxy.stats(), "pool:d:servers"), Some(2));
    for k in &spread {
        assert_eq!(c.get(k).as_deref(), Some(value_of(k).as_bytes()), "{k}");
    }
}

#[test]
fn resolved_order_does_not_depend_on_record_order() {
    // modula places keys by server index, so the two instances agree only if both order the
    // resolved addresses the same way.
    let (port, m1, m2) = two_servers_on_one_port();
    let hosts_a = Hosts::new(&[entry(&m1), entry(&m2)]);
    let hosts_b = Hosts::new(&[entry(&m2), entry(&m1)]);
    let proxy_a = Memroute::start(&dns_config(port, &hosts_a, "modula"));
    let proxy_b = Memroute::start(&dns_config(port, &hosts_b, "modula"));
    wait_pool_size(&proxy_a, 2);
    wait_pool_size(&proxy_b, 2);

    let keys: Vec<String> = (0..100).map(|i| format!("ord{i}")).collect();
    // Each instance writes its own values; which server holds an instance's value shows
    // where that instance placed the key.
    let placement = |proxy: &Memroute, tag: &str| {
        let value = |k: &str| format!("{tag}-{k}");
        proxy.connect().set_many(&keys, value);
        let tagged = |m: &Memcached| {
            let mut held: Vec<String> = m
                .held(&keys)
                .into_iter()
                .filter(|(k, v)| v == value(k).as_bytes())
                .map(|(k, _)| k)
                .collect();
            held.sort();
            held
        };
        let (on_m1, on_m2) = (tagged(&m1), tagged(&m2));
        assert_eq!(
            on_m1.len() + on_m2.len(),
            keys.len(),
            "{tag}: keys on neither server"
        );
        on_m1
    };
    let a = placement(&proxy_a, "a");
    let b = placement(&proxy_b, "b");
    println!(
        "discovery: records listed in opposite orders: {} / {} keys on the first address in both instances",
        a.len(),
        b.len()
    );
    assert!(
        !a.is_empty() && a.len() < keys.len(),
        "modula over two servers put {} of 100 keys on one",
        a.len()
    );
    assert_eq!(a, b, "the two instances place keys differently");
}

#[test]
fn aaaa_records_are_servers_too() {
    // The name resolves to an IPv4 and an IPv6 loopback address on the same port.
    let port = free_port();
    assert!(
        std::net::TcpListener::bind(("::1", port)).is_ok(),
        "[::1]:{port} is taken"
    );
    let v4 = Memcached::start_on(&free_loopback_host(port), port, 8);
    let v6 = Memcached::start_on("[::1]", port, 8);
    let hosts = Hosts::new(&[entry(&v4), format!("::1 {NAME}")]);
    let proxy = Memroute::start(&dns_config(port, &hosts, "ketama"));
    wait_pool_size(&proxy, 2);
    let keys: Vec<String> = (0..200).map(|i| format!("six{i}")).collect();
    proxy.connect().set_many(&keys, value_of);
    let (on_v4, on_v6) = (v4.held(&keys).len(), v6.held(&keys).len());
    println!("discovery: A + AAAA records: 200 keys spread {on_v4} (IPv4) / {on_v6} (IPv6)");
    assert_eq!(on_v4 + on_v6, keys.len());
    assert!(on_v4 > 0 && on_v6 > 0, "keys {on_v4} / {on_v6}");
}

/// A random route over a pool and a DNS pool whose name does not resolve yet (no servers)
/// draws once per request: the DNS pool's draws answer memcached's SERVER_ERROR for a pool
/// without servers, about half of them. Drawing again in the route executor after a pick
/// of the empty pool (as once happened for single-key requests) answered only a quarter
/// with the error, sending the rest to the other pool.
#[test]
fn random_route_over_a_pool_without_servers_yet_draws_once() {
    let server = Memcached::start();
    let port = free_port();
    // The name is not in the hosts file: the DNS pool starts empty.
    let hosts = Hosts::new(&[]);
    let config = format!(
        "{}{}[pools.d]\nservers = {{ dns = \"{NAME}:{port}\", refresh = \"100ms\" }}\n\
         distribution = \"ketama\"\nhash = \"md5\"\ntimeout = \"200ms\"\n\n\
         [routes.rnd]\ntype = \"random\"\nchildren = [\"p\", \"d\"]\n\n\
         [discovery]\nhosts_file = {:?}\n",
        proxy_section(&format!("127.0.0.1:{}", free_port()), "rnd"),
        pool_section("p", &[server.addr()], "timeout = \"200ms\""),
        hosts.path.display().to_string()
    );
    let proxy = Memroute::start(&config);
    let keys: Vec<String> = vec!["rnd:a".into(), "rnd:b".into()];
    let mut c = server.connect();
    for key in &keys {
        c.send(format!("set {key} 0 0 1\r\nv\r\n").as_bytes());
        assert_eq!(c.read_until(b"\r\n"), b"STORED\r\n");
    }
    let mut c = proxy.connect();
    // 400 draws of a fair coin: the empty pool's share is 0.5 +- 0.025 (one standard
    // deviation); 0.35-0.65 is six of them either way, while drawing twice gave 0.25.
    const DRAWS: usize = 400;
    for (what, request) in [
        ("single-key gets", format!("get {}\r\n", keys[0])),
        ("multi-gets", format!("get {}\r\n", keys.join(" "))),
    ] {
        let share = error_share(&mut c, request.as_bytes(), DRAWS, "pool has no servers");
        assert!(
            (0.35..=0.65).contains(&share),
            "{what}: the empty pool's share of {DRAWS} draws was {share:.2}, not about half"
        );
    }
}
