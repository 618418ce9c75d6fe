//! Hot keys named: a load where one key is a quarter of a pool's gets and another a tenth
//! lists them first and second, with their shares, in /hotkeys, `stats` and /metrics.
use memroute_tests::*;
use serde_json::Value;

fn config(listen: &str, admin: &str, a: &str, b: &str, admin_extra: &str) -> String {
    format!(
        "[proxy]\nlisten = [\"{listen}\"]\nworkers = 2\nroute = \"by_prefix\"\n\n\
         [pools.a]\nservers = [\"{a}\"]\ntimeout = \"10s\"\n\n[pools.b]\nservers = [\"{b}\"]\ntimeout = \"10s\"\n\n\
         [routes.by_prefix]\ntype = \"prefix\"\nprefixes = {{ \"a:\" = \"a\" }}\ndefault = \"b\"\n\n\
         [admin]\nlisten = \"{admin}\"\nhot_keys_sample = 4\n{admin_extra}"
    )
}

/// 12,000 reads of pool a's keys (a quarter `a:hot`, a tenth `a:warm`, the rest each read
/// once) and 4,000 of pool b's (uniform), shuffled, half as single gets and half in
/// 20-key multi-gets, over two connections (one per worker).
fn skewed_load(proxy: &Memroute) {
    let mut keys: Vec<String> = (0..12_000)
        .map(|i| match i % 20 {
            0..=4 => "a:hot".to_string(),
            5..=6 => "a:warm".to_string(),
            _ => format!("a:cold{i}"),
        })
        .chain((0..4_000).map(|i| format!("b:{}", i % 400)))
        .collect();
    // A fixed shuffle (xorshift), so the hot keys are spread over the whole run.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..keys.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        keys.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut clients = [proxy.connect(), proxy.connect()];
    let (single, multi) = keys.split_at(keys.len() / 2);
    for (i, key) in single.iter().enumerate() {
        assert_eq!(clients[i % 2].get(key), None);
    }
    for (i, batch) in multi.chunks(20).enumerate() {
        let line = format!("get {}\r\n", batch.join(" "));
        let c = &mut clients[i % 2];
        c.send(line.as_bytes());
        assert_eq!(c.read_get_reply(), b"END\r\n");
    }
}

#[test]
fn the_hottest_keys_of_each_pool_are_named_with_their_share() {
    let a = Memcached::start();
    let b = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&listen, &admin, &a.addr(), &b.addr(), ""));
    skewed_load(&proxy);

    let (code, body) = admin_http(&admin, "GET", "/hotkeys?top=3");
    assert_eq!(code, 200, "{body}");
    let report: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(report["sample_every"], 4, "{body}");
    let pools = report["pools"].as_array().expect("pools");
    let pool_a = pools.iter().find(|p| p["pool"] == "a").expect("pool a");
    let keys = pool_a["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 3, "{body}");
    assert_eq!(keys[0]["key"], "a:hot", "{body}");
    assert_eq!(keys[1]["key"], "a:warm", "{body}");
    let share = |k: &Value| k["share"].as_f64().expect("share");
    assert!((share(&keys[0]) - 0.25).abs() < 0.05, "{body}");
    assert!((share(&keys[1]) - 0.10).abs() < 0.05, "{body}");
    assert_eq!(keys[0]["server"], a.addr().as_str(), "{body}");
    assert!(keys[0]["rate"].as_f64().expect("rate") > 0.0, "{body}");
    // Sampling about one in four of 12,000 keys.
    let sampled = pool_a["sampled"].as_u64().expect("sampled");
    assert!((2_000..4_000).contains(&sampled), "{body}");
    // Pool b has no key above a few percent.
    let pool_b = pools.iter().find(|p| p["pool"] == "b").expect("pool b");
    assert!(share(&pool_b["keys"][0]) < 0.05, "{body}");

    // `stats` names the same key first.
    let stats = proxy.connect().stats();
    let first = stats
        .iter()
        .find(|(name, _)| name == "hot_key:a:1")
        .unwrap_or_else(|| panic!("no hot_key:a:1 in {stats:?}"));
    assert!(first.1.starts_with("a:hot share=0.2"), "{}", first.1);
    assert!(
        first.1.ends_with(&format!("server={}", a.addr())),
        "{}",
        first.1
    );

    // /metrics carries the top share per pool, never a key.
    let (_, metrics) = admin_http(&admin, "GET", "/metrics");
    let top: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("memroute_hot_key_share{pool=\"a\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no memroute_hot_key_share for pool a"));
    assert!((top - 0.25).abs() < 0.05, "{top}");
    assert!(!metrics.contains("a:hot"), "a key in /metrics");
}

#[test]
fn show_keys_false_hides_the_keys() {
    let a = Memcached::start();
    let b = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(
        &listen,
        &admin,
        &a.addr(),
        &b.addr(),
        "show_keys = false\n",
    ));
    skewed_load(&proxy);
    let (_, body) = admin_http(&admin, "GET", "/hotkeys");
    let report: Value = serde_json::from_str(&body).expect("JSON");
    let pool_a = report["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pool"] == "a"))
        .unwrap_or_else(|| panic!("pool a in {body}"));
    assert_eq!(pool_a["keys"][0]["key"], "<hidden>", "{body}");
    assert!((pool_a["keys"][0]["share"].as_f64().expect("share") - 0.25).abs() < 0.05);
    assert!(!body.contains("a:hot"), "{body}");
    let stats = proxy.connect().stats();
    assert!(stats.iter().all(|(_, v)| !v.contains("a:hot")), "{stats:?}");
}
