//! `memroute import-twemproxy nutcracker.yml`: translate a twemproxy config to memroute TOML.
//!
//! ```text
//!   nutcracker YAML --serde_yaml--> pools in file order --render--> TOML text --parse()--> checked
//! ```
//!
//! Every twemproxy key is either carried over or named in a `# NOTE:` comment that says
//! what memroute does instead: nothing is dropped silently. The generated text is run
//! through [`crate::parse`] before it is returned, so what the user gets always loads.
//!
//! twemproxy listens on one address per pool, and so does the import: every memcached pool
//! becomes a listener whose `route` is that pool. What twemproxy sets per pool but memroute
//! per process (the listen backlog, the client limit) is merged into `[proxy]` with a NOTE.
//! Redis pools (`redis: true`) are emitted as comments only: memroute speaks memcached.
//!
//! This file reads the document and checks what spans pools (their listen addresses);
//! `pool` reads one pool, `render` writes the TOML. Both import `pool`'s types, nothing here.
mod pool;
mod render;

use serde_yaml::Value;

use crate::{ConfigError, ConfigErrors, ErrorKind};
use pool::{read_pool, scalar_string, Pool};

/// Returns the equivalent memroute TOML for a nutcracker YAML config.
pub fn import(yaml: &str) -> Result<String, ConfigErrors> {
    let doc: Value = serde_yaml::from_str(yaml).map_err(|e| {
        let path = match e.location() {
            Some(l) => format!("line {}, column {}", l.line(), l.column()),
            None => "yaml".to_string(),
        };
        ConfigErrors::single(ConfigError::new(ErrorKind::Syntax, path, e.to_string()))
    })?;
    let Value::Mapping(top) = doc else {
        return Err(ConfigErrors::single(ConfigError::new(
            ErrorKind::WrongType,
            "",
            "expected a mapping of pool names to pools (a nutcracker.yml)",
        )));
    };
    if top.is_empty() {
        return Err(ConfigErrors::single(ConfigError::new(
            ErrorKind::Missing,
            "",
            "no pools found",
        )));
    }

    let mut errs = Vec::new();
    let mut pools = Vec::new();
    for (k, v) in &top {
        let Some(name) = scalar_string(k) else {
            errs.push(ConfigError::new(
                ErrorKind::WrongType,
                "",
                format!("a pool name must be a string, found {k:?}"),
            ));
            continue;
        };
        match v {
            Value::Mapping(m) => pools.push(read_pool(&name, m, &mut errs)),
            _ => errs.push(ConfigError::new(
                ErrorKind::WrongType,
                name.clone(),
                "expected a mapping of pool settings",
            )),
        }
    }
    let served: Vec<&Pool> = pools.iter().filter(|p| !p.redis).collect();
    if served.is_empty() {
        errs.push(ConfigError::new(ErrorKind::Missing,
            "",
            "no memcached pools to import: every pool has `redis: true`, and memroute speaks memcached only",
        ));
        return Err(ConfigErrors(errs));
    }
    check_listen_addresses(&served, &mut errs);
    if !errs.is_empty() {
        return Err(ConfigErrors(errs));
    }

    super::checked(render::render(&pools, &served))
}

