//! A pool: a request goes to the server that owns its key (a multi-get's keys batched per
//! server, `send_batches`), flush_all to every server. A plain pool's single-key
//! request never reaches here (dispatch sends it as a leg of its own); the executor comes
//! here for a pool reached through a policy route.
use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use memroute_backend::{ReplyReceiver, RequestWriter};
use memroute_config::Operation;
use memroute_protocol::{retrieval_error, ReplyKind, RequestBytes};
use memroute_routing::{Node, NodeId};
use smallvec::SmallVec;

use super::job::{per_key, Job, KeyReplies, MultiJob};
use super::leg::{Leg, Legs};
use crate::collapse;
use crate::hot_keys;
use crate::multiget::{self, KeyTarget, Step};
use crate::reply::{connection_gone, FlushAllMerge, Reply};
use crate::snapshot::RouteSnapshot;

/// The pool of route `node` when it is a pool with servers (DNS discovery may have found
/// none yet): only then does a policy route start as plain legs to it.
pub(crate) fn with_servers(routing: &RouteSnapshot, node: NodeId) -> Option<usize> {
    match routing.routes.node(node) {
        Node::Pool(pool) if !routing.pools[*pool].servers.is_empty() => Some(*pool),
        _ => None,
    }
}

/// A plain leg: the request (`parts`, its reply's kind, the client's connection `slot`)
/// to the server of `pool` that owns `key`, seen by the hot-key sampler. `None` when the
/// pool has no servers. Every single-key request a route sends to a pool as it is starts
/// here, so this is where a get joins an identical one in flight (`collapse`).
pub(crate) fn leg_to(
    routing: &RouteSnapshot,
    pool: usize,
    key: &[u8],
    (parts, kind, slot): (&RequestBytes, ReplyKind, usize),
    started: Instant,
) -> Option<Leg> {
    let server = routing.server_for(pool, key)?;
    routing.sent_to(pool, key, server);
    let connections = &routing.pools[pool];
    let connection = connections.servers[server].pick(slot);
    let send = || send_copy(connection, parts, kind);
    let send_or_join = || match &connections.collapsed {
        Some(collapsed) => {
            let (receiver, joined) =
                collapse::send_or_join(connection, key, parts, kind, send_copy);
            if joined {
                collapsed.inc();
            }
            (receiver, joined)
        }
        None => (send(), false),
    };
    let receiver = match &connections.hot_cache {
        Some(cache) => {
            let is_hot = |hash, now| routing.is_hot(hash, now);
            cache.answer((key, server), parts, kind, is_hot, send_or_join)
        }
        None => send_or_join().0,
    };
    Some(Leg::new(receiver, pool, server, started))
}

/// Queues `parts` on `connection` without taking them: copied into its outgoing buffer as
/// `BackendHandle::send` copies them, without a clone (two reference counts up and down)
/// of bytes that are sent again (another replica) or kept (a failover's later children).
pub(crate) fn send_copy(
    connection: &memroute_backend::BackendHandle,
    parts: &RequestBytes,
    kind: ReplyKind,
) -> ReplyReceiver {
    let mut request = connection.writer();
    for piece in parts.pieces() {
        request.append(piece);
    }
    request.finish(kind)
}

/// A flush_all to a pool: the same request to every server, a plain leg each. `None`
/// when the pool has no servers.
pub(super) fn flush_all_legs(
    routing: &RouteSnapshot,
    pool: usize,
    parts: &RequestBytes,
    slot: usize,
    started: Instant,
) -> Option<Legs> {
    let servers = &routing.pools[pool].servers;
    if servers.is_empty() {
        return None;
    }
    let legs = servers
        .iter()
        .enumerate()
        .map(|(server, connections)| {
            let receiver = connections.pick(slot).send(parts.clone(), ReplyKind::Line);
            Leg::new(receiver, pool, server, started)
        })
        .collect();
    Some(Legs::many(legs))
}

/// A pool's flush_all once every server answered: their replies merged into one
/// (`reply::FlushAllMerge`), each failure counted against its server.
pub(super) fn merge_flush_all(routing: &RouteSnapshot, legs: &mut [Leg]) -> Reply {
    if let Some(first) = legs.first() {
        first.observe(routing);
    }
    let mut merge = FlushAllMerge::default();
    for leg in legs.iter_mut() {
        merge.add(leg.take(routing));
    }
    merge.finish()
}

