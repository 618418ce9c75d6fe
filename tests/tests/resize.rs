//! Growing and shrinking a pool under memroute without a cold cache (`resize_window`):
//! 20,000 keys in a ketama pool, the config file replaced by a rename with one server more
//! (or less), then writes and one read pass through memroute during the window; afterwards
//! a memroute without a window over the new servers finds the keys on their new owners.
//!
//! ```text
//!   client ──> memroute (pool main: 4 servers -> 5, resize_window) ──> memcached x5
//!              a key whose owner changed: new owner first, then the old owner (moved)
//! ```
//!
//! Every wait polls memroute's stats, its log or a server's stats, bounded.
use std::collections::HashMap;
use std::time::Duration;

use memroute_tests::*;

#[path = "common/binary_client.rs"]
mod binary_client;

const KEYS: usize = 20_000;
const WAIT: Duration = Duration::from_secs(20);

fn servers_of(servers: &[Memcached]) -> Vec<String> {
    servers.iter().map(Memcached::addr).collect()
}

/// One ketama pool `main` (md5: sequential keys spread evenly) with `resize_window`. The
/// timeout is long: these tests judge answers, and a starved machine must not turn one into
/// a timeout.
fn config(listen: &str, servers: &[String], window: &str) -> String {
    let window = format!("resize_window = \"{window}\"\ntimeout = \"5s\"\n");
    pool_config(listen, servers, "ketama", "md5", &window)
}

/// A memroute over `servers` with no window: it finds only keys on their owners.
fn without_window(servers: &[String]) -> Memroute {
    let listen = format!("127.0.0.1:{}", free_port());
    Memroute::start(&config(&listen, servers, "0s"))
}

fn start_servers(n: usize) -> Vec<Memcached> {
    (0..n)
        .map(|_| Memcached::start_on("127.0.0.1", free_port(), 64))
        .collect()
}

fn value_of(key: &str, generation: u32) -> String {
    format!("v{generation}-{key}-{}", "x".repeat(32))
}

/// Replaces memroute's config file by a rename (its file watch reloads it) and waits until
/// the pool has `servers` servers and a resize window is running.
fn resize_to(proxy: &Memroute, listen: &str, servers: &[String], window: &str) {
    proxy.rewrite_config(&config(listen, servers, window));
    let n = servers.len() as u64;
    proxy.wait_stats("the reloaded pool and its window", WAIT, |s| {
        stat_u64(s, "pool:main:servers") == Some(n)
            && stat_u64(s, "pool:main:resize_window_active") == Some(1)
    });
}

/// Reads every key through `c` with 50-key multi-gets: key -> value.
fn read_all(c: &mut Conn, keys: &[String]) -> HashMap<String, Vec<u8>> {
    let mut out = HashMap::new();
    for chunk in keys.chunks(50) {
        c.send(format!("get {}\r\n", chunk.join(" ")).as_bytes());
        let reply = c.read_get_reply();
        let values = parse_values(&reply).unwrap_or_else(|| panic!("get: {}", show(&reply)));
        for (key, _, value) in values {
            out.insert(key, value);
        }
    }
    out
}

/// What a key should read after the writes: deleted keys miss, overwritten keys read their
/// second value, the others their first.
struct Expected {
    deleted: Vec<String>,
    overwritten: Vec<String>,
}

impl Expected {
    fn of(&self, key: &str) -> Option<String> {
        if self.deleted.iter().any(|k| k == key) {
            None
        } else if self.overwritten.iter().any(|k| k == key) {
            Some(value_of(key, 2))
        } else {
            Some(value_of(key, 1))
        }
    }
}

/// Counts (exact, stale) over one read pass: stale is any value other than the expected one
/// (a deleted key's, an overwritten key's first); a miss is neither.
fn judge(read: &HashMap<String, Vec<u8>>, keys: &[String], expected: &Expected) -> (usize, usize) {
    let (mut exact, mut stale) = (0, 0);
    for key in keys {
        let got = read
            .get(key)
            .map(|v| String::from_utf8_lossy(v).to_string());
        let want = expected.of(key);
        if got == want {
            exact += 1;
        } else if got.is_some() {
            stale += 1;
        }
    }
    (exact, stale)
}

