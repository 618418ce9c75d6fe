//! Decisions the proxy's route executor asks for: what kind of answer a backend gave, and
//! when a replicated write has been answered enough to reply to the client.
//!
//! Both are pure functions of what has arrived so far, so the executor stays a small
//! state machine and the rules are testable as tables.
use crate::spec::WritePolicy;

/// The kind of a complete backend reply, for failover, warm-up and replicated reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyClass {
    /// Any success, including a write's NOT_STORED / NOT_FOUND / EXISTS: the backend
    /// worked and its answer is the answer.
    Hit,
    /// A retrieval found nothing.
    Miss,
    /// The backend could not answer: another child may.
    Error,
}

/// Classifies one complete backend reply: `SERVER_ERROR` / `CLIENT_ERROR` / `ERROR` lines
/// are errors; a classic retrieval reply that is exactly `END\r\n` or a meta `EN\r\n` is a
/// miss (also with echoed flags, `EN O1 kfoo`); everything else (`VALUE ..`, `STORED`, `NOT_STORED`, `DELETED`, `NOT_FOUND`,
/// `EXISTS`, `TOUCHED`, numbers, `HD`/`VA`/`NS`/`NF`/`EX`, `OK`, ...) is a hit.
/// `NOT_FOUND` for a write is not an error: failing over on it would apply the write
/// elsewhere. An empty slice is no reply at all and counts as an error.
///
/// The one judgement of hit and miss: the routes' decisions and the session's `get_hits` /
/// `get_misses` counts (where an error counts as a miss) both ask it. Judged by the first
/// byte first, as most replies are `VALUE`/`VA`/`HD`/`STORED` and decided by it.
pub fn classify_reply(reply: &[u8]) -> ReplyClass {
    match reply.first() {
        None => ReplyClass::Error,
        Some(b'S') if reply.starts_with(b"SERVER_ERROR") => ReplyClass::Error,
        Some(b'C') if reply.starts_with(b"CLIENT_ERROR") => ReplyClass::Error,
        Some(b'E') if is_error_line(reply) => ReplyClass::Error,
        // A meta miss echoes the client's opaque and key flags: `EN O123 kfoo`.
        Some(b'E') if reply == b"END\r\n" || reply == b"EN\r\n" || reply.starts_with(b"EN ") => {
            ReplyClass::Miss
        }
        _ => ReplyClass::Hit,
    }
}

/// memcached's bare `ERROR` (unknown command), possibly followed by a message; not
/// a word that merely starts with ERROR.
fn is_error_line(reply: &[u8]) -> bool {
    match reply.strip_prefix(b"ERROR") {
        Some(rest) => rest.is_empty() || rest.starts_with(b"\r") || rest.starts_with(b" "),
        None => false,
    }
}

/// What to do with a replicated write after another child answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteDecision {
    /// Not decided yet: wait for more children.
    Wait,
    /// Answer the client with this child's reply (the others still complete, unseen).
    Answer { child: usize },
    /// The write failed: answer `SERVER_ERROR` naming `failed` of `total` children.
    Fail { failed: usize, total: usize },
}

