//! The one walk over the route tree (`walk`): each node handed to its kind's step, for a
//! single-key job (`Rc<Job>`) or some of a multi-get's keys (`Keys`) alike. What differs
//! between the two is each kind's own single- or multi-key execution (`Walk`), chosen at
//! compile time: the walk is the same code for both, with nothing to decide per node.
//!
//! The kinds run their children through it as `Walker` (`children::RunChild`, implemented
//! here): this module imports every kind, and none imports it back.
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use memroute_config::{FailoverOn, Operation, ReadPolicy, WritePolicy};
use memroute_routing::{Node, NodeId};
use smallvec::SmallVec;

use super::children::{RunChild, Walker};
use super::job::{BoxedKeyReplies, BoxedReply, Job, KeyReplies, MultiJob};
use super::{failover, fixed, random, replicated, resize, select, shadow, warm_up};
use crate::reply::Reply;
use crate::snapshot::RouteSnapshot;

/// What the walk carries down the route tree, and each route kind's step for it.
pub(super) trait Walk: Sized + 'static {
    type Answer: 'static;
    /// Where a prefix or operation route sends it when not all to one child.
    type Split;

    /// The answer when there is nothing left to walk (a multi-get's empty share).
    fn settled(&self) -> Option<Self::Answer>;
    /// At prefix or operation route `node`: the one child it all goes on to, or how it
    /// splits between children.
    fn select(&self, routing: &RouteSnapshot, node: NodeId) -> Result<NodeId, Self::Split>;
    async fn split(self, routing: &Rc<RouteSnapshot>, split: Self::Split) -> Self::Answer;
    async fn pool(self, routing: &Rc<RouteSnapshot>, pool: usize) -> Self::Answer;
    /// At shadow route `node`: the copy to its shadow target (the walk goes on with the
    /// primary).
    fn shadow(&self, routing: &Rc<RouteSnapshot>, node: NodeId);
    async fn replicated(
        self,
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        children: &[NodeId],
        writes: WritePolicy,
        reads: ReadPolicy,
    ) -> Self::Answer;
    async fn failover(
        self,
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        children: &[NodeId],
        on: FailoverOn,
    ) -> Self::Answer;
    async fn warm_up(
        self,
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        cold: NodeId,
        warm: NodeId,
        ttl: u32,
    ) -> Self::Answer;
    fn null(&self) -> Self::Answer;
    fn error(&self, message: &str) -> Self::Answer;
}

/// Runs `walking` from `node` down to the servers and back, each node's step its kind's.
/// Boxed: routes nest.
pub(super) fn walk<W: Walk>(
    routing: Rc<RouteSnapshot>,
    node: NodeId,
    walking: W,
) -> Pin<Box<dyn Future<Output = W::Answer>>> {
    Box::pin(async move {
        let routes = routing.routes.clone();
        let mut node = node;
        loop {
            if let Some(answer) = walking.settled() {
                return answer;
            }
            match routes.node(node) {
                Node::Prefix { .. } | Node::Operation { .. } => {
                    match walking.select(&routing, node) {
                        Ok(child) => node = child,
                        Err(split) => return walking.split(&routing, split).await,
                    }
                }
                Node::Pool(pool) => return walking.pool(&routing, *pool).await,
                Node::Shadow { primary, .. } => {
                    walking.shadow(&routing, node);
                    node = *primary;
                }
                Node::Replicated {
                    children,
                    writes,
                    reads,
                } => {
                    let (writes, reads) = (*writes, *reads);
                    return walking
                        .replicated(&routing, node, children, writes, reads)
                        .await;
                }
                Node::Failover { children, on, .. } => {
                    return walking.failover(&routing, node, children, *on).await;
                }
                Node::WarmUp { cold, warm, ttl } => {
                    return walking.warm_up(&routing, node, *cold, *warm, *ttl).await;
                }
                Node::Random { children } => node = random::pick(children),
                Node::Null => return walking.null(),
                Node::Error { message } => return walking.error(message),
            }
        }
    })
}

impl Walk for Rc<Job> {
    type Answer = Reply;
    /// A flush_all through a prefix route: every target.
    type Split = Vec<NodeId>;

    fn settled(&self) -> Option<Reply> {
        None
    }

    fn select(&self, routing: &RouteSnapshot, node: NodeId) -> Result<NodeId, Vec<NodeId>> {
        match routing.routes.node(node) {
            Node::Prefix { prefixes, default } if self.operation == Operation::FlushAll => {
                Err(select::flush_all_targets(prefixes, *default))
            }
            _ => Ok(routing.routes.select(node, self.operation, &self.key)),
        }
    }

    async fn split(self, routing: &Rc<RouteSnapshot>, targets: Vec<NodeId>) -> Reply {
        select::flush_all_of(routing, &targets, &self).await
    }

