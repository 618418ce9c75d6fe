//! The entry points: a config from TOML text or from a file, checked. Its own module so the
//! importers, which check what they write with [`parse`], import it without importing the
//! crate root (which re-exports them).
use crate::{raw, Config, ConfigError, ConfigErrors, ErrorKind};

/// Parses and validates a config from TOML text.
pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let raw = raw::RawConfig::from_toml(text)?;
    raw.validate()
}

/// Reads, parses and validates a config file.
pub fn load(path: &std::path::Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors::single(ConfigError::new(
            ErrorKind::File,
            "",
            format!("cannot read {}: {e}", path.display()),
        ))
    })?;
    parse(&text)
}
