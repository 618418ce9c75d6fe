//! Replays the vectors generated from mcrouter's own hashing code
//! (`golden/mcrouter/mcrouter-*.tsv`, described in `golden/mcrouter/README.md`) through `Placement` with
//! distributions `ch3`, `wch3` and `crc32`, and the inner hashes through
//! `memroute_routing::mcrouter_hash`. Every row must match: a different index means a
//! cold cache for whoever moves from mcrouter.
mod common;
use common::unescape;
use memroute_routing::mcrouter_hash::{crc32_index, furc, murmur64a, routing_key, spooky32};
use memroute_routing::Placement;
use memroute_routing::{DistributionName, PoolSpec, ServerSpec};

const CH3: &str = include_str!("golden/mcrouter/mcrouter-ch3.tsv");
const WCH3: &str = include_str!("golden/mcrouter/mcrouter-wch3.tsv");
const CRC32: &str = include_str!("golden/mcrouter/mcrouter-crc32.tsv");
const SPOOKY32: &str = include_str!("golden/mcrouter/mcrouter-spooky32.tsv");

/// Rows after the header line, split on tabs.
fn rows(text: &str, columns: usize) -> Vec<Vec<&str>> {
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|line| line.split('\t').collect::<Vec<_>>())
        .collect();
    for row in &rows {
        assert_eq!(row.len(), columns, "bad row {row:?}");
    }
    rows
}

/// A pool of `n` servers: only the count and order matter to mcrouter's distributions.
fn pool(distribution: DistributionName, n: usize, weights: Vec<f64>) -> PoolSpec {
    let servers = (0..n)
        .map(|i| ServerSpec {
            address: format!("10.{}.{}.{}:11211", i >> 16, (i >> 8) & 0xff, i & 0xff),
            weight: 1,
            name: None,
        })
        .collect();
    PoolSpec {
        distribution,
        weights,
        ..PoolSpec::new(servers)
    }
}

/// Pools larger than this are checked on the placement function itself: mcrouter's own
/// test rows go up to 2^32-1 servers, which no pool config can hold in memory.
const LARGEST_POOL_BUILT: usize = 100_000;

/// Placement for every row, caching one pool per (n or weights).
fn check_placements(
    text: &str,
    distribution: DistributionName,
    extra_check: impl Fn(&[&str], &[u8]) -> Option<String>,
) -> usize {
    let mut cache: std::collections::HashMap<String, Placement> = Default::default();
    let mut mismatches = Vec::new();
    let all = rows(text, 5);
    for row in &all {
        let key = unescape(row[0]);
        let expected: usize = row[2].parse().expect("index");
        let n: Option<usize> = row[1].parse().ok();
        if let Some(n) = n.filter(|&n| n > LARGEST_POOL_BUILT) {
            let got = match distribution {
                DistributionName::Ch3 => furc(routing_key(&key), n as u32) as usize,
                _ => crc32_index(routing_key(&key), n as u64) as usize,
            };
            if got != expected {
                mismatches.push(format!(
                    "{} [{n}]: mcrouter {expected}, memroute {got}",
                    row[0]
                ));
            }
            continue;
        }
        let placement = cache.entry(row[1].to_string()).or_insert_with(|| {
            if distribution == DistributionName::WeightedCh3 {
                let weights: Vec<f64> = row[1]
                    .split(',')
                    .map(|w| w.parse().expect("weight"))
                    .collect();
                Placement::new(&pool(distribution, weights.len(), weights))
            } else {
                Placement::new(&pool(distribution, row[1].parse().expect("n"), Vec::new()))
            }
        });
        let got = placement.server_for(&key);
        if got != expected {
            mismatches.push(format!(
                "{} [{}]: mcrouter {expected}, memroute {got}",
                row[0], row[1]
            ));
        }
        if routing_key(&key) != unescape(row[3]).as_slice() {
            mismatches.push(format!("{}: routing key differs from {}", row[0], row[3]));
        }
        if let Some(problem) = extra_check(row, routing_key(&key)) {
            mismatches.push(problem);
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} rows differ:\n{}",
        mismatches.len(),
        all.len(),
        mismatches.join("\n")
    );
    all.len()
}

#[test]
fn ch3_matches_mcrouter() {
    let rows = check_placements(CH3, DistributionName::Ch3, |row, routing| {
        let murmur = format!("{:016x}", murmur64a(routing, 0xF9F1_98EF));
        (murmur != row[4]).then(|| format!("{}: murmur64a {murmur}, mcrouter {}", row[0], row[4]))
    });
    assert_eq!(rows, 2064);
}

#[test]
fn weighted_ch3_matches_mcrouter() {
    let rows = check_placements(WCH3, DistributionName::WeightedCh3, |_, _| None);
    assert_eq!(rows, 1110);
}

#[test]
fn crc32_matches_mcrouter() {
    let rows = check_placements(CRC32, DistributionName::Crc32, |row, routing| {
        let crc = format!("{:08x}", memroute_routing::hash::crc32a(routing));
        (crc != row[4]).then(|| format!("{}: crc32 {crc}, mcrouter {}", row[0], row[4]))
    });
    assert_eq!(rows, 2060);
}

#[test]
fn spooky32_matches_folly() {
    let all = rows(SPOOKY32, 3);
    let wrong: Vec<String> = all
        .iter()
        .filter_map(|row| {
            let got = spooky32(&unescape(row[0]), row[1].parse().expect("seed"));
            (got.to_string() != row[2])
                .then(|| format!("{} seed {}: {got} != {}", row[0], row[1], row[2]))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(all.len(), 527);
}
