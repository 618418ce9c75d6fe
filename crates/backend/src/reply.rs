//! Reply slots: where the reply to one backend request goes, without a heap allocation
//! per request.
//!
//! A slot is a small cell shared by a [`ReplySender`] (the connection task, or the route
//! executor) and a [`ReplyReceiver`] (a client session's pending entry). Everything that
//! touches a slot runs on one worker thread (connections are `spawn_local` tasks), so the
//! cell is an `Rc` of a `RefCell` (its generation beside it in a plain `Cell`), not a
//! synchronised channel. When both sides are gone the
//! cell goes back to a per-thread free list and the next request reuses it: in steady
//! state a request costs no allocation for its reply (a tokio `oneshot` allocates its
//! shared cell every time).
//!
//! ```text
//!  reply_slot() --pop free list (or allocate)--> (ReplySender, ReplyReceiver)
//!  sender.send(reply): store it, wake the receiver's task (if it waits)
//!  drop(sender) unsent: the receiver sees Closed
//!  last side dropped: cell cleared, pushed back on the free list (bounded)
//! ```
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use memroute_protocol::RequestBytes;

use crate::BackendError;

/// The reply to one request, or why there is none.
pub type Reply = Result<Bytes, BackendError>;

#[derive(Default)]
struct State {
    reply: Option<Reply>,
    /// For a retrieval reply framed by a connection: how many `VALUE` blocks it holds
    /// (`send_retrieval`). Kept after the reply is taken, for as long as the receiver lives.
    value_blocks: Option<u32>,
    /// The receiver's task, when it waits.
    waker: Option<Waker>,
    /// The sender may still send: set when the slot is handed out, cleared once it sent
    /// or went. Only a slot still waiting can be joined (`ReplyFollow::join`).
    waiting: bool,
    /// Followers (collapsed requests): each gets a copy of this slot's reply, or is closed
    /// with it. A chain through their own cells' `next`, so joining allocates nothing.
    next: Option<ReplySender>,
    /// A follower whose request differs from its leader's only in how the reply is
    /// rendered (a meta get's opaque, key echo): its copy of the reply is rendered anew.
    render: Option<Render>,
}

impl State {
    /// A rendering follower's `render`, taken. Looked at first: most slots have none, and
    /// `take` on an empty one would copy all of its bytes out, for every reply sent.
    #[inline(always)]
    fn take_render(&mut self) -> Option<Render> {
        match self.render.is_some() {
            true => self.render.take(),
            false => None,
        }
    }
}

/// How a follower's copy of its leader's reply is rendered for its own request: the
/// function (the proxy's, which knows what differs) and the follower's request bytes
/// (views of its client's buffer, no copy).
pub struct Render {
    pub render: fn(&Bytes, &RequestBytes) -> Bytes,
    pub request: RequestBytes,
}

impl std::fmt::Debug for Render {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Render")
            .field("request", &self.request)
            .finish()
    }
}

/// A slot's state, and its generation beside it: bumped each time the cell goes back to
/// the free list, so a `ReplyFollow` taken for one request never joins the next request
/// that reuses the cell. Outside the `RefCell`, so reading it (every collapsed pool's get
/// takes a `ReplyFollow`) checks no borrow.
#[derive(Default)]
struct Slot {
    generation: std::cell::Cell<u32>,
    state: RefCell<State>,
}

impl std::ops::Deref for Slot {
    type Target = RefCell<State>;

    fn deref(&self) -> &RefCell<State> {
        &self.state
    }
}

type Cell = Rc<Slot>;

/// Slots kept per thread for reuse. Enough for every request in flight on a busy worker
/// (a few hundred pipelined requests); beyond it a burst's extra cells are freed rather
/// than held (about 100 bytes each).
const FREE_MAX: usize = 1024;

thread_local! {
    static FREE: RefCell<Vec<Cell>> = const { RefCell::new(Vec::new()) };
}

