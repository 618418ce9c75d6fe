//! Every example in config/ parses, and each class of bad config is reported with
//! its exact key path and message, all errors at once.
use std::path::PathBuf;
use std::time::Duration;

use memroute_config::{
    parse, ConfigError, DistributionName, ErrorKind, HashName, ListenAddress, RouteConfig,
};

fn config_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config")
}

/// The errors of a config that must fail, as "path: message" strings.
fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(c) => panic!("config should fail but parsed: {c:?}"),
        Err(e) => e.0.iter().map(ConfigError::to_string).collect(),
    }
}

#[test]
fn every_example_config_parses() {
    let mut count = 0;
    let entries = std::fs::read_dir(config_dir()).expect("config/ exists");
    for entry in entries {
        let path = entry.expect("readable dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        count += 1;
        if let Err(e) = memroute_config::load(&path) {
            panic!("{} does not parse:\n{e}", path.display());
        }
    }
    assert!(
        count >= 14,
        "expected the fourteen example configs, found {count}"
    );
}

/// An operator looking for how to write a route type, health settings or DNS
/// discovery finds a parsed, commented example of each in config/.
#[test]
fn examples_show_every_route_type_health_and_dns() {
    let load = |name: &str| {
        memroute_config::load(&config_dir().join(name))
            .unwrap_or_else(|e| panic!("{name} does not parse:\n{e}"))
    };
    let mut kinds = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(config_dir()).expect("config/ exists") {
        let path = entry.expect("readable dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let c = memroute_config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        for route in c.routes.values() {
            kinds.insert(match route {
                RouteConfig::Prefix { .. } => "prefix",
                RouteConfig::Operation { .. } => "operation",
                RouteConfig::Shadow { .. } => "shadow",
                RouteConfig::Replicated { .. } => "replicated",
                RouteConfig::Failover { .. } => "failover",
                RouteConfig::WarmUp { .. } => "warm-up",
                RouteConfig::Random { .. } => "random",
                RouteConfig::Null => "null",
                RouteConfig::Error { .. } => "error",
            });
        }
    }
    assert_eq!(kinds.len(), 9, "route types shown: {kinds:?}");

    let health = load("health.toml");
    let sessions = &health.pools["sessions"];
    assert!(sessions.eject);
    assert_eq!(sessions.failure_limit, 2);
    assert_eq!(sessions.probe_interval, Duration::from_millis(500));
    assert_eq!(sessions.probe_interval_max, Duration::from_secs(10));

    let dns = load("dns.toml");
    assert!(
        dns.pools.values().any(|p| p
            .discovery
            .as_ref()
            .is_some_and(|d| d.kind == memroute_config::DnsKind::Srv)),
        "dns.toml shows an SRV pool"
    );
    for pool in dns.pools.values() {
        let d = pool
            .discovery
            .as_ref()
            .expect("every pool in dns.toml uses DNS");
        match d.kind {
            memroute_config::DnsKind::Address => assert_eq!(d.port, 11211),
            memroute_config::DnsKind::Srv => assert!(d.host.starts_with("_memcache._tcp.")),
        }
        assert_eq!(d.refresh, Duration::from_secs(5));
        assert!(pool.servers.is_empty());
    }
}

#[test]
fn bundled_default_is_what_the_demo_expects() {
    let c = memroute_config::load(&config_dir().join("memroute.toml")).expect("parses");
    assert_eq!(
        c.proxy.listen,
        vec![ListenAddress::Tcp("127.0.0.1:11311".into())]
    );
    assert_eq!(c.proxy.route, "main");
    let main = &c.pools["main"];
    let addrs: Vec<&str> = main.servers.iter().map(|s| s.address.as_str()).collect();
    assert_eq!(addrs, ["127.0.0.1:21211", "127.0.0.1:21212"]);
    assert_eq!(main.distribution, DistributionName::Ketama);
    assert_eq!(main.hash, HashName::Fnv1a_64);
}

#[test]
fn minimal_config_gets_documented_defaults() {
    let c = parse("[pools.only]\nservers = [\"10.0.0.1:11211\"]\n").expect("parses");
    assert_eq!(
        c.proxy.listen,
        vec![ListenAddress::Tcp("127.0.0.1:11211".into())]
    );
    assert!(c.proxy.workers >= 1, "0 resolves to the core count");
    assert_eq!(c.proxy.backlog, 65535);
    assert_eq!(c.proxy.route, "only", "a single pool is the default route");
    assert_eq!(c.proxy.max_value_size, 1024 * 1024);
    assert_eq!(c.proxy.max_line_size, 64 * 1024);
    assert_eq!(c.proxy.max_client_pending, 256);
    assert_eq!(c.proxy.shutdown_timeout, std::time::Duration::from_secs(10));
    assert_eq!(c.proxy.max_connections, 0);
    assert_eq!(c.proxy.drain_delay, std::time::Duration::from_secs(5));
    assert_eq!(c.proxy.io, memroute_config::IoMode::IoUring);
    assert_eq!(c.proxy.max_buffered_replies, 64 * 1024 * 1024);
    assert_eq!(
        c.proxy.slow_client_timeout,
        std::time::Duration::from_secs(10)
    );
    assert_eq!(c.admin, None);
    let p = &c.pools["only"];
    assert_eq!(p.distribution, DistributionName::Ketama);
    assert_eq!(p.hash, HashName::Fnv1a_64);
    assert_eq!(p.hash_tag, None);
    assert_eq!(p.vnodes, 256);
    assert_eq!(p.connections, 1);
    assert_eq!(p.timeout, Duration::from_millis(250));
    assert_eq!(p.connect_timeout, Duration::from_millis(250));
    assert_eq!(p.max_keys_per_request, 100);
    assert_eq!(p.servers[0].weight, 1);
    assert_eq!(p.servers[0].name, None);
}

#[test]
fn server_forms_sizes_durations_and_prefix_order() {
    let c = parse(
        r#"
[proxy]
listen = ["0.0.0.0:11211", "unix:/run/memroute.sock", "[::1]:11211"]
workers = 3
max_value_size = "512KiB"
max_line_size = 2048
route = "r"

[pools.a]
servers = [
  "10.0.0.1:11211",
  "10.0.0.2:11211:3",
  "10.0.0.3:11211:2 mc-3",
  { address = "10.0.0.4:11211", weight = 5, name = "mc-4" },
  { address = "[fe80::1]:11211" },
]
hash_tag = "{}"
timeout = "1s"
connect_timeout = 40

[pools.b]
servers = ["b.example.com:11211"]
timeout = "2m"

[routes.r]
type = "prefix"
prefixes = { "a:" = "a", "a:long:" = "b", "z" = "b" }
default = "a"
"#,
    )
    .expect("parses");
    assert_eq!(c.proxy.workers, 3);
    assert_eq!(c.proxy.max_value_size, 512 * 1024);
    assert_eq!(c.proxy.max_line_size, 2048);
    assert_eq!(
        c.proxy.listen[1],
        ListenAddress::Unix("/run/memroute.sock".into())
    );
    let a = &c.pools["a"];
    let got: Vec<(&str, u32, Option<&str>)> = a
        .servers
        .iter()
        .map(|s| (s.address.as_str(), s.weight, s.name.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            ("10.0.0.1:11211", 1, None),
            ("10.0.0.2:11211", 3, None),
            ("10.0.0.3:11211", 2, Some("mc-3")),
            ("10.0.0.4:11211", 5, Some("mc-4")),
            ("[fe80::1]:11211", 1, None),
        ]
    );
    assert_eq!(a.hash_tag, Some(*b"{}"));
    assert_eq!(a.timeout, Duration::from_secs(1));
    assert_eq!(a.connect_timeout, Duration::from_millis(40));
    assert_eq!(c.pools["b"].timeout, Duration::from_secs(120));
    assert_eq!(
        c.pools["b"].connect_timeout,
        Duration::from_secs(120),
        "defaults to timeout"
    );
    let RouteConfig::Prefix { prefixes, default } = &c.routes["r"] else {
        panic!("expected a prefix route")
    };
    let order: Vec<&str> = prefixes.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(order, ["a:long:", "a:", "z"], "longest prefix first");
    assert_eq!(default, "a");
}

#[test]
fn syntax_error_names_line_and_column() {
    let e = parse("[proxy]\nlisten = [\"a:1\"\nworkers = 2\n").expect_err("not TOML");
    assert_eq!(e.kinds(), [("line 3, column 1", ErrorKind::Syntax)], "{e}");
}

#[test]
fn a_file_that_cannot_be_read_is_a_file_error() {
    let missing = std::env::temp_dir().join("memroute-config-test-no-such-file.toml");
    let e = memroute_config::load(&missing).expect_err("no such file");
    assert_eq!(e.kinds(), [("", ErrorKind::File)], "{e}");
}

#[test]
fn unknown_keys_are_errors_with_their_path() {
    let e = errors(
        r#"
[proxy]
listne = ["127.0.0.1:1"]
[pools.main]
servers = [{ address = "10.0.0.1:11211", wieght = 2 }]
hashh = "md5"
[extra]
"#,
    );
    assert_eq!(
        e,
        [
            "extra: unknown key (expected one of: proxy, admin, pools, routes, discovery)",
            "proxy.listne: unknown key (expected one of: listen, workers, backlog, route, max_value_size, max_line_size, max_client_pending, max_connections, shutdown_timeout, drain_delay, max_buffered_replies, slow_client_timeout, io, zone, routing_prefix, fastopen, fastopen_connect, tls_handshake_timeout, tls_ticket_lifetime, tls_session_cache)",
            "pools.main.hashh: unknown key (expected one of: servers, distribution, hash, hash_tag, vnodes, weights, salt, connections, timeout, connect_timeout, max_keys_per_request, coalesce_gets, collapse_gets, resize_window, failure_limit, eject, max_ejected_fraction, probe_interval, probe_interval_max, tls, zone, auth, routing_prefixes, keep_routing_prefix)",
            "pools.main.servers[0].wieght: unknown key (expected one of: address, weight, name)",
        ]
    );
}

#[test]
fn bad_servers_are_all_reported() {
    let e = errors(
        r#"
[pools.main]
servers = [
  "10.0.0.1:11211",
  { address = "10.0.0.2:11211", weight = 0 },
  "10.0.0.3:x",
  "10.0.0.1:11211:2",
  "10.0.0.5:11211:abc",
  "10.0.0.6:11211:1 a",
  "10.0.0.7:11211:1 a",
  "nohost",
]
[pools.empty]
servers = []
[pools.none]
"#,
    );
    assert_eq!(
        e,
        [
            "pools.empty.servers: a pool needs at least one server (or servers = { dns = ... })",
            "pools.main.servers[1].weight: must be > 0",
            "pools.main.servers[2].address: invalid address \"10.0.0.3:x\" (expected host:port with a numeric port)",
            "pools.main.servers[3].address: duplicate address \"10.0.0.1:11211\" (also servers[0])",
            "pools.main.servers[4].weight: expected an integer, found \"abc\"",
            "pools.main.servers[6].name: duplicate name \"a\" (also servers[5])",
            "pools.main.servers[7].address: invalid address \"nohost\" (expected host:port with a numeric port)",
            "pools.none.servers: a pool needs at least one server (or servers = { dns = ... })",
            "proxy.route: required when there is more than one pool (name the pool or route to send requests to)",
        ]
    );
}

#[test]
fn bad_pool_values_are_all_reported() {
    let e = errors(
        r#"
[pools.main]
servers = ["10.0.0.1:11211"]
hash = "foo"
distribution = "consistent"
hash_tag = "{"
connections = 0
vnodes = -1
timeout = "fast"
connect_timeout = 0
max_keys_per_request = "10"
"#,
    );
    assert_eq!(
        e,
        [
            "pools.main.distribution: unknown distribution \"consistent\" (expected one of: ketama, modula, random, ring, jump, ch3, wch3, crc32)",
            "pools.main.hash: unknown hash \"foo\" (expected one of: one_at_a_time, md5, crc16, crc32, crc32a, fnv1_64, fnv1a_64, fnv1_32, fnv1a_32, hsieh, murmur, jenkins, xxh3)",
            "pools.main.hash_tag: must be exactly two bytes, e.g. \"{}\" (found \"{\")",
            "pools.main.vnodes: must be > 0",
            "pools.main.connections: must be > 0",
            "pools.main.max_keys_per_request: expected an integer, found a string",
            "pools.main.timeout: invalid duration \"fast\" (expected a duration such as \"250ms\", \"1s\", \"2m\" or an integer number of milliseconds)",
            "pools.main.connect_timeout: must be > 0",
        ]
    );
}

#[test]
fn io_mode_is_epoll_or_io_uring() {
    for (text, mode) in [
        ("epoll", memroute_config::IoMode::Epoll),
        ("io_uring", memroute_config::IoMode::IoUring),
    ] {
        let c = parse(&format!(
            "[proxy]\nio = \"{text}\"\n[pools.only]\nservers = [\"10.0.0.1:11211\"]\n"
        ))
        .expect("parses");
        assert_eq!(c.proxy.io, mode);
    }
}

#[test]
fn bad_proxy_values_are_all_reported() {
    let e = errors(
        r#"
[proxy]
listen = ["0.0.0.0", "unix:relative.sock", 5]
workers = -1
backlog = 0
max_value_size = "1 PiB"
max_line_size = 10
max_client_pending = 0
io = "uring"
[admin]
listen = "localhost"
[pools.main]
servers = ["10.0.0.1:11211"]
"#,
    );
    assert_eq!(
        e,
        [
            "proxy.listen[0]: invalid address \"0.0.0.0\" (expected host:port with a numeric port), or unix:/path",
            "proxy.listen[1]: invalid unix socket address \"unix:relative.sock\" (expected unix:/absolute/path)",
            "proxy.listen[2]: expected a string or { address, route, tls, auth }, found an integer",
            "proxy.workers: must be >= 0",
            "proxy.backlog: must be > 0",
            "proxy.max_value_size: invalid size \"1 PiB\" (expected a size such as \"1MiB\", \"512KiB\" or an integer number of bytes)",
            "proxy.max_line_size: must be at least 1024 bytes",
            "proxy.max_client_pending: must be > 0",
            "proxy.io: unknown I/O mode `uring`; expected \"epoll\" or \"io_uring\"",
            "admin.listen: invalid address \"localhost\" (expected host:port with a numeric port)",
        ]
    );
}

#[test]
fn unknown_targets_are_reported() {
    let e = errors(
        r#"
[proxy]
route = "x"
[pools.main]
servers = ["10.0.0.1:11211"]
[routes.r]
type = "prefix"
prefixes = { "user:" = "users" }
default = "y"
"#,
    );
    assert_eq!(
        e,
        [
            "proxy.route: unknown target \"x\" (no pool or route has that name)",
            "routes.r.prefixes.\"user:\": unknown target \"users\" (no pool or route has that name)",
            "routes.r.default: unknown target \"y\" (no pool or route has that name)",
        ]
    );
}

#[test]
fn route_cycles_and_bad_routes_are_reported() {
    let e = errors(
        r#"
[proxy]
route = "a"
[pools.main]
servers = ["10.0.0.1:11211"]
[routes.a]
type = "prefix"
prefixes = { "x:" = "main" }
default = "b"
[routes.b]
type = "prefix"
prefixes = { "y:" = "a" }
default = "main"
[routes.self]
type = "prefix"
prefixes = { "s:" = "main" }
default = "self"
[routes.main]
type = "prefix"
prefixes = { "" = "a" }
default = "main"
[routes.odd]
type = "mirror"
[routes.untyped]
default = "main"
"#,
    );
    assert_eq!(
        e,
        [
            "routes.main.prefixes.\"\": a prefix must not be empty (use `default` for other keys)",
            "routes.odd.type: unknown route type \"mirror\" (expected one of: prefix, operation, shadow, replicated, failover, warm-up, random, null, error)",
            "routes.untyped.type: required (one of: prefix, operation, shadow, replicated, failover, warm-up, random, null, error)",
            "routes.main: \"main\" is also a pool name; a target name must be unique",
            "routes.a.default: route cycle a -> b -> a",
            "routes.self.default: route cycle self -> self",
        ]
    );
}

#[test]
fn no_pools_is_an_error() {
    assert_eq!(
        errors("[proxy]\nworkers = 1\n"),
        ["pools: at least one pool is required"]
    );
    assert_eq!(
        errors("pools = 3\n"),
        ["pools: expected a table, found an integer"]
    );
}

/// The nutcracker.yml quoted in config/twemproxy-compatible.toml imports to the same
/// proxy settings and pool as the example itself (checked with `nutcracker -t`).
#[test]
fn twemproxy_compatible_example_matches_its_import() {
    let yaml = "main:
  listen: 0.0.0.0:22121
  hash: fnv1a_64
  hash_tag: \"{}\"
  distribution: ketama
  timeout: 400
  backlog: 1024
  server_connections: 1
  servers:
   - 10.0.0.1:11211:1
   - 10.0.0.2:11211:1
   - 10.0.0.3:11212:1
";
    let imported = memroute_config::twemproxy::import(yaml).unwrap_or_else(|e| panic!("{e}"));
    let imported = parse(&imported).unwrap_or_else(|e| panic!("{e}"));
    let example =
        memroute_config::load(&config_dir().join("twemproxy-compatible.toml")).expect("parses");
    assert_eq!(imported.pools, example.pools);
    assert_eq!(imported.proxy, example.proxy);
    // twemproxy's default stats port, as memroute's admin port.
    assert_eq!(imported.admin, example.admin);
    assert_eq!(imported.admin.expect("[admin]").listen, "127.0.0.1:22222");
}

#[test]
fn drain_delay_may_be_zero_and_the_budget_may_be_off() {
    let c = parse(
        "[proxy]\ndrain_delay = \"0s\"\nmax_buffered_replies = 0\nslow_client_timeout = \"2s\"\n[pools.only]\nservers = [\"10.0.0.1:11211\"]\n",
    )
    .expect("parses");
    assert_eq!(c.proxy.drain_delay, std::time::Duration::ZERO);
    assert_eq!(c.proxy.max_buffered_replies, 0);
    assert_eq!(
        c.proxy.slow_client_timeout,
        std::time::Duration::from_secs(2)
    );
    let errors = parse(
        "[proxy]\ndrain_delay = \"soon\"\nslow_client_timeout = \"0s\"\n[pools.only]\nservers = [\"10.0.0.1:11211\"]\n",
    )
    .expect_err("bad durations");
    assert_eq!(
        errors.kinds(),
        [
            ("proxy.drain_delay", ErrorKind::Invalid),
            ("proxy.slow_client_timeout", ErrorKind::OutOfRange),
        ],
        "{errors}"
    );
}

#[test]
fn tls_listeners_and_pools_parse_with_defaults() {
    let c = parse(
        r#"
        [proxy]
        listen = ["127.0.0.1:11211",
                  { address = "0.0.0.0:11212", tls = { cert = "/s.pem", key = "/s.key", client_ca = "/ca.pem" } }]
        fastopen = 0
        tls_ticket_lifetime = "1h"
        [pools.main]
        servers = ["10.0.0.1:11211"]
        tls = { ca = "/ca.pem", server_name = "memcached.internal" }
        "#,
    )
    .expect("valid");
    let t = &c.proxy.transport;
    assert_eq!(c.proxy.listen.len(), 2);
    assert_eq!(t.fastopen, 0);
    assert!(t.fastopen_connect, "on by default");
    assert_eq!(t.tls_ticket_lifetime, std::time::Duration::from_secs(3600));
    let tls = &t.listen_tls[&ListenAddress::Tcp("0.0.0.0:11212".into())];
    assert_eq!(tls.key_path, "proxy.listen[1].tls");
    assert_eq!(
        tls.client_ca.as_deref(),
        Some(std::path::Path::new("/ca.pem"))
    );
    assert!(!t
        .listen_tls
        .contains_key(&ListenAddress::Tcp("127.0.0.1:11211".into())));
    let pool = c.pools["main"].tls.as_ref().expect("pool tls");
    assert_eq!(pool.server_name.as_deref(), Some("memcached.internal"));
    assert!(!pool.insecure_skip_verify);
}

#[test]
fn bad_tls_settings_are_all_reported() {
    let errors = parse(
        r#"
        [proxy]
        listen = [{ address = "unix:/tmp/x.sock", tls = { cert = "/s.pem", key = "/s.key" } },
                  { address = "127.0.0.1:1", tls = { cert = "/s.pem" } }]
        tls_ticket_lifetime = "7h"
        [pools.main]
        servers = ["10.0.0.1:11211"]
        tls = { cert = "/c.pem" }
        "#,
    )
    .expect_err("invalid");
    let messages: Vec<String> = errors.0.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        messages,
        [
            "proxy.tls_ticket_lifetime: must be between 1s and 6h (rustls rotates its own ticket keys every 6h)",
            "proxy.listen[0].tls: TLS is for TCP listeners (a unix socket never leaves the host)",
            "proxy.listen[1].tls.key: required (a PEM file)",
            "pools.main.tls: cert and key go together (a client certificate needs its key)",
            "pools.main.tls.ca: required: the CA file that signs the servers' certificates (or insecure_skip_verify = true to accept any certificate)",
        ]
    );
}

