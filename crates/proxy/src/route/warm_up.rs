//! A warm-up route: reads from `cold`; a read cold missed is asked of `warm`, and warm's
//! hit filled into cold (an `add`, on a task of its own). Everything else goes to cold.
//! Everything such a route does is here:
//!
//! - single key: `start` sends a request as a plain leg to cold's pool when it is one
//!   (`cold_pool`), a read (`warms_up`) with its continuation, `AfterCold`, which takes
//!   cold's miss on to warm (`start_after_cold`); `run` is the
//!   whole walk when cold is not a pool;
//! - many keys: planned over cold's pool as a plain pool's keys (`route::multi_get_pool`),
//!   cold's misses then asked of warm (`ask_warm_multi`); `run_multi` is the whole walk.
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use memroute_config::Operation;
use memroute_protocol::{Command, ReplyKind, RequestBytes};
use memroute_routing::{Node, NodeId, ReplyClass};

use super::children::{RunChild, Walker};
use super::in_place::{eager, join_all, BoxedMultiReply, InPlace, Routed};
use super::job::{class_of, multi_reply, BoxedReply, Job, KeyReplies, KeyReply, MultiJob};
use super::leg::{Leg, Legs};
use super::pool;
use super::then::{AfterCold, Start, Then};
use crate::buffers::Homed;
use crate::reply::Reply;
use crate::snapshot::RouteSnapshot;

/// Get from cold; on a miss get from warm and, for a classic get that hit, fill cold with
/// the value (asynchronously). Everything else goes to cold.
pub(super) async fn run(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: &Rc<Job>,
) -> Reply {
    if !warms_up(job.command) {
        return Walker::run_child(routing, cold, job).await;
    }
    let from_cold = Walker::run_child(routing, cold, job).await;
    after_cold(routing, node, cold, warm, ttl, job, from_cold).await
}

/// Whether a warm-up route asks warm for `command` when cold missed it: reads (the
/// classic retrievals and meta get); everything else goes to cold only.
pub(crate) fn warms_up(command: Command) -> bool {
    command.is_read()
}

/// For a single-key request that reached policy route `node`: when it is a warm-up route
/// whose cold is a pool with servers, that pool. The request is sent to it as a plain
/// pool's request is; a read cold missed goes on to warm (`start_after_cold`).
pub(crate) fn cold_pool(routing: &RouteSnapshot, node: NodeId) -> Option<usize> {
    match routing.routes.node(node) {
        Node::WarmUp { cold, .. } => pool::with_servers(routing, *cold),
        _ => None,
    }
}

/// Starts a read that warm-up route `node`'s cold pool (`warm_up_cold`) answered with
/// `from_cold`, a miss: asked of warm (and filled into cold), as `run` goes on after
/// cold.
pub(crate) fn start_after_cold(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: Job,
    from_cold: Reply,
    started: Instant,
) -> Routed {
    let routing = routing.clone();
    let future: BoxedReply = Box::pin(async move {
        let Node::WarmUp { cold, warm, ttl } = *routing.routes.node(node) else {
            return from_cold;
        };
        let job = Rc::new(job);
        after_cold(&routing, node, cold, warm, ttl, &job, from_cold).await
    });
    InPlace::started(future, node, started)
}

/// A request through warm-up route `node` whose cold is a pool with servers: sent to cold
/// as a plain pool's request is; a read (`warms_up`) keeps the request beside the leg
/// (`AfterCold`) for a miss to go on to warm with. `Err(job)` when cold is not such a pool.
// `Err` hands the request back, unboxed (no allocation), to the general walk.
#[allow(clippy::result_large_err)]
pub(super) fn start(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: Job,
    started: Instant,
) -> Result<Start, Job> {
    let Some(pool) = cold_pool(routing, node) else {
        return Err(job);
    };
    let request = (&job.parts, job.kind, job.slot);
    let Some(leg) = pool::leg_to(routing, pool, &job.key, request, started) else {
        return Err(job);
    };
    let leg = leg.on_route(node);
    if !warms_up(job.command) {
        return Ok(Start::leg(leg));
    }
    Ok(Start::Sent {
        legs: Legs::One(leg),
        then: Then::WarmUp(Homed::new(AfterCold {
            job: Some(job),
            node,
        })),
    })
}

impl AfterCold {
    /// Once cold answered on `cold`: a miss goes on to warm, as `run` goes on after cold;
    /// a hit or a failure is the client's answer (`None`).
    pub(super) fn go_on(&mut self, routing: &Rc<RouteSnapshot>, cold: &mut Leg) -> Option<Routed> {
        if cold.class() != ReplyClass::Miss {
            return None;
        }
        let job = self.job.take()?;
        let from_cold = cold.take(routing);
        Some(start_after_cold(
            routing,
            self.node,
            job,
            from_cold,
            cold.started,
        ))
    }
}

