//! memroute-config: the TOML configuration.
//!
//! ```text
//!   text --toml/serde--> raw::RawConfig --validate()--> Config (checked)
//! ```
//!
//! `validate` reports *every* problem at once, each with the key path that is
//! wrong (`pools.main.servers[1].weight: must be > 0`). Leaf crate: no workspace deps.
#![forbid(unsafe_code)]

mod checked;
mod error;
pub mod raw;
pub mod transport;
pub mod twemproxy;

pub use checked::*;
pub use error::{ConfigError, ConfigErrors};
pub use transport::{BackendTls, ListenerTls, TransportConfig};

/// Parses and validates a config from TOML text.
pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let raw = raw::RawConfig::from_toml(text)?;
    raw.validate()
}

/// Reads, parses and validates a config file.
pub fn load(path: &std::path::Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors::single(ConfigError::new(
            "",
            format!("cannot read {}: {e}", path.display()),
        ))
    })?;
    parse(&text)
}
