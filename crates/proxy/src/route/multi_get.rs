//! A multi-get as the session's own legs: planned in one pass over its keys
//! (`start_multi_get`, batches per server by `pool::send_batches`), each policy route's keys
//! planned by its kind where it can (`multi_get_pool`), and what goes on once the legs
//! have answered (`MultiGet::fail_over`: a failover's failed batches, a warm-up's misses,
//! handed to their kinds by `FollowUp::start`).
use std::cell::Cell;
use std::rc::Rc;
use std::task::Context;

use bytes::{Bytes, BytesMut};
use memroute_config::Operation;
use memroute_protocol::{retrieval_error, value_block_for, Request};
use memroute_routing::{operation_of, Node, NodeId};
use smallvec::SmallVec;

use super::failover::FirstMisses;
use super::in_place::RoutedKeys;
use super::job::{MultiJob, MultiReply};
use super::leg::{Leg, Legs};
use super::nearest;
use super::plan::{goes_on, multi_get_pool, start_multi, GoingOn, Planned};
use super::pool::{send_batches, Batched};
use super::random::RandomPicks;
use super::shadow;
use super::then::{FollowUp, MultiGet, Start, Then};
use super::vocabulary::GoesOn;
use crate::buffers::Homed;
use crate::multiget::{self, KeyTarget};
use crate::reply::server_error;
use crate::snapshot::RouteSnapshot;

impl MultiGet {
    /// Whether anything moves on while the entry is not the head of the session's queue:
    /// a follow-up to start, or policy routes' groups to poll.
    pub(crate) fn moves_on(&self) -> bool {
        self.follow_up.is_some() || !self.routed.is_empty()
    }

    /// Takes in what arrived on `legs` (looked for now with `None`, or polled with the
    /// session's waker); once every leg has answered, starts what goes on from them
    /// (`fail_over`); polls the policy routes' groups alongside the legs, not after them
    /// (a failover's next child must not wait for the plain pools' batches). True once
    /// every leg and group is complete.
    pub(crate) fn advance(
        &mut self,
        routing: &Rc<RouteSnapshot>,
        legs: &mut [Leg],
        mut context: Option<&mut Context<'_>>,
    ) -> bool {
        let legs_done = legs
            .iter_mut()
            .all(|leg| leg.arrived(context.as_deref_mut()));
        if legs_done && self.follow_up.is_some() {
            self.fail_over(routing, legs);
        }
        let mut groups_done = true;
        for routed in &mut self.routed {
            groups_done &= routed.advance(context.as_deref_mut());
        }
        legs_done && groups_done
    }

    /// Once every leg has answered: the keys that go on from their route's first pool
    /// (`goes_on`) form one more group per route: a failover's keys of the batches
    /// that failed (each failure counted against its server, as a failed leg always is; a
    /// failed leg all of whose keys went on then stands for none), a warm-up's keys its
    /// batch answered as misses. True when such a group was started.
    ///
    /// Nothing goes on when a failed batch stays (one of its keys has no later child to
    /// go to): the client's reply is that failure whatever the later children answer, so
    /// their backend work would be wasted.
    fn fail_over(&mut self, routing: &Rc<RouteSnapshot>, legs: &mut [Leg]) -> bool {
        let Some(rest) = self.follow_up.take() else {
            return false;
        };
        let outcomes = self.batch_outcomes(legs, rest.misses);
        let outcomes = &outcomes[..];
        let any_failed = outcomes.contains(&Batch::Failed);
        if !any_failed && !outcomes.contains(&Batch::Missed) {
            return false;
        }
        let routes = &routing.routes;
        // Where a key goes on from (`goes`: why it would), or `None` when it stays.
        let going_on = |key: &[u8], goes: GoesOn| {
            let node = routes.select(rest.root, rest.operation, key);
            let route_goes = goes_on(routing, node);
            route_goes.takes(goes).then_some((node, route_goes))
        };
        if any_failed && self.a_failed_batch_stays(routing, legs, outcomes, &going_on) {
            return false;
        }
        let groups = self.group_going_on(legs, outcomes, &going_on);
        // Every key of a failed batch went on: the batch stands for none.
        for (leg, &outcome) in legs.iter_mut().zip(outcomes) {
            if outcome == Batch::Failed {
                let _ = leg.take(routing);
                leg.reply = Some(Ok(Bytes::from_static(b"END\r\n")));
            }
        }
        if groups.is_empty() {
            return false;
        }
        let started = legs.first().map(|leg| leg.started);
        let started = started.unwrap_or_else(|| routing.metrics.now());
        for going in groups {
            let routed = rest.start(routing, going, started);
            self.routed.push(routed);
        }
        true
    }

