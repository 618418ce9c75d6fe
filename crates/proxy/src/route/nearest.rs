//! A replicated route reading `nearest`, on the request path: its read order refreshed
//! where a read starts, and its reads counted by locality. The order itself is kept in
//! `read_order`, beside the snapshot that owns it.
use memroute_routing::NodeId;

pub(crate) use crate::read_order::ChildOrder;
use crate::snapshot::RouteSnapshot;

/// Recomputes route `node`'s read order when it is due (`ReadOrder::refresh`), if the
/// route reads `nearest`: called where a read through it starts.
#[inline]
pub(crate) fn refresh(routing: &RouteSnapshot, node: NodeId) {
    if let Some(order) = routing.nearest.of(node) {
        order.refresh(routing.metrics.now());
    }
}

/// Counts `n` reads (keys) route `node` sends to `child`, by locality, if the route reads
/// `nearest` (a worker-local count, flushed with the others).
#[inline]
pub(crate) fn count_reads(routing: &RouteSnapshot, node: NodeId, child: NodeId, n: u64) {
    if let Some(order) = routing.nearest.of(node) {
        routing
            .metrics
            .count_zone_reads(node, order.is_local(child), n);
    }
}
