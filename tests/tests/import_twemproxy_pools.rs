//! A twemproxy config with three memcached pools, each on its own port, moved to one memroute
//! with `memroute import-twemproxy`: every key written through nutcracker on a pool's port is
//! found, with the same value, through memroute on that pool's port.
//!
//! ```text
//!   test --set--> nutcracker :sessions (ketama md5)                   --> memcached s0 s1 s2
//!                            :feed     (modula fnv1a_64, weights)     --> memcached f0 f1 f2
//!                            :users    (ketama fnv1a_32, "{}", names) --> memcached u0 u1
//!   test --get--> memroute   :sessions' :feed' :users'  (the imported config, listeners moved
//!                                                        to free ports)
//! ```
//!
//! The three pools hold the same keys with different values, so a listener that served the
//! wrong pool would answer with another pool's value, not only miss. A pool on a unix socket
//! is served on a unix socket.
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use memroute_tests::*;

/// A CLI run that does not serve anything finishes at once; this only bounds a hang.
const CLI_DEADLINE: Duration = Duration::from_secs(20);

/// One twemproxy pool of the test: its placement keys and its own memcached servers.
struct TestPool {
    name: &'static str,
    /// The pool's YAML lines other than `listen` and `servers`.
    placement: &'static str,
    /// `host:port:weight [name]` after the address, per server.
    server_suffixes: &'static [&'static str],
    servers: Vec<Memcached>,
    nutcracker_listen: String,
    memroute_listen: String,
}

impl TestPool {
    fn start(
        name: &'static str,
        placement: &'static str,
        server_suffixes: &'static [&'static str],
    ) -> TestPool {
        TestPool {
            name,
            placement,
            server_suffixes,
            servers: server_suffixes
                .iter()
                .map(|_| Memcached::start_on("127.0.0.1", free_port(), 8))
                .collect(),
            nutcracker_listen: format!("127.0.0.1:{}", free_port()),
            memroute_listen: format!("127.0.0.1:{}", free_port()),
        }
    }

    fn yaml(&self) -> String {
        let servers: String = self
            .servers
            .iter()
            .zip(self.server_suffixes)
            .map(|(m, suffix)| format!("   - {}:{suffix}\n", m.addr()))
            .collect();
        format!(
            "{}:\n  listen: {}\n{}  timeout: 2000\n  servers:\n{servers}",
            self.name, self.nutcracker_listen, self.placement
        )
    }

    fn value(&self, key: &str) -> String {
        format!("{}={key}", self.name)
    }
}

fn three_pools() -> Vec<TestPool> {
    vec![
        TestPool::start(
            "sessions",
            "  hash: md5\n  distribution: ketama\n",
            &["1", "1", "1"],
        ),
        TestPool::start(
            "feed",
            "  hash: fnv1a_64\n  distribution: modula\n",
            &["1", "2", "3"],
        ),
        TestPool::start(
            "users",
            "  hash: fnv1a_32\n  hash_tag: \"{}\"\n  distribution: ketama\n",
            &["1 users-a", "2 users-b"],
        ),
    ]
}

/// 240 keys in groups of four sharing a hash tag, and 60 without one (hashed whole).
fn keys() -> Vec<String> {
    let tagged = (0..240).map(|i| format!("user:{{{}}}:field{}", i / 4, i % 4));
    let plain = (0..60).map(|i| format!("plain:{i}"));
    tagged.chain(plain).collect()
}

/// The imported config with each pool's listener moved from nutcracker's address to
/// memroute's own, so both proxies run side by side over the same servers.
fn moved_listeners(imported: &str, pools: &[TestPool]) -> String {
    let mut toml = imported.to_string();
    for p in pools {
        let from = format!(
            "address = \"{}\", route = \"{}\"",
            p.nutcracker_listen, p.name
        );
        let to = format!(
            "address = \"{}\", route = \"{}\"",
            p.memroute_listen, p.name
        );
        assert_eq!(
            toml.matches(&from).count(),
            1,
            "pool {}'s listener in:\n{imported}",
            p.name
        );
        toml = toml.replace(&from, &to);
    }
    toml
}

