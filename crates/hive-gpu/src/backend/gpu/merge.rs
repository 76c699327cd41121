//! The engine's [`MergeBuffer`]: the lists of a sharded search's members on one device, copied
//! there from each member's own device (a peer copy) or from the same device, then merged by
//! `hg_merge_lists` (`kernels/merge.cu`).
//!
//! Device layout (one scratch allocation, `L` lists of `Q` queries, capacity `W` per query):
//! list slots `L x Q x W` u32 (list `s` from entry `s Q W`, its `Q x width` entries side by
//! side), list distances `L x Q x W` f64 the same way, then `L` u64 entry offsets and `L` u32
//! widths, then the merged lists, slots and distances (`Q x k`, `k <= L W`) and one tie flag
//! per query.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::Device;
use super::abi::{Launch, MergeLists};
use super::driver::{DevicePtr, Driver};
use super::kernels::{BLOCK, MERGE_LISTS};
use super::memory::{Scratch, Staging};
use super::search::{Outputs, align};
use crate::backend::{MergeBuffer, Merged, Neighbor, SourceList};
use crate::error::{HiveGpuError, Result};

/// A width not yet recorded.
const UNSET: usize = usize::MAX;

/// The stream and memory of one merge, kept by the device for the next (a merge per sharded
/// search would otherwise allocate device and page-locked memory each time).
#[derive(Debug)]
pub(crate) struct MergeScratch<D: Driver> {
    stream: D::Stream,
    memory: Scratch<D>,
    staging: Staging<D>,
}

/// Byte offsets of [`GpuMergeBuffer`]'s regions from its base.
#[derive(Debug, Clone, Copy)]
struct Layout {
    dist: usize,
    descriptors: usize,
    out_lists: usize,
    out_slots: usize,
    out_dist: usize,
    tied: usize,
    end: usize,
}

impl Layout {
    fn of(queries: usize, lists: usize, width: usize, k: usize) -> Result<Self> {
        let entries = queries
            .checked_mul(lists)
            .and_then(|n| n.checked_mul(width))
            .filter(|&n| n <= u32::MAX as usize && k <= lists * width)
            .ok_or_else(|| {
                HiveGpuError::InvalidArgument(format!("{queries} queries x {lists} lists x {width}, k {k}"))
            })?;
        let picks = queries * k;
        let dist = align(entries * 4);
        let descriptors = dist + align(entries * 8);
        let out_lists = descriptors + align(lists * 12);
        let out_slots = out_lists + align(picks * 4);
        let out_dist = out_slots + align(picks * 4);
        let tied = out_dist + align(picks * 8);
        Ok(Self { dist, descriptors, out_lists, out_slots, out_dist, tied, end: tied + align(queries * 4) })
    }
}

/// Lists of one batch on one device, and their merge (see the module docs).
#[derive(Debug)]
pub(crate) struct GpuMergeBuffer<D: Driver> {
    pub(super) device: Arc<Device<D>>,
    queries: usize,
    lists: usize,
    /// Capacity per query of each list.
    width: usize,
    /// Most picks per query.
    k: usize,
    base: DevicePtr,
    layout: Layout,
    widths: Vec<AtomicUsize>,
    /// Taken from the device's pool for the buffer's life, given back on drop unless a copy
    /// into it or the merge failed (work may still be queued on that memory and stream).
    scratch: Mutex<Option<MergeScratch<D>>>,
    failed: AtomicBool,
}

