//! Config errors: one problem at a key path, and the list of all problems in a file.
use std::fmt;
use thiserror::Error;

/// What kind of problem a [`ConfigError`] is, for code and tests that act on it; the
/// message says the same to a person, in more words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The text is not TOML (or an imported file not YAML or JSON); the path is where.
    Syntax,
    /// The file cannot be read.
    File,
    /// A key its table does not have (`pools.main.hashh`).
    UnknownKey,
    /// A value of the wrong type (a string where a number belongs).
    WrongType,
    /// A required key, section or entry is absent, or a list that needs one is empty.
    Missing,
    /// A number, size or duration outside its range.
    OutOfRange,
    /// A value of the right type that means nothing valid (an address, a name, a spelling).
    Invalid,
    /// Settings that exclude each other or must differ, or one thing given twice.
    Conflict,
    /// A target that no pool or route is named.
    UnknownTarget,
    /// Routes that refer to each other round a circle.
    Circle,
}

/// One problem in a config, at a key path (`pools.main.servers[1].weight`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct ConfigError {
    pub path: String,
    pub kind: ErrorKind,
    pub message: String,
}

impl ConfigError {
    pub fn new(kind: ErrorKind, path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            path: path.into(),
            kind,
            message: message.into(),
        }
    }
}

/// Every problem found in one config, all at once.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    pub fn single(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }

    /// Each problem as (key path, kind), in the order found: what a test that does not
    /// pin the wording compares.
    pub fn kinds(&self) -> Vec<(&str, ErrorKind)> {
        self.0.iter().map(|e| (e.path.as_str(), e.kind)).collect()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}
