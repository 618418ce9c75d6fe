//! A random route: each request goes to one child picked at random. A single-key request
//! through random routes over pools only starts as a plain leg (`route::single_pool`); a
//! multi-get's keys that reach one go to one child per multi-get (`RandomPicks`).
use memroute_routing::{Node, NodeId};
use rand::Rng;
use smallvec::SmallVec;

use crate::snapshot::RouteSnapshot;

/// The random choices of one multi-get: every key that reaches a random route goes to the
/// same child, as a group run by the executor would (one pick per route per multi-get).
pub(crate) type RandomPicks = SmallVec<[(NodeId, NodeId); 1]>;

/// Whether every child of a random route is a pool: only then is its pick made on the fast
/// path (`single_pool`, `multi_get_pool`). A pick that led to another route would be
/// discarded there and drawn again by the executor, so children that are routes would be
/// chosen less often than 1/n; the executor draws once for those.
pub(super) fn only_pools(routing: &RouteSnapshot, children: &[NodeId]) -> bool {
    children
        .iter()
        .all(|&child| matches!(routing.routes.node(child), Node::Pool(_)))
}

/// One child at random. A route table never holds a random or replicated route without
/// children (the routing crate refuses to build one: `route ... has no children`), which
/// `children[0]` for `reads = "first"` relies on too: no fallback to make up.
pub(super) fn pick(children: &[NodeId]) -> NodeId {
    match children.len() {
        1 => children[0],
        n => children[rand::thread_rng().gen_range(0..n)],
    }
}
