//! A worker's client sessions, as far as shutdown needs them: one task waker per session,
//! so starting to drain wakes every session (idle ones close, busy ones once they have
//! answered what the client sent) without each session storing a watch-channel future
//! (~140 bytes of every idle connection's task). Lives in `WorkerContext::sessions`.
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::task::{Poll, Waker};

/// The wakers of a worker's sessions, and whether the worker is draining.
///
/// A slab: a free place holds the next free place's index, so sessions closing in a burst
/// grow nothing; when the last session leaves, the storage itself is freed.
#[derive(Debug, Default)]
pub(crate) struct SessionWakers {
    places: RefCell<Vec<Place>>,
    /// The first free place, or `NO_PLACE`.
    first_free: Cell<u32>,
    open: Cell<u32>,
    draining: Cell<bool>,
}

#[derive(Debug)]
enum Place {
    /// A session, and its task's waker once it was polled.
    Taken(Option<Waker>),
    /// Free; the next free place.
    Free(u32),
}

const NO_PLACE: u32 = u32::MAX;

impl SessionWakers {
    /// A place for a new session's waker.
    pub(crate) fn enter(&self) -> u32 {
        let mut places = self.places.borrow_mut();
        if self.open.get() == 0 {
            // Empty: whatever the free list says belongs to storage that was freed.
            self.first_free.set(NO_PLACE);
        }
        self.open.set(self.open.get() + 1);
        let free = self.first_free.get();
        if let Some(place) = places.get_mut(free as usize) {
            if let Place::Free(next) = *place {
                self.first_free.set(next);
                *place = Place::Taken(None);
                return free;
            }
        }
        places.push(Place::Taken(None));
        u32::try_from(places.len() - 1).unwrap_or(NO_PLACE)
    }

    pub(crate) fn leave(&self, index: u32) {
        let mut places = self.places.borrow_mut();
        self.open.set(self.open.get().saturating_sub(1));
        if self.open.get() == 0 {
            *places = Vec::new();
            self.first_free.set(NO_PLACE);
            return;
        }
        if let Some(place) = places.get_mut(index as usize) {
            *place = Place::Free(self.first_free.get());
            self.first_free.set(index);
        }
    }

    /// Records the waker of the session at `index` (a task's waker does not change, so
    /// after the first poll this is a comparison).
    pub(crate) fn register(&self, index: u32, waker: &Waker) {
        if let Some(Place::Taken(slot)) = self.places.borrow_mut().get_mut(index as usize) {
            match slot {
                Some(known) if known.will_wake(waker) => {}
                _ => *slot = Some(waker.clone()),
            }
        }
    }

    /// Shutdown: every session closes once it is idle (nothing in flight, nothing buffered).
    pub(crate) fn drain(&self) {
        self.draining.set(true);
        // Woken outside the borrow: a waker of this thread's runtime only schedules its
        // task, but nothing here should depend on that.
        let wakers: Vec<Waker> = self
            .places
            .borrow()
            .iter()
            .filter_map(|place| match place {
                Place::Taken(Some(waker)) => Some(waker.clone()),
                _ => None,
            })
            .collect();
        for waker in wakers {
            waker.wake();
        }
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.get()
    }
}

/// Ready once the worker started draining (the session's task waker is registered).
pub(crate) fn drained(sessions: &SessionWakers) -> impl Future<Output = ()> + '_ {
    std::future::poll_fn(|_| {
        if sessions.draining() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn the_session_registry_reuses_places_and_wakes_every_session_on_drain() {
        let sessions = SessionWakers::default();
        let count = std::sync::Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let (a, b, c) = (sessions.enter(), sessions.enter(), sessions.enter());
        assert_eq!((a, b, c), (0, 1, 2));
        for index in [a, b, c] {
            sessions.register(index, &waker);
        }
        sessions.leave(b);
        // A place given back is taken again before the storage grows.
        assert_eq!(sessions.enter(), b);
        sessions.register(b, &waker);
        sessions.leave(a);
        sessions.drain();
        assert!(sessions.draining());
        assert_eq!(
            count.0.load(std::sync::atomic::Ordering::Relaxed),
            2,
            "b and c"
        );
        sessions.leave(b);
        sessions.leave(c);
        // Empty: the storage is freed, and numbering starts over.
        assert_eq!(sessions.places.borrow().capacity(), 0);
        assert_eq!(sessions.enter(), 0);
    }
}
