//! The command line as an operator uses it: `memroute --check --config FILE` prints what it
//! understood (exit 0) or every error with its key path (exit non-zero);
//! `memroute import-twemproxy nutcracker.yml` prints TOML that `--check` accepts; and a whole
//! migration: nutcracker writes keys, memroute running the imported config finds every one.
use std::time::Duration;

use memroute_tests::*;

/// A CLI run that does not serve anything finishes at once; this only bounds a hang.
const CLI_DEADLINE: Duration = Duration::from_secs(20);

fn check(path: &std::path::Path) -> CliOutput {
    run_memroute_cli(
        &["--check".as_ref(), "--config".as_ref(), path.as_os_str()],
        CLI_DEADLINE,
    )
}

#[test]
fn check_prints_pools_servers_and_routes_of_a_valid_config() {
    let dir = TempDir::new("cli-valid");
    let conf = dir.write(
        "ok.toml",
        r#"
[proxy]
listen = ["127.0.0.1:11999", "unix:/tmp/memroute-cli-check.sock"]
workers = 3
backlog = 1024
route = "by_prefix"

[pools.main]
servers = ["10.0.0.1:11211", "10.0.0.2:11211:2 mc-2", { address = "10.0.0.3:11212", weight = 5, name = "mc-3" }]
distribution = "ketama"
hash = "md5"
timeout = "400ms"

[pools.sessions]
servers = ["10.0.1.1:11211"]
distribution = "jump"
hash = "xxh3"
connections = 2

[routes.by_prefix]
type = "prefix"
prefixes = { "session:" = "sessions" }
default = "main"
"#,
    );
    let out = check(&conf);
    assert!(
        out.status.success(),
        "--check on a valid config exited {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    for needle in [
        "proxy: listen 127.0.0.1:11999, unix:/tmp/memroute-cli-check.sock workers 3 io io_uring backlog 1024 route by_prefix",
        "pool main: 3 servers, distribution ketama, hash md5, timeout 400ms, connections 1",
        "  server 10.0.0.1:11211 weight 1\n",
        "  server 10.0.0.2:11211 weight 2 name mc-2",
        "  server 10.0.0.3:11212 weight 5 name mc-3",
        "pool sessions: 1 servers, distribution jump, hash xxh3",
        "connections 2",
        "  server 10.0.1.1:11211 weight 1",
        "route by_prefix: prefix, default main",
        "\"session:\" -> sessions",
        "is valid",
    ] {
        assert!(
            out.stdout.contains(needle),
            "--check output lacks {needle:?}:\n{}",
            out.stdout
        );
    }
    assert!(
        !std::path::Path::new("/tmp/memroute-cli-check.sock").exists(),
        "--check must not bind anything"
    );
}

#[test]
fn check_reports_every_error_with_its_key_path() {
    let dir = TempDir::new("cli-bad");
    let conf = dir.write(
        "bad.toml",
        r#"
[proxy]
workers = -1
max_client_pending = 0
listne = ["127.0.0.1:1"]
[admin]
listen = "localhost"
[pools.main]
servers = ["10.0.0.1:11211", { address = "10.0.0.2:11211", weight = 0 }, "nohost"]
hash = "foo"
timeout = "fast"
[routes.r]
type = "prefix"
prefixes = { "user:" = "users" }
default = "main"
"#,
    );
    let out = check(&conf);
    assert!(
        !out.status.success(),
        "--check on a bad config exited 0\nstdout:\n{}",
        out.stdout
    );
    let expected = [
        "proxy.listne: unknown key (expected one of: listen, workers, backlog, route, max_value_size, max_line_size, max_client_pending, max_connections, shutdown_timeout, drain_delay, max_buffered_replies, slow_client_timeout, io, zone, routing_prefix, fastopen, fastopen_connect, tls_handshake_timeout, tls_ticket_lifetime, tls_session_cache)",
        "proxy.workers: must be >= 0",
        "proxy.max_client_pending: must be > 0",
        "admin.listen: invalid address \"localhost\" (expected host:port with a numeric port)",
        "pools.main.servers[1].weight: must be > 0",
        "pools.main.servers[2].address: invalid address \"nohost\" (expected host:port with a numeric port)",
        "pools.main.hash: unknown hash \"foo\"",
        "pools.main.timeout: invalid duration \"fast\"",
        "routes.r.prefixes.\"user:\": unknown target \"users\" (no pool or route has that name)",
    ];
    let missing: Vec<&str> = expected
        .iter()
        .copied()
        .filter(|e| !out.stderr.contains(e))
        .collect();
    assert!(
        missing.is_empty(),
        "stderr lacks {missing:?}\nstderr:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("bad.toml"),
        "the file is named: {}",
        out.stderr
    );
    assert!(
        !out.stdout.contains("is valid"),
        "a bad config is not called valid:\n{}",
        out.stdout
    );
}

