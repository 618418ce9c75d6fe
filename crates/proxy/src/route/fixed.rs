//! Null and error routes: answered by memroute itself, no server asked. A null route
//! answers as a server that stores nothing would (`reply::null_reply`); an error route
//! with `SERVER_ERROR <message>`.
use bytes::{BufMut, Bytes, BytesMut};

use super::job::{Job, KeyReplies, KeyReply};
use crate::reply::null_reply;

/// A null route's reply, with the flags a meta client asked to have echoed.
pub(super) fn null_answer(job: &Job) -> Bytes {
    let reply = null_reply(job.command);
    match &job.echo {
        Some(echo) if !echo.is_empty() => {
            let line = reply.strip_suffix(b"\r\n").unwrap_or(reply);
            let mut out = BytesMut::with_capacity(line.len() + echo.len() + 2);
            out.put_slice(line);
            out.put_slice(echo);
            out.put_slice(b"\r\n");
            out.freeze()
        }
        _ => Bytes::from_static(reply),
    }
}

/// An error route's reply.
pub(super) fn error_line(message: &str) -> Bytes {
    Bytes::from(format!("SERVER_ERROR {message}\r\n"))
}

/// A null route's answer to `count` keys of a multi-get: every one a miss.
pub(super) fn null_keys(count: usize) -> KeyReplies {
    KeyReplies::Keys(vec![KeyReply::Miss; count])
}

/// An error route's answer to `count` keys of a multi-get: its error fails them all.
pub(super) fn error_keys(message: &str, count: usize) -> KeyReplies {
    KeyReplies::failed(count, Ok(error_line(message)))
}
