//! mcrouter's `WeightedCh3`: Ch3, then a weighted coin per try. Each server has a weight
//! in [0, 1]; a try picks `furc(cur, n)` and keeps it when SpookyHash32 of `cur` falls
//! under the weight's share of 2^32. Otherwise `cur` becomes the routing key followed by
//! the try number's decimal digits reversed (`0`..`9`, `01`, `11`, ...), up to 32 tries;
//! after the last, its index stands even if that server's weight is 0.
//! Lowering one server's weight only moves keys off that server.
//! Pinned by `tests/golden/mcrouter/mcrouter-wch3.tsv` and `mcrouter-spooky32.tsv`.
use smallvec::SmallVec;

use super::member::Distribution;
use crate::mcrouter_hash::{furc, spooky32};

const WCH3_TRIES: u32 = 32;
const WCH3_SPOOKY_SEED: u32 = 0xFACE_2014;
/// mcrouter's weight for a server beyond the end of a too-short `weights` list.
pub const WCH3_MISSING_WEIGHT: f64 = 0.5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WeightedCh3 {
    /// Per member: `weight * (2^32 - 1)` truncated, the bound a try's spooky hash must stay
    /// strictly below.
    thresholds: Vec<u64>,
}

impl WeightedCh3 {
    /// `weights` are the members' weights in member order; mcrouter's rules for a list of
    /// the wrong length (extra ignored, missing = 0.5) are applied by the caller.
    pub(crate) fn build(weights: impl Iterator<Item = f64>) -> WeightedCh3 {
        WeightedCh3 {
            // `as` saturates: NaN gives 0 and out-of-range values clamp (validation
            // rejects both; this keeps the arithmetic total).
            thresholds: weights.map(|w| (w * 4_294_967_295.0) as u64).collect(),
        }
    }
}

impl Distribution for WeightedCh3 {
    fn pick(&self, routing_key: &[u8]) -> usize {
        let n = u32::try_from(self.thresholds.len()).unwrap_or(u32::MAX);
        // Keys are at most 250 bytes (memcached's limit) plus two suffix digits: the
        // buffer stays on the stack.
        let mut cur: SmallVec<[u8; 256]> = SmallVec::from_slice(routing_key);
        let mut index = 0;
        for attempt in 0..WCH3_TRIES {
            index = furc(&cur, n) as usize;
            let coin = u64::from(spooky32(&cur, WCH3_SPOOKY_SEED));
            if self.thresholds.get(index).is_some_and(|&w| coin < w) {
                return index;
            }
            cur.truncate(routing_key.len());
            push_reversed_decimal(&mut cur, attempt);
        }
        index
    }
}

/// Appends `n`'s decimal digits, least significant first (12 -> "21").
fn push_reversed_decimal(out: &mut SmallVec<[u8; 256]>, mut n: u32) {
    loop {
        out.push(b'0' + (n % 10) as u8);
        n /= 10;
        if n == 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_examples_from_the_description() {
        let w = |ws: &[f64]| WeightedCh3::build(ws.iter().copied());
        assert_eq!(w(&[1.0, 0.5, 1.0]).pick(b"k6"), 0);
        assert_eq!(w(&[0.05; 4]).pick(b"k6"), 0);
        // All weights 0: the last try hashes `K ++ "03"`.
        assert_eq!(w(&[0.0; 3]).pick(b"abc"), furc(b"abc03", 3) as usize);
        assert_eq!(w(&[0.0; 100]).pick(b"sample"), 59);
        assert_eq!(w(&[0.0; 100]).pick(b""), 45);
    }

    #[test]
    fn suffixes_are_reversed_decimals() {
        let mut v = SmallVec::new();
        push_reversed_decimal(&mut v, 12);
        push_reversed_decimal(&mut v, 0);
        push_reversed_decimal(&mut v, 30);
        assert_eq!(&v[..], b"21003");
    }
}