/// Deletes 200 keys and overwrites 200 others through `c`.
fn write_during_window(c: &mut Conn, keys: &[String]) -> Expected {
    // Spread over the key space: every fiftieth key deleted, the next one overwritten.
    let deleted: Vec<String> = keys.iter().step_by(50).take(200).cloned().collect();
    let overwritten: Vec<String> = keys.iter().skip(1).step_by(50).take(200).cloned().collect();
    for key in &deleted {
        let reply = c.roundtrip_line(format!("delete {key}\r\n").as_bytes());
        assert!(
            reply == b"DELETED\r\n",
            "delete {key} during the window: {}",
            show(&reply)
        );
    }
    c.set_many(&overwritten, |k| value_of(k, 2));
    Expected {
        deleted,
        overwritten,
    }
}

/// A resize that keeps the cache: `before` servers hold the keys, the pool becomes `after`, 200
/// deletes and 200 overwrites, one read pass, then a memroute with no window over `after`.
fn resize_keeps_the_cache(before: &[String], after: &[String]) {
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, before, "10m"));
    let mut c = proxy.connect();
    let keys = numbered_keys("resize:", KEYS);
    c.set_many(&keys, |k| value_of(k, 1));
    resize_to(&proxy, &listen, after, "10m");
    let expected = write_during_window(&mut c, &keys);
    let read = read_all(&mut c, &keys);
    let (exact, stale) = judge(&read, &keys, &expected);
    let share = exact as f64 / KEYS as f64;
    println!(
        "resize {} -> {} servers: {exact} of {KEYS} keys read exactly ({:.2}%), {stale} stale",
        before.len(),
        after.len(),
        share * 100.0
    );
    assert_eq!(stale, 0, "stale values read during the window");
    assert!(share >= 0.995, "only {:.2}% read exactly", share * 100.0);
    let stats = proxy.stats();
    let moved = stat_u64(&stats, "pool:main:resize_keys_moved").unwrap_or(0);
    assert!(moved > 1000, "keys moved: {moved}");

    let plain = without_window(after);
    let mut direct = plain.connect();
    let live: Vec<String> = keys
        .iter()
        .filter(|k| expected.of(k).is_some())
        .cloned()
        .collect();
    let found = read_all(&mut direct, &live)
        .iter()
        .filter(|(k, v)| expected.of(k).as_deref().map(str::as_bytes) == Some(v.as_slice()))
        .count();
    let share = found as f64 / live.len() as f64;
    println!(
        "no window over the new servers: {found} of {} live keys on their new owners ({:.2}%)",
        live.len(),
        share * 100.0
    );
    assert!(
        share >= 0.98,
        "only {:.2}% on their new owners",
        share * 100.0
    );
}

#[test]
fn adding_a_fifth_server_keeps_the_cache() {
    let servers = start_servers(5);
    let all = servers_of(&servers);
    resize_keeps_the_cache(&all[..4], &all);
}

#[test]
fn removing_a_server_that_stays_up_keeps_the_cache() {
    let servers = start_servers(5);
    let all = servers_of(&servers);
    resize_keeps_the_cache(&all, &all[..4]);
}

/// Keys whose owner changed and that are still on their old owner only: a memroute with
/// no window over `after` misses them (it moves nothing).
fn not_yet_moved(after: &[String], keys: &[String]) -> Vec<String> {
    let plain = without_window(after);
    let found = read_all(&mut plain.connect(), keys);
    keys.iter()
        .filter(|k| !found.contains_key(*k))
        .cloned()
        .collect()
}