    /// Per leg: failed, or (with `misses` to look for) answered with fewer VALUE blocks
    /// than it asked keys for. The framing counted each batch's blocks (`value_blocks`);
    /// servers answer each key asked at most once, in the order asked, so a batch whose
    /// count is its key count hit every key and is not walked here: only the merge
    /// walks it (when cold hits every key, the common case, nothing is walked twice).
    #[inline]
    fn batch_outcomes(&self, legs: &[Leg], misses: bool) -> SmallVec<[Batch; 8]> {
        let batches = legs.len();
        let mut outcomes: SmallVec<[Batch; 8]> = smallvec::smallvec![Batch::Hit; batches];
        if misses {
            let mut asked: SmallVec<[u32; 8]> = smallvec::smallvec![0; batches];
            let asked = &mut asked[..];
            for &leg in &self.key_leg {
                if let Some(asked) = asked.get_mut(leg as usize) {
                    *asked += 1;
                }
            }
            for ((outcome, leg), &asked) in outcomes.iter_mut().zip(legs).zip(&*asked) {
                *outcome = match leg.failed() {
                    true => Batch::Failed,
                    false if leg.value_blocks() == Some(asked) => Batch::Hit,
                    false => Batch::Missed,
                };
            }
        } else {
            for (outcome, leg) in outcomes.iter_mut().zip(legs) {
                if leg.failed() {
                    *outcome = Batch::Failed;
                }
            }
        }
        outcomes
    }

    /// Whether a key of a failed batch stays (a plain pool's key in a failed batch fails
    /// the multi-get). Then the reply is decided: the first failure of a batch that
    /// stays, as when the others' keys had gone on (their failures counted, not shown).
    #[inline]
    fn a_failed_batch_stays(
        &self,
        routing: &Rc<RouteSnapshot>,
        legs: &mut [Leg],
        outcomes: &[Batch],
        going_on: &impl Fn(&[u8], GoesOn) -> Option<(NodeId, GoesOn)>,
    ) -> bool {
        // Per failed leg: whether a key stays.
        let mut stays: SmallVec<[bool; 4]> = smallvec::smallvec![false; legs.len()];
        for (range, &leg) in self.request.keys.iter().zip(&self.key_leg) {
            let leg = leg as usize;
            if outcomes.get(leg) == Some(&Batch::Failed) && !stays[leg] {
                let key = &self.request.frame[range.clone()];
                stays[leg] = going_on(key, GoesOn::Failed).is_none();
            }
        }
        if !stays.contains(&true) {
            return false;
        }
        for (leg, _) in legs.iter_mut().zip(&stays).filter(|(_, &s)| !s) {
            if leg.failed() {
                let _ = leg.take(routing);
                leg.reply = Some(Ok(Bytes::from_static(b"END\r\n")));
            }
        }
        true
    }

    /// The keys that go on, one group per route they reached, in the client's order:
    /// those of failed batches, and those a batch walked for misses did not hit. Each
    /// key's leg becomes its group's (`legs.len() + routed + group`).
    #[inline]
    fn group_going_on(
        &mut self,
        legs: &[Leg],
        outcomes: &[Batch],
        going_on: &impl Fn(&[u8], GoesOn) -> Option<(NodeId, GoesOn)>,
    ) -> SmallVec<[GoingOn; 1]> {
        let batches = legs.len();
        let first_group = (batches + self.routed.len()) as u32;
        let mut groups: SmallVec<[GoingOn; 1]> = SmallVec::new();
        // Per leg walked for misses: where its next VALUE block starts.
        let mut cursor: SmallVec<[usize; 4]> = smallvec::smallvec![0; batches];
        for (range, key_leg) in self.request.keys.iter().zip(self.key_leg.iter_mut()) {
            let leg = *key_leg as usize;
            if leg >= batches {
                continue;
            }
            let key = &self.request.frame[range.clone()];
            let goes = match (outcomes[leg], &legs[leg].reply) {
                (Batch::Hit, _) => continue,
                (Batch::Failed, _) => GoesOn::Failed,
                (Batch::Missed, Some(Ok(reply))) => {
                    match value_block_for(reply, cursor[leg], key) {
                        // A hit: its block is the leg's next (servers answer in the order asked),
                        // found as the merge finds it (the header compared with this key).
                        Some(block) => {
                            cursor[leg] = block.end;
                            continue;
                        }
                        None => GoesOn::Missed,
                    }
                }
                _ => continue,
            };
            // A miss anywhere but a warm-up or an error-or-miss failover is a miss.
            let Some((node, route_goes)) = going_on(key, goes) else {
                continue;
            };
            let group = match groups.iter().position(|g| g.node == node) {
                Some(group) => group,
                None => {
                    groups.push(GoingOn {
                        node,
                        tried: legs[leg].pool() as NodeId,
                        keys: Vec::new(),
                        missed: FirstMisses::default(),
                    });
                    groups.len() - 1
                }
            };
            let going = &mut groups[group];
            going.keys.push(self.request.frame.slice(range.clone()));
            going.missed.note(route_goes, goes);
            *key_leg = first_group + group as u32;
        }
        groups
    }

