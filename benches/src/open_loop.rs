//! The open loop's bookkeeping, free of I/O and clocks so it can be unit-tested: when each
//! request is due (the arrival schedule), which connection it goes on, and how its latency is
//! counted from the time it was *due*, not the time it was sent.
//!
//! Latency from the intended send time is wrk2's correction for coordinated omission: if the
//! generator (or anything else) delays a send, that delay is part of what a client with this
//! arrival rate would have waited, so it is counted instead of hidden. How late each send
//! left against its schedule is recorded separately (`SendLateness`) so a reader can check
//! that the generator itself kept the schedule.

use std::collections::VecDeque;

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Evenly spaced, `1 / rate` apart (wrk2's constant throughput).
    Uniform,
    /// A Poisson process: exponential gaps with mean `1 / rate` (mutilate's default). Many
    /// independent clients behind one proxy look like this; bursts happen, as they do there.
    Poisson,
}

impl std::str::FromStr for Arrival {
    type Err = String;
    fn from_str(s: &str) -> Result<Arrival, String> {
        match s {
            "uniform" => Ok(Arrival::Uniform),
            "poisson" => Ok(Arrival::Poisson),
            _ => Err(format!("unknown arrival {s:?} (use uniform or poisson)")),
        }
    }
}

/// The times requests are due, in nanoseconds on the caller's clock.
#[derive(Debug)]
pub struct Schedule {
    arrival: Arrival,
    start_ns: u64,
    mean_gap_ns: f64,
    /// Requests handed out so far (uniform: the next is `start + issued * gap`, computed from
    /// the index so rounding never drifts).
    issued: u64,
    /// Poisson: the next due time as f64, accumulated gap by gap.
    next_ns: f64,
    rng: u64,
}

