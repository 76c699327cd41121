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

    /// One list per query: the slots of each query's neighbours (what a coded scan
    /// nominates for [`super::RowStore::refine`]).
    pub fn from_nominees(nominees: &[Vec<super::Neighbor>]) -> Self {
        let mut candidates = Self::new();
        let mut slots = Vec::new();
        for found in nominees {
            slots.clear();
            slots.extend(found.iter().map(|n| n.slot));
            candidates.push(&slots);
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

/// Inverted lists and the ones each query of a batch scans: the input of
/// [`RowStore::scan_lists`](super::RowStore::scan_lists), what an IVF search hands on after
/// probing its centroids.
#[derive(Debug, Clone, Copy)]
pub struct ListProbes<'a> {
    /// List `l` holds the slots `lists[l]` (any order; a list's slots are distinct and no slot
    /// is in two lists).
    pub lists: &'a [Vec<u32>],
    /// Query `q` scans the lists `probes[q * nprobe..(q + 1) * nprobe]`, each once.
    pub probes: &'a [u32],
    /// Lists per query (at least 1).
    pub nprobe: usize,
    /// Names this state of `lists`: whoever owns them gives a new value (from
    /// [`ListProbes::next_generation`]) whenever they change, so a backend may keep its own
    /// copy of the lists (a GPU's in device memory) and reuse it while the value holds. 0
    /// means none: the lists are read afresh on every call.
    pub generation: u64,
}

impl ListProbes<'_> {
    /// A generation no other lists in this process have had (never 0).
    pub fn next_generation() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The lists query `q` scans.
    pub fn of(&self, q: usize) -> &[u32] {
        self.probes.get(q * self.nprobe..(q + 1) * self.nprobe).unwrap_or(&[])
    }
}

/// A batch's probes turned around: the queries that probe each list (ascending, by a counting
/// sort), which is how every host list scan reads each list once per batch.
pub(crate) struct ListAskers {
    /// The queries of list `l` are `askers[starts[l]..starts[l + 1]]`.
    starts: Vec<usize>,
    askers: Vec<u32>,
}

impl ListAskers {
    /// The askers of each of `lists` lists, from `nprobe` probes per query (every probe names
    /// a list below `lists`: the scans check that first).
    pub(crate) fn new(probes: &[u32], nprobe: usize, lists: usize) -> Self {
        let mut starts = vec![0usize; lists + 1];
        for &list in probes {
            starts[list as usize + 1] += 1;
        }
        for l in 0..lists {
            starts[l + 1] += starts[l];
        }
        let mut fill = starts.clone();
        let mut askers = vec![0u32; probes.len()];
        for (at, &list) in probes.iter().enumerate() {
            askers[fill[list as usize]] = (at / nprobe.max(1)) as u32;
            fill[list as usize] += 1;
        }
        Self { starts, askers }
    }

    /// The queries that probe list `l`, ascending.
    pub(crate) fn of(&self, l: usize) -> &[u32] {
        &self.askers[self.starts[l]..self.starts[l + 1]]
    }

    /// The lists some query probes and `rows(l)` finds rows in, the most work (rows times
    /// queries) first, so that the last tasks of a parallel scan to finish are short ones.
    pub(crate) fn by_work(&self, rows: impl Fn(usize) -> usize) -> Vec<usize> {
        let lists = self.starts.len() - 1;
        let mut order: Vec<usize> = (0..lists).filter(|&l| !self.of(l).is_empty() && rows(l) > 0).collect();
        order.sort_by_key(|&l| std::cmp::Reverse(rows(l) * self.of(l).len()));
        order
    }
}

/// The check of its queries' values that [`RowStore::knn`](super::RowStore::knn),
/// [`scan_lists`](super::RowStore::scan_lists) and [`refine`](super::RowStore::refine) (`what`)
/// make on every backend, every path: a NaN or infinite component has no distance to rank, so
/// the batch is refused, naming the first such query and component. (A collection's searches
/// refuse such queries before any backend sees them; this holds the backends' own contract,
/// which a fast path of theirs once broke by ranking NaN distances.) One pass over the values
/// without a branch each ([`crate::exact::all_finite`]).
pub(crate) fn check_finite_queries(what: &str, dim: usize, queries: &[f32]) -> Result<()> {
    if crate::exact::all_finite(queries) {
        return Ok(());
    }
    let at = queries.iter().position(|v| !v.is_finite()).unwrap_or(0);
    let dim = dim.max(1);
    Err(HiveGpuError::InvalidArgument(format!(
        "{what}: query {} has a non-finite value ({}) at component {}",
        at / dim,
        queries[at],
        at % dim
    )))
}