/// Every served pool needs an address of its own, as twemproxy itself insists.
fn check_listen_addresses(served: &[&Pool], errs: &mut Vec<ConfigError>) {
    for (i, pool) in served.iter().enumerate() {
        let path = format!("{}.listen", pool.name);
        match &pool.listen {
            None => errs.push(ConfigError::new(
                ErrorKind::Missing,
                path,
                "missing: twemproxy serves every pool on its own listen address",
            )),
            Some(address) => {
                if let Some(earlier) = served[..i]
                    .iter()
                    .find(|p| p.listen.as_ref() == Some(address))
                {
                    errs.push(ConfigError::new(
                        ErrorKind::Conflict,
                        path,
                        format!(
                            "\"{address}\" is also pool \"{}\"'s listen address",
                            earlier.name
                        ),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HashName;
    use std::time::Duration;

    /// twemproxy's own conf/nutcracker.yml (0.5.0), as shipped in Debian's examples.
    const NUTCRACKER_YML: &str = r#"alpha:
  listen: 127.0.0.1:22121
  hash: fnv1a_64
  distribution: ketama
  auto_eject_hosts: true
  redis: true
  server_retry_timeout: 2000
  server_failure_limit: 1
  servers:
   - 127.0.0.1:6379:1

beta:
  listen: 127.0.0.1:22122
  hash: fnv1a_64
  hash_tag: "{}"
  distribution: ketama
  auto_eject_hosts: false
  timeout: 400
  redis: true
  servers:
   - 127.0.0.1:6380:1 server1
   - 127.0.0.1:6381:1 server2
   - 127.0.0.1:6382:1 server3
   - 127.0.0.1:6383:1 server4

gamma:
  listen: 127.0.0.1:22123
  hash: fnv1a_64
  distribution: ketama
  timeout: 400
  backlog: 1024
  preconnect: true
  auto_eject_hosts: true
  server_retry_timeout: 2000
  server_failure_limit: 3
  servers:
   - 127.0.0.1:11212:1
   - 127.0.0.1:11213:1

delta:
  listen: 127.0.0.1:22124
  hash: fnv1a_64
  distribution: ketama
  timeout: 100
  auto_eject_hosts: true
  server_retry_timeout: 2000
  server_failure_limit: 1
  servers:
   - 127.0.0.1:11214:1
   - 127.0.0.1:11215:1
   - 127.0.0.1:11216:1
   - 127.0.0.1:11217:1
   - 127.0.0.1:11218:1
   - 127.0.0.1:11219:1
   - 127.0.0.1:11220:1
   - 127.0.0.1:11221:1
   - 127.0.0.1:11222:1
   - 127.0.0.1:11223:1

omega:
  listen: /tmp/gamma 0666
  hash: hsieh
  distribution: ketama
  auto_eject_hosts: false
  servers:
   - 127.0.0.1:11214:100000
   - 127.0.0.1:11215:1
"#;

    fn expected_pool(toml_pool: &str) -> crate::PoolConfig {
        let text = format!("[pools.p]\n{toml_pool}");
        crate::parse(&text)
            .map(|c| c.pools["p"].clone())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn nutcracker_example_serves_every_memcached_pool_on_its_address() {
        let out = import(NUTCRACKER_YML).unwrap_or_else(|e| panic!("{e}"));
        let c = crate::parse(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));

        // Redis pools are not imported; each memcached pool has its twemproxy address as a
        // listener of its own, and the first is also the default root.
        let names: Vec<&str> = c.pools.keys().map(String::as_str).collect();
        assert_eq!(names, ["delta", "gamma", "omega"], "{out}");
        assert_eq!(c.proxy.route, "gamma");
        let roots: Vec<(String, &str)> = c
            .proxy
            .listener_roots()
            .map(|(address, root)| (address.to_string(), root))
            .collect();
        assert_eq!(
            roots,
            [
                ("127.0.0.1:22123".to_string(), "gamma"),
                ("127.0.0.1:22124".to_string(), "delta"),
                ("unix:/tmp/gamma".to_string(), "omega"),
            ],
            "{out}"
        );
        assert_eq!(
            c.proxy.listen_routes.len(),
            3,
            "every listener names its pool"
        );
        // One backlog for all: the largest, with every pool's named.
        assert_eq!(c.proxy.backlog, 1024);
        assert!(
            out.contains(
                "# NOTE: twemproxy's listen backlog differs by pool (\"gamma\": 1024, \"delta\": 512"
            ),
            "{out}"
        );

        assert_eq!(
            c.pools["gamma"],
            expected_pool(
                "servers = [\"127.0.0.1:11212:1\", \"127.0.0.1:11213:1\"]\n\
                 hash = \"fnv1a_64\"\ndistribution = \"ketama\"\ntimeout = \"400ms\"\n\
                 eject = true\nfailure_limit = 3\n\
                 probe_interval = \"2s\"\nprobe_interval_max = \"2s\"\n"
            )
        );
        let delta = &c.pools["delta"];
        assert!(delta.eject, "auto_eject_hosts: true");
        assert_eq!(delta.failure_limit, 1);
        assert_eq!(delta.probe_interval, Duration::from_secs(2));
        assert_eq!(delta.probe_interval_max, Duration::from_secs(2));
        assert!(!c.pools["omega"].eject, "auto_eject_hosts: false");
        assert_eq!(delta.servers.len(), 10);
        assert_eq!(delta.servers[9].address, "127.0.0.1:11223");
        assert_eq!(delta.timeout, Duration::from_millis(100));
        let omega = &c.pools["omega"];
        assert_eq!(omega.hash, HashName::Hsieh);
        assert_eq!(omega.servers[0].weight, 100000);
        assert_eq!(
            omega.timeout,
            Duration::from_millis(250),
            "no twemproxy timeout -> memroute default"
        );

        // Nothing silently dropped: each non-carried key is explained.
        for needle in [
            "listen mode 0666 for /tmp/gamma",
            "twemproxy pool \"alpha\" is a redis pool (redis: true) on 127.0.0.1:22121",
            "twemproxy pool \"beta\" is a redis pool (redis: true) on 127.0.0.1:22122",
            "redis pools are not served",
            "#   \"127.0.0.1:6380:1 server1\",",
            "preconnect: true",
            "server_failure_limit: 3",
            "twemproxy had no timeout here",
        ] {
            assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
        }
    }

    /// twemproxy's own defaults apply when only auto_eject_hosts is given.
    #[test]
    fn auto_eject_alone_takes_twemproxys_defaults() {
        let yaml = "p:\n  listen: 127.0.0.1:22121\n  auto_eject_hosts: true\n  timeout: 100\n  servers:\n   - 10.0.0.1:11211:1\n";
        let out = import(yaml).unwrap_or_else(|e| panic!("{e}"));
        let c = crate::parse(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
        let p = &c.pools["p"];
        assert!(p.eject);
        assert_eq!(p.failure_limit, 2);
        assert_eq!(p.probe_interval, Duration::from_secs(30));
        assert_eq!(p.probe_interval_max, Duration::from_secs(30));
        assert!(out.contains("max_ejected_fraction = 0.5"), "{out}");
    }

    #[test]
    fn single_pool_with_names_weights_and_all_keys() {
        let yaml = r#"
web:
  listen: 0.0.0.0:22121
  hash: md5
  hash_tag: "{}"
  distribution: modula
  timeout: 400
  backlog: 2048
  client_connections: 4096
  preconnect: false
  tcpkeepalive: true
  server_connections: 2
  auto_eject_hosts: false
  servers:
   - 10.0.0.1:11211:2 mc-1
   - 10.0.0.2:11211:1   mc-2
   - 10.0.0.3:11212:3
"#;
        let out = import(yaml).unwrap_or_else(|e| panic!("{e}"));
        let c = crate::parse(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
        assert_eq!(c.proxy.route, "web");
        assert_eq!(c.proxy.backlog, 2048);
        assert_eq!(c.proxy.max_connections, 4096);
        assert_eq!(
            c.pools["web"],
            expected_pool(
                r#"servers = [
  { address = "10.0.0.1:11211", weight = 2, name = "mc-1" },
  { address = "10.0.0.2:11211", weight = 1, name = "mc-2" },
  { address = "10.0.0.3:11212", weight = 3 },
]
hash = "md5"
hash_tag = "{}"
distribution = "modula"
timeout = "400ms"
connections = 2
"#
            )
        );
        assert!(
            out.contains("listen = [\"0.0.0.0:22121\"]\n"),
            "one pool: served by proxy.route, no listener route needed\n{out}"
        );
        for needle in [
            "tcpkeepalive: true",
            "server_connections: 2",
            "auto_eject_hosts: false",
        ] {
            assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
        }
    }

    /// Client limits per pool become one for the process: their sum when every pool has
    /// one, none when some pool has none; either way a NOTE names each pool's.
    #[test]
    fn client_limits_of_several_pools_merge_into_one() {
        let pools = |a: &str, b: &str| {
            format!(
                "a:\n  listen: 127.0.0.1:22121\n{a}  servers:\n   - 10.0.0.1:11211:1\n\
                 b:\n  listen: 127.0.0.1:22122\n{b}  servers:\n   - 10.0.0.2:11211:1\n"
            )
        };
        let both = import(&pools(
            "  client_connections: 100\n",
            "  client_connections: 250\n",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let c = crate::parse(&both).unwrap_or_else(|e| panic!("{e}\n{both}"));
        assert_eq!(c.proxy.max_connections, 350, "{both}");
        assert!(
            both.contains("twemproxy limits clients per pool (\"a\": 100, \"b\": 250)"),
            "{both}"
        );

        let one =
            import(&pools("  client_connections: 100\n", "")).unwrap_or_else(|e| panic!("{e}"));
        let c = crate::parse(&one).unwrap_or_else(|e| panic!("{e}\n{one}"));
        assert_eq!(c.proxy.max_connections, 0, "{one}");
        assert!(
            one.contains("(\"a\": 100) and not at all for \"b\""),
            "{one}"
        );

        let neither = import(&pools("", "")).unwrap_or_else(|e| panic!("{e}"));
        assert!(!neither.contains("max_connections"), "{neither}");
        assert!(
            neither.contains("memroute's default, 65535, is kept"),
            "no backlog anywhere: {neither}"
        );
    }

    /// twemproxy takes a unix socket's mode from after the last space, so a colon is part of
    /// the path.
    #[test]
    fn unix_listen_addresses_split_as_twemproxy_splits_them() {
        let out = import(
            "a:\n  listen: /run/nc/a.sock   0660\n  servers:\n   - 10.0.0.1:11211:1\n\
             b:\n  listen: /run/nc/b.sock:0600\n  servers:\n   - 10.0.0.2:11211:1\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.contains("{ address = \"unix:/run/nc/a.sock\", route = \"a\" }"),
            "{out}"
        );
        assert!(
            out.contains("{ address = \"unix:/run/nc/b.sock:0600\", route = \"b\" }"),
            "{out}"
        );
        assert!(out.contains("listen mode 0660 for /run/nc/a.sock"), "{out}");
        assert_eq!(out.matches("listen mode").count(), 1, "{out}");
    }

    /// As twemproxy, every memcached pool needs its own address; redis pools, never
    /// served, are not checked.
    #[test]
    fn memcached_pools_need_listen_addresses_of_their_own() {
        let e = import(
            "a:\n  listen: 127.0.0.1:22121\n  servers:\n   - 10.0.0.1:11211:1\n\
             b:\n  servers:\n   - 10.0.0.2:11211:1\n\
             r:\n  redis: true\n  listen: 127.0.0.1:22121\n  servers:\n   - 10.0.0.3:6379:1\n\
             c:\n  listen: 127.0.0.1:22121\n  servers:\n   - 10.0.0.4:11211:1\n",
        )
        .expect_err("missing and shared addresses");
        let got: Vec<String> = e.0.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "b.listen: missing: twemproxy serves every pool on its own listen address",
                "c.listen: \"127.0.0.1:22121\" is also pool \"a\"'s listen address",
            ]
        );
    }

    #[test]
    fn bad_twemproxy_configs_report_every_error() {
        let yaml = r#"
a:
  listen: 127.0.0.1:22121
  hash: sha1
  distribution: weird
  timeout: soon
  colour: blue
  servers:
   - /tmp/mc.sock:1
b:
  listen: nowhere
"#;
        let e = import(yaml).expect_err("bad config");
        let got: Vec<String> = e.0.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "a.hash: unknown hash \"sha1\"",
                "a.distribution: unknown distribution \"weird\"",
                "a.timeout: expected a non-negative integer, found \"soon\"",
                "a.colour: unknown twemproxy key (expected one of: listen, hash, hash_tag, distribution, timeout, backlog, client_connections, redis, redis_auth, redis_db, tcpkeepalive, reuseport, preconnect, auto_eject_hosts, server_connections, server_retry_timeout, server_failure_limit, servers)",
                "a.servers[0]: unix socket servers are not supported by memroute (\"/tmp/mc.sock:1\"); use host:port",
                "b.listen: invalid address \"nowhere\" (expected host:port with a numeric port)",
                "b.servers: a pool needs at least one server",
            ]
        );
    }

    #[test]
    fn only_redis_pools_is_an_error_and_yaml_syntax_has_a_position() {
        let e = import("r:\n  redis: true\n  servers:\n   - 127.0.0.1:6379:1\n")
            .expect_err("redis only");
        assert!(
            e.to_string().contains("no memcached pools to import"),
            "{e}"
        );
        let e = import("a:\n  listen: [\n").expect_err("syntax");
        assert!(e.0[0].path.starts_with("line "), "{e}");
    }

    #[test]
    fn awkward_pool_names_are_quoted() {
        let out = import("my pool.v2:\n  listen: 127.0.0.1:1\n  servers:\n   - 10.0.0.1:11211:1\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.contains("[pools.\"my pool.v2\"]"), "{out}");
        let c = crate::parse(&out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.proxy.route, "my pool.v2");
    }
}
