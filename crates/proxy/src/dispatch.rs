//! From a parsed request to a pending reply: route single keys, split multi-gets per
//! server (and into batches of `max_keys_per_request`, planned by `multiget`), fan
//! flush_all out to a pool, hand policy routes to the route executor (`execute`), and
//! answer what memroute answers itself. The entries it queues are `pending::Pending`.
use std::rc::Rc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use memroute_backend::ReplyReceiver;
use memroute_config::{Operation, WritePolicy};
use memroute_protocol::{decode_base64, Command, ReplyKind, Request};
use memroute_routing::{operation_of, Node, NodeId};
use smallvec::SmallVec;

use crate::buffers::Homed;
use crate::context::WorkerContext;
use crate::execute::{self, BatchLines, FollowUp, Job, MultiJob};
use crate::multiget::{self, KeyTarget, Step};
use crate::pending::{Fanout, FirstTry, Flow, Leg, MovesOn, MultiGet, Pending, ReplicatedWrite};
use crate::reply::immediate_ack;
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
    let leg = match routes.node(node) {
        // The fast path: a plain pool, straight to its server's connection.
        &Node::Pool(pool) => {
            let Some(server) = routing.server_for(pool, key) else {
                return no_servers_reply(routing, pool);
            };
            let connection = routing.pools[pool].servers[server].pick(slot);
            Leg::new(connection.send(parts, kind), pool, server, started)
        }
        // A policy route (shadow, replicated, failover, ...) is on the way: its future
        // lives in the pending entry.
        _ => {
            // A write through a replicated route over pools: sent to every replica as a
            // plain pool's request is, the replies judged in place (`ReplicatedWrite`).
            if operation.is_write() {
                if let Some((policy, servers)) =
                    execute::replicated_write_servers(routing, node, key)
                {
                    let ack = match policy {
                        WritePolicy::AllAsync => immediate_ack(request.command),
                        _ => None,
                    };
                    let mut write = Homed::new(ReplicatedWrite {
                        routing: routing.clone(),
                        legs: SmallVec::new(),
                        node,
                        policy,
                        ack,
                        decision: None,
                        command: request.command,
                        noreply: request.noreply,
                        started,
                    });
                    // The legs go straight into their home (not moved there afterwards).
                    if let Some(write) = write.get_mut() {
                        for &(pool, server) in &servers {
                            let connection = routing.pools[pool].servers[server].pick(slot);
                            let receiver = send_copy(connection, &parts, kind);
                            write
                                .legs
                                .push(Leg::new(receiver, pool, server, started).on_route(node));
                        }
                    }
                    return Pending::Replicated(write);
                }
            }
            let job = Job {
                operation,
                command: request.command,
                // A view of the client's frame, unless it is a decoded base64 key.
                key: match request.base64_key {
                    true => Bytes::copy_from_slice(key),
                    false => request.frame.slice_ref(key),
                },
                parts,
                kind,
                slot,
                echo: meta_echo(&request),
            };
            // Through shadow and random routes down to a pool: sent to that pool as a plain
            // pool's request is, with the shadow copy (if the key is in its range) on a
            // task of its own, as the executor would send it.
            if let Some((pool, shadow)) = execute::single_pool(routing, node) {
                // A pool without servers yet (DNS discovery) answers as the executor does
                // for it; the executor is not asked, as it would draw a random route's
                // child again (favouring the children with servers).
                let (receiver, server) = match routing.server_for(pool, key) {
                    Some(server) => {
                        let connection = routing.pools[pool].servers[server].pick(slot);
                        (connection.send(job.parts.clone(), kind), server)
                    }
                    None => (ReplyReceiver::ready(Err(routing.no_servers(pool))), 0),
                };
                if let Some(shadow) = shadow {
                    execute::shadow_copy_single(routing, shadow, job);
                }
                return Pending::Single {
                    routing: routing.clone(),
                    leg: Leg::new(receiver, pool, server, started).on_route(node),
                    command: request.command,
                    noreply: request.noreply,
                };
            }
            // A request through a warm-up route whose cold is a pool: sent to cold as a
            // plain pool's request is; a read cold missed goes on to warm (the executor).
            if let Some(pool) = execute::warm_up_cold(routing, node) {
                if let Some(server) = routing.server_for(pool, key) {
                    let connection = routing.pools[pool].servers[server].pick(slot);
                    let receiver = connection.send(job.parts.clone(), kind);
                    let leg = Leg::new(receiver, pool, server, started).on_route(node);
                    let (command, noreply) = (request.command, request.noreply);
                    if !execute::warms_up(command) {
                        return Pending::Single {
                            routing: routing.clone(),
                            leg,
                            command,
                            noreply,
                        };
                    }
                    return Pending::FirstTry(Homed::new(FirstTry {
                        routing: routing.clone(),
                        leg,
                        rest: Some(job),
                        node,
                        command,
                        noreply,
                        moves_on: MovesOn::Miss,
                    }));
                }
            }
            // A read through a failover (or replicated) route whose first child is a pool,
            // or a write through such a failover route: sent to that pool as a plain
            // pool's request is; the executor runs only for the later children, if the
            // first answer is a failure (and a write may be repeated: `FirstTry`).
            let first = match operation.is_write() {
                false => execute::first_pool(routing, node),
                true => execute::failover_write_pool(routing, node),
            };
            if let Some((pool, more)) = first {
                if let Some(server) = routing.server_for(pool, key) {
                    let connection = routing.pools[pool].servers[server].pick(slot);
                    let receiver = send_copy(connection, &job.parts, kind);
                    return Pending::FirstTry(Homed::new(FirstTry {
                        routing: routing.clone(),
                        leg: Leg::new(receiver, pool, server, started).on_route(node),
                        rest: more.then_some(job),
                        node,
                        command: request.command,
                        noreply: request.noreply,
                        moves_on: MovesOn::Failure,
                    }));
                }
            }
            return Pending::Routed {
                routing: routing.clone(),
                routed: execute::start(routing, node, job, started),
                command: request.command,
                noreply: request.noreply,
            };
        }
    };
    Pending::Single {
        routing: routing.clone(),
        leg,
        command: request.command,
        noreply: request.noreply,
    }
}