impl<D: Driver> GpuMergeBuffer<D> {
    /// A buffer on `device` for `lists` lists of `queries` queries, up to `width` entries each,
    /// merged into up to `k` per query.
    pub(super) fn new(
        device: &Arc<Device<D>>,
        queries: usize,
        lists: usize,
        width: usize,
        k: usize,
    ) -> Result<Self> {
        if lists == 0 || lists > MERGE_LISTS || queries == 0 || width == 0 || k == 0 {
            return Err(HiveGpuError::InvalidArgument(format!(
                "a device merge takes 1 to {MERGE_LISTS} lists of at least one query and one entry \
                 ({lists} lists, {queries} queries, width {width}, k = {k})"
            )));
        }
        let layout = Layout::of(queries, lists, width, k)?;
        let reused =
            device.merges.lock().map_err(|_| HiveGpuError::Internal("merge pool poisoned".into()))?.pop();
        let mut scratch = match reused {
            Some(scratch) => scratch,
            None => MergeScratch {
                stream: device.driver.stream(false)?,
                memory: Scratch::new(),
                staging: Staging::new(),
            },
        };
        let base = scratch.memory.get(&device.driver, layout.end)?;
        Ok(Self {
            device: device.clone(),
            queries,
            lists,
            width,
            k,
            base,
            layout,
            widths: (0..lists).map(|_| AtomicUsize::new(UNSET)).collect(),
            scratch: Mutex::new(Some(scratch)),
            failed: AtomicBool::new(false),
        })
    }

    /// Device addresses of list `list`'s slots and distances for queries from `first_query`.
    fn list_at(&self, list: usize, first_query: usize, width: usize) -> (DevicePtr, DevicePtr) {
        let entry = (list * self.queries * self.width + first_query * width) as u64;
        (self.base + entry * 4, self.base + self.layout.dist as u64 + entry * 8)
    }

    /// Queues, on `source`'s `stream`, the copy of `count` queries' results (slots and
    /// distances as [`Outputs`] lays them out, `width` per query) into list `list` from query
    /// `first_query`: a plain copy from this buffer's device, a peer copy from another.
    pub(super) fn write_from(
        &self,
        source: &Device<D>,
        stream: &D::Stream,
        at: (usize, usize),
        width: usize,
        outputs: &Outputs,
        count: usize,
    ) -> Result<()> {
        let (list, first_query) = at;
        if list >= self.lists || self.width(list) != Some(width) || first_query + count > self.queries {
            return Err(HiveGpuError::Internal(format!(
                "list {list} of {}, queries {first_query}..{} of {}, width {width} (recorded {:?})",
                self.lists,
                first_query + count,
                self.queries,
                self.width(list)
            )));
        }
        let (slots, dist) = self.list_at(list, first_query, width);
        let entries = count * width;
        let copied = if std::ptr::eq(source, &*self.device) {
            source
                .driver
                .copy(stream, slots, outputs.slots, entries * 4)
                .and_then(|()| source.driver.copy(stream, dist, outputs.dist, entries * 8))
        } else {
            let peer = &self.device.driver;
            source
                .driver
                .copy_to_peer(stream, peer, slots, outputs.slots, entries * 4)
                .and_then(|()| source.driver.copy_to_peer(stream, peer, dist, outputs.dist, entries * 8))
        };
        if copied.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        copied
    }
}

/// Largest merge memory kept for the next merge: a bigger one (a huge batch, or a large k) is
/// given back to the device with its buffer.
const KEPT_BYTES: usize = 64 << 20;

impl<D: Driver> Drop for GpuMergeBuffer<D> {
    fn drop(&mut self) {
        let scratch = self.scratch.get_mut().ok().and_then(Option::take);
        if self.failed.load(Ordering::Acquire) || self.layout.end > KEPT_BYTES {
            return;
        }
        if let (Some(scratch), Ok(mut pool)) = (scratch, self.device.merges.lock()) {
            pool.push(scratch);
        }
    }
}

/// Frees the merge memory `device` keeps between merges (see [`KEPT_BYTES`]).
pub(super) fn release<D: Driver>(device: &Device<D>) {
    if let Ok(mut pool) = device.merges.lock() {
        pool.clear();
    }
}

/// `count` values of `T` at byte `offset` of a host copy.
fn read<T: bytemuck::Pod>(host: &[u8], offset: usize, count: usize) -> Result<Vec<T>> {
    let bytes = host
        .get(offset..offset + count * std::mem::size_of::<T>())
        .ok_or_else(|| HiveGpuError::Internal("a merge read back past its copy".into()))?;
    Ok(bytemuck::pod_collect_to_vec(bytes))
}

