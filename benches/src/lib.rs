//! memroute-benches: the end-to-end load generator (`memroute-load`, driven by
//! `scripts/bench`) and its support code, and the allocation-count bench; the criterion
//! micro-benchmarks are in benches/micro (package memroute-microbench).
//!
//! `unsafe` is denied everywhere but `clock` (timerfd, clock_gettime, prctl for the open
//! loop's pacing), which says why.
#![deny(unsafe_code)]

pub mod clock;
pub mod hist;
pub mod open_loop;
