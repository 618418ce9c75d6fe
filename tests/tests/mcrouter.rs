//! Moving from mcrouter, end to end against real memcached:
//!
//! - side by side: keys written through memroute with a `ch3`, `wch3` or `crc32` pool are
//!   read straight from the server mcrouter's own hashing code puts them on (the golden
//!   rows in crates/routing/tests/golden/mcrouter/mcrouter-*.tsv), for pool sizes 1 to 100 and the
//!   weighted pools of the golden data;
//! - an mcrouter JSON config imported with `memroute import-mcrouter` and run;
//! - mcrouter's admin queries (`get __mcrouter__.*`);
//! - `import-mcrouter` errors on bad input.
//!
//! Pools of up to 100 servers without 100 processes: five memcached processes each listen
//! on every fifth loopback address 127.0.0.(i+1), all on one port, so pool entry i is
//! served by process i % 5. A key the golden data places on entry j must be found on
//! process j % 5 and on no other; a placement bug that picks a wrong entry is caught unless
//! the wrong entry happens to share the process (1 in 5 per key, over hundreds of keys).
use std::collections::BTreeMap;
use std::time::Duration;

use memroute_tests::{
    free_port, parse_values, run_memroute_cli, show, with_admin_on, Conn, Memcached, Memroute,
    TempDir,
};

/// The routing crate's golden-file helpers (the same escaping rule).
#[path = "../../crates/routing/tests/common/mod.rs"]
mod golden;
use golden::unescape;

const GOLDEN_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../crates/routing/tests/golden/mcrouter"
);
const PROCESSES: usize = 5;
const LARGEST_POOL: usize = 100;
const CLI_DEADLINE: Duration = Duration::from_secs(20);

/// A key mcrouter would really place (and memcached's text protocol can carry): 1 to 250
/// bytes, none of them a space, a control byte or 0x7F.
fn sendable(key: &[u8]) -> bool {
    (1..=250).contains(&key.len()) && key.iter().all(|&b| b > 0x20 && b != 0x7f)
}

/// Golden rows grouped by pool (the `n_servers` or `weights` column): key -> index.
fn golden_cases(file: &str) -> BTreeMap<String, Vec<(Vec<u8>, usize)>> {
    let text = std::fs::read_to_string(format!("{GOLDEN_DIR}/{file}")).expect("golden file");
    let mut cases: BTreeMap<String, Vec<(Vec<u8>, usize)>> = BTreeMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        let key = unescape(f[0]);
        if !sendable(&key) {
            continue;
        }
        let servers = f[1].split(',').count().max(f[1].parse().unwrap_or(0));
        if servers > LARGEST_POOL {
            continue;
        }
        let rows = cases.entry(f[1].to_string()).or_default();
        // A key listed twice for one pool (mcrouter's own test rows repeat some) is one key.
        if !rows.iter().any(|(k, _)| *k == key) {
            rows.push((key, f[2].parse().expect("index")));
        }
    }
    cases
}

/// `get KEY` straight from a server, with the key as bytes: the value on a hit. (The
/// harness's reply parser reads the `VALUE` line as UTF-8; these keys need not be.)
fn get_bytes(conn: &mut Conn, key: &[u8]) -> Option<Vec<u8>> {
    let mut request = b"get ".to_vec();
    request.extend_from_slice(key);
    request.extend_from_slice(b"\r\n");
    conn.send(&request);
    // The test's values never contain `END\r\n`, so the first one ends the reply.
    let reply = conn.read_until(b"END\r\n");
    if reply == b"END\r\n" {
        return None;
    }
    let mut head = b"VALUE ".to_vec();
    head.extend_from_slice(key);
    head.push(b' ');
    assert!(
        reply.starts_with(&head),
        "get {}: {}",
        show(key),
        show(&reply)
    );
    let start = memroute_tests::find(&reply, b"\r\n").expect("value line") + 2;
    Some(reply[start..reply.len() - b"\r\nEND\r\n".len()].to_vec())
}

