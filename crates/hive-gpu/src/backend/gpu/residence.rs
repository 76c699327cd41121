//! Where a CUDA/ROCm collection's rows live: in device memory ([`GpuRows`]) while they fit,
//! else in page-locked host memory, streamed through the device for each search
//! ([`HostRows`]). A collection starts on the device and moves to the host the first time its
//! rows would not fit there (the device is out of memory, or `Tuning::device_rows_bytes` is
//! reached), so adding rows fails with `VramLimitExceeded` only when the host cannot hold them
//! either. Emptied by `clear`, it starts on the device again.

use crate::backend::{Candidates, ListProbes, MergeBuffer, Neighbor, RowStore};
use crate::error::{HiveGpuError, Result};
use crate::slots::SlotSet;
use crate::types::{GpuDistanceMetric, StoragePrecision};

use super::driver::Driver;
use super::rows::GpuRows;
use super::streamed::HostRows;

/// A collection's rows on a CUDA/ROCm device or streamed from the host (see the module
/// documentation).
#[derive(Debug)]
pub(crate) enum EngineRows<D: Driver> {
    /// Every row in device memory.
    Device(GpuRows<D>),
    /// Rows in page-locked host memory, streamed through the device.
    Host(HostRows<D>),
}

/// `$body` with `$rows` bound to whichever store holds the rows.
macro_rules! on_rows {
    ($self:expr, $rows:ident => $body:expr) => {
        match $self {
            EngineRows::Device($rows) => $body,
            EngineRows::Host($rows) => $body,
        }
    };
}

impl<D: Driver> EngineRows<D> {
    /// Whole rows of `values` (0 when they are not whole rows: the store's own check reports
    /// that).
    fn rows_in(&self, values: usize) -> usize {
        let dim = match self {
            Self::Device(rows) => rows.dim,
            Self::Host(rows) => rows.dim(),
        };
        if values.is_multiple_of(dim) { values / dim } else { 0 }
    }
}

impl<D: Driver> RowStore for EngineRows<D> {
    fn len(&self) -> usize {
        on_rows!(self, rows => rows.len())
    }

    fn finer_pieces_when_few_rows(&self) -> bool {
        // Streamed rows are searched in one piece per member anyway.
        matches!(self, Self::Device(_))
    }

    fn reserve(&mut self, additional: usize) -> Result<()> {
        let Self::Device(rows) = self else {
            return on_rows!(self, rows => rows.reserve(additional));
        };
        match rows.reserve(additional) {
            Err(full @ HiveGpuError::VramLimitExceeded { .. }) => {
                match HostRows::spilled_from(rows, additional) {
                    Ok(host) => {
                        *self = Self::Host(host);
                        Ok(())
                    }
                    // The host cannot hold them either: the device's refusal is the answer, and the
                    // rows stay where they were.
                    Err(_) => Err(full),
                }
            }
            other => other,
        }
    }

    fn append(&mut self, rows: &[f32]) -> Result<()> {
        // Room first, so that rows that outgrow the device move to the host before they land.
        self.reserve(self.rows_in(rows.len()))?;
        on_rows!(self, store => store.append(rows))
    }

    fn append_stored(&mut self, bytes: &[u8], precision: StoragePrecision, dim: usize) -> Result<()> {
        let row_bytes = dim * precision.element_bytes();
        if row_bytes > 0 && bytes.len().is_multiple_of(row_bytes) {
            self.reserve(bytes.len() / row_bytes)?;
        }
        on_rows!(self, store => store.append_stored(bytes, precision, dim))
    }

    fn read_stored(
        &self,
        start: usize,
        count: usize,
        precision: StoragePrecision,
        out: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        on_rows!(self, rows => rows.read_stored(start, count, precision, out))
    }

    fn truncate(&mut self, len: usize) {
        on_rows!(self, rows => rows.truncate(len))
    }

    fn tombstone(&mut self, slots: &[usize]) {
        on_rows!(self, rows => rows.tombstone(slots))
    }

    fn compact(&mut self, keep: &[usize]) -> Result<()> {
        on_rows!(self, rows => rows.compact(keep))
    }

    fn clear(&mut self) {
        if let Self::Host(host) = self
            && let Ok(empty) = host.empty_on_device()
        {
            *self = Self::Device(empty);
            return;
        }
        on_rows!(self, rows => rows.clear())
    }

    fn read_row(&self, slot: usize) -> Result<Vec<f32>> {
        on_rows!(self, rows => rows.read_row(slot))
    }

    fn memory_bytes(&self) -> usize {
        on_rows!(self, rows => rows.memory_bytes())
    }

    fn streamed(&self) -> bool {
        matches!(self, Self::Host(_))
    }

    fn knn(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        on_rows!(self, rows => rows.knn(queries, k, metric, allowed))
    }

    fn nearest_rows(&self, points: &[f32]) -> Result<Vec<usize>> {
        on_rows!(self, rows => rows.nearest_rows(points))
    }

    fn gather(&self, slots: &[usize]) -> Result<Vec<f32>> {
        on_rows!(self, rows => rows.gather(slots))
    }

    fn refine(
        &self,
        queries: &[f32],
        candidates: &Candidates,
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        on_rows!(self, rows => rows.refine(queries, candidates, k, metric))
    }

    fn scan_lists(
        &self,
        queries: &[f32],
        probes: &ListProbes<'_>,
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        on_rows!(self, rows => rows.scan_lists(queries, probes, k, metric, allowed))
    }

    fn scan_codes(&self, scan: &crate::backend::CodeScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        on_rows!(self, rows => rows.scan_codes(scan, k))
    }

    fn scan_bits(&self, scan: &crate::backend::BitScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        on_rows!(self, rows => rows.scan_bits(scan, k))
    }

    fn scan_pq(&self, scan: &crate::backend::PqScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        on_rows!(self, rows => rows.scan_pq(scan, k))
    }

    fn scan_and_refine(
        &self,
        scan: crate::backend::QuantizedScan<'_>,
        wanted: usize,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        on_rows!(self, rows => rows.scan_and_refine(scan, wanted, queries, k, metric))
    }

    fn select_k(&self, scores: &[f32], width: usize, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        on_rows!(self, rows => rows.select_k(scores, width, k))
    }

    fn merge_buffer(
        &self,
        queries: usize,
        lists: usize,
        width: usize,
        k: usize,
    ) -> Result<Option<Box<dyn MergeBuffer>>> {
        on_rows!(self, rows => rows.merge_buffer(queries, lists, width, k))
    }

    fn can_write_into(&self, buffer: &dyn MergeBuffer) -> bool {
        on_rows!(self, rows => rows.can_write_into(buffer))
    }

    fn knn_into(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
        buffer: &dyn MergeBuffer,
        list: usize,
        first_query: usize,
    ) -> Result<()> {
        on_rows!(self, rows => rows.knn_into(queries, k, metric, allowed, buffer, list, first_query))
    }

    fn release_scratch(&self) {
        on_rows!(self, rows => rows.release_scratch())
    }

    fn release_filter_copies(&self, filter: u64) {
        on_rows!(self, rows => rows.release_filter_copies(filter))
    }
}
