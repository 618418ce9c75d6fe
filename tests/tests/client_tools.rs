//! Real memcached client tools through memroute: libmemcached's `memcstat` and `memcping`
//! (Debian libmemcached-tools, installed by scripts/test) parse memroute's `version` and
//! `stats` replies and exit 0, as they do against memcached itself.
use std::time::Duration;

use memroute_tests::*;

const TOOL_TIMEOUT: Duration = Duration::from_secs(20);

fn servers_arg(addr: &str) -> String {
    format!("--servers={addr}")
}

#[test]
fn memcstat_and_memcping_exit_zero_through_memroute() {
    let backend = Memcached::start();
    let proxy = Memroute::start_pool(&[backend.addr()]);
    for target in [backend.addr(), proxy.listen.clone()] {
        let stat = run_program("memcstat", &[servers_arg(&target)], TOOL_TIMEOUT);
        assert!(
            stat.status.success(),
            "memcstat against {target}: {:?}\nstdout: {}\nstderr: {}",
            stat.status,
            stat.stdout,
            stat.stderr
        );
        assert!(stat.stdout.contains("version: "), "{}", stat.stdout);
        let ping = run_program("memcping", &[servers_arg(&target)], TOOL_TIMEOUT);
        assert!(
            ping.status.success(),
            "memcping against {target}: {:?}\nstderr: {}",
            ping.status,
            ping.stderr
        );
    }
}

#[test]
fn version_is_numeric_first_and_stats_name_memroute() {
    let backend = Memcached::start();
    let proxy = Memroute::start_pool(&[backend.addr()]);
    let mut c = proxy.connect();
    let version = String::from_utf8(c.roundtrip_line(b"version\r\n")).expect("utf-8");
    let words: Vec<&str> = version.trim_end().split(' ').collect();
    assert_eq!(words.len(), 3, "{version:?}");
    assert_eq!(words[0], "VERSION");
    let parts: Vec<&str> = words[1].split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "not major.minor.micro: {version:?}"
    );
    assert!(words[2].starts_with("memroute-"), "{version:?}");
    let stats =
        String::from_utf8_lossy(&c.roundtrip_fenced(b"stats\r\n").expect("stats")).into_owned();
    assert!(
        stats.contains(&format!("STAT version {}\r\n", words[1])),
        "{stats}"
    );
    assert!(
        stats.contains(&format!(
            "STAT memroute_version {}\r\n",
            &words[2]["memroute-".len()..]
        )),
        "{stats}"
    );
}
