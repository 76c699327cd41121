//! [`SearchResults`]: a batch's neighbours in flat `nq x k` arrays (slots, ids, scores), the
//! shape a Python binding or a server hands out without a structure per neighbour. Each piece
//! of a batch writes its own rows in place, in parallel: no list per query, no concatenation.

use std::sync::Arc;

use crate::payload::Payload;
use crate::types::{GpuSearchResult, Metadata, SmolStr};

/// The results of a batch search: `len()` rows of `k()` entries each in flat arrays (row `q`
/// at `q * k..(q + 1) * k`), the layout of FAISS's and numpy's `nq x k` result arrays. Row
/// `q` holds query `q`'s neighbours, best first, in its first `lens()[q]` entries: k, or fewer
/// when fewer vectors passed the search's filter. The rest of a row is padding: an empty id, a
/// NaN score and slot `usize::MAX`. Nothing is allocated per neighbour: ids of up to 23 bytes
/// live inline in a [`SmolStr`], longer ones share the collection's allocation.
///
/// ```
/// use hive_gpu::{GpuBackendType, GpuContext, GpuDistanceMetric, GpuVector, SearchOptions};
///
/// let context = GpuContext::with_backend(GpuBackendType::Cpu, 0)?;
/// let storage = context.create_storage(2, GpuDistanceMetric::Euclidean)?;
/// storage.add_vectors(&[GpuVector::new("a", vec![0.0, 0.0]), GpuVector::new("b", vec![1.0, 0.0])])?;
/// let results = storage.search_batch_results(&[0.1, 0.0, 0.9, 0.0], 2, &SearchOptions::default())?;
/// assert_eq!((results.len(), results.k()), (2, 2));
/// assert_eq!(results.row(1).ids, ["b", "a"]);
/// assert_eq!(results.ids().len(), 4); // 2 queries x k = 2, flat
/// # Ok::<(), hive_gpu::HiveGpuError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SearchResults {
    k: usize,
    lens: Vec<usize>,
    slots: Vec<usize>,
    ids: Vec<SmolStr>,
    scores: Vec<f32>,
    /// Present when the search asked for payloads.
    metadata: Option<Vec<Arc<Metadata>>>,
    payloads: Option<Vec<Arc<Payload>>>,
}

/// One query's neighbours in a [`SearchResults`], best first (padding left out).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResultRow<'a> {
    /// The neighbours' ids.
    pub ids: &'a [SmolStr],
    /// Their scores (see [`GpuSearchResult`] for the meaning per metric).
    pub scores: &'a [f32],
    /// Their slots at the time of the search.
    pub slots: &'a [usize],
    /// Their string payloads, when the search asked for payloads.
    pub metadata: Option<&'a [Arc<Metadata>]>,
    /// Their typed payloads, when the search asked for payloads.
    pub payloads: Option<&'a [Arc<Payload>]>,
}

/// The part of a [`SearchResults`] one piece of a batch writes: whole rows, disjoint from
/// every other piece's.
pub(crate) struct RowsMut<'a> {
    pub(crate) k: usize,
    pub(crate) lens: &'a mut [usize],
    pub(crate) slots: &'a mut [usize],
    pub(crate) ids: &'a mut [SmolStr],
    pub(crate) scores: &'a mut [f32],
    pub(crate) metadata: Option<&'a mut [Arc<Metadata>]>,
    pub(crate) payloads: Option<&'a mut [Arc<Payload>]>,
}

impl ResultRow<'_> {
    /// Neighbours in the row.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the row holds no neighbour.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

impl SearchResults {
    /// All-padding results of `queries` rows of `k` entries, filled in parallel on the library's
    /// pool when they are many (callers hold a collection's lock: never on the caller's pool, see
    /// `crate::exec`), on this thread otherwise (a rayon call for one query's row cost more than
    /// the row).
    pub(crate) fn padded(queries: usize, k: usize, with_payload: bool) -> Self {
        let entries = queries * k;
        if entries >= crate::backend::PARALLEL_RESULTS
            && let Ok(out) = crate::exec::run(|| Self::padded_in_parallel(queries, k, with_payload))
        {
            return out;
        }
        let mut out = Self { k, lens: vec![0; queries], ..Self::default() };
        out.slots = vec![usize::MAX; entries];
        out.ids = vec![SmolStr::default(); entries];
        out.scores = vec![f32::NAN; entries];
        if with_payload {
            out.metadata = Some(vec![Arc::<Metadata>::default(); entries]);
            out.payloads = Some(vec![Arc::<Payload>::default(); entries]);
        }
        out
    }

