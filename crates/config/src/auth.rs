//! `auth` tables: the login memroute gives a pool's servers, and the authfile a listener's
//! clients must log in against.
//!
//! ```toml
//! [pools.main]
//! auth = { username = "memroute", password_file = "/run/secrets/memcached-password" }
//! [proxy]
//! listen = [{ address = "0.0.0.0:11211", auth = { authfile = "/etc/memroute/authfile" } }]
//! ```
use std::path::PathBuf;

use toml::Value;

use crate::checked::{BackendAuth, ListenerAuth, Password};
use crate::walk::{check_keys, get_str, join, wrong_type, Errors};
use crate::ErrorKind;

const BACKEND_AUTH_KEYS: &[&str] = &["username", "password", "password_file"];
const LISTENER_AUTH_KEYS: &[&str] = &["authfile"];

/// Why a user name or password cannot go in memcached's login: it is the data block
/// `user password`, and memcached splits it at spaces; a CR or LF would end the block.
pub fn login_word_problem(word: &str) -> Option<&'static str> {
    if word.is_empty() {
        Some("must not be empty")
    } else if word.bytes().any(|b| matches!(b, b' ' | b'\r' | b'\n' | 0)) {
        Some("must not contain spaces, CR, LF or NUL (memcached's login splits at spaces)")
    } else {
        None
    }
}

/// `[pools.X] auth = { username, password | password_file }`.
pub(crate) fn check_backend_auth(v: &Value, path: &str, errs: &mut Errors) -> Option<BackendAuth> {
    let Value::Table(t) = v else {
        wrong_type(errs, path, "a table { username, password_file }", v);
        return None;
    };
    check_keys(t, path, BACKEND_AUTH_KEYS, errs);
    let username = get_str(t, "username", path, errs);
    if username.is_none() && !t.contains_key("username") {
        errs.push(ErrorKind::Missing, &join(path, "username"), "required");
    }
    if let Some(problem) = username.and_then(login_word_problem) {
        errs.push(ErrorKind::Invalid, &join(path, "username"), problem);
    }
    let inline = get_str(t, "password", path, errs);
    let file = get_str(t, "password_file", path, errs);
    let password = match (inline, file) {
        (Some(_), Some(_)) => {
            errs.push(
                ErrorKind::Conflict,
                path,
                "set password or password_file, not both",
            );
            None
        }
        (None, None) => {
            errs.push(
                ErrorKind::Missing,
                &join(path, "password_file"),
                "required (or password; a file keeps the secret out of the config)",
            );
            None
        }
        (Some(password), None) => match login_word_problem(password) {
            Some(problem) => {
                errs.push(ErrorKind::Invalid, &join(path, "password"), problem);
                None
            }
            None => Some(Password::Inline(password.to_string())),
        },
        (None, Some("")) => {
            errs.push(
                ErrorKind::Invalid,
                &join(path, "password_file"),
                "must not be empty",
            );
            None
        }
        (None, Some(file)) => Some(Password::File(PathBuf::from(file))),
    };
    Some(BackendAuth {
        username: username?.to_string(),
        password: password?,
        key_path: path.to_string(),
    })
}

/// `auth = { authfile = "..." }` on a listen entry.
pub(crate) fn check_listener_auth(
    v: &Value,
    path: &str,
    errs: &mut Errors,
) -> Option<ListenerAuth> {
    let Value::Table(t) = v else {
        wrong_type(errs, path, "a table { authfile }", v);
        return None;
    };
    check_keys(t, path, LISTENER_AUTH_KEYS, errs);
    let authfile = get_str(t, "authfile", path, errs);
    match authfile {
        None if !t.contains_key("authfile") => {
            errs.push(
                ErrorKind::Missing,
                &join(path, "authfile"),
                "required (memcached's -Y file: user:password lines)",
            );
            None
        }
        Some("") => {
            errs.push(
                ErrorKind::Invalid,
                &join(path, "authfile"),
                "must not be empty",
            );
            None
        }
        None => None,
        Some(file) => Some(ListenerAuth {
            authfile: PathBuf::from(file),
            key_path: join(path, "authfile"),
        }),
    }
}