/// A warm-up read once cold answered `from_cold`: a hit (or a failure) is the answer; a
/// miss is asked of warm, and warm's hit filled into cold.
async fn after_cold(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: &Rc<Job>,
    from_cold: Reply,
) -> Reply {
    if class_of(&from_cold) != ReplyClass::Miss {
        return from_cold;
    }
    let from_warm = Walker::run_child(routing, warm, job).await;
    if class_of(&from_warm) != ReplyClass::Hit {
        // Warm had nothing (or failed): the cold miss is the honest answer.
        return from_cold;
    }
    // A meta get's hit is not filled (its reply is not a `VALUE` block to `add` from).
    let classic = job.command != Command::MetaGet;
    if classic {
        if let Some(fill) = from_warm
            .as_ref()
            .ok()
            .and_then(|r| fill_job(r, ttl, job.slot))
        {
            routing.route_stats(node).fills.fetch_add(1, Relaxed);
            let (routing, fill) = (routing.clone(), Rc::new(fill));
            tokio::task::spawn_local(async move {
                let _ = Walker::run(routing, cold, fill).await;
            });
        }
    }
    from_warm
}

/// `add <key> <flags> <ttl> <bytes>` built from the first `VALUE` block of a retrieval reply.
/// `add`, not `set`: a client's write that reached cold while warm was being asked must win
/// over the older value from warm.
fn fill_job(reply: &Bytes, ttl: u32, slot: usize) -> Option<Job> {
    let line_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&reply[..line_end]).ok()?;
    let mut tokens = line.split(' ');
    if tokens.next()? != "VALUE" {
        return None;
    }
    let key = tokens.next()?;
    let flags: u32 = tokens.next()?.parse().ok()?;
    let length: usize = tokens.next()?.parse().ok()?;
    let data_start = line_end + 2;
    let data = reply.get(data_start..data_start.checked_add(length)?)?;
    let mut frame = BytesMut::with_capacity(data.len() + key.len() + 48);
    frame.put_slice(format!("add {key} {flags} {ttl} {length}\r\n").as_bytes());
    frame.put_slice(data);
    frame.put_slice(b"\r\n");
    Some(Job {
        operation: Operation::Add,
        command: Command::Add,
        key: Bytes::copy_from_slice(key.as_bytes()),
        parts: RequestBytes::whole(frame.freeze()),
        kind: ReplyKind::Line,
        slot,
        echo: None,
    })
}

/// Every key from cold; cold's misses from warm; warm's hits filled into cold (`add`,
/// asynchronously, on one task for the whole batch).
pub(super) async fn run_multi(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: &Rc<MultiJob>,
    keys: Vec<u32>,
) -> KeyReplies {
    let mut replies = Walker::run_multi_child(routing, cold, job, keys.clone())
        .await
        .into_keys(job, &keys);
    let missed: Vec<usize> = (0..replies.len())
        .filter(|&p| replies[p].class() == ReplyClass::Miss)
        .collect();
    if missed.is_empty() {
        return KeyReplies::Keys(replies);
    }
    let asked: Vec<u32> = missed.iter().map(|&p| keys[p]).collect();
    let from_warm = warm_misses(routing, node, cold, warm, ttl, job, asked).await;
    for (&position, reply) in missed.iter().zip(from_warm) {
        // Warm had nothing (or failed): cold's miss is the honest answer.
        if let KeyReply::Hit(_) = reply {
            replies[position] = reply;
        }
    }
    KeyReplies::Keys(replies)
}

/// Cold's misses `asked` (indexes into `job.keys`) asked of warm: per key, warm's hit
/// (filled into cold with an `add`, asynchronously, on one task for the whole batch) or a
/// miss (warm had nothing, or failed: cold's miss is the honest answer).
async fn warm_misses(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: &Rc<MultiJob>,
    asked: Vec<u32>,
) -> Vec<KeyReply> {
    let from_warm = Walker::run_multi_child(routing, warm, job, asked.clone())
        .await
        .into_keys(job, &asked);
    let mut fills: Vec<BoxedReply> = Vec::new();
    let replies = from_warm
        .into_iter()
        .map(|reply| match reply {
            KeyReply::Hit(block) => {
                if let Some(fill) = fill_job(&block, ttl, job.slot) {
                    fills.push(Walker::run(routing.clone(), cold, Rc::new(fill)));
                }
                KeyReply::Hit(block)
            }
            _ => KeyReply::Miss,
        })
        .collect();
    if !fills.is_empty() {
        routing
            .route_stats(node)
            .fills
            .fetch_add(fills.len() as u64, Relaxed);
        tokio::task::spawn_local(eager(async move {
            join_all(fills).await;
        }));
    }
    replies
}

/// Cold's misses (`job`'s keys, in the client's order) of a multi-get planned over cold's
/// pool: asked of warm, as `run_multi` asks it.
pub(super) fn ask_warm_multi(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: MultiJob,
) -> BoxedMultiReply {
    let routing = routing.clone();
    Box::pin(async move {
        let keys = (0..job.keys.len() as u32).collect();
        let job = Rc::new(job);
        let replies = warm_misses(&routing, node, cold, warm, ttl, &job, keys).await;
        multi_reply(KeyReplies::Keys(replies))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_built_from_the_first_value_block() {
        let reply = Bytes::from_static(b"VALUE k 7 5 99\r\nhello\r\nEND\r\n");
        let job = fill_job(&reply, 3600, 0).expect("fill");
        assert_eq!(&job.parts.head[..], b"add k 7 3600 5\r\nhello\r\n");
        assert_eq!(&job.key[..], b"k");
        assert!(fill_job(&Bytes::from_static(b"END\r\n"), 0, 0).is_none());
        // A reply cut short is never filled.
        assert!(fill_job(&Bytes::from_static(b"VALUE k 0 10\r\nabc"), 0, 0).is_none());
    }
}
