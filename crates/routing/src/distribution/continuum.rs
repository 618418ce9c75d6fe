//! The sorted point circle shared by `ketama` and `ring`: a key's hash goes to the first
//! point at or above it, wrapping past the last point to the first.

/// (point, member position), sorted by point; equal points keep insertion order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Continuum {
    pub(crate) points: Vec<(u32, u32)>,
    /// `starts[b]`: the first point at or above `b << shift` (the top bits of a hash pick
    /// its bucket), so a lookup searches only the points of one bucket (about one) instead
    /// of the whole circle: a 4-server ketama pool has 640 points, a binary search ten
    /// dependent steps per key. One more entry than buckets: the end of the last.
    starts: Box<[u32]>,
    shift: u32,
}

/// At most 2^16 buckets (256 KiB of index for a circle of 65,536 points or more).
const MAX_BUCKET_BITS: u32 = 16;

impl Continuum {
    /// Sorts `points` stably by point. twemproxy sorts with glibc qsort, a stable merge
    /// sort for arrays this size, so equal points keep insertion (server) order and lookup
    /// picks the first of them; a stable sort does the same.
    pub(crate) fn new(mut points: Vec<(u32, u32)>) -> Continuum {
        points.sort_by_key(|&(point, _)| point);
        // About one point per bucket.
        let bits = (points.len().max(1).next_power_of_two().trailing_zeros()).min(MAX_BUCKET_BITS);
        let shift = 32 - bits;
        let buckets = 1usize << bits;
        let mut starts = Vec::with_capacity(buckets + 1);
        let mut at = 0usize;
        for bucket in 0..buckets {
            let low = (bucket as u64) << shift;
            while at < points.len() && u64::from(points[at].0) < low {
                at += 1;
            }
            starts.push(at as u32);
        }
        starts.push(points.len() as u32);
        Continuum {
            points,
            starts: starts.into_boxed_slice(),
            shift,
        }
    }

    /// Member owning `hash`: first point >= hash, wrapping. An empty circle (no weight
    /// anywhere; validation prevents it) answers member 0 rather than panicking.
    #[inline]
    pub(crate) fn lookup(&self, hash: u32) -> usize {
        // The first point >= hash is in hash's bucket, or is the next bucket's first.
        // (`shift` is 32 for a circle of at most one point: `checked_shr` gives bucket 0.)
        let bucket = hash.checked_shr(self.shift).unwrap_or(0) as usize;
        let (from, to) = match (self.starts.get(bucket), self.starts.get(bucket + 1)) {
            (Some(&from), Some(&to)) => (from as usize, to as usize),
            _ => (0, self.points.len()),
        };
        let window = self.points.get(from..to).unwrap_or_default();
        let i = from + window.partition_point(|&(p, _)| p < hash);
        match self.points.get(i).or_else(|| self.points.first()) {
            Some(&(_, member)) => member as usize,
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucket index answers exactly as a search over the whole circle does.
    #[test]
    fn bucketed_lookup_matches_a_full_search() {
        let full = |c: &Continuum, hash: u32| {
            let i = c.points.partition_point(|&(p, _)| p < hash);
            c.points
                .get(i)
                .or_else(|| c.points.first())
                .map_or(0, |&(_, m)| m as usize)
        };
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for size in [0usize, 1, 2, 3, 7, 640, 1000, 70_000] {
            let mut points: Vec<(u32, u32)> = (0..size).map(|i| (next(), i as u32 % 5)).collect();
            // Edges and duplicates: the first and last hash, equal points of two members.
            if size >= 3 {
                points[0].0 = 0;
                points[1].0 = u32::MAX;
                points[2].0 = points[size / 2].0;
            }
            let c = Continuum::new(points);
            let probes = (0..2000)
                .map(|_| next())
                .chain([0, 1, u32::MAX, u32::MAX - 1]);
            for hash in probes.chain(c.points.iter().flat_map(|&(p, _)| [p, p.wrapping_add(1)])) {
                assert_eq!(c.lookup(hash), full(&c, hash), "size {size}, hash {hash}");
            }
        }
    }
}