impl Schedule {
    /// `rate` requests per second starting at `start_ns`; `seed` fixes the Poisson gaps.
    pub fn new(arrival: Arrival, rate: f64, start_ns: u64, seed: u64) -> Schedule {
        assert!(rate > 0.0, "rate must be positive");
        Schedule {
            arrival,
            start_ns,
            mean_gap_ns: 1e9 / rate,
            issued: 0,
            next_ns: start_ns as f64,
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// When the next request is due (does not advance).
    pub fn peek(&self) -> u64 {
        match self.arrival {
            Arrival::Uniform => self.start_ns + (self.issued as f64 * self.mean_gap_ns) as u64,
            Arrival::Poisson => self.next_ns as u64,
        }
    }

    /// Hands out the next due time and moves on to the one after.
    pub fn advance(&mut self) -> u64 {
        let due = self.peek();
        self.issued += 1;
        if self.arrival == Arrival::Poisson {
            // Inverse transform: -ln(U) is exponential with mean 1; U in (0, 1].
            let u = 1.0 - self.unit();
            self.next_ns += -u.ln() * self.mean_gap_ns;
        }
        due
    }

    /// Uniform in [0, 1) from xorshift64* (the generator's PRNG; no crate needed).
    fn unit(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Picks the connection for the next request, as a client pool would: the first idle
/// connection (`is_idle`) at or after `cursor` among `n`, round robin; if every connection
/// is busy, the one at `cursor` (the request is pipelined behind the others: the offered
/// rate holds and the wait shows in its latency). Returns the index and the next cursor.
pub fn pick_connection(n: usize, cursor: usize, is_idle: impl Fn(usize) -> bool) -> (usize, usize) {
    assert!(n > 0, "no connections");
    let cursor = cursor % n;
    let chosen = (0..n)
        .map(|i| (cursor + i) % n)
        .find(|&c| is_idle(c))
        .unwrap_or(cursor);
    (chosen, (chosen + 1) % n)
}

/// One connection's requests in flight, oldest first: replies come back in request order
/// on a memcached connection, so each reply is matched to the oldest intended time.
#[derive(Debug, Default)]
pub struct InFlight {
    /// (due time, time the request actually left), oldest first.
    due: VecDeque<(u64, u64)>,
}

impl InFlight {
    /// Records a request that was due at `due_ns` and left at `sent_ns`.
    pub fn sent(&mut self, due_ns: u64, sent_ns: u64) {
        self.due.push_back((due_ns, sent_ns));
    }

    /// A reply arrived at `now_ns`: returns (due time, latency from the due time), or None
    /// if nothing was in flight (a reply nobody asked for).
    pub fn replied(&mut self, now_ns: u64) -> Option<(u64, u64)> {
        let (due, _) = self.due.pop_front()?;
        Some((due, now_ns.saturating_sub(due)))
    }

    pub fn len(&self) -> usize {
        self.due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// When the oldest request still waiting actually left (for the reply timeout: a
    /// generator that fell behind its schedule must not blame the target for it).
    pub fn oldest_sent(&self) -> Option<u64> {
        self.due.front().map(|&(_, sent)| sent)
    }
}

/// Whether a request due at `due_ns` belongs to the measured window `[from_ns, to_ns)`.
/// Requests are counted by when they were *due*, so a slow reply to a request offered inside
/// the window is measured even if it arrives after the window closed.
pub fn in_window(due_ns: u64, from_ns: u64, to_ns: u64) -> bool {
    due_ns >= from_ns && due_ns < to_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_schedule_is_evenly_spaced_without_drift() {
        let mut s = Schedule::new(Arrival::Uniform, 30_000.0, 1_000, 7);
        let times: Vec<u64> = (0..300_001).map(|_| s.advance()).collect();
        assert_eq!(times[0], 1_000);
        assert_eq!(times[1] - times[0], 33_333);
        // 300,000 gaps of 1/30,000 s are exactly 10 s: no accumulated rounding.
        assert_eq!(times[300_000], 1_000 + 10_000_000_000);
        assert!(times
            .windows(2)
            .all(|w| (33_333..=33_334).contains(&(w[1] - w[0]))));
    }

    #[test]
    fn poisson_schedule_has_the_asked_mean_and_exponential_spread() {
        let rate = 20_000.0;
        let mut s = Schedule::new(Arrival::Poisson, rate, 0, 42);
        let n = 200_000;
        let times: Vec<u64> = (0..=n).map(|_| s.advance()).collect();
        assert!(
            times.windows(2).all(|w| w[1] >= w[0]),
            "never goes back in time"
        );
        let mean_gap = times[n] as f64 / n as f64;
        assert!(
            (mean_gap / 50_000.0 - 1.0).abs() < 0.01,
            "mean gap {mean_gap}"
        );
        // Exponential: P(gap > mean) = 1/e ~ 0.368 (uniform spacing would give 0 or 1).
        let above = times.windows(2).filter(|w| w[1] - w[0] > 50_000).count();
        let share = above as f64 / n as f64;
        assert!(
            (share - (-1.0f64).exp()).abs() < 0.01,
            "share above mean {share}"
        );
    }

    #[test]
    fn poisson_gaps_depend_on_the_seed_only() {
        let a: Vec<u64> = {
            let mut s = Schedule::new(Arrival::Poisson, 1000.0, 5, 3);
            (0..10).map(|_| s.advance()).collect()
        };
        let mut s = Schedule::new(Arrival::Poisson, 1000.0, 5, 3);
        assert_eq!(a, (0..10).map(|_| s.advance()).collect::<Vec<_>>());
        assert_eq!(a[0], 5);
    }

    #[test]
    fn peek_does_not_advance() {
        let mut s = Schedule::new(Arrival::Uniform, 1000.0, 0, 1);
        assert_eq!(s.peek(), 0);
        assert_eq!(s.peek(), 0);
        assert_eq!(s.advance(), 0);
        assert_eq!(s.peek(), 1_000_000);
    }

    #[test]
    fn picks_the_next_idle_connection_round_robin() {
        let pick = |outstanding: &[usize], cursor| {
            pick_connection(outstanding.len(), cursor, |c| outstanding[c] == 0)
        };
        assert_eq!(pick(&[0, 0, 0], 0), (0, 1));
        assert_eq!(pick(&[0, 0, 0], 1), (1, 2));
        assert_eq!(pick(&[0, 0, 0], 2), (2, 0));
        // Busy connections are skipped.
        assert_eq!(pick(&[0, 1, 1], 1), (0, 1));
        assert_eq!(pick(&[1, 2, 0], 0), (2, 0));
        // All busy: pipeline on the cursor's connection rather than wait.
        assert_eq!(pick(&[1, 1, 1], 1), (1, 2));
        // A stale cursor past the end wraps.
        assert_eq!(pick(&[0, 0], 5), (1, 0));
    }

    #[test]
    fn replies_match_the_oldest_due_time() {
        let mut f = InFlight::default();
        assert_eq!(f.replied(10), None);
        f.sent(100, 130);
        f.sent(150, 151);
        assert_eq!(f.len(), 2);
        assert_eq!(f.oldest_sent(), Some(130));
        // The send may have left late; latency still counts from the due time.
        assert_eq!(f.replied(180), Some((100, 80)));
        assert_eq!(f.replied(190), Some((150, 40)));
        assert!(f.is_empty());
        // A clock read before the due time (cannot happen with one monotonic clock) is 0.
        f.sent(500, 500);
        assert_eq!(f.replied(400), Some((500, 0)));
    }

    #[test]
    fn window_counts_by_due_time() {
        assert!(!in_window(99, 100, 200));
        assert!(in_window(100, 100, 200));
        assert!(in_window(199, 100, 200));
        assert!(!in_window(200, 100, 200));
    }
}
