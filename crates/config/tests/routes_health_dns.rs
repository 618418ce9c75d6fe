//! Every route type with its defaults, pool health settings, DNS
//! discovery, and every class of mistake reported with its key path, all at once.
use std::path::PathBuf;
use std::time::Duration;

use memroute_config::{
    parse, Config, ConfigError, DnsDiscovery, DnsKind, ErrorKind, FailoverErrors, FailoverOn,
    Operation, ReadPolicy, RouteConfig, ShadowSelect, WritePolicy,
};

/// Two pools, `a` and `b`, then `extra` (routes, and whatever else a test needs).
fn with_pools(extra: &str) -> String {
    format!(
        "[proxy]\nroute = \"root\"\n[pools.a]\nservers = [\"10.0.0.1:11211\"]\n\
         [pools.b]\nservers = [\"10.0.0.2:11211\"]\n{extra}"
    )
}

fn ok(extra: &str) -> Config {
    parse(&with_pools(extra)).unwrap_or_else(|e| panic!("should parse:\n{e}"))
}

fn errors(extra: &str) -> Vec<String> {
    match parse(&with_pools(extra)) {
        Ok(c) => panic!("config should fail but parsed: {c:?}"),
        Err(e) => e.0.iter().map(ConfigError::to_string).collect(),
    }
}

fn root(c: &Config) -> &RouteConfig {
    &c.routes["root"]
}