impl<D: Driver> MergeBuffer for GpuMergeBuffer<D> {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn queries(&self) -> usize {
        self.queries
    }

    fn lists(&self) -> usize {
        self.lists
    }

    fn set_width(&self, list: usize, width: usize) -> Result<()> {
        let slot = self.widths.get(list).filter(|_| width <= self.width).ok_or_else(|| {
            HiveGpuError::Internal(format!(
                "width {width} for list {list} of {} (at most {})",
                self.lists, self.width
            ))
        })?;
        slot.store(width, Ordering::Release);
        Ok(())
    }

    fn width(&self, list: usize) -> Option<usize> {
        self.widths.get(list).map(|w| w.load(Ordering::Acquire)).filter(|&w| w != UNSET)
    }

    fn merge(&self) -> Result<Merged> {
        let merged = self.merge_lists();
        if merged.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        merged
    }
}

impl<D: Driver> GpuMergeBuffer<D> {
    /// [`MergeBuffer::merge`]'s work.
    fn merge_lists(&self) -> Result<Merged> {
        let widths: Vec<usize> = (0..self.lists)
            .map(|s| self.width(s).ok_or_else(|| HiveGpuError::Internal(format!("list {s} has no width"))))
            .collect::<Result<_>>()?;
        let k = self.k.min(widths.iter().sum());
        if k == 0 {
            return Ok(Merged::default());
        }
        let (queries, lists, layout) = (self.queries, self.lists, self.layout);
        let mut guard =
            self.scratch.lock().map_err(|_| HiveGpuError::Internal("merge scratch poisoned".into()))?;
        let scratch = guard.as_mut().ok_or_else(|| HiveGpuError::Internal("merge scratch missing".into()))?;
        let driver = &*self.device.driver;
        let picks_bytes = layout.end - layout.out_lists;
        let staging = scratch.staging.get(driver, picks_bytes.max(lists * 12))?;
        let offsets: Vec<u64> = (0..lists).map(|s| (s * queries * self.width) as u64).collect();
        let widths32: Vec<u32> = widths.iter().map(|&w| w as u32).collect();
        staging[..lists * 8].copy_from_slice(bytemuck::cast_slice(&offsets));
        staging[lists * 8..lists * 12].copy_from_slice(bytemuck::cast_slice(&widths32));
        let at = |offset: usize| self.base + offset as u64;
        driver.upload(&scratch.stream, at(layout.descriptors), staging, lists * 12)?;
        self.device.launch(
            &scratch.stream,
            self.device.kernels.merge_lists,
            Launch::new((queries.div_ceil(BLOCK as usize) as u32, 1), BLOCK),
            &MergeLists {
                slots: self.base,
                dist: at(layout.dist),
                offsets: at(layout.descriptors),
                widths: at(layout.descriptors + lists * 8),
                lists: lists as u32,
                nq: queries as u32,
                k: k as u32,
                out_lists: at(layout.out_lists),
                out_slots: at(layout.out_slots),
                out_dist: at(layout.out_dist),
                tied: at(layout.tied),
            },
        )?;
        // Stream order puts the download after the upload has read the staging buffer.
        driver.download(&scratch.stream, staging, at(layout.out_lists), picks_bytes)?;
        driver.synchronize(&scratch.stream)?;
        let host: &[u8] = staging;
        let from = |offset: usize| offset - layout.out_lists;
        let picked_lists: Vec<u32> = read(host, from(layout.out_lists), queries * k)?;
        if picked_lists.iter().any(|&s| s as usize >= lists) {
            return Err(HiveGpuError::Internal("the device merge picked past its lists".into()));
        }
        let tied_flags: Vec<u32> = read(host, from(layout.tied), queries)?;
        let mut merged = Merged {
            k,
            lists: picked_lists,
            slots: read(host, from(layout.out_slots), queries * k)?,
            distances: read(host, from(layout.out_dist), queries * k)?,
            tied: tied_flags.iter().enumerate().filter(|&(_, &t)| t != 0).map(|(q, _)| q).collect(),
            sources: Vec::new(),
        };
        if !merged.tied.is_empty() {
            // The lists themselves, for the host to merge the tied queries.
            let staging = scratch.staging.get(driver, layout.descriptors)?;
            driver.download(&scratch.stream, staging, self.base, layout.descriptors)?;
            driver.synchronize(&scratch.stream)?;
            let host: &[u8] = staging;
            for (s, &width) in widths.iter().enumerate() {
                let entry = s * queries * self.width;
                merged.sources.push(SourceList {
                    width,
                    slots: read(host, entry * 4, queries * width)?,
                    distances: read(host, layout.dist + entry * 8, queries * width)?,
                });
            }
        }
        Ok(merged)
    }
}

