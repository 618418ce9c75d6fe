//! From a parsed request to a pending reply: route single keys, split multi-gets per
//! server (and into batches of `max_keys_per_request`, planned by `multiget`), fan
//! flush_all out to a pool, hand policy routes to the route executor (`route`), and
//! answer what memroute answers itself. The entries it queues are `pending::Pending`.
//! In a config with mcrouter's routing prefixes, a key starting with `/` is routed by its
//! prefix (`routing_prefix::resolve`): sent to the prefix's routes with the prefix cut,
//! its reply given the prefix back (`Pending::Restored`, `Pending::Split`).
use std::rc::Rc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use memroute_protocol::{decode_base64, Command, ReplyKind, Request, RequestBytes, MAX_SHORT_LINE};
use memroute_routing::{operation_of, NodeId, Operation};

use crate::context::WorkerContext;
use crate::pending::{Flow, Pending, Restored, Split};
use crate::route;
use crate::routing_prefix::{self, Resolved};
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
    // Every request is counted on the listener it came in on (a worker-local cell), and
    // takes that listener's root route.
    routing.metrics.count_listener(listener);
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
                    Command::Get => request.keys().next().and_then(|key| {
                        crate::mcrouter_admin::answer(routing, listener, root, key)
                    }),
                    _ => None,
                };
                match admin {
                    Some(reply) => pending.push_back(Pending::Ready(reply)),
                    None => pending.push_back(send_single(routing, root, origin, request)),
                }
            } else {
                pending.push_back(split_multi_get(routing, root, origin, request));
            }
        }
        Command::MetaGet => {
            count(&stats.get_keys, 1);
            pending.push_back(send_single(routing, root, origin, request));
        }
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas
        | Command::MetaSet => {
            count(&stats.set_requests, 1);
            pending.push_back(send_single(routing, root, origin, request));
        }
        Command::Touch => {
            count(&stats.touch_keys, 1);
            pending.push_back(send_single(routing, root, origin, request));
        }
        Command::Delete
        | Command::Incr
        | Command::Decr
        | Command::MetaDelete
        | Command::MetaArithmetic
        | Command::MetaDebug => {
            pending.push_back(send_single(routing, root, origin, request));
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

/// Sends `unlink`, the delete memcached does in place of a `set` or `ms` it refused as too
/// large (`memroute_protocol::TooLarge`), wherever a request of the refused write's
/// `operation` on its key goes: through operation routes by that operation, to every
/// replica, to the shadow, along a failover's children, as the write would have gone, so
/// no server that could hold the old value keeps it. Nothing of its reply reaches the client (the
/// refusal, queued after it, is the client's answer); being dispatched in the client's
/// order, it reaches each server before any request the client sends after the refusal.
pub(crate) fn unlink(
    routing: &Rc<RouteSnapshot>,
    origin: Origin,
    operation: Operation,
    unlink: Request,
    pending: &mut std::collections::VecDeque<Pending>,
) {
    let root = routing.root_of(origin.listener);
    // Finished as a text `delete <key> noreply` is: no reply, success or error, is written.
    let answered_as = (Command::Delete, true);
    if routing_prefix::may_carry(&routing.routes, unlink.key(0)) && !unlink.base64_key {
        pending.push_back(send_prefixed(
            routing,
            origin,
            unlink,
            operation,
            answered_as,
        ));
        return;
    }
    pending.push_back(send_placed(
        routing,
        root,
        origin.slot,
        unlink,
        operation,
        answered_as,
    ));
}

fn send_single(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    origin: Origin,
    request: Request,
) -> Pending {
    let operation = operation_of(&request);
    let answered_as = (request.command, request.noreply);
    if routing_prefix::may_carry(&routing.routes, request.key(0)) && !request.base64_key {
        return send_prefixed(routing, origin, request, operation, answered_as);
    }
    send_placed(routing, root, origin.slot, request, operation, answered_as)
}

/// A single-key request whose key may carry a routing prefix: sent to the routes the
/// prefix names (`routing_prefix::resolve`), the first answering the client and the others
/// (a wildcard's) sent to in the background, as mcrouter's RootRoute does for every
/// command; each gets the key with the prefix cut unless its pools keep it, and the
/// client's reply carries the key as it sent it.
fn send_prefixed(
    routing: &Rc<RouteSnapshot>,
    origin: Origin,
    request: Request,
    operation: Operation,
    answered_as: (Command, bool),
) -> Pending {
    let (targets, len) =
        match routing_prefix::resolve(&routing.routes, origin.listener, request.key(0)) {
            Resolved::Plain => {
                let root = routing.root_of(origin.listener);
                return send_placed(routing, root, origin.slot, request, operation, answered_as);
            }
            Resolved::NoRoute => return refused(answered_as, routing_prefix::NO_ROUTE),
            Resolved::OnlyPrefix => return refused(answered_as, routing_prefix::ONLY_PREFIX),
            Resolved::Routes { len, targets } => (targets, len),
        };
    let prefix = request.frame.slice_ref(&request.key(0)[..len]);
    let in_place = cuts_in_place(&request, len);
    let send = |request: &Request, strip: bool, node: NodeId| match (strip, in_place) {
        (true, true) => send_cut(
            routing,
            node,
            origin.slot,
            request.clone(),
            len,
            operation,
            answered_as,
        ),
        _ => {
            let sent = cut_prefix(request, len, strip);
            send_placed(routing, node, origin.slot, sent, operation, answered_as)
        }
    };
    for target in &targets[1..] {
        send(&request, target.strip, target.node).run_in_background();
    }
    let first = targets[0];
    let inner = send(&request, first.strip, first.node);
    restored(inner, request.command, prefix, first.strip)
}

/// The entry for a request whose keys' `prefix` was cut (`strip`): its reply gets it back
/// when it carries keys.
fn restored(inner: Pending, command: Command, prefix: Bytes, strip: bool) -> Pending {
    if !strip || prefix.is_empty() || !routing_prefix::reply_carries_key(command) {
        return inner;
    }
    Pending::Restored(Box::new(Restored {
        inner,
        command,
        prefix,
    }))
}

/// The single-key `request` with its key's first `len` bytes (its routing prefix) cut
/// when `strip`; as it is (a view of the same frame) otherwise.
fn cut_prefix(request: &Request, len: usize, strip: bool) -> Request {
    match strip {
        true => request.with_keys(&[(0, len)]),
        false => request.clone(),
    }
}

/// Whether a prefix of `len` bytes can be left out of `request` as it is sent
/// (`send_cut`) rather than cut into a new frame (`cut_prefix`): a text command (a meta
/// request's flags may echo its key) without a `noreply` token (the frame would be in
/// three pieces), whose line without the prefix needs no rebuilding (`forwardable`).
fn cuts_in_place(request: &Request, len: usize) -> bool {
    !request.command.is_keyed_meta()
        && request.quiet_token.is_none()
        && (request.line_len - len < MAX_SHORT_LINE || !line_limited(request.command))
}

/// The client's frame around the first `cut` bytes of its key: what the server gets.
fn around_cut(request: &Request, cut: usize) -> RequestBytes {
    let key_at = request.keys.first().map_or(0, |key| key.start);
    RequestBytes {
        head: request.frame.slice(..key_at),
        tail: Some(request.frame.slice(key_at + cut..)),
    }
}

/// A request its routing prefix refuses (`error`: mcrouter's for a prefix that names no
/// route, or memcached's for a key that is only a prefix); nothing for a text `noreply`
/// request (meta quiet mode shows errors).
fn refused((command, noreply): (Command, bool), error: &'static [u8]) -> Pending {
    match noreply && !command.is_keyed_meta() {
        true => Pending::Ready(Bytes::new()),
        false => Pending::Ready(Bytes::from_static(error)),
    }
}

/// Sends a single-key request by the route `operation` selects from `root`; its reply is
/// written as `answered_as` (command, noreply) says (`pending::finish_single`).
fn send_placed(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    slot: usize,
    request: Request,
    operation: Operation,
    answered_as: (Command, bool),
) -> Pending {
    send_cut(routing, root, slot, request, 0, operation, answered_as)
}

/// `send_placed` of `request` with its key's first `cut` bytes (a routing prefix, when
/// `cuts_in_place` allows) left out of what is placed and sent: the server gets the
/// client's frame around them, two views of it, no copy.
fn send_cut(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    slot: usize,
    request: Request,
    cut: usize,
    operation: Operation,
    (command, noreply): (Command, bool),
) -> Pending {
    let Some(key) = request.keys().next().and_then(|key| key.get(cut..)) else {
        // The parser never yields a keyed command without a key; answer as memcached would if it did.
        return Pending::Ready(Bytes::from_static(b"ERROR\r\n"));
    };
    // A base64 key (meta `b` flag) is placed by its decoded bytes, like the same key sent raw.
    let mut decoded = [0u8; 256];
    let key = match request.base64_key {
        true => decode_base64(key, &mut decoded).map_or(key, |len| &decoded[..len]),
        false => key,
    };
    // Read-your-writes: no get dispatched after this may join one sent before it, nor
    // be answered from a copy kept before it (or before its reply: `hot_cache`).
    let mut written = None;
    if crate::collapse::changes_key(request.command, &request.frame[..request.line_len]) {
        crate::collapse::forget(key);
        written = crate::hot_cache::written(key);
    }
    let parts = match cut {
        0 => forwardable(&request),
        _ => Some(around_cut(&request, cut)),
    };
    let Some(parts) = parts else {
        return Pending::Ready(Bytes::from_static(b"CLIENT_ERROR line too long\r\n"));
    };
    let kind = ReplyKind::for_command(request.command);
    let routes = &routing.routes;
    let node = routes.select(root, operation, key);
    routing.metrics.count(node as usize, request.command);
    let started = routing.metrics.now();
    let single = route::Single {
        request: &request,
        key,
        parts,
        kind,
        operation,
        slot,
        started,
    };
    Pending::started(
        routing,
        route::start_single(routing, node, single),
        command,
        noreply,
    )
    .holding(written)
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
fn forwardable(request: &Request) -> Option<RequestBytes> {
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
    Some(RequestBytes::whole(rebuilt.freeze()))
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

fn split_multi_get(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    origin: Origin,
    request: Request,
) -> Pending {
    if routing_prefix::any_may_carry(&routing.routes, &request) {
        return split_prefixed(routing, origin, request);
    }
    plain_multi_get(routing, root, origin.slot, request)
}

/// A multi-get sent from `root` as the client wrote it, split per server.
fn plain_multi_get(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    slot: usize,
    request: Request,
) -> Pending {
    let head = compact_head(&request);
    // gat/gats lines must stay under memcached's line limit (get/gets lines may be longer).
    let byte_cap = match line_limited(request.command) {
        true => MAX_SHORT_LINE - 2,
        false => usize::MAX,
    };
    let command = request.command;
    if matches!(command, Command::Gat | Command::Gats) {
        // A touch changes when each key expires: later gets join no get sent before it.
        // The hot cache's copies of them too (at dispatch only: a touch leaves values as
        // they are, so a get answered before it landed read the same value).
        request.keys().for_each(|key| {
            crate::collapse::forget(key);
            drop(crate::hot_cache::written(key));
        });
    }
    let start = route::start_multi_get(routing, root, slot, request, head, byte_cap);
    Pending::started(routing, start, command, false)
}

fn fan_out_flush(
    routing: &Rc<RouteSnapshot>,
    root: NodeId,
    slot: usize,
    request: Request,
) -> Pending {
    routing.metrics.count(root as usize, request.command);
    let started = routing.metrics.now();
    let (command, noreply) = (request.command, request.noreply);
    crate::collapse::forget_all();
    let flushed = crate::hot_cache::flushed();
    let start = route::start_flush_all(routing, root, request.forward_parts(), slot, started);
    Pending::started(routing, start, command, noreply).holding(flushed)
}

/// One route's keys of a multi-get whose keys carry routing prefixes: the route, the
/// prefix cut from them (empty: sent as written), and each key as `(index, cut)`.
struct PrefixGroup {
    node: NodeId,
    prefix: Bytes,
    keys: Vec<(usize, usize)>,
}

/// A multi-get whose keys may carry routing prefixes: its keys grouped by the route that
/// answers for them (keys without a prefix take the listener's root), each group sent as
/// a multi-get of its own with its prefix cut, and the replies merged in the client's
/// order with the client's keys (`Pending::Split`); one group is sent as the client's
/// multi-get. A wildcard's other routes get their keys in the background.
///
/// A key whose prefix names no route (or is the whole key) answers the whole multi-get
/// with its error, and no hit is written: mcrouter sends each key of a text multi-get as a
/// request of its own, and its `MultiOpParent` keeps the first error, which then takes the
/// place of `END`, and suppresses every reply that comes after it (`noReply` on a parent
/// error); a key without a route fails at once, before any server answers. Its other keys
/// are still sent there, so a `gat`'s touches land: they are here too, for gat/gats, with
/// their replies dropped (a get's would change nothing).
fn split_prefixed(routing: &Rc<RouteSnapshot>, origin: Origin, request: Request) -> Pending {
    let root = routing.root_of(origin.listener);
    let mut groups: Vec<PrefixGroup> = Vec::new();
    let mut background: Vec<PrefixGroup> = Vec::new();
    let mut refusal: Option<&'static [u8]> = None;
    let mut key_part = crate::multiget::KeyLegs::with_capacity(request.keys.len());
    let key_count = request.keys.len();
    let group_of = |groups: &mut Vec<PrefixGroup>, node, prefix: Bytes| match groups
        .iter()
        .position(|g| g.node == node && g.prefix == prefix)
    {
        Some(at) => at,
        None => {
            // Room for every key: one allocation where most multi-gets have one group.
            groups.push(PrefixGroup {
                node,
                prefix,
                keys: Vec::with_capacity(key_count),
            });
            groups.len() - 1
        }
    };
    for (i, key) in request.keys().enumerate() {
        let (targets, len) = match routing_prefix::resolve(&routing.routes, origin.listener, key) {
            Resolved::Plain => {
                let at = group_of(&mut groups, root, Bytes::new());
                groups[at].keys.push((i, 0));
                key_part.push(at as u32);
                continue;
            }
            Resolved::NoRoute => {
                refusal.get_or_insert(routing_prefix::NO_ROUTE);
                continue;
            }
            Resolved::OnlyPrefix => {
                refusal.get_or_insert(routing_prefix::ONLY_PREFIX);
                continue;
            }
            Resolved::Routes { len, targets } => (targets, len),
        };
        let prefix = request.frame.slice_ref(&key[..len]);
        for (n, target) in targets.iter().enumerate() {
            let (cut, prefix) = match target.strip {
                true => (len, prefix.clone()),
                false => (0, Bytes::new()),
            };
            let into = if n == 0 { &mut groups } else { &mut background };
            let at = group_of(into, target.node, prefix);
            into[at].keys.push((i, cut));
            if n == 0 {
                key_part.push(at as u32);
            }
        }
    }
    if refusal.is_some() {
        if matches!(request.command, Command::Gat | Command::Gats) {
            background.append(&mut groups);
        } else {
            background.clear();
        }
    }
    for group in background {
        let keys = request.with_keys(&group.keys);
        send_group(routing, group.node, origin.slot, keys).run_in_background();
    }
    if let Some(error) = refusal {
        return refused((request.command, false), error);
    }
    let command = request.command;
    if let [group] = &groups[..] {
        let keys = request.with_keys(&group.keys);
        let inner = send_group(routing, group.node, origin.slot, keys);
        return restored(inner, command, group.prefix.clone(), true);
    }
    let parts = groups
        .into_iter()
        .map(|group| {
            let keys = request.with_keys(&group.keys);
            (
                send_group(routing, group.node, origin.slot, keys),
                group.prefix,
            )
        })
        .collect();
    Pending::Split(Box::new(Split {
        parts,
        command,
        request,
        key_part,
    }))
}

/// One route's keys of a multi-get (`split_prefixed`), sent from route `node` as the
/// client's multi-get (or single get) would be.
fn send_group(routing: &Rc<RouteSnapshot>, node: NodeId, slot: usize, request: Request) -> Pending {
    if request.keys.len() == 1 {
        let operation = operation_of(&request);
        let answered_as = (request.command, false);
        return send_placed(routing, node, slot, request, operation, answered_as);
    }
    plain_multi_get(routing, node, slot, request)
}
