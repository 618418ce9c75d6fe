//! Which requests the live watch takes (`request_watch`), looked at only while someone
//! watches: each key's route as dispatch will select it, and the watchers that want it.
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use memroute_protocol::{decode_base64, Command, Request};
use memroute_routing::operation_of;

use crate::request_watch::{Sampled, WatchHub, WatchLine};
use crate::snapshot::RouteSnapshot;

/// Key bytes a line carries (memcached's key limit; a base64 meta key decoded).
const KEY_BYTES: usize = memroute_protocol::MAX_KEY_LEN;

/// The request `request`, read from `client()` on the `listener`-th listener: the watchers
/// that take it, if any (called only while someone watches).
pub(crate) fn sample(
    hub: &Arc<WatchHub>,
    routing: &RouteSnapshot,
    listener: usize,
    client: &dyn Fn() -> String,
    request: &Request,
) -> Option<Box<Sampled>> {
    hub.counters.examined.inc();
    let mut decoded = [0u8; 256];
    let keys = request.keys().map(|key| match request.base64_key {
        true => decode_base64(key, &mut decoded).map_or(key.to_vec(), |n| decoded[..n].to_vec()),
        false => key.to_vec(),
    });
    let root = routing.root_of(listener);
    let root_name = routing.routes.node_name(root);
    let now = Instant::now();
    let mut chosen = None;
    let keyed = request.command.is_keyed();
    let local = local_route(request.command);
    // The first key any watcher wants is the line's (a multi-get's other keys are counted);
    // a request without a key is looked at once, as an empty key.
    let empty = (!keyed).then(Vec::new);
    for key in keys.chain(empty) {
        let route = match keyed {
            true => keyed_route(routing, listener, root, request, &key),
            false => local.unwrap_or(root_name).to_string(),
        };
        let takers = hub.takers(&key, &route, root_name, now);
        if !takers.is_empty() {
            chosen = Some((key, route, takers));
            break;
        }
    }
    let (mut key, route, takers) = chosen?;
    key.truncate(KEY_BYTES);
    let line = WatchLine {
        time: SystemTime::now(),
        client: client(),
        command: request.command.name(),
        key,
        keys: request.keys().count(),
        route,
        server: String::new(),
        result: String::new(),
        latency: Duration::ZERO,
    };
    Some(Sampled::new(
        hub.clone(),
        takers,
        now,
        request.command,
        line,
    ))
}

/// The route name requests memroute answers itself are counted under (as in `stats`).
fn local_route(command: Command) -> Option<&'static str> {
    match command {
        Command::Version
        | Command::Verbosity
        | Command::Stats
        | Command::MetaNoop
        | Command::Shutdown
        | Command::Quit => Some("(proxy)"),
        _ => None,
    }
}

/// The route a keyed request's `key` takes, as dispatch selects it: by its routing prefix
/// when it carries one this config routes by (the first of a wildcard's routes, the one
/// that answers), else from the listener's `root`.
fn keyed_route(
    routing: &RouteSnapshot,
    listener: usize,
    root: memroute_routing::NodeId,
    request: &Request,
    key: &[u8],
) -> String {
    use crate::routing_prefix::{may_carry, resolve, Resolved};
    let routes = &routing.routes;
    let operation = operation_of(request);
    if !request.base64_key && may_carry(routes, key) {
        match resolve(routes, listener, key) {
            Resolved::Plain => {}
            Resolved::Routes { len, targets } => {
                let first = targets[0];
                let sent = if first.strip { &key[len..] } else { key };
                return routes
                    .node_name(routes.select(first.node, operation, sent))
                    .to_string();
            }
            Resolved::NoRoute | Resolved::OnlyPrefix => return "(no route)".to_string(),
        }
    }
    routes
        .node_name(routes.select(root, operation, key))
        .to_string()
}
