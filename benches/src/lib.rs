//! memroute-benches: support code for the criterion benches and the end-to-end
//! load generator (`memroute-load`, driven by `scripts/bench`).
//!
//! `unsafe` is denied everywhere but `clock` (timerfd, clock_gettime, prctl for the open
//! loop's pacing), which says why.
#![deny(unsafe_code)]

pub mod clock;
pub mod hist;
pub mod open_loop;
