//! Per-worker buffer pool: client sessions borrow I/O buffers only while bytes wait.
//!
//! A central tier holds tens of thousands of client connections, nearly all idle. Giving
//! every session its own 16 KiB input and output buffers cost ~32 KiB of address space
//! (and ~10 KiB of RSS) per idle connection. Instead a session takes a buffer from its
//! worker's pool for one read (and gives it straight back when the read would block, or
//! when everything read was parsed), and for one batch of replies (given back once
//! written). A worker is one thread running one session at a time, so a handful of
//! buffers serve all its sessions; the pool keeps at most [`POOL_LIMIT`] and drops the
//! rest so a burst does not pin memory for the process's life, and [`trim`] (the worker's
//! steady tick) frees those that a whole tick did not use, so what a burst left in the
//! pool goes back within two ticks while a steady load keeps its buffers.
//!
//! A thread-local rather than a field of the worker context keeps this module
//! self-contained: every worker is one thread with one current-thread runtime.
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use bytes::{Buf, BytesMut};

/// The size of a pooled buffer and of one read.
pub(crate) const CHUNK: usize = 16 * 1024;
/// Buffers kept per worker once given back; more are freed.
const POOL_LIMIT: usize = 16;
/// A buffer that grew past this (a huge multi-get reply, a large value) is freed rather
/// than kept, so one large reply does not pin its memory for the worker's life. A batch of
/// pipelined replies (1,024 small values) reaches ~256 KiB; freeing those after every
/// batch cost an mmap/munmap and page faults per batch. At most 16 x 256 KiB per worker.
const KEEP_AT_MOST: usize = 16 * CHUNK;
/// Empty pending queues kept per worker (see [`take_queue`]).
const QUEUE_POOL_LIMIT: usize = 64;

/// Homes for busy sessions' futures kept per worker once given back; more are freed.
const BUSY_POOL_LIMIT: usize = 64;

thread_local! {
    static BUFFERS: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    /// The fewest buffers `BUFFERS` held since the last [`trim`]: that many sat unused.
    static BUFFERS_LOW: Cell<usize> = const { Cell::new(0) };
    /// One `Vec<Pin<Box<Option<F>>>>` per busy-future type `F` (the text session over a
    /// socket; the fuzzing harness's over a pipe), found by type.
    static BUSY: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer with at least `CHUNK / 4` bytes of room, from the pool when it has one.
pub(crate) fn take() -> BytesMut {
    let reused = BUFFERS.with(|pool| {
        let mut pool = pool.borrow_mut();
        // Newest first. A tail of a buffer that requests were split off is usable once
        // they are gone (a multi-get keeps its line until its reply is written): its
        // allocation is reclaimed in place. One still shared stays pooled for a later
        // `take`, so the worker's buffers take turns instead of being freed and allocated.
        let usable = (0..pool.len())
            .rev()
            .find(|&i| pool[i].capacity() >= CHUNK / 4 || pool[i].try_reclaim(CHUNK))?;
        let buffer = pool.remove(usable);
        BUFFERS_LOW.with(|low| low.set(low.get().min(pool.len())));
        Some(buffer)
    });
    reused.unwrap_or_else(|| BytesMut::with_capacity(CHUNK))
}

/// Gives a buffer back (its contents are discarded).
pub(crate) fn give(mut buffer: BytesMut) {
    buffer.clear();
    // A tail of a buffer that requests were split off is pooled too (see `take`).
    if buffer.capacity() > KEEP_AT_MOST {
        return;
    }
    BUFFERS.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.len() < POOL_LIMIT {
            pool.push(buffer);
        }
    });
}

/// Frees the pooled buffers that nothing took since the last call (see the module header).
pub(crate) fn trim() {
    BUFFERS.with(|pool| {
        let mut pool = pool.borrow_mut();
        let unused = BUFFERS_LOW.with(Cell::get).min(pool.len());
        // The oldest first: `take` prefers the newest.
        pool.drain(..unused);
        BUFFERS_LOW.with(|low| low.set(pool.len()));
    });
}

/// Drops the bytes of a refused value (a data block too large, a bad binary body) from the
/// front of `input` as they arrive, `remaining` of them still to come; true while more
/// are awaited, so the caller reads before parsing again.
pub(crate) fn skip_refused(input: &mut BytesMut, remaining: &mut usize) -> bool {
    let skip = (*remaining).min(input.len());
    input.advance(skip);
    *remaining -= skip;
    *remaining > 0
}

/// Pending-reply queues of the same type, so a session that went idle can give its
/// queue's storage back and take one again on its next request without a heap allocation.
pub(crate) struct QueuePool<T> {
    queues: RefCell<Vec<VecDeque<T>>>,
}

impl<T> QueuePool<T> {
    pub(crate) const fn new() -> Self {
        QueuePool {
            queues: RefCell::new(Vec::new()),
        }
    }

    /// Gives an empty queue's storage back; the caller is left with an unallocated one.
    pub(crate) fn give(&self, queue: &mut VecDeque<T>) {
        if queue.capacity() == 0 || !queue.is_empty() {
            return;
        }
        let mut queues = self.queues.borrow_mut();
        if queues.len() < QUEUE_POOL_LIMIT && queue.capacity() <= 256 {
            queues.push(std::mem::take(queue));
        } else {
            *queue = VecDeque::new();
        }
    }