#[test]
fn writes_on_moved_keys_answer_as_memcached_would() {
    let servers = start_servers(5);
    let all = servers_of(&servers);
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &all[..4], "10m"));
    let mut c = proxy.connect();
    let keys = numbered_keys("w:", 2000);
    c.set_many(&keys, |_| "10".to_string());
    resize_to(&proxy, &listen, &all, "10m");
    let moved = not_yet_moved(&all, &keys);
    assert!(moved.len() >= 12, "only {} keys moved", moved.len());
    let mut moved = moved.iter();
    let mut next = || moved.next().expect("a moved key").clone();

    // Each of these would answer differently on a new owner that never had the key.
    let k = next();
    assert_eq!(
        c.roundtrip_line(format!("append {k} 0 0 2\r\n-a\r\n").as_bytes()),
        b"STORED\r\n"
    );
    assert_eq!(c.get(&k).as_deref(), Some(&b"10-a"[..]));
    let k = next();
    assert_eq!(
        c.roundtrip_line(format!("prepend {k} 0 0 2\r\np-\r\n").as_bytes()),
        b"STORED\r\n"
    );
    assert_eq!(c.get(&k).as_deref(), Some(&b"p-10"[..]));
    let k = next();
    assert_eq!(
        c.roundtrip_line(format!("incr {k} 5\r\n").as_bytes()),
        b"15\r\n"
    );
    let k = next();
    assert_eq!(
        c.roundtrip_line(format!("decr {k} 3\r\n").as_bytes()),
        b"7\r\n"
    );
    let k = next();
    assert_eq!(
        c.roundtrip_line(format!("touch {k} 300\r\n").as_bytes()),
        b"TOUCHED\r\n"
    );
    let k = next();
    assert_eq!(
        c.roundtrip_line(format!("add {k} 0 0 1\r\nx\r\n").as_bytes()),
        b"NOT_STORED\r\n"
    );
    assert_eq!(c.get(&k).as_deref(), Some(&b"10"[..]));
    let k = next();
    assert_eq!(
        c.roundtrip_line(format!("replace {k} 0 0 1\r\nr\r\n").as_bytes()),
        b"STORED\r\n"
    );
    assert_eq!(c.get(&k).as_deref(), Some(&b"r"[..]));
    // gets answers the new owner's CAS, which a cas then matches.
    let k = next();
    c.send(format!("gets {k}\r\n").as_bytes());
    let reply = String::from_utf8_lossy(&c.read_get_reply()).to_string();
    let cas = reply
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(4))
        .unwrap_or_else(|| panic!("gets {k}: {reply}"))
        .to_string();
    assert_eq!(
        c.roundtrip_line(format!("cas {k} 0 0 1 {cas}\r\nc\r\n").as_bytes()),
        b"STORED\r\n"
    );
    assert_eq!(c.get(&k).as_deref(), Some(&b"c"[..]));
    // Meta arithmetic and a meta get.
    let k = next();
    assert_eq!(
        c.roundtrip_line(format!("ma {k} v\r\n").as_bytes()),
        b"VA 2\r\n"
    );
    assert_eq!(c.read_line(), b"11\r\n");
    let k = next();
    assert_eq!(
        c.roundtrip_line(format!("mg {k} v\r\n").as_bytes()),
        b"VA 2\r\n"
    );
    assert_eq!(c.read_line(), b"10\r\n");
    // Deletes of keys not moved yet find them on their old owner, which forgets them.
    let deleted = next();
    assert_eq!(
        c.roundtrip_line(format!("delete {deleted}\r\n").as_bytes()),
        b"DELETED\r\n"
    );
    assert_eq!(c.get(&deleted), None);
    let meta_deleted = next();
    assert_eq!(
        c.roundtrip_line(format!("md {meta_deleted}\r\n").as_bytes()),
        b"HD\r\n"
    );
    assert_eq!(c.get(&meta_deleted), None);
    // A binary-protocol get of a moved key.
    let k = next();
    assert_eq!(
        binary_client::get(&mut proxy.connect(), &k).as_deref(),
        Some(&b"10"[..])
    );

    // Eleven keys moved (append, prepend, incr, decr, touch, add, replace, gets, ma, mg,
    // the binary get); fourteen looks on an old owner: those, the cas behind the gets (its
    // key moved already) and the gets of the two deleted keys (the deletes look for none).
    let stats = proxy.stats();
    assert_eq!(
        stat_u64(&stats, "pool:main:resize_keys_moved"),
        Some(11),
        "{stats:?}"
    );
    assert_eq!(
        stat_u64(&stats, "pool:main:resize_fallback_reads"),
        Some(14),
        "{stats:?}"
    );
    assert_eq!(
        stat_u64(&stats, "pool:main:resize_errors"),
        Some(0),
        "{stats:?}"
    );
    // The deleted keys' old copies are gone too: the old placement has neither.
    let before = without_window(&all[..4]);
    let mut before = before.connect();
    assert_eq!(before.get(&deleted), None);
    assert_eq!(before.get(&meta_deleted), None);
}