#[test]
fn check_fails_on_a_missing_file_and_on_no_config() {
    let dir = TempDir::new("cli-missing");
    let missing = dir.path().join("absent.toml");
    let out = check(&missing);
    assert!(!out.status.success(), "missing file: exit 0");
    assert!(
        out.stderr.contains("absent.toml"),
        "names the file: {}",
        out.stderr
    );

    let out = run_memroute_cli(&["--check"], CLI_DEADLINE);
    assert!(!out.status.success(), "--check without --config: exit 0");
    assert!(out.stderr.contains("--config"), "{}", out.stderr);
}

#[test]
fn import_twemproxy_reports_every_error() {
    let dir = TempDir::new("cli-import-bad");
    let yml = dir.write(
        "nutcracker.yml",
        "a:\n  listen: 127.0.0.1:22121\n  hash: sha1\n  distribution: weird\n  servers:\n   - /tmp/mc.sock:1\n",
    );
    let out = run_memroute_cli(
        &["import-twemproxy".as_ref(), yml.as_os_str()],
        CLI_DEADLINE,
    );
    assert!(!out.status.success(), "bad yml imported:\n{}", out.stdout);
    for needle in [
        "a.hash: unknown hash \"sha1\"",
        "a.distribution: unknown distribution \"weird\"",
        "a.servers[0]: unix socket servers are not supported",
    ] {
        assert!(
            out.stderr.contains(needle),
            "stderr lacks {needle:?}:\n{}",
            out.stderr
        );
    }
}

/// A 5-server nutcracker pool with weights and names (names decide ketama placement). md5,
/// not fnv1a_64: twemproxy's fnv1a_64 keeps only 32 bits and bunches short sequential keys
/// onto few servers, and this test wants keys on (nearly) every server.
fn nutcracker_yml(listen: &str, servers: &[Memcached]) -> String {
    let names = ["alpha", "beta", "gamma", "delta", "epsilon"];
    let weights = [1, 2, 1, 3, 1];
    let lines: String = servers
        .iter()
        .enumerate()
        .map(|(i, m)| format!("   - {}:{} {}\n", m.addr(), weights[i], names[i]))
        .collect();
    format!(
        "mig:\n  listen: {listen}\n  hash: md5\n  distribution: ketama\n  timeout: 2000\n  \
         auto_eject_hosts: false\n  server_retry_timeout: 2000\n  server_failure_limit: 3\n  servers:\n{lines}"
    )
}

