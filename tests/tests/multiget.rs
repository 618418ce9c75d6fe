//! Multi-key gets across 4 memcached servers behind memroute (ketama): split per server,
//! merged back in the client's key order with duplicates kept, also when batches are capped.
use memroute_tests::tls::Pki;
use memroute_tests::*;

fn four_servers() -> Vec<Memcached> {
    (0..4).map(|_| Memcached::start()).collect()
}

fn addrs(servers: &[Memcached]) -> Vec<String> {
    servers.iter().map(Memcached::addr).collect()
}

/// memroute over `servers` with ketama over md5. (twemproxy's default fnv1a_64 is a 32-bit FNV-1a
/// that bunches short sequential keys like `key0..key199` onto one or two of four servers;
/// md5 spreads them, and this test is about splitting and merging, not the hash.)
/// The backend timeout is long: a TLS connect or a reply through a debug build on a busy
/// machine can take longer than the default 250 ms, and these tests are about placement and
/// merging, not the clock.
fn proxy_over(servers: &[Memcached], extra_pool_lines: &str) -> Memroute {
    let listen = format!("127.0.0.1:{}", free_port());
    Memroute::start(&pool_config(
        &listen,
        &addrs(servers),
        "ketama",
        "md5",
        &format!("timeout = \"10s\"\n{extra_pool_lines}"),
    ))
}

fn value_of(i: usize) -> String {
    format!("value-{i}-{}", "x".repeat(i % 17))
}

/// Sets key0..key199 through `proxy` (pipelined) and returns their names.
fn set_200(proxy: &Memroute) -> Vec<String> {
    let keys: Vec<String> = (0..200).map(|i| format!("key{i}")).collect();
    let mut c = proxy.connect();
    let mut batch = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let v = value_of(i);
        batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let replies = c.roundtrip_lines(&batch, keys.len());
    assert_eq!(show(&replies), show(&b"STORED\r\n".repeat(keys.len())));
    keys
}

/// 100 keys in one get: hits, duplicates and misses interleaved.
fn mixed_keys() -> Vec<String> {
    (0..100)
        .map(|i| match i % 4 {
            0 | 1 => format!("key{}", i * 2),
            2 => format!("key{}", (i - 2) * 2), // a duplicate of the key two places earlier
            _ => format!("missing{i}"),
        })
        .collect()
}

/// The reply memcached would give for `keys` if it held all 200 keys.
fn expected_reply(keys: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for k in keys {
        if let Some(i) = k.strip_prefix("key").and_then(|n| n.parse::<usize>().ok()) {
            let v = value_of(i);
            out.extend_from_slice(format!("VALUE {k} 0 {}\r\n{v}\r\n", v.len()).as_bytes());
        }
    }
    out.extend_from_slice(b"END\r\n");
    out
}

fn multi_get(proxy: &Memroute, keys: &[String]) -> Vec<u8> {
    let mut c = proxy.connect();
    c.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    c.read_get_reply()
}

#[test]
fn keys_spread_over_all_servers_and_multiget_merges_in_order() {
    let servers = four_servers();
    let proxy = proxy_over(&servers, "");
    let keys = set_200(&proxy);

    // Every key is on exactly one server, and every server holds some.
    let mut per_server = vec![0; servers.len()];
    for k in &keys {
        let holders: Vec<usize> = (0..servers.len())
            .filter(|&s| servers[s].connect().get(k).is_some())
            .collect();
        assert_eq!(holders.len(), 1, "{k} is on servers {holders:?}");
        per_server[holders[0]] += 1;
    }
    assert!(
        per_server.iter().all(|&n| n > 0),
        "keys per server: {per_server:?}"
    );

    let keys = mixed_keys();
    assert_eq!(
        show(&multi_get(&proxy, &keys)),
        show(&expected_reply(&keys))
    );
}

/// The same split and merge through a TLS pool: four real `memcached -Z` servers, each
/// reached over its own TLS connection; capped batches too.
#[test]
fn multiget_through_a_tls_pool_merges_in_order() {
    let pki = Pki::generate();
    let servers: Vec<Memcached> = (0..4)
        .map(|_| {
            Memcached::start_with_args(
                "127.0.0.1",
                free_port(),
                64,
                Pki::memcached_args(&pki.server),
            )
        })
        .collect();
    let tls = format!(
        "tls = {{ ca = {:?}, server_name = \"localhost\" }}",
        pki.ca.display().to_string()
    );
    for extra in ["", "max_keys_per_request = 3"] {
        let proxy = proxy_over(&servers, &format!("{tls}\n{extra}"));
        set_200(&proxy);
        let keys = mixed_keys();
        assert_eq!(
            show(&multi_get(&proxy, &keys)),
            show(&expected_reply(&keys)),
            "{extra}"
        );
    }
}

#[test]
fn capped_batches_give_the_same_answer() {
    let servers = four_servers();
    let proxy = proxy_over(&servers, "max_keys_per_request = 3");
    set_200(&proxy);
    let keys = mixed_keys();
    assert_eq!(
        show(&multi_get(&proxy, &keys)),
        show(&expected_reply(&keys))
    );
    // gets with the cap too: same VALUE lines (with cas) as asking each key alone.
    let mut c = proxy.connect();
    c.send(format!("gets {}\r\n", keys.join(" ")).as_bytes());
    let values = parse_values(&c.read_get_reply()).expect("gets reply");
    let got: Vec<&str> = values.iter().map(|(k, _, _)| k.as_str()).collect();
    let want: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .filter(|k| k.starts_with("key"))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn flush_all_empties_every_server() {
    let servers = four_servers();
    let proxy = proxy_over(&servers, "");
    let keys = set_200(&proxy);
    let mut c = proxy.connect();
    assert_eq!(show(&c.roundtrip_line(b"flush_all\r\n")), show(b"OK\r\n"));
    for (s, server) in servers.iter().enumerate() {
        let mut direct = server.connect();
        direct.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
        assert_eq!(
            show(&direct.read_get_reply()),
            "END\\r\\n\n",
            "server {s} still holds keys after flush_all"
        );
    }
    assert_eq!(show(&multi_get(&proxy, &keys[..50])), "END\\r\\n\n");
}