#[test]
fn a_window_ends_and_the_servers_that_left_are_let_go() {
    let servers = start_servers(5);
    let all = servers_of(&servers);
    let mut probe = servers[4].connect();
    let baseline = stat_u64(&probe.stats(), "curr_connections").expect("curr_connections");
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &all, "2s"));
    let mut c = proxy.connect();
    let keys = numbered_keys("end:", 2000);
    c.set_many(&keys, |k| value_of(k, 1));
    let on_leaving = servers[4].held(&keys).len();
    assert!(on_leaving > 100, "{on_leaving} keys on the fifth server");
    resize_to(&proxy, &listen, &all[..4], "2s");
    assert!(
        proxy.wait_log("resize window ended", WAIT),
        "no `resize window ended`\n{}",
        proxy.log_text()
    );
    proxy.wait_stats("the window's end in stats", WAIT, |s| {
        stat_u64(s, "pool:main:resize_window_active") == Some(0)
    });
    // Keys never read during the window stayed on the server that left: plain misses now.
    let read = read_all(&mut c, &keys);
    assert_eq!(read.len(), keys.len() - on_leaving);
    // And memroute has closed its connections to that server.
    let now = {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let now = stat_u64(&probe.stats(), "curr_connections").expect("curr_connections");
            if now <= baseline || std::time::Instant::now() >= deadline {
                break now;
            }
            std::thread::sleep(POLL);
        }
    };
    assert_eq!(now, baseline, "connections to the server that left");
}

#[test]
fn a_second_change_during_a_window_starts_from_the_placement_just_before() {
    let servers = start_servers(6);
    let all = servers_of(&servers);
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &all[..4], "10m"));
    let mut c = proxy.connect();
    let keys = numbered_keys("twice:", 5000);
    c.set_many(&keys, |k| value_of(k, 1));
    resize_to(&proxy, &listen, &all[..5], "10m");
    // Every key read (and so moved) under five servers...
    let read = read_all(&mut c, &keys);
    assert_eq!(read.len(), keys.len());
    let moved_first = stat_u64(&proxy.stats(), "pool:main:resize_keys_moved").unwrap_or(0);
    resize_to(&proxy, &listen, &all, "10m");
    assert!(
        proxy.wait_log_count("resize window started", 2, WAIT),
        "{}",
        proxy.log_text()
    );
    // ...is found again under six: the new window's old owners are the five servers'.
    let read = read_all(&mut c, &keys);
    let exact = keys
        .iter()
        .filter(|k| read.get(*k).map(Vec::as_slice) == Some(value_of(k, 1).as_bytes()))
        .count();
    assert_eq!(exact, keys.len());
    let moved_second = stat_u64(&proxy.stats(), "pool:main:resize_keys_moved").unwrap_or(0);
    assert!(
        moved_second > moved_first + 300,
        "{moved_first} then {moved_second}"
    );
}

#[test]
fn dns_discovery_finding_a_fifth_server_keeps_the_cache() {
    let port = free_port();
    let servers: Vec<Memcached> = (0..5)
        .map(|_| Memcached::start_on(&free_loopback_host(port), port, 64))
        .collect();
    let dir = TempDir::new("resize-dns");
    let hosts_path = dir.path().join("hosts");
    let write_hosts = |servers: &[Memcached]| {
        let lines: Vec<String> = servers
            .iter()
            .map(|s| format!("{} cache.test", s.host))
            .collect();
        let staged = dir.write("hosts.new", &format!("{}\n", lines.join("\n")));
        std::fs::rename(staged, &hosts_path).expect("replace the hosts file");
    };
    write_hosts(&servers[..4]);
    let toml = format!(
        "{}[pools.d]\nservers = {{ dns = \"cache.test:{port}\", refresh = \"100ms\" }}\n\
         distribution = \"ketama\"\nhash = \"md5\"\nresize_window = \"10m\"\ntimeout = \"5s\"\n\n\
         [discovery]\nhosts_file = {:?}\n",
        proxy_section(&format!("127.0.0.1:{}", free_port()), "d"),
        hosts_path.display().to_string()
    );
    let proxy = Memroute::start(&toml);
    let mut c = proxy.connect();
    proxy.wait_stats("four servers found", WAIT, |s| {
        stat_u64(s, "pool:d:servers") == Some(4)
    });
    let keys = numbered_keys("dns:", 5000);
    c.set_many(&keys, |k| value_of(k, 1));
    write_hosts(&servers);
    proxy.wait_stats("the fifth server and a window", WAIT, |s| {
        stat_u64(s, "pool:d:servers") == Some(5)
            && stat_u64(s, "pool:d:resize_window_active") == Some(1)
    });
    let read = read_all(&mut c, &keys);
    let exact = keys
        .iter()
        .filter(|k| read.get(*k).map(Vec::as_slice) == Some(value_of(k, 1).as_bytes()))
        .count();
    assert_eq!(exact, keys.len());
    assert!(
        servers[4].held(&keys).len() > 500,
        "keys moved to the fifth server"
    );
}

