//! The merge of several searches' top-k lists on one device: what a sharded search runs where
//! its shards' devices can copy into one another (`crate::multi::sharded`), instead of bringing
//! every shard's lists to the host and merging them there.
//!
//! Each member store writes its lists into a [`MergeBuffer`] on the merging device
//! ([`super::RowStore::knn_into`], through a peer copy where the member is on another device),
//! and [`MergeBuffer::merge`] keeps the `k` best of each query there: only the merged lists
//! come back. The order between equal distances of different lists is the storage's write
//! order, which only the host knows (`crate::multi::merge`): a query whose pick ties another
//! list's head is reported in [`Merged::tied`] with every list's entries, for the host to merge.

use crate::error::Result;

/// A buffer on one device for the top-k lists of several searches of one batch, and their merge
/// there. Made by [`super::RowStore::merge_buffer`]; which stores can write into it is
/// [`super::RowStore::can_write_into`]'s answer.
pub trait MergeBuffer: Send + Sync + std::fmt::Debug {
    /// The buffer as [`std::any::Any`]: the backend that made it finds its own type.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Queries of the batch.
    fn queries(&self) -> usize;
    /// Lists the buffer holds (one per member store).
    fn lists(&self) -> usize;
    /// Records that list `list` holds `width` entries per query (at most the buffer's width; 0
    /// for a member with nothing to return), before any of its searches writes into it.
    fn set_width(&self, list: usize, width: usize) -> Result<()>;
    /// List `list`'s width as [`MergeBuffer::set_width`] recorded it.
    fn width(&self, list: usize) -> Option<usize>;
    /// The `min(k, sum of widths)` best of each query over every list (`k` as the buffer was
    /// made), by distance, then list, then slot; every list's width must be set and all its
    /// queries written.
    fn merge(&self) -> Result<Merged>;
}

/// What [`MergeBuffer::merge`] brings back: `queries x k` picks, row-major.
#[derive(Debug, Clone, Default)]
pub struct Merged {
    /// Entries per query.
    pub k: usize,
    /// The list each pick came from.
    pub lists: Vec<u32>,
    /// Each pick's slot in its list's store.
    pub slots: Vec<u32>,
    /// Each pick's distance.
    pub distances: Vec<f64>,
    /// Queries whose picks met an equal distance in another list: the host merges these from
    /// [`Merged::sources`] (their picks here may be in the wrong order among the ties).
    pub tied: Vec<usize>,
    /// Every list's entries (`queries x width`, row-major), present when some query tied.
    pub sources: Vec<SourceList>,
}

/// One list's entries as written into a [`MergeBuffer`].
#[derive(Debug, Clone, Default)]
pub struct SourceList {
    /// Entries per query.
    pub width: usize,
    /// Slots, `queries x width`.
    pub slots: Vec<u32>,
    /// Distances, `queries x width`.
    pub distances: Vec<f64>,
}

impl SourceList {
    /// Query `q`'s entries as neighbours.
    pub fn of(&self, q: usize) -> Vec<super::Neighbor> {
        let range = q * self.width..(q + 1) * self.width;
        self.slots[range.clone()]
            .iter()
            .zip(&self.distances[range])
            .map(|(&slot, &distance)| super::Neighbor { slot: slot as usize, distance })
            .collect()
    }
}
