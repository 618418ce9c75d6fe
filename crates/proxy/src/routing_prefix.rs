//! mcrouter's routing prefixes on the request path: which routes a key's `/region/cluster/`
//! prefix sends it to (`memroute_routing::routing_prefix`, as mcrouter's RootRoute), the
//! key a server gets (the prefix cut unless the route's pools keep it), and the client's
//! key put back in the reply (`restore_keys`). Dispatch routes with what `resolve`
//! answers; the pending entry puts the prefix back.
//!
//! ```text
//!   key[0] != '/' or no prefixes in the config --> the listener's root, as without prefixes
//!   "/region/cluster/rest" --resolve--> Targets (first answers, the rest in the background)
//!                                       | none: NO_ROUTE (mcrouter's "No rh found")
//! ```
use bytes::BytesMut;
use memroute_protocol::{value_block_at, Command, Request};
use memroute_routing::routing_prefix::{prefix_len, Targets};
use memroute_routing::RouteTable;
use smallvec::SmallVec;

/// mcrouter's reply when a prefix names no route: RootRoute's `ErrorReply` with the
/// message "RootRoute: No rh found", a LOCAL_ERROR written by its ASCII serializer as
/// `SERVER_ERROR <message>`.
pub(crate) const NO_ROUTE: &[u8] = b"SERVER_ERROR RootRoute: No rh found\r\n";

/// The reply to a key that is only a routing prefix (nothing would be left to send):
/// memcached's for a command line without a key. Never sent to a server, whose
/// connection an empty key would throw out of step.
pub(crate) const ONLY_PREFIX: &[u8] = b"CLIENT_ERROR bad command line format\r\n";

/// Whether `key` may carry a routing prefix this config routes by: one branch on its first
/// byte for a plain key; a config without prefixes never looks further.
#[inline]
pub fn may_carry(routes: &RouteTable, key: &[u8]) -> bool {
    key.first() == Some(&b'/') && !routes.routing_prefixes().is_empty()
}

/// Whether a multi-key request has a key that may carry a routing prefix.
pub(crate) fn any_may_carry(routes: &RouteTable, request: &Request) -> bool {
    !routes.routing_prefixes().is_empty()
        && !request.base64_key
        && request.keys().any(|key| key.first() == Some(&b'/'))
}

/// Where a key goes by its routing prefix.
#[derive(Debug)]
pub enum Resolved {
    /// No prefix: the listener's root.
    Plain,
    /// The routes its prefix (`len` bytes) names, the one that answers first.
    Routes { len: usize, targets: Targets },
    /// A prefix naming no route: the client gets `NO_ROUTE`.
    NoRoute,
    /// A key that is only a prefix: the client gets `ONLY_PREFIX`.
    OnlyPrefix,
}

/// The routes `key` goes to from listener `listener` (its default prefix is first among a
/// wildcard's routes).
pub fn resolve(routes: &RouteTable, listener: usize, key: &[u8]) -> Resolved {
    let Some(len) = prefix_len(key) else {
        return Resolved::Plain;
    };
    if len == key.len() {
        return Resolved::OnlyPrefix;
    }
    let default = routes.default_prefix(listener);
    let targets = routes.routing_prefixes().targets(&key[..len], default);
    match targets.is_empty() {
        true => Resolved::NoRoute,
        false => Resolved::Routes { len, targets },
    }
}

/// Whether `key`'s routing prefix refuses it (names no route, or is the whole key). A
/// batch of binary quiet gets ends before such a key, which is then answered on its own:
/// each binary request is one, and only it gets the error.
pub(crate) fn refuses(routes: &RouteTable, listener: usize, key: &[u8]) -> bool {
    may_carry(routes, key)
        && matches!(
            resolve(routes, listener, key),
            Resolved::NoRoute | Resolved::OnlyPrefix
        )
}

/// Whether the reply to `command` carries the request's key: a retrieval's `VALUE` lines,
/// a meta command's `k` flag.
pub(crate) fn reply_carries_key(command: Command) -> bool {
    command.is_read() || command.is_keyed_meta()
}

