//! Reloading by watching the config file: edits in place, atomic renames and a Kubernetes
//! ConfigMap update (the `..data` symlink swap) each reach memroute without a signal, under
//! continuous pipelined load, without a client error and without reconnecting to servers
//! that stay; a storm of writes is debounced; a deleted, emptied or invalid file keeps the
//! running config; SIGHUP still works with the watch off.
//!
//! ```text
//!   test writes the file (3 ways) --inotify on its directory--> memroute: debounce, read,
//!     validate, swap routes          client thread: pipelined set+get batches, every reply checked
//! ```
//!
//! Every wait is on memroute's log or stats, bounded.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memroute_tests::*;

/// A file change must be applied within this.
const DEADLINE: Duration = Duration::from_secs(15);

/// How the test replaces the config.
#[derive(Debug, Clone, Copy)]
enum Write {
    /// Truncate and write the same file (an editor saving in place).
    InPlace,
    /// Write a sibling, rename it over the file.
    AtomicRename,
    /// What the kubelet does to a ConfigMap volume: a new timestamped directory with the
    /// file, a `..data_tmp` symlink to it renamed over `..data`, the old directory removed.
    /// The config path is `memroute.toml -> ..data/memroute.toml`.
    ConfigMapSwap,
}

/// The config directory, laid out as a plain file or as a ConfigMap volume.
struct ConfigDir {
    dir: PathBuf,
    /// The current `..<version>` directory of the ConfigMap layout.
    version: usize,
}

impl ConfigDir {
    fn file(&self) -> PathBuf {
        self.dir.join("memroute.toml")
    }

    fn write(&mut self, how: Write, toml: &str) {
        match how {
            Write::InPlace => std::fs::write(self.file(), toml).expect("write in place"),
            Write::AtomicRename => {
                let staged = self.dir.join(".memroute.toml.swp");
                std::fs::write(&staged, toml).expect("write staged");
                std::fs::rename(&staged, self.file()).expect("rename over");
            }
            Write::ConfigMapSwap => {
                let old = self.dir.join(format!("..v{}", self.version));
                self.version += 1;
                let name = format!("..v{}", self.version);
                let new = self.dir.join(&name);
                std::fs::create_dir(&new).expect("version dir");
                std::fs::write(new.join("memroute.toml"), toml).expect("write version");
                let tmp = self.dir.join("..data_tmp");
                std::os::unix::fs::symlink(&name, &tmp).expect("..data_tmp");
                std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
                let link = self.file();
                if !std::fs::symlink_metadata(&link)
                    .map(|m| m.file_type().is_symlink())
                    .unwrap_or(false)
                {
                    // First swap: the plain file becomes the ConfigMap's symlink, atomically.
                    let tmp_link = self.dir.join("memroute.toml.link");
                    std::os::unix::fs::symlink("..data/memroute.toml", &tmp_link)
                        .expect("file symlink");
                    std::fs::rename(&tmp_link, &link).expect("replace the file by the link");
                }
                let _ = std::fs::remove_dir_all(old);
            }
        }
    }
}

/// Writes `toml` and waits until memroute logged one more `config reloaded`.
fn reload_by_file(proxy: &Memroute, config: &mut ConfigDir, how: Write, toml: &str) {
    let before = proxy.log_count("config reloaded");
    config.write(how, toml);
    assert!(
        proxy.wait_log_count("config reloaded", before + 1, DEADLINE),
        "no `config reloaded` within {DEADLINE:?} after a {how:?} write\n{}",
        proxy.log_text()
    );
}

