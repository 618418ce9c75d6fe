//! mcrouter's admin queries, answered the way mcrouter answers them, so scripts and
//! dashboards written for mcrouter keep working against memroute:
//!
//! ```text
//!   get __mcrouter__.version                  VALUE ... memroute-<version>
//!   get __mcrouter__.config_file              VALUE ... <path of the config file>
//!   get __mcrouter__.route(OP,KEY)            VALUE ... every server OP KEY may reach, one per line
//!   get __mcrouter__.route_handles(OP,KEY)    VALUE ... the route tree OP KEY walks, indented
//!   get __mcrouter__.<anything else>          SERVER_ERROR naming what is not supported
//! ```
//!
//! Only a single-key `get` is looked at; a multi-get containing such a key is routed like
//! any other. Answering costs one prefix comparison per single-key get.
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::OnceLock;

use bytes::Bytes;
use memroute_config::{Operation, ReadPolicy};
use memroute_routing::{Node, NodeId};

use crate::snapshot::RouteSnapshot;

const PREFIX: &[u8] = b"__mcrouter__.";
/// Route nodes `route(op,key)` visits at most.
const MAX_WALK_STEPS: usize = 10_000;
/// Largest `route_handles` answer; the tree is cut (with `...`) beyond it.
const MAX_ROUTE_HANDLES_BYTES: usize = 64 * 1024;

/// The config file memroute was started with (what `__mcrouter__.config_file` answers).
static CONFIG_FILE: OnceLock<PathBuf> = OnceLock::new();

/// Records the config file's path for `__mcrouter__.config_file` (once, at start).
pub fn set_config_file(path: PathBuf) {
    let _ = CONFIG_FILE.set(path);
}

/// The reply to `get KEY` when KEY is an mcrouter admin query, else `None`.
pub(crate) fn answer(
    routing: &RouteSnapshot,
    listener: usize,
    root: NodeId,
    key: &[u8],
) -> Option<Bytes> {
    let query = key.strip_prefix(PREFIX)?;
    let value = match query {
        b"version" => Ok(format!("memroute-{}", crate::version::VERSION)),
        b"config_file" => match CONFIG_FILE.get() {
            Some(path) => Ok(path.display().to_string()),
            None => Err("no config file".to_string()),
        },
        other => match parse_route_query(other) {
            Some((b"route", operation, routed_key)) => {
                let mut out = Vec::new();
                for (from, key) in starts(routing, listener, root, routed_key) {
                    out.extend(destinations(routing, from, operation, key));
                }
                out.dedup();
                Ok(out.join("\r\n"))
            }
            Some((b"route_handles", operation, routed_key)) => {
                let mut out = String::new();
                for (from, key) in starts(routing, listener, root, routed_key) {
                    route_handles(routing, from, operation, key, 0, &mut out);
                }
                Ok(out.trim_end().to_string())
            }
            _ => Err(format!(
                "memroute does not answer __mcrouter__.{} (supported: version, config_file, route(op,key), route_handles(op,key))",
                String::from_utf8_lossy(other)
            )),
        },
    };
    Some(match value {
        Ok(value) => {
            let mut reply = Vec::with_capacity(key.len() + value.len() + 32);
            reply.extend_from_slice(b"VALUE ");
            reply.extend_from_slice(key);
            reply.extend_from_slice(format!(" 0 {}\r\n", value.len()).as_bytes());
            reply.extend_from_slice(value.as_bytes());
            reply.extend_from_slice(b"\r\nEND\r\n");
            Bytes::from(reply)
        }
        Err(message) => Bytes::from(format!("SERVER_ERROR {message}\r\n")),
    })
}

