//! A multi-get's plan and merge, without sockets: which keys go to which server in which
//! batch (`plan`), and the client's reply built from the servers' replies in the client's
//! key order (`merge`). `dispatch` runs the plan (writes the batch lines, sends them) and
//! `pending` merges when every leg has answered.
//!
//! ```text
//!   keys  a b c d e       targets  S1 S2 S1 X S1   (X: a policy route, via the executor)
//!   plan: Open(a) Add(c) Add(e) Close(S1)  Open(b) Close(S2)  Executor(d)
//!         legs   0: S1 "a c e"             1: S2 "b"          2: d
//!   merge: walk a..e, take each leg's next VALUE block when it is for this key
//! ```
use bytes::{Bytes, BytesMut};
use memroute_protocol::{retrieval_error, value_block_at};
use smallvec::SmallVec;

/// A key no leg carries yet (`plan` assigns every key before it returns `Ok`).
pub(crate) const UNASSIGNED: u32 = u32::MAX;

/// Where one key of a multi-get goes: a server of a plain pool (batched with the other
/// keys of that server), or the route executor (one leg per key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyTarget {
    Server(u32, u32),
    Executor,
    /// A pool with no servers (DNS discovery found none yet).
    Nowhere(u32),
}

/// One step of a multi-get's plan, in the order the sends must happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Key `key` goes through the route executor, on a leg of its own.
    Executor { key: usize },
    /// A new batch line starts with key `key`; about `keys_hint` keys will follow it.
    Open { key: usize, keys_hint: usize },
    /// Key `key` joins the open batch.
    Add { key: usize },
    /// The open batch is complete: send it to `server` of `pool`.
    Close { pool: usize, server: usize },
}

/// Plans a multi-get: each server's keys in client order, cut into batches of
/// `batch_size(pool)` keys and of lines at most `byte_cap` bytes (`head_len` + keys with
/// single spaces + CRLF); servers in the order their first key appears; keys for the
/// executor each on a leg of their own, in place. `key_leg[i]` becomes the index of the
/// leg (in the order of `Executor` and `Close` steps) that carries key `i`.
///
/// Returns `Err(pool)` at the first key whose pool has no servers; the steps before it
/// have been taken (their requests are sent and their replies dropped).
pub(crate) fn plan(
    targets: &[KeyTarget],
    key_len: impl Fn(usize) -> usize,
    head_len: usize,
    byte_cap: usize,
    batch_size: impl Fn(usize) -> usize,
    key_leg: &mut [u32],
    mut step: impl FnMut(Step),
) -> Result<(), usize> {
    let count = targets.len();
    let mut legs: u32 = 0;
    for first in 0..count {
        if key_leg[first] != UNASSIGNED {
            continue;
        }
        let (pool, server) = match targets[first] {
            KeyTarget::Server(pool, server) => (pool as usize, server as usize),
            KeyTarget::Nowhere(pool) => return Err(pool as usize),
            KeyTarget::Executor => {
                key_leg[first] = legs;
                legs += 1;
                step(Step::Executor { key: first });
                continue;
            }
        };
        let batch_size = batch_size(pool);
        let mut line_len = 0;
        let mut in_batch = 0;
        for i in first..count {
            if targets[i] != targets[first] {
                continue;
            }
            if in_batch > 0 && line_len + 1 + key_len(i) + 2 > byte_cap {
                step(Step::Close { pool, server });
                legs += 1;
                in_batch = 0;
            }
            if in_batch == 0 {
                step(Step::Open {
                    key: i,
                    keys_hint: batch_size.min(count - i),
                });
                line_len = head_len + key_len(i);
            } else {
                step(Step::Add { key: i });
                line_len += 1 + key_len(i);
            }
            key_leg[i] = legs;
            in_batch += 1;
            if in_batch == batch_size {
                step(Step::Close { pool, server });
                legs += 1;
                in_batch = 0;
            }
        }
        if in_batch > 0 {
            step(Step::Close { pool, server });
            legs += 1;
        }
    }
    Ok(())
}