/// config/mcrouter.json (an mcrouter config) imports to the pools and routes of the
/// commented example config/mcrouter-compatible.toml.
#[test]
fn mcrouter_compatible_example_matches_its_import() {
    let json = std::fs::read_to_string(config_dir().join("mcrouter.json")).expect("readable");
    let imported =
        memroute_config::import::mcrouter::import(&json).unwrap_or_else(|e| panic!("{e}"));
    let imported = parse(&imported).unwrap_or_else(|e| panic!("{e}"));
    let example =
        memroute_config::load(&config_dir().join("mcrouter-compatible.toml")).expect("parses");
    assert_eq!(imported.pools, example.pools);
    assert_eq!(imported.routes, example.routes);
    assert_eq!(imported.proxy.route, example.proxy.route);
    assert_eq!(imported.admin, example.admin);
    assert!(imported.admin.is_some(), "no [admin] in the import");
}

#[test]
fn mcrouter_distributions_and_weights() {
    let config = memroute_config::parse(
        r#"
proxy = { route = "w" }
[pools.w]
servers = ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"]
distribution = "wch3"
weights = [1, 0.5, 0]
[pools.c]
servers = ["10.0.0.1:11211"]
distribution = "ch3"
"#,
    )
    .expect("valid");
    assert_eq!(config.pools["w"].weights, [1.0, 0.5, 0.0]);
    assert_eq!(config.pools["c"].distribution.as_str(), "ch3");

    let e = errors(
        r#"
[pools.a]
servers = ["10.0.0.1:11211", "10.0.0.2:11211"]
distribution = "wch3"
weights = [1.5, "x", 0.5]
[pools.b]
servers = ["10.0.0.1:11211"]
distribution = "wch3"
[pools.c]
servers = ["10.0.0.1:11211"]
distribution = "ch3"
weights = [1]
[pools.d]
servers = ["10.0.0.1:11211"]
salt = "s"
"#,
    );
    assert_eq!(
        e,
        [
            "pools.a.weights: has 3 weights for 2 servers",
            "pools.a.weights[0]: must be between 0 and 1 (found 1.5)",
            "pools.a.weights[1]: expected a number between 0 and 1, found a string",
            "pools.b.weights: required by distribution \"wch3\"",
            "pools.c.weights: only used by distribution \"wch3\"",
            "pools.d.salt: only used by distributions \"ch3\", \"wch3\" and \"crc32\"",
            "proxy.route: required when there is more than one pool (name the pool or route to send requests to)",
        ]
    );
}