/// One request to the server that owns its key (flush_all: to every server), by the
/// pool's current placement (`resize::send` adds a running resize window's steps).
pub(super) async fn send_plain(routing: &Rc<RouteSnapshot>, pool: usize, job: &Job) -> Reply {
    if job.operation == Operation::FlushAll {
        return flush_pool(routing, pool, job).await;
    }
    let Some(server) = routing.server_for(pool, &job.key) else {
        return Err(routing.no_servers(pool));
    };
    routing.sent_to(pool, &job.key, server);
    let connections = &routing.pools[pool].servers[server];
    let reply = connections
        .pick(job.slot)
        .send(job.parts.clone(), job.kind)
        .await
        .unwrap_or_else(|_| Err(connection_gone()));
    if let Err(error) = &reply {
        connections.count_failure(error);
    }
    reply
}

/// flush_all to every server of a pool: `OK` only if every server said so.
async fn flush_pool(routing: &Rc<RouteSnapshot>, pool: usize, job: &Job) -> Reply {
    let receivers: Vec<_> = routing.pools[pool]
        .servers
        .iter()
        .map(|s| s.pick(job.slot).send(job.parts.clone(), ReplyKind::Line))
        .collect();
    if receivers.is_empty() {
        return Err(routing.no_servers(pool));
    }
    let mut merge = FlushAllMerge::default();
    for receiver in receivers {
        merge.add(receiver.await.unwrap_or_else(|_| Err(connection_gone())));
    }
    merge.finish()
}

/// What `send_batches` tells its caller as the plan goes.
pub(crate) enum Batched<'k> {
    /// The next leg's line was opened, to `server` of `pool`.
    Opened { pool: usize, server: usize },
    /// Leg `leg`'s line was sent: its reply's receiver.
    Sent { leg: usize, receiver: ReplyReceiver },
    /// A key whose target is the executor (`KeyTarget::Executor`).
    Executor { key: &'k [u8] },
    /// A key joined an identical get in flight to `server` of `pool` (`collapse`): the
    /// next leg, answered by that get's reply.
    Joined {
        pool: usize,
        server: usize,
        receiver: ReplyReceiver,
    },
}

/// Plans a multi-get's `targets` (`multiget::plan`) and sends its batches: each batch
/// line, starting with `head` (`get `, `gets `...), written straight into its server
/// connection's outgoing buffer (on the client's connection `slot`) as the plan adds keys
/// and sent when the plan closes it. A key with an identical get in flight on its
/// connection joins that get instead (`collapse::join_key`), a leg of its own; the first
/// hot key with none leads one (`collapse::lead_key`: sent alone once the batches are, a
/// leg of its own too). `Err(pool)`: a pool without servers; the lines still open take their bytes
/// back out, the batches already sent are the caller's to drop, no key leads.
pub(crate) fn send_batches<'k>(
    routing: &RouteSnapshot,
    head: &[u8],
    slot: usize,
    byte_cap: usize,
    targets: impl Iterator<Item = (&'k [u8], KeyTarget)>,
    key_leg: &mut multiget::KeyLegs,
    mut on: impl FnMut(Batched<'k>),
) -> Result<(), usize> {
    let mut lines = BatchLines::new(routing, head, slot);
    // The plan takes each key's step as soon as it has its target: one key's join at a time.
    let joined: Cell<Option<ReplyReceiver>> = Cell::new(None);
    // The key that leads (`Step::Lead`; at most one, below), sent once every batch line is.
    let mut lead: Option<Step<'k>> = None;
    let on_step = |step: Step<'k>| match step {
        Step::Open {
            pool, server, key, ..
        } => {
            lines.open(pool, server, key);
            on(Batched::Opened { pool, server });
        }
        Step::Add { leg, key } => lines.add(leg, key),
        Step::Close { leg } => {
            if let Some(receiver) = lines.close(leg) {
                on(Batched::Sent { leg, receiver });
            }
        }
        Step::Joined { .. } | Step::Lead { .. } => {
            lines.collapsed(step, &joined, &mut lead, &mut on);
        }
        Step::Executor { key, .. } => on(Batched::Executor { key }),
    };
    // Most multi-gets: `None`, no key may join or lead, and each key costs one compare in
    // the plan.
    let collapsing = collapse::MultiGetKeys::new(head, routing.hot_keys());
    // At most one key of a multi-get leads (the first hot one): a lead is a request and a
    // leg more, which only pays when other gets of the key arrive during its flight. A
    // multi-get of many hot keys (a client asking for the same few keys over and over)
    // stays one batch per server and one leg more, not one request per key.
    let (led, joined) = (&Cell::new(false), &joined);
    let retarget = collapsing.as_ref().map(|keys| {
        move |key, target| collapsed_target(routing, keys, slot, key, target, led, joined)
    });
    multiget::plan(
        targets,
        retarget,
        head.len(),
        byte_cap,
        |pool| routing.pools[pool].max_keys_per_request,
        key_leg,
        on_step,
    )?;
    if let Some(Step::Lead {
        leg,
        pool,
        server,
        key,
    }) = lead
    {
        let connections = &routing.pools[pool];
        let connection = connections.servers[server].pick(slot);
        let (receiver, joined) = collapse::lead_key(connection, head, key);
        if let (true, Some(collapsed)) = (joined, &connections.collapsed) {
            collapsed.inc();
        }
        on(Batched::Sent { leg, receiver });
    }
    Ok(())
}