/// A new slot, reused from this thread's free list when one is there.
pub fn reply_slot() -> (ReplySender, ReplyReceiver) {
    let cell = FREE
        .try_with(|free| free.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default();
    cell.borrow_mut().waiting = true;
    (ReplySender { cell: cell.clone() }, ReplyReceiver { cell })
}

/// Drops a chain of followers one by one (each sees `Closed`), without recursing down it.
fn close_followers(mut next: Option<ReplySender>) {
    while let Some(sender) = next {
        next = sender.cell.borrow_mut().next.take();
        drop(sender);
    }
}

/// Called as either side is dropped: when it is the last one, the cell is cleared and
/// kept for the next request. One thread, so the strong count is exact: 2 while both
/// sides live, 1 once one of them is gone.
fn release(cell: &Cell) {
    if Rc::strong_count(cell) != 1 {
        return;
    }
    // Taken out before being dropped, so no borrow is held while a reply's bytes go.
    cell.generation.set(cell.generation.get().wrapping_add(1));
    let (reply, waker, next, render) = {
        let mut state = cell.borrow_mut();
        state.value_blocks = None;
        state.waiting = false;
        (
            state.reply.take(),
            state.waker.take(),
            state.next.take(),
            state.render.take(),
        )
    };
    drop((reply, waker, render));
    close_followers(next);
    // try_with: a slot dropped while the thread's locals are torn down is simply freed.
    let _ = FREE.try_with(|free| {
        let mut free = free.borrow_mut();
        if free.len() < FREE_MAX {
            free.push(cell.clone());
        }
    });
}

/// The side that completes a slot.
pub struct ReplySender {
    cell: Cell,
}

impl ReplySender {
    /// Stores the reply and wakes the receiver. A reply to a receiver already dropped is
    /// dropped with the slot.
    pub fn send(self, reply: Reply) {
        self.send_counted(reply, None);
    }

    /// `send` for a retrieval reply whose `VALUE` blocks the connection's framing counted
    /// (`parse_reply_counting`): the receiver's `value_blocks`. A multi-get leg whose count
    /// is the number of keys it asked for had no miss, without a walk of its reply.
    pub fn send_retrieval(self, reply: Bytes, value_blocks: u32) {
        self.send_counted(Ok(reply), Some(value_blocks));
    }

    fn send_counted(self, reply: Reply, value_blocks: Option<u32>) {
        // The reply, then a copy (reference counts, no bytes copied) to each follower in
        // turn: a loop, not a recursion, however many requests collapsed onto this one. A
        // follower that renders the reply its own way renders it from the leader's.
        let (mut sender, mut original) = (self, reply);
        loop {
            // One borrow per slot: rendering reads bytes only, and the waker is woken
            // after it ends.
            let mut state = sender.cell.borrow_mut();
            let next = state.next.take();
            let rendered = match (state.take_render(), &original) {
                (Some(render), Ok(bytes)) => Some(Ok((render.render)(bytes, &render.request))),
                _ => None,
            };
            let (own, rest) = match (rendered, next) {
                (Some(own), next) => (own, next.map(|next| (next, original))),
                (None, Some(next)) => (original.clone(), Some((next, original))),
                (None, None) => (original, None),
            };
            state.reply = Some(own);
            state.value_blocks = value_blocks;
            state.waiting = false;
            let waker = state.waker.take();
            drop(state);
            if let Some(waker) = waker {
                waker.wake();
            }
            // The receiver still holds the cell (or it goes back to the free list).
            drop(sender);
            match rest {
                Some((follower, reply)) => (sender, original) = (follower, reply),
                None => return,
            }
        }
    }
}

impl Drop for ReplySender {
    fn drop(&mut self) {
        if Rc::strong_count(&self.cell) == 1 {
            return release(&self.cell);
        }
        // Gone without a reply (or after one): a waiting receiver must look again, and
        // finds either the reply or Closed; so do its followers, at once.
        let (waker, next) = {
            let mut state = self.cell.borrow_mut();
            state.waiting = false;
            (state.waker.take(), state.next.take())
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        close_followers(next);
    }
}

impl std::fmt::Debug for ReplySender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplySender")
    }
}

/// Why [`ReplyReceiver::try_recv`] has no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryRecvError {
    /// Not yet: the sender still holds the slot.
    Empty,
    /// Never: the sender went without replying (or the reply was already taken).
    Closed,
}

/// Awaiting a [`ReplyReceiver`] whose sender went without replying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvError;

/// The side that waits for a slot's reply: poll it with `try_recv`, or `.await` it.
pub struct ReplyReceiver {
    cell: Cell,
}

impl ReplyReceiver {
    /// A receiver whose reply is already there (an answer known without sending).
    pub fn ready(reply: Reply) -> ReplyReceiver {
        let (sender, receiver) = reply_slot();
        sender.send(reply);
        receiver
    }

    /// How many `VALUE` blocks the reply holds, when it is a retrieval reply framed by a
    /// connection (`ReplySender::send_retrieval`); `None` for any other reply (an error,
    /// one made up without a server) and before the reply arrived. Still there after the
    /// reply was taken.
    pub fn value_blocks(&self) -> Option<u32> {
        self.cell.borrow().value_blocks
    }

