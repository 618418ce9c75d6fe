//! What the executor carries and gives back: a single-key `Job` and its `Reply`, the keys
//! of a multi-get that reach one policy route (`MultiJob`) and their outcome per key
//! (`KeyReplies`), merged into the client's reply by the session (`MultiReply`).
use std::future::Future;
use std::pin::Pin;

use bytes::{BufMut, Bytes, BytesMut};
use memroute_config::Operation;
use memroute_protocol::{
    retrieval_error, value_block_at, Command, ReplyKind, Request, RequestBytes,
};
use memroute_routing::{classify_reply, ReplyClass};
use smallvec::SmallVec;

use super::vocabulary::Single;
use crate::multiget;
use crate::reply::{connection_gone, Reply};

/// One request as the executor sees it: enough to send it anywhere and to judge its reply.
#[derive(Debug)]
pub(crate) struct Job {
    pub operation: Operation,
    pub command: Command,
    /// The key the route and the placement use (a base64 meta key decoded); empty for flush_all.
    pub key: Bytes,
    /// The bytes to send to a server (noreply/q already stripped).
    pub parts: RequestBytes,
    pub kind: ReplyKind,
    /// The client session's connection slot (keeps one client's requests on one connection).
    pub slot: usize,
    /// For meta commands: the flags a reply without data echoes (` O123 kfoo`).
    pub echo: Option<Bytes>,
}

impl Job {
    /// A single-key request as the executor (or a first try's continuation) carries it.
    pub(crate) fn single(single: Single<'_>) -> Job {
        let request = single.request;
        Job {
            operation: single.operation,
            command: request.command,
            // A view of the client's frame, unless it is a decoded base64 key.
            key: match request.base64_key {
                true => Bytes::copy_from_slice(single.key),
                false => request.frame.slice_ref(single.key),
            },
            parts: single.parts,
            kind: single.kind,
            slot: single.slot,
            echo: meta_echo(request),
        }
    }
}

impl Job {
    /// The same request with other bytes to send (a failover child's capped exptime).
    pub(crate) fn with_parts(&self, parts: RequestBytes) -> Job {
        Job {
            operation: self.operation,
            command: self.command,
            key: self.key.clone(),
            parts,
            kind: self.kind,
            slot: self.slot,
            echo: self.echo.clone(),
        }
    }
}

/// The flags memcached echoes on a meta reply that carries no data (`EN`, `NS`, `NF`, `HD`):
/// the opaque `O...`, the key `k` (as `k<key>`) and base64 `b`. Only routes that answer
/// without a server (null) need them; `None` for non-meta commands.
fn meta_echo(request: &Request) -> Option<Bytes> {
    let is_meta = request.command.is_keyed_meta();
    let key_range = request.keys.first()?;
    if !is_meta {
        return None;
    }
    let key = &request.frame[key_range.clone()];
    let line = request.frame.get(key_range.end..request.line_len)?;
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut echo = BytesMut::new();
    for flag in line.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
        match flag.first() {
            Some(b'O') => {
                echo.put_u8(b' ');
                echo.put_slice(flag);
            }
            Some(b'k') => {
                echo.put_slice(b" k");
                echo.put_slice(key);
            }
            Some(b'b') if flag.len() == 1 => echo.put_slice(b" b"),
            _ => {}
        }
    }
    Some(echo.freeze())
}

/// The keys of one multi-get (get/gets/gat/gats) that reach the same policy route.
#[derive(Debug)]
pub(crate) struct MultiJob {
    pub operation: Operation,
    /// The batch line's start before its keys (`get `, `gat 300 `).
    pub head: Bytes,
    /// The keys, in the client's order (views of the client's frame).
    pub keys: Vec<Bytes>,
    pub slot: usize,
    /// The longest batch line a server may be sent (gat lines stay under memcached's limit).
    pub byte_cap: usize,
}

/// What a multi-key job answers, for the session's merge.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per job, in its pending entry; never in bulk
pub(crate) enum MultiReply {
    /// A pool answered every batch (the common case): the servers' replies as they are,
    /// with each of the job's keys' batch (`key_leg`, in the job's key order). The
    /// session merges them straight into the client's reply: one parse, one copy.
    Batches {
        replies: SmallVec<[Bytes; 4]>,
        key_leg: multiget::KeyLegs,
    },
    /// Built per key: the hits as `VALUE` blocks in key order then `END` (or the failure
    /// that fails the multi-get), and how many keys hit.
    Built(Reply, u32),
}

impl MultiReply {
    /// The job's reply as bytes (hits in key order then `END`) and its hit count; `keys`
    /// are the job's keys, in its order.
    pub(crate) fn into_reply<'k>(self, keys: impl Iterator<Item = &'k [u8]>) -> (Reply, u32) {
        match self {
            MultiReply::Built(reply, hits) => (reply, hits),
            MultiReply::Batches { replies, key_leg } => {
                let length = replies.iter().map(Bytes::len).sum::<usize>() + 5;
                let mut out = BytesMut::with_capacity(length);
                match multiget::merge(&replies, keys, &key_leg, &mut out) {
                    Some((hits, _)) => (Ok(out.freeze()), hits as u32),
                    // An error line (never in Batches): it is the whole reply.
                    None => (Ok(out.freeze()), 0),
                }
            }
        }
    }
}