/// Sets every key through `conn` (pipelined), expecting STORED for each.
fn set_all(conn: &mut Conn, pool: &TestPool, keys: &[String]) {
    let mut batch = Vec::new();
    for k in keys {
        let v = pool.value(k);
        batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let replies = conn.roundtrip_lines(&batch, keys.len());
    assert_eq!(
        show(&replies),
        show(&b"STORED\r\n".repeat(keys.len())),
        "sets through nutcracker's {} port",
        pool.name
    );
}

/// Which of the pool's servers holds `key`, read from the servers directly.
fn holder(pool: &TestPool, conns: &mut [Conn], key: &str) -> Option<usize> {
    let holders: Vec<usize> = conns
        .iter_mut()
        .enumerate()
        .filter_map(|(i, c)| c.get(key).map(|_| i))
        .collect();
    assert!(
        holders.len() <= 1,
        "{key} of pool {} is on servers {holders:?}",
        pool.name
    );
    holders.first().copied()
}

/// The keys are spread over every server of the pool, and keys sharing a hash tag share a
/// server where the pool has `hash_tag`: a placement that puts everything on one server
/// would prove little.
fn assert_spread(pool: &TestPool, keys: &[String]) {
    let mut conns: Vec<Conn> = pool.servers.iter().map(Memcached::connect).collect();
    let mut per_server = vec![0usize; conns.len()];
    let mut tag_holder: Vec<(String, usize)> = Vec::new();
    for k in keys {
        let at = holder(pool, &mut conns, k).unwrap_or_else(|| {
            panic!(
                "{k} set through nutcracker is on no server of {}",
                pool.name
            )
        });
        per_server[at] += 1;
        if pool.placement.contains("hash_tag") {
            if let Some(tag) = k.split(['{', '}']).nth(1) {
                match tag_holder.iter().find(|(t, _)| t == tag) {
                    Some((_, first)) => {
                        assert_eq!(*first, at, "tag {{{tag}}} split in {}", pool.name)
                    }
                    None => tag_holder.push((tag.to_string(), at)),
                }
            }
        }
    }
    assert!(
        per_server.iter().all(|n| *n > 0),
        "pool {}: keys per server {per_server:?}",
        pool.name
    );
}

/// Every key read through memroute on the pool's port, one get each and as one multi-get,
/// has the pool's value.
fn assert_all_found(pool: &TestPool, keys: &[String], toml: &str) {
    let mut conn = Conn::connect(&pool.memroute_listen);
    let mut missed = Vec::new();
    for k in keys {
        match conn.get(k) {
            Some(v) => assert_eq!(
                show(&v),
                show(pool.value(k).as_bytes()),
                "{k} through memroute's {} port",
                pool.name
            ),
            None => missed.push(k.as_str()),
        }
    }
    assert!(
        missed.is_empty(),
        "{} of {} keys written through nutcracker's {} port missed through memroute's: {:?}\nconfig:\n{toml}",
        missed.len(),
        keys.len(),
        pool.name,
        &missed[..missed.len().min(20)],
    );

    conn.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    let reply = conn.read_get_reply();
    let values = parse_values(&reply)
        .unwrap_or_else(|| panic!("multi-get through {}: {}", pool.name, show(&reply)));
    let got: Vec<(String, String)> = values
        .into_iter()
        .map(|(k, _, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect();
    let want: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), pool.value(k))).collect();
    assert_eq!(got, want, "multi-get through memroute's {} port", pool.name);
}

#[test]
fn three_nutcracker_pools_are_served_on_their_own_ports_with_the_same_placement() {
    let pools = three_pools();
    let yaml: String = pools.iter().map(|p| p.yaml() + "\n").collect();
    let dir = TempDir::new("import-pools");
    let yaml_path = dir.write("nutcracker.yml", &yaml);

    let import = run_memroute_cli(
        &["import-twemproxy".as_ref(), yaml_path.as_os_str()],
        CLI_DEADLINE,
    );
    assert!(
        import.status.success(),
        "import-twemproxy exited {}\nstderr:\n{}",
        import.status,
        import.stderr
    );
    let imported_path = dir.write("imported.toml", &import.stdout);
    let checked = run_memroute_cli(
        &[
            "--check".as_ref(),
            "--config".as_ref(),
            imported_path.as_os_str(),
        ],
        CLI_DEADLINE,
    );
    assert!(
        checked.status.success(),
        "--check rejects the imported config\nstderr:\n{}\nconfig:\n{}",
        checked.stderr,
        import.stdout
    );
    for p in &pools {
        let listener = format!("listener {}: route {}\n", p.nutcracker_listen, p.name);
        assert!(
            checked.stdout.contains(&listener),
            "--check lacks {listener:?}:\n{}",
            checked.stdout
        );
    }

    let nutcracker = Nutcracker::start(&yaml);
    // The import maps nutcracker's stats port to memroute's admin port (22222): moved too.
    let admin = format!("127.0.0.1:{}", free_port());
    let toml = with_admin_on(&moved_listeners(&import.stdout, &pools), &admin);
    let _memroute = Memroute::start(&toml);
    // The migrated proxy has its metrics and readiness.
    let (status, metrics) = admin_http(&admin, "GET", "/metrics");
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("memroute_"), "{metrics}");
    assert!(
        poll_until(START_DEADLINE, || admin_http(&admin, "GET", "/ready").0
            == 200),
        "{}",
        admin_http(&admin, "GET", "/ready").1
    );

    let keys = keys();
    for p in &pools {
        set_all(&mut Conn::connect(&p.nutcracker_listen), p, &keys);
    }
    drop(nutcracker);
    for p in &pools {
        assert_spread(p, &keys);
        assert_all_found(p, &keys, &toml);
    }
}

