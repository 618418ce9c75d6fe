//! The route executor: runs one single-key request (or a flush_all) through the policy
//! nodes of the route tree: shadow, replicated, failover, warm-up, random, null, error.
//!
//! ```text
//!   dispatch: route is a plain pool? --yes--> fast path (dispatch.rs, no task, no allocation)
//!                 | no
//!                 v
//!   spawn(node, job) -> local task: run(node) -> oneshot reply -> the session's pending FIFO
//!                         |  Prefix/Operation: select a child and go on
//!                         |  Shadow: copy to the shadow target (its own task), go on with primary
//!                         |  Replicated/Failover/WarmUp: run children, decide (routing::policy)
//!                         |  Pool: send to the server that owns the key, await its reply
//! ```
//!
//! The decisions themselves (which child, whether a write policy was met, what counts as
//! a miss) are sans-I/O functions in `memroute_routing`; this module only does the waiting.
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use memroute_config::{FailoverOn, Operation, ReadPolicy, WritePolicy};
use memroute_protocol::{Command, ReplyKind};
use memroute_routing::{classify_reply, write_decision, Node, NodeId, ReplyClass, WriteDecision};
use rand::Rng;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::reply::{connection_gone, immediate_ack, null_reply, FlushAllMerge, Reply};
use crate::snapshot::RouteSnapshot;

/// One request as the executor sees it: enough to send it anywhere and to judge its reply.
#[derive(Debug)]
pub(crate) struct Job {
    pub operation: Operation,
    pub command: Command,
    /// The key the route and the placement use (a base64 meta key decoded); empty for flush_all.
    pub key: Bytes,
    /// The bytes to send to a server (noreply/q already stripped).
    pub parts: (Bytes, Option<Bytes>),
    pub kind: ReplyKind,
    /// The client session's connection slot (keeps one client's requests on one connection).
    pub slot: usize,
    /// For meta commands: the flags a reply without data echoes (` O123 kfoo`).
    pub echo: Option<Bytes>,
}

/// Runs `job` from `node` on a task of its own; the reply arrives on the receiver.
pub(crate) fn spawn(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    job: Job,
) -> oneshot::Receiver<Reply> {
    let (sender, receiver) = oneshot::channel();
    let routing = routing.clone();
    tokio::task::spawn_local(eager(async move {
        let reply = run(routing, node, Rc::new(job)).await;
        let _ = sender.send(reply);
    }));
    receiver
}

/// Polls `future` once, right now, before it becomes a task. A task spawned with
/// `spawn_local` first runs on the worker's next turn, after the session has dispatched
/// the client's following requests: a `set` through a replicated route would then reach
/// the servers after the `get` the client pipelined behind it. Polling once here sends
/// every request the future can send without waiting, in the client's order; the task
/// then polls it again with its real waker.
fn eager<F: Future + 'static>(future: F) -> Eager<F> {
    let mut future = Box::pin(future);
    let waker = std::task::Waker::from(Arc::new(NoWake));
    let mut context = std::task::Context::from_waker(&waker);
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(output) => Eager::Ready(Some(output)),
        std::task::Poll::Pending => Eager::Pending(future),
    }
}

/// The waker of the first, eager poll: the task's own poll replaces it at once.
struct NoWake;

impl std::task::Wake for NoWake {
    fn wake(self: Arc<Self>) {}
}

enum Eager<F: Future> {
    Ready(Option<F::Output>),
    Pending(Pin<Box<F>>),
}

impl<F: Future> Future for Eager<F>
where
    F::Output: Unpin,
{
    type Output = F::Output;

    fn poll(
        self: Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        match self.get_mut() {
            Eager::Ready(output) => match output.take() {
                Some(output) => std::task::Poll::Ready(output),
                // Polled again after completing: a bug in the caller, never in tokio's tasks.
                None => std::task::Poll::Pending,
            },
            Eager::Pending(future) => future.as_mut().poll(context),
        }
    }
}

type BoxedReply = Pin<Box<dyn Future<Output = Reply>>>;

