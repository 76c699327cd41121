//! [`SearchResults`]: a batch's neighbours in flat arrays (slots, ids, scores), one row per
//! query, the shape a Python binding or a server hands out without a structure per neighbour.

use std::sync::Arc;

use crate::payload::Payload;
use crate::types::{GpuSearchResult, Metadata, SmolStr};

/// The results of a batch search: row `q` holds query `q`'s neighbours, best first, in the
/// flat arrays at `offsets[q]..offsets[q + 1]` (k entries, fewer when fewer vectors passed the
/// search's filter or the collection holds fewer). Nothing is allocated per neighbour: ids of up
/// to 23 bytes live inline in a [`SmolStr`], longer ones share the collection's allocation.
///
/// ```
/// use hive_gpu::{GpuBackendType, GpuContext, GpuDistanceMetric, GpuVector, SearchOptions};
///
/// let context = GpuContext::with_backend(GpuBackendType::Cpu, 0)?;
/// let storage = context.create_storage(2, GpuDistanceMetric::Euclidean)?;
/// storage.add_vectors(&[GpuVector::new("a", vec![0.0, 0.0]), GpuVector::new("b", vec![1.0, 0.0])])?;
/// let results = storage.search_batch_results(&[0.1, 0.0, 0.9, 0.0], 2, &SearchOptions::default())?;
/// assert_eq!(results.len(), 2);
/// assert_eq!(results.row(1).ids, ["b", "a"]);
/// assert_eq!(results.ids().len(), 4); // 2 queries x k = 2, flat
/// # Ok::<(), hive_gpu::HiveGpuError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SearchResults {
    offsets: Vec<usize>,
    slots: Vec<usize>,
    ids: Vec<SmolStr>,
    scores: Vec<f32>,
    /// Present when the search asked for payloads.
    metadata: Option<Vec<Arc<Metadata>>>,
    payloads: Option<Vec<Arc<Payload>>>,
}

/// One query's neighbours in a [`SearchResults`], best first.
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
    /// Empty results for `queries` queries of up to `k` neighbours, with room reserved.
    pub(crate) fn with_capacity(queries: usize, k: usize, with_payload: bool) -> Self {
        let entries = queries.saturating_mul(k);
        let mut offsets = Vec::with_capacity(queries + 1);
        offsets.push(0);
        Self {
            offsets,
            slots: Vec::with_capacity(entries),
            ids: Vec::with_capacity(entries),
            scores: Vec::with_capacity(entries),
            metadata: with_payload.then(|| Vec::with_capacity(entries)),
            payloads: with_payload.then(|| Vec::with_capacity(entries)),
        }
    }

    /// Appends one neighbour to the row being built.
    pub(crate) fn push(
        &mut self,
        slot: usize,
        id: &SmolStr,
        score: f32,
        payload: Option<(&Arc<Metadata>, &Arc<Payload>)>,
    ) {
        self.slots.push(slot);
        self.ids.push(id.clone());
        self.scores.push(score);
        if let (Some(metadata), Some(payloads), Some((m, p))) =
            (self.metadata.as_mut(), self.payloads.as_mut(), payload)
        {
            metadata.push(Arc::clone(m));
            payloads.push(Arc::clone(p));
        }
    }

    /// Ends the row being built.
    pub(crate) fn end_row(&mut self) {
        self.offsets.push(self.ids.len());
    }

    /// Appends the rows of `other` (a later piece of the same batch).
    pub(crate) fn append(&mut self, other: SearchResults) {
        let base = self.ids.len();
        self.offsets.extend(other.offsets.iter().skip(1).map(|o| o + base));
        self.slots.extend(other.slots);
        self.ids.extend(other.ids);
        self.scores.extend(other.scores);
        if let (Some(a), Some(b)) = (self.metadata.as_mut(), other.metadata) {
            a.extend(b);
        }
        if let (Some(a), Some(b)) = (self.payloads.as_mut(), other.payloads) {
            a.extend(b);
        }
    }

    /// Queries (rows).
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Query `q`'s neighbours. Panics when `q >= self.len()`, like slice indexing.
    pub fn row(&self, q: usize) -> ResultRow<'_> {
        let range = self.offsets[q]..self.offsets[q + 1];
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

    /// Where each row starts in the flat arrays, and where the last ends (`len() + 1` entries).
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Every neighbour's id, row after row.
    pub fn ids(&self) -> &[SmolStr] {
        &self.ids
    }

    /// Every neighbour's score, row after row.
    pub fn scores(&self) -> &[f32] {
        &self.scores
    }

    /// Every neighbour's slot, row after row.
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