#[test]
fn route_lookup_shows_a_moved_keys_old_owner_during_the_window() {
    let servers = start_servers(5);
    let all = servers_of(&servers);
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let with_admin = |servers: &[String]| {
        format!(
            "{}[admin]\nlisten = \"{admin}\"\n",
            config(&listen, servers, "10m")
        )
    };
    let proxy = Memroute::start(&with_admin(&all[..4]));
    let keys = numbered_keys("where:", 200);
    proxy.connect().set_many(&keys, |k| value_of(k, 1));
    let moved = not_yet_moved(&all, &keys);
    let key = moved.first().expect("a key that moves");
    let (status, before) = admin_http(&admin, "GET", &format!("/route?key={key}"));
    assert_eq!(status, 200);
    assert!(!before.contains("old owner"), "{before}");
    proxy.rewrite_config(&with_admin(&all));
    proxy.wait_stats("the reloaded pool and its window", WAIT, |s| {
        stat_u64(s, "pool:main:resize_window_active") == Some(1)
    });
    let (status, during) = admin_http(&admin, "GET", &format!("/route?key={key}"));
    assert_eq!(status, 200);
    let old_owner = before
        .split(" => ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .expect("the owner before");
    assert!(
        during.contains(&format!("[resize window: old owner {old_owner}]")),
        "before: {before}during: {during}"
    );
    assert!(
        during.contains(&all[4]),
        "the new owner is the fifth server: {during}"
    );
}

#[test]
fn keys_of_a_server_that_is_gone_are_plain_misses() {
    let mut servers = start_servers(5);
    let all = servers_of(&servers);
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &all, "10m"));
    let mut c = proxy.connect();
    let keys = numbered_keys("gone:", 2000);
    c.set_many(&keys, |k| value_of(k, 1));
    let on_gone: Vec<String> = servers[4].held(&keys).into_keys().collect();
    assert!(
        on_gone.len() > 100,
        "{} keys on the fifth server",
        on_gone.len()
    );
    resize_to(&proxy, &listen, &all[..4], "10m");
    servers[4].kill();
    // Every read answers: a miss for the keys that were on the server that went away (the
    // first ask may find it refusing, which marks it down; neither is the client's error).
    for key in &on_gone {
        c.send(format!("get {key}\r\n").as_bytes());
        assert_eq!(c.read_get_reply(), b"END\r\n", "get {key}");
    }
    let read = read_all(&mut c, &keys);
    assert_eq!(read.len(), keys.len() - on_gone.len());
}

/// The value a single-key get reply carries, if any.
fn value_in(reply: &[u8]) -> Option<Vec<u8>> {
    parse_values(reply)
        .and_then(|values| values.into_iter().next())
        .map(|(_, _, value)| value)
}