    /// The client's reply, written into `out`: the batches (and groups) merged in the
    /// client's key order, or the failure that fails the multi-get. Its (hits, misses)
    /// when it was no failure. One latency sample per request, under the route of its
    /// first leg (or group).
    pub(crate) fn finish(
        &mut self,
        routing: &RouteSnapshot,
        legs: &mut [Leg],
        out: &mut BytesMut,
    ) -> Option<(u64, u64)> {
        if let Some(first) = legs.first() {
            first.observe(routing);
        } else if let Some(first) = self.routed.first() {
            routing
                .metrics
                .observe_since(first.route as usize, first.started);
        }
        if let ([], [group]) = (&*legs, &mut self.routed[..]) {
            // Every key went through one policy route, in the client's order: a pool's
            // batches are merged straight into the client's reply, a reply built per key
            // is the client's.
            let (reply, hits) = match group.take() {
                MultiReply::Batches { replies, key_leg } => {
                    let keys = self.request.keys();
                    return multiget::merge(&replies, keys, &key_leg, out);
                }
                MultiReply::Built(reply, hits) => (reply, u64::from(hits)),
            };
            return match reply {
                Ok(bytes) => {
                    out.extend_from_slice(&bytes);
                    retrieval_error(&bytes).is_none().then(|| {
                        let misses = (self.request.keys.len() as u64).saturating_sub(hits);
                        (hits, misses)
                    })
                }
                Err(error) => {
                    server_error(out, &error);
                    None
                }
            };
        }
        let mut replies: SmallVec<[Bytes; 4]> = SmallVec::with_capacity(legs.len());
        for leg in legs.iter_mut() {
            match leg.take(routing) {
                Ok(bytes) => replies.push(bytes),
                // One failed server fails the whole reply: a partial answer would look
                // like misses.
                Err(error) => {
                    server_error(out, &error);
                    return None;
                }
            }
        }
        let batches = legs.len() as u32;
        for (group, routed) in self.routed.iter_mut().enumerate() {
            // The group's keys: the client's keys its leg carries, in order.
            let leg = batches + group as u32;
            let keys = self.request.keys().zip(&self.key_leg);
            let keys = keys
                .filter(|(_, &key_leg)| key_leg == leg)
                .map(|(key, _)| key);
            match routed.take().into_reply(keys).0 {
                Ok(bytes) => replies.push(bytes),
                Err(error) => {
                    server_error(out, &error);
                    return None;
                }
            }
        }
        multiget::merge(&replies, self.request.keys(), &self.key_leg, out)
    }
}

/// What a multi-get's batch answered, as `MultiGet::fail_over` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// Every key asked (or no misses looked for).
    Hit,
    /// Answered, with fewer VALUE blocks than keys asked: walked for the misses.
    Missed,
    /// No answer, or an error line.
    Failed,
}

/// How many of a multi-get's keys are placed at once when they all go to one pool: a
/// 20-key get in two steps, room on the stack for both arrays, none on the heap.
const PLACED_AHEAD: usize = 16;

