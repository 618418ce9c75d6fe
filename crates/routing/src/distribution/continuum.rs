//! The sorted point circle shared by `ketama` and `ring`: a key's hash goes to the first
//! point at or above it, wrapping past the last point to the first.

/// (point, member position), sorted by point; equal points keep insertion order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Continuum {
    pub(crate) points: Vec<(u32, u32)>,
}

impl Continuum {
    /// Sorts `points` stably by point. twemproxy sorts with glibc qsort, a stable merge
    /// sort for arrays this size, so equal points keep insertion (server) order and lookup
    /// picks the first of them; a stable sort does the same.
    pub(crate) fn new(mut points: Vec<(u32, u32)>) -> Continuum {
        points.sort_by_key(|&(point, _)| point);
        Continuum { points }
    }

    /// Member owning `hash`: first point >= hash, wrapping. An empty circle (no weight
    /// anywhere; validation prevents it) answers member 0 rather than panicking.
    #[inline]
    pub(crate) fn lookup(&self, hash: u32) -> usize {
        let i = self.points.partition_point(|&(p, _)| p < hash);
        match self.points.get(i).or_else(|| self.points.first()) {
            Some(&(_, member)) => member as usize,
            None => 0,
        }
    }
}