/// The config for reload `round`: servers m1 and m2 always; m3 joins the pool, leaves it,
/// or serves a prefix route of its own, in turn. Each round's text is distinct.
fn config_for(round: usize, listen: &str, m: &[&Memcached; 3]) -> String {
    let (m1, m2, m3) = (m[0].addr(), m[1].addr(), m[2].addr());
    let head = format!("# reload round {round}\n");
    match round % 3 {
        0 => format!(
            "{head}{}{}",
            proxy_section(listen, "main"),
            pool_section("main", &[m1, m2], "")
        ),
        1 => format!(
            "{head}{}{}",
            proxy_section(listen, "main"),
            pool_section("main", &[m1, m2, m3], "")
        ),
        _ => format!(
            "{head}{}{}{}[routes.root]\ntype = \"prefix\"\nprefixes = {{ \"pfx:\" = \"side\" }}\ndefault = \"main\"\n",
            proxy_section(listen, "root"),
            pool_section("main", &[m1, m2], ""),
            pool_section("side", &[m3], "")
        ),
    }
}

/// Pipelined batches of sets and gets until `stop`; returns (replies, error replies).
fn pipelined_load(mut c: Conn, stop: Arc<AtomicBool>) -> (usize, Vec<String>) {
    const BATCH: usize = 50;
    let (mut replies, mut errors, mut batches) = (0usize, Vec::new(), 0usize);
    while batches < 5 || !stop.load(Ordering::SeqCst) {
        let mut request = Vec::new();
        for i in 0..BATCH {
            let key = if i % 5 == 0 {
                format!("pfx:{}", (batches + i) % 97)
            } else {
                format!("load{}", (batches * 7 + i) % 499)
            };
            if i % 2 == 0 {
                request.extend_from_slice(format!("set {key} 0 0 2\r\nok\r\n").as_bytes());
            } else {
                request.extend_from_slice(format!("get {key}\r\n").as_bytes());
            }
        }
        c.send(&request);
        for i in 0..BATCH {
            let reply = if i % 2 == 0 {
                c.read_line()
            } else {
                c.read_get_reply()
            };
            let fine = if i % 2 == 0 {
                reply == b"STORED\r\n"
            } else {
                parse_values(&reply).is_some()
            };
            if !fine {
                errors.push(show(&reply));
            }
            replies += 1;
        }
        batches += 1;
    }
    (replies, errors)
}

#[test]
fn fifty_file_reloads_under_pipelined_load_without_errors_or_reconnects() {
    let (m1, m2, m3) = (Memcached::start(), Memcached::start(), Memcached::start());
    let servers = [&m1, &m2, &m3];
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config_for(0, &listen, &servers));
    let dir = proxy
        .config_path()
        .parent()
        .map(Path::to_path_buf)
        .expect("config dir");
    let mut config = ConfigDir { dir, version: 0 };

    // Both servers that stay have their connection from memroute before counting starts.
    let keys: Vec<String> = (0..100).map(|i| format!("warm{i}")).collect();
    proxy.connect().set_many(&keys, |k| format!("v-{k}"));
    assert!(!m1.held(&keys).is_empty() && !m2.held(&keys).is_empty());
    let opened_before = [m1.stat("total_connections"), m2.stat("total_connections")];

    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let (c, stop) = (proxy.connect(), stop.clone());
        std::thread::spawn(move || pipelined_load(c, stop))
    };
    let ways = [Write::InPlace, Write::AtomicRename, Write::ConfigMapSwap];
    let started = Instant::now();
    for round in 1..=50 {
        // Plain-file writes first, then the ConfigMap layout (a plain file cannot come back
        // once memroute.toml is the ConfigMap's symlink): 17 in place, 17 renames, 16 swaps.
        let how = ways[((round - 1) * 3 / 50).min(2)];
        reload_by_file(
            &proxy,
            &mut config,
            how,
            &config_for(round, &listen, &servers),
        );
    }
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let (replies, errors) = client.join().expect("the load client panicked");
    assert!(
        errors.is_empty(),
        "{} error replies of {replies}, first: {}\n{}",
        errors.len(),
        errors[0],
        proxy.log_text()
    );
    // Each `stat` below opens one connection of its own (and counts it).
    let opened = [
        m1.stat("total_connections") - opened_before[0],
        m2.stat("total_connections") - opened_before[1],
    ];
    assert_eq!(
        opened,
        [1, 1],
        "memroute reconnected to servers that stayed in every config\n{}",
        proxy.log_text()
    );
    let log = proxy.log_text();
    assert_eq!(proxy.log_count("config reloaded"), 50, "{log}");
    assert!(log.contains("file change"), "{log}");
    assert_eq!(proxy.log_count("config reload rejected"), 0, "{log}");
    println!(
        "file watch: 50 reloads (in place, rename, ConfigMap swap) in {:.1} s under load; {replies} replies, 0 errors",
        took.as_secs_f64()
    );
}

