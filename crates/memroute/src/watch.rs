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
//! itself. An event asks for a reload when it names the config's own file name, the file a
//! symlinked config resolves to, or `..data` (the ConfigMap swap), or when inotify lost events
//! (a rescan); other files in the directory (logs, editors' swap files, sibling configs) are
//! ignored. A reload that reads the same bytes as last time does nothing.
//!
//! Debouncing bounds the work of a storm (an editor's several writes, a script rewriting the
//! file in a loop): at most one reload per QUIET period of silence, and never more than
//! MAX_DELAY late under continuous writes, so the last write is always picked up.
use std::ffi::{OsStr, OsString};
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

/// The file names whose events ask for a reload: the config's own, the file it resolves
/// to when it is a symlink (`memroute.toml -> real.toml`, or a file in another directory),
/// and `..data`, the symlink a Kubernetes ConfigMap volume renames to publish an update.
fn names_of(config: &Path) -> Vec<OsString> {
    let mut names: Vec<OsString> = [Some(config), std::fs::canonicalize(config).ok().as_deref()]
        .into_iter()
        .flatten()
        .filter_map(|path| path.file_name().map(OsStr::to_os_string))
        .collect();
    names.push(OsString::from("..data"));
    names.sort();
    names.dedup();
    names
}

/// Whether `event` may have changed the config: it names one of `names`, or it names no
/// file at all (inotify's queue overflowed and events were lost: assume the worst).
fn concerns_config(event: &notify::Event, names: &[OsString]) -> bool {
    event.need_rescan()
        || event.paths.is_empty()
        || event.paths.iter().any(|path| {
            path.file_name()
                .is_some_and(|name| names.iter().any(|wanted| wanted == name))
        })
}

/// Starts watching `config`'s directory; `changed` gets one message per debounced burst.
pub fn start(
    config: &Path,
    changed: tokio::sync::mpsc::UnboundedSender<()>,
) -> anyhow::Result<ConfigWatch> {
    let directory = directory_of(config);
    let names = names_of(config);
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
            Ok(event) if concerns_config(&event, &names) => {
                let _ = events.send(());
            }
            Ok(_) => {}
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

    fn event(kind: EventKind, paths: &[&str]) -> notify::Event {
        paths.iter().fold(notify::Event::new(kind), |event, path| {
            event.add_path(PathBuf::from(path))
        })
    }

    #[test]
    fn only_events_that_name_the_config_ask_for_a_reload() {
        use notify::event::{CreateKind, ModifyKind, RenameMode};
        let names = names_of(Path::new("/etc/memroute/memroute.toml"));
        let write = EventKind::Modify(ModifyKind::Any);
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        // An in-place edit, an atomic rename over the file, a ConfigMap's `..data` swap.
        assert!(concerns_config(
            &event(write, &["/etc/memroute/memroute.toml"]),
            &names
        ));
        assert!(concerns_config(
            &event(
                rename,
                &[
                    "/etc/memroute/.memroute.toml.swp",
                    "/etc/memroute/memroute.toml"
                ]
            ),
            &names
        ));
        assert!(concerns_config(
            &event(
                rename,
                &["/etc/memroute/..data_tmp", "/etc/memroute/..data"]
            ),
            &names
        ));
        // Lost events: reload to be safe.
        assert!(concerns_config(&event(EventKind::Other, &[]), &names));
        // A log, a sibling config, an editor's swap file: not ours.
        assert!(!concerns_config(
            &event(write, &["/etc/memroute/access.log"]),
            &names
        ));
        assert!(!concerns_config(
            &event(
                EventKind::Create(CreateKind::File),
                &["/etc/memroute/other.toml"]
            ),
            &names
        ));
        assert!(!concerns_config(
            &event(write, &["/etc/memroute/.memroute.toml.swp"]),
            &names
        ));
    }

    #[test]
    fn a_symlinked_config_is_known_by_the_name_it_resolves_to() {
        let dir = std::env::temp_dir().join(format!("memroute-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("real.toml"), "").expect("real file");
        let link = dir.join("memroute.toml");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("real.toml", &link).expect("symlink");
        let names = names_of(&link);
        std::fs::remove_dir_all(&dir).expect("clean up");
        let write = EventKind::Modify(notify::event::ModifyKind::Any);
        assert!(concerns_config(&event(write, &["/x/real.toml"]), &names));
        assert!(concerns_config(
            &event(write, &["/x/memroute.toml"]),
            &names
        ));
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