/// The check [`RowStore::scan_lists`](super::RowStore::scan_lists) starts with on every
/// backend: whole queries of finite values, `nprobe` lists each that exist, and k of at least
/// 1. Returns the number of queries.
pub(crate) fn check_scan(dim: usize, queries: &[f32], probes: &ListProbes<'_>, k: usize) -> Result<usize> {
    if k == 0 || probes.nprobe == 0 || !queries.len().is_multiple_of(dim) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "scan_lists needs k and nprobe of at least 1 (k = {k}, nprobe = {}) and whole \
             {dim}-dimensional queries ({} values)",
            probes.nprobe,
            queries.len()
        )));
    }
    let nq = queries.len() / dim;
    if probes.probes.len() != nq * probes.nprobe {
        return Err(HiveGpuError::InvalidArgument(format!(
            "scan_lists: {nq} queries of {} probes need {} list numbers, got {}",
            probes.nprobe,
            nq * probes.nprobe,
            probes.probes.len()
        )));
    }
    if let Some(at) = probes.probes.iter().position(|&l| l as usize >= probes.lists.len()) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "scan_lists: query {} probes list {}, past the {} lists",
            at / probes.nprobe,
            probes.probes[at],
            probes.lists.len()
        )));
    }
    check_finite_queries("scan_lists", dim, queries)?;
    Ok(nq)
}

/// Candidate slots per refine call of the default [`RowStore::scan_lists`]
/// (`super::scan_by_refine`): 128 MiB of them at most.
const SCAN_CANDIDATES: usize = 1 << 24;

/// The default [`RowStore::scan_lists`](super::RowStore::scan_lists): each query's list
/// members that `allowed` admits, handed to the store's `refine`, queries in groups whose
/// candidates stay bounded.
pub(crate) fn scan_by_refine<S: super::RowStore + ?Sized>(
    store: &S,
    queries: &[f32],
    probes: &ListProbes<'_>,
    k: usize,
    metric: crate::types::GpuDistanceMetric,
    allowed: Option<&SlotSet>,
) -> Result<Vec<Vec<super::Neighbor>>> {
    // The store's refine checks the queries' dimension; the batch's size comes from the probes.
    let nq = probes.probes.len().checked_div(probes.nprobe).unwrap_or(0);
    if nq == 0 && queries.is_empty() {
        return Ok(Vec::new());
    }
    if nq == 0 || queries.is_empty() || !queries.len().is_multiple_of(nq) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "scan_lists: {} values are not {nq} whole queries (probes {} lists each)",
            queries.len(),
            probes.nprobe
        )));
    }
    let dim = queries.len() / nq;
    let nq = check_scan(dim, queries, probes, k)?;
    let mut found = Vec::with_capacity(nq);
    let mut q = 0;
    while q < nq {
        let mut candidates = Candidates::new();
        let first = q;
        while q < nq && (q == first || candidates.total() < SCAN_CANDIDATES) {
            let mut members = Vec::new();
            for &list in probes.of(q) {
                let list = &probes.lists[list as usize];
                match allowed {
                    Some(allowed) => {
                        members.extend(list.iter().map(|&s| s as usize).filter(|&s| allowed.contains(s)))
                    }
                    None => members.extend(list.iter().map(|&s| s as usize)),
                }
            }
            candidates.push(&members);
            q += 1;
        }
        found.extend(store.refine(&queries[first * dim..q * dim], &candidates, k, metric)?);
    }
    Ok(found)
}

/// The check [`RowStore::refine`](super::RowStore::refine) starts with on every backend:
/// whole `dim`-dimensional queries of finite values, one candidate list each, and k of at least
/// 1. Returns the number of queries.
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
    check_finite_queries("refine", dim, queries)?;
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