    /// A way for another request to wait for this slot's reply instead of sending its
    /// own (collapsing identical gets): see [`ReplyFollow::join`]. Inline: every get a
    /// pool collapses takes one as its key's new leader, and a call would be most of its cost.
    #[inline]
    pub fn follow(&self) -> ReplyFollow {
        ReplyFollow {
            cell: Rc::downgrade(&self.cell),
            generation: self.cell.generation.get(),
        }
    }

    /// Takes the reply if it has arrived, without waiting.
    pub fn try_recv(&mut self) -> Result<Reply, TryRecvError> {
        if let Some(reply) = self.cell.borrow_mut().reply.take() {
            return Ok(reply);
        }
        match Rc::strong_count(&self.cell) {
            1 => Err(TryRecvError::Closed),
            _ => Err(TryRecvError::Empty),
        }
    }
}

impl Future for ReplyReceiver {
    type Output = Result<Reply, RecvError>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.try_recv() {
            Ok(reply) => Poll::Ready(Ok(reply)),
            Err(TryRecvError::Closed) => Poll::Ready(Err(RecvError)),
            Err(TryRecvError::Empty) => {
                let mut state = this.cell.borrow_mut();
                // The same task polling again keeps its waker: no clone.
                if !matches!(&state.waker, Some(waker) if waker.will_wake(context.waker())) {
                    state.waker = Some(context.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for ReplyReceiver {
    fn drop(&mut self) {
        release(&self.cell);
    }
}

impl std::fmt::Debug for ReplyReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyReceiver")
    }
}

/// A handle on a reply slot still waiting for its reply, that lets other requests wait
/// for the same reply (`ReplyReceiver::follow`). It keeps nothing alive: a weak reference
/// and the slot's generation, so a slot reused by a later request is never joined.
#[derive(Default)]
pub struct ReplyFollow {
    cell: Weak<Slot>,
    generation: u32,
}

impl ReplyFollow {
    /// A receiver that gets a copy of the slot's reply (the same bytes, or the same
    /// error; `Closed` if the sender goes without replying), or `None` when the reply was
    /// already sent, its sender went, or the slot now serves another request. No
    /// allocation: the follower's slot comes from the free list, and it is chained
    /// through its own cell.
    pub fn join(&self) -> Option<ReplyReceiver> {
        self.join_rendered(None)
    }

    /// Whether `join` would find the slot still waiting for this request's reply (a
    /// check without a receiver: a multi-get asks it of the few leaders it could join,
    /// once per multi-get, not once per key).
    pub fn waiting(&self) -> bool {
        self.cell
            .upgrade()
            .is_some_and(|cell| cell.generation.get() == self.generation && cell.borrow().waiting)
    }

    /// `join`, the copy of the reply rendered by `render` first (an error is passed on as
    /// it is): for a request that asks the same of the server but shows the reply
    /// otherwise. The reply the leader and its other followers see is left as it is.
    pub fn join_rendered(&self, render: Option<Render>) -> Option<ReplyReceiver> {
        let cell = self.cell.upgrade()?;
        if cell.generation.get() != self.generation || !cell.borrow().waiting {
            return None;
        }
        let (sender, receiver) = reply_slot();
        let mut state = cell.borrow_mut();
        {
            let mut follower = sender.cell.borrow_mut();
            follower.next = state.next.take();
            follower.render = render;
        }
        state.next = Some(sender);
        Some(receiver)
    }
}

impl std::fmt::Debug for ReplyFollow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyFollow")
    }
}

/// Slots on this thread's free list (for tests and measurements).
pub fn free_reply_slots() -> usize {
    FREE.try_with(|free| free.borrow().len()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// Counts its wake-ups.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn poll(
        receiver: &mut ReplyReceiver,
        waker: &Arc<CountingWaker>,
    ) -> Poll<Result<Reply, RecvError>> {
        let waker = Waker::from(waker.clone());
        Pin::new(receiver).poll(&mut Context::from_waker(&waker))
    }

    fn ok(text: &'static [u8]) -> Reply {
        Ok(Bytes::from_static(text))
    }

    #[test]
    fn a_reply_sent_before_the_receiver_looks_is_there_at_once() {
        let (sender, mut receiver) = reply_slot();
        sender.send(ok(b"END\r\n"));
        assert_eq!(
            &receiver.try_recv().expect("reply").expect("ok")[..],
            b"END\r\n"
        );
        // Taken once; the sender is gone, so there is nothing more to come.
        assert_eq!(receiver.try_recv().err(), Some(TryRecvError::Closed));
    }

    #[test]
    fn a_reply_sent_after_the_receiver_waits_wakes_it_once() {
        let waker = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let (sender, mut receiver) = reply_slot();
        assert_eq!(receiver.try_recv().err(), Some(TryRecvError::Empty));
        assert!(poll(&mut receiver, &waker).is_pending());
        assert!(poll(&mut receiver, &waker).is_pending());
        assert_eq!(waker.0.load(Ordering::Relaxed), 0);
        sender.send(ok(b"STORED\r\n"));
        assert_eq!(waker.0.load(Ordering::Relaxed), 1);
        match poll(&mut receiver, &waker) {
            Poll::Ready(Ok(Ok(bytes))) => assert_eq!(&bytes[..], b"STORED\r\n"),
            other => panic!("expected the reply, got {other:?}"),
        }
    }

    #[test]
    fn a_sender_dropped_unsent_closes_a_waiting_receiver() {
        let waker = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let (sender, mut receiver) = reply_slot();
        assert!(poll(&mut receiver, &waker).is_pending());
        drop(sender);
        assert_eq!(waker.0.load(Ordering::Relaxed), 1);
        assert!(matches!(
            poll(&mut receiver, &waker),
            Poll::Ready(Err(RecvError))
        ));
        assert_eq!(receiver.try_recv().err(), Some(TryRecvError::Closed));
    }

    #[test]
    fn a_receiver_dropped_first_leaves_the_sender_harmless() {
        let before = free_reply_slots();
        let (sender, receiver) = reply_slot();
        drop(receiver);
        assert_eq!(free_reply_slots(), before, "the sender still holds it");
        // The reply goes nowhere, and the slot goes back to the free list with it.
        sender.send(Err(BackendError::Closed {
            server: Arc::from("a:1"),
        }));
        assert_eq!(free_reply_slots(), before + 1);
        let (_sender, mut receiver) = reply_slot();
        assert_eq!(
            receiver.try_recv().err(),
            Some(TryRecvError::Empty),
            "the undelivered reply must not reach the slot's next receiver"
        );
    }

    #[test]
    fn slots_are_recycled_once_both_sides_are_gone() {
        // Tests run on threads of their own: this thread's list starts empty.
        let before = free_reply_slots();
        let (sender, receiver) = reply_slot();
        drop(sender);
        assert_eq!(free_reply_slots(), before, "receiver still holds it");
        drop(receiver);
        assert_eq!(free_reply_slots(), before + 1);
        // The next slot is that one, cleared: no stale reply, no stale waker.
        let (sender, mut receiver) = reply_slot();
        assert_eq!(free_reply_slots(), before);
        assert_eq!(receiver.try_recv().err(), Some(TryRecvError::Empty));
        sender.send(ok(b"END\r\n"));
        drop(receiver);
        assert_eq!(free_reply_slots(), before + 1);
        let (_sender, mut receiver) = reply_slot();
        assert_eq!(
            receiver.try_recv().err(),
            Some(TryRecvError::Empty),
            "a reused slot must be empty"
        );
    }

    #[test]
    fn a_retrieval_reply_keeps_its_block_count_until_the_slot_is_reused() {
        let (sender, mut receiver) = reply_slot();
        assert_eq!(receiver.value_blocks(), None);
        sender.send_retrieval(Bytes::from_static(b"VALUE a 0 1\r\n1\r\nEND\r\n"), 1);
        assert!(receiver.try_recv().is_ok());
        assert_eq!(
            receiver.value_blocks(),
            Some(1),
            "kept after the reply is taken"
        );
        drop(receiver);
        // The same cell, reused: no count from the reply before, already before anything
        // is sent on it (`send` clears the count too, so looking after it proves nothing).
        let (sender, receiver) = reply_slot();
        assert_eq!(receiver.value_blocks(), None, "release clears the count");
        sender.send(ok(b"END\r\n"));
        assert_eq!(receiver.value_blocks(), None);
    }

    #[test]
    fn followers_get_the_reply_and_its_block_count() {
        let (sender, mut leader) = reply_slot();
        let follow = leader.follow();
        let mut first = follow.join().expect("waiting");
        let mut second = follow.join().expect("waiting");
        sender.send_retrieval(Bytes::from_static(b"VALUE k 0 1\r\n1\r\nEND\r\n"), 1);
        for receiver in [&mut leader, &mut first, &mut second] {
            let reply = receiver.try_recv().expect("reply").expect("ok");
            assert_eq!(&reply[..], b"VALUE k 0 1\r\n1\r\nEND\r\n");
            assert_eq!(receiver.value_blocks(), Some(1));
        }
        assert!(follow.join().is_none(), "answered: nothing left to join");
    }

    /// A render for the tests: the follower's request bytes, then the leader's reply.
    fn prefixed(reply: &Bytes, request: &RequestBytes) -> Bytes {
        let mut out: Vec<u8> = request.pieces().flatten().copied().collect();
        out.extend_from_slice(reply);
        Bytes::from(out)
    }

    #[test]
    fn a_rendering_follower_renders_the_leaders_reply_and_no_one_elses() {
        let (sender, mut leader) = reply_slot();
        let follow = leader.follow();
        let render = |tag: &'static [u8]| Render {
            render: prefixed,
            request: RequestBytes::whole(Bytes::from_static(tag)),
        };
        let mut plain_first = follow.join().expect("waiting");
        let mut rendered = follow.join_rendered(Some(render(b"a:"))).expect("waiting");
        let mut plain = follow.join().expect("waiting");
        let mut other = follow.join_rendered(Some(render(b"b:"))).expect("waiting");
        sender.send(ok(b"HD\r\n"));
        let got = |receiver: &mut ReplyReceiver| receiver.try_recv().expect("reply").expect("ok");
        assert_eq!(&got(&mut leader)[..], b"HD\r\n");
        assert_eq!(&got(&mut plain_first)[..], b"HD\r\n");
        assert_eq!(&got(&mut rendered)[..], b"a:HD\r\n");
        assert_eq!(&got(&mut plain)[..], b"HD\r\n");
        assert_eq!(&got(&mut other)[..], b"b:HD\r\n");
    }