fn set_bytes(conn: &mut Conn, key: &[u8], value: &[u8]) {
    let mut request = b"set ".to_vec();
    request.extend_from_slice(key);
    request.extend_from_slice(format!(" 0 0 {}\r\n", value.len()).as_bytes());
    request.extend_from_slice(value);
    request.extend_from_slice(b"\r\n");
    let reply = conn.roundtrip_line(&request);
    assert_eq!(reply, b"STORED\r\n", "set {}: {}", show(key), show(&reply));
}

/// Five processes serving 127.0.0.1..=127.0.0.100 on one port (entry i on process i % 5).
fn spread_servers() -> (Vec<Memcached>, u16) {
    let port = free_port();
    let processes = (0..PROCESSES)
        .map(|p| {
            let hosts: Vec<String> = (0..LARGEST_POOL)
                .filter(|i| i % PROCESSES == p)
                .map(|i| format!("127.0.0.{}", i + 1))
                .collect();
            Memcached::start_on_many(&hosts, port, 16)
        })
        .collect();
    (processes, port)
}

/// memroute over `servers` for a placement check. Its timeout is long: these tests assert
/// where keys land, and a loaded machine (the suite runs several test binaries at once)
/// can stall a set past the default 250 ms.
fn memroute_over(servers: &[String], pool_lines: &str) -> Memroute {
    let listen = format!("127.0.0.1:{}", free_port());
    let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
    Memroute::start(&format!(
        "[proxy]\nlisten = [\"{listen}\"]\nworkers = 1\nroute = \"main\"\n\n[pools.main]\nservers = [{}]\ntimeout = \"5s\"\n{pool_lines}\n",
        servers.join(", ")
    ))
}

