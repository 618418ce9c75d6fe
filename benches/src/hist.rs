//! A small HDR-style latency histogram: log-linear buckets, fixed memory, O(1) record.
//!
//! Values (nanoseconds) below 128 get one bucket each; above that every power of
//! two is split into 64 linear sub-buckets, so a reported quantile is within
//! 1/64 (~1.6%) of the true value. That is far below the run-to-run noise of
//! the end-to-end bench, and it keeps the load generator free of extra crates.

const SUB_BITS: u32 = 6; // 64 sub-buckets per power of two
const SUB: u64 = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB; // values below this are exact
const MAX_SHIFT: u32 = 40; // up to ~2^46 ns (~19 hours): anything above is clamped
const BUCKETS: usize = (LINEAR + SUB * MAX_SHIFT as u64) as usize;

#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros(); // >= SUB_BITS + 1
    let shift = (msb - SUB_BITS).min(MAX_SHIFT); // v >> shift lies in [SUB, 2*SUB)
    let sub = (v >> shift).min(2 * SUB - 1) - SUB;
    (LINEAR + (shift as u64 - 1) * SUB + sub) as usize
}

/// Midpoint of the values that fall into bucket `i`.
fn value_of(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let shift = (i - LINEAR) / SUB + 1;
    let sub = (i - LINEAR) % SUB;
    let low = (SUB + sub) << shift;
    low + (1 << shift) / 2
}

impl Histogram {
    pub fn record(&mut self, v: u64) {
        self.counts[index(v).min(BUCKETS - 1)] += 1;
        self.total += 1;
        self.sum += v as u128;
        self.max = self.max.max(v);
    }

    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
        self.sum += o.sum;
        self.max = self.max.max(o.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// Value at quantile `q` in [0, 1] (0 when empty), never above the recorded max.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return value_of(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_trip_within_precision() {
        for v in [
            0u64,
            1,
            127,
            128,
            129,
            1000,
            12_345,
            1_000_000,
            987_654_321,
            1 << 45,
        ] {
            let back = value_of(index(v));
            let err = (back as f64 - v as f64).abs() / (v.max(1) as f64);
            assert!(err <= 1.0 / 64.0, "v={v} back={back} err={err}");
        }
    }

    #[test]
    fn indices_are_monotonic() {
        let mut last = 0;
        for v in (0..2_000_000u64).step_by(7) {
            let i = index(v);
            assert!(i >= last);
            last = i;
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 / 5_000_000.0 - 1.0).abs() < 0.02, "{p50}");
        assert!((p99 / 9_900_000.0 - 1.0).abs() < 0.02, "{p99}");
        assert_eq!(h.count(), 10_000);
    }
}