/// Plans a multi-get from `root` in one pass over its keys: the keys of plain pools, and
/// of policy routes whose kind plans them over a pool (`multi_get_pool`), batched per
/// server as the session's own legs (`send_legs`); the other policy routes' keys grouped
/// per route node for the general walk (`ExecutorGroups`); the shadow routes' copies; and
/// what goes on once the legs answer (`FollowUp`). `head` is the batch line's start
/// (`get `), `byte_cap` the longest batch line. `Err(pool)`: a pool without servers.
pub(crate) fn start_multi_get(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    slot: usize,
    request: Request,
    head: Bytes,
    byte_cap: usize,
) -> Start {
    // A resize window: every key through the general walk (`resize::run_multi`).
    if routing.resizing {
        return route_every_key(routing, root, slot, request, head, byte_cap);
    }
    let policy_root = !matches!(
        routing.routes.node(root),
        Node::Pool(_) | Node::Prefix { .. } | Node::Operation { .. }
    );
    let mut found = Found {
        goes_on: None,
        last: None,
        copies: SmallVec::new(),
        picks: RandomPicks::new(),
    };
    let root_planned = match policy_root {
        true => match multi_get_pool(routing, root, &mut found.picks) {
            Some(planned) => Some(planned),
            None => return route_every_key(routing, root, slot, request, head, byte_cap),
        },
        false => None,
    };
    if let Some(planned) = root_planned {
        found.goes_on = with_goes_on(None, planned.goes_on);
        let keys = request.keys.len() as u64;
        nearest::count_reads(routing, root, planned.pool as NodeId, keys);
    }
    let operation = operation_of(&request);
    let job_of = |keys| MultiJob {
        operation,
        head: head.clone(),
        keys,
        slot,
        byte_cap,
    };
    let shape = Shape {
        routing,
        root,
        operation,
        request: &request,
        root_planned,
    };
    let Sent {
        legs,
        mut key_leg,
        executor,
    } = match send_legs(shape, &head, slot, byte_cap, &mut found) {
        Ok(sent) => sent,
        Err(pool) => return Start::NoServers(pool),
    };
    let routed = executor.start(routing, legs.len() as u32, &mut key_leg, job_of);
    // The shadow routes' copies of the keys in their ranges, one batch per route; they ask
    // with the client's command line head, as the executor's groups do.
    for (node, keys) in found.copies {
        shadow::copy_planned_keys(routing, node, job_of(keys));
    }
    // Keys of a batch that fails on a failover's first pool go on to its later children,
    // a warm-up's cold misses to warm.
    let follow_up = found.goes_on.map(|misses| FollowUp {
        root,
        operation,
        head: head.clone(),
        slot,
        byte_cap,
        misses,
    });
    Start::Sent {
        legs: Legs::many(legs),
        then: Then::MultiGet(Homed::new(MultiGet {
            request,
            routed,
            key_leg,
            follow_up,
        })),
    }
}

/// A multi-get whose root is a policy route the session cannot plan (a fastest read, a
/// failover whose first child is a route, ...): every key reaches it, one group for the
/// general walk, nothing to plan here.
fn route_every_key(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    slot: usize,
    request: Request,
    head: Bytes,
    byte_cap: usize,
) -> Start {
    for _ in 0..request.keys.len() {
        routing.metrics.count(root as usize, request.command);
    }
    let job = MultiJob {
        operation: operation_of(&request),
        head,
        keys: request
            .keys
            .iter()
            .map(|range| request.frame.slice(range))
            .collect(),
        slot,
        byte_cap,
    };
    let routed = smallvec::smallvec![start_multi(routing, root, job, routing.metrics.now())];
    let key_leg = smallvec::smallvec![0; request.keys.len()];
    Start::Sent {
        legs: Legs::None,
        then: Then::MultiGet(Homed::new(MultiGet {
            request,
            routed,
            key_leg,
            follow_up: None,
        })),
    }
}

/// The multi-get being planned and where its root leads.
#[derive(Clone, Copy)]
struct Shape<'r> {
    routing: &'r RouteSnapshot,
    root: NodeId,
    operation: Operation,
    request: &'r Request,
    /// Where the keys are planned when the root is a policy route (`multi_get_pool`).
    root_planned: Option<Planned>,
}

/// What the plan's pass over the keys finds besides their targets.
struct Found {
    /// What goes on after the legs' answers (a failover's failed batches, a warm-up's
    /// cold misses): `None`, `Some(false)` (failed batches only), `Some(true)` (misses
    /// too).
    goes_on: Option<bool>,
    /// The last route node reached and where its keys are planned (looked up once per
    /// multi-get and node).
    last: Option<(NodeId, Option<Planned>)>,
    /// Per shadow route, the keys in its range it copies.
    copies: ShadowCopies,
    /// The random routes' picks for this multi-get (`multi_get_pool`).
    picks: RandomPicks,
}

