//! Placement equal to nutcracker's (twemproxy 0.5.0): nutcracker and memroute run over the SAME
//! memcached servers; keys written through one must all be found through the other. A key
//! placed on a different server shows up as a miss, so this pins ketama point counts, server
//! identities (names, the port-11211 rule), weights and every hash function end to end.
use memroute_tests::*;

const KEYS: usize = 500;

/// One pool: its servers (twemproxy spec strings) and the processes behind them.
struct Pool {
    servers: Vec<Memcached>,
    specs: Vec<String>,
}

/// `n` memcached on 127.0.0.1 with weight 1 and no name.
fn plain(n: usize) -> Pool {
    let servers: Vec<Memcached> = (0..n)
        .map(|_| Memcached::start_on("127.0.0.1", free_port(), 8))
        .collect();
    let specs = servers.iter().map(|m| format!("{}:1", m.addr())).collect();
    Pool { servers, specs }
}

/// Keys as an application might use them, some with bytes >= 0x80 (twemproxy's hashes that
/// sign-extend such bytes would place them differently if memroute got that wrong).
fn keys(prefix: &str) -> Vec<String> {
    (0..KEYS)
        .map(|i| match i % 10 {
            0 => format!("{prefix}ключ:{i}"),
            1 => format!("{prefix}user:{i}:profile"),
            2 => format!("{prefix}{{tag}}{i}"),
            _ => format!("{prefix}{i}"),
        })
        .collect()
}