    #[test]
    fn followers_get_the_same_error() {
        let (sender, mut leader) = reply_slot();
        let mut follower = leader.follow().join().expect("waiting");
        sender.send(Err(BackendError::Timeout {
            server: Arc::from("a:1"),
        }));
        for receiver in [&mut leader, &mut follower] {
            let reply = receiver.try_recv().expect("reply");
            assert!(matches!(reply, Err(BackendError::Timeout { .. })));
        }
    }

    #[test]
    fn a_sender_gone_unsent_closes_its_followers_at_once() {
        let waker = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let (sender, _leader) = reply_slot();
        let mut follower = _leader.follow().join().expect("waiting");
        assert!(poll(&mut follower, &waker).is_pending());
        drop(sender);
        assert_eq!(waker.0.load(Ordering::Relaxed), 1);
        assert_eq!(follower.try_recv().err(), Some(TryRecvError::Closed));
    }

    #[test]
    fn a_follower_whose_leader_left_still_gets_the_reply() {
        let (sender, leader) = reply_slot();
        let mut follower = leader.follow().join().expect("waiting");
        drop(leader);
        sender.send(ok(b"EN\r\n"));
        assert_eq!(
            &follower.try_recv().expect("reply").expect("ok")[..],
            b"EN\r\n"
        );
    }

