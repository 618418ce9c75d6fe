//! Importers: another proxy's config in, memroute TOML out. One module per source, each
//! with the same shape: read the foreign file, carry over what has an equivalent, list
//! everything else as a `# NOTE` naming where it was, then run the output through
//! [`crate::parse`] so what the user gets always loads.
pub mod mcrouter;
pub mod twemproxy;

use crate::{ConfigError, ConfigErrors};

/// Returns `text` if memroute loads it. If it does not, that is a bug in the importer or a
/// value its checks let through (a bad address, say): the errors are reported, marked as
/// being in the generated file, rather than a file that will not start being printed.
pub(crate) fn checked(text: String) -> Result<String, ConfigErrors> {
    match crate::parse(&text) {
        Ok(_) => Ok(text),
        Err(ConfigErrors(errors)) => Err(ConfigErrors(
            errors
                .into_iter()
                .map(|e| {
                    ConfigError::new(
                        e.kind,
                        e.path,
                        format!("{} (in the imported config)", e.message),
                    )
                })
                .collect(),
        )),
    }
}

/// Appends `# NOTE: ...` wrapped at about 90 columns, continuation lines indented.
pub(crate) fn push_note(out: &mut String, note: &str) {
    let mut line = String::from("# NOTE:");
    for word in note.split_whitespace() {
        if line.len() + 1 + word.len() > 90 && line.len() > "#   ".len() {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#  ");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

/// What an mcrouter import's `[admin]` section stands for (mcrouter has no such port).
pub(crate) const MCROUTER_ADMIN_NOTE: &str = "mcrouter has no HTTP port (its stats are \
    `__mcrouter__` gets and --stats-root files); memroute's admin port answers /metrics \
    (Prometheus), /ready, /state and the panel at /. Listening on 127.0.0.1 keeps it on this \
    host; pick the address a collector elsewhere can reach.";

/// Appends the `[admin]` section an imported config ends with: without one a migrated proxy
/// has no `/metrics`, `/ready` or panel. `note` says what the old proxy had in its place.
pub(crate) fn push_admin(out: &mut String, address: &str, note: &str) {
    out.push('\n');
    push_note(out, note);
    out.push_str("[admin]\n");
    out.push_str(&format!("listen = \"{address}\"\n"));
}
