//! Pins memroute's own distributions, `ring` and `jump`, which no other program
//! implements: `golden/memroute/ring-jump.tsv` was recorded from the implementation as
//! it stood before distributions moved into one file each (commit 11b5558), so any later
//! change that moves a key fails here instead of silently cold-starting a cache.
//!
//! Re-record only on purpose (a deliberate placement change is a breaking change):
//! `MEMROUTE_RECORD_GOLDEN=1 cargo test -p memroute-routing --test memroute_golden -- --ignored`.
mod common;
use common::unescape;
use memroute_routing::Placement;
use memroute_routing::{DistributionName, HashName, PoolSpec, ServerSpec};

const GOLDEN: &str = include_str!("golden/memroute/ring-jump.tsv");
const HEADER: &str = "distribution\thash\tvnodes\tservers (address:weight[ name];...)\tkey\tindex";

/// The pools recorded: sizes, weights, names, vnodes and the pool hash all vary.
fn cases() -> Vec<(DistributionName, HashName, u32, Vec<ServerSpec>)> {
    let servers = |n: usize, weight: &dyn Fn(usize) -> u32, named: bool| -> Vec<ServerSpec> {
        (0..n)
            .map(|i| ServerSpec {
                address: format!(
                    "10.1.{}.{}:{}",
                    i / 200,
                    i % 200 + 1,
                    11211 + (i % 3) as u16
                ),
                weight: weight(i),
                name: named.then(|| format!("mc-{i}")),
            })
            .collect()
    };
    let one = |_: usize| 1;
    let uneven = |i: usize| (i % 4) as u32 + 1;
    let mut out = Vec::new();
    for n in [1, 2, 3, 5, 10, 25, 100] {
        out.push((
            DistributionName::Ring,
            HashName::Xxh3,
            256,
            servers(n, &one, false),
        ));
        out.push((
            DistributionName::Jump,
            HashName::Xxh3,
            256,
            servers(n, &one, false),
        ));
    }
    for n in [3, 10] {
        out.push((
            DistributionName::Ring,
            HashName::Xxh3,
            256,
            servers(n, &uneven, false),
        ));
        out.push((
            DistributionName::Ring,
            HashName::Xxh3,
            64,
            servers(n, &one, true),
        ));
        out.push((
            DistributionName::Ring,
            HashName::Fnv1a_64,
            160,
            servers(n, &uneven, true),
        ));
        out.push((
            DistributionName::Jump,
            HashName::Md5,
            256,
            servers(n, &uneven, true),
        ));
    }
    for n in [7, 1000] {
        out.push((
            DistributionName::Jump,
            HashName::Xxh3,
            256,
            servers(n, &one, false),
        ));
    }
    out
}

fn keys() -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = (0..60)
        .map(|i| format!("key:{i}:{}", i * 7919).into_bytes())
        .collect();
    for k in [
        "a",
        "sample",
        "user:12345:profile",
        "{tag}x",
        "x{tag}",
        "ключ",
        "/r/c/key",
    ] {
        keys.push(k.as_bytes().to_vec());
    }
    keys.push(vec![0xff; 9]);
    keys.push((0x80..=0xffu8).collect());
    keys.push(b"k".repeat(250));
    keys
}

fn servers_field(servers: &[ServerSpec]) -> String {
    servers
        .iter()
        .map(|s| match &s.name {
            Some(name) => format!("{}:{} {name}", s.address, s.weight),
            None => format!("{}:{}", s.address, s.weight),
        })
        .collect::<Vec<_>>()
        .join(";")
}

fn parse_servers(field: &str) -> Vec<ServerSpec> {
    field
        .split(';')
        .map(|entry| {
            let (spec, name) = match entry.split_once(' ') {
                Some((spec, name)) => (spec, Some(name.to_string())),
                None => (entry, None),
            };
            let (address, weight) = spec.rsplit_once(':').expect("address:weight");
            ServerSpec {
                address: address.to_string(),
                weight: weight.parse().expect("weight"),
                name,
            }
        })
        .collect()
}

fn pool(
    distribution: DistributionName,
    hash: HashName,
    vnodes: u32,
    servers: Vec<ServerSpec>,
) -> PoolSpec {
    PoolSpec {
        distribution,
        hash,
        vnodes,
        ..PoolSpec::new(servers)
    }
}

fn escape(key: &[u8]) -> String {
    let mut out = String::new();
    for &b in key {
        match b {
            b'\\' => out.push_str("\\\\"),
            0x21..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

#[test]
#[ignore = "records the golden file; run by hand only for a deliberate placement change"]
fn record() {
    if std::env::var_os("MEMROUTE_RECORD_GOLDEN").is_none() {
        return;
    }
    let mut text = format!(
        "# recorded by crates/routing/tests/memroute_golden.rs; do not edit by hand\n{HEADER}\n"
    );
    for (distribution, hash, vnodes, servers) in cases() {
        let field = servers_field(&servers);
        let placement = Placement::new(&pool(distribution, hash, vnodes, servers));
        for key in keys() {
            text.push_str(&format!(
                "{}\t{}\t{vnodes}\t{field}\t{}\t{}\n",
                distribution.as_str(),
                hash.as_str(),
                escape(&key),
                placement.server_for(&key)
            ));
        }
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/memroute/ring-jump.tsv"
    );
    std::fs::write(path, text).expect("write golden file");
}

#[test]
fn ring_and_jump_match_the_recorded_placement() {
    let mut rows = 0;
    let mut mismatches = Vec::new();
    for line in GOLDEN
        .lines()
        .filter(|l| !l.starts_with('#') && *l != HEADER)
    {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 6, "bad row: {line}");
        let distribution = DistributionName::parse(f[0]).expect("distribution");
        let hash = HashName::parse(f[1]).expect("hash");
        let vnodes: u32 = f[2].parse().expect("vnodes");
        let expected: usize = f[5].parse().expect("index");
        let placement = Placement::new(&pool(distribution, hash, vnodes, parse_servers(f[3])));
        let got = placement.server_for(&unescape(f[4]));
        if got != expected {
            mismatches.push(format!(
                "{} n={} {}: recorded {expected}, now {got}",
                f[0],
                f[3].split(';').count(),
                f[4]
            ));
        }
        rows += 1;
    }
    assert_eq!(
        rows,
        cases().len() * keys().len(),
        "golden file and case list disagree"
    );
    assert!(
        mismatches.is_empty(),
        "{} rows moved:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
