//! A shadow route: the client is answered by `primary`; the keys in the route's range are
//! also copied to `shadow` on a task of its own (replies dropped, at most `max_in_flight`
//! copies per worker). A single-key request through shadow (and random) routes down to a
//! pool starts as a plain leg (`route::single_pool`) with `copy_single` beside it; a
//! multi-get planned over that pool copies its keys in range with `copy_planned_keys`;
//! `copy` and `copy_keys` are the executor's steps.
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;

use memroute_config::Operation;
use memroute_routing::{Node, NodeId};

use super::children::{RunChild, Walker};
use super::in_place::eager;
use super::job::{answered, Job, KeyReplies, KeyReply, MultiJob};
use crate::snapshot::RouteSnapshot;

/// The executor's step through shadow route `node`: `job` copied when its key is in range
/// (flush_all has no key to select by: it is not shadowed).
pub(super) fn copy(routing: &Rc<RouteSnapshot>, node: NodeId, job: &Rc<Job>) {
    if let Node::Shadow {
        shadow,
        range,
        max_in_flight,
        shadow_index,
        ..
    } = routing.routes.node(node)
    {
        if job.operation != Operation::FlushAll && range.contains_key(&job.key) {
            shadow_copy(routing, *shadow, *shadow_index, *max_in_flight, job);
        }
    }
}

/// The executor's step through shadow route `node` for many keys: those in range copied
/// as one batch.
pub(super) fn copy_keys(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: &Rc<MultiJob>,
    keys: &[u32],
) {
    if let Node::Shadow {
        shadow,
        range,
        max_in_flight,
        shadow_index,
        ..
    } = routing.routes.node(node)
    {
        let copied: Vec<u32> = keys
            .iter()
            .copied()
            .filter(|&key| range.contains_key(&job.keys[key as usize]))
            .collect();
        if !copied.is_empty() {
            shadow_copy_multi(routing, *shadow, *shadow_index, *max_in_flight, job, copied);
        }
    }
}

/// Copies `job` to shadow route `node`'s shadow target when its key is in the route's
/// range, as `run` does for a shadow route (on a task of its own; replies dropped).
pub(crate) fn copy_single(routing: &Rc<RouteSnapshot>, node: NodeId, job: Job) {
    if let Node::Shadow {
        shadow,
        range,
        max_in_flight,
        shadow_index,
        ..
    } = routing.routes.node(node)
    {
        if range.contains_key(&job.key) {
            shadow_copy(
                routing,
                *shadow,
                *shadow_index,
                *max_in_flight,
                &Rc::new(job),
            );
        }
    }
}

/// Whether `key` is in shadow route `node`'s range (is copied to its shadow target).
pub(crate) fn shadows_key(routing: &RouteSnapshot, node: NodeId, key: &[u8]) -> bool {
    match routing.routes.node(node) {
        Node::Shadow { range, .. } => range.contains_key(key),
        _ => false,
    }
}

/// Copies `job`'s keys (the keys of a multi-get in shadow route `node`'s range, planned
/// by the session) to the shadow target, as `run_multi` does for a shadow route's keys.
pub(crate) fn copy_planned_keys(routing: &Rc<RouteSnapshot>, node: NodeId, job: MultiJob) {
    if let Node::Shadow {
        shadow,
        max_in_flight,
        shadow_index,
        ..
    } = *routing.routes.node(node)
    {
        let keys = (0..job.keys.len() as u32).collect();
        shadow_copy_multi(
            routing,
            shadow,
            shadow_index,
            max_in_flight,
            &Rc::new(job),
            keys,
        );
    }
}

/// Copies a request to a shadow target. Never awaited by the client's request: the copy
/// runs on its own task, its reply is dropped, and past `max_in_flight` copies (per
/// worker) new ones are dropped and counted rather than queued.
fn shadow_copy(
    routing: &Rc<RouteSnapshot>,
    shadow: NodeId,
    index: usize,
    max_in_flight: usize,
    job: &Rc<Job>,
) {
    let Some(state) = routing.shadows.get(index) else {
        return;
    };
    if state.in_flight.get() >= max_in_flight {
        state.stats.dropped.fetch_add(1, Relaxed);
        return;
    }
    state.in_flight.set(state.in_flight.get() + 1);
    state.stats.sent.fetch_add(1, Relaxed);
    let (routing, job) = (routing.clone(), job.clone());
    tokio::task::spawn_local(eager(async move {
        let reply = Walker::run(routing.clone(), shadow, job).await;
        if let Some(state) = routing.shadows.get(index) {
            let counter = match answered(&reply) {
                true => &state.stats.completed,
                false => &state.stats.errors,
            };
            counter.fetch_add(1, Relaxed);
            state.in_flight.set(state.in_flight.get().saturating_sub(1));
        }
    }));
}

/// Copies the keys of a multi-get in the shadow range to the shadow target, on a task of
/// its own (replies dropped). One copy (one `max_in_flight` slot) per batch of keys;
/// `sent`, `completed` and `errors` count keys, as they do for single-key copies.
fn shadow_copy_multi(
    routing: &Rc<RouteSnapshot>,
    shadow: NodeId,
    index: usize,
    max_in_flight: usize,
    job: &Rc<MultiJob>,
    keys: Vec<u32>,
) {
    let Some(state) = routing.shadows.get(index) else {
        return;
    };
    let count = keys.len() as u64;
    if state.in_flight.get() >= max_in_flight {
        state.stats.dropped.fetch_add(count, Relaxed);
        return;
    }
    state.in_flight.set(state.in_flight.get() + 1);
    state.stats.sent.fetch_add(count, Relaxed);
    let (routing, job) = (routing.clone(), job.clone());
    tokio::task::spawn_local(eager(async move {
        let replies = Walker::run_multi_child(&routing, shadow, &job, keys).await;
        if let Some(state) = routing.shadows.get(index) {
            let errors = match &replies {
                KeyReplies::Batches { .. } => 0,
                KeyReplies::Keys(replies) => replies
                    .iter()
                    .filter(|r| matches!(r, KeyReply::Failed(_)))
                    .count() as u64,
            };
            state.stats.errors.fetch_add(errors, Relaxed);
            state.stats.completed.fetch_add(count - errors, Relaxed);
            state.in_flight.set(state.in_flight.get().saturating_sub(1));
        }
    }));
}
