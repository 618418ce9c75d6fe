//! On which errors a failover route moves on (`failover_errors`, mcrouter's setting of the
//! same name): mcrouter's classes of error (`carbon::Result` names without `mc_res_`), the
//! set a route was given, and the class of a reply a server sent. The proxy names the class
//! of a failure that never got a reply (a server marked down is `tko`, ...), as it knows
//! the transport's errors; see docs/configuration.md for the whole mapping.

/// mcrouter's error results, in its order (`mcrouter/lib/carbon/Result.h`): every
/// `carbon::Result` that `isErrorResult` accepts, by the name its config uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    Ooo,
    /// No reply in time (a data timeout).
    Timeout,
    ConnectTimeout,
    /// The connect failed (refused, or a name that does not resolve).
    ConnectError,
    Busy,
    TryAgain,
    Shutdown,
    /// The server is marked down: the request was not sent.
    Tko,
    BadCommand,
    BadKey,
    BadFlags,
    BadExptime,
    BadLeaseId,
    BadCasId,
    BadValue,
    Aborted,
    /// `CLIENT_ERROR` from the server.
    ClientError,
    /// A failure inside the proxy (a reply it could not read, a task that ended).
    LocalError,
    /// `SERVER_ERROR` from the server, or the connection broke after the request was sent.
    RemoteError,
    DeadlineExceeded,
    PermissionDenied,
    HotKey,
    Overloaded,
}

impl ErrorClass {
    /// Every class with mcrouter's name for it.
    pub const NAMES: &'static [(&'static str, ErrorClass)] = &[
        ("ooo", ErrorClass::Ooo),
        ("timeout", ErrorClass::Timeout),
        ("connect_timeout", ErrorClass::ConnectTimeout),
        ("connect_error", ErrorClass::ConnectError),
        ("busy", ErrorClass::Busy),
        ("try_again", ErrorClass::TryAgain),
        ("shutdown", ErrorClass::Shutdown),
        ("tko", ErrorClass::Tko),
        ("bad_command", ErrorClass::BadCommand),
        ("bad_key", ErrorClass::BadKey),
        ("bad_flags", ErrorClass::BadFlags),
        ("bad_exptime", ErrorClass::BadExptime),
        ("bad_lease_id", ErrorClass::BadLeaseId),
        ("bad_cas_id", ErrorClass::BadCasId),
        ("bad_value", ErrorClass::BadValue),
        ("aborted", ErrorClass::Aborted),
        ("client_error", ErrorClass::ClientError),
        ("local_error", ErrorClass::LocalError),
        ("remote_error", ErrorClass::RemoteError),
        ("deadline_exceeded", ErrorClass::DeadlineExceeded),
        ("permission_denied", ErrorClass::PermissionDenied),
        ("hot_key", ErrorClass::HotKey),
        ("overloaded", ErrorClass::Overloaded),
    ];

    /// The class mcrouter gives this name, if it is one of its error results.
    pub fn from_name(name: &str) -> Option<ErrorClass> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, class)| class)
    }

    /// mcrouter's name for the class.
    pub fn as_str(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|&&(_, class)| class == self)
            .map_or("", |&(name, _)| name)
    }

    /// The class of an error reply a server sent (one `classify_reply` calls an error), as
    /// mcrouter's reply parser gives it: `SERVER_ERROR 307 ...` is `busy`, any other
    /// `SERVER_ERROR` `remote_error`, `CLIENT_ERROR` `client_error`, and anything it cannot
    /// parse (a bare `ERROR`, an empty reply) `local_error`.
    pub fn of_reply(reply: &[u8]) -> ErrorClass {
        if let Some(rest) = reply.strip_prefix(b"SERVER_ERROR") {
            return match rest.strip_prefix(b" 307 ") {
                Some(_) => ErrorClass::Busy,
                None => ErrorClass::RemoteError,
            };
        }
        match reply.starts_with(b"CLIENT_ERROR") {
            true => ErrorClass::ClientError,
            false => ErrorClass::LocalError,
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// The classes of error a failover route moves on for. `ALL` (the default) is every error,
/// as a failover route without `failover_errors` has always done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverErrors(u32);

impl FailoverErrors {
    /// Every class of error.
    pub const ALL: FailoverErrors = FailoverErrors(u32::MAX);

    /// Exactly the classes given.
    pub fn of(classes: impl IntoIterator<Item = ErrorClass>) -> FailoverErrors {
        FailoverErrors(classes.into_iter().fold(0, |bits, c| bits | c.bit()))
    }

    pub fn contains(self, class: ErrorClass) -> bool {
        self.0 & class.bit() != 0
    }

    pub fn is_all(self) -> bool {
        self == Self::ALL
    }

    /// The classes, by name, in mcrouter's order (for `--check` output and the docs).
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        ErrorClass::NAMES
            .iter()
            .filter(move |&&(_, class)| self.contains(class))
            .map(|&(name, _)| name)
    }
}

/// What a failover route's `failover_errors` and `failover_exptime` add to its one-line
/// description (`--check`, the panel): empty when it has neither.
pub fn gutter_description(errors: FailoverErrors, exptime_cap: Option<u32>) -> String {
    let mut text = String::new();
    if !errors.is_all() {
        let names: Vec<&str> = errors.names().collect();
        text.push_str(&format!(", failover_errors [{}]", names.join(", ")));
    }
    if let Some(cap) = exptime_cap {
        text.push_str(&format!(", failover_exptime {cap}s"));
    }
    text
}

impl Default for FailoverErrors {
    fn default() -> Self {
        Self::ALL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sets_hold_what_they_were_given() {
        for &(name, class) in ErrorClass::NAMES {
            assert_eq!(ErrorClass::from_name(name), Some(class));
            assert_eq!(class.as_str(), name);
        }
        assert_eq!(ErrorClass::from_name("mc_res_tko"), None);
        assert_eq!(ErrorClass::from_name("notfound"), None);
        let set = FailoverErrors::of([ErrorClass::Tko, ErrorClass::ConnectError]);
        assert!(set.contains(ErrorClass::Tko) && set.contains(ErrorClass::ConnectError));
        assert!(!set.contains(ErrorClass::RemoteError) && !set.is_all());
        assert_eq!(set.names().collect::<Vec<_>>(), ["connect_error", "tko"]);
        assert!(FailoverErrors::default().contains(ErrorClass::ClientError));
    }

    #[test]
    fn error_replies_are_classed_as_mcrouter_parses_them() {
        let class = ErrorClass::of_reply;
        assert_eq!(
            class(b"SERVER_ERROR out of memory\r\n"),
            ErrorClass::RemoteError
        );
        assert_eq!(class(b"SERVER_ERROR 307 busy\r\n"), ErrorClass::Busy);
        assert_eq!(
            class(b"CLIENT_ERROR bad data chunk\r\n"),
            ErrorClass::ClientError
        );
        assert_eq!(class(b"ERROR\r\n"), ErrorClass::LocalError);
        assert_eq!(class(b""), ErrorClass::LocalError);
    }
}
