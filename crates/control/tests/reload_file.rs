//! `ProxyHandle::reload_file`: what reloads count, and which bytes they skip.
use std::sync::atomic::Ordering::Relaxed;

use memroute_control::{ReloadOutcome, ReloadTrigger};

/// A config file in a directory of its own, removed when dropped.
struct ConfigFile(std::path::PathBuf);

impl ConfigFile {
    fn new() -> ConfigFile {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "memroute-proxy-reload-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        ConfigFile(dir.join("memroute.toml"))
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A port nobody listens on now (the proxy binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn config_text(port: u16, servers: &str) -> String {
    format!(
        "[proxy]\nlisten = [\"127.0.0.1:{port}\"]\nworkers = 1\nroute = \"main\"\n\
         [pools.main]\nservers = [{servers}]\n"
    )
}

#[test]
fn reloads_are_counted_and_unchanged_bytes_are_skipped() {
    let file = ConfigFile::new();
    let port = free_port();
    let first = config_text(port, "\"127.0.0.1:1\"");
    std::fs::write(&file.0, &first).expect("write");
    let config = memroute_config::parse(&first).expect("valid");
    let handle = memroute_control::start(config).expect("start");
    handle.loaded_from(first.into_bytes());
    let counts = handle.reload_counts();
    let reload = |trigger| handle.reload_file(&file.0, trigger);

    assert_eq!(reload(ReloadTrigger::FileChanged), ReloadOutcome::Unchanged);
    std::fs::write(
        &file.0,
        config_text(port, "\"127.0.0.1:1\", \"127.0.0.1:2\""),
    )
    .expect("write");
    assert_eq!(
        reload(ReloadTrigger::FileChanged),
        ReloadOutcome::Applied { kept: Vec::new() }
    );
    assert_eq!(reload(ReloadTrigger::Signal), ReloadOutcome::Unchanged);
    assert_eq!((counts.ok(), counts.failed()), (1, 0));

    std::fs::write(&file.0, config_text(port, "\"127.0.0.1:1:0\"")).expect("write");
    assert!(
        matches!(reload(ReloadTrigger::Admin), ReloadOutcome::Rejected(r) if r.contains("invalid config"))
    );
    // Asked again, the same bytes are still rejected (the running config is not the
    // file), and not counted twice.
    assert!(
        matches!(reload(ReloadTrigger::Signal), ReloadOutcome::Rejected(r) if r.contains("unchanged since it was rejected") && r.contains("invalid config"))
    );
    // A restart-only change applies the rest and says what it kept.
    std::fs::write(
        &file.0,
        config_text(port, "\"127.0.0.1:1\"").replace("workers = 1", "workers = 3"),
    )
    .expect("write");
    assert!(
        matches!(reload(ReloadTrigger::Admin), ReloadOutcome::Applied { kept } if kept.len() == 1 && kept[0].starts_with("proxy.workers"))
    );
    std::fs::write(&file.0, "").expect("empty");
    assert!(matches!(
        reload(ReloadTrigger::FileChanged),
        ReloadOutcome::Rejected(_)
    ));
    std::fs::remove_file(&file.0).expect("delete");
    assert!(
        matches!(reload(ReloadTrigger::FileChanged), ReloadOutcome::Rejected(r) if r.contains("cannot read"))
    );
    assert_eq!((counts.ok(), counts.failed()), (2, 3));

    handle.shutdown();
    handle.join();
}
