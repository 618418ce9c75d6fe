//! From a parsed request to a pending reply: route single keys, split multi-gets per
//! server (and into batches of `max_keys_per_request`, planned by `multiget`), fan
//! flush_all out to a pool, hand policy routes to the route executor (`route`), and
//! answer what memroute answers itself. The entries it queues are `pending::Pending`.
use std::rc::Rc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use memroute_config::Operation;
use memroute_protocol::{decode_base64, Command, ReplyKind, Request, MAX_SHORT_LINE};
use memroute_routing::{operation_of, Node, NodeId};
use smallvec::SmallVec;

use crate::buffers::Homed;
use crate::context::WorkerContext;
use crate::multiget::{self, KeyTarget, Step};
use crate::pending::{Fanout, Flow, Leg, MultiGet, Pending};
use crate::route::{self, shadow, BatchLines, FollowUp, Job, MultiJob, Start};
use crate::snapshot::RouteSnapshot;
use crate::stats::WorkerMetrics;

/// Where a session's requests come from: the listener it was accepted on (whose root
/// route they take) and which of each server's connections it uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    pub slot: usize,
    pub listener: usize,
}

/// Routes one request with `routing` (the session's snapshot) and appends its pending reply.
pub(crate) fn dispatch(
    context: &WorkerContext,
    routing: &Rc<RouteSnapshot>,
    origin: Origin,
    request: Request,
    pending: &mut std::collections::VecDeque<Pending>,
) -> Flow {
    let Origin { slot, listener } = origin;
    // The root route of the listener the client came in on.
    let root = routing.root_of(listener);
    let stats = context.stats();
    let count = WorkerMetrics::add;
    let command = request.command;
    if is_local(command) {
        routing.metrics.count_local(command);
    }
    match command {
        Command::Get | Command::Gets | Command::Gat | Command::Gats => {
            count(&stats.get_keys, request.keys.len() as u64);
            if matches!(command, Command::Gat | Command::Gats) {
                count(&stats.touch_keys, request.keys.len() as u64);
            }
            if request.keys.len() == 1 {
                // mcrouter's admin queries (`get __mcrouter__.route(get,KEY)` ...).
                let admin = match command {
                    Command::Get => request
                        .keys()
                        .next()
                        .and_then(|key| crate::mcrouter_admin::answer(routing, root, key)),
                    _ => None,
                };
                match admin {
                    Some(reply) => pending.push_back(Pending::Ready(reply)),
                    None => pending.push_back(send_single(routing, root, slot, request)),
                }
            } else {
                pending.push_back(split_multi_get(routing, root, slot, request));
            }
        }
        Command::MetaGet => {
            count(&stats.get_keys, 1);
            pending.push_back(send_single(routing, root, slot, request));
        }
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas
        | Command::MetaSet => {
            count(&stats.set_requests, 1);
            pending.push_back(send_single(routing, root, slot, request));
        }
        Command::Touch => {
            count(&stats.touch_keys, 1);
            pending.push_back(send_single(routing, root, slot, request));
        }
        Command::Delete
        | Command::Incr
        | Command::Decr
        | Command::MetaDelete
        | Command::MetaArithmetic
        | Command::MetaDebug => {
            pending.push_back(send_single(routing, root, slot, request));
        }
        Command::FlushAll => {
            count(&stats.flush_requests, 1);
            pending.push_back(fan_out_flush(routing, root, slot, request));
        }
        Command::Version => {
            pending.push_back(Pending::Ready(Bytes::from(crate::version::version_line())))
        }
        Command::Verbosity => {
            // memroute's own log level is set at start; the command is accepted like memcached does.
            if !request.noreply {
                pending.push_back(Pending::Ready(Bytes::from_static(b"OK\r\n")));
            }
        }
        Command::Stats => pending.push_back(stats_reply(context, &request)),
        Command::MetaNoop => pending.push_back(Pending::Ready(Bytes::from_static(b"MN\r\n"))),
        Command::Shutdown => {
            // A client must never be able to stop the proxy; memcached without -A says the same.
            pending.push_back(Pending::Ready(Bytes::from_static(
                b"ERROR: shutdown not enabled\r\n",
            )))
        }
        Command::Quit => {
            pending.push_back(Pending::Close);
            return Flow::Close;
        }
    }
    Flow::Continue
}

/// The whole `stats` reply: every worker moves its local counts into the registry first
/// (bounded wait), so the reply counts every request answered before it.
pub(crate) fn all_stats(context: &WorkerContext) -> Pending {
    let metrics = context.metrics.shared.clone();
    Pending::Stats {
        ticket: metrics.flush.request(),
        deadline: Instant::now() + crate::stats::FLUSH_WAIT,
        metrics,
    }
}

