//! Turns per key: requests on one key run one after another, in the order they took
//! their turn. A resize window needs this for the keys whose owner changed: moving a key
//! takes several round trips to two servers, so a request pipelined behind another on the
//! same key would otherwise reach the new owner first (a get behind an append reading the
//! value before the append, or missing because the append moved the key meanwhile).
//!
//! Turns are taken synchronously (a request takes its turn when it starts, in the client's
//! order) and waited for asynchronously. A request waits only for requests that took their
//! turn before it, so requests that take turns on several keys (multi-gets) cannot wait
//! for each other in a circle. A turn given up without being waited for (its request
//! dropped) passes to the next one.
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::future::poll_fn;
use std::task::{Poll, Waker};

use bytes::Bytes;

/// The turns of the keys that have requests waiting or running, on one worker.
#[derive(Debug, Default)]
pub(crate) struct KeyTurns {
    keys: RefCell<HashMap<Bytes, Line>>,
}

/// One key's queue of turns.
#[derive(Debug, Default)]
struct Line {
    /// The number the next request gets.
    next: u64,
    /// The number whose request runs now.
    serving: u64,
    /// Turns given up before they came (served as soon as they come).
    given_up: BTreeSet<u64>,
    /// The requests waiting for their turn.
    waiting: Vec<Waker>,
}

/// One request's turn on one key; ends (passes to the next) when dropped.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    turns: &'a KeyTurns,
    key: Bytes,
    number: u64,
}

impl KeyTurns {
    /// Takes the next turn on `key`.
    pub(crate) fn take(&self, key: &Bytes) -> Turn<'_> {
        let mut keys = self.keys.borrow_mut();
        let line = keys.entry(key.clone()).or_default();
        let number = line.next;
        line.next += 1;
        Turn {
            turns: self,
            key: key.clone(),
            number,
        }
    }

    #[cfg(test)]
    fn lines(&self) -> usize {
        self.keys.borrow().len()
    }
}

impl Turn<'_> {
    /// Waits until every request that took a turn on this key before this one is done.
    pub(crate) async fn come(&self) {
        poll_fn(|context| {
            let mut keys = self.turns.keys.borrow_mut();
            let Some(line) = keys.get_mut(&self.key) else {
                return Poll::Ready(());
            };
            if line.serving == self.number {
                return Poll::Ready(());
            }
            if !line.waiting.iter().any(|w| w.will_wake(context.waker())) {
                line.waiting.push(context.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut keys = self.turns.keys.borrow_mut();
        let Some(line) = keys.get_mut(&self.key) else {
            return;
        };
        if line.serving != self.number {
            line.given_up.insert(self.number);
            return;
        }
        line.serving += 1;
        while line.given_up.remove(&line.serving) {
            line.serving += 1;
        }
        if line.serving == line.next {
            keys.remove(&self.key);
            return;
        }
        for waker in line.waiting.drain(..) {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::Context;

    fn ready(future: impl Future<Output = ()>) -> bool {
        let mut context = Context::from_waker(Waker::noop());
        pin!(future).poll(&mut context).is_ready()
    }

    #[test]
    fn turns_on_one_key_come_in_the_order_taken() {
        let turns = KeyTurns::default();
        let key = Bytes::from_static(b"k");
        let first = turns.take(&key);
        let second = turns.take(&key);
        let other = turns.take(&Bytes::from_static(b"other"));
        assert!(ready(first.come()));
        assert!(!ready(second.come()));
        assert!(ready(other.come()));
        drop(first);
        assert!(ready(second.come()));
        drop(second);
        drop(other);
        assert_eq!(turns.lines(), 0);
    }

    #[test]
    fn a_turn_given_up_before_it_came_is_skipped() {
        let turns = KeyTurns::default();
        let key = Bytes::from_static(b"k");
        let first = turns.take(&key);
        let second = turns.take(&key);
        let third = turns.take(&key);
        drop(second);
        assert!(!ready(third.come()));
        drop(first);
        assert!(ready(third.come()));
        drop(third);
        assert_eq!(turns.lines(), 0);
    }
}