/// For a replicated write: `outcomes` per child so far (`None` = not answered yet,
/// `Some(true)` = answered without error, `Some(false)` = error or transport failure).
///
/// - `AllSync`: wait until every child answered; all ok answers with child 0, else fail.
/// - `AllInitial`: once child 0 answered, answer with it (ok or not).
/// - `AllMajority`: with `need = n/2 + 1`, `need` oks answer with the lowest-index ok
///   child; more than `n - need` failures (a majority can no longer succeed) fail.
/// - `AllAsync`: answer with child 0 once it answered (the proxy asks only for commands
///   whose reply carries data; the others it answers at once itself).
///
/// No children at all (which `RouteTable::build` rejects) fails with `0 of 0`.
pub fn write_decision(policy: WritePolicy, outcomes: &[Option<bool>]) -> WriteDecision {
    let total = outcomes.len();
    if total == 0 {
        return WriteDecision::Fail { failed: 0, total };
    }
    let failed = outcomes.iter().filter(|o| **o == Some(false)).count();
    let ok = outcomes.iter().filter(|o| **o == Some(true)).count();
    match policy {
        WritePolicy::AllSync => {
            if ok + failed < total {
                WriteDecision::Wait
            } else if failed == 0 {
                WriteDecision::Answer { child: 0 }
            } else {
                WriteDecision::Fail { failed, total }
            }
        }
        WritePolicy::AllInitial | WritePolicy::AllAsync => match outcomes[0] {
            Some(_) => WriteDecision::Answer { child: 0 },
            None => WriteDecision::Wait,
        },
        WritePolicy::AllMajority => {
            let need = total / 2 + 1;
            if ok >= need {
                let child = outcomes.iter().position(|o| *o == Some(true)).unwrap_or(0);
                WriteDecision::Answer { child }
            } else if failed > total - need {
                WriteDecision::Fail { failed, total }
            } else {
                WriteDecision::Wait
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meta_miss_with_echoed_flags_is_a_miss() {
        assert_eq!(classify_reply(b"EN O123 kfoo\r\n"), ReplyClass::Miss);
        assert_eq!(classify_reply(b"ENX\r\n"), ReplyClass::Hit);
    }
    use WriteDecision::{Answer, Fail, Wait};

    #[test]
    fn reply_classes() {
        let cases: &[(&[u8], ReplyClass)] = &[
            (b"SERVER_ERROR out of memory\r\n", ReplyClass::Error),
            (b"SERVER_ERROR backend timeout\r\n", ReplyClass::Error),
            (b"CLIENT_ERROR bad data chunk\r\n", ReplyClass::Error),
            (b"ERROR\r\n", ReplyClass::Error),
            (b"ERROR unknown\r\n", ReplyClass::Error),
            (b"", ReplyClass::Error),
            (b"END\r\n", ReplyClass::Miss),
            (b"EN\r\n", ReplyClass::Miss),
            (b"VALUE k 0 1\r\nx\r\nEND\r\n", ReplyClass::Hit),
            (b"VALUE k 0 1 99\r\nx\r\nEND\r\n", ReplyClass::Hit),
            (b"VA 1 s1\r\nx\r\n", ReplyClass::Hit),
            (b"HD\r\n", ReplyClass::Hit),
            (b"HD c12\r\n", ReplyClass::Hit),
            (b"NS\r\n", ReplyClass::Hit),
            (b"NF\r\n", ReplyClass::Hit),
            (b"EX\r\n", ReplyClass::Hit),
            (b"MN\r\n", ReplyClass::Hit),
            (b"ME k exp=-1 la=1\r\n", ReplyClass::Hit),
            (b"STORED\r\n", ReplyClass::Hit),
            (b"NOT_STORED\r\n", ReplyClass::Hit),
            (b"EXISTS\r\n", ReplyClass::Hit),
            (b"DELETED\r\n", ReplyClass::Hit),
            (b"NOT_FOUND\r\n", ReplyClass::Hit),
            (b"TOUCHED\r\n", ReplyClass::Hit),
            (b"42\r\n", ReplyClass::Hit),
            (b"OK\r\n", ReplyClass::Hit),
            (b"VERSION 1.6.21\r\n", ReplyClass::Hit),
            // Only the whole reply `END\r\n` is a miss; a value that ends in END is not.
            (b"VALUE END 0 3\r\nEND\r\nEND\r\n", ReplyClass::Hit),
            (b"ERRORS\r\n", ReplyClass::Hit),
        ];
        for (reply, expected) in cases {
            assert_eq!(
                classify_reply(reply),
                *expected,
                "{}",
                String::from_utf8_lossy(reply)
            );
        }
    }

    /// (outcomes, expected) for one policy.
    fn check(policy: WritePolicy, table: &[(&[Option<bool>], WriteDecision)]) {
        for (outcomes, expected) in table {
            assert_eq!(
                write_decision(policy, outcomes),
                *expected,
                "{policy:?} {outcomes:?}"
            );
        }
    }

    const N: Option<bool> = None;
    const T: Option<bool> = Some(true);
    const F: Option<bool> = Some(false);

    #[test]
    fn all_sync_waits_for_everyone_and_needs_every_success() {
        check(
            WritePolicy::AllSync,
            &[
                (&[N], Wait),
                (&[T], Answer { child: 0 }),
                (
                    &[F],
                    Fail {
                        failed: 1,
                        total: 1,
                    },
                ),
                (&[N, N], Wait),
                (&[T, N], Wait),
                (&[F, N], Wait),
                (&[N, T], Wait),
                (&[T, T], Answer { child: 0 }),
                (
                    &[T, F],
                    Fail {
                        failed: 1,
                        total: 2,
                    },
                ),
                (
                    &[F, T],
                    Fail {
                        failed: 1,
                        total: 2,
                    },
                ),
                (
                    &[F, F],
                    Fail {
                        failed: 2,
                        total: 2,
                    },
                ),
                (&[T, T, N], Wait),
                (&[T, T, T], Answer { child: 0 }),
                (
                    &[T, F, T],
                    Fail {
                        failed: 1,
                        total: 3,
                    },
                ),
                (
                    &[F, F, F],
                    Fail {
                        failed: 3,
                        total: 3,
                    },
                ),
            ],
        );
    }

    #[test]
    fn all_initial_and_all_async_answer_with_the_first_child() {
        for policy in [WritePolicy::AllInitial, WritePolicy::AllAsync] {
            check(
                policy,
                &[
                    (&[N], Wait),
                    (&[T], Answer { child: 0 }),
                    (&[F], Answer { child: 0 }),
                    (&[N, T], Wait),
                    (&[N, F], Wait),
                    (&[T, N], Answer { child: 0 }),
                    (&[F, T], Answer { child: 0 }),
                    (&[N, T, T], Wait),
                    (&[T, N, N], Answer { child: 0 }),
                    (&[F, F, F], Answer { child: 0 }),
                ],
            );
        }
    }

    #[test]
    fn all_majority_answers_once_a_majority_succeeded_or_could_not() {
        check(
            WritePolicy::AllMajority,
            &[
                // n = 1: need 1.
                (&[N], Wait),
                (&[T], Answer { child: 0 }),
                (
                    &[F],
                    Fail {
                        failed: 1,
                        total: 1,
                    },
                ),
                // n = 2: need 2, so one failure decides.
                (&[N, N], Wait),
                (&[T, N], Wait),
                (&[N, T], Wait),
                (&[T, T], Answer { child: 0 }),
                (
                    &[F, N],
                    Fail {
                        failed: 1,
                        total: 2,
                    },
                ),
                (
                    &[N, F],
                    Fail {
                        failed: 1,
                        total: 2,
                    },
                ),
                (
                    &[T, F],
                    Fail {
                        failed: 1,
                        total: 2,
                    },
                ),
                // n = 3: need 2; two failures decide.
                (&[N, N, N], Wait),
                (&[T, N, N], Wait),
                (&[F, N, N], Wait),
                (&[F, T, N], Wait),
                (&[T, T, N], Answer { child: 0 }),
                (&[N, T, T], Answer { child: 1 }),
                (&[F, T, T], Answer { child: 1 }),
                (&[T, F, T], Answer { child: 0 }),
                (
                    &[F, F, N],
                    Fail {
                        failed: 2,
                        total: 3,
                    },
                ),
                (
                    &[F, N, F],
                    Fail {
                        failed: 2,
                        total: 3,
                    },
                ),
                (
                    &[T, F, F],
                    Fail {
                        failed: 2,
                        total: 3,
                    },
                ),
            ],
        );
    }

    #[test]
    fn no_children_fail() {
        for policy in [
            WritePolicy::AllSync,
            WritePolicy::AllAsync,
            WritePolicy::AllInitial,
            WritePolicy::AllMajority,
        ] {
            assert_eq!(
                write_decision(policy, &[]),
                Fail {
                    failed: 0,
                    total: 0
                }
            );
        }
    }
}