/// Runs `job` from `node` down to the servers and back. Boxed: routes nest.
fn run(routing: Rc<RouteSnapshot>, node: NodeId, job: Rc<Job>) -> BoxedReply {
    Box::pin(async move {
        let routes = routing.routes.clone();
        let mut node = node;
        loop {
            match routes.node(node) {
                // flush_all has no key: it goes to every target of a prefix route, so
                // that the pools behind the other prefixes are flushed too.
                Node::Prefix { prefixes, default } if job.operation == Operation::FlushAll => {
                    let mut targets: Vec<NodeId> = prefixes.iter().map(|(_, t)| *t).collect();
                    targets.push(*default);
                    targets.sort_unstable();
                    targets.dedup();
                    return flush_all_of(&routing, &targets, &job).await;
                }
                Node::Prefix { .. } | Node::Operation { .. } => {
                    node = routes.select(node, job.operation, &job.key);
                }
                Node::Pool(pool) => return send_to_pool(&routing, *pool, &job).await,
                Node::Shadow {
                    primary,
                    shadow,
                    range,
                    max_in_flight,
                    shadow_index,
                } => {
                    // flush_all has no key to select by: it is not shadowed.
                    if job.operation != Operation::FlushAll && range.contains_key(&job.key) {
                        shadow_copy(&routing, *shadow, *shadow_index, *max_in_flight, &job);
                    }
                    node = *primary;
                }
                Node::Replicated {
                    children,
                    writes,
                    reads,
                } => {
                    return match job.operation.is_write() {
                        true => replicated_write(&routing, node, children, *writes, &job).await,
                        false => replicated_read(&routing, node, children, *reads, &job).await,
                    };
                }
                Node::Failover { children, on } => {
                    return failover(&routing, node, children, *on, &job).await;
                }
                Node::WarmUp { cold, warm, ttl } => {
                    return warm_up(&routing, node, *cold, *warm, *ttl, &job).await;
                }
                Node::Random { children } => node = pick_random(children),
                Node::Null => return Ok(null_answer(&job)),
                Node::Error { message } => {
                    return Ok(Bytes::from(format!("SERVER_ERROR {message}\r\n")));
                }
            }
        }
    })
}

fn pick_random(children: &[NodeId]) -> NodeId {
    match children.len() {
        0 | 1 => children.first().copied().unwrap_or_default(),
        n => children[rand::thread_rng().gen_range(0..n)],
    }
}

/// A reply that met the request: anything but a transport failure or an error line.
fn answered(reply: &Reply) -> bool {
    matches!(reply, Ok(bytes) if classify_reply(bytes) != ReplyClass::Error)
}

fn class_of(reply: &Reply) -> ReplyClass {
    match reply {
        Ok(bytes) => classify_reply(bytes),
        Err(_) => ReplyClass::Error,
    }
}

async fn send_to_pool(routing: &Rc<RouteSnapshot>, pool: usize, job: &Job) -> Reply {
    if job.operation == Operation::FlushAll {
        return flush_pool(routing, pool, job).await;
    }
    let Some(server) = routing.server_for(pool, &job.key) else {
        return Err(routing.no_servers(pool));
    };
    let connections = &routing.pools[pool].servers[server];
    let reply = connections
        .pick(job.slot)
        .send(job.parts.clone(), job.kind)
        .await
        .unwrap_or_else(|_| Err(connection_gone()));
    if let Err(error) = &reply {
        connections.count_failure(error);
    }
    reply
}

/// flush_all to every server of a pool: `OK` only if every server said so.
async fn flush_pool(routing: &Rc<RouteSnapshot>, pool: usize, job: &Job) -> Reply {
    let receivers: Vec<_> = routing.pools[pool]
        .servers
        .iter()
        .map(|s| s.pick(job.slot).send(job.parts.clone(), ReplyKind::Line))
        .collect();
    if receivers.is_empty() {
        return Err(routing.no_servers(pool));
    }
    let mut merge = FlushAllMerge::default();
    for receiver in receivers {
        merge.add(receiver.await.unwrap_or_else(|_| Err(connection_gone())));
    }
    merge.finish()
}