/// Pipelined requests of one key on one connection answer as memcached would answer them
/// in order: the read behind a write sees the write, even when the write has to move the
/// key first (and a read behind a read that moves it still finds it).
#[test]
fn a_read_pipelined_behind_a_request_on_its_moved_key_sees_that_request() {
    let servers = start_servers(5);
    let all = servers_of(&servers);
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &all[..4], "10m"));
    let mut c = proxy.connect();
    let keys = numbered_keys("pipelined:", 2000);
    c.set_many(&keys, |_| "10".to_string());
    resize_to(&proxy, &listen, &all, "10m");
    let moved = not_yet_moved(&all, &keys);
    assert!(moved.len() >= 300, "only {} keys moved", moved.len());
    let mut moved = moved.chunks(50);
    let mut next = || moved.next().expect("50 moved keys");
    for key in next() {
        // The append moves the key while the get behind it looks for it.
        c.send(format!("append {key} 0 0 2\r\n-a\r\nget {key}\r\n").as_bytes());
        assert_eq!(c.read_line(), b"STORED\r\n", "append {key}");
        let reply = c.read_get_reply();
        assert_eq!(
            value_in(&reply).as_deref(),
            Some(&b"10-a"[..]),
            "get {key} pipelined behind its append: {}",
            show(&reply)
        );
    }
    for key in next() {
        c.send(format!("incr {key} 5\r\ngets {key}\r\n").as_bytes());
        assert_eq!(c.read_line(), b"15\r\n", "incr {key}");
        let reply = c.read_get_reply();
        assert_eq!(
            value_in(&reply).as_deref(),
            Some(&b"15"[..]),
            "gets {key} pipelined behind its incr: {}",
            show(&reply)
        );
    }
    for key in next() {
        // Two reads: the first moves the key, the second must still find it.
        c.send(format!("get {key}\r\nget {key}\r\n").as_bytes());
        for _ in 0..2 {
            let reply = c.read_get_reply();
            assert_eq!(
                value_in(&reply).as_deref(),
                Some(&b"10"[..]),
                "get {key} twice: {}",
                show(&reply)
            );
        }
    }
    let batch = next();
    for key in batch {
        // The append moves the key while a multi-get behind it reads it with another key.
        c.send(format!("append {key} 0 0 2\r\n-b\r\nget {key} {}\r\n", keys[0]).as_bytes());
        assert_eq!(c.read_line(), b"STORED\r\n", "append {key}");
        let reply = c.read_get_reply();
        let values = parse_values(&reply).unwrap_or_else(|| panic!("get: {}", show(&reply)));
        let got = values
            .into_iter()
            .find(|(k, ..)| k == key)
            .map(|(_, _, value)| value);
        assert_eq!(
            got.as_deref(),
            Some(&b"10-b"[..]),
            "multi-get of {key} pipelined behind its append: {}",
            show(&reply)
        );
    }
    // noreply writes: the read behind sees them too.
    for key in next() {
        c.send(format!("append {key} 0 0 2 noreply\r\n-c\r\nget {key}\r\n").as_bytes());
        let reply = c.read_get_reply();
        assert_eq!(
            value_in(&reply).as_deref(),
            Some(&b"10-c"[..]),
            "get {key} pipelined behind its noreply append: {}",
            show(&reply)
        );
        c.send(format!("delete {key} noreply\r\nget {key}\r\n").as_bytes());
        assert_eq!(
            c.read_get_reply(),
            b"END\r\n",
            "get {key} pipelined behind its noreply delete"
        );
    }
    // A multi-get naming a moved key twice answers it twice.
    let key = &next()[0];
    c.send(format!("get {key} {key}\r\n").as_bytes());
    let reply = c.read_get_reply();
    let values = parse_values(&reply).unwrap_or_else(|| panic!("get: {}", show(&reply)));
    assert_eq!(values.len(), 2, "{}", show(&reply));
    assert!(
        values.iter().all(|(_, _, v)| v == b"10"),
        "{}",
        show(&reply)
    );
}

/// `mg KEY f t v` through `c`: (flags, seconds left or -1, value); `None` for a miss.
fn flags_ttl_value(c: &mut Conn, key: &str) -> Option<(u64, i64, Vec<u8>)> {
    let line = String::from_utf8(c.roundtrip_line(format!("mg {key} f t v\r\n").as_bytes()))
        .expect("an ASCII line");
    if line == "EN\r\n" {
        return None;
    }
    let mut tokens = line.trim_end().split(' ');
    assert_eq!(tokens.next(), Some("VA"), "mg {key}: {line}");
    let (mut flags, mut ttl) = (None, None);
    for token in tokens.skip(1) {
        match token.split_at(1) {
            ("f", v) => flags = v.parse().ok(),
            ("t", v) => ttl = v.parse().ok(),
            _ => {}
        }
    }
    let value = c.read_line();
    let value = value[..value.len() - 2].to_vec();
    Some((flags.expect("f"), ttl.expect("t"), value))
}