/// Sets every key to `v-<key>` through `writer`, pipelined.
fn write_all(writer: &mut Conn, keys: &[String]) {
    let mut batch = Vec::new();
    for k in keys {
        let v = format!("v-{k}");
        batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let replies = writer.roundtrip_lines(&batch, keys.len());
    assert_eq!(show(&replies), show(&b"STORED\r\n".repeat(keys.len())));
}

/// Gets every key through `reader` (one get per key, pipelined); returns the keys that missed.
fn misses(reader: &mut Conn, keys: &[String]) -> Vec<String> {
    let batch: String = keys.iter().map(|k| format!("get {k}\r\n")).collect();
    reader.send(batch.as_bytes());
    let mut missed = Vec::new();
    for k in keys {
        let reply = reader.read_get_reply();
        let values = parse_values(&reply).unwrap_or_else(|| panic!("get {k}: {}", show(&reply)));
        match values.first() {
            Some((_, _, v)) => assert_eq!(v, format!("v-{k}").as_bytes(), "wrong value for {k}"),
            None => missed.push(k.clone()),
        }
    }
    missed
}

/// Which servers hold `key` (for the failure message).
fn holders(pool: &Pool, key: &str) -> Vec<String> {
    pool.servers
        .iter()
        .filter(|m| m.connect().get(key).is_some())
        .map(Memcached::addr)
        .collect()
}

fn check(name: &str, pool: &Pool, distribution: &str, hash: &str) {
    let nc_listen = format!("127.0.0.1:{}", free_port());
    let servers_yaml: String = pool.specs.iter().map(|s| format!("   - {s}\n")).collect();
    let nutcracker = Nutcracker::start(&format!(
        "pool:\n  listen: {nc_listen}\n  hash: {hash}\n  distribution: {distribution}\n  timeout: 5000\n  \
         auto_eject_hosts: false\n  servers:\n{servers_yaml}"
    ));
    let mr_listen = format!("127.0.0.1:{}", free_port());
    // The same timeout as nutcracker's: on a busy machine a reply can take longer than the
    // default 250 ms, and this test is about placement, not the clock.
    let memroute = Memroute::start(&pool_config(
        &mr_listen,
        &pool.specs,
        distribution,
        hash,
        "timeout = \"5s\"",
    ));

    let mut failures = Vec::new();
    for (writer, reader, w, r, prefix) in [
        (
            &nutcracker.listen,
            &memroute.listen,
            "nutcracker",
            "memroute",
            "n",
        ),
        (
            &memroute.listen,
            &nutcracker.listen,
            "memroute",
            "nutcracker",
            "m",
        ),
    ] {
        let keys = keys(prefix);
        write_all(&mut Conn::connect(writer), &keys);
        let missed = misses(&mut Conn::connect(reader), &keys);
        if !missed.is_empty() {
            let examples: Vec<String> = missed
                .iter()
                .take(5)
                .map(|k| format!("{k:?} is on {:?}", holders(pool, k)))
                .collect();
            failures.push(format!(
                "{} of {KEYS} keys written via {w} miss via {r}; e.g. {}",
                missed.len(),
                examples.join("; ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name} ({distribution}/{hash}, servers {:?}):\n{}",
        pool.specs,
        failures.join("\n")
    );
}

#[test]
fn ketama_fnv1a_64_pool_sizes_1_2_3() {
    for n in [1, 2, 3] {
        check(&format!("{n} servers"), &plain(n), "ketama", "fnv1a_64");
    }
}

#[test]
fn ketama_fnv1a_64_10_servers() {
    check("10 servers", &plain(10), "ketama", "fnv1a_64");
}

/// 25 is the first size where twemproxy's float32 arithmetic gives 156 points per server.
#[test]
fn ketama_fnv1a_64_25_servers() {
    check("25 servers", &plain(25), "ketama", "fnv1a_64");
}

#[test]
fn ketama_fnv1a_64_50_servers() {
    check("50 servers", &plain(50), "ketama", "fnv1a_64");
}

/// Weights change point counts; names replace the address in the ketama identity.
#[test]
fn ketama_weighted_and_named() {
    let weights = [1, 2, 3, 1, 5];
    let servers: Vec<Memcached> = weights
        .iter()
        .map(|_| Memcached::start_on("127.0.0.1", free_port(), 8))
        .collect();
    let named = Pool {
        specs: servers
            .iter()
            .zip(weights)
            .enumerate()
            .map(|(i, (m, w))| format!("{}:{w} cache-{i}", m.addr()))
            .collect(),
        servers,
    };
    check("weighted + named", &named, "ketama", "fnv1a_64");

    let servers: Vec<Memcached> = weights
        .iter()
        .map(|_| Memcached::start_on("127.0.0.1", free_port(), 8))
        .collect();
    let weighted = Pool {
        specs: servers
            .iter()
            .zip(weights)
            .map(|(m, w)| format!("{}:{w}", m.addr()))
            .collect(),
        servers,
    };
    check("weighted, unnamed", &weighted, "ketama", "fnv1a_64");
}

/// Servers on port 11211 are identified by host alone in twemproxy's ketama.
#[test]
fn ketama_port_11211_servers() {
    let servers: Vec<Memcached> = (0..4)
        .map(|_| Memcached::start_on(&free_loopback_host(11211), 11211, 8))
        .collect();
    let specs = servers.iter().map(|m| format!("{}:1", m.addr())).collect();
    check(
        "port 11211 on distinct addresses",
        &Pool { servers, specs },
        "ketama",
        "fnv1a_64",
    );
}

const HASHES: [&str; 12] = [
    "one_at_a_time",
    "md5",
    "crc16",
    "crc32",
    "crc32a",
    "fnv1_64",
    "fnv1a_64",
    "fnv1_32",
    "fnv1a_32",
    "hsieh",
    "murmur",
    "jenkins",
];

#[test]
fn ketama_every_twemproxy_hash() {
    for (i, hash) in HASHES.iter().enumerate() {
        check(&format!("hash {hash}"), &plain(3 + i % 3), "ketama", hash);
    }
}

#[test]
fn modula_every_twemproxy_hash() {
    for (i, hash) in HASHES.iter().enumerate() {
        check(&format!("hash {hash}"), &plain(3 + i % 3), "modula", hash);
    }
}