/// A multi-get's batches as sent (`send_legs`).
struct Sent {
    legs: SmallVec<[Leg; 4]>,
    /// For each key, its leg: a batch, or (numbered after the batches, one per key) the
    /// executor (`ExecutorGroups::start` numbers those).
    key_leg: multiget::KeyLegs,
    executor: ExecutorGroups,
}

/// Plans the keys (`key_targets`) and sends their batches as the session's own legs, the
/// keys that reach policy routes it cannot plan grouped for the executor.
fn send_legs(
    shape: Shape<'_>,
    head: &[u8],
    slot: usize,
    byte_cap: usize,
    found: &mut Found,
) -> Result<Sent, usize> {
    let Shape {
        routing,
        root,
        operation,
        request,
        ..
    } = shape;
    // The route node of the key the plan is at: its legs' latency is recorded under it.
    let current = Cell::new(root);
    let targets = key_targets(shape, &current, found);
    let mut key_leg = multiget::KeyLegs::new();
    key_leg.reserve_exact(request.keys.len());
    let mut legs: SmallVec<[Leg; 4]> = SmallVec::new();
    let mut executor = ExecutorGroups::default();
    let planned = send_batches(
        routing,
        head,
        slot,
        byte_cap,
        targets,
        &mut key_leg,
        |batched| match batched {
            Batched::Opened { pool, server } => {
                // Through a policy route, latency is recorded under the route's name.
                let leg = Leg::writing(pool, server, routing.metrics.now());
                legs.push(leg.on_route(current.get()));
            }
            Batched::Sent { leg, receiver } => legs[leg].sent(receiver),
            Batched::Joined {
                pool,
                server,
                receiver,
            } => {
                let mut leg = Leg::writing(pool, server, routing.metrics.now());
                leg.sent(receiver);
                legs.push(leg.on_route(current.get()));
            }
            Batched::Executor { key } => {
                let node = routing.routes.select(root, operation, key);
                executor.add(node, request.frame.slice_ref(key), request.keys.len());
            }
        },
    );
    // A pool without servers: its batches already sent are answered and dropped.
    planned?;
    Ok(Sent {
        legs,
        key_leg,
        executor,
    })
}

