//! Multi-gets through policy routes (failover, replicated, warm-up, shadow) against real
//! memcached: every key answered, in the client's order, and the keys batched per server as
//! a plain pool's are. Batching is read from the servers' own counters: `cmd_get` counts
//! keys asked, `bytes_read` the bytes of the `get` lines that carried them, so one batched
//! line of 60 keys reads about 60 x 5 bytes less than 60 one-key gets.
//!
//! ```text
//!   test ──get k0 .. k59──> memroute ──policy route──> pool ──one get line per server──> memcached
//! ```
//!
//! Waits are polls of a condition with a deadline (a server's contents, memroute's stats).
use std::time::Duration;

use memroute_tests::*;

/// How long an asynchronous effect (a shadow copy, a warm-up fill) may take to show up.
const ASYNC_DEADLINE: Duration = Duration::from_secs(5);

fn pool(name: &str, servers: &[&Memcached]) -> String {
    let addrs: Vec<String> = servers.iter().map(|s| s.addr()).collect();
    pool_section(name, &addrs, "timeout = \"200ms\"")
}

/// Stores `key` = `{tag}-{key}` on `server` directly, for every key.
fn store_all(server: &Memcached, keys: &[String], tag: &str) {
    let mut c = server.connect();
    let mut batch = Vec::new();
    for k in keys {
        let v = format!("{tag}-{k}");
        batch.extend_from_slice(format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let reply = c.roundtrip_lines(&batch, keys.len());
    assert_eq!(
        reply,
        b"STORED\r\n".repeat(keys.len()),
        "storing on {}",
        server.addr()
    );
}

/// One multi-get of `keys` through `c`: the (key, value) pairs of its reply, in its order.
fn multi_get(c: &mut Conn, keys: &[String]) -> Vec<(String, String)> {
    c.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    let reply = c.read_get_reply();
    parse_values(&reply)
        .unwrap_or_else(|| panic!("not a get reply: {}", show(&reply)))
        .into_iter()
        .map(|(k, _, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

/// memroute over `sections` with root `root`, once it has greeted every server (so the
/// greetings' bytes are read before any test counts `bytes_read`).
fn start_greeted(root: &str, sections: &[String]) -> Memroute {
    let proxy = Memroute::start_routes(root, sections);
    proxy.wait_greeted();
    proxy
}

/// A server's (cmd_get, bytes_read) as its own `stats` reports them, without the bytes of
/// the `stats` requests themselves (each asked on a fresh connection: `stats\r\n`).
struct Counters {
    cmd_get: u64,
    bytes_read: u64,
}

fn counters(server: &Memcached) -> Counters {
    let stats = server.connect().stats();
    let get = |name: &str| stat_u64(&stats, name).unwrap_or_else(|| panic!("no {name}"));
    Counters {
        cmd_get: get("cmd_get"),
        bytes_read: get("bytes_read"),
    }
}

/// What `server` read between `before` and now: (keys asked, bytes of requests), the
/// `stats\r\n` of the later reading subtracted when memcached counted it already.
fn read_since(server: &Memcached, before: &Counters) -> (u64, u64) {
    let after = counters(server);
    // Two readings in a row tell what one `stats` request adds to bytes_read (0 or 7).
    let again = counters(server);
    let per_stats = again.bytes_read - after.bytes_read;
    (
        after.cmd_get - before.cmd_get,
        after.bytes_read - before.bytes_read - per_stats,
    )
}

/// The bytes of `asked` keys sent as `get` lines of at most 100 keys (the default
/// `max_keys_per_request`), against the bytes of one `get` line per key.
fn line_bytes(asked: &[&String]) -> (u64, u64) {
    let keys: u64 = asked.iter().map(|k| k.len() as u64).sum();
    let n = asked.len() as u64;
    let lines = n.div_ceil(100);
    let batched = keys + n.saturating_sub(lines) + lines * "get \r\n".len() as u64;
    let one_per_key = keys + n * "get \r\n".len() as u64;
    (batched, one_per_key)
}

#[test]
fn failover_multiget_answers_every_key_with_a_primary_server_dead_re_asking_only_its_keys() {
    let mut main = [Memcached::start(), Memcached::start()];
    let spare = Memcached::start();
    let proxy = start_greeted(
        "root",
        &[
            pool("main", &[&main[0], &main[1]]),
            pool("spare", &[&spare]),
            "[routes.root]\ntype = \"failover\"\nchildren = [\"main\", \"spare\"]\n\n".to_string(),
        ],
    );
    let keys = numbered_keys("fo", 60);
    // Each main server holds every key (only the ones placed on it are asked of it); the
    // spare holds them under another value, so each answer says where it came from.
    store_all(&main[0], &keys, "main");
    store_all(&main[1], &keys, "main");
    store_all(&spare, &keys, "spare");
    let mut c = proxy.connect();
    // Open memroute's connections first, with every server alive.
    assert_eq!(multi_get(&mut c, &keys).len(), keys.len());

    main[0].kill();
    let before_live = counters(&main[1]);
    let before_spare = counters(&spare);
    let hits_before = stat_u64(&proxy.stats(), "get_hits").unwrap_or(0);
    let got = multi_get(&mut c, &keys);
    assert_eq!(
        stat_u64(&proxy.stats(), "get_hits"),
        Some(hits_before + keys.len() as u64),
        "memroute counts every key's hit"
    );
    let answered: Vec<&String> = got.iter().map(|(k, _)| k).collect();
    assert_eq!(
        answered,
        keys.iter().collect::<Vec<_>>(),
        "every key answered, in the client's order"
    );
    let from_spare: Vec<&String> = got
        .iter()
        .filter(|(k, v)| *v == format!("spare-{k}"))
        .map(|(k, _)| k)
        .collect();
    for (k, v) in &got {
        assert!(
            *v == format!("main-{k}") || *v == format!("spare-{k}"),
            "{k} = {v}"
        );
    }
    let (live_keys, live_bytes) = read_since(&main[1], &before_live);
    let (spare_keys, spare_bytes) = read_since(&spare, &before_spare);
    println!(
        "failover multi-get of {} keys, main server 0 killed: {} keys from the live main \
         server ({live_bytes} request bytes), {} re-asked of the spare ({spare_bytes} bytes)",
        keys.len(),
        live_keys,
        from_spare.len()
    );
    assert!(
        !from_spare.is_empty() && from_spare.len() < keys.len(),
        "the dead server's keys (and only those) come from the spare: {}",
        from_spare.len()
    );
    assert_eq!(
        spare_keys,
        from_spare.len() as u64,
        "the spare is asked only for the keys that failed"
    );
    assert_eq!(live_keys + spare_keys, keys.len() as u64);
    let (batched, one_per_key) = line_bytes(&from_spare);
    assert_eq!(
        spare_bytes, batched,
        "the failed keys reach the spare as one get line ({one_per_key} bytes as one get per key)"
    );
    let live: Vec<&String> = keys.iter().filter(|k| !from_spare.contains(k)).collect();
    assert_eq!(
        live_bytes,
        line_bytes(&live).0,
        "the live server's keys go as one line"
    );
    let stats = proxy.stats();
    assert_eq!(
        stat_u64(&stats, "route:root:failovers"),
        Some(from_spare.len() as u64),
        "failovers count keys moved on: {stats:?}"
    );
}

/// `[routes.NAME]` of type replicated over pools a, b, c.
fn replicated(name: &str, reads: &str) -> String {
    format!(
        "[routes.{name}]\ntype = \"replicated\"\nchildren = [\"a\", \"b\", \"c\"]\nwrites = \"all-sync\"\nreads = \"{reads}\"\n\n"
    )
}

#[test]
fn replicated_multiget_reads_one_replica_per_batch_and_fails_over_as_a_batch() {
    let mut servers = [Memcached::start(), Memcached::start(), Memcached::start()];
    let proxy = start_greeted(
        "root",
        &[
            pool("a", &[&servers[0]]),
            pool("b", &[&servers[1]]),
            pool("c", &[&servers[2]]),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"first:\" = \"first\" }\ndefault = \"fo\"\n\n"
                .to_string(),
            replicated("first", "first"),
            replicated("fo", "failover"),
        ],
    );
    let keys = numbered_keys("rp", 50);
    for (i, server) in servers.iter().enumerate() {
        store_all(server, &keys, &format!("r{i}"));
    }
    let mut c = proxy.connect();
    let before: Vec<Counters> = servers.iter().map(counters).collect();
    let got = multi_get(&mut c, &keys);
    let expected: Vec<(String, String)> = keys
        .iter()
        .map(|k| (k.clone(), format!("r0-{k}")))
        .collect();
    assert_eq!(
        got, expected,
        "reads = failover asks the first replica while it answers"
    );
    let (asked, bytes) = read_since(&servers[0], &before[0]);
    assert_eq!(asked, keys.len() as u64);
    let all: Vec<&String> = keys.iter().collect();
    assert_eq!(bytes, line_bytes(&all).0, "the replica got one get line");
    for i in 1..3 {
        assert_eq!(
            read_since(&servers[i], &before[i]).0,
            0,
            "replica {i} asked"
        );
    }

    // reads = first, through a prefix route in front: the same keys under "first:".
    let prefixed: Vec<String> = keys.iter().map(|k| format!("first:{k}")).collect();
    store_all(&servers[0], &prefixed, "r0");
    assert_eq!(
        multi_get(&mut c, &prefixed),
        prefixed
            .iter()
            .map(|k| (k.clone(), format!("r0-{k}")))
            .collect::<Vec<_>>()
    );

    // The first replica dies: the whole batch fails over to the second, in one line.
    servers[0].kill();
    let before_b = counters(&servers[1]);
    let got = multi_get(&mut c, &keys);
    let expected: Vec<(String, String)> = keys
        .iter()
        .map(|k| (k.clone(), format!("r1-{k}")))
        .collect();
    assert_eq!(
        got, expected,
        "with replica a dead, every key comes from b, in order"
    );
    let (asked, bytes) = read_since(&servers[1], &before_b);
    assert_eq!(asked, keys.len() as u64);
    assert_eq!(
        bytes,
        line_bytes(&all).0,
        "b got the failed batch as one line"
    );
    // reads = first has no fallback: the dead replica fails the multi-get.
    c.send(format!("get {}\r\n", prefixed.join(" ")).as_bytes());
    let reply = c.read_until(b"\r\n");
    assert!(
        reply.starts_with(b"SERVER_ERROR "),
        "reads = first with its replica dead: {}",
        show(&reply)
    );
}

#[test]
fn warm_up_multiget_asks_warm_only_for_cold_misses_and_fills_cold() {
    let cold = Memcached::start();
    let warm = Memcached::start();
    let proxy = start_greeted(
        "root",
        &[
            pool("cold", &[&cold]),
            pool("warm", &[&warm]),
            "[routes.root]\ntype = \"warm-up\"\ncold = \"cold\"\nwarm = \"warm\"\nttl = \"1h\"\n\n"
                .to_string(),
        ],
    );
    let keys = numbered_keys("wu", 60);
    store_all(&warm, &keys, "warm");
    // A third of the keys are in cold already, under cold's own value.
    let in_cold: Vec<String> = keys.iter().step_by(3).cloned().collect();
    store_all(&cold, &in_cold, "cold");
    let mut c = proxy.connect();
    let before_warm = counters(&warm);
    let got = multi_get(&mut c, &keys);
    let expected: Vec<(String, String)> = keys
        .iter()
        .map(|k| match in_cold.contains(k) {
            true => (k.clone(), format!("cold-{k}")),
            false => (k.clone(), format!("warm-{k}")),
        })
        .collect();
    assert_eq!(
        got, expected,
        "cold's hits, then warm's answers for cold's misses, in order"
    );
    let missed: Vec<&String> = keys.iter().filter(|k| !in_cold.contains(k)).collect();
    let (asked, bytes) = read_since(&warm, &before_warm);
    assert_eq!(
        asked,
        missed.len() as u64,
        "warm is asked only for cold's misses"
    );
    assert_eq!(bytes, line_bytes(&missed).0, "as one get line");
    assert!(
        poll_until(ASYNC_DEADLINE, || cold.held(&keys).len() == keys.len()),
        "cold was not filled with warm's values"
    );
    let held = cold.held(&keys);
    for k in &missed {
        assert_eq!(
            held[*k],
            format!("warm-{k}").as_bytes(),
            "{k} filled from warm"
        );
    }
    let stats = proxy.stats();
    assert_eq!(
        stat_u64(&stats, "route:root:fills"),
        Some(missed.len() as u64)
    );
    // Filled: the next multi-get is answered by cold alone.
    let before_warm = counters(&warm);
    assert_eq!(multi_get(&mut c, &keys).len(), keys.len());
    assert_eq!(read_since(&warm, &before_warm).0, 0, "warm asked again");
}

#[test]
fn shadow_multiget_copies_the_keys_in_range_as_batches() {
    let primary = Memcached::start();
    let shadow = Memcached::start();
    let proxy = start_greeted(
        "root",
        &[
            pool("p", &[&primary]),
            pool("s", &[&shadow]),
            "[routes.root]\ntype = \"shadow\"\nprimary = \"p\"\nshadow = \"s\"\nfraction = 0.5\n\n"
                .to_string(),
        ],
    );
    let keys = numbered_keys("sm", 80);
    store_all(&primary, &keys, "p");
    let mut c = proxy.connect();
    let before = counters(&shadow);
    let got = multi_get(&mut c, &keys);
    assert_eq!(
        got,
        keys.iter()
            .map(|k| (k.clone(), format!("p-{k}")))
            .collect::<Vec<_>>(),
        "the primary answers every key, in order"
    );
    let stats = proxy.wait_stats("the shadow copy settled", ASYNC_DEADLINE, |s| {
        match (
            stat_u64(s, "shadow:root:sent"),
            stat_u64(s, "shadow:root:completed"),
        ) {
            (Some(sent), Some(completed)) => sent > 0 && completed == sent,
            _ => false,
        }
    });
    let sent = stat_u64(&stats, "shadow:root:sent").unwrap_or(0);
    let (asked, bytes) = read_since(&shadow, &before);
    println!(
        "shadow multi-get: {sent} of {} keys copied, {bytes} request bytes",
        keys.len()
    );
    assert!(
        sent > 0 && sent < keys.len() as u64,
        "fraction 0.5 copied {sent} of {} keys",
        keys.len()
    );
    assert_eq!(asked, sent, "the shadow is asked for the keys in its range");
    // Which keys: the ones a set through memroute copies to the shadow (the same
    // key-hash range), once those copies settled.
    let mut setter = proxy.connect();
    for k in &keys {
        setter.set(k, format!("p-{k}").as_bytes());
    }
    // Every set is answered, so every copy is counted in `sent` already.
    let stats = proxy.wait_stats("the sets' shadow copies settled", ASYNC_DEADLINE, |s| {
        stat_u64(s, "shadow:root:sent") == stat_u64(s, "shadow:root:completed")
    });
    assert_eq!(
        stat_u64(&stats, "shadow:root:sent"),
        Some(2 * sent),
        "the sets copied as many keys as the multi-get"
    );
    let held = shadow.held(&keys);
    let in_range: Vec<&String> = keys.iter().filter(|k| held.contains_key(*k)).collect();
    assert_eq!(
        in_range.len() as u64,
        sent,
        "sets copy the same number of keys"
    );
    assert_eq!(
        bytes,
        line_bytes(&in_range).0,
        "the copy went as one get line"
    );
}

#[test]
fn a_multiget_mixing_plain_pool_and_policy_keys_merges_in_client_order() {
    let plain = Memcached::start();
    let a = Memcached::start();
    let b = Memcached::start();
    let proxy = start_greeted(
        "root",
        &[
            pool("plain", &[&plain]),
            pool("a", &[&a]),
            pool("b", &[&b]),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"fo:\" = \"fo\" }\ndefault = \"plain\"\n\n"
                .to_string(),
            "[routes.fo]\ntype = \"failover\"\nchildren = [\"a\", \"b\"]\non = \"error-or-miss\"\n\n"
                .to_string(),
        ],
    );
    // Interleaved: plain, fo:, plain, fo: ...; odd fo: keys only in b (a misses them).
    let keys: Vec<String> = (0..60)
        .map(|i| match i % 2 {
            0 => format!("pl{i}"),
            _ => format!("fo:{i}"),
        })
        .collect();
    let plain_keys: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with("pl"))
        .cloned()
        .collect();
    let fo_keys: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with("fo:"))
        .cloned()
        .collect();
    let in_a: Vec<String> = fo_keys.iter().step_by(2).cloned().collect();
    let in_b: Vec<String> = fo_keys.iter().skip(1).step_by(2).cloned().collect();
    store_all(&plain, &plain_keys, "plain");
    store_all(&a, &in_a, "a");
    store_all(&b, &in_b, "b");
    // One key nobody holds: a miss, left out of the reply.
    let mut asked = keys.clone();
    asked.insert(7, "fo:nowhere".to_string());
    let mut c = proxy.connect();
    let before_b = counters(&b);
    let misses_before = stat_u64(&proxy.stats(), "get_misses").unwrap_or(0);
    let got = multi_get(&mut c, &asked);
    assert_eq!(
        stat_u64(&proxy.stats(), "get_misses"),
        Some(misses_before + 1),
        "memroute counts the one miss"
    );
    let expected: Vec<(String, String)> = keys
        .iter()
        .map(|k| {
            let tag = match () {
                _ if plain_keys.contains(k) => "plain",
                _ if in_a.contains(k) => "a",
                _ => "b",
            };
            (k.clone(), format!("{tag}-{k}"))
        })
        .collect();
    assert_eq!(
        got, expected,
        "hits in the client's order, the miss left out"
    );
    let (b_keys, _) = read_since(&b, &before_b);
    assert_eq!(
        b_keys,
        in_b.len() as u64 + 1,
        "b is asked only for a's misses (error-or-miss)"
    );
}

/// Interleaves the keys of several routes (`a0 b0 c0 a1 b1 c1 ...`): a multi-get whose
/// keys part ways at a prefix route on every key.
fn interleave(lists: &[&[String]]) -> Vec<String> {
    let longest = lists.iter().map(|l| l.len()).max().unwrap_or(0);
    (0..longest)
        .flat_map(|i| lists.iter().filter_map(move |l| l.get(i).cloned()))
        .collect()
}

#[test]
fn prefix_routed_failover_multiget_with_its_first_server_dead_moves_only_its_keys() {
    let mut main = [Memcached::start(), Memcached::start()];
    let spare = Memcached::start();
    let plain = Memcached::start();
    let proxy = start_greeted(
        "root",
        &[
            pool("main", &[&main[0], &main[1]]),
            pool("spare", &[&spare]),
            pool("plain", &[&plain]),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"fo:\" = \"fo\", \"main:\" = \"main\" }\ndefault = \"plain\"\n\n"
                .to_string(),
            "[routes.fo]\ntype = \"failover\"\nchildren = [\"main\", \"spare\"]\n\n".to_string(),
        ],
    );
    let fo_keys = numbered_keys("fo:", 40);
    let plain_keys = numbered_keys("pl", 40);
    store_all(&main[0], &fo_keys, "main");
    store_all(&main[1], &fo_keys, "main");
    store_all(&spare, &fo_keys, "spare");
    store_all(&plain, &plain_keys, "plain");
    // A key nobody holds, in the middle: a miss, left out of the reply.
    let mut keys = interleave(&[&plain_keys, &fo_keys]);
    keys.insert(11, "fo:nowhere".to_string());
    let mut c = proxy.connect();
    let got = multi_get(&mut c, &keys);
    assert_eq!(
        got.len(),
        keys.len() - 1,
        "every server alive: every key but one hits"
    );

    main[0].kill();
    let before_spare = counters(&spare);
    let stats = proxy.stats();
    let hits_before = stat_u64(&stats, "get_hits").unwrap_or(0);
    let misses_before = stat_u64(&stats, "get_misses").unwrap_or(0);
    let got = multi_get(&mut c, &keys);
    let answered: Vec<&String> = got.iter().map(|(k, _)| k).collect();
    let expected: Vec<&String> = keys.iter().filter(|k| *k != "fo:nowhere").collect();
    assert_eq!(
        answered, expected,
        "every held key answered, in the client's order"
    );
    let from_spare: Vec<&String> = got
        .iter()
        .filter(|(k, v)| *v == format!("spare-{k}"))
        .map(|(k, _)| k)
        .collect();
    for (k, v) in &got {
        let tag = match k.starts_with("fo:") {
            true if from_spare.contains(&k) => "spare",
            true => "main",
            false => "plain",
        };
        assert_eq!(*v, format!("{tag}-{k}"));
    }
    assert!(
        !from_spare.is_empty() && from_spare.len() < fo_keys.len(),
        "the dead server's keys (and only those) come from the spare: {}",
        from_spare.len()
    );
    let (spare_keys, spare_bytes) = read_since(&spare, &before_spare);
    // The spare may also be asked for fo:nowhere, when the dead server owns it.
    let nowhere_moved = spare_keys - from_spare.len() as u64;
    assert!(
        nowhere_moved <= 1,
        "the spare was asked for {spare_keys} keys"
    );
    let mut asked = from_spare.clone();
    let nowhere = "fo:nowhere".to_string();
    if nowhere_moved == 1 {
        let at = keys.iter().position(|k| *k == nowhere).unwrap_or(0);
        let before = keys[..at].iter().filter(|k| asked.contains(k)).count();
        asked.insert(before, &nowhere);
    }
    assert_eq!(
        spare_bytes,
        line_bytes(&asked).0,
        "the failed keys reach the spare as one get line"
    );
    let stats = proxy.stats();
    assert_eq!(
        stat_u64(&stats, "route:fo:failovers"),
        Some(spare_keys),
        "failovers count the keys moved on: {stats:?}"
    );
    assert_eq!(
        stat_u64(&stats, "get_hits"),
        Some(hits_before + got.len() as u64)
    );
    assert_eq!(stat_u64(&stats, "get_misses"), Some(misses_before + 1));

    // The same pool reached as a plain pool ("main:"): its dead server fails the multi-get
    // (a partial answer would look like misses), even with failover keys in its batch.
    let direct = numbered_keys("main:", 30);
    let mixed = interleave(&[&direct, &fo_keys]);
    c.send(format!("get {}\r\n", mixed.join(" ")).as_bytes());
    let reply = c.read_until(b"\r\n");
    assert!(
        reply.starts_with(b"SERVER_ERROR "),
        "a plain pool's dead server in a mixed multi-get: {}",
        show(&reply)
    );
    // The connection goes on, and the failover keys alone are answered.
    let got = multi_get(&mut c, &fo_keys);
    assert_eq!(
        got.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        fo_keys.iter().collect::<Vec<_>>()
    );
}

#[test]
fn prefix_routed_warm_up_multiget_asks_warm_only_for_its_own_misses_and_fills_cold() {
    let cold = Memcached::start();
    let mut warm = Memcached::start();
    let proxy = start_greeted(
        "root",
        &[
            pool("cold", &[&cold]),
            pool("warm", &[&warm]),
            // Plain keys go to the cold pool directly: the same server, the same batches.
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"wu:\" = \"wu\" }\ndefault = \"cold\"\n\n"
                .to_string(),
            "[routes.wu]\ntype = \"warm-up\"\ncold = \"cold\"\nwarm = \"warm\"\nttl = \"1h\"\n\n"
                .to_string(),
        ],
    );
    let wu_keys = numbered_keys("wu:", 45);
    let plain_keys = numbered_keys("pl", 45);
    // Warm holds every key (a plain key asked of warm would show up as a hit).
    store_all(&warm, &wu_keys, "warm");
    store_all(&warm, &plain_keys, "warm");
    // Cold holds a third of the warm-up keys and half of the plain ones.
    let wu_in_cold: Vec<String> = wu_keys.iter().step_by(3).cloned().collect();
    let plain_in_cold: Vec<String> = plain_keys.iter().step_by(2).cloned().collect();
    store_all(&cold, &wu_in_cold, "cold");
    store_all(&cold, &plain_in_cold, "cold");
    let mut keys = interleave(&[&plain_keys, &wu_keys]);
    keys.insert(20, "wu:nowhere".to_string());
    let mut c = proxy.connect();
    let before_warm = counters(&warm);
    let before_cold = counters(&cold);
    let stats = proxy.stats();
    let hits_before = stat_u64(&stats, "get_hits").unwrap_or(0);
    let misses_before = stat_u64(&stats, "get_misses").unwrap_or(0);
    let got = multi_get(&mut c, &keys);
    let expected: Vec<(String, String)> = keys
        .iter()
        .filter_map(|k| {
            let tag = match () {
                _ if wu_in_cold.contains(k) || plain_in_cold.contains(k) => "cold",
                _ if wu_keys.contains(k) => "warm",
                _ => return None,
            };
            Some((k.clone(), format!("{tag}-{k}")))
        })
        .collect();
    assert_eq!(
        got, expected,
        "cold's hits, warm's answers for the warm-up keys cold missed, in the client's order"
    );
    let wu_missed: Vec<&String> = keys
        .iter()
        .filter(|k| k.starts_with("wu:") && !wu_in_cold.contains(k))
        .collect();
    let (warm_keys, warm_bytes) = read_since(&warm, &before_warm);
    assert_eq!(
        warm_keys,
        wu_missed.len() as u64,
        "warm is asked only for the warm-up keys cold missed (wu:nowhere included)"
    );
    assert_eq!(warm_bytes, line_bytes(&wu_missed).0, "as one get line");
    let filled: Vec<String> = wu_missed
        .iter()
        .filter(|k| **k != "wu:nowhere")
        .map(|k| k.to_string())
        .collect();
    // Watched by cold's item count: asking cold with gets would count in its cmd_get.
    let items = (wu_in_cold.len() + plain_in_cold.len() + filled.len()) as u64;
    let mut polls = 0;
    assert!(
        poll_until(ASYNC_DEADLINE, || {
            polls += 1;
            cold.stat("curr_items") == items
        }),
        "cold was not filled with warm's values"
    );
    // The multi-get's line and the fills' adds, nothing else (each poll's `stats\r\n`
    // taken out as `read_since` takes out its own).
    let (cold_keys, cold_bytes) = read_since(&cold, &before_cold);
    let per_stats = {
        let first = counters(&cold).bytes_read;
        counters(&cold).bytes_read - first
    };
    let cold_bytes = cold_bytes - polls * per_stats;
    assert_eq!(
        cold_keys,
        keys.len() as u64,
        "cold is asked for every key once"
    );
    let all: Vec<&String> = keys.iter().collect();
    let fill_bytes: u64 = filled
        .iter()
        .map(|k| {
            let value = format!("warm-{k}");
            format!("add {k} 0 3600 {}\r\n{value}\r\n", value.len()).len() as u64
        })
        .sum();
    assert_eq!(
        cold_bytes,
        line_bytes(&all).0 + fill_bytes,
        "plain and warm-up keys share one get line to cold (then the fills)"
    );
    let held = cold.held(&filled);
    for k in &filled {
        assert_eq!(
            held[k],
            format!("warm-{k}").as_bytes(),
            "{k} filled from warm"
        );
    }
    let stats = proxy.stats();
    assert_eq!(
        stat_u64(&stats, "route:wu:fills"),
        Some(filled.len() as u64)
    );
    assert_eq!(
        stat_u64(&stats, "get_hits"),
        Some(hits_before + got.len() as u64)
    );
    assert_eq!(
        stat_u64(&stats, "get_misses"),
        Some(misses_before + (keys.len() - got.len()) as u64)
    );
    let plain_missing: Vec<String> = plain_keys
        .iter()
        .filter(|k| !plain_in_cold.contains(k))
        .cloned()
        .collect();
    assert!(
        cold.held(&plain_missing).is_empty(),
        "a plain key's miss is never filled"
    );

    // Warm gone: a warm-up key cold misses is a miss (cold's answer), not an error.
    warm.kill();
    let fresh = numbered_keys("wu:fresh", 10);
    let mut asked = interleave(&[&fresh, &wu_keys[..10]]);
    asked.push(plain_keys[0].clone());
    let got = multi_get(&mut c, &asked);
    let expected: Vec<(String, String)> = asked
        .iter()
        .filter(|k| !fresh.contains(k))
        .map(|k| {
            let tag = match wu_in_cold.contains(k) || plain_in_cold.contains(k) {
                true => "cold",
                false => "warm",
            };
            (k.clone(), format!("{tag}-{k}"))
        })
        .collect();
    assert_eq!(
        got, expected,
        "cold's hits (and fills), warm's failure a miss"
    );
}

#[test]
fn prefix_routed_shadow_and_random_multigets_answer_from_the_primary_and_one_random_child() {
    let primary = Memcached::start();
    let mut shadow = Memcached::start();
    let r = [Memcached::start(), Memcached::start()];
    let plain = Memcached::start();
    let proxy = start_greeted(
        "root",
        &[
            pool("p", &[&primary]),
            pool("s", &[&shadow]),
            pool("r1", &[&r[0]]),
            pool("r2", &[&r[1]]),
            pool("plain", &[&plain]),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"sh:\" = \"sh\", \"rnd:\" = \"rnd\" }\ndefault = \"plain\"\n\n"
                .to_string(),
            "[routes.sh]\ntype = \"shadow\"\nprimary = \"p\"\nshadow = \"s\"\nfraction = 0.5\n\n"
                .to_string(),
            "[routes.rnd]\ntype = \"random\"\nchildren = [\"r1\", \"r2\"]\n\n".to_string(),
        ],
    );
    let sh_keys = numbered_keys("sh:", 40);
    let rnd_keys = numbered_keys("rnd:", 40);
    let plain_keys = numbered_keys("pl", 40);
    store_all(&primary, &sh_keys, "p");
    store_all(&r[0], &rnd_keys, "r1");
    store_all(&r[1], &rnd_keys, "r2");
    store_all(&plain, &plain_keys, "plain");
    let keys = interleave(&[&sh_keys, &rnd_keys, &plain_keys]);
    let mut c = proxy.connect();
    let before = counters(&shadow);
    let got = multi_get(&mut c, &keys);
    let answered: Vec<&String> = got.iter().map(|(k, _)| k).collect();
    assert_eq!(
        answered,
        keys.iter().collect::<Vec<_>>(),
        "every key answered, in the client's order"
    );
    let random_tag = |got: &[(String, String)]| -> Vec<String> {
        let mut tags: Vec<String> = got
            .iter()
            .filter(|(k, _)| k.starts_with("rnd:"))
            .map(|(k, v)| v.strip_suffix(&format!("-{k}")).unwrap_or(v).to_string())
            .collect();
        tags.dedup();
        tags
    };
    assert_eq!(
        random_tag(&got).len(),
        1,
        "a multi-get's random keys all go to one child: {got:?}"
    );
    for (k, v) in got.iter().filter(|(k, _)| !k.starts_with("rnd:")) {
        let tag = match k.starts_with("sh:") {
            true => "p",
            false => "plain",
        };
        assert_eq!(*v, format!("{tag}-{k}"));
    }
    let stats = proxy.wait_stats("the shadow copy settled", ASYNC_DEADLINE, |s| {
        match (
            stat_u64(s, "shadow:sh:sent"),
            stat_u64(s, "shadow:sh:completed"),
        ) {
            (Some(sent), Some(completed)) => sent > 0 && completed == sent,
            _ => false,
        }
    });
    let sent = stat_u64(&stats, "shadow:sh:sent").unwrap_or(0);
    assert!(
        sent > 0 && sent < sh_keys.len() as u64,
        "fraction 0.5 copied {sent} of {} keys",
        sh_keys.len()
    );
    let (asked, bytes) = read_since(&shadow, &before);
    assert_eq!(
        asked, sent,
        "the shadow is asked for the keys in its range only"
    );
    // Which keys: the ones a set through memroute copies (the same key-hash range).
    let mut setter = proxy.connect();
    for k in &sh_keys {
        setter.set(k, format!("p-{k}").as_bytes());
    }
    proxy.wait_stats("the sets' shadow copies settled", ASYNC_DEADLINE, |s| {
        stat_u64(s, "shadow:sh:sent") == stat_u64(s, "shadow:sh:completed")
    });
    let held = shadow.held(&sh_keys);
    let in_range: Vec<&String> = sh_keys.iter().filter(|k| held.contains_key(*k)).collect();
    assert_eq!(in_range.len() as u64, sent, "sets copy the same keys");
    assert_eq!(
        bytes,
        line_bytes(&in_range).0,
        "the copy went as one get line"
    );

    // Random picks spread over multi-gets (one pick each): both children answer in time.
    let mut seen: Vec<String> = Vec::new();
    for _ in 0..64 {
        for tag in random_tag(&multi_get(&mut c, &rnd_keys[..10])) {
            if !seen.contains(&tag) {
                seen.push(tag);
            }
        }
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen.len(), 2, "random multi-gets reached {seen:?} only");

    // A dead shadow never fails or changes the client's reply.
    shadow.kill();
    let got = multi_get(&mut c, &sh_keys);
    assert_eq!(
        got,
        sh_keys
            .iter()
            .map(|k| (k.clone(), format!("p-{k}")))
            .collect::<Vec<_>>()
    );
    proxy.wait_stats(
        "the dead shadow's copy counted as an error",
        ASYNC_DEADLINE,
        |s| stat_u64(s, "shadow:sh:errors").unwrap_or(0) > 0,
    );
}

#[test]
fn error_or_miss_failover_multiget_keeps_a_first_miss_over_a_later_error() {
    let a = Memcached::start();
    let mut b = Memcached::start();
    let proxy = start_greeted(
        "root",
        &[
            pool("a", &[&a]),
            pool("b", &[&b]),
            "[routes.root]\ntype = \"failover\"\nchildren = [\"a\", \"b\"]\non = \"error-or-miss\"\n\n"
                .to_string(),
        ],
    );
    let keys = numbered_keys("em", 30);
    let in_a: Vec<String> = keys.iter().step_by(2).cloned().collect();
    let in_b: Vec<String> = keys.iter().skip(1).step_by(4).cloned().collect();
    store_all(&a, &in_a, "a");
    store_all(&b, &in_b, "b");
    let mut c = proxy.connect();
    let before_b = counters(&b);
    let got = multi_get(&mut c, &keys);
    let expected: Vec<(String, String)> = keys
        .iter()
        .filter_map(|k| match () {
            _ if in_a.contains(k) => Some((k.clone(), format!("a-{k}"))),
            _ if in_b.contains(k) => Some((k.clone(), format!("b-{k}"))),
            _ => None,
        })
        .collect();
    assert_eq!(got, expected, "a's hits, then b's for a's misses, in order");
    let (b_keys, b_bytes) = read_since(&b, &before_b);
    let missed: Vec<&String> = keys.iter().filter(|k| !in_a.contains(k)).collect();
    assert_eq!(
        b_keys,
        missed.len() as u64,
        "b is asked only for a's misses"
    );
    assert_eq!(b_bytes, line_bytes(&missed).0, "as one get line");
    assert_eq!(
        stat_u64(&proxy.stats(), "route:root:failovers"),
        Some(missed.len() as u64)
    );

    // b dead: a's misses stay misses (a miss from an earlier child beats a later error).
    b.kill();
    let got = multi_get(&mut c, &keys);
    let expected: Vec<(String, String)> =
        in_a.iter().map(|k| (k.clone(), format!("a-{k}"))).collect();
    assert_eq!(got, expected, "a's hits only, no error");
}

/// A random route over a pool and a route that is not a pool (here an error route) picks
/// each child half the time, for single-key gets and multi-gets alike: the fast path must
/// not draw, find a non-pool child, and leave the executor to draw again (which gave the
/// pool 3/4 of the requests).
#[test]
fn random_route_over_a_pool_and_a_route_picks_each_child_evenly() {
    let server = Memcached::start();
    let proxy = start_greeted(
        "rnd",
        &[
            pool("p", &[&server]),
            "[routes.err]\ntype = \"error\"\nmessage = \"picked the error child\"\n\n".to_string(),
            "[routes.rnd]\ntype = \"random\"\nchildren = [\"p\", \"err\"]\n\n".to_string(),
        ],
    );
    let keys = numbered_keys("even:", 2);
    store_all(&server, &keys, "p");
    let mut c = proxy.connect();
    // 400 draws of a fair coin: the error child's share is 0.5 +- 0.025 (one standard
    // deviation); 0.35-0.65 is six of them either way, while the biased draw gave 0.25.
    const DRAWS: usize = 400;
    for (what, request) in [
        ("single-key gets", format!("get {}\r\n", keys[0])),
        ("multi-gets", format!("get {}\r\n", keys.join(" "))),
    ] {
        let share = error_share(&mut c, request.as_bytes(), DRAWS, "picked the error child");
        assert!(
            (0.35..=0.65).contains(&share),
            "{what}: the error child's share of {DRAWS} draws was {share:.2}, not about half"
        );
    }
}

/// A multi-get whose reply is already decided as an error (a plain pool's key in a batch
/// to a dead server: nowhere else to ask it) sends nothing on: neither the failover keys
/// of that dead server to the failover's spare nor the warm-up keys cold missed to warm.
/// Their backend work would be wasted. Read from the servers' own `cmd_get`; the same
/// keys without the plain pool's then do go on (so the first reading is not vacuous).
#[test]
fn a_multiget_failed_by_a_plain_pool_sends_no_failover_or_warm_up_follow_ups() {
    let mut main = [Memcached::start(), Memcached::start()];
    let spare = Memcached::start();
    let cold = Memcached::start();
    let warm = Memcached::start();
    let proxy = start_greeted(
        "root",
        &[
            pool("main", &[&main[0], &main[1]]),
            pool("spare", &[&spare]),
            pool("cold", &[&cold]),
            pool("warm", &[&warm]),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"fo:\" = \"fo\", \"wu:\" = \"wu\" }\ndefault = \"main\"\n\n"
                .to_string(),
            "[routes.fo]\ntype = \"failover\"\nchildren = [\"main\", \"spare\"]\n\n".to_string(),
            "[routes.wu]\ntype = \"warm-up\"\ncold = \"cold\"\nwarm = \"warm\"\nttl = \"1h\"\n\n"
                .to_string(),
        ],
    );
    let direct = numbered_keys("main:", 30);
    let fo_keys = numbered_keys("fo:", 30);
    let wu_keys = numbered_keys("wu:", 30);
    store_all(&spare, &fo_keys, "spare");
    // Cold holds none of the warm-up keys: every one is a miss that would go to warm.
    store_all(&warm, &wu_keys, "warm");
    let mut c = proxy.connect();
    // Open memroute's connections first, with every server alive.
    assert_eq!(multi_get(&mut c, &direct).len(), 0);

    main[0].kill();
    let (before_spare, before_warm) = (counters(&spare), counters(&warm));
    let mixed = interleave(&[&direct, &fo_keys, &wu_keys]);
    c.send(format!("get {}\r\n", mixed.join(" ")).as_bytes());
    let reply = c.read_until(b"\r\n");
    assert!(
        reply.starts_with(b"SERVER_ERROR "),
        "a plain pool's dead server fails the multi-get: {}",
        show(&reply)
    );
    // The reply was written once the entry was complete: a follow-up, had one started,
    // would have been answered (so counted by its server) before it.
    assert_eq!(
        read_since(&spare, &before_spare).0,
        0,
        "the failover's spare asked for keys of a multi-get that had failed"
    );
    assert_eq!(
        read_since(&warm, &before_warm).0,
        0,
        "warm asked for the misses of a multi-get that had failed"
    );

    // Without the plain pool's keys the same keys go on: the dead server's failover keys
    // to the spare, the warm-up's misses to warm.
    let (before_spare, before_warm) = (counters(&spare), counters(&warm));
    let got = multi_get(&mut c, &interleave(&[&fo_keys, &wu_keys]));
    let (spare_asked, warm_asked) = (
        read_since(&spare, &before_spare).0,
        read_since(&warm, &before_warm).0,
    );
    assert!(
        spare_asked > 0 && spare_asked < fo_keys.len() as u64,
        "the dead server's failover keys go to the spare: {spare_asked}"
    );
    assert_eq!(warm_asked, wu_keys.len() as u64, "cold's misses go to warm");
    let from_spare = got.iter().filter(|(k, _)| k.starts_with("fo:")).count();
    assert_eq!(from_spare as u64, spare_asked, "the spare answered them");
    let from_warm = got.iter().filter(|(k, _)| k.starts_with("wu:")).count();
    assert_eq!(from_warm, wu_keys.len(), "warm answered them");
}