/// Writes the client's reply to a split multi-get from its legs' replies (`replies[leg]`,
/// `key_leg[i]` the leg of the client's key `i`): the value blocks in the client's key
/// order, then `END`. Returns (hits, misses); `None` when a leg answered with an error
/// line, which is then the whole reply (nothing counted).
pub(crate) fn merge<'k>(
    replies: &[Bytes],
    keys: impl Iterator<Item = &'k [u8]>,
    key_leg: &[u32],
    out: &mut BytesMut,
) -> Option<(u64, u64)> {
    for reply in replies {
        if let Some(line) = retrieval_error(reply) {
            out.extend_from_slice(&reply[line]);
            return None;
        }
    }
    // Servers answer in the order they were asked, skipping misses: walk the client's keys
    // and take each leg's next block when it is for this key.
    let mut cursor: SmallVec<[usize; 4]> = smallvec::smallvec![0; replies.len()];
    let (mut hits, mut misses) = (0u64, 0u64);
    for (i, key) in keys.enumerate() {
        let leg = key_leg[i] as usize;
        let reply = &replies[leg];
        match value_block_at(reply, cursor[leg]) {
            Some(block) if &reply[block.key.clone()] == key => {
                out.extend_from_slice(&reply[block.block.clone()]);
                cursor[leg] = block.block.end;
                hits += 1;
            }
            _ => misses += 1,
        }
    }
    out.extend_from_slice(b"END\r\n");
    Some((hits, misses))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S1: KeyTarget = KeyTarget::Server(0, 1);
    const S2: KeyTarget = KeyTarget::Server(0, 2);

    /// The steps and key_leg of a plan over keys of the given lengths (head "get ").
    fn planned(
        targets: &[KeyTarget],
        lengths: &[usize],
        byte_cap: usize,
        batch: usize,
    ) -> (Result<(), usize>, Vec<Step>, Vec<u32>) {
        let mut key_leg = vec![UNASSIGNED; targets.len()];
        let mut steps = Vec::new();
        let result = plan(
            targets,
            |i| lengths[i],
            4,
            byte_cap,
            |_| batch,
            &mut key_leg,
            |s| steps.push(s),
        );
        (result, steps, key_leg)
    }

    #[test]
    fn keys_are_batched_per_server_in_order_of_first_appearance() {
        let targets = [S1, S2, S1, KeyTarget::Executor, S1];
        let (result, steps, key_leg) = planned(&targets, &[1; 5], usize::MAX, 100);
        assert_eq!(result, Ok(()));
        assert_eq!(
            steps,
            [
                Step::Open {
                    key: 0,
                    keys_hint: 5
                },
                Step::Add { key: 2 },
                Step::Add { key: 4 },
                Step::Close { pool: 0, server: 1 },
                Step::Open {
                    key: 1,
                    keys_hint: 4
                },
                Step::Close { pool: 0, server: 2 },
                Step::Executor { key: 3 },
            ]
        );
        assert_eq!(key_leg, [0, 1, 0, 2, 0]);
    }

    #[test]
    fn batches_are_cut_at_max_keys_and_at_the_line_limit() {
        let (_, steps, key_leg) = planned(&[S1; 5], &[1; 5], usize::MAX, 2);
        let closes = steps
            .iter()
            .filter(|s| matches!(s, Step::Close { .. }))
            .count();
        assert_eq!(closes, 3);
        assert_eq!(key_leg, [0, 0, 1, 1, 2]);
        // "get " + "aaaa bbbb" + CRLF = 15 bytes fits a cap of 15; a third key would not.
        let (_, _, key_leg) = planned(&[S1; 3], &[4; 3], 15, 100);
        assert_eq!(key_leg, [0, 0, 1]);
        // A key longer than the cap still goes, alone on its line.
        let (_, _, key_leg) = planned(&[S1; 2], &[40, 1], 15, 100);
        assert_eq!(key_leg, [0, 1]);
    }

    #[test]
    fn a_pool_without_servers_stops_the_plan() {
        let targets = [S1, KeyTarget::Nowhere(3), S1];
        let (result, steps, _) = planned(&targets, &[1; 3], usize::MAX, 100);
        assert_eq!(result, Err(3));
        // The first server's batch (keys 0 and 2) was planned before the empty pool's key.
        assert_eq!(steps.len(), 3);
    }

    #[test]
    fn merge_puts_values_in_client_order_and_counts_misses() {
        let replies = [
            Bytes::from_static(b"VALUE a 0 1\r\n1\r\nVALUE c 0 1\r\n3\r\nEND\r\n"),
            Bytes::from_static(b"VALUE b 0 1\r\n2\r\nEND\r\n"),
            Bytes::from_static(b"END\r\n"),
        ];
        let keys: [&[u8]; 4] = [b"a", b"b", b"c", b"d"];
        let mut out = BytesMut::new();
        let counted = merge(&replies, keys.into_iter(), &[0, 1, 0, 2], &mut out);
        assert_eq!(counted, Some((3, 1)));
        assert_eq!(
            &out[..],
            b"VALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nVALUE c 0 1\r\n3\r\nEND\r\n"
        );
    }

    #[test]
    fn merge_repeats_a_key_only_as_often_as_the_server_sent_it() {
        // The client asked for `a` twice; the server batch asked twice and answered once.
        let replies = [Bytes::from_static(b"VALUE a 0 1\r\n1\r\nEND\r\n")];
        let keys: [&[u8]; 2] = [b"a", b"a"];
        let mut out = BytesMut::new();
        assert_eq!(
            merge(&replies, keys.into_iter(), &[0, 0], &mut out),
            Some((1, 1))
        );
        assert_eq!(&out[..], b"VALUE a 0 1\r\n1\r\nEND\r\n");
    }

    #[test]
    fn an_error_line_from_one_server_is_the_whole_reply() {
        let replies = [
            Bytes::from_static(b"VALUE a 0 1\r\n1\r\nEND\r\n"),
            Bytes::from_static(b"SERVER_ERROR out of memory\r\n"),
        ];
        let keys: [&[u8]; 2] = [b"a", b"b"];
        let mut out = BytesMut::new();
        assert_eq!(merge(&replies, keys.into_iter(), &[0, 1], &mut out), None);
        assert_eq!(&out[..], b"SERVER_ERROR out of memory\r\n");
    }
}
