//! Importers: another proxy's config in, memroute TOML out. One module per source, each
//! with the same shape: read the foreign file, carry over what has an equivalent, list
//! everything else as a `# NOTE` naming where it was, then run the output through
//! [`crate::parse`] so what the user gets always loads.
pub mod mcrouter;
pub mod twemproxy;
