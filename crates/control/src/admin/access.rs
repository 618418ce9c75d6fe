//! Who may change state through the admin port (`POST /reload`), or watch its requests
//! live (`GET /watch`: client addresses and keys as they pass). Reading is open to
//! whoever reaches the port (scrapes, probes, `/route`); those two are not:
//! - with `admin.token` or `admin.token_file`, a request must carry
//!   `Authorization: Bearer TOKEN`, compared in constant time;
//! - without one, only a loopback peer may (a person or a script on the same host or pod);
//! - a request a browser marks as sent from another site (`Sec-Fetch-Site`, or an
//!   `Origin` that is not the admin's own `Host`) is refused either way, so a web page
//!   cannot make an operator's browser post to a memroute on localhost.
use std::net::IpAddr;

use hyper::header::{HeaderMap, AUTHORIZATION, HOST, ORIGIN};
use memroute_config::AdminToken;
use subtle::ConstantTimeEq;

/// Why a state-changing request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No token is configured and the peer is not on loopback.
    NotLoopback,
    /// A browser sent it from another site.
    CrossSite,
    /// A token is configured; the request carries none, or another.
    BadToken,
    /// `admin.token_file` cannot be read: nobody may change state until it can.
    TokenFile(String),
}

impl Denied {
    /// The answer's first line, for the person or script that sent the request.
    pub(crate) fn reason(&self) -> String {
        match self {
            Denied::NotLoopback => "POST /reload and GET /watch are answered only from a \
                 loopback peer unless admin.token or admin.token_file is set"
                .to_string(),
            Denied::CrossSite => "refused: the request was sent from another site".to_string(),
            Denied::BadToken => {
                "missing or wrong token: send Authorization: Bearer TOKEN".to_string()
            }
            Denied::TokenFile(error) => format!("admin.token_file cannot be read: {error}"),
        }
    }
}

/// Whether a request from `peer` with `headers` may change state.
pub(crate) fn may_change_state(
    token: Option<&AdminToken>,
    peer: IpAddr,
    headers: &HeaderMap,
) -> Result<(), Denied> {
    if is_cross_site(headers) {
        return Err(Denied::CrossSite);
    }
    let expected = match token {
        None if peer.is_loopback() || is_mapped_loopback(peer) => return Ok(()),
        None => return Err(Denied::NotLoopback),
        Some(AdminToken::Inline(token)) => token.clone(),
        Some(AdminToken::File(path)) => match std::fs::read_to_string(path) {
            // A Secret file or `echo TOKEN > file` ends with a newline that is not part of it.
            Ok(text) => text.trim_end_matches(['\r', '\n']).to_string(),
            Err(error) => return Err(Denied::TokenFile(format!("{}: {error}", path.display()))),
        },
    };
    let offered = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or(b"");
    // An empty file must not make an empty bearer a password.
    match !expected.is_empty() && bool::from(offered.ct_eq(expected.as_bytes())) {
        true => Ok(()),
        false => Err(Denied::BadToken),
    }
}

fn is_mapped_loopback(peer: IpAddr) -> bool {
    match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        IpAddr::V4(_) => false,
    }
}

fn is_cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return true;
        }
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return false;
    };
    // `Origin: http://HOST:PORT` must name the address the request was sent to.
    let origin = origin.as_bytes();
    let authority = origin
        .strip_prefix(b"http://")
        .or_else(|| origin.strip_prefix(b"https://"))
        .unwrap_or(b"");
    headers.get(HOST).map(|host| host.as_bytes()) != Some(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().expect("header value"));
        }
        map
    }

    const LOOPBACK: [u8; 4] = [127, 0, 0, 1];
    const REMOTE: [u8; 4] = [10, 0, 0, 9];

    #[test]
    fn without_a_token_only_loopback_may() {
        assert_eq!(
            may_change_state(None, LOOPBACK.into(), &headers(&[])),
            Ok(())
        );
        assert_eq!(
            may_change_state(
                None,
                "::ffff:127.0.0.1".parse().expect("address"),
                &headers(&[])
            ),
            Ok(())
        );
        assert_eq!(
            may_change_state(None, REMOTE.into(), &headers(&[])),
            Err(Denied::NotLoopback)
        );
    }

    #[test]
    fn with_a_token_anyone_holding_it_may() {
        let token = AdminToken::Inline("s3cret".into());
        let right = headers(&[("authorization", "Bearer s3cret")]);
        assert_eq!(
            may_change_state(Some(&token), REMOTE.into(), &right),
            Ok(())
        );
        for wrong in [
            headers(&[]),
            headers(&[("authorization", "Bearer s3cre")]),
            headers(&[("authorization", "Bearer s3cretX")]),
            headers(&[("authorization", "Basic s3cret")]),
        ] {
            assert_eq!(
                may_change_state(Some(&token), LOOPBACK.into(), &wrong),
                Err(Denied::BadToken),
                "{wrong:?}"
            );
        }
    }

    #[test]
    fn a_token_file_is_read_at_each_request() {
        let dir = std::env::temp_dir().join(format!("memroute-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("token file");
        let path = dir.join("token");
        let token = AdminToken::File(path.clone());
        let bearer = headers(&[("authorization", "Bearer one")]);
        assert!(matches!(
            may_change_state(Some(&token), LOOPBACK.into(), &bearer),
            Err(Denied::TokenFile(_))
        ));
        std::fs::write(&path, "one\n").expect("token file");
        assert_eq!(
            may_change_state(Some(&token), REMOTE.into(), &bearer),
            Ok(())
        );
        std::fs::write(&path, "two\n").expect("token file");
        assert_eq!(
            may_change_state(Some(&token), REMOTE.into(), &bearer),
            Err(Denied::BadToken)
        );
        std::fs::write(&path, "\n").expect("token file");
        let empty = headers(&[("authorization", "Bearer ")]);
        assert_eq!(
            may_change_state(Some(&token), REMOTE.into(), &empty),
            Err(Denied::BadToken)
        );
        std::fs::remove_dir_all(&dir).expect("token file");
    }

    #[test]
    fn a_browser_on_another_site_may_not() {
        for sent in [
            headers(&[("sec-fetch-site", "cross-site")]),
            headers(&[("sec-fetch-site", "same-site")]),
            headers(&[
                ("origin", "https://evil.example"),
                ("host", "127.0.0.1:9150"),
            ]),
            headers(&[("origin", "null"), ("host", "127.0.0.1:9150")]),
        ] {
            assert_eq!(
                may_change_state(None, LOOPBACK.into(), &sent),
                Err(Denied::CrossSite),
                "{sent:?}"
            );
        }
        let same = headers(&[
            ("origin", "http://127.0.0.1:9150"),
            ("host", "127.0.0.1:9150"),
        ]);
        assert_eq!(may_change_state(None, LOOPBACK.into(), &same), Ok(()));
    }
}