#[test]
fn a_write_storm_is_debounced_and_a_bad_file_keeps_the_running_config() {
    let (m1, m2) = (Memcached::start(), Memcached::start());
    let listen = format!("127.0.0.1:{}", free_port());
    let one = simple_config(&listen, &[m1.addr()], "");
    let two = simple_config(&listen, &[m1.addr(), m2.addr()], "");
    let proxy = Memroute::start(&one);
    let path = proxy.config_path().to_path_buf();

    // 100 writes spread over about a second (paced to span several debounce periods: this
    // is the storm, not a wait for anything), the last one adding m2.
    let before = proxy.log_count("config reloaded");
    let storm = Instant::now();
    // Gaps between writes longer than the 100 ms quiet period: on a busy machine the 10 ms
    // pause can stretch past it, and then the debouncer rightly reloads in the gap.
    let mut quiet_gaps = 0;
    let mut last_write = Instant::now();
    for i in 0..100 {
        let text = if i == 99 { &two } else { &one };
        if i > 0 && last_write.elapsed() > Duration::from_millis(100) {
            quiet_gaps += 1;
        }
        std::fs::write(&path, format!("# write {i}\n{text}")).expect("storm write");
        last_write = Instant::now();
        std::thread::sleep(Duration::from_millis(10));
    }
    let storm_took = storm.elapsed();
    proxy.wait_stats("pool:main:servers == 2", DEADLINE, |s| {
        stat_u64(s, "pool:main:servers") == Some(2)
    });
    // The stats show the last write's pool as soon as the workers are handed it; its
    // `config reloaded` line follows once every worker has switched. Every reload started
    // ("reloading the config") ends in one of the two lines: wait for that, then count.
    let settled = || {
        proxy.log_count("config reloaded") + proxy.log_count("config reload rejected")
            >= proxy.log_count("reloading the config")
    };
    let deadline = Instant::now() + DEADLINE;
    while !settled() {
        assert!(
            Instant::now() < deadline,
            "a reload started and never finished\n{}",
            proxy.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let reloads = proxy.log_count("config reloaded") - before;
    println!(
        "file watch: 100 writes in {:.2} s ({quiet_gaps} gaps over 100 ms) -> {reloads} reloads",
        storm_took.as_secs_f64()
    );
    // One reload per second of storm (the 1 s max delay), one per quiet gap, and slack for
    // a half-written file read mid-storm.
    let allowed = 5 + storm_took.as_secs() as usize + quiet_gaps;
    assert!(
        (1..=allowed).contains(&reloads),
        "100 writes in {storm_took:?} ({quiet_gaps} gaps over 100 ms) gave {reloads} reloads, \
         more than {allowed} (debounce: 100 ms quiet, 1 s max)\n{}",
        proxy.log_text()
    );

    let mut c = proxy.connect();
    // A reload forced mid-storm (1 s max delay) may have read a half-written file and been
    // rejected: count rejections from here.
    let rejected_before = proxy.log_count("config reload rejected");
    let rejected = |n| {
        assert!(
            proxy.wait_log_count("config reload rejected", rejected_before + n, DEADLINE),
            "no rejection #{n}\n{}",
            proxy.log_text()
        );
    };
    let still_serving = |c: &mut Conn, key: &str| {
        c.set(key, b"kept");
        assert_eq!(c.get(key).as_deref(), Some(&b"kept"[..]));
        assert_eq!(
            stat_u64(&proxy.stats(), "pool:main:servers"),
            Some(2),
            "the running config changed"
        );
    };
    // Deleted.
    std::fs::remove_file(&path).expect("delete");
    rejected(1);
    assert!(proxy.log_text().contains("cannot read the config file"));
    still_serving(&mut c, "after-delete");
    // Emptied.
    std::fs::write(&path, "").expect("empty");
    rejected(2);
    still_serving(&mut c, "after-empty");
    // Invalid: every error named by its key path.
    std::fs::write(
        &path,
        two.replace(
            "distribution = \"ketama\"",
            "distribution = \"nope\"\ntimeout = \"-1s\"",
        ),
    )
    .expect("invalid");
    rejected(3);
    let log = proxy.log_text();
    assert!(
        log.contains("pools.main.distribution") && log.contains("pools.main.timeout"),
        "{log}"
    );
    still_serving(&mut c, "after-invalid");
    // Fixed: applied again.
    let before = proxy.log_count("config reloaded");
    std::fs::write(&path, &one).expect("fix");
    assert!(proxy.wait_log_count("config reloaded", before + 1, DEADLINE));
    proxy.wait_stats("pool:main:servers == 1", DEADLINE, |s| {
        stat_u64(s, "pool:main:servers") == Some(1)
    });
}

#[test]
fn sighup_reloads_with_the_watch_off() {
    let (m1, m2) = (Memcached::start(), Memcached::start());
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start_args(&simple_config(&listen, &[m1.addr()], ""), &["--no-watch"]);
    assert!(!proxy.log_text().contains("watching the config file"));
    assert!(proxy.reload(&simple_config(&listen, &[m1.addr(), m2.addr()], "")));
    let log = proxy.log_text();
    assert!(
        log.contains("trigger=SIGHUP") || log.contains("trigger=\"SIGHUP\""),
        "{log}"
    );
    assert_eq!(stat_u64(&proxy.stats(), "pool:main:servers"), Some(2));
    // SIGHUP with nothing changed: said so, nothing reloaded.
    let reloaded = proxy.log_count("config reloaded");
    proxy.signal("HUP");
    assert!(
        proxy.wait_log("nothing to do", DEADLINE),
        "{}",
        proxy.log_text()
    );
    assert_eq!(proxy.log_count("config reloaded"), reloaded);
}

#[test]
fn a_config_symlinked_from_another_directory_is_watched_where_it_lives() {
    let (m1, m2) = (Memcached::start(), Memcached::start());
    let listen = format!("127.0.0.1:{}", free_port());
    let one = simple_config(&listen, &[m1.addr()], "");
    let two = simple_config(&listen, &[m1.addr(), m2.addr()], "");
    // The real file lives in `real/`; memroute is given `link/memroute.toml -> real file`.
    let real = TempDir::new("watch-real");
    let target = real.write("memroute.toml", &one);
    let link_dir = TempDir::new("watch-link");
    let link = link_dir.path().join("memroute.toml");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let mut command = std::process::Command::new(memroute_binary());
    command.arg("--config").arg(&link);
    let proxy = Memroute::start_command(command, &one, link, link_dir);
    assert!(
        proxy.wait_log("symlink's target directory too", DEADLINE),
        "{}",
        proxy.log_text()
    );
    // An edit where the file really lives (in place: no event in the link's directory).
    let before = proxy.log_count("config reloaded");
    std::fs::write(&target, &two).expect("edit the target");
    assert!(
        proxy.wait_log_count("config reloaded", before + 1, DEADLINE),
        "{}",
        proxy.log_text()
    );
    proxy.wait_stats("pool:main:servers == 2", DEADLINE, |s| {
        stat_u64(s, "pool:main:servers") == Some(2)
    });
}
