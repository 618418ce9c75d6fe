//! memroute-benches: support code for the criterion benches and the end-to-end
//! load generator (`memroute-load`, driven by `scripts/bench`).
#![forbid(unsafe_code)]

pub mod hist;