/// Where each key goes, decided as the plan's one pass reaches it. When every key goes to
/// one pool (a plain pool's root, or a policy root planned over a pool), keys are placed
/// a chunk ahead, together (`RouteSnapshot::servers_for`: their hashes interleaved). Each
/// key is counted once, as cmd_get counts keys.
fn key_targets<'r>(
    shape: Shape<'r>,
    current: &'r Cell<NodeId>,
    found: &'r mut Found,
) -> impl Iterator<Item = (&'r [u8], KeyTarget)> + 'r {
    let Shape {
        routing,
        root,
        operation,
        request,
        root_planned,
    } = shape;
    let routes = &routing.routes;
    let one_pool = match (root_planned, routes.node(root)) {
        (Some(planned), _) => Some(planned.pool),
        (None, &Node::Pool(pool)) => Some(pool),
        _ => None,
    };
    let root_shadow = root_planned.and_then(|planned| planned.shadow);
    let mut keys = request.keys();
    let mut ahead_keys: [&[u8]; PLACED_AHEAD] = [&[]; PLACED_AHEAD];
    let mut ahead: [u32; PLACED_AHEAD] = [0; PLACED_AHEAD];
    let (mut at, mut placed, mut nowhere) = (0, 0, false);
    let command = request.command;
    let frame = &request.frame;
    std::iter::from_fn(move || {
        let Some(pool) = one_pool else {
            let key = keys.next()?;
            let node = routes.select(root, operation, key);
            current.set(node);
            routing.metrics.count(node as usize, command);
            let planned = match routes.node(node) {
                &Node::Pool(pool) => Some(Planned {
                    pool,
                    goes_on: GoesOn::Never,
                    shadow: None,
                }),
                // A policy route: planned here too where its semantics allow.
                _ => match found.last {
                    Some((seen, planned)) if seen == node => planned,
                    _ => {
                        let planned = multi_get_pool(routing, node, &mut found.picks);
                        if let Some(planned) = planned {
                            found.goes_on = with_goes_on(found.goes_on, planned.goes_on);
                        }
                        found.last = Some((node, planned));
                        planned
                    }
                },
            };
            let Some(planned) = planned else {
                return Some((key, KeyTarget::Executor));
            };
            nearest::count_reads(routing, node, planned.pool as NodeId, 1);
            if let Some(shadow) = planned.shadow {
                add_copy(&mut found.copies, routing, shadow, frame, key);
            }
            let target = match routing.server_for(planned.pool, key) {
                Some(server) => KeyTarget::Server(planned.pool as u32, server as u32),
                None => KeyTarget::Nowhere(planned.pool as u32),
            };
            return Some((key, target));
        };
        if at == placed {
            placed = 0;
            for (slot, key) in ahead_keys.iter_mut().zip(&mut keys) {
                *slot = key;
                placed += 1;
            }
            if placed == 0 {
                return None;
            }
            at = 0;
            nowhere = !routing.servers_for(pool, &ahead_keys[..placed], &mut ahead[..placed]);
        }
        let (key, server) = (ahead_keys[at], ahead[at]);
        at += 1;
        routing.metrics.count(root as usize, command);
        if let Some(shadow) = root_shadow {
            add_copy(&mut found.copies, routing, shadow, frame, key);
        }
        Some(match nowhere {
            true => (key, KeyTarget::Nowhere(pool as u32)),
            false => (key, KeyTarget::Server(pool as u32, server)),
        })
    })
}

/// Keys for policy routes the plan leaves to the executor: grouped per route node (keys
/// in client order, as views of the client's frame), each group run once by the
/// executor, batched per server inside it.
#[derive(Default)]
struct ExecutorGroups {
    groups: SmallVec<[(NodeId, Vec<Bytes>); 1]>,
    /// `group_of[j]`: the group of the plan's j-th executor key.
    group_of: SmallVec<[u32; 8]>,
}

impl ExecutorGroups {
    /// Adds the next executor key, which reached route `node`, of a multi-get of `count`
    /// keys.
    fn add(&mut self, node: NodeId, key: Bytes, count: usize) {
        let group = match self.groups.iter().position(|(n, _)| *n == node) {
            Some(group) => group,
            None => {
                // Usually the only group: room for every key at once.
                self.groups.push((node, Vec::with_capacity(count)));
                self.groups.len() - 1
            }
        };
        self.groups[group].1.push(key);
        self.group_of.push(group as u32);
    }

    /// Starts each group on the general walk (`start_multi`, as `job_of` its keys). The
    /// plan numbered the executor keys' legs after its `batches`, one per key; one leg per
    /// group instead, in the same place.
    fn start(
        self,
        routing: &Rc<RouteSnapshot>,
        batches: u32,
        key_leg: &mut multiget::KeyLegs,
        job_of: impl Fn(Vec<Bytes>) -> MultiJob,
    ) -> SmallVec<[RoutedKeys; 1]> {
        let mut routed = SmallVec::new();
        if self.groups.is_empty() {
            return routed;
        }
        for leg in key_leg.iter_mut().filter(|leg| **leg >= batches) {
            let group = self
                .group_of
                .get((*leg - batches) as usize)
                .copied()
                .unwrap_or(0);
            *leg = batches + group;
        }
        let started = routing.metrics.now();
        for (node, keys) in self.groups {
            routed.push(start_multi(routing, node, job_of(keys), started));
        }
        routed
    }
}

/// Per shadow route a multi-get's keys pass through, the keys in its range (views of the
/// client's frame), copied as one batch once the multi-get is planned.
type ShadowCopies = SmallVec<[(NodeId, Vec<Bytes>); 1]>;

/// Adds `key` (in the client's `frame`) to shadow route `shadow`'s copy when it is in the
/// route's range.
fn add_copy(
    copies: &mut ShadowCopies,
    routing: &RouteSnapshot,
    shadow: NodeId,
    frame: &Bytes,
    key: &[u8],
) {
    if !shadow::shadows_key(routing, shadow, key) {
        return;
    }
    let at = match copies.iter().position(|(node, _)| *node == shadow) {
        Some(at) => at,
        None => {
            copies.push((shadow, Vec::new()));
            copies.len() - 1
        }
    };
    copies[at].1.push(frame.slice_ref(key));
}

/// What goes on after a multi-get's legs answer (`None`: nothing; `Some(misses)`: failed
/// batches, and with `misses` the keys answered as misses too), once keys of a route
/// that `goes` on were planned.
fn with_goes_on(so_far: Option<bool>, goes: GoesOn) -> Option<bool> {
    match goes {
        GoesOn::Never => so_far,
        GoesOn::Failed => Some(so_far.unwrap_or(false)),
        GoesOn::Missed | GoesOn::FailedOrMissed => Some(true),
    }
}
