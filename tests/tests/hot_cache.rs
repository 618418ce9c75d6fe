//! The hot-key cache (`hot_cache`): gets of a key the sketch names hot are answered from
//! a copy at most `ttl` old. Checked against a real memcached's own counts (`cmd_get`)
//! and values: a copy made stale on purpose (a set straight to memcached, with a `ttl`
//! far longer than the test) shows the cache is in use; a write, delete, touch or
//! flush_all through memroute must drop it at once.
use std::time::{Duration, Instant};

use memroute_tests::*;

/// Every sampled key counts (`hot_keys_sample = 1`), so a key is hot from its second get.
fn admin_lines() -> String {
    format!(
        "\n[admin]\nlisten = \"127.0.0.1:{}\"\nhot_keys_sample = 1\n",
        free_port()
    )
}

fn server_gets(mc: &Memcached) -> u64 {
    stat_u64(&mc.connect().stats(), "cmd_get").unwrap_or(0)
}

fn hits(proxy: &Memroute) -> u64 {
    stat_u64(&proxy.connect().stats(), "pool:main:hot_cache_hits").unwrap_or(0)
}

/// memcached with `hot` = `v1`, and memroute (`workers`) in front with `hot_cache` of
/// `ttl` (none when `None`).
fn setup(ttl: Option<&str>, workers: usize) -> (Memcached, Memroute) {
    let mc = Memcached::start();
    mc.connect().set("hot", b"v1");
    let cache = match ttl {
        Some(ttl) => format!("hot_cache = {{ ttl = \"{ttl}\", keys = 8 }}\n"),
        None => String::new(),
    };
    let listen = format!("127.0.0.1:{}", free_port());
    // Not the default 250ms: on a loaded machine a storm's pipelined sets must not time out.
    let pool = format!("{cache}timeout = \"5s\"\n{}", admin_lines());
    let toml = simple_config(&listen, &[mc.addr()], &pool)
        .replace("workers = 1", &format!("workers = {workers}"));
    (mc, Memroute::start(&toml))
}

/// Gets `hot` through `conn` until one is answered from the cache (the stat moves).
fn make_hot(proxy: &Memroute, conn: &mut Conn, value: &[u8]) {
    let before = hits(proxy);
    let cached = poll_until(Duration::from_secs(10), || {
        assert_eq!(conn.get("hot").as_deref(), Some(value));
        hits(proxy) > before
    });
    assert!(cached, "no get of the hot key was answered from the cache");
}

#[test]
fn a_burst_of_gets_costs_memcached_about_one_get_per_ttl() {
    const TTL: Duration = Duration::from_millis(1000);
    let (mc, proxy) = setup(Some("1s"), 1);
    let mut client = proxy.connect();
    let before = server_gets(&mc);
    let started = Instant::now();
    const GETS: u64 = 2000;
    for _ in 0..GETS {
        assert_eq!(client.get("hot").as_deref(), Some(&b"v1"[..]));
    }
    let elapsed = started.elapsed();
    let sent = server_gets(&mc) - before;
    // Two gets before the key is hot and its copy filled, then one per ttl begun.
    let allowed = 2 + elapsed.as_millis() as u64 / TTL.as_millis() as u64 + 1;
    assert!(
        sent <= allowed,
        "memcached saw {sent} gets of {GETS} in {elapsed:?} (at most {allowed} expected)"
    );
    let stats = proxy.connect().stats();
    let hits =
        stat_u64(&stats, "pool:main:hot_cache_hits").expect("pool:main:hot_cache_hits in stats");
    let misses = stat_u64(&stats, "pool:main:hot_cache_misses")
        .expect("pool:main:hot_cache_misses in stats");
    assert_eq!(hits + misses, GETS, "every get is a hit or a miss");
    assert_eq!(
        misses, sent,
        "every miss, and only a miss, went to memcached"
    );
    let bytes =
        stat_u64(&stats, "pool:main:hot_cache_bytes").expect("pool:main:hot_cache_bytes in stats");
    assert_eq!(bytes, b"VALUE hot 0 2\r\nv1\r\nEND\r\n".len() as u64);
}