    async fn pool(self, routing: &Rc<RouteSnapshot>, pool: usize) -> Reply {
        resize::send(routing, pool, &self).await
    }

    fn shadow(&self, routing: &Rc<RouteSnapshot>, node: NodeId) {
        shadow::copy(routing, node, self);
    }

    async fn replicated(
        self,
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        children: &[NodeId],
        writes: WritePolicy,
        reads: ReadPolicy,
    ) -> Reply {
        replicated::run(routing, node, children, writes, reads, &self).await
    }

    async fn failover(
        self,
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        children: &[NodeId],
        on: FailoverOn,
    ) -> Reply {
        failover::run(routing, node, children, on, &self).await
    }

    async fn warm_up(
        self,
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        cold: NodeId,
        warm: NodeId,
        ttl: u32,
    ) -> Reply {
        warm_up::run(routing, node, cold, warm, ttl, &self).await
    }

    fn null(&self) -> Reply {
        Ok(fixed::null_answer(self))
    }

    fn error(&self, message: &str) -> Reply {
        Ok(fixed::error_line(message))
    }
}

/// Some of a multi-get's keys: `keys` are indexes into `job.keys`; the answer has one
/// outcome per key, in the order of `keys`.
pub(super) struct Keys {
    pub job: Rc<MultiJob>,
    pub keys: Vec<u32>,
}

impl Walk for Keys {
    type Answer = KeyReplies;
    /// Per child, the positions (in `keys`) of its keys.
    type Split = SmallVec<[(NodeId, Vec<usize>); 2]>;

    fn settled(&self) -> Option<KeyReplies> {
        self.keys.is_empty().then(|| KeyReplies::Keys(Vec::new()))
    }

    fn select(&self, routing: &RouteSnapshot, node: NodeId) -> Result<NodeId, Self::Split> {
        match select::split_keys(routing, node, &self.job, &self.keys) {
            select::Split::One(child) => Ok(child),
            select::Split::Groups(groups) => Err(groups),
        }
    }

    async fn split(self, routing: &Rc<RouteSnapshot>, groups: Self::Split) -> KeyReplies {
        select::run_groups(routing, &self.job, &self.keys, groups).await
    }

    async fn pool(self, routing: &Rc<RouteSnapshot>, pool: usize) -> KeyReplies {
        resize::run_multi(routing, pool, &self.job, &self.keys).await
    }

    fn shadow(&self, routing: &Rc<RouteSnapshot>, node: NodeId) {
        shadow::copy_keys(routing, node, &self.job, &self.keys);
    }

    async fn replicated(
        self,
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        children: &[NodeId],
        _writes: WritePolicy,
        reads: ReadPolicy,
    ) -> KeyReplies {
        replicated::run_multi(routing, node, children, reads, &self.job, self.keys).await
    }

    async fn failover(
        self,
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        children: &[NodeId],
        on: FailoverOn,
    ) -> KeyReplies {
        failover::run_multi(routing, node, children, on, &self.job, self.keys).await
    }

    async fn warm_up(
        self,
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        cold: NodeId,
        warm: NodeId,
        ttl: u32,
    ) -> KeyReplies {
        warm_up::run_multi(routing, node, cold, warm, ttl, &self.job, self.keys).await
    }

    fn null(&self) -> KeyReplies {
        fixed::null_keys(self.keys.len())
    }

    fn error(&self, message: &str) -> KeyReplies {
        fixed::error_keys(message, self.keys.len())
    }
}

impl RunChild for Walker {
    fn run(routing: Rc<RouteSnapshot>, node: NodeId, job: Rc<Job>) -> BoxedReply {
        walk(routing, node, job)
    }

    fn run_multi(
        routing: Rc<RouteSnapshot>,
        node: NodeId,
        job: Rc<MultiJob>,
        keys: Vec<u32>,
    ) -> BoxedKeyReplies {
        walk(routing, node, Keys { job, keys })
    }

    async fn run_child(routing: &Rc<RouteSnapshot>, node: NodeId, job: &Rc<Job>) -> Reply {
        match routing.routes.node(node) {
            Node::Pool(pool) if job.operation != Operation::FlushAll => {
                resize::send(routing, *pool, job).await
            }
            _ => Self::run(routing.clone(), node, job.clone()).await,
        }
    }

    async fn run_multi_child(
        routing: &Rc<RouteSnapshot>,
        node: NodeId,
        job: &Rc<MultiJob>,
        keys: Vec<u32>,
    ) -> KeyReplies {
        match routing.routes.node(node) {
            Node::Pool(pool) => resize::run_multi(routing, *pool, job, &keys).await,
            _ => Self::run_multi(routing.clone(), node, job.clone(), keys).await,
        }
    }
}
