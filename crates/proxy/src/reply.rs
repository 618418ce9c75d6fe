//! Replies memroute builds itself rather than relays: `SERVER_ERROR` lines, the merged
//! answer of a flush_all sent to several servers or routes, a null route's answers, the
//! immediate acknowledgement of an `all-async` write. A leaf: the dispatcher and the route
//! executor build the same bytes from here.

use bytes::{Bytes, BytesMut};
use memroute_backend::BackendError;
use memroute_protocol::Command;

/// A backend reply or why there is none.
pub(crate) type Reply = Result<Bytes, BackendError>;

/// The error for a reply that will never come: the connection (or the task) that was
/// to deliver it is gone. It names no server: it is not one server's fault.
pub(crate) fn connection_gone() -> BackendError {
    BackendError::Lost
}

/// `SERVER_ERROR <error>` for a request that failed.
pub(crate) fn server_error(out: &mut BytesMut, error: &BackendError) {
    out.extend_from_slice(b"SERVER_ERROR ");
    out.extend_from_slice(error.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A reply's first line, without its line end.
pub(crate) fn first_line(reply: &[u8]) -> &[u8] {
    let end = reply
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(reply.len());
    &reply[..end]
}

/// flush_all sent to several servers (or routes) at once: `OK` only if every one said so,
/// otherwise the first reply (in the order they are added) that was not `OK`.
///
/// A reply counts as `OK` when it starts with `OK\r\n`, the whole line memcached sends
/// for flush_all (this was the executor's test; the dispatcher's fan-out compared the first
/// line without its line end, which also took a bare `OK\n` or an unterminated `OK`).
#[derive(Debug, Default)]
pub(crate) struct FlushAllMerge {
    first_not_ok: Option<Reply>,
}

impl FlushAllMerge {
    pub(crate) fn add(&mut self, reply: Reply) {
        let ok = matches!(&reply, Ok(bytes) if bytes.starts_with(b"OK\r\n"));
        if !ok && self.first_not_ok.is_none() {
            self.first_not_ok = Some(reply);
        }
    }

    pub(crate) fn finish(self) -> Reply {
        self.first_not_ok
            .unwrap_or(Ok(Bytes::from_static(b"OK\r\n")))
    }
}

/// What `all-async` answers at once: the command's success reply, when that reply carries
/// no data. incr/decr (the new value) and meta commands (flags echoed) have none.
pub(crate) fn immediate_ack(command: Command) -> Option<&'static [u8]> {
    match command {
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas => Some(b"STORED\r\n"),
        Command::Delete => Some(b"DELETED\r\n"),
        Command::Touch => Some(b"TOUCHED\r\n"),
        Command::FlushAll => Some(b"OK\r\n"),
        _ => None,
    }
}

/// What a null route answers: the command's "nothing here / nothing done" reply.
pub(crate) fn null_reply(command: Command) -> &'static [u8] {
    match command {
        Command::Get | Command::Gets | Command::Gat | Command::Gats => b"END\r\n",
        Command::MetaGet | Command::MetaDebug => b"EN\r\n",
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas => b"NOT_STORED\r\n",
        Command::MetaSet => b"NS\r\n",
        Command::MetaDelete | Command::MetaArithmetic => b"NF\r\n",
        Command::FlushAll => b"OK\r\n",
        _ => b"NOT_FOUND\r\n",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_async_replies_follow_the_command() {
        assert_eq!(null_reply(Command::Get), b"END\r\n");
        assert_eq!(null_reply(Command::Set), b"NOT_STORED\r\n");
        assert_eq!(null_reply(Command::Delete), b"NOT_FOUND\r\n");
        assert_eq!(null_reply(Command::MetaGet), b"EN\r\n");
        assert_eq!(immediate_ack(Command::Set), Some(&b"STORED\r\n"[..]));
        assert_eq!(immediate_ack(Command::Incr), None);
        assert_eq!(immediate_ack(Command::MetaSet), None);
    }

    #[test]
    fn flush_all_is_ok_only_when_every_reply_is() {
        let ok = || Ok(Bytes::from_static(b"OK\r\n"));
        let mut all_ok = FlushAllMerge::default();
        all_ok.add(ok());
        all_ok.add(ok());
        assert_eq!(&all_ok.finish().expect("ok")[..], b"OK\r\n");
        assert_eq!(
            &FlushAllMerge::default().finish().expect("ok")[..],
            b"OK\r\n"
        );

        let mut failed = FlushAllMerge::default();
        failed.add(ok());
        failed.add(Ok(Bytes::from_static(b"ERROR\r\n")));
        failed.add(Err(connection_gone()));
        assert_eq!(&failed.finish().expect("first failure")[..], b"ERROR\r\n");

        let mut gone = FlushAllMerge::default();
        gone.add(Err(connection_gone()));
        gone.add(Ok(Bytes::from_static(b"SERVER_ERROR busy\r\n")));
        assert!(matches!(gone.finish(), Err(BackendError::Lost)));

        let mut bare = FlushAllMerge::default();
        bare.add(Ok(Bytes::from_static(b"OK")));
        assert_eq!(&bare.finish().expect("not ok")[..], b"OK");
    }

    #[test]
    fn server_error_names_the_failure() {
        let mut out = BytesMut::new();
        server_error(&mut out, &connection_gone());
        assert!(out.starts_with(b"SERVER_ERROR "));
        assert!(out.ends_with(b"\r\n"));
        assert_eq!(first_line(b"OK\r\nmore"), b"OK");
        assert_eq!(first_line(b"END"), b"END");
    }
}
