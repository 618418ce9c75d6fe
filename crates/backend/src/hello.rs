//! What memroute says first on every connection it opens to a server, before any client's
//! request: `version`. memcached answers `VERSION ...` on a connection that may be used,
//! and `CLIENT_ERROR unauthenticated` when it was started with `-Y` and wants a login
//! first; memroute then logs in with the pool's credentials, or, having none, gives the
//! server up as down. So a client's bytes never reach a connection that has not logged in,
//! and no client's `set` can log one in for everybody (the hole a login forwarded over a
//! pooled connection opens).
//!
//! ```text
//!   connect -> "version"  -> VERSION ...                      -> open
//!                          -> CLIENT_ERROR unauthenticated    -> no login: refused (down)
//!                                 | login: "set memroute 0 0 N / user password"
//!                                 v
//!                             STORED -> open;  CLIENT_ERROR authentication failure -> refused
//! ```
//!
//! The login is never sent before memcached asked for it: a memcached without `-Y` would
//! store it as an item anyone could read.
use std::time::Duration;

use memroute_net::{Connector, NetError, Stream};
use memroute_protocol::auth::{classify_hello, login_request, Hello, HELLO};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The longest first reply read (a `VERSION` line is a few dozen bytes).
const MAX_HELLO_REPLY: usize = 1024;

/// How the server greeted memroute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Greeting {
    /// It answered `version` with this line (`VERSION 1.6.18`, or whatever a server that
    /// is not memcached says).
    Answered(String),
    /// It wanted a login and took memroute's.
    LoggedIn,
}

/// Why a connection could not be opened for use.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// No connection (refused, timed out, a TLS handshake that failed).
    Connect(NetError),
    /// The server wants a login memroute does not have, or refused memroute's: it must not
    /// be used, so it is marked down with this reason.
    Login(String),
    /// The exchange failed (no answer in time, closed, a read error).
    Exchange(String),
}

/// Connects through `connector` and greets the server, logging in when it asks for it.
/// Each exchange must be answered within `reply_timeout`.
pub(crate) async fn open(
    connector: &Connector,
    connect_timeout: Duration,
    reply_timeout: Duration,
) -> Result<(Stream, Greeting), Refusal> {
    let mut stream = connector
        .connect(connect_timeout)
        .await
        .map_err(Refusal::Connect)?;
    let first = exchange(&mut stream, HELLO, "version", reply_timeout).await?;
    match (classify_hello(&first), connector.login()) {
        (Hello::Open, _) => {
            let line = String::from_utf8_lossy(&first).trim_end().to_string();
            Ok((stream, Greeting::Answered(line)))
        }
        (Hello::LoginRequired, None) => Err(Refusal::Login(
            "memcached wants a login (CLIENT_ERROR unauthenticated) and the pool has no auth"
                .to_string(),
        )),
        (Hello::Refused, _) => Err(Refusal::Login(format!(
            "memcached refused the connection before a login: {}",
            String::from_utf8_lossy(&first).trim_end()
        ))),
        (Hello::LoginRequired, Some(login)) => {
            let request = login_request(&login.username, &login.password);
            let answer = exchange(&mut stream, &request, "login", reply_timeout).await?;
            let answer = String::from_utf8_lossy(&answer).trim_end().to_string();
            match answer.as_str() {
                "STORED" => Ok((stream, Greeting::LoggedIn)),
                _ => Err(Refusal::Login(format!(
                    "memcached refused the login of user {}: {answer}",
                    login.username
                ))),
            }
        }
    }
}

/// Writes `request` (`what`, in errors) and reads the one line that answers it.
async fn exchange(
    stream: &mut Stream,
    request: &[u8],
    what: &str,
    reply_timeout: Duration,
) -> Result<Vec<u8>, Refusal> {
    let round_trip = async {
        // A TCP Fast Open connect is made by its first write: a refusal shows here, and
        // is the refused connect it is (the server is not running).
        let refused = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => Refusal::Connect(NetError::ConnectRefused),
            _ => Refusal::Exchange(e.to_string()),
        };
        stream.write_all(request).await.map_err(refused)?;
        stream.flush().await.map_err(refused)?;
        let mut reply = Vec::with_capacity(64);
        loop {
            if let Some(end) = reply.iter().position(|&b| b == b'\n') {
                reply.truncate(end + 1);
                return Ok(reply);
            }
            if reply.len() > MAX_HELLO_REPLY {
                return Err(Refusal::Exchange("reply too long".to_string()));
            }
            let mut chunk = [0u8; 256];
            match stream.read(&mut chunk).await {
                Ok(0) => {
                    let closed = "connection closed by server".to_string();
                    return Err(Refusal::Exchange(closed));
                }
                Ok(n) => reply.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(refused(e)),
            }
        }
    };
    match tokio::time::timeout(reply_timeout, round_trip).await {
        Ok(result) => result,
        Err(_) => Err(Refusal::Exchange(format!("{what} timed out"))),
    }
}