/// Writes host lists (`width` each) as a search's results into `ws`'s output buffer, the layout
/// [`GpuMergeBuffer::write_from`] copies from: for the queries a search finished on the host
/// (a gathered filter, or a band that overflowed its list).
pub(super) fn stage_host_lists<D: Driver>(
    driver: &Arc<D>,
    ws: &mut super::memory::Workspace<D>,
    lists: &[Vec<Neighbor>],
    width: usize,
) -> Result<Outputs> {
    let nq = lists.len();
    let outputs = Outputs::at(ws.outputs.get(driver, Outputs::bytes_for(nq, width))?, nq, width);
    let staging = ws.staging.get(&**driver, outputs.bytes)?;
    let dist_offset = (outputs.dist - outputs.slots) as usize;
    for (q, list) in lists.iter().enumerate() {
        if list.len() != width {
            return Err(HiveGpuError::Internal(format!("query {q} found {} of {width}", list.len())));
        }
        for (i, n) in list.iter().enumerate() {
            let e = q * width + i;
            let slot = u32::try_from(n.slot).map_err(|_| HiveGpuError::Internal("slot past u32".into()))?;
            staging[e * 4..e * 4 + 4].copy_from_slice(&slot.to_ne_bytes());
            let at = dist_offset + e * 8;
            staging[at..at + 8].copy_from_slice(&n.distance.to_ne_bytes());
        }
    }
    driver.upload(&ws.stream, outputs.slots, staging, outputs.bytes)?;
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_s_regions_hold_what_the_kernel_reads_and_writes_and_never_overlap() {
        for (queries, lists, width, k) in
            [(1, 2, 1, 1), (10_000, 2, 10, 10), (3, 5, 7, 30), (4500, 3, 200, 600)]
        {
            let l = Layout::of(queries, lists, width, k).expect("a layout");
            let entries = queries * lists * width;
            let regions = [
                (0, entries * 4),
                (l.dist, entries * 8),
                (l.descriptors, lists * 12),
                (l.out_lists, queries * k * 4),
                (l.out_slots, queries * k * 4),
                (l.out_dist, queries * k * 8),
                (l.tied, queries * 4),
            ];
            for pair in regions.windows(2) {
                let ((start, bytes), (next, _)) = (pair[0], pair[1]);
                assert!(start + bytes <= next, "{queries} x {lists} x {width}: a region runs into the next");
            }
            let (last, bytes) = regions[regions.len() - 1];
            assert!(last + bytes <= l.end);
            // f64 arrays start on 256-byte boundaries, as cuMemAlloc's base does.
            assert!(regions.iter().all(|&(start, _)| start % 256 == 0));
        }
    }

    #[test]
    fn a_merge_asking_more_picks_than_its_lists_hold_or_past_u32_entries_is_refused() {
        assert!(Layout::of(10, 2, 5, 11).is_err());
        assert!(Layout::of(10, 2, 5, 10).is_ok());
        assert!(Layout::of(1 << 20, 64, 1 << 12, 10).is_err());
        assert!(Layout::of(usize::MAX, 2, 2, 1).is_err());
    }
}
