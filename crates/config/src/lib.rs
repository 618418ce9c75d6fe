//! memroute-config: the TOML configuration.
//!
//! ```text
//!   text --toml/serde--> raw::RawConfig --validate()--> Config (checked)
//! ```
//!
//! `validate` reports *every* problem at once, each with the key path that is
//! wrong (`pools.main.servers[1].weight: must be > 0`). Builds memroute-routing's spec
//! ([`Config::routing_spec`]), and takes memroute-protocol's limits and expiry rule for its
//! defaults and checks: the two workspace crates it depends on, both sans-I/O.
//!
//! Modules import one way:
//!
//! ```text
//!   raw (RawConfig, each section's checks) --> transport (TLS / TFO checks) --> walk (TOML
//!    |                                              |                          getters, Errors)
//!    '--------------------------------------------->+--> checked (the validated types)
//!                                                              '--> defaults
//!   raw --> auth (pool logins, listener authfiles) --> walk, checked
//!   raw --> routing_prefixes (routing_prefixes, routing_prefix, keep_routing_prefix) --> walk, checked
//!   spec (Config -> routing's spec) --> checked        import/ --> raw, load (parse()),
//!                                                                 checked (pools_reached)
//!   load (parse, load) --> raw
//! ```
//!
//! lib.rs only declares and re-exports: an item defined here would be above every module
//! that uses it and below the re-exports, a circle (tests/tests/layers.rs finds those).
#![forbid(unsafe_code)]

mod auth;
mod checked;
pub mod defaults;
mod error;
pub mod import;
mod load;
pub mod raw;
mod redact;
mod routing_prefixes;
mod spec;
mod transport;
mod walk;
/// Kept at its old path for callers from before importers had their own module.
pub use import::twemproxy;

pub use auth::login_word_problem;
pub use checked::*;
pub use error::{ConfigError, ConfigErrors, ErrorKind};
pub use load::{load, parse};
pub use redact::redacted;