/// Writes every case's keys through memroute and finds each on the process the golden
/// index names, and on no other.
fn check_side_by_side(file: &str, pool_lines: impl Fn(&str) -> String) -> usize {
    let (processes, port) = spread_servers();
    let mut direct: Vec<Conn> = processes.iter().map(Memcached::connect).collect();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (case, rows) in golden_cases(file) {
        let n = case.split(',').count().max(case.parse().unwrap_or(0));
        let servers: Vec<String> = (0..n)
            .map(|i| format!("127.0.0.{}:{port}", i + 1))
            .collect();
        let memroute = memroute_over(&servers, &pool_lines(&case));
        let mut client = memroute.connect();
        for conn in &mut direct {
            assert_eq!(conn.roundtrip_line(b"flush_all\r\n"), b"OK\r\n");
        }
        let value = format!("case {case}").into_bytes();
        for (key, _) in &rows {
            set_bytes(&mut client, key, &value);
        }
        for (key, index) in &rows {
            let home = index % PROCESSES;
            for (p, conn) in direct.iter_mut().enumerate() {
                let found = get_bytes(conn, key).as_deref() == Some(value.as_slice());
                if found != (p == home) {
                    wrong.push(format!(
                        "{file} [{case}] {}: mcrouter index {index} (process {home}), found on process {p}: {found}",
                        show(key)
                    ));
                }
            }
            checked += 1;
        }
    }
    assert!(
        wrong.is_empty(),
        "{} placements differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    checked
}

#[test]
fn ch3_pool_places_every_key_where_mcrouter_does() {
    let checked = check_side_by_side("mcrouter-ch3.tsv", |_| "distribution = \"ch3\"".to_string());
    // Every pool size of the golden data up to 100: 1, 2, 3, 5, 10, 25, 100.
    assert!(checked > 1000, "only {checked} keys checked");
}

#[test]
fn weighted_ch3_pool_places_every_key_where_mcrouter_does() {
    let checked = check_side_by_side("mcrouter-wch3.tsv", |weights| {
        format!("distribution = \"wch3\"\nweights = [{weights}]")
    });
    assert!(checked > 900, "only {checked} keys checked");
}

#[test]
fn crc32_pool_places_every_key_where_mcrouter_does() {
    let checked = check_side_by_side("mcrouter-crc32.tsv", |_| {
        "distribution = \"crc32\"".to_string()
    });
    assert!(checked > 1000, "only {checked} keys checked");
}

/// `[proxy] listen` for an imported config (mcrouter's port is a command-line flag), and its
/// admin port moved to a free one.
fn with_listen(toml: &str, listen: &str) -> String {
    let toml = toml.replacen(
        "[proxy]\n",
        &format!("[proxy]\nlisten = [\"{listen}\"]\nworkers = 1\n"),
        1,
    );
    with_admin_on(&toml, &format!("127.0.0.1:{}", free_port()))
}

#[test]
fn imported_mcrouter_config_runs_against_memcached() {
    // Two pools of three: `main` (Ch3) and `weighted` (WeightedCh3 1,0.5,1), each with its
    // golden rows; a prefix selector in front with a null and an error route.
    let main: Vec<Memcached> = (0..3)
        .map(|_| Memcached::start_on("127.0.0.1", free_port(), 8))
        .collect();
    let weighted: Vec<Memcached> = (0..3)
        .map(|_| Memcached::start_on("127.0.0.1", free_port(), 8))
        .collect();
    let list = |ms: &[Memcached]| {
        ms.iter()
            .map(|m| format!("\"{}\"", m.addr()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let json = format!(
        r#"{{
  "pools": {{
    "main": {{ "servers": [{}] }},
    "weighted": {{ "servers": [{}], "weights": [1, 0.5, 1] }}
  }},
  "named_handles": [
    {{ "type": "AllSyncRoute", "name": "both", "children": ["PoolRoute|main", "PoolRoute|weighted"] }}
  ],
  "route": {{
    "type": "PrefixSelectorRoute",
    "policies": {{
      "null:": "NullRoute",
      "err:": {{ "type": "ErrorRoute", "response": "not here" }}
    }},
    "wildcard": {{
      "type": "OperationSelectorRoute",
      "operation_policies": {{ "get": {{ "type": "FailoverRoute", "children": ["PoolRoute|main", "PoolRoute|weighted"] }} }},
      "default_policy": "both"
    }}
  }}
}}"#,
        list(&main),
        list(&weighted)
    );
    let dir = TempDir::new("mcrouter-import");
    let json_path = dir.write("mcrouter.json", &json);
    let import = run_memroute_cli(
        &["import-mcrouter".as_ref(), json_path.as_os_str()],
        CLI_DEADLINE,
    );
    assert!(import.status.success(), "import failed:\n{}", import.stderr);
    assert!(
        import.stdout.contains("distribution = \"wch3\""),
        "{}",
        import.stdout
    );

    let listen = format!("127.0.0.1:{}", free_port());
    let toml = with_listen(&import.stdout, &listen);
    // `--check` accepts the import and shows the placement it understood.
    let toml_path = dir.write("memroute.toml", &toml);
    let checked = run_memroute_cli(
        &[
            "--check".as_ref(),
            "--config".as_ref(),
            toml_path.as_os_str(),
        ],
        CLI_DEADLINE,
    );
    assert!(
        checked.status.success(),
        "--check failed:\n{}",
        checked.stderr
    );
    assert!(
        checked
            .stdout
            .contains("pool weighted: 3 servers, distribution wch3")
            && checked.stdout.contains("  weights [1.0, 0.5, 1.0]")
            && checked
                .stdout
                .contains("pool main: 3 servers, distribution ch3"),
        "{}",
        checked.stdout
    );
    let memroute = Memroute::start(&toml);
    let mut client = memroute.connect();

    let ch3 = golden_cases("mcrouter-ch3.tsv")
        .remove("3")
        .expect("ch3 rows for 3 servers");
    let wch3 = golden_cases("mcrouter-wch3.tsv")
        .remove("1,0.5,1")
        .expect("wch3 rows for 1,0.5,1");
    // Sets go to both pools (AllSyncRoute): each key lands on main at its Ch3 index and on
    // weighted at its WeightedCh3 index.
    let mut keys: Vec<&Vec<u8>> = ch3.iter().map(|(k, _)| k).collect();
    keys.extend(
        wch3.iter()
            .map(|(k, _)| k)
            .filter(|k| !k.starts_with(b"null:") && !k.starts_with(b"err:")),
    );
    for key in &keys {
        set_bytes(&mut client, key, b"imported");
    }
    let mut wrong = Vec::new();
    for (servers, rows, name) in [
        (&main, &ch3, "main/ch3"),
        (&weighted, &wch3, "weighted/wch3"),
    ] {
        let mut direct: Vec<Conn> = servers.iter().map(Memcached::connect).collect();
        for (key, index) in rows.iter() {
            for (i, conn) in direct.iter_mut().enumerate() {
                let found = get_bytes(conn, key).is_some();
                if found != (i == *index) {
                    wrong.push(format!(
                        "{name} {}: golden {index}, on server {i}: {found}",
                        show(key)
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} placements differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        ch3.len() > 150 && wch3.len() > 50,
        "{} / {} keys",
        ch3.len(),
        wch3.len()
    );

    // mcrouter's route query lists every server a request may reach: a set of `sample`
    // goes to both pools (AllSyncRoute), in child order; a key under `null:` reaches none.
    let ch3_sample = ch3
        .iter()
        .find(|(k, _)| k == b"sample")
        .map(|&(_, i)| i)
        .expect("sample");
    let wch3_sample = wch3
        .iter()
        .find(|(k, _)| k == b"sample")
        .map(|&(_, i)| i)
        .expect("sample");
    let route = |client: &mut Conn, query: &str| -> Vec<u8> {
        client.send(format!("get __mcrouter__.{query}\r\n").as_bytes());
        let reply = client.read_until(b"END\r\n");
        let values = parse_values(&reply).unwrap_or_else(|| panic!("{query}: {}", show(&reply)));
        values.into_iter().next().map(|v| v.2).unwrap_or_default()
    };
    assert_eq!(
        show(&route(&mut client, "route(set,sample)")),
        show(
            format!(
                "{}\r\n{}",
                main[ch3_sample].addr(),
                weighted[wch3_sample].addr()
            )
            .as_bytes()
        )
    );
    assert_eq!(route(&mut client, "route(get,null:x)"), b"");
    let tree = String::from_utf8(route(&mut client, "route_handles(set,sample)")).expect("utf-8");
    assert!(
        tree.starts_with(
            "prefix|root\r\n operation|root_wildcard\r\n  replicated|both\r\n   pool|main\r\n"
        ),
        "{tree}"
    );

    // A get goes to main only (FailoverRoute: the first child with a live server).
    assert_eq!(
        show(&route(&mut client, "route(get,sample)")),
        show(main[ch3_sample].addr().as_bytes())
    );
    // Reads fail over main -> weighted: with main's server for `sample` gone, the weighted
    // copy answers, and the route query follows the routing in effect once memroute has
    // marked that server down (a refused connect does it at once).
    assert_eq!(
        get_bytes(&mut client, b"sample").as_deref(),
        Some(&b"imported"[..])
    );
    let mut main = main;
    main[ch3_sample].kill();
    assert_eq!(
        get_bytes(&mut client, b"sample").as_deref(),
        Some(&b"imported"[..])
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = route(&mut client, "route(get,sample)");
        if now == weighted[wch3_sample].addr().as_bytes() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "route(get,sample) still {} after main's server went down",
            show(&now)
        );
        // Each query is itself a round trip through the worker; no sleep needed between.
        assert_eq!(
            get_bytes(&mut client, b"sample").as_deref(),
            Some(&b"imported"[..])
        );
    }

    // The null and error routes answer without a backend.
    assert_eq!(client.roundtrip_line(b"get null:x\r\n"), b"END\r\n");
    assert_eq!(
        client.roundtrip_line(b"get err:x\r\n"),
        b"SERVER_ERROR not here\r\n"
    );
}

#[test]
fn mcrouter_admin_queries_are_answered() {
    let servers: Vec<Memcached> = (0..3)
        .map(|_| Memcached::start_on("127.0.0.1", free_port(), 8))
        .collect();
    let addresses: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let memroute = memroute_over(&addresses, "distribution = \"ch3\"");
    let mut client = memroute.connect();

    let value = |client: &mut Conn, key: &str| -> String {
        client.send(format!("get {key}\r\n").as_bytes());
        let reply = client.read_get_reply();
        let values = parse_values(&reply).unwrap_or_else(|| panic!("{key}: {}", show(&reply)));
        assert_eq!(values.len(), 1, "{key}: {}", show(&reply));
        assert_eq!(values[0].0, key);
        String::from_utf8(values[0].2.clone()).expect("utf-8")
    };
    assert!(value(&mut client, "__mcrouter__.version").starts_with("memroute-"));
    assert_eq!(
        value(&mut client, "__mcrouter__.config_file"),
        memroute.config_path().display().to_string()
    );
    // `sample` with 3 servers: the golden Ch3 index.
    let index = golden_cases("mcrouter-ch3.tsv")["3"]
        .iter()
        .find(|(k, _)| k == b"sample")
        .map(|&(_, i)| i)
        .expect("sample in the golden rows");
    assert_eq!(
        value(&mut client, "__mcrouter__.route(get,sample)"),
        addresses[index]
    );
    assert_eq!(
        value(&mut client, "__mcrouter__.route_handles(get,sample)"),
        format!("pool|main\r\n server|{}", addresses[index])
    );
    // Not supported: an error that says so, and the connection goes on.
    let reply = client.roundtrip_line(b"get __mcrouter__.options\r\n");
    assert!(
        reply.starts_with(b"SERVER_ERROR memroute does not answer __mcrouter__.options"),
        "{}",
        show(&reply)
    );
    client.set("after", b"1");
    assert_eq!(client.get("after").as_deref(), Some(&b"1"[..]));
    assert_eq!(
        servers[index].connect().get("sample"),
        None,
        "admin query reached a server"
    );
}

#[test]
fn import_mcrouter_reports_bad_input_with_json_paths() {
    let dir = TempDir::new("mcrouter-import-bad");
    let cases: &[(&str, &[&str])] = &[
        ("{\"pools\": {", &["line 1, column 11: invalid JSON"]),
        (
            r#"{"pools": {"A": {"servers": ["h:1", "h:2"], "weights": [0, -0.5]}}, "route": "PoolRoute|A"}"#,
            // mcrouter takes weight 0 (the importer writes its nearest with a NOTE), not
            // a negative one.
            &["pools.A.weights[1]: weight -0.5 must be > 0"],
        ),
        (
            r#"{"pools": {"A": {"servers": ["h:1"]}}, "route": {"type": "PrefixSelectorRoute", "policies": {"a": {"type": "BogusRoute"}}, "wildcard": "PoolRoute|A"}}"#,
            // Not one of mcrouter's handles: mcrouter rejects it too.
            &["route.policies.a.type: unknown route handle \"BogusRoute\""],
        ),
        (
            r#"{"pools": {"A": {"servers": ["h:1"]}}, "named_handles": [{"name": "a", "type": "FailoverRoute", "children": ["b"]}, {"name": "b", "type": "FailoverRoute", "children": ["a"]}], "route": "a"}"#,
            &["named_handles[1].children[0]: named handle loop: a -> b -> a"],
        ),
    ];
    for (i, (json, expected)) in cases.iter().enumerate() {
        let path = dir.write(&format!("bad{i}.json"), json);
        let out = run_memroute_cli(
            &["import-mcrouter".as_ref(), path.as_os_str()],
            CLI_DEADLINE,
        );
        assert!(
            !out.status.success(),
            "bad config {i} imported:\n{}",
            out.stdout
        );
        assert!(
            out.stdout.is_empty(),
            "printed something for bad config {i}:\n{}",
            out.stdout
        );
        for line in *expected {
            assert!(
                out.stderr.contains(line),
                "case {i}: missing {line:?} in:\n{}",
                out.stderr
            );
        }
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
    let missing = run_memroute_cli(
        &["import-mcrouter", "/nonexistent/mcrouter.json"],
        CLI_DEADLINE,
    );
    assert!(!missing.status.success());
    assert!(
        missing
            .stderr
            .contains("cannot read /nonexistent/mcrouter.json"),
        "{}",
        missing.stderr
    );
}
