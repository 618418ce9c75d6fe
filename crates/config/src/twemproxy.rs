//! `memroute import-twemproxy nutcracker.yml`: translate a twemproxy config to memroute TOML.
use crate::ConfigErrors;

/// Returns the equivalent memroute TOML for a nutcracker YAML config.
pub fn import(yaml: &str) -> Result<String, ConfigErrors> {
    let _ = yaml;
    todo!("config helper implements")
}