    /// Makes sure `queue` has storage, from the pool when it has some.
    pub(crate) fn fill(&self, queue: &mut VecDeque<T>) {
        if queue.capacity() == 0 {
            if let Some(reused) = self.queues.borrow_mut().pop() {
                *queue = reused;
            }
        }
    }
}

/// A busy session's future, in a home taken from the worker's pool: a session is a small
/// task while idle and borrows this (about a kilobyte: pending queue, buffers, the budget's
/// charge, the waits of a request in flight) only while a request is in flight, without a
/// heap allocation per request once the pool has warmed up.
pub(crate) fn start_busy<F: Future + 'static>(future: F) -> Pin<Box<Option<F>>> {
    match with_busy_pool(|pool: &mut Vec<Pin<Box<Option<F>>>>| pool.pop()) {
        Some(mut home) => {
            home.set(Some(future));
            home
        }
        None => Box::pin(Some(future)),
    }
}

/// Drops what `home` holds (a finished future) and gives the home back to the pool.
pub(crate) fn end_busy<F: Future + 'static>(mut home: Pin<Box<Option<F>>>) {
    home.set(None);
    with_busy_pool(|pool: &mut Vec<Pin<Box<Option<F>>>>| {
        if pool.len() < BUSY_POOL_LIMIT {
            pool.push(home);
        }
    });
}

/// A value in a heap home from the worker's pool: per-request state too large to keep inline
/// in a session's pending queue (a multi-get's legs and routing, ~620 bytes), without a
/// heap allocation per request once the pool has warmed up.
#[derive(Debug)]
pub(crate) struct Homed<T: 'static> {
    /// `Some` from [`Homed::new`] until [`Homed::release`], which consumes the `Homed`.
    home: Box<Option<T>>,
}

impl<T: 'static> Homed<T> {
    pub(crate) fn new(value: T) -> Self {
        match with_busy_pool(|pool: &mut Vec<Box<Option<T>>>| pool.pop()) {
            Some(mut home) => {
                *home = Some(value);
                Homed { home }
            }
            None => Homed {
                home: Box::new(Some(value)),
            },
        }
    }

    /// Drops the value where it lives and gives its home back to the pool. (A `Homed`
    /// dropped whole, as when its session closes with the request in flight, just frees
    /// its home.)
    pub(crate) fn release(self) {
        let Homed { mut home } = self;
        *home = None;
        with_busy_pool(|pool: &mut Vec<Box<Option<T>>>| {
            if pool.len() < BUSY_POOL_LIMIT {
                pool.push(home);
            }
        });
    }

    pub(crate) fn get(&self) -> Option<&T> {
        self.home.as_ref().as_ref()
    }

    pub(crate) fn get_mut(&mut self) -> Option<&mut T> {
        self.home.as_mut().as_mut()
    }
}

fn with_busy_pool<P: Default + 'static, R>(use_pool: impl FnOnce(&mut P) -> R) -> R {
    BUSY.with(|pools| {
        let mut pools = pools.borrow_mut();
        let index = match pools.iter().position(|pool| pool.is::<P>()) {
            Some(index) => index,
            None => {
                pools.push(Box::new(P::default()));
                pools.len() - 1
            }
        };
        match pools[index].downcast_mut::<P>() {
            Some(pool) => use_pool(pool),
            // Not reached: `index` was found (or pushed) by this very type.
            None => use_pool(&mut P::default()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_frees_only_the_buffers_a_whole_tick_left_unused() {
        // A burst: eight buffers in use at once, then all given back.
        let burst: Vec<BytesMut> = (0..8).map(|_| take()).collect();
        burst.into_iter().for_each(give);
        let pooled = || BUFFERS.with(|pool| pool.borrow().len());
        assert_eq!(pooled(), 8);
        // The tick that saw the burst: the pool was empty at one point, nothing goes.
        trim();
        assert_eq!(pooled(), 8);
        // A steady load of two at a time through the next tick: the six it never reached go.
        for _ in 0..100 {
            let (a, b) = (take(), take());
            give(a);
            give(b);
        }
        trim();
        assert_eq!(pooled(), 2);
        // Idle through a whole tick: the rest go too.
        trim();
        assert_eq!(pooled(), 0);
    }

    /// The bench's 0.00 allocations per single-key request rests on this: a buffer that
    /// requests were split off is not replaced while they are in flight and then freed, but
    /// taken back whole once they are gone.
    #[test]
    fn a_shared_tail_is_reclaimed_whole_once_its_requests_are_gone() {
        let mut buffer = take();
        let start = buffer.as_ptr();
        buffer.resize(CHUNK - 100, b'x');
        let request = buffer.split_to(CHUNK - 100).freeze();
        give(buffer);
        // Still shared by the request: a fresh buffer, the tail stays pooled.
        let fresh = take();
        assert_ne!(fresh.as_ptr(), start);
        drop(request);
        let reclaimed = take();
        assert_eq!(reclaimed.as_ptr(), start);
        assert!(reclaimed.capacity() >= CHUNK);
    }
}