/// flush_all through several routes at once: `OK` only if every one said so.
async fn flush_all_of(routing: &Rc<RouteSnapshot>, targets: &[NodeId], job: &Rc<Job>) -> Reply {
    let mut set = start_all(routing, targets, job);
    let mut merge = FlushAllMerge::default();
    while let Some(joined) = set.join_next().await {
        merge.add(match joined {
            Ok((_, reply)) => reply,
            Err(_) => Err(connection_gone()),
        });
    }
    merge.finish()
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
        let reply = run(routing.clone(), shadow, job).await;
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

/// Starts `job` on every child; the set yields (child index, reply).
fn start_all(
    routing: &Rc<RouteSnapshot>,
    children: &[NodeId],
    job: &Rc<Job>,
) -> JoinSet<(usize, Reply)> {
    let mut set = JoinSet::new();
    for (index, &child) in children.iter().enumerate() {
        let (routing, job) = (routing.clone(), job.clone());
        set.spawn_local(eager(
            async move { (index, run(routing, child, job).await) },
        ));
    }
    set
}

async fn replicated_write(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    policy: WritePolicy,
    job: &Rc<Job>,
) -> Reply {
    if policy == WritePolicy::AllAsync {
        if let Some(ack) = immediate_ack(job.command) {
            start_all(routing, children, job).detach_all();
            return Ok(Bytes::from_static(ack));
        }
    }
    let mut set = start_all(routing, children, job);
    let mut outcomes: Vec<Option<bool>> = vec![None; children.len()];
    let mut replies: Vec<Option<Reply>> = vec![None; children.len()];
    loop {
        match write_decision(policy, &outcomes) {
            WriteDecision::Wait => match set.join_next().await {
                Some(Ok((index, reply))) => {
                    outcomes[index] = Some(answered(&reply));
                    replies[index] = Some(reply);
                }
                // A child task that panicked or was cancelled: its index is unknown, so
                // count the first unanswered child as failed rather than wait forever.
                Some(Err(_)) | None => match outcomes.iter().position(Option::is_none) {
                    Some(index) => outcomes[index] = Some(false),
                    None => return Err(connection_gone()),
                },
            },
            WriteDecision::Answer { child } => {
                // The rest finish in the background (all-initial, all-majority).
                set.detach_all();
                return replies[child]
                    .take()
                    .unwrap_or_else(|| Err(connection_gone()));
            }
            WriteDecision::Fail { failed, total } => {
                set.detach_all();
                routing
                    .route_stats(node)
                    .write_failures
                    .fetch_add(1, Relaxed);
                return Ok(Bytes::from(format!(
                    "SERVER_ERROR replicated write failed on {failed} of {total} replicas ({})\r\n",
                    policy.as_str()
                )));
            }
        }
    }
}

async fn replicated_read(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    policy: ReadPolicy,
    job: &Rc<Job>,
) -> Reply {
    match policy {
        ReadPolicy::First => run(routing.clone(), children[0], job.clone()).await,
        ReadPolicy::Random => run(routing.clone(), pick_random(children), job.clone()).await,
        ReadPolicy::Failover => failover(routing, node, children, FailoverOn::Error, job).await,
        ReadPolicy::Fastest => {
            let mut set = start_all(routing, children, job);
            let mut last = Err(connection_gone());
            while let Some(joined) = set.join_next().await {
                if let Ok((_, reply)) = joined {
                    if answered(&reply) {
                        // The slower children's replies are not needed: dropping the set
                        // cancels their waits (the servers' replies are read and dropped).
                        return reply;
                    }
                    last = reply;
                }
            }
            last
        }
    }
}

/// Children in order until one answers. A request that changes data in a way that must not
/// be repeated (incr, decr, append, prepend, cas) moves on only when the failed child never
/// received it.
async fn failover(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    children: &[NodeId],
    on: FailoverOn,
    job: &Rc<Job>,
) -> Reply {
    let mut last = Err(connection_gone());
    // With `error-or-miss`, a miss from an earlier child beats an error from a later one:
    // the key is absent where it could be looked up.
    let mut first_miss: Option<Reply> = None;
    for (index, &child) in children.iter().enumerate() {
        let reply = run(routing.clone(), child, job.clone()).await;
        let class = class_of(&reply);
        let try_next = match class {
            ReplyClass::Error => true,
            ReplyClass::Miss => on == FailoverOn::ErrorOrMiss && !job.operation.is_write(),
            ReplyClass::Hit => false,
        };
        if !try_next || index + 1 == children.len() {
            return match (class, first_miss) {
                (ReplyClass::Error, Some(miss)) => miss,
                _ => reply,
            };
        }
        let safe_to_repeat =
            job.operation.is_idempotent() || matches!(&reply, Err(error) if error.never_sent());
        if !safe_to_repeat {
            return reply;
        }
        routing.route_stats(node).failovers.fetch_add(1, Relaxed);
        if class == ReplyClass::Miss && first_miss.is_none() {
            first_miss = Some(reply);
        } else {
            last = reply;
        }
    }
    last
}

/// Get from cold; on a miss get from warm and, for a classic get that hit, fill cold with
/// the value (asynchronously). Everything else goes to cold.
async fn warm_up(
    routing: &Rc<RouteSnapshot>,
    node: NodeId,
    cold: NodeId,
    warm: NodeId,
    ttl: u32,
    job: &Rc<Job>,
) -> Reply {
    let classic = matches!(
        job.command,
        Command::Get | Command::Gets | Command::Gat | Command::Gats
    );
    if !classic && job.command != Command::MetaGet {
        return run(routing.clone(), cold, job.clone()).await;
    }
    let from_cold = run(routing.clone(), cold, job.clone()).await;
    if class_of(&from_cold) != ReplyClass::Miss {
        return from_cold;
    }
    let from_warm = run(routing.clone(), warm, job.clone()).await;
    if class_of(&from_warm) != ReplyClass::Hit {
        // Warm had nothing (or failed): the cold miss is the honest answer.
        return from_cold;
    }
    if classic {
        if let Some(fill) = from_warm
            .as_ref()
            .ok()
            .and_then(|r| fill_job(r, ttl, job.slot))
        {
            routing.route_stats(node).fills.fetch_add(1, Relaxed);
            let (routing, fill) = (routing.clone(), Rc::new(fill));
            tokio::task::spawn_local(async move {
                let _ = run(routing, cold, fill).await;
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
        parts: (frame.freeze(), None),
        kind: ReplyKind::Line,
        slot,
        echo: None,
    })
}

/// A null route's reply, with the flags a meta client asked to have echoed.
fn null_answer(job: &Job) -> Bytes {
    let reply = null_reply(job.command);
    match &job.echo {
        Some(echo) if !echo.is_empty() => {
            let line = reply.strip_suffix(b"\r\n").unwrap_or(reply);
            let mut out = BytesMut::with_capacity(line.len() + echo.len() + 2);
            out.put_slice(line);
            out.put_slice(echo);
            out.put_slice(b"\r\n");
            out.freeze()
        }
        _ => Bytes::from_static(reply),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_built_from_the_first_value_block() {
        let reply = Bytes::from_static(b"VALUE k 7 5 99\r\nhello\r\nEND\r\n");
        let job = fill_job(&reply, 3600, 0).expect("fill");
        assert_eq!(&job.parts.0[..], b"add k 7 3600 5\r\nhello\r\n");
        assert_eq!(&job.key[..], b"k");
        assert!(fill_job(&Bytes::from_static(b"END\r\n"), 0, 0).is_none());
        // A reply cut short is never filled.
        assert!(fill_job(&Bytes::from_static(b"VALUE k 0 10\r\nabc"), 0, 0).is_none());
    }
}
