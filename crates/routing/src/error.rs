use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RoutingError {
    #[error("unknown route target `{0}`")]
    UnknownTarget(String),
    #[error("pool `{0}` has no servers")]
    EmptyPool(String),
    #[error("route cycle through `{0}`")]
    Cycle(String),
    /// A replicated, failover or random route with no children would have nothing to
    /// answer with; validation rejects it too, but a table must never hold one.
    #[error("route `{0}` has no children")]
    NoChildren(String),
}
