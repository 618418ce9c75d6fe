use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RoutingError {
    #[error("unknown route target `{0}`")]
    UnknownTarget(String),
    #[error("pool `{0}` has no servers")]
    EmptyPool(String),
    #[error("route cycle through `{0}`")]
    Cycle(String),
}
