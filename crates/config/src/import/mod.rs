//! Importers: another proxy's config in, memroute TOML out. One module per source, each
//! with the same shape: read the foreign file, carry over what has an equivalent, list
//! everything else as a `# NOTE` naming where it was, then run the output through
//! [`crate::parse`] so what the user gets always loads.
pub mod mcrouter;
pub mod twemproxy;

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