/// A moved key reads on its new owner with the flags and the time left it had: no expiry,
/// a relative TTL, and an absolute expiry time (a TTL over 30 days, which memcached reads
/// as a Unix time).
#[test]
fn a_moved_key_keeps_its_flags_and_its_time_left() {
    let servers = start_servers(5);
    let all = servers_of(&servers);
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &all[..4], "10m"));
    let mut c = proxy.connect();
    let keys = numbered_keys("ttl:", 1000);
    c.set_many(&keys, |_| "10".to_string());
    let moved: Vec<String> = not_yet_moved(&all, &keys).into_iter().take(3).collect();
    assert_eq!(moved.len(), 3, "three keys that move");
    const SIXTY_DAYS: u64 = 60 * 24 * 3600;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let (forever, hour, far) = (&moved[0], &moved[1], &moved[2]);
    for (key, flags, exptime) in [
        (forever, u32::MAX as u64, 0),
        (hour, 7, 3600),
        (far, 12345, now + SIXTY_DAYS),
    ] {
        assert_eq!(
            c.roundtrip_line(format!("set {key} {flags} {exptime} 5\r\nvalue\r\n").as_bytes()),
            b"STORED\r\n"
        );
    }
    resize_to(&proxy, &listen, &all, "10m");
    // Moved by a read through memroute, then read on the new owner alone.
    for key in &moved {
        assert_eq!(c.get(key).as_deref(), Some(&b"value"[..]), "get {key}");
    }
    let plain = without_window(&all);
    let mut direct = plain.connect();
    let (flags, ttl, value) = flags_ttl_value(&mut direct, forever).expect("the key kept forever");
    assert_eq!(
        (flags, ttl, &value[..]),
        (u32::MAX as u64, -1, &b"value"[..])
    );
    let (flags, ttl, value) = flags_ttl_value(&mut direct, hour).expect("the key kept an hour");
    assert_eq!((flags, &value[..]), (7, &b"value"[..]));
    assert!(
        (3500..=3600).contains(&ttl),
        "an hour's key has {ttl}s left"
    );
    let (flags, ttl, value) = flags_ttl_value(&mut direct, far).expect("the key kept 60 days");
    assert_eq!((flags, &value[..]), (12345, &b"value"[..]));
    // memcached's clock ticks once a second, a little behind the Unix time the expiry is
    // rebuilt from: a second or two more is the clocks, not the copy.
    let sixty_days = SIXTY_DAYS as i64;
    assert!(
        (sixty_days - 100..=sixty_days + 2).contains(&ttl),
        "a 60-day key has {ttl}s left"
    );
}

