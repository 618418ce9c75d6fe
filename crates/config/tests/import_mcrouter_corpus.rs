//! mcrouter's own test configs (fixtures/mcrouter, copied from facebook/mcrouter's
//! `mcrouter/test/*.json` under its MIT license) through `memroute import-mcrouter`'s code:
//! every config mcrouter takes imports, and the output loads in memroute (the importer
//! runs it through `memroute_config::parse` before it returns it); the two mcrouter rejects
//! are errors naming the key path of the fault.
//!
//! Files its own tests start mcrouter with flags for are imported with the same
//! `--config-params`; the two its tests rewrite before mcrouter reads them (`START_TIME`)
//! are imported rewritten the same way.
//!
//! No config mcrouter accepts may fail to import, including those whose routing
//! prefixes reach pools that disagree on `keep_routing_prefix` (memroute keeps or cuts a
//! prefix per routing prefix, not per pool: the import turns keeping off on such pools,
//! with a NOTE).
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test, with its message

use std::path::{Path, PathBuf};

use memroute_config::import::mcrouter::{import_file, Flags};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcrouter")
}

/// Files in mcrouter/test that are not configs mcrouter is started with.
const NOT_CONFIGS: &[(&str, &str)] = &[
    (
        "runtime_vars_file.json",
        "runtime variables (--runtime-vars-file)",
    ),
    (
        "test_poolstats_config.json",
        "pool stats settings (--pool-stats-config-file)",
    ),
    (
        "test_shadow_with_file_config.json",
        "a file test_shadow_with_file.json @imports",
    ),
];

/// Configs mcrouter refuses, and the fault the importer names.
const REJECTED: &[(&str, &str)] = &[
    ("invalid_config.json", "route: unknown pool \"A.pho\""),
    (
        "test_dump_config_invalid.json",
        "route: unknown route handle or named handle \"-PoolRoute|foo\"",
    ),
];

/// The `--config-params` mcrouter's tests give these configs.
fn params(file: &str) -> Vec<(String, String)> {
    let pairs: &[(&str, &str)] = match file {
        "mcrouter_test_portoverride.json" => &[("PORT", "11211")],
        "test_config_params.json" => &[("PORT", "11211"), ("POOL", "A")],
        "test_shadow_with_file.json" => &[
            ("PORT_1", "11211"),
            ("PORT_2", "11212"),
            ("PORT_SHADOW", "11213"),
        ],
        _ => &[],
    };
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn import(file: &Path) -> Result<String, String> {
    let name = file.file_name().unwrap().to_str().unwrap();
    let mut text = std::fs::read_to_string(file).unwrap();
    if name.starts_with("test_migrated_pools") {
        // Its test writes the migration's start time in before mcrouter reads the file.
        text = text.replace("START_TIME", "1700000000");
    }
    let flags = Flags {
        config_params: params(name),
        ..Flags::default()
    };
    import_file(&text, file, &flags).map_err(|errors| errors.to_string())
}

#[test]
fn every_config_mcrouter_takes_imports_and_loads() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 100, "the corpus: {} files", files.len());
    let mut imported = 0;
    let mut failures = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_str().unwrap();
        if NOT_CONFIGS.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let outcome = import(file);
        if let Some((_, fault)) = REJECTED.iter().find(|(n, _)| *n == name) {
            match outcome {
                Err(message) => assert!(message.contains(fault), "{name}: {message}"),
                Ok(_) => failures.push(format!("{name}: mcrouter rejects it, the import did not")),
            }
            continue;
        }
        match outcome {
            Ok(toml) => {
                assert!(toml.contains("[proxy]"), "{name}");
                imported += 1;
            }
            Err(message) => failures.push(format!("{name}: {message}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{imported} imported");
}

#[test]
fn a_failover_with_exptime_imports_as_a_gutter_failover() {
    let file = fixtures().join("test_basic_failover.json");
    let toml = import(&file).unwrap();
    let config = memroute_config::parse(&toml).unwrap();
    let route = &config.routes[&config.proxy.route];
    let memroute_config::RouteConfig::Failover {
        children,
        exptime_cap,
        errors,
        ..
    } = route
    else {
        panic!("not a failover route: {route:?}\n{toml}");
    };
    assert_eq!(children, &["A.wildcard", "B.wildcard"]);
    // mcrouter's default failover_exptime, 60 s, written out.
    assert_eq!(*exptime_cap, Some(60), "{toml}");
    assert!(errors.is_all());
}

#[test]
fn pools_that_disagree_on_keeping_a_routing_prefix_import_cutting_it_with_a_note() {
    let file = fixtures().join("routing_prefix_test_ascii.json");
    let toml = import(&file).unwrap();
    let config = memroute_config::parse(&toml).unwrap();
    // mcrouter kept the prefix on B.wildcard only; the routes reaching it reach A.wildcard
    // too, so memroute cuts it on both.
    assert!(config.routing_prefixes.keep.is_empty(), "{toml}");
    let section = toml.split("[pools.\"B.wildcard\"]").next().unwrap();
    let notes = section.rsplit("\n\n").next().unwrap().replace("\n#  ", "");
    assert!(
        notes.contains("mcrouter sent this pool's keys with their routing prefix")
            && notes.contains("memroute sends this pool's keys without")
            && notes.contains("\"/a/a/\"")
            && notes.contains("cold pool"),
        "{toml}"
    );
}
