//! A policy route's work in flight, polled in place by the session that holds it (no task,
//! no channel), and the few helpers that run futures side by side without a task each.
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use memroute_routing::NodeId;

use super::children::{RunChild, Walker};
use super::job::{BoxedReply, Job, MultiReply};
use crate::reply::{connection_gone, Reply};
use crate::snapshot::RouteSnapshot;

/// A policy route's work in flight: its future, polled in place by the session that holds
/// it in its pending queue (no task, no channel), then its output.
pub(crate) struct InPlace<T> {
    state: InPlaceState<T>,
    /// The route node the request reached and when it was read (its latency sample).
    pub route: NodeId,
    pub started: Instant,
}

// Inline on purpose: a multi-get's group lives in its pooled entry, so its size costs no
// single-key request anything.
#[allow(clippy::large_enum_variant)]
enum InPlaceState<T> {
    Running(Pin<Box<dyn Future<Output = T>>>),
    Done(Option<T>),
}

/// A single-key (or flush_all) request through a policy route.
pub(crate) type Routed = InPlace<Reply>;

/// The keys of a multi-get that reach one policy route, their outcome kept unmerged.
pub(crate) type RoutedKeys = InPlace<MultiReply>;

/// The future of a multi-key job's outcome.
pub(crate) type BoxedMultiReply = Pin<Box<dyn Future<Output = MultiReply>>>;

impl<T> std::fmt::Debug for InPlace<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            InPlaceState::Running(_) => "running",
            InPlaceState::Done(_) => "done",
        };
        f.debug_struct("InPlace")
            .field("state", &state)
            .field("route", &self.route)
            .finish()
    }
}

impl<T> InPlace<T> {
    /// Polled once now, so that every request it can send without waiting goes out before
    /// the client's next request is dispatched (a `set` through a replicated route reaches
    /// the servers before the `get` pipelined behind it; a multi-get's batches leave in
    /// the client's order).
    pub(crate) fn started(
        future: Pin<Box<dyn Future<Output = T>>>,
        node: NodeId,
        started: Instant,
    ) -> Self {
        let mut in_place = InPlace {
            state: InPlaceState::Running(future),
            route: node,
            started,
        };
        in_place.try_complete();
        in_place
    }

    /// Polls the work on; `Ready` once its output is in.
    pub(crate) fn poll(&mut self, context: &mut Context<'_>) -> Poll<()> {
        let InPlaceState::Running(future) = &mut self.state else {
            return Poll::Ready(());
        };
        match future.as_mut().poll(context) {
            Poll::Ready(output) => {
                self.state = InPlaceState::Done(Some(output));
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Polls without a waker (the session's "what is complete now" pass); the session's
    /// wait polls it again with its own waker before it sleeps.
    pub(crate) fn try_complete(&mut self) -> bool {
        let mut context = Context::from_waker(std::task::Waker::noop());
        self.poll(&mut context).is_ready()
    }

    /// Whether the output is in: polled without a waker (`None`) or with the session's.
    pub(crate) fn advance(&mut self, context: Option<&mut Context<'_>>) -> bool {
        match context {
            Some(context) => self.poll(context).is_ready(),
            None => self.try_complete(),
        }
    }

    /// The output (once complete), or `lost()` when there is none.
    fn take_or(&mut self, lost: impl FnOnce() -> T) -> T {
        match &mut self.state {
            InPlaceState::Done(output) => output.take(),
            InPlaceState::Running(_) => None,
        }
        .unwrap_or_else(lost)
    }
}

impl InPlace<Reply> {
    /// The reply (once complete).
    pub(crate) fn take(&mut self) -> Reply {
        self.take_or(|| Err(connection_gone()))
    }
}

impl InPlace<MultiReply> {
    /// The outcome (once complete).
    pub(crate) fn take(&mut self) -> MultiReply {
        self.take_or(|| MultiReply::Built(Err(connection_gone()), 0))
    }
}

/// Polls `future` once, right now, before it becomes a task. A task spawned with
/// `spawn_local` first runs on the worker's next turn, after the session has dispatched
/// the client's following requests: a `set` through a replicated route would then reach
/// the servers after the `get` the client pipelined behind it. Polling once here sends
/// every request the future can send without waiting, in the client's order; the task
/// then polls it again with its real waker.
pub(crate) fn eager<F: Future + 'static>(future: F) -> Eager<F> {
    let mut future = Box::pin(future);
    let mut context = Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        Poll::Ready(output) => Eager::Ready(Some(output)),
        Poll::Pending => Eager::Pending(future),
    }
}

pub(crate) enum Eager<F: Future> {
    Ready(Option<F::Output>),
    Pending(Pin<Box<F>>),
}

impl<F: Future> Future for Eager<F>
where
    F::Output: Unpin,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        match self.get_mut() {
            Eager::Ready(output) => match output.take() {
                Some(output) => Poll::Ready(output),
                // Polled again after completing: a bug in the caller, never in tokio's tasks.
                None => Poll::Pending,
            },
            Eager::Pending(future) => future.as_mut().poll(context),
        }
    }
}

/// Starts `job` on every child, polled in place by the request's own future (no task
/// per child); `next` yields (child index, reply) as they arrive.
pub(crate) fn start_all(
    routing: &Rc<RouteSnapshot>,
    children: &[NodeId],
    job: &Rc<Job>,
) -> Children {
    Children {
        running: children
            .iter()
            .map(|&child| Some(Walker::run(routing.clone(), child, job.clone())))
            .collect(),
    }
}

/// Children's requests in flight, polled by whoever awaits `next`. Dropping it cancels
/// their waits (the servers' replies are read and dropped); `detach` lets them finish
/// on tasks of their own instead.
pub(crate) struct Children {
    running: Vec<Option<BoxedReply>>,
}

impl Children {
    /// The next child to answer, or `None` once every child has.
    pub(crate) async fn next(&mut self) -> Option<(usize, Reply)> {
        std::future::poll_fn(|context| {
            let mut any = false;
            for (index, slot) in self.running.iter_mut().enumerate() {
                let Some(future) = slot else { continue };
                any = true;
                if let Poll::Ready(reply) = future.as_mut().poll(context) {
                    *slot = None;
                    return Poll::Ready(Some((index, reply)));
                }
            }
            match any {
                true => Poll::Pending,
                false => Poll::Ready(None),
            }
        })
        .await
    }

    /// The children still running go on in the background (their replies dropped).
    /// Polled once now: a child never polled yet sends its request at once.
    pub(crate) fn detach(self) {
        for future in self.running.into_iter().flatten() {
            tokio::task::spawn_local(eager(future));
        }
    }
}

/// Polls every future in place until all are done; their outputs in order.
pub(crate) async fn join_all<T>(mut futures: Vec<Pin<Box<dyn Future<Output = T>>>>) -> Vec<T> {
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut done = true;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => done = false,
                }
            }
        }
        match done {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
