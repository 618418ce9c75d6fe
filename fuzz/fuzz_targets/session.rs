//! A whole client session over a scripted backend that may answer garbage, stall or close
//! (`memroute_proxy::fuzzing`): the session must not panic, must finish once the client
//! has sent everything (every request answered by the backend or by a 20 ms timeout), must
//! write only framed replies, and must not write without bound.
//!
//! Input layout: byte 0 picks what the backend does after answering (close, stall, repeat
//! per read), bytes 1-2 (little endian) the length of its answer, which follows; the rest is
//! the client's stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memroute_proxy::fuzzing::{check_framed, run, Case};

fuzz_target!(|data: &[u8]| {
    let case = Case::from_bytes(data);
    let outcome = run(&case);
    assert!(outcome.finished, "the session did not finish: {case:?}");
    if let Err(reason) = check_framed(&outcome.output) {
        panic!("unframed output: {reason}");
    }
    // memroute's own replies are bounded per request (`stats` is the longest, a few KB,
    // for 7 input bytes); a backend's are bounded by what it sent, once per request.
    let requests = case.client.len() + 1;
    let bound = requests * (8 * 1024 + case.backend_reply.len());
    assert!(
        outcome.output.len() <= bound,
        "{} bytes written for {} client bytes",
        outcome.output.len(),
        case.client.len()
    );
});
