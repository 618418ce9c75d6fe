//! A process-wide budget for reply bytes held for clients that have not read them yet.
//!
//! ```text
//!   every session ──charge(held bytes)──> ReplyBudget { used, holders, avg reply size }
//!        held = unsent output + outstanding requests x this session's average reply size
//!
//!   used <= max_buffered_replies : everyone reads and dispatches as usual
//!   used  > max_buffered_replies : sessions holding more than their share
//!                                  (limit / sessions holding anything) stop reading;
//!                                  the others, holding little, keep their latency
//!   still over its share after slow_client_timeout, blocked writing: closed, counted, logged
//! ```
//!
//! `max_client_pending` bounds one client; this bounds the sum, so ten clients that pipeline
//! gets of large values and never read cannot hold ten times that. Replies already on their
//! way when a session is paused still arrive: the budget is a soft bound, kept by pausing
//! the heaviest holders and, past the timeout, by closing them (which frees what they held).
//!
//! A reply's size is known only once it arrives, so a new session would otherwise dispatch
//! `max_client_pending` requests at once whatever their replies weigh. While the budget is
//! on, a session's window of unanswered requests starts at 32 and doubles each time its
//! replies are written without waiting (the client reads), up to `max_client_pending`. It
//! never shrinks: a write that waits is normal for a fast pipelining client, and halving on
//! it cost such clients throughput. A client that reads never notices beyond its first few
//! batches; one that does not read holds what its window had grown to, not the full cap.
//!
//! The request path pays one relaxed load per request while the budget is not exceeded.
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::counters::ReplyBudget;
use crate::stats::Metrics;

/// What the running config says about the budget (0 = no process-wide bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BudgetSettings {
    pub max_buffered_replies: usize,
    pub slow_client_timeout: Duration,
}

/// Before any reply was seen, an outstanding request is assumed to bring back this much.
const INITIAL_AVERAGE_REPLY: usize = 1024;
/// A new session's window of unanswered requests (see the module header).
const INITIAL_WINDOW: usize = 32;
/// Past this the window is no limit (`max_client_pending` applies on its own).
const MAX_WINDOW: usize = 1 << 20;

/// Why a budgeted write ended without writing everything.
#[derive(Debug)]
pub(crate) enum WriteEnd {
    /// The client went away (or the socket failed).
    Io,
    /// The client held more than its share past `slow_client_timeout`: closed.
    SlowClient,
}

/// One session's charge against the budget while it is busy; released when dropped. The
/// budget lives in `Metrics` (one per process), which every session reaches already.
/// What a session learnt about its client (average reply, window) outlives the charge as
/// a [`ChargeMemory`] while the session is idle, so an idle session stores 8 bytes of it.
#[derive(Debug)]
pub(crate) struct Charge<'a> {
    shared: &'a Metrics,
    held: usize,
    /// A running average of this session's reply sizes (bytes), to charge its requests
    /// not answered yet. Kept per session: no shared cache line on the request path, and a
    /// client's own replies predict its next ones better than everyone's.
    average_reply: usize,
    /// Unanswered requests this session may have (slow start, see the module header).
    window: usize,
}

/// What an idle session keeps of its [`Charge`]: its client's average reply size and
/// window of unanswered requests (both far below `u32::MAX`: see `MAX_WINDOW`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChargeMemory {
    average_reply: u32,
    window: u32,
}

impl Default for ChargeMemory {
    fn default() -> Self {
        ChargeMemory {
            average_reply: INITIAL_AVERAGE_REPLY as u32,
            window: INITIAL_WINDOW as u32,
        }
    }
}