/// The storm of the hot-key bench in small: readers on several connections hammer the hot key
/// while writers set thousands of other keys through the same memroute, pipelined. The
/// copy is refilled once per `ttl` (its age counts from when its fill was sent, so fills
/// are at least `ttl` apart), the readers that miss at expiry join that one fill, and a
/// write of another key must not drop the copy: memcached sees at most one get of the
/// hot key per `ttl` of the span, plus one.
#[test]
fn a_storm_with_writes_of_other_keys_costs_memcached_one_get_per_ttl() {
    const TTL: Duration = Duration::from_millis(1000);
    const SPAN: Duration = Duration::from_millis(4500);
    const READERS: usize = 8;
    const WRITERS: usize = 2;
    // More keys than the hot cache's 4096 write slots: every slot is written, the hot
    // key's too, several times a second.
    const OTHER_KEYS: usize = 8192;
    let (mc, proxy) = setup(Some("1s"), 1);
    make_hot(&proxy, &mut proxy.connect(), b"v1");
    let readers: Vec<Conn> = (0..READERS).map(|_| proxy.connect()).collect();
    let writers: Vec<Conn> = (0..WRITERS).map(|_| proxy.connect()).collect();
    let hits_before = hits(&proxy);
    let before = server_gets(&mc);
    let started = Instant::now();
    let deadline = started + SPAN;
    let readers: Vec<_> = readers
        .into_iter()
        .map(|mut conn| {
            std::thread::spawn(move || {
                let mut gets = 0u64;
                while Instant::now() < deadline {
                    assert_eq!(conn.get("hot").as_deref(), Some(&b"v1"[..]));
                    gets += 1;
                }
                gets
            })
        })
        .collect();
    let writers: Vec<_> = writers
        .into_iter()
        .enumerate()
        .map(|(w, mut conn)| {
            std::thread::spawn(move || {
                let keys: Vec<String> = (0..OTHER_KEYS)
                    .filter(|i| i % WRITERS == w)
                    .map(|i| format!("other:{i}"))
                    .collect();
                let mut sets = 0u64;
                while Instant::now() < deadline {
                    conn.set_many(&keys, |_| "x".to_string());
                    sets += keys.len() as u64;
                }
                sets
            })
        })
        .collect();
    let gets: u64 = readers.into_iter().map(|r| r.join().expect("reader")).sum();
    let sets: u64 = writers.into_iter().map(|w| w.join().expect("writer")).sum();
    let sent = server_gets(&mc) - before;
    let span = started.elapsed();
    // Fills at least `ttl` apart, every one inside the span.
    let allowed = span.as_millis() as u64 / TTL.as_millis() as u64 + 1;
    assert!(
        sent <= allowed,
        "memcached saw {sent} gets of the hot key in {span:?} (at most {allowed}: one per \
         ttl begun); the readers sent {gets}, the writers {sets} sets of other keys"
    );
    assert!(
        sets >= OTHER_KEYS as u64,
        "every other key was written: {sets} sets"
    );
    assert!(gets >= 1000, "a storm: the readers sent {gets} gets");
    // A reader misses at most once per fill (it joins the fill, then finds the copy).
    let answered = hits(&proxy) - hits_before;
    assert!(
        answered >= gets.saturating_sub(sent * READERS as u64),
        "{answered} of the readers' {gets} gets were answered from the copy ({sent} fills)"
    );
}

#[test]
fn a_set_through_memroute_is_read_back_at_once_from_every_connection() {
    // Two workers: a set on one must drop the other's copy too. A copy would otherwise
    // live a minute.
    let (_mc, proxy) = setup(Some("60s"), 2);
    let mut clients: Vec<Conn> = (0..8).map(|_| proxy.connect()).collect();
    for client in &mut clients {
        make_hot(&proxy, client, b"v1");
    }
    for round in 0..40 {
        let value = format!("round{round}");
        let writer = round % clients.len();
        clients[writer].set("hot", value.as_bytes());
        for (i, client) in clients.iter_mut().enumerate() {
            assert_eq!(
                client.get("hot").as_deref(),
                Some(value.as_bytes()),
                "round {round}: client {i} read a stale copy after client {writer}'s set"
            );
        }
    }
    assert!(hits(&proxy) > 40, "the copies were used between the sets");
}