/// Puts `prefix` back in front of each key the reply at `out[start..]` carries: in a text
/// retrieval's `VALUE` lines, or a meta reply's `k` flag. In place: the reply's bytes are
/// moved up once, from its end, to make room (no copy of the reply elsewhere).
pub(crate) fn restore_keys(command: Command, out: &mut BytesMut, start: usize, prefix: &[u8]) {
    if prefix.is_empty() {
        return;
    }
    // Where each key starts, in the reply as the server wrote it.
    let mut at_keys: SmallVec<[usize; 32]> = SmallVec::new();
    let reply = &out[start..];
    if command.is_keyed_meta() {
        at_keys.extend(meta_key_at(reply));
    } else {
        let mut at = 0;
        while let Some(block) = value_block_at(reply, at) {
            at_keys.push(block.key.start);
            at = block.block.end;
        }
    }
    if at_keys.is_empty() {
        return;
    }
    let old_end = out.len();
    out.resize(old_end + at_keys.len() * prefix.len(), 0);
    // From the last key back: the bytes after each key start move up by the prefixes
    // written before them, and that key's prefix goes in front of it.
    let mut segment_end = old_end;
    for (n, &key) in at_keys.iter().enumerate().rev() {
        let key = start + key;
        let shift = (n + 1) * prefix.len();
        out.copy_within(key..segment_end, key + shift);
        let prefix_at = key + n * prefix.len();
        out[prefix_at..prefix_at + prefix.len()].copy_from_slice(prefix);
        segment_end = key;
    }
}

/// Where a meta reply's key starts: in its first line, the `k<key>` flag (any token after
/// the status, and after a `VA`'s size, that starts with `k`), past the `k`.
fn meta_key_at(reply: &[u8]) -> Option<usize> {
    let line_end = reply
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(reply.len());
    let line = &reply[..line_end];
    let skip = if line.starts_with(b"VA ") { 2 } else { 1 };
    let mut at = 0;
    for (n, token) in line.split(|&b| b == b' ').enumerate() {
        if n >= skip && token.first() == Some(&b'k') {
            return Some(at + 1);
        }
        at += token.len() + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restored(command: Command, reply: &[u8]) -> Vec<u8> {
        // After bytes already written (an earlier reply), which stay as they are.
        let mut out = BytesMut::from(&b"STORED\r\n"[..]);
        out.extend_from_slice(reply);
        restore_keys(command, &mut out, 8, b"/dc/c/");
        assert_eq!(&out[..8], b"STORED\r\n");
        out[8..].to_vec()
    }

    #[test]
    fn text_values_get_the_prefix_back() {
        let reply = b"VALUE a 0 2\r\nhi\r\nVALUE b 5 1 7\r\nx\r\nEND\r\n";
        assert_eq!(
            restored(Command::Gets, reply),
            b"VALUE /dc/c/a 0 2\r\nhi\r\nVALUE /dc/c/b 5 1 7\r\nx\r\nEND\r\n"
        );
        assert_eq!(restored(Command::Get, b"END\r\n"), b"END\r\n");
        assert_eq!(
            restored(Command::Get, b"SERVER_ERROR busy\r\n"),
            b"SERVER_ERROR busy\r\n"
        );
    }

    #[test]
    fn meta_key_flags_get_the_prefix_back() {
        assert_eq!(
            restored(Command::MetaGet, b"VA 2 f0 ka t-1\r\nhi\r\n"),
            b"VA 2 f0 k/dc/c/a t-1\r\nhi\r\n"
        );
        assert_eq!(
            restored(Command::MetaDelete, b"HD ka O1\r\n"),
            b"HD k/dc/c/a O1\r\n"
        );
        assert_eq!(restored(Command::MetaGet, b"EN\r\n"), b"EN\r\n");
        assert_eq!(restored(Command::MetaSet, b"HD\r\n"), b"HD\r\n");
    }
}
