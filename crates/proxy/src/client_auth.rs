//! A listener's login gate: until a client has logged in, its requests are answered here
//! (as memcached started with `-Y` or `-S` answers them) and never reach a route or a
//! backend connection; once it has, they pass untouched.
//!
//! ```text
//!   text (framing.rs, `login`):   parse_login -> "CLIENT_ERROR unauthenticated" | login: STORED / "CLIENT_ERROR
//!           authentication failure" | close (2 KiB without a newline)
//!   binary: SASL_LIST_MECHS -> "PLAIN"; SASL_AUTH PLAIN -> "Authenticated" / Auth failure;
//!           VERSION answered; anything else -> Auth failure, and the connection closes
//!           (binary.rs renders these)
//! ```
//!
//! A listener without `auth` has no gate (`LoginGate::open` is true at once): a client's
//! login `set` is then a plain `set`, as memcached without `-Y` reads it, and its SASL
//! frames get memcached's "Unknown command".
use std::cell::Cell;

use memroute_protocol::auth::Authfile;

use crate::client_log::{self, ClientEvent, Peer};
use crate::context::WorkerContext;

/// One session's login state for one batch of requests: the listener's authfile (from the
/// batch's routing snapshot, so a reload that turns a login on applies to the next batch)
/// and whether this client has logged in (kept by the session while it is idle).
#[derive(Debug)]
pub(crate) struct LoginGate<'a> {
    authfile: Option<&'a Authfile>,
    logged_in: Cell<bool>,
}

impl<'a> LoginGate<'a> {
    pub(crate) fn new(authfile: Option<&'a Authfile>, logged_in: bool) -> LoginGate<'a> {
        LoginGate {
            authfile,
            logged_in: Cell::new(logged_in),
        }
    }

    /// Whether requests pass: the listener wants no login, or the client has logged in.
    #[inline]
    pub(crate) fn open(&self) -> bool {
        self.authfile.is_none() || self.logged_in.get()
    }

    /// Whether the client has logged in (the session keeps this while idle).
    pub(crate) fn logged_in(&self) -> bool {
        self.logged_in.get()
    }

    /// Whether the listener takes logins at all (SASL is answered only where it does).
    pub(crate) fn wants_login(&self) -> bool {
        self.authfile.is_some()
    }

    /// Checks a login; the client is logged in from now on when it holds. A failed login
    /// leaves a client logged in earlier logged in, as memcached does.
    pub(crate) fn attempt(
        &self,
        context: &WorkerContext,
        peer: &dyn Fn() -> Peer,
        user: &[u8],
        password: &[u8],
    ) -> bool {
        let Some(authfile) = self.authfile else {
            return false;
        };
        let accepted = authfile.check(user, password);
        let peer = peer();
        client_log::count(context, &peer, ClientEvent::AuthCommand);
        if accepted {
            self.logged_in.set(true);
        } else {
            client_log::count(context, &peer, ClientEvent::AuthError);
            client_log::login_refused(&peer, user);
        }
        accepted
    }
}
