//! Watching the config file so an edit reaches memroute without a signal.
//!
//! ```text
//!   inotify (notify crate) on the config file's DIRECTORY
//!     -> every event but reads (opens and closes without writing: memroute's own reads)
//!     -> debounce thread: first event, then wait until QUIET passes without one (at most
//!        MAX_DELAY after the first) -> one message to the main thread -> reload_file()
//! ```
//!
//! The directory, not the file, because the file's inode does not survive the ways configs
//! are replaced: an atomic rename (`mv new memroute.toml`) swaps the directory entry, and a
//! Kubernetes ConfigMap volume updates by renaming a `..data` symlink to a new timestamped
//! directory (`memroute.toml -> ..data/memroute.toml`), so no event ever names the file
//! itself. Any change in the directory asks for a reload; the reload reads the file and does
//! nothing when its bytes are those it read last, so unrelated files cost one read.
//!
//! Debouncing bounds the work of a storm (an editor's several writes, a script rewriting the
//! file in a loop): at most one reload per QUIET period of silence, and never more than
//! MAX_DELAY late under continuous writes, so the last write is always picked up.
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use notify::{EventKind, RecursiveMode, Watcher as _};

/// A reload waits until the directory has been quiet this long...
const QUIET: Duration = Duration::from_millis(100);
/// ...but never longer than this after the first event of a burst.
const MAX_DELAY: Duration = Duration::from_secs(1);

/// A running watch; dropping it stops the events (the debounce thread then ends).
#[allow(dead_code)] // Held only to keep the inotify watch alive.
pub struct ConfigWatch(notify::RecommendedWatcher);

impl std::fmt::Debug for ConfigWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigWatch")
    }
}

/// The directory holding `config` (`.` for a bare file name).
fn directory_of(config: &Path) -> PathBuf {
    match config.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Starts watching `config`'s directory; `changed` gets one message per debounced burst.
pub fn start(
    config: &Path,
    changed: tokio::sync::mpsc::UnboundedSender<()>,
) -> anyhow::Result<ConfigWatch> {
    let directory = directory_of(config);
    let (events, bursts) = mpsc::channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            // Opening and closing without writing is a read (ours, at each reload): not a
            // change. A close after writing is the end of an in-place edit: a change.
            Ok(event)
                if matches!(
                    event.kind,
                    EventKind::Access(
                        notify::event::AccessKind::Open(_)
                            | notify::event::AccessKind::Read
                            | notify::event::AccessKind::Close(notify::event::AccessMode::Read)
                    )
                ) => {}
            Ok(_) => {
                let _ = events.send(());
            }
            Err(error) => tracing::warn!(%error, "config watch error"),
        }
    })
    .context("cannot start watching the config file")?;
    watcher
        .watch(&directory, RecursiveMode::NonRecursive)
        .with_context(|| format!("cannot watch {}", directory.display()))?;
    // A config that is a symlink to a file elsewhere (`/etc/memroute.toml ->
    // /srv/config/memroute.toml`) changes where it really lives: watch that directory too.
    // Not for a ConfigMap, whose target (`..2024_01_01.../memroute.toml`) sits under the
    // directory already watched and is replaced, never edited.
    if let Some(target) = std::fs::canonicalize(config)
        .ok()
        .map(|real| directory_of(&real))
        .filter(|real| !real.starts_with(std::fs::canonicalize(&directory).unwrap_or_default()))
    {
        match watcher.watch(&target, RecursiveMode::NonRecursive) {
            Ok(()) => {
                tracing::info!(directory = %target.display(), "watching the config symlink's target directory too")
            }
            Err(error) => {
                tracing::warn!(directory = %target.display(), %error, "cannot watch the config symlink's target directory; edits there need SIGHUP")
            }
        }
    }
    std::thread::Builder::new()
        .name("memroute-config-watch".to_string())
        .spawn(move || debounce(bursts, changed))
        .context("cannot start the config watch thread")?;
    tracing::info!(directory = %directory.display(), "watching the config file's directory for changes");
    Ok(ConfigWatch(watcher))
}

/// Turns bursts of events into one message each; ends when either side is gone.
fn debounce(events: mpsc::Receiver<()>, changed: tokio::sync::mpsc::UnboundedSender<()>) {
    while events.recv().is_ok() {
        let latest = Instant::now() + MAX_DELAY;
        loop {
            let wait = QUIET.min(latest.saturating_duration_since(Instant::now()));
            match events.recv_timeout(wait) {
                Ok(()) if Instant::now() < latest => continue,
                Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
        if changed.send(()).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_of_a_bare_name_is_the_current_one() {
        assert_eq!(directory_of(Path::new("memroute.toml")), Path::new("."));
        assert_eq!(
            directory_of(Path::new("/etc/memroute/memroute.toml")),
            Path::new("/etc/memroute")
        );
    }

    #[test]
    fn a_burst_becomes_one_message_and_a_storm_is_bounded() {
        let (events, bursts) = mpsc::channel();
        let (changed, mut reloads) = tokio::sync::mpsc::unbounded_channel();
        let thread = std::thread::spawn(move || debounce(bursts, changed));
        for _ in 0..20 {
            events.send(()).expect("debounce thread runs");
        }
        // One message for the burst, once it has been quiet.
        assert_eq!(reloads.blocking_recv(), Some(()));
        drop(events);
        thread.join().expect("debounce thread");
        assert!(reloads.try_recv().is_err(), "one burst, one reload");
    }
}