/// Where a request for `key` starts: the listener's root, or the routes its routing
/// prefix names (in the order they are sent to), each with the key its servers get.
fn starts<'k>(
    routing: &RouteSnapshot,
    listener: usize,
    root: NodeId,
    key: &'k [u8],
) -> Vec<(NodeId, &'k [u8])> {
    use crate::routing_prefix::{may_carry, resolve, Resolved};
    if !may_carry(&routing.routes, key) {
        return vec![(root, key)];
    }
    match resolve(&routing.routes, listener, key) {
        Resolved::Plain => vec![(root, key)],
        Resolved::NoRoute | Resolved::OnlyPrefix => Vec::new(),
        Resolved::Routes { len, targets } => targets
            .iter()
            .map(|t| (t.node, if t.strip { &key[len..] } else { key }))
            .collect(),
    }
}

/// `route(get,KEY)` -> ("route", Get, KEY), on bytes: KEY need not be UTF-8. mcrouter
/// spells flush_all `flushall`.
fn parse_route_query(query: &[u8]) -> Option<(&[u8], Operation, &[u8])> {
    let open = query.iter().position(|&b| b == b'(')?;
    let (name, rest) = (&query[..open], &query[open + 1..]);
    let args = rest.strip_suffix(b")")?;
    let comma = args.iter().position(|&b| b == b',')?;
    let (operation, key) = (&args[..comma], &args[comma + 1..]);
    let operation = match operation {
        b"flushall" => Operation::FlushAll,
        op => Operation::parse(std::str::from_utf8(op).ok()?)?,
    };
    Some((name, operation, key))
}

/// The servers the request would be sent to now, in route order, without repeats. As in
/// mcrouter this follows the routing in effect: a failover route (and replicated reads that
/// fail over, in this worker's read order for `nearest`) reports the first child that has
/// a server not marked down; writes to a
/// replicated route report every child; a shadow is reported when the key is in its range;
/// a random route reports every child it may choose; a warm-up get reports cold then warm.
fn destinations(
    routing: &RouteSnapshot,
    root: NodeId,
    operation: Operation,
    key: &[u8],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut walk = Walk {
        routing,
        operation,
        key,
        // Routes are a DAG: a node shared by several parents is walked once.
        seen: vec![false; routing.routes.node_count()],
        // Failover children not taken are un-seen again, so a contrived DAG could make the
        // walk long: it stops after this many steps rather than hold up the worker.
        budget: MAX_WALK_STEPS,
    };
    walk.collect(root, &mut out);
    out
}

struct Walk<'a> {
    routing: &'a RouteSnapshot,
    operation: Operation,
    key: &'a [u8],
    seen: Vec<bool>,
    budget: usize,
}

impl Walk<'_> {
    fn collect(&mut self, from: NodeId, out: &mut Vec<String>) {
        let Some(budget) = self.budget.checked_sub(1) else {
            return;
        };
        self.budget = budget;
        let routes = &self.routing.routes;
        let id = routes.select(from, self.operation, self.key);
        if std::mem::replace(&mut self.seen[id as usize], true) {
            return;
        }
        match routes.node(id) {
            Node::Pool(pool) => {
                if let Some(server) = self.routing.server_for(*pool, self.key) {
                    let address = self.routing.pools[*pool].servers[server].health.address();
                    if !out.iter().any(|a| a.as_str() == &**address) {
                        out.push(address.to_string());
                    }
                }
            }
            Node::Shadow {
                primary,
                shadow,
                range,
                ..
            } => {
                self.collect(*primary, out);
                if range.contains_key(self.key) {
                    self.collect(*shadow, out);
                }
            }
            Node::Replicated {
                children, reads, ..
            } => {
                if self.operation.is_write()
                    || *reads == ReadPolicy::Fastest
                    || *reads == ReadPolicy::Random
                {
                    for &child in children {
                        self.collect(child, out);
                    }
                } else if *reads == ReadPolicy::First {
                    self.collect(children[0], out);
                } else if let Some(order) = self.routing.nearest.of(id) {
                    // This worker's read order (its zone, then measured latency).
                    self.first_live(&order.order(), out);
                } else {
                    self.first_live(children, out);
                }
            }
            Node::Failover { children, .. } => self.first_live(children, out),
            Node::WarmUp { cold, warm, .. } => {
                self.collect(*cold, out);
                if !self.operation.is_write() {
                    self.collect(*warm, out);
                }
            }
            Node::Random { children } => {
                for &child in children {
                    self.collect(child, out);
                }
            }
            Node::Null | Node::Error { .. } | Node::Prefix { .. } | Node::Operation { .. } => {}
        }
    }

    /// The first child that reaches a server not marked down (the last child when none
    /// does: the request ends there).
    fn first_live(&mut self, children: &[NodeId], out: &mut Vec<String>) {
        for (i, &child) in children.iter().enumerate() {
            let mut found = Vec::new();
            let seen = self.seen.clone();
            self.collect(child, &mut found);
            let live = found.iter().any(|address| !self.is_down(address));
            if live || i + 1 == children.len() {
                for address in found {
                    if !out.contains(&address) {
                        out.push(address);
                    }
                }
                return;
            }
            // Not taken: its nodes may still be reached through another path.
            self.seen = seen;
        }
    }

    fn is_down(&self, address: &str) -> bool {
        self.routing
            .pools
            .iter()
            .flat_map(|pool| &pool.servers)
            .any(|server| &**server.health.address() == address && server.health.is_down())
    }
}