/// Commands memroute answers itself (counted under the `(proxy)` route).
fn is_local(command: Command) -> bool {
    matches!(
        command,
        Command::Version
            | Command::Verbosity
            | Command::Stats
            | Command::MetaNoop
            | Command::Shutdown
            | Command::Quit
    )
}

fn stats_reply(context: &WorkerContext, request: &Request) -> Pending {
    let argument = &request.frame[request.stats_arg.clone()];
    if argument.is_empty() {
        return all_stats(context);
    }
    // memroute keeps no slabs or items of its own; sub-statistics belong to the servers.
    Pending::Ready(Bytes::from_static(b"ERROR\r\n"))
}

fn send_single(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    slot: usize,
    request: Request,
) -> Pending {
    let Some(key) = request.keys().next() else {
        // The parser never yields a keyed command without a key; answer as memcached would if it did.
        return Pending::Ready(Bytes::from_static(b"ERROR\r\n"));
    };
    // A base64 key (meta `b` flag) is placed by its decoded bytes, like the same key sent raw.
    let mut decoded = [0u8; 256];
    let key = match request.base64_key {
        true => decode_base64(key, &mut decoded).map_or(key, |len| &decoded[..len]),
        false => key,
    };
    let operation = operation_of(&request);
    let Some(parts) = forwardable(&request) else {
        return Pending::Ready(Bytes::from_static(b"CLIENT_ERROR line too long\r\n"));
    };
    let kind = ReplyKind::for_command(request.command);
    let routes = &routing.routes;
    let node = routes.select(root, operation, key);
    routing.metrics.count(node as usize, request.command);
    let started = routing.metrics.now();
    let (command, noreply) = (request.command, request.noreply);
    let single = route::Single {
        request: &request,
        key,
        parts,
        kind,
        operation,
        slot,
        started,
    };
    match route::start_single(routing, node, single) {
        Start::Leg(leg) => Pending::Single {
            routing: routing.clone(),
            leg,
            command,
            noreply,
        },
        Start::FirstTry(first) => Pending::FirstTry(first),
        Start::Replicated(write) => Pending::Replicated(write),
        Start::Routed(routed) => Pending::Routed {
            routing: routing.clone(),
            routed,
            command,
            noreply,
        },
        Start::NoServers(pool) => no_servers_reply(routing, pool),
    }
}

fn no_servers_reply(routing: &RouteSnapshot, pool: usize) -> Pending {
    Pending::Ready(Bytes::from(format!(
        "SERVER_ERROR {}\r\n",
        routing.no_servers(pool)
    )))
}

/// Whether a command's line must stay below memcached's short-line buffer
/// (`MAX_SHORT_LINE`): every line but a get's.
fn line_limited(command: Command) -> bool {
    !matches!(command, Command::Get | Command::Gets)
}

/// The bytes to forward for a single-key request: the client's frame without its
/// `noreply`/`q` token, and, when the command line is longer than memcached tolerates on
/// a shared connection (padding spaces), the line rebuilt with single spaces. `None` when
/// even the rebuilt line is too long.
fn forwardable(request: &Request) -> Option<(Bytes, Option<Bytes>)> {
    if request.line_len < MAX_SHORT_LINE || !line_limited(request.command) {
        return Some(request.forward_parts());
    }
    let line = &request.frame[..request.line_len];
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let quiet = request.quiet_token.clone().unwrap_or(0..0);
    let mut rebuilt = BytesMut::with_capacity(256 + request.frame.len() - request.line_len);
    let mut start = 0;
    for token in line.split(|&b| b == b' ') {
        let range = start..start + token.len();
        start = range.end + 1;
        if token.is_empty() || (range.start >= quiet.start && range.end <= quiet.end) {
            continue;
        }
        if !rebuilt.is_empty() {
            rebuilt.put_u8(b' ');
        }
        rebuilt.put_slice(token);
    }
    rebuilt.put_slice(b"\r\n");
    if rebuilt.len() >= MAX_SHORT_LINE {
        return None;
    }
    rebuilt.put_slice(&request.frame[request.line_len..]);
    Some((rebuilt.freeze(), None))
}

/// The part of a multi-key line before its keys (`gat 300 `), with padding squeezed out
/// so that a batch line's length is its keys'.
fn compact_head(request: &Request) -> Bytes {
    let head = request.multi_key_head();
    if !head.starts_with(b" ") && !head.windows(2).any(|pair| pair == b"  ") {
        return request.frame.slice(..head.len());
    }
    let mut compact = BytesMut::with_capacity(32);
    for token in head.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
        compact.put_slice(token);
        compact.put_u8(b' ');
    }
    compact.freeze()
}

