//! The inputs of the primitives every backend implements beside its fused k-NN
//! ([`RowStore::refine`], [`RowStore::select_k`], [`RowStore::gather`]), and the checks they
//! all start with, so that an invalid argument reads the same on every backend.
//!
//! [`RowStore::refine`]: super::RowStore::refine
//! [`RowStore::select_k`]: super::RowStore::select_k
//! [`RowStore::gather`]: super::RowStore::gather

use crate::error::{HiveGpuError, Result};
use crate::slots::SlotSet;

/// Each query's candidate slots, in one flat array: query `q`'s are
/// `slots[offsets[q]..offsets[q + 1]]`. What an approximate index (IVF lists, a graph's
/// visited set) hands to [`RowStore::refine`](super::RowStore::refine): lists of any length,
/// in any order, repeats allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidates {
    offsets: Vec<usize>,
    slots: Vec<usize>,
}

impl Default for Candidates {
    fn default() -> Self {
        Self::new()
    }
}

impl Candidates {
    /// No query yet.
    pub fn new() -> Self {
        Self { offsets: vec![0], slots: Vec::new() }
    }

    /// One list per query.
    pub fn from_lists<L: AsRef<[usize]>>(lists: &[L]) -> Self {
        let mut candidates = Self::new();
        for list in lists {
            candidates.push(list.as_ref());
        }
        candidates
    }

    /// Appends the next query's candidates.
    pub fn push(&mut self, slots: &[usize]) {
        self.slots.extend_from_slice(slots);
        self.offsets.push(self.slots.len());
    }

    /// Number of queries.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether no query has been added.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Query `q`'s candidates (empty past the last query).
    pub fn of(&self, q: usize) -> &[usize] {
        match (self.offsets.get(q), self.offsets.get(q + 1)) {
            (Some(&start), Some(&end)) => &self.slots[start..end],
            _ => &[],
        }
    }

    /// Candidates over all queries, repeats included.
    pub fn total(&self) -> usize {
        self.slots.len()
    }
}

/// The check [`RowStore::refine`](super::RowStore::refine) starts with on every backend:
/// whole `dim`-dimensional queries, one candidate list each, and k of at least 1. Returns the
/// number of queries.
pub(crate) fn check_refine(dim: usize, queries: &[f32], candidates: &Candidates, k: usize) -> Result<usize> {
    if k == 0 {
        return Err(HiveGpuError::InvalidArgument("refine needs k of at least 1".into()));
    }
    if !queries.len().is_multiple_of(dim) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "refine: {} values are not whole {dim}-dimensional queries",
            queries.len()
        )));
    }
    let nq = queries.len() / dim;
    if candidates.len() != nq {
        return Err(HiveGpuError::InvalidArgument(format!(
            "refine: {nq} queries but {} candidate lists",
            candidates.len()
        )));
    }
    Ok(nq)
}

/// Query `q`'s candidates that a refine scores: ascending, each once, removed slots dropped.
/// A slot at or past `len` is an error naming it and the query.
pub(crate) fn live_candidates(
    candidates: &Candidates,
    q: usize,
    len: usize,
    removed: &SlotSet,
) -> Result<Vec<usize>> {
    let mut live = Vec::with_capacity(candidates.of(q).len());
    for &slot in candidates.of(q) {
        if slot >= len {
            return Err(HiveGpuError::InvalidArgument(format!(
                "refine: candidate slot {slot} of query {q} is past the {len} stored rows"
            )));
        }
        if !removed.contains(slot) {
            live.push(slot);
        }
    }
    live.sort_unstable();
    live.dedup();
    Ok(live)
}

/// The check [`RowStore::select_k`](super::RowStore::select_k) starts with on every backend:
/// whole rows of `width` scores, none NaN, and k of at least 1. Returns the number of rows.
pub(crate) fn check_select(scores: &[f32], width: usize, k: usize) -> Result<usize> {
    if k == 0 || width == 0 {
        return Err(HiveGpuError::InvalidArgument(format!(
            "select_k needs k and a row width of at least 1 (k = {k}, width = {width})"
        )));
    }
    if !scores.len().is_multiple_of(width) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "select_k: {} scores are not whole rows of {width}",
            scores.len()
        )));
    }
    if let Some(at) = scores.iter().position(|s| s.is_nan()) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "select_k: score {} of row {} is NaN",
            at % width,
            at / width
        )));
    }
    Ok(scores.len() / width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_keep_their_boundaries_including_empty_ones() {
        let c = Candidates::from_lists(&[vec![3, 1], vec![], vec![7]]);
        assert_eq!((c.len(), c.total()), (3, 3));
        assert_eq!((c.of(0), c.of(1), c.of(2), c.of(3)), (&[3, 1][..], &[][..], &[7][..], &[][..]));
    }

    #[test]
    fn live_candidates_drop_repeats_and_removed_rows_and_name_a_bad_slot() {
        let removed = SlotSet::from_slots(10, [4]);
        let c = Candidates::from_lists(&[vec![9, 4, 2, 9, 0], vec![10]]);
        assert_eq!(live_candidates(&c, 0, 10, &removed).unwrap(), vec![0, 2, 9]);
        let e = live_candidates(&c, 1, 10, &removed).unwrap_err().to_string();
        assert!(e.contains("slot 10") && e.contains("query 1"), "{e}");
    }

    #[test]
    fn select_refuses_nan_and_ragged_rows() {
        assert!(check_select(&[1.0, f32::NAN], 2, 1).unwrap_err().to_string().contains("score 1 of row 0"));
        assert!(check_select(&[1.0, 2.0, 3.0], 2, 1).is_err());
        assert!(check_select(&[1.0, 2.0], 2, 0).is_err());
        assert_eq!(check_select(&[1.0, f32::INFINITY, 3.0, 4.0], 2, 5).unwrap(), 2);
    }
}