pub(crate) fn multi_reply(replies: KeyReplies) -> MultiReply {
    match replies {
        KeyReplies::Batches { replies, key_leg } => MultiReply::Batches { replies, key_leg },
        KeyReplies::Keys(replies) => {
            let (reply, hits) = retrieval_reply(replies);
            MultiReply::Built(reply, hits)
        }
    }
}

pub(crate) type BoxedReply = Pin<Box<dyn Future<Output = Reply>>>;

/// A reply that met the request: anything but a transport failure or an error line.
pub(crate) fn answered(reply: &Reply) -> bool {
    matches!(reply, Ok(bytes) if classify_reply(bytes) != ReplyClass::Error)
}

pub(crate) fn class_of(reply: &Reply) -> ReplyClass {
    match reply {
        Ok(bytes) => classify_reply(bytes),
        Err(_) => ReplyClass::Error,
    }
}

/// One key's outcome in a multi-key job.
#[derive(Debug, Clone)]
pub(crate) enum KeyReply {
    /// The key's whole `VALUE` block (a view of the server's reply).
    Hit(Bytes),
    Miss,
    /// A transport failure, or the error line a server (or an error route) answered.
    Failed(Reply),
}

impl KeyReply {
    pub(crate) fn class(&self) -> ReplyClass {
        match self {
            KeyReply::Hit(_) => ReplyClass::Hit,
            KeyReply::Miss => ReplyClass::Miss,
            KeyReply::Failed(_) => ReplyClass::Error,
        }
    }
}

/// A multi-key job's outcome: per key, or (the common case: a pool whose every batch was
/// answered without an error) the servers' replies as they are with each key's batch, so
/// that the client's reply is merged from them once, as a plain pool's is. One per job,
/// returned and dropped, never stored in bulk: the inline batches are worth their size.
#[allow(clippy::large_enum_variant)]
pub(crate) enum KeyReplies {
    Keys(Vec<KeyReply>),
    Batches {
        replies: SmallVec<[Bytes; 4]>,
        key_leg: multiget::KeyLegs,
    },
}

impl KeyReplies {
    /// Per key (`keys` as asked), walking the batches when that is what came back.
    pub(crate) fn into_keys(self, job: &MultiJob, keys: &[u32]) -> Vec<KeyReply> {
        let (replies, key_leg) = match self {
            KeyReplies::Keys(replies) => return replies,
            KeyReplies::Batches { replies, key_leg } => (replies, key_leg),
        };
        let replies: SmallVec<[Reply; 4]> = replies.into_iter().map(Ok).collect();
        per_key(&replies, &key_leg, job, keys)
    }

    /// Whether every key was answered (hit or miss), none failed.
    pub(crate) fn all_answered(&self) -> bool {
        match self {
            KeyReplies::Batches { .. } => true,
            KeyReplies::Keys(replies) => replies.iter().all(|r| !matches!(r, KeyReply::Failed(_))),
        }
    }

    pub(crate) fn failed(count: usize, failure: Reply) -> KeyReplies {
        KeyReplies::Keys(vec![KeyReply::Failed(failure); count])
    }
}

pub(crate) type BoxedKeyReplies = Pin<Box<dyn Future<Output = KeyReplies>>>;

/// Each key's outcome from the batch replies that carried it (`key_leg[i]`: the batch of
/// `keys[i]`): its batch's failure, or its `VALUE` block, or a miss. Servers answer in the
/// order they were asked, skipping misses.
pub(crate) fn per_key(
    replies: &[Reply],
    key_leg: &[u32],
    job: &MultiJob,
    keys: &[u32],
) -> Vec<KeyReply> {
    let mut cursor: SmallVec<[usize; 4]> = smallvec::smallvec![0; replies.len()];
    keys.iter()
        .enumerate()
        .map(|(i, &key)| {
            let leg = key_leg.get(i).copied().unwrap_or(multiget::NO_LEG) as usize;
            let Some(reply) = replies.get(leg) else {
                return KeyReply::Failed(Err(connection_gone()));
            };
            let bytes = match reply {
                Ok(bytes) => bytes,
                Err(error) => return KeyReply::Failed(Err(error.clone())),
            };
            if let Some(line) = retrieval_error(bytes) {
                return KeyReply::Failed(Ok(bytes.slice(line)));
            }
            match value_block_at(bytes, cursor[leg]) {
                Some(block) if bytes[block.key.clone()] == job.keys[key as usize][..] => {
                    cursor[leg] = block.block.end;
                    KeyReply::Hit(bytes.slice(block.block))
                }
                _ => KeyReply::Miss,
            }
        })
        .collect()
}

/// The reply of a multi-key job answered per key: the hits in key order then `END`, and
/// their count; the first failure instead when a key failed (one failed key fails a
/// multi-get, as a failed server does). (A pool's batches, the other outcome, reach the
/// session unmerged: `MultiReply::Batches`.)
pub(crate) fn retrieval_reply(replies: Vec<KeyReply>) -> (Reply, u32) {
    let (mut length, mut hits) = (5, 0);
    for reply in &replies {
        match reply {
            KeyReply::Hit(block) => {
                length += block.len();
                hits += 1;
            }
            KeyReply::Miss => {}
            KeyReply::Failed(failure) => return (failure.clone(), 0),
        }
    }
    let mut out = BytesMut::with_capacity(length);
    for reply in &replies {
        if let KeyReply::Hit(block) = reply {
            out.put_slice(block);
        }
    }
    out.put_slice(b"END\r\n");
    (Ok(out.freeze()), hits)
}