    #[test]
    fn a_reused_slot_is_never_joined() {
        let (sender, receiver) = reply_slot();
        let follow = receiver.follow();
        drop(receiver);
        drop(sender);
        // The same cell, now another request's, still waiting.
        let (_sender, _receiver) = reply_slot();
        assert!(follow.join().is_none());
        assert!(ReplyFollow::default().join().is_none());
    }

    #[test]
    fn many_followers_are_answered_without_recursion() {
        let (sender, leader) = reply_slot();
        let follow = leader.follow();
        let mut followers: Vec<_> = (0..100_000)
            .map(|_| follow.join().expect("waiting"))
            .collect();
        sender.send(ok(b"EN\r\n"));
        assert!(followers.iter_mut().all(|f| f.try_recv().is_ok()));
        let (sender, leader) = reply_slot();
        let follow = leader.follow();
        let followers: Vec<_> = (0..100_000)
            .map(|_| follow.join().expect("waiting"))
            .collect();
        drop(sender);
        drop(leader);
        drop(followers);
    }

    #[test]
    fn awaiting_works_across_tasks() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async {
            let (sender, receiver) = reply_slot();
            let waiter = tokio::task::spawn_local(receiver);
            tokio::task::yield_now().await;
            sender.send(ok(b"VERSION 1\r\n"));
            let reply = waiter.await.expect("task").expect("sent").expect("ok");
            assert_eq!(&reply[..], b"VERSION 1\r\n");
            let (sender, receiver) = reply_slot();
            let waiter = tokio::task::spawn_local(receiver);
            tokio::task::yield_now().await;
            drop(sender);
            assert_eq!(waiter.await.expect("task").err(), Some(RecvError));
        });
    }
}
