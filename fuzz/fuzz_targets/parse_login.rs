//! Fuzz target for `parse_login` (a client's ASCII login before it has logged in) and the
//! authfile reader: never panic, never consume more than was given or nothing while
//! answering, and never read a login's user or password from outside the bytes consumed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memroute_protocol::auth::{parse_login, sasl_plain, Authfile, Login};

fuzz_target!(|data: &[u8]| {
    match parse_login(data) {
        Login::Incomplete | Login::Close => {}
        Login::Answer { consumed, reply } => {
            assert!(consumed > 0 && consumed <= data.len());
            assert!(reply.starts_with(b"CLIENT_ERROR ") && reply.ends_with(b"\r\n"));
        }
        Login::Attempt {
            consumed,
            user,
            password,
        } => {
            assert!(consumed <= data.len());
            let within = |part: &[u8]| {
                let start = part.as_ptr() as usize - data.as_ptr() as usize;
                start + part.len() <= consumed
            };
            assert!(within(user) && within(password));
            assert!(!user.is_empty() && !password.is_empty());
        }
    }
    if let Ok(authfile) = Authfile::parse(data) {
        assert!(!authfile.is_empty());
    }
    let _ = sasl_plain(data);
});