/// The route tree `operation key` walks, one node per line, children indented by one
/// space (mcrouter's format), each as `type|name` with the server for pools.
fn route_handles(
    routing: &RouteSnapshot,
    id: NodeId,
    operation: Operation,
    key: &[u8],
    depth: usize,
    out: &mut String,
) {
    let node = routing.routes.node(id);
    let name = routing.routes.node_name(id);
    let indent = " ".repeat(depth);
    let (kind, next): (&str, Vec<NodeId>) = match node {
        Node::Pool(pool) => {
            let server = routing
                .server_for(*pool, key)
                .map(|s| routing.pools[*pool].servers[s].health.address().to_string())
                .unwrap_or_else(|| "(no servers)".to_string());
            let _ = write!(out, "{indent}pool|{name}\r\n");
            let _ = write!(out, "{indent} server|{server}\r\n");
            return;
        }
        // One step, not `select` (which would skip nested operation nodes from the tree).
        Node::Prefix { prefixes, default } => (
            "prefix",
            vec![prefixes
                .iter()
                .find(|(prefix, _)| key.starts_with(prefix))
                .map_or(*default, |&(_, target)| target)],
        ),
        Node::Operation { table } => ("operation", vec![table[operation.index()]]),
        Node::Shadow {
            primary,
            shadow,
            range,
            ..
        } => (
            "shadow",
            if range.contains_key(key) {
                vec![*primary, *shadow]
            } else {
                vec![*primary]
            },
        ),
        Node::Replicated { .. } => ("replicated", node.children()),
        Node::Failover { .. } => ("failover", node.children()),
        Node::WarmUp { .. } => ("warm-up", node.children()),
        Node::Random { .. } => ("random", node.children()),
        Node::Null => ("null", Vec::new()),
        Node::Error { .. } => ("error", Vec::new()),
    };
    let _ = write!(out, "{indent}{kind}|{name}\r\n");
    for child in next {
        // A tree printed from a DAG can repeat shared parts; past this size the rest is cut
        // so one query cannot keep a worker busy.
        if out.len() > MAX_ROUTE_HANDLES_BYTES {
            let _ = write!(out, "{indent} ...\r\n");
            return;
        }
        route_handles(routing, child, operation, key, depth + 1, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_queries_parse() {
        assert_eq!(
            parse_route_query(b"route(get,a:b,c)"),
            Some((&b"route"[..], Operation::Get, &b"a:b,c"[..]))
        );
        assert_eq!(
            parse_route_query(b"route_handles(flushall,k\xff)"),
            Some((&b"route_handles"[..], Operation::FlushAll, &b"k\xff"[..]))
        );
        assert_eq!(parse_route_query(b"route(bogus,k)"), None);
        assert_eq!(parse_route_query(b"route(\xff,k)"), None);
        assert_eq!(parse_route_query(b"route(get)"), None);
        assert_eq!(parse_route_query(b"options"), None);
    }
}