impl<'a> Charge<'a> {
    #[cfg(test)]
    pub(crate) fn new(shared: &'a Metrics) -> Charge<'a> {
        Charge::resume(shared, ChargeMemory::default())
    }

    /// A charge of nothing yet, for a session that was idle and remembered `memory`.
    pub(crate) fn resume(shared: &'a Metrics, memory: ChargeMemory) -> Charge<'a> {
        Charge {
            shared,
            held: 0,
            average_reply: memory.average_reply as usize,
            window: memory.window as usize,
        }
    }

    /// What to remember of this client while the session is idle.
    pub(crate) fn memory(&self) -> ChargeMemory {
        ChargeMemory {
            average_reply: u32::try_from(self.average_reply).unwrap_or(u32::MAX),
            window: u32::try_from(self.window).unwrap_or(u32::MAX),
        }
    }

    /// Folds `replies` replies totalling `bytes` into the running average (weight 1/8:
    /// a change of workload shows within a few batches).
    pub(crate) fn observe(&mut self, bytes: usize, replies: usize) {
        if replies == 0 {
            return;
        }
        let sample = bytes / replies;
        self.average_reply = (self.average_reply - self.average_reply / 8 + sample / 8).max(1);
    }

    fn counters(&self) -> &ReplyBudget {
        &self.shared.replies
    }

    /// Records that this session now holds `unsent` output bytes and `outstanding`
    /// requests not yet answered.
    pub(crate) fn set(&mut self, unsent: usize, outstanding: usize) {
        let counters = &self.shared.replies;
        let held = unsent.saturating_add(outstanding.saturating_mul(self.average_reply));
        if held == self.held {
            return;
        }
        match (self.held == 0, held == 0) {
            (true, false) => {
                counters.holders.fetch_add(1, Relaxed);
            }
            (false, true) => {
                counters.holders.fetch_sub(1, Relaxed);
            }
            _ => {}
        }
        if held > self.held {
            counters.used.fetch_add(held - self.held, Relaxed);
        } else {
            counters.used.fetch_sub(self.held - held, Relaxed);
        }
        self.held = held;
    }

    /// Whether this session holds more than its share of an exceeded budget.
    fn over_share(&self, settings: &BudgetSettings) -> bool {
        let limit = settings.max_buffered_replies;
        if limit == 0 || self.held == 0 {
            return false;
        }
        let counters = self.counters();
        if counters.used.load(Relaxed) <= limit {
            return false;
        }
        let holders = counters.holders.load(Relaxed).max(1);
        self.held > limit / holders
    }

    /// Whether the session may read and dispatch another request, given `outstanding`
    /// requests already unanswered. When it says no, `paused` is set and the session waits
    /// for a reply (there is always one outstanding then). Counts a budget pause the first
    /// time it says no.
    pub(crate) fn may_read(
        &mut self,
        settings: &BudgetSettings,
        outstanding: usize,
        paused: &mut bool,
    ) -> bool {
        if settings.max_buffered_replies == 0 {
            return true;
        }
        if outstanding >= self.window {
            *paused = true;
            return false;
        }
        // The cheap test first: under budget, nothing else to look at.
        if self.counters().used.load(Relaxed) <= settings.max_buffered_replies {
            *paused = false;
            return true;
        }
        self.set(0, outstanding);
        // A session waiting for nothing never pauses: it could not be woken.
        let allowed = outstanding == 0 || !self.over_share(settings);
        if !allowed && !*paused {
            self.counters().paused_total.fetch_add(1, Relaxed);
        }
        *paused = !allowed;
        allowed
    }

    /// Writes `bytes` to the client with this session charged for them until written.
    /// While the write is blocked (the client does not read) and the session holds more
    /// than its share of an exceeded budget for `slow_client_timeout`, gives up.
    pub(crate) async fn write_all<W: AsyncWrite + Unpin>(
        &mut self,
        writer: &mut W,
        bytes: &[u8],
        outstanding: usize,
        settings: &BudgetSettings,
    ) -> Result<(), WriteEnd> {
        let mut write = pin!(writer.write_all(bytes));
        // Fast path: the socket takes it all now (a reading client); no timer, no charge.
        let first = std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await;
        if let Poll::Ready(done) = first {
            // A charge left from a paused or blocked spell is refreshed; a session that
            // holds nothing touches no shared counter here.
            if self.held != 0 {
                self.set(0, outstanding);
            }
            // Grow only while the budget has room: under pressure, new and growing
            // sessions keep small windows.
            if self.counters().used() <= settings.max_buffered_replies / 2 {
                self.window = self.window.saturating_mul(2).min(MAX_WINDOW);
            }
            return done.map_err(|_| WriteEnd::Io);
        }
        self.set(bytes.len(), outstanding);
        let check = (settings.slow_client_timeout / 4)
            .clamp(Duration::from_millis(10), Duration::from_millis(250));
        let mut over_since: Option<Instant> = None;
        let outcome = loop {
            tokio::select! {
                done = &mut write => break done.map_err(|_| WriteEnd::Io),
                _ = tokio::time::sleep(check) => {
                    if !self.over_share(settings) {
                        over_since = None;
                        continue;
                    }
                    let since = *over_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= settings.slow_client_timeout {
                        self.counters().slow_closed_total.fetch_add(1, Relaxed);
                        tracing::warn!(
                            held_bytes = self.held,
                            buffered_bytes = self.counters().used(),
                            limit = settings.max_buffered_replies,
                            timeout = ?settings.slow_client_timeout,
                            "closing a client that holds more than its share of max_buffered_replies and does not read"
                        );
                        break Err(WriteEnd::SlowClient);
                    }
                }
            }
        };
        self.set(0, outstanding);
        outcome
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        self.set(0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn settings(limit: usize) -> BudgetSettings {
        BudgetSettings {
            max_buffered_replies: limit,
            slow_client_timeout: Duration::from_millis(50),
        }
    }

    fn shared() -> Arc<Metrics> {
        Arc::new(Metrics::new(1))
    }

    #[test]
    fn charges_add_up_and_are_released_on_drop() {
        let shared = shared();
        let mut a = Charge::new(&shared);
        let mut b = Charge::new(&shared);
        a.set(1000, 0);
        b.set(500, 2);
        let average = INITIAL_AVERAGE_REPLY;
        assert_eq!(shared.replies.used(), 1500 + 2 * average);
        assert_eq!(shared.replies.holders.load(Relaxed), 2);
        a.set(0, 0);
        assert_eq!(shared.replies.holders.load(Relaxed), 1);
        drop(b);
        assert_eq!(shared.replies.used(), 0);
        assert_eq!(shared.replies.holders.load(Relaxed), 0);
        drop(a);
        assert_eq!(shared.replies.used(), 0);
    }

    #[test]
    fn over_budget_only_the_heaviest_holders_pause() {
        let shared = shared();
        let mut heavy = Charge::new(&shared);
        let mut light = Charge::new(&shared);
        // Replies average 1000 bytes, for both.
        for _ in 0..100 {
            heavy.observe(1000, 1);
            light.observe(1000, 1);
        }
        let average = heavy.average_reply;
        assert!((990..=1024).contains(&average), "{average}");
        let limit = 10 * average;
        let mut paused = (false, false);
        // Under budget: both read, up to their window.
        assert!(heavy.may_read(&settings(limit), 5, &mut paused.0));
        assert!(!heavy.may_read(&settings(limit), INITIAL_WINDOW, &mut paused.0));
        assert!(paused.0);
        assert_eq!(
            shared.replies.paused_total.load(Relaxed),
            0,
            "not a budget pause"
        );
        assert!(heavy.may_read(&settings(limit), 5, &mut paused.0));
        heavy.set(0, 9);
        light.set(0, 2);
        assert!(!paused.0);
        // 9 + 2 outstanding > 10: over budget. The heavy one (9 > 10/2) pauses, the light
        // one (2) keeps reading.
        assert!(!heavy.may_read(&settings(limit), 9, &mut paused.0));
        assert!(light.may_read(&settings(limit), 2, &mut paused.1));
        assert!(paused.0 && !paused.1);
        assert_eq!(shared.replies.paused_total.load(Relaxed), 1);
        // Asked again while still paused: counted once.
        assert!(!heavy.may_read(&settings(limit), 9, &mut paused.0));
        assert_eq!(shared.replies.paused_total.load(Relaxed), 1);
        // A session with nothing outstanding is never paused.
        assert!(heavy.may_read(&settings(limit), 0, &mut paused.0));
        // Budget off: never paused.
        assert!(light.may_read(&settings(0), 1000, &mut paused.1));
    }

    #[tokio::test]
    async fn a_blocked_writer_over_its_share_is_closed_after_the_timeout() {
        let shared = shared();
        let mut charge = Charge::new(&shared);
        // A peer that never reads: a duplex pipe with a small buffer.
        let (mut writer, _reader) = tokio::io::duplex(1024);
        let bytes = vec![b'x'; 64 * 1024];
        let outcome = charge
            .write_all(&mut writer, &bytes, 0, &settings(16 * 1024))
            .await;
        assert!(matches!(outcome, Err(WriteEnd::SlowClient)), "{outcome:?}");
        assert_eq!(shared.replies.slow_closed_total.load(Relaxed), 1);
        assert_eq!(shared.replies.used(), 0, "released when the write ends");
    }

    #[tokio::test]
    async fn a_reader_that_keeps_up_is_written_in_full() {
        let shared = shared();
        let mut charge = Charge::new(&shared);
        let (mut writer, mut reader) = tokio::io::duplex(1024);
        let drain = tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut sink).await;
            sink.len()
        });
        let bytes = vec![b'x'; 64 * 1024];
        // Under budget (limit far above): the write may take as long as it needs.
        charge
            .write_all(&mut writer, &bytes, 0, &settings(1 << 30))
            .await
            .expect("written");
        drop(writer);
        assert_eq!(drain.await.expect("reader"), 64 * 1024);
        assert_eq!(shared.replies.used(), 0);
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn the_window_grows_while_the_client_reads_and_stays_when_it_does_not() {
        let shared = Arc::new(Metrics::new(1));
        let mut charge = Charge::new(&shared);
        let settings = BudgetSettings {
            max_buffered_replies: 1 << 30,
            slow_client_timeout: Duration::from_secs(60),
        };
        let (mut writer, mut reader) = tokio::io::duplex(64 * 1024);
        for expected in [64, 128, 256] {
            charge
                .write_all(&mut writer, b"VALUE", 0, &settings)
                .await
                .expect("written");
            assert_eq!(charge.window, expected);
        }
        // A write that must wait (the reader is behind) leaves the window as it is.
        let big = vec![b'x'; 128 * 1024];
        let drain = tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut sink).await;
        });
        charge
            .write_all(&mut writer, &big, 0, &settings)
            .await
            .expect("written once the reader catches up");
        assert_eq!(charge.window, 256);
        drop(writer);
        drain.await.expect("reader");
        // Budget off: no window at all.
        let off = BudgetSettings {
            max_buffered_replies: 0,
            ..settings
        };
        let mut paused = false;
        assert!(charge.may_read(&off, 100_000, &mut paused));
    }
}