/// The target of a multi-get's `key` (`target` as placed) when some of its keys may join
/// a get in flight or lead one (`keys`): what its print's chance decides (`join_or_lead`),
/// the receiver of a key that joined left in `joined` for its step; `led` once a key leads.
/// Out of line: the plan of most multi-gets, which have no such key, stays as small as it
/// was without collapsing. `key` and `target` apart: a tuple of them goes by reference, and
/// the plan stored every key's target for it, called or not.
#[inline(never)]
fn collapsed_target(
    routing: &RouteSnapshot,
    keys: &collapse::MultiGetKeys,
    slot: usize,
    key: &[u8],
    target: KeyTarget,
    led: &Cell<bool>,
    joined: &Cell<Option<ReplyReceiver>>,
) -> KeyTarget {
    let KeyTarget::Server(pool, server) = target else {
        return target;
    };
    let mut chance = keys.chance(key);
    chance.lead &= !led.get();
    if !chance.join && !chance.lead {
        return target;
    }
    let target = join_or_lead(routing, keys, slot, (key, pool, server), chance, joined);
    led.set(led.get() || matches!(target, KeyTarget::Lead(..)));
    target
}

/// A multi-get key bound for `server` of `pool` whose print says it may join a get in
/// flight or lead one (`chance`): joined (its receiver left in `joined`), leading (a hot
/// key, in a pool that collapses), or batched as ever.
#[inline(never)]
fn join_or_lead(
    routing: &RouteSnapshot,
    keys: &collapse::MultiGetKeys,
    slot: usize,
    (key, pool, server): (&[u8], u32, u32),
    chance: collapse::Chance,
    joined: &Cell<Option<ReplyReceiver>>,
) -> KeyTarget {
    let batched = KeyTarget::Server(pool, server);
    let connections = &routing.pools[pool as usize];
    let Some(collapsed) = &connections.collapsed else {
        return batched;
    };
    if chance.join {
        let connection = connections.servers[server as usize].pick(slot);
        if let Some(receiver) = collapse::join_key(connection, keys.head(), key) {
            collapsed.inc();
            joined.set(Some(receiver));
            return KeyTarget::Joined(pool, server);
        }
    }
    if chance.lead && routing.is_hot(hot_keys::hash(key), Instant::now()) {
        return KeyTarget::Lead(pool, server);
    }
    batched
}

/// The batch lines of a multi-get being planned (`send_batches`), one per leg, written
/// straight into each server connection's outgoing buffer and sent when the plan closes
/// them. Dropped with lines still open (the plan stopped), those take their bytes back out.
struct BatchLines<'r> {
    routing: &'r RouteSnapshot,
    head: &'r [u8],
    slot: usize,
    /// Indexed by leg; taken when the leg is sent.
    writers: SmallVec<[Option<RequestWriter<'r>>; 4]>,
    /// Indexed by leg: its (pool, server), for the hot-key sampler.
    targets: SmallVec<[(usize, usize); 4]>,
}

impl<'r> BatchLines<'r> {
    /// Lines that start with `head` (`get `, `gets `...), on the client's connection `slot`.
    fn new(routing: &'r RouteSnapshot, head: &'r [u8], slot: usize) -> Self {
        BatchLines {
            routing,
            head,
            slot,
            writers: SmallVec::new(),
            targets: SmallVec::new(),
        }
    }

    /// Starts the next leg's line, to `server` of `pool`, with its first key.
    fn open(&mut self, pool: usize, server: usize, key: &[u8]) {
        self.routing.sent_to(pool, key, server);
        self.targets.push((pool, server));
        let mut writer = self.routing.pools[pool].servers[server]
            .pick(self.slot)
            .writer();
        writer.append(self.head);
        writer.append_key(key);
        self.writers.push(Some(writer));
    }

