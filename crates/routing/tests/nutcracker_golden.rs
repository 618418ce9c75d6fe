//! Replays placement recorded from the real twemproxy (nutcracker 0.5.0) through
//! `Placement` and requires the same server for every key of every case.
//!
//! The files under `tests/golden/nutcracker/` are written by `scripts/record-golden` (run by hand; it
//! needs memcached and nutcracker). `cases.tsv` describes each pool exactly as nutcracker
//! was configured; `placements.tsv` lists where nutcracker put each key.
use std::collections::BTreeMap;

use memroute_routing::Placement;
use memroute_routing::{DistributionName, HashName, PoolSpec, ServerSpec};

const CASES: &str = include_str!("golden/nutcracker/cases.tsv");
const PLACEMENTS: &str = include_str!("golden/nutcracker/placements.tsv");

fn data_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// One nutcracker server entry: `host:port:weight` or `host:port:weight name`.
fn parse_server(entry: &str) -> ServerSpec {
    let (spec, name) = match entry.split_once(' ') {
        Some((spec, name)) => (spec, Some(name.to_string())),
        None => (entry, None),
    };
    let (address, weight) = spec.rsplit_once(':').expect("host:port:weight");
    ServerSpec {
        address: address.to_string(),
        weight: weight.parse().expect("weight"),
        name,
    }
}

fn parse_case(line: &str) -> (String, PoolSpec) {
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields.len(), 5, "bad case line: {line}");
    let hash_tag = match fields[3] {
        "-" => None,
        tag => {
            let b = tag.as_bytes();
            assert_eq!(b.len(), 2, "hash_tag must be two bytes: {tag}");
            Some([b[0], b[1]])
        }
    };
    let pool = PoolSpec {
        servers: fields[4].split(';').map(parse_server).collect(),
        distribution: DistributionName::parse(fields[1]).expect("distribution"),
        hash: HashName::parse(fields[2]).expect("hash"),
        hash_tag,
        vnodes: 256,
        ..PoolSpec::new(Vec::new())
    };
    (fields[0].to_string(), pool)
}

/// Undoes the script's escaping: `\xHH` is one byte, everything else is literal.
fn unescape(key: &str) -> Vec<u8> {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            assert_eq!(bytes.get(i + 1), Some(&b'x'), "bad escape in {key}");
            let hex = std::str::from_utf8(&bytes[i + 2..i + 4]).expect("hex");
            out.push(u8::from_str_radix(hex, 16).expect("hex byte"));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn placement_matches_nutcracker() {
    let cases: BTreeMap<String, Placement> = data_lines(CASES)
        .map(parse_case)
        .map(|(id, pool)| (id, Placement::new(&pool)))
        .collect();
    assert!(
        cases.len() >= 100,
        "expected the full case list, got {}",
        cases.len()
    );

    let mut checked: BTreeMap<&str, usize> = BTreeMap::new();
    let mut mismatches: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for line in data_lines(PLACEMENTS) {
        let mut fields = line.split('\t');
        let (Some(case), Some(key), Some(server), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            panic!("bad placement line: {line}");
        };
        let placement = cases
            .get(case)
            .unwrap_or_else(|| panic!("unknown case {case}"));
        let expected: usize = server.parse().expect("server index");
        let got = placement.server_for(&unescape(key));
        *checked.entry(case).or_default() += 1;
        if got != expected {
            mismatches
                .entry(case)
                .or_default()
                .push(format!("{key}: nutcracker {expected}, memroute {got}"));
        }
    }

    // Every case must have been replayed, with its full key list.
    for id in cases.keys() {
        assert_eq!(
            checked.get(id.as_str()),
            Some(&300),
            "case {id} has no or partial data"
        );
    }
    if !mismatches.is_empty() {
        let report: Vec<String> = mismatches
            .iter()
            .map(|(case, keys)| format!("{case}: {} of 300 differ, e.g. {}", keys.len(), keys[0]))
            .collect();
        panic!(
            "placement differs from nutcracker in {} cases:\n{}",
            report.len(),
            report.join("\n")
        );
    }
}