/// How many of a multi-get's keys are placed at once when they all go to one pool: a
/// 20-key get in two steps, room on the stack for both arrays, none on the heap.
const PLACED_AHEAD: usize = 16;

fn split_multi_get(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    slot: usize,
    request: Request,
) -> Pending {
    let operation = operation_of(&request);
    let routes = &routing.routes;
    let head_bytes = compact_head(&request);
    let head = &head_bytes[..];
    // gat/gats lines must stay under memcached's line limit (get/gets lines may be longer).
    let byte_cap = if line_limited(request.command) {
        MAX_SHORT_LINE - 2
    } else {
        usize::MAX
    };
    let policy_root = !matches!(
        routes.node(root),
        Node::Pool(_) | Node::Prefix { .. } | Node::Operation { .. }
    );
    // The random routes' picks for this multi-get (`route::multi_get_pool`).
    let mut picks = route::RandomPicks::new();
    let root_planned = match policy_root {
        true => route::multi_get_pool(routing, root, &mut picks),
        false => None,
    };
    if policy_root && root_planned.is_none() {
        // The root is a policy route the session cannot plan (a fastest read, a failover
        // whose first child is a route, ...): every key reaches it, one group, nothing to
        // plan here.
        for _ in 0..request.keys.len() {
            routing.metrics.count(root as usize, request.command);
        }
        let job = MultiJob {
            operation,
            head: head_bytes.clone(),
            keys: request
                .keys
                .iter()
                .map(|range| request.frame.slice(range))
                .collect(),
            slot,
            byte_cap,
        };
        let routed = smallvec::smallvec![route::start_multi(
            routing,
            root,
            job,
            routing.metrics.now(),
        )];
        let key_leg = smallvec::smallvec![0; request.keys.len()];
        return Pending::MultiGet(Homed::new(MultiGet {
            routing: routing.clone(),
            request,
            legs: SmallVec::new(),
            routed,
            key_leg,
            follow_up: None,
        }));
    }
    // The route node of the key the plan is at (its legs' latency is recorded under it),
    // and what goes on after the legs' answers (a failover's failed batches, a warm-up's
    // cold misses): `None`, `Some(false)` (failed batches only), `Some(true)` (misses too).
    let current = std::cell::Cell::new(root);
    let mut goes_on: Option<bool> = None;
    if let Some(planned) = root_planned {
        goes_on = with_goes_on(goes_on, planned.goes_on);
    }
    // Per route node reached, where its keys are planned (looked up once per multi-get).
    let mut last: Option<(NodeId, Option<route::Planned>)> = None;
    // Per shadow route, the keys in its range it copies.
    let mut copies: ShadowCopies = SmallVec::new();
    // Where each key goes, decided as the plan's one pass reaches it. When every key goes
    // to one pool (a plain pool's root, or a policy root planned over a pool), keys are
    // placed a chunk ahead, together (`RouteSnapshot::servers_for`: their hashes
    // interleaved).
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
    let (current_at, goes_on_at, last_at, copies_at, picks_at) =
        (&current, &mut goes_on, &mut last, &mut copies, &mut picks);
    let targets = std::iter::from_fn(move || {
        // One count per key, as cmd_get counts keys.
        let Some(pool) = one_pool else {
            let key = keys.next()?;
            let node = routes.select(root, operation, key);
            current_at.set(node);
            routing.metrics.count(node as usize, command);
            let planned = match routes.node(node) {
                &Node::Pool(pool) => Some(route::Planned {
                    pool,
                    goes_on: route::GoesOn::Never,
                    shadow: None,
                }),
                // A policy route: planned here too where its semantics allow.
                _ => match *last_at {
                    Some((seen, planned)) if seen == node => planned,
                    _ => {
                        let planned = route::multi_get_pool(routing, node, picks_at);
                        if let Some(planned) = planned {
                            *goes_on_at = with_goes_on(*goes_on_at, planned.goes_on);
                        }
                        *last_at = Some((node, planned));
                        planned
                    }
                },
            };
            let Some(planned) = planned else {
                return Some((key, KeyTarget::Executor));
            };
            if let Some(shadow) = planned.shadow {
                add_copy(copies_at, routing, shadow, frame, key);
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
            add_copy(copies_at, routing, shadow, frame, key);
        }
        Some(match nowhere {
            true => (key, KeyTarget::Nowhere(pool as u32)),
            false => (key, KeyTarget::Server(pool as u32, server)),
        })
    });
    let mut key_leg = multiget::KeyLegs::new();
    key_leg.reserve_exact(request.keys.len());
    let mut legs: SmallVec<[Leg; 4]> = SmallVec::new();
    let mut lines = BatchLines::new(routing, head, slot);
    // Keys for policy routes: grouped per route node (keys in client order, as views of
    // the client's frame), each group run once by the executor, batched per server inside
    // it; `group_of[j]` is the group of the plan's j-th executor key.
    let mut groups: SmallVec<[(u32, Vec<Bytes>); 1]> = SmallVec::new();
    let mut group_of: SmallVec<[u32; 8]> = SmallVec::new();
    let planned = multiget::plan(
        targets,
        head.len(),
        byte_cap,
        |pool| routing.pools[pool].max_keys_per_request,
        &mut key_leg,
        |step| match step {
            Step::Open {
                pool, server, key, ..
            } => {
                lines.open(pool, server, key);
                // Through a policy route, latency is recorded under the route's name.
                let leg = Leg::writing(pool, server, routing.metrics.now());
                legs.push(leg.on_route(current.get()));
            }
            Step::Add { leg, key } => lines.add(leg, key),
            Step::Close { leg } => {
                if let Some(receiver) = lines.close(leg) {
                    legs[leg].sent(receiver);
                }
            }
            Step::Executor { key, .. } => {
                let node = routes.select(root, operation, key);
                let group = match groups.iter().position(|(n, _)| *n == node) {
                    Some(group) => group,
                    None => {
                        // Usually the only group: room for every key at once.
                        groups.push((node, Vec::with_capacity(request.keys.len())));
                        groups.len() - 1
                    }
                };
                groups[group].1.push(request.frame.slice_ref(key));
                group_of.push(group as u32);
            }
        },
    );
    drop(lines);
    if let Err(pool) = planned {
        return no_servers_reply(routing, pool);
    }
    // The executor's groups and the shadow copies ask with the client's command line head.
    let job_of = |keys| MultiJob {
        operation,
        head: head_bytes.clone(),
        keys,
        slot,
        byte_cap,
    };
    let mut routed = SmallVec::new();
    if !groups.is_empty() {
        // The plan numbered the executor keys' legs after its batches, one per key; one
        // leg per group instead, in the same place.
        let batches = legs.len() as u32;
        for leg in key_leg.iter_mut().filter(|leg| **leg >= batches) {
            let group = group_of
                .get((*leg - batches) as usize)
                .copied()
                .unwrap_or(0);
            *leg = batches + group;
        }
        let started = routing.metrics.now();
        for (node, keys) in groups {
            routed.push(route::start_multi(routing, node, job_of(keys), started));
        }
    }
    // The shadow routes' copies of the keys in their ranges, one batch per route.
    for (node, keys) in copies {
        shadow::copy_planned_keys(routing, node, job_of(keys));
    }
    // Keys of a batch that fails on a failover's first pool go on to its later children,
    // a warm-up's cold misses to warm.
    let follow_up = goes_on.map(|misses| FollowUp {
        root,
        operation,
        head: head_bytes.clone(),
        slot,
        byte_cap,
        misses,
    });
    Pending::MultiGet(Homed::new(MultiGet {
        routing: routing.clone(),
        request,
        legs,
        routed,
        key_leg,
        follow_up,
    }))
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
fn with_goes_on(so_far: Option<bool>, goes: route::GoesOn) -> Option<bool> {
    match goes {
        route::GoesOn::Never => so_far,
        route::GoesOn::Failed => Some(so_far.unwrap_or(false)),
        route::GoesOn::Missed | route::GoesOn::FailedOrMissed => Some(true),
    }
}

fn fan_out_flush(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    slot: usize,
    request: Request,
) -> Pending {
    let routes = &routing.routes;
    let parts = request.forward_parts();
    routing.metrics.count(root as usize, request.command);
    let started = routing.metrics.now();
    let pool = match routes.node(root) {
        Node::Pool(pool) => *pool,
        // A route decides where flush_all goes (every target of a prefix route, every
        // replica, the operation route's flush_all target, ...).
        _ => {
            let job = Job {
                operation: Operation::FlushAll,
                command: request.command,
                key: Bytes::new(),
                parts,
                kind: ReplyKind::Line,
                slot,
                echo: None,
            };
            return Pending::Routed {
                routing: routing.clone(),
                routed: route::start(routing, root, job, started),
                command: request.command,
                noreply: request.noreply,
            };
        }
    };
    if routing.pools[pool].servers.is_empty() {
        return no_servers_reply(routing, pool);
    }
    let legs = routing.pools[pool]
        .servers
        .iter()
        .enumerate()
        .map(|(server, connections)| {
            Leg::new(
                connections.pick(slot).send(parts.clone(), ReplyKind::Line),
                pool,
                server,
                started,
            )
        })
        .collect();
    Pending::Fanout(Box::new(Fanout {
        routing: routing.clone(),
        legs,
        noreply: request.noreply,
    }))
}
