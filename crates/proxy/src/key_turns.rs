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
//!
//! Keys go by a 64-bit hash of theirs (nothing copied or allocated per request): two keys
//! with the same hash share their turns, which orders them more than needed, never less.
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::future::poll_fn;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::task::{Poll, Waker};

/// The turns of the keys that have requests waiting or running, on one worker.
#[derive(Debug, Default)]
pub(crate) struct KeyTurns {
    keys: RefCell<HashMap<u64, Line>>,
    /// The number the last request taking turns got (`request`).
    requests: Cell<u64>,
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
    /// The request that took the last turn.
    last_request: u64,
}

/// One request's turn on one key; ends (passes to the next) when dropped.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    turns: &'a KeyTurns,
    key: u64,
    number: u64,
}

impl KeyTurns {
    /// A number for one request, which then takes its turns with it (`take`).
    pub(crate) fn request(&self) -> u64 {
        let number = self.requests.get() + 1;
        self.requests.set(number);
        number
    }

    /// Takes the next turn on `key` for request `request`; `None` when that request holds
    /// one on it already (a key asked twice, or another with the same hash): it must not
    /// wait for itself.
    pub(crate) fn take(&self, key: &[u8], request: u64) -> Option<Turn<'_>> {
        let key = hash(key);
        let mut keys = self.keys.borrow_mut();
        let line = keys.entry(key).or_default();
        if line.next > line.serving && line.last_request == request {
            return None;
        }
        let number = line.next;
        line.next += 1;
        line.last_request = request;
        Some(Turn {
            turns: self,
            key,
            number,
        })
    }

    #[cfg(test)]
    fn lines(&self) -> usize {
        self.keys.borrow().len()
    }
}

fn hash(key: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
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
        let key = b"k";
        let take = |key: &[u8]| turns.take(key, turns.request()).expect("a turn");
        let first = take(key);
        let second = take(key);
        let other = take(b"other");
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
        let key = b"k";
        let take = |key: &[u8]| turns.take(key, turns.request()).expect("a turn");
        let first = take(key);
        let second = take(key);
        let third = take(key);
        drop(second);
        assert!(!ready(third.come()));
        drop(first);
        assert!(ready(third.come()));
        drop(third);
        assert_eq!(turns.lines(), 0);
    }

    #[test]
    fn one_request_takes_one_turn_per_key() {
        let turns = KeyTurns::default();
        let earlier = turns.take(b"k", turns.request()).expect("a turn");
        let request = turns.request();
        let first = turns.take(b"k", request).expect("a turn");
        assert!(turns.take(b"k", request).is_none());
        assert!(!ready(first.come()));
        drop(earlier);
        assert!(ready(first.come()));
        drop(first);
        assert_eq!(turns.lines(), 0);
    }
}
