//! Raw serde types, exactly as written in the TOML file.
use crate::{Config, ConfigErrors};

#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct RawConfig {}

impl RawConfig {
    pub fn from_toml(text: &str) -> Result<RawConfig, ConfigErrors> {
        let _ = text;
        todo!("config helper implements")
    }
    pub fn validate(self) -> Result<Config, ConfigErrors> {
        todo!("config helper implements")
    }
}