/// Makes the cached copy of `hot` stale (set straight to memcached), checks memroute
/// still serves it, sends `request` through memroute, and returns the next get's value.
fn stale_then(request: &[u8], expect_reply: &[u8]) -> Option<Vec<u8>> {
    let (mc, proxy) = setup(Some("60s"), 1);
    let mut client = proxy.connect();
    make_hot(&proxy, &mut client, b"v1");
    mc.connect().set("hot", b"v2");
    assert_eq!(
        client.get("hot").as_deref(),
        Some(&b"v1"[..]),
        "the copy, 60s ttl, is served"
    );
    let mut other = proxy.connect();
    assert_eq!(other.roundtrip_line(request), expect_reply);
    client.get("hot")
}

#[test]
fn delete_touch_and_flush_through_memroute_drop_the_copy() {
    assert_eq!(stale_then(b"delete hot\r\n", b"DELETED\r\n"), None);
    assert_eq!(
        stale_then(b"touch hot 0\r\n", b"TOUCHED\r\n").as_deref(),
        Some(&b"v2"[..])
    );
    assert_eq!(stale_then(b"flush_all\r\n", b"OK\r\n"), None);
    assert_eq!(
        stale_then(
            b"incr hot 1\r\n",
            b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
        )
        .as_deref(),
        Some(&b"v2"[..]),
        "even a failed write drops it"
    );
}

#[test]
fn a_set_straight_to_memcached_is_seen_within_ttl() {
    const TTL: Duration = Duration::from_millis(300);
    // Generous: a loaded machine delays the polls, not the bound.
    const MARGIN: Duration = Duration::from_secs(3);
    let (mc, proxy) = setup(Some("300ms"), 1);
    let mut client = proxy.connect();
    for round in 0..5 {
        let old = format!("old{round}");
        let new = format!("new{round}");
        mc.connect().set("hot", old.as_bytes());
        // The old value through memroute (the previous round's copy expires first).
        assert!(poll_until(TTL + MARGIN, || client.get("hot").as_deref()
            == Some(old.as_bytes())));
        make_hot(&proxy, &mut client, old.as_bytes());
        mc.connect().set("hot", new.as_bytes());
        let set_at = Instant::now();
        let seen = poll_until(TTL + MARGIN, || {
            client.get("hot").as_deref() == Some(new.as_bytes())
        });
        assert!(
            seen,
            "round {round}: the new value was not seen {:?} after the set",
            TTL + MARGIN
        );
        let took = set_at.elapsed();
        for _ in 0..20 {
            assert_eq!(
                client.get("hot").as_deref(),
                Some(new.as_bytes()),
                "round {round}: the old value came back ({took:?} after the set)"
            );
        }
    }
}

#[test]
fn replies_are_per_request_bytes_opaques_included() {
    let (_mc, proxy) = setup(Some("60s"), 1);
    let mut client = proxy.connect();
    make_hot(&proxy, &mut client, b"v1");
    for _ in 0..5 {
        assert_eq!(client.roundtrip_line(b"mg hot v O1\r\n"), b"VA 2 O1\r\n");
        client.read_line();
        assert_eq!(client.roundtrip_line(b"mg hot v O2\r\n"), b"VA 2 O2\r\n");
        client.read_line();
    }
}

#[test]
fn without_hot_cache_every_get_reaches_memcached() {
    let (mc, proxy) = setup(None, 1);
    let mut client = proxy.connect();
    let before = server_gets(&mc);
    for _ in 0..200 {
        assert_eq!(client.get("hot").as_deref(), Some(&b"v1"[..]));
    }
    assert_eq!(server_gets(&mc) - before, 200);
    mc.connect().set("hot", b"v2");
    assert_eq!(client.get("hot").as_deref(), Some(&b"v2"[..]));
    let stats = proxy.connect().stats();
    assert!(stat_u64(&stats, "pool:main:hot_cache_hits").is_none());
}