    /// Makes these results `queries` rows of `k` entries for a search about to write every
    /// entry of every row (`index::flat::fill_columns` writes the padding too): arrays with
    /// room enough are resized in place, so that a caller searching batch after batch into the
    /// same results fills no fresh memory (a fresh batch of 10,000 x 100 faults in 36 MB page
    /// by page before its first search: 1.8-23 ms on the development VM, docs/PERFORMANCE.md,
    /// "The few-rows pass's chain of additions"). Arrays without the room are made afresh and
    /// padded. Until the search writes them, rows hold whatever they held.
    pub(crate) fn reuse_for(&mut self, queries: usize, k: usize, with_payload: bool) {
        let entries = queries * k;
        let room = self.slots.capacity() >= entries
            && self.ids.capacity() >= entries
            && self.scores.capacity() >= entries
            && (!with_payload
                || (self.metadata.as_ref().is_some_and(|m| m.capacity() >= entries)
                    && self.payloads.as_ref().is_some_and(|p| p.capacity() >= entries)));
        if !room {
            *self = Self::padded(queries, k, with_payload);
            return;
        }
        self.k = k;
        self.lens.clear();
        self.lens.resize(queries, 0);
        self.slots.resize(entries, usize::MAX);
        self.ids.resize(entries, SmolStr::default());
        self.scores.resize(entries, f32::NAN);
        if with_payload {
            if let Some(m) = self.metadata.as_mut() {
                m.resize(entries, Arc::default());
            }
            if let Some(p) = self.payloads.as_mut() {
                p.resize(entries, Arc::default());
            }
        } else {
            (self.metadata, self.payloads) = (None, None);
        }
    }

    fn padded_in_parallel(queries: usize, k: usize, with_payload: bool) -> Self {
        use rayon::prelude::*;
        let entries = queries * k;
        let mut out = Self { k, lens: vec![0; queries], ..Self::default() };
        out.slots.par_extend((0..entries).into_par_iter().map(|_| usize::MAX));
        out.ids.par_extend((0..entries).into_par_iter().map(|_| SmolStr::default()));
        out.scores.par_extend((0..entries).into_par_iter().map(|_| f32::NAN));
        if with_payload {
            let (metadata, payloads) = (Arc::<Metadata>::default(), Arc::<Payload>::default());
            let mut m = Vec::new();
            m.par_extend((0..entries).into_par_iter().map(|_| Arc::clone(&metadata)));
            let mut p = Vec::new();
            p.par_extend((0..entries).into_par_iter().map(|_| Arc::clone(&payloads)));
            (out.metadata, out.payloads) = (Some(m), Some(p));
        }
        out
    }

    /// The rows of each piece, for the pieces' writers: `sizes` are the pieces' row counts, in
    /// order, summing to `len()`.
    pub(crate) fn split_rows(&mut self, sizes: &[usize]) -> Vec<RowsMut<'_>> {
        let k = self.k;
        let mut lens = self.lens.as_mut_slice();
        let mut slots = self.slots.as_mut_slice();
        let mut ids = self.ids.as_mut_slice();
        let mut scores = self.scores.as_mut_slice();
        let mut metadata = self.metadata.as_deref_mut();
        let mut payloads = self.payloads.as_deref_mut();
        let mut out = Vec::with_capacity(sizes.len());
        for &rows in sizes {
            let (l, rest) = std::mem::take(&mut lens).split_at_mut(rows);
            lens = rest;
            let (s, rest) = std::mem::take(&mut slots).split_at_mut(rows * k);
            slots = rest;
            let (i, rest) = std::mem::take(&mut ids).split_at_mut(rows * k);
            ids = rest;
            let (c, rest) = std::mem::take(&mut scores).split_at_mut(rows * k);
            scores = rest;
            let m = metadata.take().map(|m| {
                let (head, rest) = m.split_at_mut(rows * k);
                metadata = Some(rest);
                head
            });
            let p = payloads.take().map(|p| {
                let (head, rest) = p.split_at_mut(rows * k);
                payloads = Some(rest);
                head
            });
            out.push(RowsMut { k, lens: l, slots: s, ids: i, scores: c, metadata: m, payloads: p });
        }
        out
    }

    /// Queries (rows).
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Entries per row (the search's k, or the number of vectors searched when that is
    /// smaller).
    pub fn k(&self) -> usize {
        self.k
    }

    /// How many of each row's entries are neighbours (the rest is padding).
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Query `q`'s neighbours. Panics when `q >= self.len()`, like slice indexing.
    pub fn row(&self, q: usize) -> ResultRow<'_> {
        let range = q * self.k..q * self.k + self.lens[q];
        ResultRow {
            ids: &self.ids[range.clone()],
            scores: &self.scores[range.clone()],
            slots: &self.slots[range.clone()],
            metadata: self.metadata.as_ref().map(|m| &m[range.clone()]),
            payloads: self.payloads.as_ref().map(|p| &p[range]),
        }
    }

    /// Every row in query order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = ResultRow<'_>> + '_ {
        (0..self.len()).map(|q| self.row(q))
    }

    /// Every entry's id, `len() x k()` row-major, padding included.
    pub fn ids(&self) -> &[SmolStr] {
        &self.ids
    }

    /// Every entry's score, `len() x k()` row-major (NaN for padding).
    pub fn scores(&self) -> &[f32] {
        &self.scores
    }

    /// Every entry's slot, `len() x k()` row-major (`usize::MAX` for padding).
    pub fn slots(&self) -> &[usize] {
        &self.slots
    }

    /// The per-query lists of [`GpuSearchResult`]s that `search_batch` returns.
    pub fn to_lists(&self) -> Vec<Vec<GpuSearchResult>> {
        self.rows()
            .map(|row| {
                (0..row.len())
                    .map(|i| GpuSearchResult {
                        id: row.ids[i].clone(),
                        score: row.scores[i],
                        index: row.slots[i],
                        metadata: row.metadata.map(|m| Arc::clone(&m[i])),
                        payload: row.payloads.map(|p| Arc::clone(&p[i])),
                    })
                    .collect()
            })
            .collect()
    }
}
