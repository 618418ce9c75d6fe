//! How a route kind runs its child routes: the interface of the walk over the route tree
//! (`RunChild`), declared here, below the kinds, and implemented by walk.rs (`Walker`),
//! above them. The kinds recurse through the tree without importing the walk that calls
//! them, so the walk is the one module that knows every kind.
use std::rc::Rc;

use memroute_routing::NodeId;

use super::job::{BoxedKeyReplies, BoxedReply, Job, KeyReplies, MultiJob};
use crate::reply::Reply;
use crate::snapshot::RouteSnapshot;

/// The walk over the route tree (walk.rs implements `RunChild` for it). A type without
/// data, so that every call is resolved at compile time: no table of functions on the
/// request path.
pub(super) struct Walker;

/// Running a job from a node down to the servers and back.
pub(super) trait RunChild {
    /// Runs `job` from `node`. Boxed: routes nest.
    fn run(routing: Rc<RouteSnapshot>, node: NodeId, job: Rc<Job>) -> BoxedReply;

    /// Runs the keys `keys` (indexes into `job.keys`) from `node`; one outcome per key, in
    /// the order of `keys`. Boxed: routes nest.
    fn run_multi(
        routing: Rc<RouteSnapshot>,
        node: NodeId,
        job: Rc<MultiJob>,
        keys: Vec<u32>,
    ) -> BoxedKeyReplies;

    /// `run` from a child node, awaited in place: a pool child (the common case) without
    /// the boxed future a nested route needs.
    async fn run_child(routing: &Rc<RouteSnapshot>, node: NodeId, job: &Rc<Job>) -> Reply;

    /// `run_child` for a multi-key job.
    async fn run_multi_child(
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        job: &Rc<MultiJob>,
        keys: Vec<u32>,
    ) -> KeyReplies;
}
