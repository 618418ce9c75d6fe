//! memroute-config: the TOML configuration.
//!
//! ```text
//!   text --toml/serde--> raw::RawConfig --validate()--> Config (checked)
//! ```
//!
//! `validate` reports *every* problem at once, each with the key path that is
//! wrong (`pools.main.servers[1].weight: must be > 0`). Builds memroute-routing's spec
//! ([`Config::routing_spec`]): the one workspace crate it depends on.
//!
//! Modules import one way:
//!
//! ```text
//!   raw (RawConfig, each section's checks) --> transport (TLS / TFO checks) --> walk (TOML
//!    |                                              |                          getters, Errors)
//!    '--------------------------------------------->+--> checked (the validated types)
//!                                                              '--> defaults
//!   raw --> auth (pool logins, listener authfiles) --> walk, checked
//!   spec (Config -> routing's spec) --> checked        import/ --> raw, parse()
//! ```
#![forbid(unsafe_code)]

mod auth;
mod checked;
pub mod defaults;
mod error;
pub mod import;
pub mod raw;
mod redact;
mod spec;
mod transport;
mod walk;
/// Kept at its old path for callers from before importers had their own module.
pub use import::twemproxy;

pub use auth::login_word_problem;
pub use checked::*;
pub use error::{ConfigError, ConfigErrors};
pub use redact::redacted;

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