/// Queues `parts` on `connection` without taking them: copied into its outgoing buffer as
/// `BackendHandle::send` copies them, without a clone (two reference counts up and down)
/// of bytes that are sent again (another replica) or kept (a failover's later children).
fn send_copy(
    connection: &memroute_backend::BackendHandle,
    parts: &(Bytes, Option<Bytes>),
    kind: ReplyKind,
) -> ReplyReceiver {
    let mut request = connection.writer();
    request.append(&parts.0);
    if let Some(rest) = &parts.1 {
        request.append(rest);
    }
    request.finish(kind)
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

fn no_servers_reply(routing: &RouteSnapshot, pool: usize) -> Pending {
    Pending::Ready(Bytes::from(format!(
        "SERVER_ERROR {}\r\n",
        routing.no_servers(pool)
    )))
}

/// Lines other than a get's stay below memcached's short-line buffer (see the constant).
const MEMCACHED_LINE_LIMIT: usize = memroute_protocol::MAX_SHORT_LINE;

fn line_limited(command: Command) -> bool {
    !matches!(command, Command::Get | Command::Gets)
}

/// The bytes to forward for a single-key request: the client's frame without its
/// `noreply`/`q` token, and, when the command line is longer than memcached tolerates on
/// a shared connection (padding spaces), the line rebuilt with single spaces. `None` when
/// even the rebuilt line is too long.
fn forwardable(request: &Request) -> Option<(Bytes, Option<Bytes>)> {
    if request.line_len < MEMCACHED_LINE_LIMIT || !line_limited(request.command) {
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
    if rebuilt.len() >= MEMCACHED_LINE_LIMIT {
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
        MEMCACHED_LINE_LIMIT - 2
    } else {
        usize::MAX
    };
    let policy_root = !matches!(
        routes.node(root),
        Node::Pool(_) | Node::Prefix { .. } | Node::Operation { .. }
    );
    // The random routes' picks for this multi-get (`execute::multi_get_pool`).
    let mut picks = execute::RandomPicks::new();
    let root_planned = match policy_root {
        true => execute::multi_get_pool(routing, root, &mut picks),
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
        let routed = smallvec::smallvec![execute::start_multi(
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
    let mut last: Option<(NodeId, Option<execute::Planned>)> = None;
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
                &Node::Pool(pool) => Some(execute::Planned {
                    pool,
                    goes_on: execute::GoesOn::Never,
                    shadow: None,
                }),
                // A policy route: planned here too where its semantics allow.
                _ => match *last_at {
                    Some((seen, planned)) if seen == node => planned,
                    _ => {
                        let planned = execute::multi_get_pool(routing, node, picks_at);
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
            routed.push(execute::start_multi(routing, node, job_of(keys), started));
        }
    }
    // The shadow routes' copies of the keys in their ranges, one batch per route.
    for (node, keys) in copies {
        execute::shadow_copy_keys(routing, node, job_of(keys));
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
    if !execute::shadows_key(routing, shadow, key) {
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
fn with_goes_on(so_far: Option<bool>, goes: execute::GoesOn) -> Option<bool> {
    match goes {
        execute::GoesOn::Never => so_far,
        execute::GoesOn::Failed => Some(so_far.unwrap_or(false)),
        execute::GoesOn::Missed | execute::GoesOn::FailedOrMissed => Some(true),
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
                routed: execute::start(routing, root, job, started),
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
