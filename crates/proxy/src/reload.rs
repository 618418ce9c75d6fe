//! Reloading from the config file: the one path every trigger takes (SIGHUP, the file
//! watcher, an admin request), so they log, count and skip repeats the same way.
//!
//! ```text
//!   SIGHUP ----------+
//!   file watcher ----+--> reload_file(path, trigger)
//!   POST /reload ----+      read -> same bytes as the last attempt? -> Unchanged (nothing logged
//!                           |                                          above debug, not counted)
//!                           parse + validate -> errors: each logged with its key path,
//!                           |                   Rejected, `failed` + 1, running config kept
//!                           ProxyHandle::reload -> Applied, `ok` + 1 (or Rejected, `failed` + 1)
//! ```
//!
//! Skipping an unchanged file matters because one edit reaches memroute more than once: an
//! editor's write fires several file events, a Kubernetes ConfigMap update is a handful of
//! renames, and an operator may send SIGHUP after the watcher already applied the change.
//! A deleted or emptied file is a rejected reload like any invalid one: the running config
//! stays and the reason is logged.
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use crate::counters::ReloadCounts;
use crate::ProxyHandle;

/// What asked for a reload (named in the log lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadTrigger {
    /// SIGHUP.
    Signal,
    /// The config file (or its directory: an atomic rename, a ConfigMap swap) changed.
    FileChanged,
    /// An admin request.
    Admin,
}

impl ReloadTrigger {
    fn as_str(self) -> &'static str {
        match self {
            ReloadTrigger::Signal => "SIGHUP",
            ReloadTrigger::FileChanged => "file change",
            ReloadTrigger::Admin => "admin request",
        }
    }
}

/// How a reload ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The new config is being served, but for the restart-only settings it changed,
    /// which keep their running values (`key: why`, each also logged).
    Applied { kept: Vec<String> },
    /// The file holds exactly what the running config was read from: nothing to do.
    Unchanged,
    /// The file could not be read, did not validate, or could not be routed; the running
    /// config stays. The reason, as logged.
    Rejected(String),
}

/// What reloads remember between calls.
#[derive(Debug, Default)]
pub(crate) struct ReloadState {
    /// The bytes the last reload read, and why they were rejected (`None`: they are
    /// running); `None` until the first one.
    last_read: Mutex<Option<(Vec<u8>, Option<String>)>>,
    pub(crate) counts: Arc<ReloadCounts>,
}

impl ProxyHandle {
    /// Reads `path` and serves it, unless it holds what the last reload read. Logs the
    /// outcome (every config error with its key path) and counts applied and rejected
    /// reloads. Never changes the running config on failure.
    pub fn reload_file(&self, path: &Path, trigger: ReloadTrigger) -> ReloadOutcome {
        let state = &self.reload_state;
        // Held for the whole reload: two triggers at once apply one after the other, and
        // the second sees the first's bytes.
        let mut last_read = state.last_read.lock().unwrap_or_else(|e| e.into_inner());
        let file = path.display();
        let trigger_name = trigger.as_str();
        let reject = |last_read: &mut Option<(Vec<u8>, Option<String>)>, reason: String| {
            if let Some((_, rejected)) = last_read.as_mut() {
                *rejected = Some(reason.clone());
            }
            state.counts.failed.fetch_add(1, Relaxed);
            state.counts.record(trigger_name, false, reason.clone());
            tracing::error!(config = %file, trigger = trigger_name, "config reload rejected: {reason}; keeping the running config");
            ReloadOutcome::Rejected(reason)
        };
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            // Not remembered: the file coming back with the old bytes is not a change.
            Err(error) => {
                return reject(&mut None, format!("cannot read the config file: {error}"))
            }
        };
        if let Some((read, Some(rejected))) = &*last_read {
            if read == &bytes {
                // Not a new reload (nothing counted): the same bytes, the same answer. The
                // running config is still not this file.
                tracing::info!(config = %file, trigger = trigger_name, "config unchanged since it was rejected; keeping the running config");
                return ReloadOutcome::Rejected(format!(
                    "the file is unchanged since it was rejected: {rejected}"
                ));
            }
        }
        // A SIGHUP or POST /reload re-reads the secret files (authfiles, password files)
        // even when the config file is as it was: they change on their own (a rotated
        // Kubernetes Secret).
        let secrets_changed = trigger != ReloadTrigger::FileChanged
            && crate::credentials::changed_since(&self.controller.current());
        if last_read.as_ref().map(|(read, _)| read) == Some(&bytes) && !secrets_changed {
            // The certificate files may have changed even though the config did not.
            self.recheck_certificates();
            tracing::debug!(config = %file, trigger = trigger_name, "config unchanged since the last reload");
            if trigger != ReloadTrigger::FileChanged {
                tracing::info!(config = %file, trigger = trigger_name, "config unchanged since the last reload; nothing to do");
            }
            return ReloadOutcome::Unchanged;
        }
        *last_read = Some((bytes.clone(), None));
        tracing::info!(config = %file, trigger = trigger_name, "reloading the config");
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(_) => return reject(&mut last_read, "the config file is not UTF-8".to_string()),
        };
        let config = match memroute_config::parse(&text) {
            Ok(mut config) => {
                config.resolve_paths(path.parent().unwrap_or(Path::new(".")));
                config.resolve_zone_from_environment();
                config
            }
            Err(errors) => {
                for error in &errors.0 {
                    tracing::error!(config = %file, "config error: {error}");
                }
                return reject(
                    &mut last_read,
                    format!("invalid config ({} errors):\n{errors}", errors.0.len()),
                );
            }
        };
        let pools = config.pools.len();
        match self.reload_inner(config) {
            Ok(kept) => {
                state.counts.ok.fetch_add(1, Relaxed);
                let mut detail = format!("{pools} pools");
                for setting in &kept {
                    detail.push_str(&format!("\nkept (needs a restart): {setting}"));
                }
                state.counts.record(trigger_name, true, detail);
                self.set_config_source(&text);
                tracing::info!(config = %file, trigger = trigger_name, pools, "config reloaded");
                ReloadOutcome::Applied { kept }
            }
            Err(error) => reject(&mut last_read, error.to_string()),
        }
    }

    /// Applied and rejected reloads since start.
    pub fn reload_counts(&self) -> Arc<ReloadCounts> {
        self.reload_state.counts.clone()
    }

    /// Tells reloads what the running config was read from, so an event that leaves the
    /// file as it was (a touch, a ConfigMap resync) is not a reload.
    pub fn loaded_from(&self, bytes: Vec<u8>) {
        // `/config` shows it and `memroute_config_info` exports its hash.
        if let Ok(text) = std::str::from_utf8(&bytes) {
            self.set_config_source(text);
        }
        *self
            .reload_state
            .last_read
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((bytes, None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let handle = crate::start(config).expect("start");
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
}
