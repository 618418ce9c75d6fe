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

const KEYS: usize = 20_000;
const WAIT: Duration = Duration::from_secs(20);

fn servers_of(servers: &[Memcached]) -> Vec<String> {
    servers.iter().map(Memcached::addr).collect()
}

fn config(listen: &str, servers: &[String], window: &str) -> String {
    simple_config(listen, servers, &format!("resize_window = \"{window}\"\n"))
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

/// The scenario of the issue: `before` servers hold the keys, the pool becomes `after`, 200
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

    let plain = Memroute::start_pool_with(after, "resize_window = \"0s\"\n");
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
