//! Experiment for issue 10 item 3: the same minimal proxy on epoll and on io_uring.
//! See `main.rs` and docs/benchmarks.md ("io_uring (issue 10 item 3)").
pub mod core;
pub mod epoll;
pub mod uring;