/// Sends `request` over the unix socket at `path` and reads until `complete` says the reply
/// is whole (every read bounded by `IO_TIMEOUT`).
fn unix_roundtrip(path: &Path, request: &[u8], complete: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut stream =
        UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .expect("read timeout");
    stream.write_all(request).expect("write");
    let mut reply = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while !complete(&reply) {
        match stream.read(&mut chunk) {
            Ok(n) if n > 0 => reply.extend_from_slice(&chunk[..n]),
            other => panic!(
                "reading over {} after {}: {other:?}",
                path.display(),
                show(&reply)
            ),
        }
    }
    reply
}

#[test]
fn a_pool_on_a_unix_socket_is_served_on_a_unix_socket() {
    let dir = TempDir::new("import-unix");
    let tcp_server = Memcached::start_on("127.0.0.1", free_port(), 8);
    let unix_servers: Vec<Memcached> = (0..2)
        .map(|_| Memcached::start_on("127.0.0.1", free_port(), 8))
        .collect();
    let nutcracker_tcp = format!("127.0.0.1:{}", free_port());
    let memroute_tcp = format!("127.0.0.1:{}", free_port());
    let nutcracker_socket = dir.path().join("nutcracker.sock");
    let memroute_socket = dir.path().join("memroute.sock");
    let yaml = format!(
        "web:\n  listen: {nutcracker_tcp}\n  timeout: 2000\n  servers:\n   - {}:1\n\n\
         local:\n  listen: {} 0600\n  hash: md5\n  distribution: ketama\n  timeout: 2000\n  \
         servers:\n   - {}:1 local-a\n   - {}:1 local-b\n",
        tcp_server.addr(),
        nutcracker_socket.display(),
        unix_servers[0].addr(),
        unix_servers[1].addr(),
    );
    let yaml_path = dir.write("nutcracker.yml", &yaml);
    let import = run_memroute_cli(
        &["import-twemproxy".as_ref(), yaml_path.as_os_str()],
        CLI_DEADLINE,
    );
    assert!(import.status.success(), "{}", import.stderr);
    assert!(
        import.stdout.contains("listen mode 0600"),
        "{}",
        import.stdout
    );
    let mut toml = import.stdout.clone();
    for (from, to) in [
        (
            format!("address = \"{nutcracker_tcp}\", route = \"web\""),
            format!("address = \"{memroute_tcp}\", route = \"web\""),
        ),
        (
            format!(
                "address = \"unix:{}\", route = \"local\"",
                nutcracker_socket.display()
            ),
            format!(
                "address = \"unix:{}\", route = \"local\"",
                memroute_socket.display()
            ),
        ),
    ] {
        assert_eq!(toml.matches(&from).count(), 1, "{from} in:\n{toml}");
        toml = toml.replace(&from, &to);
    }

    let nutcracker = Nutcracker::start(&yaml);
    let toml = with_admin_on(&toml, &format!("127.0.0.1:{}", free_port()));
    let _memroute = Memroute::start(&toml);

    let keys: Vec<String> = (0..200).map(|i| format!("local:{i}")).collect();
    let mut sets = Vec::new();
    for k in &keys {
        sets.extend_from_slice(format!("set {k} 0 0 {}\r\n{k}\r\n", k.len()).as_bytes());
    }
    let stored = b"STORED\r\n".repeat(keys.len());
    let reply = unix_roundtrip(&nutcracker_socket, &sets, |r| r.len() >= stored.len());
    assert_eq!(
        show(&reply),
        show(&stored),
        "sets through nutcracker's socket"
    );
    drop(nutcracker);
    for server in &unix_servers {
        let mut conn = server.connect();
        assert!(
            keys.iter().any(|k| conn.get(k).is_some()),
            "no key on {}: the placement check would prove little",
            server.addr()
        );
    }

    let reply = unix_roundtrip(
        &memroute_socket,
        format!("get {}\r\n", keys.join(" ")).as_bytes(),
        |r| r.ends_with(b"END\r\n"),
    );
    let values = parse_values(&reply)
        .unwrap_or_else(|| panic!("multi-get over memroute's socket: {}", show(&reply)));
    let got: Vec<(String, Vec<u8>)> = values.into_iter().map(|(k, _, v)| (k, v)).collect();
    let want: Vec<(String, Vec<u8>)> = keys
        .iter()
        .map(|k| (k.clone(), k.as_bytes().to_vec()))
        .collect();
    assert_eq!(
        got, want,
        "keys set through nutcracker's socket, read through memroute's"
    );
}
