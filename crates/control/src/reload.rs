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

use memroute_config::Config;
use memroute_proxy::ProxyError;
use memroute_proxy::ReloadCounts;

/// What a reload acts on (the running proxy, `ProxyHandle`): this module decides whether
/// and how to reload, the proxy applies.
pub(crate) trait Reloadable {
    /// Whether a secret file (an authfile, a password file) of the running config changed.
    fn secrets_changed(&self) -> bool;
    /// Re-reads the TLS listeners' certificate files if they changed on disk.
    fn recheck_certificates(&self);
    /// Serves `config`; answers the restart-only settings that kept their running values.
    fn apply(&self, config: Config) -> Result<Vec<String>, ProxyError>;
    /// Records the text of the config file now running.
    fn set_config_source(&self, text: &str);
}

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

impl ReloadState {
    /// Reads `path` and has `proxy` serve it, unless it holds what the last reload read.
    /// Logs the outcome (every config error with its key path) and counts applied and
    /// rejected reloads. Never changes the running config on failure.
    pub(crate) fn reload_file(
        &self,
        proxy: &impl Reloadable,
        path: &Path,
        trigger: ReloadTrigger,
    ) -> ReloadOutcome {
        let state = self;
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
        let secrets_changed = trigger != ReloadTrigger::FileChanged && proxy.secrets_changed();
        if last_read.as_ref().map(|(read, _)| read) == Some(&bytes) && !secrets_changed {
            // The certificate files may have changed even though the config did not.
            proxy.recheck_certificates();
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
        match proxy.apply(config) {
            Ok(kept) => {
                state.counts.ok.fetch_add(1, Relaxed);
                let mut detail = format!("{pools} pools");
                for setting in &kept {
                    detail.push_str(&format!("\nkept (needs a restart): {setting}"));
                }
                state.counts.record(trigger_name, true, detail);
                proxy.set_config_source(&text);
                tracing::info!(config = %file, trigger = trigger_name, pools, "config reloaded");
                ReloadOutcome::Applied { kept }
            }
            Err(error) => reject(&mut last_read, error.to_string()),
        }
    }

    /// Tells reloads what the running config was read from, so an event that leaves the
    /// file as it was (a touch, a ConfigMap resync) is not a reload.
    pub(crate) fn loaded_from(&self, bytes: Vec<u8>) {
        *self.last_read.lock().unwrap_or_else(|e| e.into_inner()) = Some((bytes, None));
    }
}