/// Keys read (and so moved) on some connections while other connections delete or
/// overwrite them, on two workers: once both are done, no deleted key has come back on
/// either owner and every overwritten key reads its new value on its new owner only.
#[test]
fn a_key_deleted_or_overwritten_while_another_client_moves_it_stays_so() {
    let servers = start_servers(5);
    let all = servers_of(&servers);
    let listen = format!("127.0.0.1:{}", free_port());
    let two_workers = |servers: &[String]| {
        config(&listen, servers, "10m").replacen("workers = 1", "workers = 2", 1)
    };
    let proxy = Memroute::start(&two_workers(&all[..4]));
    let keys = numbered_keys("race:", 8000);
    proxy.connect().set_many(&keys, |k| value_of(k, 1));
    proxy.rewrite_config(&two_workers(&all));
    proxy.wait_stats("the reloaded pool and its window", WAIT, |s| {
        stat_u64(s, "pool:main:servers") == Some(5)
            && stat_u64(s, "pool:main:resize_window_active") == Some(1)
    });
    let moved = not_yet_moved(&all, &keys);
    assert!(moved.len() >= 1000, "only {} keys moved", moved.len());
    // The moved keys with an even number deleted, the others overwritten.
    let deleted = |key: &str| key.ends_with(['0', '2', '4', '6', '8']);
    std::thread::scope(|scope| {
        for chunk in moved.chunks(moved.len() / 4 + 1) {
            let mut reader = proxy.connect();
            let mut writer = proxy.connect();
            scope.spawn(move || {
                for batch in chunk.chunks(20) {
                    let gets: String = batch.iter().map(|k| format!("get {k}\r\n")).collect();
                    reader.send(gets.as_bytes());
                    for _ in batch {
                        reader.read_get_reply();
                    }
                }
            });
            scope.spawn(move || {
                for batch in chunk.chunks(20) {
                    let writes: String = batch
                        .iter()
                        .map(|k| match deleted(k) {
                            true => format!("delete {k}\r\n"),
                            false => {
                                let value = value_of(k, 2);
                                format!("set {k} 0 0 {}\r\n{value}\r\n", value.len())
                            }
                        })
                        .collect();
                    writer.send(writes.as_bytes());
                    for key in batch {
                        let reply = writer.read_line();
                        let want: &[u8] = match deleted(key) {
                            true => b"DELETED\r\n",
                            false => b"STORED\r\n",
                        };
                        assert_eq!(reply, want, "{key}: {}", show(&reply));
                    }
                }
            });
        }
    });
    let after = without_window(&all);
    let on_new = read_all(&mut after.connect(), &moved);
    let before = without_window(&all[..4]);
    let on_old = read_all(&mut before.connect(), &moved);
    let back: Vec<&String> = moved
        .iter()
        .filter(|k| deleted(k) && on_new.contains_key(*k))
        .collect();
    let overwritten = moved
        .iter()
        .filter(|k| !deleted(k))
        .filter(|k| on_new.get(*k).map(Vec::as_slice) == Some(value_of(k, 2).as_bytes()))
        .count();
    let live = moved.iter().filter(|k| !deleted(k)).count();
    assert!(
        back.is_empty() && on_old.is_empty() && overwritten == live,
        "{} deleted keys back on their new owners (e.g. {:?}), {} keys left on their old \
         owners, {overwritten} of {live} overwritten keys read their new value",
        back.len(),
        back.first(),
        on_old.len()
    );
}

/// Standard base64 of `bytes` (for meta commands' `b` keys).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            match i <= chunk.len() {
                true => out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char),
                false => out.push('='),
            }
        }
    }
    out
}

/// Keys only base64 carries (a space in them) and values of half a megabyte move intact:
/// every one reads back exactly through memroute during the window, and some moved.
#[test]
fn base64_keys_and_large_values_move_intact() {
    let servers = start_servers(5);
    let all = servers_of(&servers);
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &all[..4], "10m"));
    let mut c = proxy.connect();
    let spaced: Vec<String> = (0..200)
        .map(|i| base64(format!("a key {i}").as_bytes()))
        .collect();
    for key in &spaced {
        assert_eq!(
            c.roundtrip_line(format!("ms {key} 5 b F9\r\nspace\r\n").as_bytes()),
            b"HD\r\n"
        );
    }
    let large = numbered_keys("large:", 30);
    let large_value = |key: &str| format!("{key}-{}", "L".repeat(512 * 1024));
    c.set_many(&large, large_value);
    resize_to(&proxy, &listen, &all, "10m");
    for key in &spaced {
        assert_eq!(
            c.roundtrip_line(format!("mg {key} b v f\r\n").as_bytes()),
            b"VA 5 f9\r\n",
            "mg {key} b"
        );
        assert_eq!(c.read_line(), b"space\r\n");
    }
    let read = read_all(&mut c, &large);
    for key in &large {
        assert!(
            read.get(key).map(Vec::as_slice) == Some(large_value(key).as_bytes()),
            "{key}: {} bytes",
            read.get(key).map_or(0, Vec::len)
        );
    }
    let stats = proxy.stats();
    let moved = stat_u64(&stats, "pool:main:resize_keys_moved").unwrap_or(0);
    assert!(moved > 20, "keys moved: {moved}");
    assert_eq!(stat_u64(&stats, "pool:main:resize_errors"), Some(0));
}