/// Replaces the `listen = [...]` line of `[proxy]` in an imported config.
fn with_listen(toml: &str, listen: &str) -> String {
    let mut replaced = 0;
    let out: Vec<String> = toml
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("listen = [") {
                replaced += 1;
                format!("listen = [\"{listen}\"]")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert_eq!(replaced, 1, "one listen line in:\n{toml}");
    out.join("\n") + "\n"
}

#[test]
fn import_twemproxy_output_passes_check_and_keeps_placement() {
    let servers: Vec<Memcached> = (0..5)
        .map(|_| Memcached::start_on("127.0.0.1", free_port(), 8))
        .collect();
    let nc_listen = format!("127.0.0.1:{}", free_port());
    let yml = nutcracker_yml(&nc_listen, &servers);
    let dir = TempDir::new("cli-migrate");
    let yml_path = dir.write("nutcracker.yml", &yml);

    let import = run_memroute_cli(
        &["import-twemproxy".as_ref(), yml_path.as_os_str()],
        CLI_DEADLINE,
    );
    assert!(
        import.status.success(),
        "import-twemproxy exited {}\nstderr:\n{}",
        import.status,
        import.stderr
    );
    // The import keeps every server with its weight and name.
    for (i, m) in servers.iter().enumerate() {
        let name = ["alpha", "beta", "gamma", "delta", "epsilon"][i];
        assert!(
            import.stdout.contains(&m.addr()) && import.stdout.contains(name),
            "server {} ({name}) missing from:\n{}",
            m.addr(),
            import.stdout
        );
    }

    // `--check` accepts the imported TOML exactly as printed.
    let toml_path = dir.write("memroute.toml", &import.stdout);
    let checked = check(&toml_path);
    assert!(
        checked.status.success(),
        "--check rejects the imported config\nstderr:\n{}\nconfig:\n{}",
        checked.stderr,
        import.stdout
    );
    assert!(
        checked
            .stdout
            .contains("pool mig: 5 servers, distribution ketama, hash md5, timeout 2s"),
        "{}",
        checked.stdout
    );
    assert!(
        checked
            .stdout
            .contains(&format!("server {} weight 3 name delta", servers[3].addr())),
        "{}",
        checked.stdout
    );

    // Monday morning: nutcracker wrote the cache, memroute (same servers, imported config,
    // its own listen port) must find every key where nutcracker put it.
    let nutcracker = Nutcracker::start(&yml);
    let mr_listen = format!("127.0.0.1:{}", free_port());
    let memroute = Memroute::start(&with_listen(&import.stdout, &mr_listen));

    let keys: Vec<String> = (0..300).map(|i| format!("migrate:{i}")).collect();
    let mut writer = nutcracker.connect();
    let mut batch = Vec::new();
    for k in &keys {
        let v = format!("v-{k}");
        batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let replies = writer.roundtrip_lines(&batch, keys.len());
    assert_eq!(show(&replies), show(&b"STORED\r\n".repeat(keys.len())));

    // The keys really are spread: a single-server placement would prove little.
    let used = servers
        .iter()
        .filter(|m| {
            let mut c = m.connect();
            keys.iter().any(|k| c.get(k).is_some())
        })
        .count();
    assert!(
        used >= 4,
        "300 keys reached only {used} of 5 servers through nutcracker"
    );

    let mut reader = memroute.connect();
    let mut missed = Vec::new();
    for k in &keys {
        match reader.get(k) {
            Some(v) => assert_eq!(v, format!("v-{k}").as_bytes(), "wrong value for {k}"),
            None => missed.push(k.clone()),
        }
    }
    assert!(
        missed.is_empty(),
        "{} of 300 keys written via nutcracker missed via memroute with the imported config: {:?}\nconfig:\n{}",
        missed.len(),
        &missed[..missed.len().min(20)],
        import.stdout
    );
}

/// What the kernel settings of this host keep from memroute's defaults (backlog 65535,
/// TCP Fast Open on listeners and connects), as the words its start-up line uses.
fn kernel_limits_here() -> Vec<&'static str> {
    let read =
        |path: &str| -> Option<u32> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let mut limits = Vec::new();
    if read("/proc/sys/net/core/somaxconn").is_some_and(|cap| cap < 65535) {
        limits.push("net.core.somaxconn");
    }
    if let Some(tfo) = read("/proc/sys/net/ipv4/tcp_fastopen") {
        if tfo & 2 == 0 {
            limits.push("TCP Fast Open off on listeners");
        }
        if tfo & 1 == 0 {
            limits.push("TCP Fast Open off on backend connects");
        }
    }
    limits
}

/// Starting memroute as an operator does: the ready line names its addresses plainly
/// (`admin=ADDRESS` or `admin=off`, never Rust's `Some(..)`), the kernel's limits are one
/// line at info (not a warning for a default that most kernels cap), and a port in use is
/// said once.
#[test]
fn start_up_lines_say_each_thing_once_and_plainly() {
    let backend = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        "{}\n[admin]\nlisten = \"{admin}\"\n",
        simple_config(&listen, &[backend.addr()], "")
    );
    let proxy = Memroute::start(&toml);
    // The listeners accept before the ready line is logged: wait for the line itself.
    assert!(
        proxy.wait_log("memroute ready", Duration::from_secs(10)),
        "no ready line: {}",
        proxy.log_text()
    );
    let log = proxy.log_text();
    let ready = log
        .lines()
        .find(|l| l.contains("memroute ready"))
        .expect("a ready line");
    assert!(
        ready.contains(&format!(
            " listen={listen} admin={admin} workers=1 pools=1 zone=none"
        )),
        "{ready}"
    );
    let kernel: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("somaxconn") || l.contains("tcp_fastopen"))
        .collect();
    let limits = kernel_limits_here();
    if limits.is_empty() {
        assert!(kernel.is_empty(), "{log}");
    } else {
        assert_eq!(kernel.len(), 1, "one line for the kernel's limits:\n{log}");
        assert!(
            kernel[0].contains(" INFO kernel settings: "),
            "{}",
            kernel[0]
        );
        for limit in limits {
            assert!(kernel[0].contains(limit), "{limit} in {}", kernel[0]);
        }
    }
    assert!(!log.contains(" WARN "), "nothing to warn about:\n{log}");
    drop(proxy);

    let without_admin = Memroute::start_pool(&[backend.addr()]);
    without_admin.wait_log("memroute ready", Duration::from_secs(10));
    let log = without_admin.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("memroute ready") && l.contains(" admin=off ")),
        "{log}"
    );

    // A port held by another process (without SO_REUSEPORT, which memroute's own listeners
    // would share): memroute exits naming the address and the reason, once.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = holder.local_addr().expect("bound").to_string();
    let dir = TempDir::new("cli-in-use");
    let conf = dir.write(
        "memroute.toml",
        &simple_config(&taken, &[backend.addr()], ""),
    );
    let out = run_memroute_cli(&["--config".as_ref(), conf.as_os_str()], CLI_DEADLINE);
    assert!(!out.status.success(), "started on a port in use");
    assert!(
        out.stderr.contains(&format!("cannot listen on {taken}: ")),
        "{}",
        out.stderr
    );
    assert_eq!(
        out.stderr.matches("Address already in use").count(),
        1,
        "{}",
        out.stderr
    );
}
