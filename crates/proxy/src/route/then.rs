//! What a route does once the legs of a request's pending entry have answered: the
//! continuation the session's entry holds beside its legs (`Legs`), and each kind's own
//! (`AfterFirst`, `AfterCold`, `ReplicatedWrite`, `MultiGet`, `FollowUp`). Only the data is
//! here, below the kinds: each kind's behaviour on its own continuation is an `impl` in the
//! kind's module (failover.rs, warm_up.rs, replicated.rs, multi_get.rs, plan.rs), and
//! resuming a `Then` (matching the variant, calling the kind) is resume.rs, above them. So
//! the kinds build `Start` and `Then` without a circle through the dispatch.
use bytes::Bytes;
use memroute_config::{Operation, WritePolicy};
use memroute_protocol::{Command, Request};
use memroute_routing::NodeId;
use smallvec::SmallVec;

use super::in_place::{Routed, RoutedKeys};
use super::job::Job;
use super::leg::{Leg, Legs};
use crate::buffers::Homed;
use crate::reply::Reply;

/// A route's continuation: what its entry's legs' answers lead to. Every one larger than
/// a few bytes lives in a pooled home, so that an entry stays small enough to move without
/// a call to memcpy (it is moved into the session's queue and out of it once per request).
#[derive(Debug)]
pub(crate) enum Then {
    /// The one leg's reply is the client's (a pool; shadow and random routes down to one).
    Reply,
    /// A failover's first try: a failure goes on to the later children.
    Failover(Homed<AfterFirst>),
    /// A warm-up's read of cold: a miss goes on to warm.
    WarmUp(Homed<AfterCold>),
    /// A replicated write, one leg per replica, judged as the replies arrive.
    Replicated(ReplicatedWrite),
    /// A multi-get's batches (and policy routes' groups), merged in the client's order.
    MultiGet(Homed<MultiGet>),
    /// A flush_all to every server of a pool, the replies merged into one.
    FlushAll,
    /// The general walk's future, polled in place; it sends its own requests (no legs).
    Executor(Homed<Routed>),
}

// What a route does next is at most two words, so an entry (`pending::InFlight`: the
// routing, its legs, this) stays small; pending.rs holds the entry itself to its bound.
const _: () = assert!(std::mem::size_of::<Then>() <= 16);

/// A finished entry's answer for the session to write.
pub(crate) enum Finished {
    /// One reply (the session counts a retrieval's hit or miss and honours noreply).
    Reply(Reply),
    /// Already written (a multi-get's merge); its (hits, misses) when it was no failure.
    Written(Option<(u64, u64)>),
}

/// How a request starts: its legs in flight and its route's continuation, or a pool
/// without servers yet (DNS discovery).
pub(crate) enum Start {
    Sent { legs: Legs, then: Then },
    NoServers(usize),
}

impl Start {
    /// A plain leg whose reply is the client's.
    pub(crate) fn leg(leg: Leg) -> Start {
        Start::Sent {
            legs: Legs::One(leg),
            then: Then::Reply,
        }
    }

    /// The general walk, polled in place.
    pub(crate) fn executor(routed: Routed) -> Start {
        Start::Sent {
            legs: Legs::None,
            then: Then::Executor(Homed::new(routed)),
        }
    }
}

/// The continuation of a first try to failover route `node`'s first pool: the request
/// again, for the later children.
#[derive(Debug)]
pub(crate) struct AfterFirst {
    /// Taken when it goes on.
    pub(super) job: Option<Job>,
    pub(super) node: NodeId,
}

/// The continuation of a read of warm-up route `node`'s cold pool: the request again, for
/// warm.
#[derive(Debug)]
pub(crate) struct AfterCold {
    /// Taken when it goes on.
    pub(super) job: Option<Job>,
    pub(super) node: NodeId,
}

/// The continuation of a single-key write through a replicated route whose children are
/// all pools (`write_servers`): sent to each replica's server as a plain pool's request is,
/// one leg per child in the route's order, and answered as the executor's `run` answers:
/// the write policy (`write_decision`) is asked after each reply, in child order, and its
/// first decision stands. No task and no allocation per write (the legs' home is pooled)
/// unless replicas are still writing when the client is answered (all-async, all-initial,
/// all-majority): those finish on one task that counts their failures, as the executor's
/// detached children do.
///
/// Small enough to live inline in the entry's continuation (`Then`): the latency sample
/// starts when the legs did, and all-async's answer is looked up again when it is given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplicatedWrite {
    pub(super) node: NodeId,
    pub(super) policy: WritePolicy,
    /// all-async's command, answered without waiting for any replica
    /// (`reply::immediate_ack`).
    pub(super) acks: Option<Command>,
    /// The policy's decision once made.
    pub(super) decision: Option<Decided>,
}

/// A replicated write's `WriteDecision` once made (never `Wait`), in a few bytes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Decided {
    Answer { child: u16 },
    Fail { failed: u16, total: u16 },
}

/// A multi-key retrieval split over servers.
#[derive(Debug)]
pub(crate) struct MultiGet {
    pub request: Request,
    /// The keys that reach policy routes, one group per route node, each run by the
    /// route executor in place; their replies merge after the legs' (leg index
    /// `legs.len() + group` in `key_leg`).
    pub routed: SmallVec<[RoutedKeys; 1]>,
    /// For each of the request's keys, the leg that carries it.
    pub key_leg: crate::multiget::KeyLegs,
    /// Planned over failover or warm-up routes' first pools (`multi_get_pool`):
    /// where the keys of a failed batch (or a warm-up's misses) go once every leg has
    /// answered; taken when looked at.
    pub follow_up: Option<FollowUp>,
}

/// What a multi-get planned over failover or warm-up routes' first pools (`multi_get_pool`)
/// needs to send keys on from there once its legs have answered: a failed batch's keys to
/// a failover's later children, a warm-up's cold misses to warm.
#[derive(Debug)]
pub(crate) struct FollowUp {
    /// Where the keys' routes are selected from (`RouteTable::select`): the route table's
    /// root, or a policy root itself.
    pub root: NodeId,
    pub operation: Operation,
    /// The batch line's start before its keys.
    pub head: Bytes,
    pub slot: usize,
    pub byte_cap: usize,
    /// Whether a warm-up route's keys are among the legs' (their misses must be looked for
    /// in every answered batch; otherwise only failed batches are looked at).
    pub misses: bool,
}