#[test]
fn operation_route_in_operation_order() {
    let c = ok(r#"
[routes.root]
type = "operation"
flush_all = "b"
delete = "b"
get = "a"
default = "a"
"#);
    assert_eq!(
        root(&c),
        &RouteConfig::Operation {
            operations: vec![
                (Operation::Get, "a".into()),
                (Operation::Delete, "b".into()),
                (Operation::FlushAll, "b".into()),
            ],
            default: "a".into(),
        }
    );
}

#[test]
fn shadow_route_fraction_key_range_and_defaults() {
    let c = ok(r#"
[routes.root]
type = "shadow"
primary = "a"
shadow = "b"
fraction = 0.25
"#);
    assert_eq!(
        root(&c),
        &RouteConfig::Shadow {
            primary: "a".into(),
            shadow: "b".into(),
            select: ShadowSelect::Fraction(0.25),
            max_in_flight: 1000,
        }
    );
    let c = ok(r#"
[routes.root]
type = "shadow"
primary = "a"
shadow = "b"
key_range = [0, 0.5]
max_in_flight = 10
"#);
    assert_eq!(
        root(&c),
        &RouteConfig::Shadow {
            primary: "a".into(),
            shadow: "b".into(),
            select: ShadowSelect::KeyRange(0.0, 0.5),
            max_in_flight: 10,
        }
    );
    // The integers 0 and 1 are numbers between 0 and 1 too.
    let c = ok(r#"
[routes.root]
type = "shadow"
primary = "a"
shadow = "b"
fraction = 1
"#);
    assert!(matches!(
        root(&c),
        RouteConfig::Shadow {
            select: ShadowSelect::Fraction(f),
            ..
        } if *f == 1.0
    ));
}

#[test]
fn replicated_route_defaults_and_every_policy() {
    let c = ok(r#"
[routes.root]
type = "replicated"
children = ["a", "b"]
"#);
    assert_eq!(
        root(&c),
        &RouteConfig::Replicated {
            children: vec!["a".into(), "b".into()],
            writes: WritePolicy::AllSync,
            reads: ReadPolicy::Failover,
        }
    );
    let writes = [
        ("all-sync", WritePolicy::AllSync),
        ("all-async", WritePolicy::AllAsync),
        ("all-initial", WritePolicy::AllInitial),
        ("all-majority", WritePolicy::AllMajority),
    ];
    let reads = [
        ("first", ReadPolicy::First),
        ("failover", ReadPolicy::Failover),
        ("random", ReadPolicy::Random),
        ("fastest", ReadPolicy::Fastest),
    ];
    for ((w, want_w), (r, want_r)) in writes.into_iter().zip(reads) {
        let c = ok(&format!(
            "[routes.root]\ntype = \"replicated\"\nchildren = [\"a\", \"b\"]\n\
             writes = \"{w}\"\nreads = \"{r}\"\n"
        ));
        let RouteConfig::Replicated { writes, reads, .. } = root(&c) else {
            panic!("expected a replicated route");
        };
        assert_eq!((*writes, *reads), (want_w, want_r), "{w} / {r}");
    }
}

#[test]
fn failover_random_null_and_error_routes() {
    let c = ok(r#"
[routes.root]
type = "failover"
children = ["a", "b"]
[routes.miss]
type = "failover"
children = ["b", "a"]
on = "error-or-miss"
[routes.rand]
type = "random"
children = ["a", "b", "root"]
[routes.nothing]
type = "null"
[routes.broken]
type = "error"
[routes.maintenance]
type = "error"
message = "down for maintenance"
"#);
    assert_eq!(
        c.routes["root"],
        RouteConfig::Failover {
            children: vec!["a".into(), "b".into()],
            on: FailoverOn::Error,
            errors: FailoverErrors::ALL,
            exptime_cap: None,
        }
    );
    assert_eq!(
        c.routes["miss"],
        RouteConfig::Failover {
            children: vec!["b".into(), "a".into()],
            on: FailoverOn::ErrorOrMiss,
            errors: FailoverErrors::ALL,
            exptime_cap: None,
        }
    );
    assert_eq!(
        c.routes["rand"],
        RouteConfig::Random {
            children: vec!["a".into(), "b".into(), "root".into()],
        }
    );
    assert_eq!(c.routes["nothing"], RouteConfig::Null);
    assert_eq!(
        c.routes["broken"],
        RouteConfig::Error {
            message: "error route".into()
        }
    );
    assert_eq!(
        c.routes["maintenance"],
        RouteConfig::Error {
            message: "down for maintenance".into()
        }
    );
}

#[test]
fn warm_up_route_ttl_forms() {
    let ttl_of = |ttl_line: &str| {
        let c = ok(&format!(
            "[routes.root]\ntype = \"warm-up\"\ncold = \"a\"\nwarm = \"b\"\n{ttl_line}\n"
        ));
        let RouteConfig::WarmUp { cold, warm, ttl } = root(&c) else {
            panic!("expected a warm-up route");
        };
        assert_eq!((cold.as_str(), warm.as_str()), ("a", "b"));
        *ttl
    };
    assert_eq!(ttl_of(""), 0, "default: never expire");
    assert_eq!(ttl_of("ttl = \"1h\""), 3600);
    assert_eq!(
        ttl_of("ttl = 90"),
        90,
        "an integer is seconds, as memcached"
    );
    assert_eq!(
        ttl_of("ttl = \"1500ms\""),
        1,
        "rounded down to whole seconds"
    );
    assert_eq!(ttl_of("ttl = 0"), 0);
    assert_eq!(
        ttl_of("ttl = \"720h\""),
        30 * 24 * 3600,
        "30 days is the limit"
    );
}

#[test]
fn pool_health_defaults_and_settings() {
    let c = ok("[routes.root]\ntype = \"null\"\n");
    let a = &c.pools["a"];
    assert_eq!(a.failure_limit, 3);
    assert!(!a.eject);
    assert_eq!(a.max_ejected_fraction, 0.5);
    assert_eq!(a.probe_interval, Duration::from_millis(200));
    assert_eq!(a.probe_interval_max, Duration::from_millis(500));
    assert_eq!(a.discovery, None);

    let c = parse(
        r#"
[pools.a]
servers = ["10.0.0.1:11211", "10.0.0.2:11211"]
failure_limit = 1
eject = true
max_ejected_fraction = 0.34
probe_interval = "200ms"
probe_interval_max = "10s"
[pools.b]
servers = ["10.0.0.3:11211"]
max_ejected_fraction = 1
probe_interval = "1m"
[proxy]
route = "a"
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let a = &c.pools["a"];
    assert_eq!(a.failure_limit, 1);
    assert!(a.eject);
    assert_eq!(a.max_ejected_fraction, 0.34);
    assert_eq!(a.probe_interval, Duration::from_millis(200));
    assert_eq!(a.probe_interval_max, Duration::from_secs(10));
    let b = &c.pools["b"];
    assert_eq!(b.max_ejected_fraction, 1.0);
    assert_eq!(
        b.probe_interval_max,
        Duration::from_secs(60),
        "unset, the ceiling is never below the first interval"
    );
}

#[test]
fn dns_pool_and_discovery_table() {
    let c = parse(
        r#"
[discovery]
hosts_file = "/etc/memroute/hosts"
[pools.dns]
servers = { dns = "memcached.cache.svc.cluster.local:11211" }
[pools.fast]
servers = { dns = "mc:11212", refresh = "500ms" }
[proxy]
route = "dns"
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.discovery.hosts_file,
        Some(PathBuf::from("/etc/memroute/hosts"))
    );
    let dns = &c.pools["dns"];
    assert!(dns.servers.is_empty(), "filled in by the proxy");
    assert_eq!(
        dns.discovery,
        Some(DnsDiscovery {
            host: "memcached.cache.svc.cluster.local".into(),
            port: 11211,
            refresh: Duration::from_secs(5),
            kind: DnsKind::Address,
        })
    );
    assert_eq!(
        c.pools["fast"].discovery,
        Some(DnsDiscovery {
            host: "mc".into(),
            port: 11212,
            refresh: Duration::from_millis(500),
            kind: DnsKind::Address,
        })
    );
    let c = parse("[pools.a]\nservers = [\"10.0.0.1:11211\"]\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.discovery.hosts_file, None,
        "no [discovery]: no hosts file"
    );
    assert!(c.discovery.nameservers.is_empty(), "default: resolv.conf");
}

#[test]
fn srv_pool_and_nameservers() {
    let c = parse(
        r#"
[discovery]
nameservers = ["127.0.0.1:5353", "10.96.0.10", "[::1]:53"]
[pools.mc]
servers = { srv = "_memcache._tcp.memcached.default.svc.cluster.local", refresh = "30s" }
[proxy]
route = "mc"
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let shown: Vec<String> = c
        .discovery
        .nameservers
        .iter()
        .map(|a| a.to_string())
        .collect();
    assert_eq!(shown, ["127.0.0.1:5353", "10.96.0.10:53", "[::1]:53"]);
    assert_eq!(
        c.pools["mc"].discovery,
        Some(DnsDiscovery {
            host: "_memcache._tcp.memcached.default.svc.cluster.local".into(),
            port: 0,
            refresh: Duration::from_secs(30),
            kind: DnsKind::Srv,
        })
    );
}

#[test]
fn bad_srv_and_nameserver_settings_name_their_keys() {
    let e = errors(
        r#"
[discovery]
nameservers = ["dns.example", 53]
[pools.both]
servers = { dns = "mc:11211", srv = "_memcache._tcp.mc" }
[pools.plain]
servers = { srv = "memcached.default.svc" }
[pools.port]
servers = { srv = "_memcache._tcp.mc:11211" }
[pools.none]
servers = { refresh = "1s" }
[routes.root]
type = "random"
children = ["a", "b"]
"#,
    );
    assert_eq!(
        e,
        [
            "discovery.nameservers[0]: invalid nameserver \"dns.example\" (expected \"ip\" or \"ip:port\", e.g. \"10.96.0.10:53\")",
            "discovery.nameservers[1]: expected a string, found an integer",
            "pools.both.servers: give either dns = \"name:port\" or srv = \"_service._proto.name\", not both",
            "pools.none.servers.dns: required (the name to resolve, as \"name:port\"; or srv = \"_service._proto.name\")",
            "pools.plain.servers.srv: invalid SRV name \"memcached.default.svc\" (expected \"_service._proto.name\", e.g. \"_memcache._tcp.memcached.cache.svc.cluster.local\")",
            "pools.port.servers.srv: invalid SRV name \"_memcache._tcp.mc:11211\" (expected \"_service._proto.name\", e.g. \"_memcache._tcp.memcached.cache.svc.cluster.local\")",
        ]
    );
}

#[test]
fn every_target_of_every_route_type_is_checked() {
    let e = errors(
        r#"
[routes.root]
type = "operation"
get = "nope1"
default = "a"
[routes.s]
type = "shadow"
primary = "a"
shadow = "nope2"
fraction = 0.1
[routes.r]
type = "replicated"
children = ["a", "nope3"]
[routes.f]
type = "failover"
children = ["nope4"]
[routes.w]
type = "warm-up"
cold = "nope5"
warm = "b"
[routes.x]
type = "random"
children = ["b", "a", "nope6"]
"#,
    );
    assert_eq!(
        e,
        [
            "routes.f.children[0]: unknown target \"nope4\" (no pool or route has that name)",
            "routes.r.children[1]: unknown target \"nope3\" (no pool or route has that name)",
            "routes.root.get: unknown target \"nope1\" (no pool or route has that name)",
            "routes.s.shadow: unknown target \"nope2\" (no pool or route has that name)",
            "routes.w.cold: unknown target \"nope5\" (no pool or route has that name)",
            "routes.x.children[2]: unknown target \"nope6\" (no pool or route has that name)",
        ]
    );
}

#[test]
fn cycles_through_every_kind_of_edge_are_found() {
    let e = errors(
        r#"
[routes.root]
type = "failover"
children = ["a", "back"]
[routes.back]
type = "shadow"
primary = "a"
shadow = "root"
fraction = 0.5
[routes.w]
type = "warm-up"
cold = "a"
warm = "o"
[routes.o]
type = "operation"
set = "w"
default = "a"
[routes.rep]
type = "replicated"
children = ["a", "rep"]
"#,
    );
    assert_eq!(
        e,
        [
            "routes.back.shadow: route cycle back -> root -> back",
            "routes.o.set: route cycle o -> w -> o",
            "routes.rep.children[1]: route cycle rep -> rep",
        ]
    );
}

#[test]
fn bad_route_values_are_all_reported() {
    let e = errors(
        r#"
[routes.root]
type = "shadow"
primary = "a"
shadow = "b"
fraction = 1.5
[routes.both]
type = "shadow"
primary = "a"
shadow = "b"
fraction = 0.1
key_range = [0.1, 0.2]
[routes.reversed]
type = "shadow"
primary = "a"
shadow = "a"
key_range = [0.6, 0.2]
max_in_flight = 0
[routes.short]
type = "shadow"
primary = "a"
shadow = "b"
key_range = [0.5]
[routes.nan]
type = "shadow"
primary = "a"
shadow = "b"
key_range = [nan, 2]
[routes.empty]
type = "replicated"
children = []
writes = "all-quorum"
reads = "closest"
[routes.dup]
type = "failover"
children = ["a", "b", "a"]
on = "miss"
[routes.nokids]
type = "random"
[routes.ops]
type = "operation"
get = "a"
mget = "b"
[routes.noops]
type = "operation"
default = "a"
[routes.warm]
type = "warm-up"
cold = "a"
warm = "a"
ttl = "10ms"
[routes.warm2]
type = "warm-up"
cold = "a"
warm = "b"
ttl = "31d"
[routes.warm3]
type = "warm-up"
cold = "a"
warm = "b"
ttl = 2592001
[routes.nil]
type = "null"
default = "a"
[routes.err]
type = "error"
message = "two\r\nlines"
"#,
    );
    assert_eq!(
        e,
        [
            "routes.both: set either fraction or key_range, not both (they both choose which keys are shadowed)",
            "routes.dup.children[2]: duplicate child \"a\" (also children[0])",
            "routes.dup.on: unknown value \"miss\" (expected one of: error, error-or-miss)",
            "routes.empty.children: needs at least one child",
            "routes.empty.writes: unknown value \"all-quorum\" (expected one of: all-sync, all-async, all-initial, all-majority)",
            "routes.empty.reads: unknown value \"closest\" (expected one of: first, failover, random, fastest, nearest)",
            "routes.err.message: must be non-empty and on one line (no \\r or \\n)",
            "routes.nan.key_range[0]: must be between 0 and 1 (found nan)",
            "routes.nan.key_range[1]: must be between 0 and 1 (found 2)",
            "routes.nil.default: unknown key (expected one of: type)",
            "routes.nokids.children: required (a non-empty array of target names)",
            "routes.noops: an operation route needs at least one operation (one of: get, gets, gat, gats, set, add, replace, append, prepend, cas, delete, incr, decr, touch, flush_all)",
            "routes.ops.mget: unknown key (expected one of: type, default, get, gets, gat, gats, set, add, replace, append, prepend, cas, delete, incr, decr, touch, flush_all)",
            "routes.ops.default: required (the target for operations not named here)",
            "routes.reversed.shadow: must differ from primary (both are \"a\")",
            "routes.reversed.key_range: the range must not be reversed: need a <= b (found [0.6, 0.2])",
            "routes.reversed.max_in_flight: must be > 0",
            "routes.root.fraction: must be between 0 and 1 (found 1.5)",
            "routes.short.key_range: must be two numbers [a, b] (found [0.5])",
            "routes.warm.warm: must differ from cold (both are \"a\")",
            "routes.warm.ttl: must be at least 1s (memcached expiry is in whole seconds; 0 = never)",
            "routes.warm2.ttl: invalid duration \"31d\" (expected a duration such as \"250ms\", \"1s\", \"2m\" or an integer number of milliseconds)",
            "routes.warm3.ttl: must be at most 30 days (2592000s): memcached reads a larger expiry as a unix timestamp (found 2592001s)",
        ]
    );
}

#[test]
fn bad_pool_health_and_dns_values_are_all_reported() {
    let e = match parse(
        r#"
[discovery]
hosts_file = 3
resolver = "8.8.8.8"
[pools.a]
servers = ["10.0.0.1:11211"]
failure_limit = 0
eject = "yes"
max_ejected_fraction = 2
probe_interval = "5s"
probe_interval_max = "2s"
[pools.b]
servers = { dns = "no-port" }
[pools.c]
servers = { dns = ":11211", refresh = 0, weight = 2 }
[pools.d]
servers = { refresh = "1s" }
[pools.e]
servers = { dns = "mc:70000" }
[pools.f]
servers = []
[pools.g]
servers = "10.0.0.1:11211"
[proxy]
route = "a"
"#,
    ) {
        Ok(c) => panic!("should fail: {c:?}"),
        Err(e) => e.0.iter().map(ConfigError::to_string).collect::<Vec<_>>(),
    };
    assert_eq!(
        e,
        [
            "discovery.resolver: unknown key (expected one of: hosts_file, nameservers)",
            "discovery.hosts_file: expected a string, found an integer",
            "pools.a.failure_limit: must be > 0",
            "pools.a.eject: expected true or false, found a string",
            "pools.a.max_ejected_fraction: must be between 0 and 1 (found 2)",
            "pools.a.probe_interval_max: must be at least probe_interval (found 2s < 5s)",
            "pools.b.servers.dns: invalid DNS name \"no-port\" (expected \"name:port\", e.g. \"memcached.cache.svc:11211\")",
            "pools.c.servers.weight: unknown key (expected one of: dns, srv, refresh)",
            "pools.c.servers.dns: invalid DNS name \":11211\" (expected \"name:port\", e.g. \"memcached.cache.svc:11211\")",
            "pools.c.servers.refresh: must be > 0",
            "pools.d.servers.dns: required (the name to resolve, as \"name:port\"; or srv = \"_service._proto.name\")",
            "pools.e.servers.dns: invalid DNS name \"mc:70000\" (expected \"name:port\", e.g. \"memcached.cache.svc:11211\")",
            "pools.f.servers: a pool needs at least one server (or servers = { dns = ... })",
            "pools.g.servers: expected an array of servers or a table { dns = \"name:port\" }, found a string",
        ]
    );
}

/// One file with mistakes in every part: all of them come back together, each with
/// its path and kind, so an operator fixes the file in one go (the wording of each is
/// pinned by the tests of its section).
#[test]
fn several_errors_are_reported_at_once() {
    let e = match parse(
        r#"
[proxy]
route = "front"
[pools.main]
servers = []
failure_limit = -1
[pools.dns]
servers = { dns = "mc.svc", refresh = "soon" }
[routes.front]
type = "failover"
children = ["main", "ghost"]
[routes.copy]
type = "shadow"
primary = "front"
shadow = "main"
fraction = 0.1
key_range = [0.2, 0.1]
[routes.loop]
type = "random"
children = ["loop"]
"#,
    ) {
        Ok(c) => panic!("should fail: {c:?}"),
        Err(e) => e,
    };
    assert_eq!(
        e.kinds(),
        [
            ("pools.dns.servers.dns", ErrorKind::Invalid),
            ("pools.dns.servers.refresh", ErrorKind::Invalid),
            ("pools.main.servers", ErrorKind::Missing),
            ("pools.main.failure_limit", ErrorKind::OutOfRange),
            ("routes.copy.key_range", ErrorKind::Invalid),
            ("routes.copy", ErrorKind::Conflict),
            ("routes.front.children[1]", ErrorKind::UnknownTarget),
            ("routes.loop.children[0]", ErrorKind::Circle),
        ]
    );
}
