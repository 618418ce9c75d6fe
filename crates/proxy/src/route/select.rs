//! Prefix and operation routes: they only pick the child a request goes on to
//! (`RouteTable::select`); the walk goes on there. flush_all has no key: through a prefix
//! route it goes to every target. A multi-get's keys may part ways here: one group per
//! child, run side by side.
use std::rc::Rc;

use memroute_routing::NodeId;
use smallvec::SmallVec;

use super::children::{RunChild, Walker};
use super::in_place::{join_all, start_all};
use super::job::{Job, KeyReplies, KeyReply, MultiJob};
use crate::reply::{FlushAllMerge, Reply};
use crate::snapshot::RouteSnapshot;

/// Where a flush_all through prefix route `prefixes`/`default` goes: to every target, so
/// that the pools behind the other prefixes are flushed too (`flush_all_of`).
pub(super) fn flush_all_targets(prefixes: &[(Vec<u8>, NodeId)], default: NodeId) -> Vec<NodeId> {
    let mut targets: Vec<NodeId> = prefixes.iter().map(|(_, t)| *t).collect();
    targets.push(default);
    targets.sort_unstable();
    targets.dedup();
    targets
}

/// Where a multi-get's keys go on from a prefix or operation route.
pub(super) enum Split {
    /// Every key to one child (the common case): the walk goes on there.
    One(NodeId),
    /// Per child, the positions (in `keys`) of its keys.
    Groups(SmallVec<[(NodeId, Vec<usize>); 2]>),
}

/// Groups `keys` (indexes into `job.keys`) by the child of `node` each goes to.
pub(super) fn split_keys(
    routing: &RouteSnapshot,
    node: NodeId,
    job: &MultiJob,
    keys: &[u32],
) -> Split {
    let mut groups: SmallVec<[(NodeId, Vec<usize>); 2]> = SmallVec::new();
    for (position, &key) in keys.iter().enumerate() {
        let child = routing
            .routes
            .select(node, job.operation, &job.keys[key as usize]);
        match groups.iter_mut().find(|(node, _)| *node == child) {
            Some((_, positions)) => positions.push(position),
            None => groups.push((child, vec![position])),
        }
    }
    match groups.as_slice() {
        [(child, _)] => Split::One(*child),
        _ => Split::Groups(groups),
    }
}

/// Runs each child's group side by side; the outcomes back in the order of `keys`.
pub(super) async fn run_groups(
    routing: &Rc<RouteSnapshot>,
    job: &Rc<MultiJob>,
    keys: &[u32],
    groups: SmallVec<[(NodeId, Vec<usize>); 2]>,
) -> KeyReplies {
    let subsets: Vec<Vec<u32>> = groups
        .iter()
        .map(|(_, positions)| positions.iter().map(|&p| keys[p]).collect())
        .collect();
    let futures = groups
        .iter()
        .zip(&subsets)
        .map(|((child, _), subset)| {
            Walker::run_multi(routing.clone(), *child, job.clone(), subset.clone())
        })
        .collect();
    let mut out = vec![KeyReply::Miss; keys.len()];
    let answers = join_all(futures).await;
    for (((_, positions), subset), replies) in groups.iter().zip(&subsets).zip(answers) {
        let replies = replies.into_keys(job, subset);
        for (&position, reply) in positions.iter().zip(replies) {
            out[position] = reply;
        }
    }
    KeyReplies::Keys(out)
}

/// flush_all through several routes at once: `OK` only if every one said so.
pub(super) async fn flush_all_of(
    routing: &Rc<RouteSnapshot>,
    targets: &[NodeId],
    job: &Rc<Job>,
) -> Reply {
    let mut set = start_all(routing, targets, job);
    let mut merge = FlushAllMerge::default();
    while let Some((_, reply)) = set.next().await {
        merge.add(reply);
    }
    merge.finish()
}
