//! A multi-get's plan and merge, without sockets: which keys go to which server in which
//! batch (`plan`), and the client's reply built from the servers' replies in the client's
//! key order (`merge`). `dispatch` runs the plan (writes each key straight into its
//! server connection's outgoing buffer as the plan reaches it) and `pending` merges when
//! every leg has answered.
//!
//! ```text
//!   keys  a b c d e       targets  S1 S2 S1 X S1   (X: a policy route, via the executor)
//!   plan (one pass):  Open(0: S1, a) Open(1: S2, b) Add(0, c) Add(0, e)
//!                     Close(0) Close(1)  Executor(2, d)   (executor legs after every batch)
//!         legs   0: S1 "a c e"             1: S2 "b"          2: d
//!   merge: walk a..e, take each leg's next VALUE block when it is for this key
//! ```
//!
//! A key that joined an identical get in flight (`KeyTarget::Joined`, collapsing), or that
//! is hot and leads a get of its own (`KeyTarget::Lead`), is a leg of its own, numbered
//! where the pass meets it; the merge takes its block from that get's reply as from a
//! batch's.
//!
//! Per key the plan keeps one `u32` (its leg); the keys themselves stay in the client's
//! line, and each is copied once, into the outgoing buffer of its server's connection.
use bytes::{Bytes, BytesMut};
use memroute_protocol::{retrieval_error, value_block_for};
use smallvec::SmallVec;

/// Where one key of a multi-get goes: a server of a plain pool (batched with the other
/// keys of that server), or the route executor (one leg per key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyTarget {
    Server(u32, u32),
    Executor,
    /// A pool with no servers (DNS discovery found none yet).
    Nowhere(u32),
    /// A server of a plain pool whose connection has an identical single-key get of this
    /// key in flight, which the key joined (`collapse::join_key`): a leg of its own, sent
    /// nothing.
    Joined(u32, u32),
    /// A hot key of a plain pool's server that no get in flight there answers: sent alone
    /// (`get K`), after the batches, as a get later gets of it may join
    /// (`collapse::lead_key`): a leg of its own.
    Lead(u32, u32),
}