    /// The next leg is `key`'s, joined to a get in flight to `server` of `pool`: no line.
    fn joined(&mut self, pool: usize, server: usize, key: &[u8]) {
        self.routing.sent_to(pool, key, server);
        self.targets.push((pool, server));
        self.writers.push(None);
    }

    /// A key's leg that is no batch line (`Step::Joined`: answered by the get in flight it
    /// joined, whose receiver is in `joined`; `Step::Lead`: sent once the plan is done, kept
    /// in `lead`). Out of line: most multi-gets have none, and the plan's per-step call
    /// stays as small as without them.
    #[inline(never)]
    fn collapsed<'k>(
        &mut self,
        step: Step<'k>,
        joined: &Cell<Option<ReplyReceiver>>,
        lead: &mut Option<Step<'k>>,
        on: &mut impl FnMut(Batched<'k>),
    ) {
        match step {
            Step::Joined {
                pool, server, key, ..
            } => {
                self.joined(pool, server, key);
                if let Some(receiver) = joined.take() {
                    on(Batched::Joined {
                        pool,
                        server,
                        receiver,
                    });
                }
            }
            Step::Lead {
                pool, server, key, ..
            } => {
                self.joined(pool, server, key);
                on(Batched::Opened { pool, server });
                debug_assert!(lead.is_none(), "one key of a multi-get leads");
                *lead = Some(step);
            }
            _ => {}
        }
    }

    /// Adds `key` to leg `leg`'s open line.
    fn add(&mut self, leg: usize, key: &[u8]) {
        if let Some(writer) = &mut self.writers[leg] {
            writer.append_word(key);
            let (pool, server) = self.targets[leg];
            self.routing.sent_to(pool, key, server);
        }
    }

    /// Ends leg `leg`'s line and sends it; its reply's receiver.
    fn close(&mut self, leg: usize) -> Option<ReplyReceiver> {
        let mut writer = self.writers[leg].take()?;
        writer.append(b"\r\n");
        Some(writer.finish(ReplyKind::Retrieval))
    }
}

/// A pool's share of a multi-get by its current placement: its keys batched per server
/// (`send_batches`), every batch sent before any reply is awaited (`resize::run_multi`
/// adds a running resize window's steps).
pub(super) async fn run_multi_plain(
    routing: &Rc<RouteSnapshot>,
    pool: usize,
    job: &MultiJob,
    keys: &[u32],
) -> KeyReplies {
    let targets = keys.iter().map(|&key| {
        let key = &job.keys[key as usize][..];
        let target = match routing.server_for(pool, key) {
            Some(server) => KeyTarget::Server(pool as u32, server as u32),
            None => KeyTarget::Nowhere(pool as u32),
        };
        (key, target)
    });
    let mut key_leg = multiget::KeyLegs::new();
    key_leg.reserve_exact(keys.len());
    // Per batch: its server, then the reply's receiver once sent.
    let mut servers: SmallVec<[usize; 4]> = SmallVec::new();
    let mut receivers: SmallVec<[Option<ReplyReceiver>; 4]> = SmallVec::new();
    let planned = send_batches(
        routing,
        &job.head,
        job.slot,
        job.byte_cap,
        targets,
        &mut key_leg,
        |batched| match batched {
            Batched::Opened { server, .. } => {
                servers.push(server);
                receivers.push(None);
            }
            Batched::Sent { leg, receiver } => receivers[leg] = Some(receiver),
            Batched::Joined {
                server, receiver, ..
            } => {
                servers.push(server);
                receivers.push(Some(receiver));
            }
            // Every target here is a server of this pool.
            Batched::Executor { .. } => {}
        },
    );
    if planned.is_err() {
        return KeyReplies::failed(keys.len(), Err(routing.no_servers(pool)));
    }
    let batches = servers.into_iter().zip(receivers);
    let mut replies: SmallVec<[Reply; 4]> = SmallVec::new();
    for (server, receiver) in batches {
        let reply = match receiver {
            Some(receiver) => receiver.await.unwrap_or_else(|_| Err(connection_gone())),
            None => Err(connection_gone()),
        };
        if let Err(error) = &reply {
            routing.pools[pool].servers[server].count_failure(error);
        }
        replies.push(reply);
    }
    if replies
        .iter()
        .all(|reply| matches!(reply, Ok(bytes) if retrieval_error(bytes).is_none()))
    {
        let replies = replies.into_iter().flatten().collect();
        return KeyReplies::Batches { replies, key_leg };
    }
    // A batch failed: per key, its batch's failure or its own answer.
    let outcomes = per_key(&replies, &key_leg, job, keys);
    KeyReplies::Keys(outcomes)
}
