use std::cell::Cell;
use std::task::{Poll, Waker};

/// A single-thread `Notify` for one waiting task: a flag and the task's waker.
#[derive(Default)]
pub(super) struct LocalNotify {
    notified: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl LocalNotify {
    pub(super) fn notify(&self) {
        self.notified.set(true);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Completes once `notify` was called since the last completion.
    pub(super) fn notified(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |context| {
            if self.notified.replace(false) {
                return Poll::Ready(());
            }
            let waker = match self.waker.take() {
                Some(waker) if waker.will_wake(context.waker()) => waker,
                _ => context.waker().clone(),
            };
            self.waker.set(Some(waker));
            Poll::Pending
        })
    }
}