/// One step of a multi-get's plan, in the order the writes and sends must happen. Legs
/// are numbered in the order they open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step<'k> {
    /// Leg `leg` starts a batch line to `server` of `pool` with `key`.
    Open {
        leg: usize,
        pool: usize,
        server: usize,
        key: &'k [u8],
    },
    /// `key` joins leg `leg`'s open batch line.
    Add { leg: usize, key: &'k [u8] },
    /// Leg `leg`'s batch line is complete: end it and send it.
    Close { leg: usize },
    /// `key` joined a get in flight to `server` of `pool` (`KeyTarget::Joined`): leg
    /// `leg`, its reply that get's.
    Joined {
        leg: usize,
        pool: usize,
        server: usize,
        key: &'k [u8],
    },
    /// `key` leads a get of its own to `server` of `pool` (`KeyTarget::Lead`): leg `leg`,
    /// sent by the caller once the plan is done (a batch line to that server may be open
    /// until then).
    Lead {
        leg: usize,
        pool: usize,
        server: usize,
        key: &'k [u8],
    },
    /// `key` goes through the route executor, as leg `leg` of its own. These come after
    /// every batch is closed: the executor may send on the same connections at once.
    Executor { leg: usize, key: &'k [u8] },
}

/// Per key of a multi-get, the leg that carries it (inline for up to 32 keys), or
/// [`NO_LEG`].
pub(crate) type KeyLegs = SmallVec<[u32; 32]>;

/// A key no leg carries: it goes to the route executor (`Step::Executor`). Kept in the
/// same `u32` as a leg's index so the table stays four bytes a key; no request has this
/// many legs.
pub(crate) const NO_LEG: u32 = u32::MAX;

/// A batch line being written.
#[derive(Debug, Clone, Copy)]
struct Open {
    pool: u32,
    server: u32,
    leg: u32,
    keys: u32,
    line_len: usize,
}

/// Plans a multi-get in one pass over its keys (`keys` yields each key and its target,
/// in the client's order, computed as the pass reaches it): each server's keys in client
/// order, cut into batches of `batch_size(pool)` keys and of lines at most `byte_cap`
/// bytes (`head_len` + keys with single spaces + CRLF); keys for the executor each on a
/// leg of their own, after the batches. `key_leg` gets, per key, the index of the leg
/// that carries it. `retarget`, when there is one, may change each key's target as the
/// pass reaches it (collapsing: a key that joins a get in flight or leads one); without
/// one a key costs a compare more, where an adapter on `keys` cost a copy of each.
///
/// Returns `Err(pool)` at the first key whose pool has no servers; batches already closed
/// have been sent (their replies are dropped), open ones are not closed.
pub(crate) fn plan<'k>(
    keys: impl Iterator<Item = (&'k [u8], KeyTarget)>,
    mut retarget: Option<impl FnMut(&'k [u8], KeyTarget) -> KeyTarget>,
    head_len: usize,
    byte_cap: usize,
    batch_size: impl Fn(usize) -> usize,
    key_leg: &mut KeyLegs,
    mut step: impl FnMut(Step<'k>),
) -> Result<(), usize> {
    // At most one open batch per server; few servers per request, so a short list
    // searched from the most recently used end.
    let mut open: SmallVec<[Open; 8]> = SmallVec::new();
    let mut executor: SmallVec<[(u32, &'k [u8]); 2]> = SmallVec::new();
    let mut legs: u32 = 0;
    for (index, (key, target)) in keys.enumerate() {
        let target = match &mut retarget {
            Some(retarget) => retarget(key, target),
            None => target,
        };
        let (pool, server) = match target {
            KeyTarget::Server(pool, server) => (pool, server),
            KeyTarget::Nowhere(pool) => return Err(pool as usize),
            KeyTarget::Executor => {
                executor.push((index as u32, key));
                key_leg.push(NO_LEG);
                continue;
            }
            // A key that joined a get in flight, or leads one: a leg of its own.
            joined_or_lead => {
                key_leg.push(legs);
                if let Some(own) = own_leg(joined_or_lead, legs as usize, key) {
                    step(own);
                }
                legs += 1;
                continue;
            }
        };
        let found = open
            .iter()
            .rposition(|o| o.pool == pool && o.server == server);
        let joins = found.filter(|&at| {
            let batch = &open[at];
            (batch.keys as usize) < batch_size(pool as usize)
                && batch.line_len + 1 + key.len() + 2 <= byte_cap
        });
        match joins {
            Some(at) => {
                let batch = &mut open[at];
                batch.keys += 1;
                batch.line_len += 1 + key.len();
                key_leg.push(batch.leg);
                step(Step::Add {
                    leg: batch.leg as usize,
                    key,
                });
            }
            None => {
                // The server's batch is full (or there is none yet): a new leg.
                if let Some(at) = found {
                    step(Step::Close {
                        leg: open.remove(at).leg as usize,
                    });
                }
                open.push(Open {
                    pool,
                    server,
                    leg: legs,
                    keys: 1,
                    line_len: head_len + key.len(),
                });
                key_leg.push(legs);
                step(Step::Open {
                    leg: legs as usize,
                    pool: pool as usize,
                    server: server as usize,
                    key,
                });
                legs += 1;
            }
        }
    }
    for batch in open {
        step(Step::Close {
            leg: batch.leg as usize,
        });
    }
    for (index, key) in executor {
        key_leg[index as usize] = legs;
        step(Step::Executor {
            leg: legs as usize,
            key,
        });
        legs += 1;
    }
    Ok(())
}

/// The step of `key`, a leg of its own (`leg`): it leads a get of its own to its server
/// (`KeyTarget::Lead`), or joined one in flight there (`KeyTarget::Joined`); `None` for
/// any other target, which `plan` places itself. Out of the plan's loop, which matches
/// these two as one arm: most keys are batched, and the loop's match stays small.
#[cold]
fn own_leg(target: KeyTarget, leg: usize, key: &[u8]) -> Option<Step<'_>> {
    match target {
        KeyTarget::Lead(pool, server) => Some(Step::Lead {
            leg,
            pool: pool as usize,
            server: server as usize,
            key,
        }),
        KeyTarget::Joined(pool, server) => Some(Step::Joined {
            leg,
            pool: pool as usize,
            server: server as usize,
            key,
        }),
        KeyTarget::Server(..) | KeyTarget::Executor | KeyTarget::Nowhere(_) => None,
    }
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
        // The block is this key's when its header names it (found without reading the
        // header's key a second time: `value_block_for` compares it with this key).
        match value_block_for(reply, cursor[leg], key) {
            Some(block) => {
                out.extend_from_slice(&reply[block.clone()]);
                cursor[leg] = block.end;
                hits += 1;
            }
            None => misses += 1,
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

    const NAMES: [&[u8]; 8] = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"];

    /// The steps and key_leg of a plan over `keys` (head "get ").
    fn planned<'k>(
        keys: &[(&'k [u8], KeyTarget)],
        byte_cap: usize,
        batch: usize,
    ) -> (Result<(), usize>, Vec<Step<'k>>, KeyLegs) {
        let mut key_leg = KeyLegs::new();
        let mut steps = Vec::new();
        let result = plan(
            keys.iter().copied(),
            None::<fn(&'k [u8], KeyTarget) -> KeyTarget>,
            4,
            byte_cap,
            |_| batch,
            &mut key_leg,
            |s| steps.push(s),
        );
        (result, steps, key_leg)
    }

    #[test]
    fn a_key_is_planned_where_retarget_sends_it() {
        // Key b retargeted as a join: planned as a key placed as joined is.
        let keys = named(&[S1, S1, S1, S2]);
        let joined_b = |key: &[u8], target| match key {
            b"b" => KeyTarget::Joined(0, 1),
            _ => target,
        };
        let mut key_leg = KeyLegs::new();
        let mut steps = Vec::new();
        let result = plan(
            keys.iter().copied(),
            Some(joined_b),
            4,
            usize::MAX,
            |_| 100,
            &mut key_leg,
            |s| steps.push(s),
        );
        let as_placed = named(&[S1, KeyTarget::Joined(0, 1), S1, S2]);
        assert_eq!(
            (result, steps, key_leg),
            planned(&as_placed, usize::MAX, 100)
        );
    }

    fn named(targets: &[KeyTarget]) -> Vec<(&'static [u8], KeyTarget)> {
        NAMES.iter().copied().zip(targets.iter().copied()).collect()
    }

    #[test]
    fn keys_are_batched_per_server_in_one_pass_and_executor_keys_go_last() {
        let keys = named(&[S1, S2, S1, KeyTarget::Executor, S1]);
        let (result, steps, key_leg) = planned(&keys, usize::MAX, 100);
        assert_eq!(result, Ok(()));
        assert_eq!(
            steps,
            [
                Step::Open {
                    leg: 0,
                    pool: 0,
                    server: 1,
                    key: b"a"
                },
                Step::Open {
                    leg: 1,
                    pool: 0,
                    server: 2,
                    key: b"b"
                },
                Step::Add { leg: 0, key: b"c" },
                Step::Add { leg: 0, key: b"e" },
                Step::Close { leg: 0 },
                Step::Close { leg: 1 },
                Step::Executor { leg: 2, key: b"d" },
            ]
        );
        assert_eq!(key_leg[..], [0, 1, 0, 2, 0]);
    }

    #[test]
    fn a_joined_key_is_a_leg_of_its_own_where_the_pass_meets_it() {
        let joined = KeyTarget::Joined(0, 1);
        let keys = named(&[S1, joined, S1, S2]);
        let (result, steps, key_leg) = planned(&keys, usize::MAX, 100);
        assert_eq!(result, Ok(()));
        assert_eq!(
            steps[1],
            Step::Joined {
                leg: 1,
                pool: 0,
                server: 1,
                key: b"b"
            }
        );
        assert_eq!(steps[2], Step::Add { leg: 0, key: b"c" });
        assert_eq!(key_leg[..], [0, 1, 0, 2]);
        // A key that leads is numbered the same way.
        let keys = named(&[S1, KeyTarget::Lead(0, 1), S1, S2]);
        let (_, lead_steps, lead_key_leg) = planned(&keys, usize::MAX, 100);
        assert_eq!(
            lead_steps[1],
            Step::Lead {
                leg: 1,
                pool: 0,
                server: 1,
                key: b"b"
            }
        );
        assert_eq!(lead_key_leg, key_leg);
        // Merged from a single get's reply as from a batch's.
        let replies = [
            Bytes::from_static(b"VALUE a 0 1\r\n1\r\nVALUE c 0 1\r\n3\r\nEND\r\n"),
            Bytes::from_static(b"VALUE b 0 1\r\n2\r\nEND\r\n"),
            Bytes::from_static(b"END\r\n"),
        ];
        let mut out = BytesMut::new();
        let counted = merge(&replies, NAMES[..4].iter().copied(), &key_leg, &mut out);
        assert_eq!(counted, Some((3, 1)));
        assert_eq!(
            &out[..],
            b"VALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nVALUE c 0 1\r\n3\r\nEND\r\n"
        );
    }

    #[test]
    fn batches_are_cut_at_max_keys_and_at_the_line_limit() {
        let (_, steps, key_leg) = planned(&named(&[S1; 5]), usize::MAX, 2);
        let closes = steps
            .iter()
            .filter(|s| matches!(s, Step::Close { .. }))
            .count();
        assert_eq!(closes, 3);
        assert_eq!(key_leg[..], [0, 0, 1, 1, 2]);
        // "get " + "aaaa bbbb" + CRLF = 15 bytes fits a cap of 15; a third key would not.
        let four: [(&[u8], KeyTarget); 3] = [(b"aaaa", S1), (b"bbbb", S1), (b"cccc", S1)];
        let (_, _, key_leg) = planned(&four, 15, 100);
        assert_eq!(key_leg[..], [0, 0, 1]);
        // A key longer than the cap still goes, alone on its line.
        let long = [0u8; 40];
        let (_, _, key_leg) = planned(&[(&long[..], S1), (b"a", S1)], 15, 100);
        assert_eq!(key_leg[..], [0, 1]);
        // Two servers filling up in turn: each closes its own batch only.
        let (_, steps, key_leg) = planned(&named(&[S1, S2, S1, S2, S1, S2]), usize::MAX, 2);
        assert_eq!(key_leg[..], [0, 1, 0, 1, 2, 3]);
        assert_eq!(steps[4], Step::Close { leg: 0 });
    }

    #[test]
    fn a_pool_without_servers_stops_the_plan() {
        let keys = named(&[S1, KeyTarget::Nowhere(3), S1]);
        let (result, steps, _) = planned(&keys, usize::MAX, 100);
        assert_eq!(result, Err(3));
        // The first server's batch was opened, never closed (the dispatcher drops it).
        assert_eq!(steps.len(), 1);
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
