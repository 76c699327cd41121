//! Exact k-NN on the device. Four paths produce candidates, all finished the same way
//! (f64 re-rank of every row inside the proven error band, on the device):
//! - few queries: a bandwidth-bound scan fused with per-block top-k, merged per query;
//! - batches on tensor-core devices: one kernel multiplies on the tensor cores and keeps only
//!   the distances below a per-query threshold guessed on the device from the products with a
//!   sample of the rows (any threshold is safe: finalize proves that nothing inside the band was
//!   dropped, or flags the query for a narrower path);
//! - other batches: GEMM tiles (cuBLAS) folded into per-query candidate lists tile by tile, so
//!   the full distance matrix never exists;
//! - any k too large for on-chip lists, and any query whose band overflowed its list: a
//!   radix select of the k-th distance, then the band, re-ranked and sorted on the device.
//!
//! Only k (slot, distance) pairs per query come back to the host.

use rayon::prelude::*;

use super::abi::{
    FewTopk, Finalize, Launch, MmaFilter, RadixCollect, RadixHist, RadixPick, RadixState, RoundRows,
    SampleTau, ScanAll, ScanTopk, SelectCollect, SelectHist, SelectPick, SelectState, StridedNorms, TileTopk,
    WidenBytes, read_back,
};
use super::driver::{DevicePtr, Driver, GemmInputs, GemmTn};
use super::kernels::{BLOCK, FEW_ROWS, FEW_THREADS, MMA_TILE, mma_shared_bytes};
use super::memory::{FilterKey, Filtered, Gathered, Workspace};
use super::prepare::{Prepared, prepare};
use super::primitives::{Pairs, ResultSlot, key_f64};
use super::rows::GpuRows;
use crate::backend::{MergeBuffer, Neighbor, PARALLEL_RESULTS, profiling};
use crate::error::{HiveGpuError, Result};
use crate::exact::gates::{self as bounds, Approximation};
use crate::exact::metric_code;
use crate::exact::plan::{FUSED_CAP, SAMPLE_STRIDE, sample_rank, wide_list_size};
use crate::slots::{SearchMask, SlotSet};
use crate::types::{GpuDistanceMetric, SearchPrecision, StoragePrecision};
use half::slice::HalfFloatSliceExt;

/// Largest on-chip candidate list (entries); larger k take the radix path.
pub(super) const MAX_LIST: usize = 4096;
/// Batches of at least this many queries use GEMM tiles; fewer scan.
const GEMM_MIN_QUERIES: usize = 8;
pub(super) fn align(bytes: usize) -> usize {
    bytes.div_ceil(256) * 256
}

/// Copies into the pinned staging buffer, on several threads (of the library's pool) for a big
/// batch's queries.
pub(super) fn copy_bytes(to: &mut [u8], from: &[u8]) -> Result<()> {
    const CHUNK: usize = 1 << 20;
    if from.len() >= 4 * CHUNK {
        crate::exec::run(|| {
            to.par_chunks_mut(CHUNK).zip(from.par_chunks(CHUNK)).for_each(|(t, f)| t.copy_from_slice(f))
        })
    } else {
        to.copy_from_slice(from);
        Ok(())
    }
}

/// Candidate list size for k: room for the band's extra rows beyond k.
pub(super) fn list_size(k: usize) -> usize {
    (k + (k / 4).max(32)).next_power_of_two()
}

/// Results up to this size are written by the kernels into mapped host memory.
const MAPPED_RESULTS_BYTES: usize = 256 << 10;

/// Largest k of the few-rows pass: each block keeps its best min(k, 32) rows in order by
/// ranking each against all the others, and the host merges the blocks' lists.
const FEW_MAX_K: usize = 128;

/// Most rows of the few-rows pass (512 blocks), whatever their dimension: measured over 1,024
/// to 10,253 rows of 128 (docs/PERFORMANCE.md, "One exact pass for a query over few rows"); a
/// low dimension would otherwise let a million rows in, each block's list coming back to the
/// host.
const FEW_MAX_ROWS: usize = 16_384;

/// The k least (key, slot) pairs of the few-rows pass's block lists, ascending; `None` where
/// they hold fewer than k. `heads` holds each block's least key (all ones where it has no
/// row), `keys` / `slots` each block's list (`kb` pairs, ascending; where a block has fewer
/// live rows the list goes on with all-ones keys, whose slots mean nothing).
///
/// Every block's list is its min(k, 32) best in order, and a block holds at most 32 rows, so a
/// list holds either the block's k best or all of its rows: the k best of their union are the
/// query's. The heads are read first, one contiguous run, and then only the lists whose head
/// is at or under [`heads_bound`], each up to the bound: a few dozen pairs at k = 10. Reading
/// and selecting every listed pair (1,610 over 10,253 rows in blocks of 64) took 13-15 us on
/// the H200 machine.
fn merge_block_lists(
    heads: &[u64],
    keys: &[u64],
    slots: &[u32],
    kb: usize,
    k: usize,
) -> Option<Vec<(u64, u32)>> {
    if kb == 0 || k == 0 {
        return None;
    }
    let bound = heads_bound(heads, k);
    let mut found: Vec<(u64, u32)> = Vec::with_capacity(2 * k);
    let lists = keys.chunks_exact(kb).zip(slots.chunks_exact(kb));
    for (&head, (list_keys, list_slots)) in heads.iter().zip(lists) {
        if head > bound {
            continue;
        }
        for (&key, &slot) in list_keys.iter().zip(list_slots) {
            if key > bound {
                break;
            }
            found.push((key, slot));
        }
    }
    if found.len() < k {
        return None;
    }
    found.select_nth_unstable(k - 1);
    found.truncate(k);
    found.sort_unstable();
    Some(found)
}

/// A key no pair of the query's k best exceeds: the k-th least of the lists' first keys
/// (`heads`), which are k distinct rows at or under it (a pair above it loses to all of them);
/// all ones less one (every real key) where fewer than k lists have a row.
fn heads_bound(heads: &[u64], k: usize) -> u64 {
    let mut heads: Vec<u64> = heads.iter().copied().filter(|&key| key != u64::MAX).collect();
    match k.checked_sub(1) {
        Some(at) if at < heads.len() => *heads.select_nth_unstable(at).1,
        _ => u64::MAX - 1,
    }
}

/// Where the few-rows pass writes its lists of `blocks` blocks of `kb` pairs in mapped host
/// memory: the blocks' heads (one key each) first, so that the host reads them as one
/// contiguous run, then the keys and the slots of the lists; byte offsets.
#[derive(Debug, Clone, Copy)]
struct FewLists {
    keys: usize,
    slots: usize,
    bytes: usize,
}

impl FewLists {
    fn of(blocks: usize, kb: usize) -> Self {
        let keys = align(blocks * 8);
        let slots = keys + align(blocks * kb * 8);
        Self { keys, slots, bytes: slots + align(blocks * kb * 4) }
    }
}

/// Most blocks along a grid's y dimension (queries) in one launch.
const MAX_GRID_Y: usize = 65_535;

/// Gate bands that the fused filter's guessed threshold adds to its sample's j-th approximate
/// distance (`hg_sample_tau`). One band is what a query needs not to be flagged: its k-th
/// nearest is far below the sample's j-th (about 2k + 256 rows of the collection are expected
/// below that), so the k-th's band stays under the j-th's plus one band unless the two
/// products err by more than a band between them, which their worst-case bounds allow but
/// real errors do not reach. Three bands (covering those bounds) let so many rows pass in high
/// dimensions, where distances crowd together, that buffers overflowed and their queries were
/// searched again: 1M x 384 L2 batches ran at 0.42x (docs/PERFORMANCE.md, "Thresholds guessed
/// on the device").
const SAMPLE_WIDEN: f32 = 1.0;

/// Where each input lives in the workspace's input buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Inputs {
    pub(super) exact: DevicePtr,
    pub(super) approx: DevicePtr,
    pub(super) half: DevicePtr,
    pub(super) inv_scale: DevicePtr,
    pub(super) q_norms: DevicePtr,
    pub(super) gate_mul: DevicePtr,
    pub(super) gate_add: DevicePtr,
    /// The rows the products read where they are not the stored ones: an exact f16 copy of
    /// byte rows on the f16 paths (`GpuRows::widened_bytes`); 0 for the stored rows.
    pub(super) product_rows: DevicePtr,
}

/// What one GEMM of a path multiplies (`GpuRows::product_operands`): the queries (`element`
/// bytes a value, scaled by `inv_scale` on the f16 path, else 0) and the rows (`row_element`
/// bytes a value).
struct Operands {
    kind: GemmInputs,
    queries: DevicePtr,
    element: u64,
    rows: DevicePtr,
    row_element: u64,
    inv_scale: DevicePtr,
}

/// Per-query candidate lists handed to finalize: `segments` lists of `len` entries per query,
/// each sorted (the scan and tile kernels' lists) or not (the fused filter's buffers).
#[derive(Debug, Clone, Copy)]
pub(super) struct Lists {
    pub(super) entries: DevicePtr,
    pub(super) evicted: DevicePtr,
    pub(super) segments: usize,
    pub(super) len: usize,
    pub(super) sorted: bool,
}

impl Outputs {
    /// Bytes of the results of `nq` queries of `k` neighbors: slots, f64 distances, flags.
    pub(super) fn bytes_for(nq: usize, k: usize) -> usize {
        align(nq * k * 4) + align(nq * k * 8) + align(nq * 4)
    }

    /// The layout of [`Outputs::bytes_for`] at device address `base`.
    pub(super) fn at(base: DevicePtr, nq: usize, k: usize) -> Self {
        let dist_offset = align(nq * k * 4);
        let flags_offset = dist_offset + align(nq * k * 8);
        Self {
            slots: base,
            dist: base + dist_offset as u64,
            flags: base + flags_offset as u64,
            bytes: Self::bytes_for(nq, k),
            dist_offset,
            flags_offset,
            mapped: false,
        }
    }
}

/// The results of [`Outputs`] as read back into host memory: typed arrays, not byte offsets.
pub(super) struct OutputsView<'a> {
    /// `nq x k` slots.
    pub(super) slots: &'a [u32],
    /// `nq x k` f64 distances.
    pub(super) dist: &'a [f64],
    /// One flag per query: nonzero where its band overflowed its list.
    pub(super) flags: &'a [u32],
}

impl Outputs {
    /// The arrays of `host` (a copy of the outputs of `nq` queries of `k`, at the host
    /// buffer's start; pinned buffers are page-aligned).
    pub(super) fn view<'a>(&self, host: &'a [u8], nq: usize, k: usize) -> Result<OutputsView<'a>> {
        Ok(OutputsView {
            slots: typed(host, 0, nq * k)?,
            dist: typed(host, self.dist_offset, nq * k)?,
            flags: typed(host, self.flags_offset, nq)?,
        })
    }
}

/// `count` values of `T` at byte `offset` of a host copy of device memory.
fn typed<T: bytemuck::Pod>(host: &[u8], offset: usize, count: usize) -> Result<&[T]> {
    let bytes = host
        .get(offset..offset + count * std::mem::size_of::<T>())
        .ok_or_else(|| HiveGpuError::Internal(format!("a read back of {} bytes is too short", host.len())))?;
    bytemuck::try_cast_slice(bytes)
        .map_err(|e| HiveGpuError::Internal(format!("a read back is not an array of its type: {e}")))
}

/// The bits of the device's `hg_entry(distance, slot)`: the distance's sortable key, then
/// the slot (`codes.rs` reads them back with `entry_distance`).
pub(super) fn entry_key(distance: f32, slot: u32) -> u64 {
    let bits = distance.to_bits();
    let key = if bits & 0x8000_0000 != 0 { !bits } else { bits | 0x8000_0000 };
    (u64::from(key) << 32) | u64::from(slot)
}

/// Where a search writes its results instead of returning them: list `list` of a merge
/// buffer, from query `first_query` of the buffer's batch.
pub(super) struct Sink<'b, D: Driver> {
    pub(super) target: &'b super::merge::GpuMergeBuffer<D>,
    pub(super) list: usize,
    pub(super) first_query: usize,
}

impl<D: Driver> Sink<'_, D> {
    /// Copies `count` queries' results (`width` each, laid out as [`Outputs`] lays them) from
    /// `ws`'s device into the sink's list, and waits for the copy.
    fn write(
        &self,
        device: &super::Device<D>,
        ws: &Workspace<D>,
        outputs: &Outputs,
        count: usize,
        width: usize,
    ) -> Result<()> {
        self.target.write_from(device, &ws.stream, (self.list, self.first_query), width, outputs, count)?;
        device.driver.synchronize(&ws.stream)
    }

    /// [`Sink::write`] of lists the host holds (`width` each): staged through `ws`'s buffers.
    fn write_host(
        &self,
        device: &super::Device<D>,
        ws: &mut Workspace<D>,
        lists: &[Vec<Neighbor>],
        width: usize,
    ) -> Result<()> {
        let outputs = super::merge::stage_host_lists(&device.driver, ws, lists, width)?;
        self.write(device, ws, &outputs, lists.len(), width)
    }
}

/// Where each output lives in the workspace's output buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outputs {
    pub(super) slots: DevicePtr,
    pub(super) dist: DevicePtr,
    pub(super) flags: DevicePtr,
    pub(super) bytes: usize,
    dist_offset: usize,
    flags_offset: usize,
    /// In the workspace's mapped host buffer (`results`), not in device memory.
    mapped: bool,
}

/// With `HIVE_GPU_PROFILE=1`, each search phase synchronizes and reports its wall time on
/// stderr (a diagnostic: it serializes the pipeline it measures).
pub(super) struct Profiler {
    enabled: bool,
    last: std::time::Instant,
    phases: Vec<(&'static str, f64)>,
}

impl Profiler {
    pub(super) fn new() -> Self {
        let enabled = profiling();
        Self { enabled, last: std::time::Instant::now(), phases: Vec::new() }
    }

    pub(super) fn mark<D: Driver>(
        &mut self,
        driver: &D,
        stream: &D::Stream,
        phase: &'static str,
    ) -> Result<()> {
        if self.enabled {
            driver.synchronize(stream)?;
            let now = std::time::Instant::now();
            let ms = (now - self.last).as_secs_f64() * 1e3;
            match self.phases.iter_mut().find(|(p, _)| *p == phase) {
                Some(entry) => entry.1 += ms,
                None => self.phases.push((phase, ms)),
            }
            self.last = now;
        }
        Ok(())
    }

    pub(super) fn report(&self, what: &str) {
        if self.enabled {
            let parts: Vec<String> = self.phases.iter().map(|(p, ms)| format!("{p} {ms:.3}")).collect();
            eprintln!("hive-gpu profile ({what}, ms): {}", parts.join(", "));
        }
    }
}

impl<D: Driver> GpuRows<D> {
    pub(super) fn checkout(&self) -> Result<Workspace<D>> {
        let reused =
            self.pool.lock().map_err(|_| HiveGpuError::Internal("workspace pool poisoned".into()))?.pop();
        match reused {
            Some(ws) => Ok(ws),
            None => Workspace::new(&**self.driver()),
        }
    }

    pub(super) fn checkin(&self, ws: Workspace<D>) {
        if let Ok(mut pool) = self.pool.lock() {
            pool.push(ws);
        }
    }

    /// Exact k nearest live rows of each query, among those of `allowed` when given (see the
    /// module docs).
    pub(super) fn search(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.search_with(queries, k, metric, allowed, None)
    }

    /// [`Self::search`], or with `sink` its results written into a merge buffer's list instead
    /// of returned (an empty list comes back).
    pub(super) fn search_with(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
        sink: Option<&Sink<'_, D>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        crate::backend::candidates::check_finite_queries("knn", self.dim, queries)?;
        let mut ws = self.checkout()?;
        let outcome = match allowed {
            None => self
                .check_request(queries, k, self.live())
                .and_then(|()| self.search_in(&mut ws, queries, k, metric, None, sink)),
            Some(allowed) => self.search_filtered(&mut ws, queries, k, metric, allowed, sink),
        };
        ws.filtered = None;
        // A workspace whose stream saw an error is dropped, not reused; a request refused
        // before any device work (`check_request`) leaves it as it was.
        if matches!(outcome, Ok(_) | Err(HiveGpuError::InvalidArgument(_))) {
            self.checkin(ws);
        }
        outcome
    }

    /// The error of a search for `k` of `live` rows that cannot run, if it cannot.
    fn check_request(&self, queries: &[f32], k: usize, live: usize) -> Result<()> {
        if k == 0 || k > live || !queries.len().is_multiple_of(self.dim) || queries.is_empty() {
            return Err(HiveGpuError::InvalidArgument(format!(
                "knn needs 1 <= k <= {live} live rows (k = {k}) and whole {}-dimensional queries ({} values)",
                self.dim,
                queries.len()
            )));
        }
        Ok(())
    }

    /// A search among the live rows of `allowed`, in `ws`. Few passing rows are gathered and
    /// searched alone (`Tuning::gather_fraction`, and `batch_gather_fraction` for batches,
    /// where the masked paths cost more); more are scanned with the others masked. What either
    /// derives from the filter (the gathered rows, the skip words on the device) stays with
    /// the workspace under the filter's key, so a filter searched again over unchanged rows
    /// (a prepared one, `crate::PreparedFilter`) costs no host pass over the slots and no
    /// upload.
    fn search_filtered(
        &self,
        ws: &mut Workspace<D>,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: &SlotSet,
        sink: Option<&Sink<'_, D>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        // With HIVE_GPU_PROFILE: the host's mask (its upload comes with the search) and a
        // single search's gather; a failed synchronize there only loses the line.
        let mut profile = Profiler::new();
        let key = self.filter_key(allowed);
        let kept_gather = ws.gathered.as_ref().filter(|g| g.key == key);
        let kept_skip = ws.skip_for.filter(|(of, _)| *of == key);
        let mut mask = None;
        let live = match (kept_gather, kept_skip) {
            (Some(gathered), _) => gathered.passing.len(),
            (None, Some((_, live))) => live,
            (None, None) => {
                let built = SearchMask::new(&self.dead, self.len, Some(allowed));
                let live = built.live;
                mask = Some(built);
                live
            }
        };
        self.check_request(queries, k, live)?;
        // A filter that leaves every live row is no filter: the unfiltered paths, no mask.
        if live == self.live() {
            return self.search_in(ws, queries, k, metric, None, sink);
        }
        profile.mark(&**self.driver(), &ws.stream, "mask").ok();
        profile.report(&format!("filtered search among {live} rows"));
        if self.gathers(queries.len() / self.dim, live) {
            match self.search_gathered(ws, queries, k, metric, allowed, key, live, mask.as_ref()) {
                // No room on the device for a copy of the passing rows: the masked scan needs none.
                Err(HiveGpuError::VramLimitExceeded { .. }) => {}
                Ok(found) if sink.is_some() => return self.sink_host_lists(sink, &found),
                outcome => return outcome,
            }
        }
        self.mask_workspace(ws, Some(allowed), mask)?;
        self.search_in(ws, queries, k, metric, None, sink)
    }

    /// Whether a filtered search of `nq` queries among `live` passing rows gathers them: at
    /// most 1 in `Tuning::gather_fraction` (`batch_gather_fraction` for a batch) of the rows.
    /// A batch gathers once for all its pieces and keeps the copy for the next batch of the
    /// filter ([`Self::shared_gather`]), so for a prepared filter a batch reads only the
    /// passing rows whatever their share; a single query's gather is its own and pays only for
    /// few rows (docs/PERFORMANCE.md, filtered search).
    fn gathers(&self, nq: usize, live: usize) -> bool {
        let t = &self.tuning;
        let fraction = if nq >= GEMM_MIN_QUERIES { t.batch_gather_fraction } else { t.gather_fraction };
        fraction > 0 && live.saturating_mul(fraction) <= self.len
    }

    /// Whether a gather of `live` rows stays with the workspace that made it (at most 1 in 16
    /// of the rows); a larger one is shared by the rows ([`Self::shared_gather`]).
    fn workspace_keeps(&self, live: usize) -> bool {
        live.saturating_mul(16) <= self.len
    }

    /// The key of a search among `allowed` over these rows.
    pub(super) fn filter_key(&self, allowed: &SlotSet) -> FilterKey {
        (allowed.stamp(), self.rows_stamp)
    }

    /// A filtered search over the passing rows alone: they are gathered on the device into
    /// rows of their own (the compaction kernel), searched there with `ws`, and their slots
    /// mapped back (the passing slots are ascending, so ties still go to the lower slot). A
    /// small gather stays with the workspace, a large one with the rows (both under `key`),
    /// for the next search of the filter.
    #[allow(clippy::too_many_arguments)]
    fn search_gathered(
        &self,
        ws: &mut Workspace<D>,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: &SlotSet,
        key: FilterKey,
        live: usize,
        mask: Option<&SearchMask<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let passing_slots = || match mask {
            Some(mask) => mask.kept(self.len),
            None => SearchMask::new(&self.dead, self.len, Some(allowed)).kept(self.len),
        };
        if !self.workspace_keeps(live) {
            let gathered = self.shared_gather(ws, live, key, passing_slots)?;
            let found = gathered.rows.search_in(ws, queries, k, metric, None, None);
            return found.map(|found| crate::backend::ungather(found, &gathered.passing));
        }
        let mut profile = Profiler::new();
        let gathered = match ws.gathered.take() {
            Some(kept) if kept.key == key => kept,
            earlier => {
                let passing = passing_slots();
                profile.mark(&**self.driver(), &ws.stream, "passing slots").ok();
                let rows = self.gathered(&passing, earlier.map(|e| e.rows), &mut ws.gather_slots)?;
                profile.mark(&**self.driver(), &ws.stream, "gather").ok();
                profile.report(&format!("gather of {live} rows"));
                Gathered { rows, passing, key }
            }
        };
        let found = gathered.rows.search_in(ws, queries, k, metric, None, None);
        let found = found.map(|found| crate::backend::ungather(found, &gathered.passing));
        ws.gathered = Some(gathered);
        found
    }

    /// The rows' shared gather of the `live` passing rows under `key`: the kept one, or a new
    /// one made now (with `ws`'s slot scratch) in place of any other. A batch's pieces search
    /// side by side; the first to come gathers while the others wait for it, instead of each
    /// gathering for itself (on the H100 that made a gather at half the rows no faster than
    /// the masked scan: docs/PERFORMANCE.md, filtered search). The copy may take at most half
    /// of the device's free memory, so that it never takes the room of rows still to come or
    /// of the searches' own buffers: otherwise `VramLimitExceeded`, and the caller scans with
    /// a mask instead. A search whose filter was evaluated for it alone drops the copy when it
    /// ends (`RowStore::release_filter_copies`): only a prepared filter's stays.
    fn shared_gather(
        &self,
        ws: &mut Workspace<D>,
        live: usize,
        key: FilterKey,
        passing_slots: impl FnOnce() -> Vec<usize>,
    ) -> Result<std::sync::Arc<Gathered<D>>> {
        // The cache holds no invariant a panic could break halfway: a poisoned lock is used.
        let mut cache = self.gather_cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(kept) = cache.as_ref().filter(|g| g.key == key) {
            return Ok(kept.clone());
        }
        // The earlier gather's memory would be given back (or reused) first: it counts as
        // free, and it is kept when this one is refused.
        let earlier_bytes = cache.as_ref().map_or(0, |g| g.rows.capacity() * self.gathered_row_bytes());
        let bytes = live.saturating_mul(self.gathered_row_bytes());
        let (free, _) = self.driver().mem_info()?;
        let room = free.saturating_add(earlier_bytes) / 2;
        if bytes > room {
            return Err(HiveGpuError::VramLimitExceeded {
                backend: self.device.backend,
                requested: bytes as u64,
                available: room as u64,
            });
        }
        let reuse = cache.take().and_then(|g| std::sync::Arc::try_unwrap(g).ok()).map(|g| g.rows);
        let passing = passing_slots();
        let rows = self.gathered(&passing, reuse, &mut ws.gather_slots)?;
        let gathered = std::sync::Arc::new(Gathered { rows, passing, key });
        *cache = Some(gathered.clone());
        Ok(gathered)
    }

    /// Device bytes a gathered row takes: its elements, its norm and its removed bit (rounded
    /// up to a byte).
    fn gathered_row_bytes(&self) -> usize {
        self.dim * self.element_bytes() + 5
    }

    /// Points `ws`'s kernels at the skip words of a search among `allowed` (none without a
    /// filter): those already on the device when they were built for its key, else `mask` (or
    /// one built now) sent up once.
    pub(super) fn mask_workspace(
        &self,
        ws: &mut Workspace<D>,
        allowed: Option<&SlotSet>,
        mask: Option<SearchMask<'_>>,
    ) -> Result<()> {
        let Some(allowed) = allowed else { return Ok(()) };
        let driver = self.driver().clone();
        let bytes = (SlotSet::words_for(self.len) * 4).max(4);
        let skip = ws.skip.get(&driver, bytes)?;
        // Same key, same length: `skip` was not reallocated since the words went up.
        let key = self.filter_key(allowed);
        if let Some((_, live)) = ws.skip_for.filter(|(of, _)| *of == key) {
            ws.filtered = Some(Filtered { skip, live });
            return Ok(());
        }
        ws.skip_for = None;
        let mask = mask.unwrap_or_else(|| SearchMask::new(&self.dead, self.len, Some(allowed)));
        let words = mask.skip.words();
        // The staging memory may still feed an upload of an earlier search of this workspace
        // (one whose results went to a merge buffer ends without waiting): wait for that first.
        driver.synchronize(&ws.stream)?;
        let staging = ws.skip_staging.get(&*driver, bytes)?;
        copy_bytes(&mut staging[..words.len() * 4], bytemuck::cast_slice(words))?;
        driver.upload(&ws.stream, skip, staging, words.len() * 4)?;
        ws.filtered = Some(Filtered { skip, live: mask.live });
        ws.skip_for = Some((key, mask.live));
        Ok(())
    }

    /// Rows the search in `ws` may return.
    fn searched(&self, ws: &Workspace<D>) -> usize {
        ws.filtered.map_or_else(|| self.live(), |f| f.live)
    }

    fn approximation(&self, nq: usize, k: usize, metric: GpuDistanceMetric) -> Approximation {
        if nq < GEMM_MIN_QUERIES
            && list_size(k) <= MAX_LIST
            && self.scan_shared_bytes(k) <= self.shared_limit()
        {
            return Approximation::Scan;
        }
        if !metric.is_difference_norm() && self.byte_copy_fits() {
            // Byte rows are f16 values: an exact f16 copy of them multiplies on the f16
            // tensor cores under the f16 rows' bound.
            return Approximation::GemmF16 { scale: 1.0 };
        }
        if self.own_tiles(metric) {
            // No product form, or rows no BLAS multiplies (bf16 and bytes against f32
            // queries): the engine's own tiles (`hg_tiles`) over f32 queries.
            return Approximation::GemmF32;
        }
        match (self.precision, self.search) {
            (StoragePrecision::F16, _) => Approximation::GemmF16 { scale: 1.0 },
            (StoragePrecision::F32, SearchPrecision::Fast) => Approximation::GemmTf32,
            _ => Approximation::GemmF32,
        }
    }

    /// Whether a batch's tiles come from the engine's own kernel (`hg_tiles`) rather than the
    /// BLAS: for the metrics without a product form, and for rows stored as bf16 or bytes,
    /// which widen exactly to f32 in the kernel (so the f32 gate holds for them as it is).
    fn own_tiles(&self, metric: GpuDistanceMetric) -> bool {
        metric.is_difference_norm()
            || !matches!(self.precision, StoragePrecision::F32 | StoragePrecision::F16)
    }

    /// Whether the rows are bytes (i8 or u8).
    fn byte_rows(&self) -> bool {
        matches!(self.precision, StoragePrecision::I8 | StoragePrecision::U8)
    }

    /// Whether a batch over byte rows can multiply an exact f16 copy of them
    /// ([`Self::widened_bytes`]): a device with the tensor-core kernels, rows of whole 4-byte
    /// words, and a copy within `Tuning::rounded_copy_bytes`.
    fn byte_copy_fits(&self) -> bool {
        self.byte_rows()
            && self.device.kernels.tensor.is_some()
            && self.dim.is_multiple_of(4)
            && self.len.saturating_mul(self.dim).saturating_mul(2) <= self.tuning.rounded_copy_bytes
    }

    /// Whether the rows `path` multiplies are the f16 copy of byte rows.
    fn products_on_copy(&self, path: Approximation) -> bool {
        self.byte_rows() && matches!(path, Approximation::GemmF16 { .. })
    }

    /// Bytes of one element of the rows `path` multiplies (the f16 copy's for byte rows).
    fn product_element_bytes(&self, path: Approximation) -> usize {
        if self.products_on_copy(path) { 2 } else { self.element_bytes() }
    }

    /// An exact f16 copy of the byte rows in `ws` (every integer up to 2048 is an f16), for
    /// the f16 paths; None where the device's memory has no room for it (the batch then
    /// takes the own tiles over the stored bytes). One pass over the rows per batch, which
    /// the tensor cores' work over every row for every query dwarfs.
    fn widened_bytes(&self, ws: &mut Workspace<D>) -> Result<Option<DevicePtr>> {
        let Some(tensor) = self.device.kernels.tensor.as_ref() else {
            return Ok(None);
        };
        let (rows, _, _) = self.arrays_ptrs(ws)?;
        let Some((copy, quads, launch)) = self.f16_copy_buffer(ws)? else { return Ok(None) };
        self.device.launch(
            &ws.stream,
            tensor.widen_bytes,
            launch,
            &WidenBytes {
                rows,
                out: copy,
                quads: quads as u64,
                is_signed: i32::from(self.precision == StoragePrecision::I8),
            },
        )?;
        Ok(Some(copy))
    }

    /// The tensor-core path of the fused filter for a batch that would take `path`, if the
    /// device has the kernels and the batch suits them. Exact and fast f32 batches round the
    /// rows to f16 on the device (`RoundedF16`: half TF32's band, half its tensor-core work;
    /// dimension a multiple of 8; cosine where no stored row is so much shorter than the
    /// longest that its rounding floor matters, see [`Self::cosine_rounds`]), else run on
    /// TF32: the gate's band and
    /// the f64 re-rank keep them exact, and queries whose band overflowed re-run on plain f32
    /// GEMMs. `Tuning::fused` turns the filter off and `Tuning::f16_filter` keeps f32 rows on
    /// TF32; `Tuning::fused_min_rows` is the size from which it runs (tests use 1), and
    /// `Tuning::fused_min_work` the rows x queries from which a smaller collection's batch does.
    fn fused_approximation(
        &self,
        ws: &Workspace<D>,
        nq: usize,
        k: usize,
        metric: GpuDistanceMetric,
        path: Approximation,
    ) -> Option<Approximation> {
        self.device.kernels.tensor.as_ref()?;
        // bf16 rows multiply on the tensor cores through their rounded f16 copy only: they
        // have no f32 for TF32 or for the filter's own conversion.
        let bf16 = self.precision == StoragePrecision::Bf16;
        let own = self.own_tiles(metric) && !self.products_on_copy(path) && !bf16;
        if !self.tuning.fused || metric.is_difference_norm() || own {
            return None;
        }
        // Rows no scale brings into f16's range (a norm that overflowed f32) stay on TF32.
        let rounded_path = Approximation::RoundedF16 {
            scale: 1.0,
            row_scale: self.row_scale(),
            least_row_norm: self.least_row_norm(),
        };
        // The shared-memory check takes the in-filter conversion's size, the larger of the two
        // (the copy may not fit the device's memory at search time): where it does not fit,
        // TF32 may.
        let rounded = (metric != GpuDistanceMetric::Cosine || self.cosine_rounds())
            && self.dim.is_multiple_of(8)
            && self.largest_component() * self.row_scale() <= 32768.0
            && self.mma_shared_bytes(rounded_path) <= self.driver().max_shared_bytes()
            && self.tuning.f16_filter
            && (!bf16
                || self.len.saturating_mul(self.dim).saturating_mul(2) <= self.tuning.rounded_copy_bytes);
        let tensor_path = match path {
            Approximation::GemmF32 | Approximation::GemmTf32 if rounded => rounded_path,
            _ if bf16 => return None,
            Approximation::GemmF32 | Approximation::GemmTf32 => Approximation::GemmTf32,
            Approximation::GemmF16 { scale } => Approximation::GemmF16 { scale },
            Approximation::Scan | Approximation::CoopF16 { .. } | Approximation::RoundedF16 { .. } => {
                return None;
            }
        };
        let min_rows = self.tuning.fused_min_rows;
        let kcap = self.path_list_size(k, tensor_path);
        let fits = nq >= GEMM_MIN_QUERIES
            && (self.len >= min_rows || self.len.saturating_mul(nq) >= self.tuning.fused_min_work)
            && (self.dim * self.product_element_bytes(tensor_path)).is_multiple_of(16)
            && kcap < FUSED_CAP
            // Without a sample every row passes: only small collections fit the buffers.
            && (self.sample_rank(ws, k).is_some() || self.len <= FUSED_CAP)
            && Self::fused_sort_size(kcap) * 8 <= self.shared_limit()
            && self.mma_shared_bytes(tensor_path) <= self.driver().max_shared_bytes();
        fits.then_some(tensor_path)
    }

    /// Bytes of a tensor-core operand on `path`: TF32 multiplies f32, the others f16.
    fn operand_bytes(path: Approximation) -> usize {
        if path == Approximation::GemmTf32 { 4 } else { 2 }
    }

    /// The filter kernel's dynamic shared memory on `path`.
    fn mma_shared_bytes(&self, path: Approximation) -> usize {
        mma_shared_bytes(self.product_element_bytes(path), Self::operand_bytes(path), self.dim)
    }

    /// The power of two f32 rows are scaled by before the filter rounds them to f16: the
    /// largest component (at most the largest norm) lands at or below 2^15.
    fn row_scale(&self) -> f64 {
        bounds::f16_scale_below(self.largest_component())
    }

    /// A lower bound on every stored row's norm (removed rows included; 0 where unknown).
    fn least_row_norm(&self) -> f64 {
        f64::from(self.least_sq_norm).sqrt()
    }

    /// Whether cosine batches may round the rows to f16: the rounding's absolute floor (f16
    /// subnormals, 2^-25 of a scaled component), which cosine divides by each row's norm, adds
    /// at most 2^-14 to the band of a unit query, a sixteenth of the rounding's relative
    /// error (2^-10). The rows' norms then span at most about 2^26 / sqrt(dim); a collection
    /// with rows nearer zero, or whose least norm is unknown, stays on TF32.
    fn cosine_rounds(&self) -> bool {
        let floor = 2f64.powi(-25) * (self.dim as f64).sqrt() / (self.row_scale() * self.least_row_norm());
        floor <= 2f64.powi(-14)
    }

    /// An upper bound on every stored component: the largest norm, widened for its f32
    /// rounding.
    fn largest_component(&self) -> f64 {
        f64::from(self.max_sq_norm).sqrt() * (1.0 + 1e-6)
    }

    /// The rank j whose sample distance gives the fused filter's thresholds, if the sample
    /// holds enough live rows for one.
    fn sample_rank(&self, ws: &Workspace<D>, k: usize) -> Option<usize> {
        sample_rank(self.len, self.searched(ws), k)
    }

    fn fused_sort_size(kcap: usize) -> usize {
        (2 * kcap).max(FUSED_CAP).max(1024)
    }

    /// Whether lists of `kcap` entries fit the tile and finalize kernels' shared memory.
    fn list_fits(&self, kcap: usize) -> bool {
        kcap <= MAX_LIST && (2 * kcap).max(2048) * 8 <= self.shared_limit()
    }

    /// The list size on `path`: tensor-core passes have wider bands, so more room where it fits.
    fn path_list_size(&self, k: usize, path: Approximation) -> usize {
        let wide = wide_list_size(k);
        match path {
            Approximation::GemmTf32 | Approximation::GemmF16 { .. } | Approximation::RoundedF16 { .. }
                if self.list_fits(wide) =>
            {
                wide
            }
            _ => list_size(k),
        }
    }

    pub(super) fn shared_limit(&self) -> usize {
        self.driver().max_shared_bytes().saturating_sub(1024)
    }

    pub(super) fn scan_sort_size(k: usize) -> usize {
        (2 * list_size(k)).max(512)
    }

    fn scan_shared_bytes(&self, k: usize) -> usize {
        Self::scan_sort_size(k) * 8 + self.dim * 4
    }

    /// The path that re-runs queries whose band overflowed on `path`: f32 arithmetic has
    /// the narrowest band. None: go straight to the radix path.
    fn narrower(&self, path: Approximation, k: usize) -> Option<Approximation> {
        let scan_fits = list_size(k) <= MAX_LIST && self.scan_shared_bytes(k) <= self.shared_limit();
        match (path, self.precision) {
            (Approximation::GemmTf32 | Approximation::RoundedF16 { .. }, _) => Some(Approximation::GemmF32),
            (
                Approximation::GemmF16 { .. },
                StoragePrecision::F16 | StoragePrecision::I8 | StoragePrecision::U8,
            ) if scan_fits => Some(Approximation::Scan),
            _ => None,
        }
    }

    fn search_in(
        &self,
        ws: &mut Workspace<D>,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        forced: Option<Approximation>,
        sink: Option<&Sink<'_, D>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let driver = self.driver().clone();
        let dim = self.dim;
        let nq = queries.len() / dim;
        if forced.is_none()
            && sink.is_none()
            && self.few_rows(nq, k)
            && let Some(found) = self.few_path(ws, queries, k, metric)?
        {
            return Ok(found);
        }
        let mut path = forced.unwrap_or_else(|| self.approximation(nq, k, metric));
        let mut profile = Profiler::new();
        // Lists too large for on-chip memory (k beyond about 3,000, or less on devices with
        // 64 KiB of shared memory) take the radix path.
        let radix_only = !self.list_fits(list_size(k));
        let mut fused = match forced {
            None if !radix_only => self.fused_approximation(ws, nq, k, metric, path),
            _ => None,
        };
        if let Some(tensor_path) = fused {
            path = tensor_path;
        }

        let cosine = metric == GpuDistanceMetric::Cosine;
        let gate_path = |path| if radix_only { Approximation::Scan } else { path };
        let max_sq = f64::from(self.max_sq_norm);
        profile.mark(&*driver, &ws.stream, "plan")?;
        let prepare_for = |path| {
            prepare(queries, dim, metric, path, gate_path(path), max_sq, self.tuning.prepare_parallel_queries)
        };
        let mut prepared = prepare_for(path)?;
        // The rounded filter turns products into distances with 2 / (scale * row_scale) in
        // f32. A batch where that factor is no normal f32 for some query (queries or rows at
        // the ends of f32's range) takes the plain f32 tiles instead.
        if let Approximation::RoundedF16 { row_scale, .. } = path
            && prepared.scales.iter().any(|&s| !((2.0 / (s * row_scale)) as f32).is_normal())
        {
            path = Approximation::GemmF32;
            fused = None;
            prepared = prepare_for(path)?;
        }
        // Byte rows on an f16 path multiply their f16 copy; without room for it, the own
        // tiles over the bytes.
        let mut product_rows = 0;
        if self.products_on_copy(path) && !radix_only {
            match self.widened_bytes(ws)? {
                Some(copy) => product_rows = copy,
                None => {
                    path = Approximation::GemmF32;
                    fused = None;
                    prepared = prepare_for(path)?;
                }
            }
        }
        let half = matches!(path, Approximation::GemmF16 { .. } | Approximation::RoundedF16 { .. });
        let Prepared { q_norms, gate_mul, gate_add, scan_mul, scan_add, .. } = &prepared;
        let inv_scale: Vec<f32> = prepared.scales.iter().map(|&s| (1.0 / s) as f32).collect();

        // One upload of every input.
        let sizes = [
            align(nq * dim * 4),
            if cosine { align(nq * dim * 4) } else { 0 },
            if half { align(nq * dim * 2) } else { 0 },
            align(nq * 4),
            align(nq * 8),
            align(nq * 4),
            align(nq * 4),
            align(nq * 4),
            align(nq * 4),
        ];
        let input_bytes: usize = sizes.iter().sum();
        profile.mark(&*driver, &ws.stream, "prepare")?;
        // Results for a merge buffer stay in device memory, to be copied from there.
        let outputs = match sink {
            Some(_) => Outputs::at(ws.outputs.get(&driver, Outputs::bytes_for(nq, k))?, nq, k),
            None => self.outputs(ws, nq, k)?,
        };
        let base = ws.inputs.get(&driver, input_bytes)?;
        let staging = ws.staging.get(&*driver, input_bytes.max(outputs.bytes))?;
        let mut offset = 0usize;
        let mut put = |bytes: &[u8], size: usize| -> Result<DevicePtr> {
            copy_bytes(&mut staging[offset..offset + bytes.len()], bytes)?;
            let at = base + offset as u64;
            offset += size;
            Ok(at)
        };
        let exact = put(bytemuck::cast_slice(queries), sizes[0])?;
        let approx_ptr = if cosine { put(bytemuck::cast_slice(&prepared.unit), sizes[1])? } else { exact };
        let half_ptr =
            if half { put(bytemuck::cast_slice(prepared.halves.reinterpret_cast()), sizes[2])? } else { 0 };
        let inv_scale_ptr = put(bytemuck::cast_slice(&inv_scale), sizes[3])?;
        let q_norms_ptr = put(bytemuck::cast_slice(q_norms), sizes[4])?;
        let gate_mul_ptr = put(bytemuck::cast_slice(gate_mul), sizes[5])?;
        let gate_add_ptr = put(bytemuck::cast_slice(gate_add), sizes[6])?;
        let scan_mul_ptr = put(bytemuck::cast_slice(scan_mul), sizes[7])?;
        let scan_add_ptr = put(bytemuck::cast_slice(scan_add), sizes[8])?;
        profile.mark(&*driver, &ws.stream, "stage")?;
        driver.upload(&ws.stream, base, staging, input_bytes)?;
        let inputs = Inputs {
            exact,
            approx: approx_ptr,
            half: half_ptr,
            inv_scale: if half { inv_scale_ptr } else { 0 },
            q_norms: q_norms_ptr,
            gate_mul: gate_mul_ptr,
            gate_add: gate_add_ptr,
            product_rows,
        };
        // Every query's flag is written by finalize or the radix path: no clearing first.
        profile.mark(&*driver, &ws.stream, "upload")?;

        if radix_only {
            for q in 0..nq {
                self.radix_one(ws, &inputs, q, k, metric, &outputs, (gate_mul[q], gate_add[q]), q_norms[q])?;
            }
        } else if fused.is_some() {
            self.fused_path(ws, &inputs, nq, k, metric, path, &outputs, &mut profile)?;
        } else if path == Approximation::Scan {
            self.scan_path(ws, &inputs, nq, k, metric, &outputs, &mut profile)?;
        } else {
            self.tile_path(ws, &inputs, nq, k, metric, path, &outputs, &mut profile)?;
        }
        profile.mark(&*driver, &ws.stream, "candidates+finalize")?;

        // Into a merge buffer: only the flags come back; where none is set, the results go
        // from device to device.
        if let Some(sink) = sink {
            let staging = ws.staging.get(&*driver, nq * 4)?;
            driver.download(&ws.stream, staging, outputs.flags, nq * 4)?;
            driver.synchronize(&ws.stream)?;
            let flags: &[u32] = typed(staging, 0, nq)?;
            if flags.iter().all(|&f| f == 0) {
                sink.write(&self.device, ws, &outputs, nq, k)?;
                profile.mark(&*driver, &ws.stream, "copy to merge")?;
                profile.report(&format!("nq {nq} k {k} {path:?} into a merge buffer"));
                return Ok(Vec::new());
            }
        }
        let mut results = self.download_results(ws, &outputs, nq, k, false)?;
        profile.mark(&*driver, &ws.stream, "download")?;
        // Queries whose band overflowed their list go through the radix path (rare: heavy
        // ties or huge error bands).
        let flagged: Vec<usize> =
            results.iter().enumerate().filter(|(_, r)| r.is_none()).map(|(q, _)| q).collect();
        if !flagged.is_empty()
            && let Some(narrower) = self.narrower(path, k)
        {
            let subset: Vec<f32> =
                flagged.iter().flat_map(|&q| queries[q * dim..(q + 1) * dim].iter().copied()).collect();
            let again = self.search_in(ws, &subset, k, metric, Some(narrower), None)?;
            for (q, found) in flagged.iter().zip(again) {
                results[*q] = Some(found);
            }
        } else if !flagged.is_empty() {
            let scan_inputs = Inputs { gate_mul: scan_mul_ptr, gate_add: scan_add_ptr, ..inputs };
            for &q in &flagged {
                self.radix_one(
                    ws,
                    &scan_inputs,
                    q,
                    k,
                    metric,
                    &outputs,
                    (scan_mul[q], scan_add[q]),
                    q_norms[q],
                )?;
            }
            let again = self.download_results(ws, &outputs, nq, k, false)?;
            for q in flagged {
                results[q] = again[q].clone();
            }
        }
        profile.report(&format!("nq {nq} k {k} {path:?}"));
        let results = results
            .into_iter()
            .map(|r| r.ok_or_else(|| HiveGpuError::Internal("the radix path flagged a query".into())))
            .collect::<Result<Vec<_>>>()?;
        match sink {
            Some(sink) => sink.write_host(&self.device, ws, &results, k).map(|()| Vec::new()),
            None => Ok(results),
        }
    }

    /// Whether a search of `nq` queries for `k` takes [`Self::few_path`]: one query, k at most
    /// [`FEW_MAX_K`], at most `Tuning::few_values` stored values over at most [`FEW_MAX_ROWS`]
    /// rows, and the blocks' lists small enough to come back through mapped host memory.
    fn few_rows(&self, nq: usize, k: usize) -> bool {
        nq == 1
            && (1..=FEW_MAX_K).contains(&k)
            && self.len.saturating_mul(self.dim) <= self.tuning.few_values
            && (1..=FEW_MAX_ROWS).contains(&self.len)
            && FewLists::of(self.len.div_ceil(FEW_ROWS), k.min(FEW_ROWS)).bytes <= MAPPED_RESULTS_BYTES
    }

    /// One query over few rows: every row's exact distance in one pass, each block's best kept
    /// in order (`hg_few_topk`, written into mapped host memory), and the blocks' lists merged
    /// here (at most 16,384 pairs; [`merge_block_lists`] reads few of them). One upload and one
    /// launch, against the scan's approximate pass, in-block merges, band check and re-rank in
    /// two. `None` where it cannot run (no mapped memory) or found fewer than k rows: the caller
    /// then takes the other paths, whose checks name the problem. The query's values were
    /// checked finite on the way in ([`Self::search_with`]).
    fn few_path(
        &self,
        ws: &mut Workspace<D>,
        query: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Option<Vec<Vec<Neighbor>>>> {
        let driver = self.driver().clone();
        let mut profile = Profiler::new();
        let blocks = self.len.div_ceil(FEW_ROWS);
        // Between 1 and the block's rows: the kernel writes ranks below its HG_FEW_ROWS rows
        // only (a longer list would keep stale pairs), and a list of none would leave every
        // thread at rank 0. `few_rows` admits k >= 1 only.
        let kb = k.clamp(1, FEW_ROWS);
        let entries = blocks * kb;
        let layout = FewLists::of(blocks, kb);
        let Some(lists) = ws.results.device_address(&*driver, layout.bytes)? else { return Ok(None) };
        // The canonical distance's query norm, as `prepare` computes it; only cosine reads it.
        let q_norm = match metric {
            GpuDistanceMetric::Cosine => crate::exact::squared_norm_f64(query).sqrt(),
            _ => 0.0,
        };
        let base = ws.inputs.get(&driver, align(self.dim * 4))?;
        let staging = ws.staging.get(&*driver, self.dim * 4)?;
        copy_bytes(&mut staging[..self.dim * 4], bytemuck::cast_slice(query))?;
        driver.upload(&ws.stream, base, staging, self.dim * 4)?;
        let (rows, _, dead) = self.arrays_ptrs(ws)?;
        self.device.launch(
            &ws.stream,
            self.device.kernels.few_topk().get(self.precision),
            Launch::new((blocks as u32, 1), FEW_THREADS),
            &FewTopk {
                rows,
                dead,
                n: self.len as u32,
                dim: self.dim as u32,
                q: base,
                q_norm,
                metric: metric_code(metric),
                kb: kb as u32,
                heads: lists,
                keys: lists + layout.keys as u64,
                slots: lists + layout.slots as u64,
            },
        )?;
        driver.synchronize(&ws.stream)?;
        profile.mark(&*driver, &ws.stream, "few rows")?;
        let host: &[u8] = ws.results.get(&*driver, layout.bytes)?;
        let heads: &[u64] = typed(host, 0, blocks)?;
        let keys: &[u64] = typed(host, layout.keys, entries)?;
        let slots: &[u32] = typed(host, layout.slots, entries)?;
        let Some(found) = merge_block_lists(heads, keys, slots, kb, k) else { return Ok(None) };
        let len = self.len;
        let row = found
            .into_iter()
            .map(|(key, slot)| {
                let slot = slot as usize;
                if slot >= len {
                    return Err(HiveGpuError::Internal(format!("the device returned slot {slot} of {len}")));
                }
                Ok(Neighbor { slot, distance: key_f64(key) })
            })
            .collect::<Result<Vec<_>>>()?;
        profile.mark(&*driver, &ws.stream, "merge")?;
        profile.report(&format!("nq 1 k {k} over {len} rows"));
        Ok(Some(vec![row]))
    }

    /// Writes lists the host holds into `sink`'s merge buffer (a gathered filtered search's).
    fn sink_host_lists(
        &self,
        sink: Option<&Sink<'_, D>>,
        found: &[Vec<Neighbor>],
    ) -> Result<Vec<Vec<Neighbor>>> {
        let Some(sink) = sink else { return Ok(found.to_vec()) };
        let k = sink.target.width(sink.list).unwrap_or(0);
        let mut ws = self.checkout()?;
        let written = sink.write_host(&self.device, &mut ws, found, k);
        if written.is_ok() {
            self.checkin(ws);
        }
        written.map(|()| Vec::new())
    }

    /// Where the kernels write a search's results: small ones straight into the workspace's
    /// page-locked host buffer where the driver maps it (a copy back and its wait cost about
    /// 5 us of a 0.2 ms single query), else device memory that [`Self::download_results`]
    /// copies back.
    pub(super) fn outputs(&self, ws: &mut Workspace<D>, nq: usize, k: usize) -> Result<Outputs> {
        let driver = self.driver().clone();
        let bytes = Outputs::bytes_for(nq, k);
        if bytes <= MAPPED_RESULTS_BYTES
            && let Some(base) = ws.results.device_address(&*driver, bytes)?
        {
            return Ok(Outputs { mapped: true, ..Outputs::at(base, nq, k) });
        }
        Ok(Outputs::at(ws.outputs.get(&driver, bytes)?, nq, k))
    }

    /// Waits for the results (copying them back unless mapped): `None` for a query whose band
    /// overflowed its list. With `fewer`, a query may hold fewer than k (an inverted-list
    /// scan's): its list ends at the first slot of all ones.
    pub(super) fn download_results(
        &self,
        ws: &mut Workspace<D>,
        outputs: &Outputs,
        nq: usize,
        k: usize,
        fewer: bool,
    ) -> Result<Vec<Option<Vec<Neighbor>>>> {
        let driver = self.driver().clone();
        let host = if outputs.mapped {
            driver.synchronize(&ws.stream)?;
            ws.results.get(&*driver, outputs.bytes)?
        } else {
            let host = ws.staging.get(&*driver, outputs.bytes)?;
            driver.download(&ws.stream, host, outputs.slots, outputs.bytes)?;
            driver.synchronize(&ws.stream)?;
            host
        };
        let host: &[u8] = host;
        let view = outputs.view(host, nq, k)?;
        let len = self.len;
        let parse = |q: usize| -> Result<Option<Vec<Neighbor>>> {
            if view.flags[q] != 0 {
                return Ok(None);
            }
            let range = q * k..(q + 1) * k;
            // Sized once: collecting through `Result` grows the list by doubling, several
            // allocations per query (docs/PERFORMANCE.md, "Typed kernel ABI and backend primitives").
            let mut row = Vec::with_capacity(k);
            for (&slot, &distance) in view.slots[range.clone()].iter().zip(&view.dist[range]) {
                if fewer && slot == u32::MAX {
                    break;
                }
                let slot = slot as usize;
                if slot >= len {
                    return Err(HiveGpuError::Internal(format!("the device returned slot {slot} of {len}")));
                }
                row.push(Neighbor { slot, distance });
            }
            Ok(Some(row))
        };
        if nq * k >= PARALLEL_RESULTS {
            crate::exec::run(|| (0..nq).into_par_iter().map(parse).collect())?
        } else {
            (0..nq).map(parse).collect()
        }
    }

    pub(super) fn arrays_ptrs(&self, ws: &Workspace<D>) -> Result<(DevicePtr, DevicePtr, DevicePtr)> {
        let arrays = self.arrays.as_ref().ok_or(HiveGpuError::EmptyCollection)?;
        // A filtered search reads its own skip words; without removed rows the kernels skip
        // the bitmap entirely (null pointer).
        let dead = match ws.filtered {
            Some(filtered) => filtered.skip,
            None if self.dead.count() > 0 => arrays.dead.ptr(),
            None => 0,
        };
        Ok((arrays.rows.ptr(), arrays.norms.ptr(), dead))
    }

    /// Finalize: merge `lists` (S per query), check the band, re-rank in f64, write results.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finalize(
        &self,
        ws: &Workspace<D>,
        inputs: &Inputs,
        first_query: usize,
        count: usize,
        k: usize,
        lists: Lists,
        kcap: usize,
        metric: GpuDistanceMetric,
        outputs: &Outputs,
    ) -> Result<()> {
        let segments = lists.segments;
        // Several lists per query: room for the lists' heads (which bound the k-th best) and
        // for every list's prefix inside the first band. An unsorted buffer is all head.
        let mut sortn = (2 * kcap).max(1024);
        let mut head = 0;
        if !lists.sorted {
            head = lists.len;
            sortn = sortn.max(lists.len.next_power_of_two());
        } else if segments > 1 {
            head = (2 * k).div_ceil(segments).clamp(1, kcap);
            let roomy = (4 * kcap).max((segments * head).next_power_of_two()).max(1024);
            if roomy * 8 <= self.shared_limit() {
                sortn = roomy;
            }
            while head > 0 && (segments * head).next_power_of_two() > sortn {
                head -= 1;
            }
        }
        // Few queries leave their blocks most of the device's shared memory: room to stage
        // the query and its candidates' rows in f64 for the re-rank (see hg_rerank).
        let mut stage_bytes = 0;
        if count < GEMM_MIN_QUERIES {
            let line = (self.dim | 1) * 8;
            let lines = (self.shared_limit().saturating_sub(sortn * 8) / line).min(kcap + 1);
            if lines >= 2 {
                stage_bytes = lines * line;
            }
        }
        let (rows, _, _) = self.arrays_ptrs(ws)?;
        let kernel = self.device.kernels.finalize().get(self.precision);
        let q0 = first_query as u64;
        self.device.launch(
            &ws.stream,
            kernel,
            Launch::new((count as u32, 1), BLOCK).shared((sortn * 8 + stage_bytes) as u32),
            &Finalize {
                lists: lists.entries,
                evicted: lists.evicted,
                segments: segments as u32,
                head: head as u32,
                sorted: u32::from(lists.sorted),
                kcap_in: lists.len as u32,
                k: k as u32,
                kcap: kcap as u32,
                sortn: sortn as u32,
                gate_mul: inputs.gate_mul + q0 * 4,
                gate_add: inputs.gate_add + q0 * 4,
                rows,
                dim: self.dim as u32,
                queries: inputs.exact + q0 * self.dim as u64 * 4,
                q_norms: inputs.q_norms + q0 * 8,
                metric: metric_code(metric),
                out_slots: outputs.slots + q0 * k as u64 * 4,
                out_dist: outputs.dist + q0 * k as u64 * 8,
                flags: outputs.flags + q0 * 4,
                stage_bytes: stage_bytes as u32,
            },
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn scan_path(
        &self,
        ws: &mut Workspace<D>,
        inputs: &Inputs,
        nq: usize,
        k: usize,
        metric: GpuDistanceMetric,
        outputs: &Outputs,
        profile: &mut Profiler,
    ) -> Result<()> {
        let driver = self.driver().clone();
        let n = self.len;
        let kcap = list_size(k);
        let sortn = Self::scan_sort_size(k);
        let per_sm = self.tuning.scan_blocks_per_sm;
        // Passes between merge checks; the kernel caps it so the buffer stays half free.
        let max_sub = self.tuning.scan_subrounds;
        let (rows, norms, dead) = self.arrays_ptrs(ws)?;
        let kernel = self.device.kernels.scan_topk().get(self.precision);
        for q0 in (0..nq).step_by(MAX_GRID_Y) {
            let qn = (nq - q0).min(MAX_GRID_Y);
            let blocks_wanted = (driver.multiprocessors() as usize * per_sm / qn).max(1);
            let segments = blocks_wanted.min(n.div_ceil(BLOCK as usize)).max(1);
            let per = n.div_ceil(segments);
            let lists = ws.lists.get(&driver, qn * segments * kcap * 8)?;
            let evicted = ws.evicted.get(&driver, qn * segments * 8)?;
            let offset = q0 as u64;
            self.device.launch(
                &ws.stream,
                kernel,
                Launch::new((segments as u32, qn as u32), BLOCK).shared(self.scan_shared_bytes(k) as u32),
                &ScanTopk {
                    rows,
                    norms,
                    dead,
                    n: n as u32,
                    dim: self.dim as u32,
                    queries: inputs.approx + offset * self.dim as u64 * 4,
                    gate_mul: inputs.gate_mul + offset * 4,
                    gate_add: inputs.gate_add + offset * 4,
                    metric: metric_code(metric),
                    k: k as u32,
                    kcap: kcap as u32,
                    sortn: sortn as u32,
                    per: per as u32,
                    max_sub: max_sub as u32,
                    lists,
                    evicted,
                },
            )?;
            profile.mark(&*driver, &ws.stream, "scan")?;
            let lists = Lists { entries: lists, evicted, segments, len: kcap, sorted: true };
            self.finalize(ws, inputs, q0, qn, k, lists, kcap, metric, outputs)?;
            profile.mark(&*driver, &ws.stream, "finalize")?;
        }
        Ok(())
    }

    /// The operands of `path`'s GEMM: a `RoundedF16` filter's sample runs on TF32 (cuBLAS has
    /// no f32-rows-in-f16 GEMM) under the filter's narrower gate (its threshold is a guess
    /// either way, which the filter's finalize proves or rejects); byte rows on an f16 path
    /// multiply their f16 copy.
    fn product_operands(&self, inputs: &Inputs, path: Approximation, rows: DevicePtr) -> Operands {
        let (kind, queries, element) = match path {
            Approximation::GemmF16 { .. } => (GemmInputs::F16, inputs.half, 2u64),
            Approximation::GemmTf32 | Approximation::RoundedF16 { .. } => {
                (GemmInputs::Tf32, inputs.approx, 4)
            }
            _ => (GemmInputs::F32, inputs.approx, 4),
        };
        let inv_scale = if matches!(path, Approximation::GemmF16 { .. }) { inputs.inv_scale } else { 0 };
        let (rows, row_element) = match inputs.product_rows {
            0 => (rows, self.element_bytes() as u64),
            copy => (copy, 2),
        };
        Operands { kind, queries, element, rows, row_element, inv_scale }
    }

    /// One GEMM tile of products on `stream`: the engine's own tiles where the metric or the
    /// stored type needs them (and no f16 copy stands in for the rows), else the GEMM.
    fn products(
        &self,
        stream: &D::Stream,
        g: &GemmTn,
        metric: GpuDistanceMetric,
        inputs: &Inputs,
    ) -> Result<()> {
        if self.own_tiles(metric) && inputs.product_rows == 0 {
            self.device.tiles(stream, g, metric, self.precision)
        } else {
            self.device.gemm(stream, g, self.tuning.own_gemm)
        }
    }

    /// Every `stride`-th norm side by side in the workspace: a sample's norms, read by the
    /// selections by sample row.
    fn sample_norms(&self, ws: &mut Workspace<D>, norms: DevicePtr, stride: usize) -> Result<DevicePtr> {
        let driver = self.driver().clone();
        let n = self.len.div_ceil(stride);
        let gathered = ws.sample_norms.get(&driver, n * 4)?;
        self.device.launch(
            &ws.stream,
            self.device.kernels.strided_norms,
            Launch::new((n.div_ceil(BLOCK as usize).min(1024) as u32, 1), BLOCK),
            &StridedNorms { norms, stride: stride as u32, count: n as u32, out: gathered },
        )?;
        Ok(gathered)
    }

    #[allow(clippy::too_many_arguments)]
    fn tile_path(
        &self,
        ws: &mut Workspace<D>,
        inputs: &Inputs,
        nq: usize,
        k: usize,
        metric: GpuDistanceMetric,
        path: Approximation,
        outputs: &Outputs,
        profile: &mut Profiler,
    ) -> Result<()> {
        let driver = self.driver().clone();
        let (n, dim) = (self.len, self.dim);
        let kcap = self.path_list_size(k, path);
        let sortn = (2 * kcap).max(2048);
        let chunk = self.tuning.tile_queries.min(nq).min(MAX_GRID_Y);
        let tile_budget = self.tuning.tile_bytes;
        let tile_rows = (tile_budget / (chunk * 4)).clamp(256, n.max(256)).div_ceil(256) * 256;
        let tile_rows = self.tuning.tile_rows.unwrap_or(tile_rows).min(n.div_ceil(256) * 256);
        // Segments per query so that even a few queries fill the device.
        let wanted = (driver.multiprocessors() as usize * 8).div_ceil(chunk);
        let segments = wanted.min(tile_rows.div_ceil(1024)).max(1);
        // Whole 256-column blocks per segment keep every segment's loads aligned.
        let seg = tile_rows.div_ceil(segments).div_ceil(256) * 256;
        let states = chunk * segments;
        let tiles = [
            ws.tiles[0].get(&driver, chunk * tile_rows * 4)?,
            ws.tiles[1].get(&driver, chunk * tile_rows * 4)?,
        ];
        let lists = ws.lists.get(&driver, states * kcap * 8)?;
        let evicted = ws.evicted.get(&driver, states * 8)?;
        let thresholds = ws.thresholds.get(&driver, states * 4)?;
        let (rows, norms, dead) = self.arrays_ptrs(ws)?;
        let Operands { kind: inputs_kind, queries, element, rows, row_element, inv_scale } =
            self.product_operands(inputs, path, rows);
        for q0 in (0..nq).step_by(chunk) {
            let qc = chunk.min(nq - q0);
            driver.fill(&ws.stream, lists, 0xff, qc * segments * kcap * 8)?;
            driver.fill(&ws.stream, evicted, 0xff, qc * segments * 8)?;
            // 0x7f7f7f7f is 3.4e38: above every distance, so "no threshold yet".
            driver.fill(&ws.stream, thresholds, 0x7f, qc * segments * 4)?;
            // The GEMM stream starts after the inputs and the reset lists are in place.
            driver.record(&ws.events[0][1], &ws.stream)?;
            driver.record(&ws.events[1][1], &ws.stream)?;
            for (t, r0) in (0..n).step_by(tile_rows).enumerate() {
                let rt = tile_rows.min(n - r0);
                let (buffer, [gemm_done, select_done]) = (t % 2, &ws.events[t % 2]);
                let tile = tiles[buffer];
                // GEMM t+1 fills the other buffer while tile t is being selected.
                driver.wait(&ws.gemm_stream, select_done)?;
                let products = GemmTn {
                    m: rt,
                    n: qc,
                    k: dim,
                    a: rows + r0 as u64 * dim as u64 * row_element,
                    lda: dim,
                    b: queries + q0 as u64 * dim as u64 * element,
                    ldb: dim,
                    c: tile,
                    ldc: tile_rows,
                    inputs: inputs_kind,
                };
                self.products(&ws.gemm_stream, &products, metric, inputs)?;
                driver.record(gemm_done, &ws.gemm_stream)?;
                profile.mark(&*driver, &ws.gemm_stream, "gemm")?;
                driver.wait(&ws.stream, gemm_done)?;
                self.device.launch(
                    &ws.stream,
                    self.device.kernels.tile_topk,
                    Launch::new((segments as u32, qc as u32), BLOCK).shared((sortn * 8) as u32),
                    &TileTopk {
                        dots: tile,
                        ldc: tile_rows as u32,
                        tile_rows: rt as u32,
                        row0: r0 as u32,
                        seg: seg as u32,
                        norms,
                        dead,
                        metric: metric_code(metric),
                        inv_scale: if inv_scale == 0 { 0 } else { inv_scale + q0 as u64 * 4 },
                        gate_mul: inputs.gate_mul + q0 as u64 * 4,
                        gate_add: inputs.gate_add + q0 as u64 * 4,
                        k: k as u32,
                        kcap: kcap as u32,
                        sortn: sortn as u32,
                        lists,
                        evicted,
                        thresholds,
                    },
                )?;
                driver.record(select_done, &ws.stream)?;
                profile.mark(&*driver, &ws.stream, "select")?;
            }
            let lists = Lists { entries: lists, evicted, segments, len: kcap, sorted: true };
            self.finalize(ws, inputs, q0, qc, k, lists, kcap, metric, outputs)?;
            profile.mark(&*driver, &ws.stream, "finalize")?;
        }
        Ok(())
    }

    /// The fused filter: thresholds guessed from a sample of every `SAMPLE_STRIDE`-th row,
    /// then one tensor-core kernel per query chunk that keeps the rows below them, then the
    /// usual finalize over each query's buffer.
    #[allow(clippy::too_many_arguments)]
    fn fused_path(
        &self,
        ws: &mut Workspace<D>,
        inputs: &Inputs,
        nq: usize,
        k: usize,
        metric: GpuDistanceMetric,
        path: Approximation,
        outputs: &Outputs,
        profile: &mut Profiler,
    ) -> Result<()> {
        let driver = self.driver().clone();
        let tensor = self.device.kernels.tensor.as_ref().ok_or_else(|| {
            HiveGpuError::Internal("fused filter planned on a device without tensor-core kernels".into())
        })?;
        let (n, dim) = (self.len, self.dim);
        // Thresholds, then every query's smallest dropped entry: the threshold itself, since
        // only rows above it are dropped (slot 0 keeps the key at or below any such row's).
        let state_bytes = align(nq * 4) + align(nq * 8);
        let state = ws.fused_state.get(&driver, state_bytes)?;
        let (tau_ptr, evicted_ptr) = (state, state + align(nq * 4) as u64);
        self.sample_thresholds(ws, inputs, nq, k, metric, path, profile, tau_ptr, evicted_ptr)?;

        let kcap = self.path_list_size(k, path);
        let chunk = self.tuning.tile_queries.min(nq);
        let cand = ws.fused_cand.get(&driver, chunk * FUSED_CAP * 8)?;
        let counts = ws.fused_counts.get(&driver, chunk * 4)?;
        let (rows, norms, dead) = self.arrays_ptrs(ws)?;
        let (kernel, queries, element, rows, row_element) = match path {
            Approximation::GemmF16 { .. } => {
                let rows = if inputs.product_rows == 0 { rows } else { inputs.product_rows };
                (tensor.f16, inputs.half, 2u64, rows, 2)
            }
            Approximation::RoundedF16 { row_scale, .. } => {
                match self.rounded_rows(ws, rows, row_scale, nq)? {
                    Some(copy) => (tensor.f16, inputs.half, 2, copy, 2),
                    // bf16 rows have nothing for the filter to convert: without room for their
                    // copy, the own tiles (whose f32 error is inside this path's band).
                    None if self.precision == StoragePrecision::Bf16 => {
                        let path = Approximation::GemmF32;
                        return self.tile_path(ws, inputs, nq, k, metric, path, outputs, profile);
                    }
                    None => (tensor.f32h, inputs.half, 2, rows, 4),
                }
            }
            _ => (tensor.tf32, inputs.approx, 4, rows, 4),
        };
        let row_scale = match path {
            Approximation::RoundedF16 { row_scale, .. } => row_scale as f32,
            _ => 1.0,
        };
        let shared = mma_shared_bytes(row_element, element as usize, dim);
        for q0 in (0..nq).step_by(chunk) {
            let qc = chunk.min(nq - q0);
            let (tiles, row_groups) = self.fused_grid(n, qc);
            driver.fill(&ws.stream, cand, 0xff, qc * FUSED_CAP * 8)?;
            driver.fill(&ws.stream, counts, 0, qc * 4)?;
            let q = q0 as u64;
            self.device.launch(
                &ws.stream,
                kernel,
                Launch::new((qc.div_ceil(MMA_TILE) as u32, row_groups as u32), BLOCK).shared(shared as u32),
                &MmaFilter {
                    rows,
                    norms,
                    dead,
                    n: n as u32,
                    tiles: tiles as u32,
                    dim: dim as u32,
                    queries: queries + q * dim as u64 * element,
                    nq: qc as u32,
                    inv_scale: if inputs.inv_scale == 0 { 0 } else { inputs.inv_scale + q * 4 },
                    row_scale,
                    tau: tau_ptr + q * 4,
                    metric: metric_code(metric),
                    cap: FUSED_CAP as u32,
                    cand,
                    counts,
                    evicted: evicted_ptr + q * 8,
                },
            )?;
            profile.mark(&*driver, &ws.stream, "filter")?;
            let lists = Lists {
                entries: cand,
                evicted: evicted_ptr + q * 8,
                segments: 1,
                len: FUSED_CAP,
                sorted: false,
            };
            self.finalize(ws, inputs, q0, qc, k, lists, kcap, metric, outputs)?;
            profile.mark(&*driver, &ws.stream, "finalize")?;
        }
        Ok(())
    }

    /// The rows scaled by `row_scale` and rounded to f16 in `ws`, for the f16 filter over `nq`
    /// queries, if the copy fits `Tuning::rounded_copy_bytes` and the device's memory and the
    /// batch has `Tuning::rounded_copy_min_queries` (bf16 rows, which the filter cannot
    /// convert, always copy). One pass over the rows per search costs less than converting
    /// every staged step in every block of the filter, which re-reads the rows once per 128
    /// queries; but a batch of one such tile reads them once either way, and the copy's pass
    /// (4 bytes read and 2 written per value) then doubles the traffic. Beyond the budget,
    /// with too little memory, or for few queries, the filter converts f32 rows in place
    /// (`f32h`); bf16 rows without their copy take the f32 tiles (`fused_path`).
    fn rounded_rows(
        &self,
        ws: &mut Workspace<D>,
        rows: DevicePtr,
        row_scale: f64,
        nq: usize,
    ) -> Result<Option<DevicePtr>> {
        let Some(tensor) = self.device.kernels.tensor.as_ref() else {
            return Ok(None);
        };
        let bf16 = self.precision == StoragePrecision::Bf16;
        // Unlike the other sizes, 0 is a setting here: no copy.
        if self.len * self.dim * 2 > self.tuning.rounded_copy_bytes
            || (nq < self.tuning.rounded_copy_min_queries && !bf16)
        {
            return Ok(None);
        }
        let Some((copy, quads, launch)) = self.f16_copy_buffer(ws)? else { return Ok(None) };
        let kernel = if bf16 { tensor.round_bf16_rows } else { tensor.round_rows };
        self.device.launch(
            &ws.stream,
            kernel,
            launch,
            &RoundRows { rows, out: copy, quads: quads as u64, scale: row_scale as f32 },
        )?;
        Ok(Some(copy))
    }

    /// The workspace's buffer for an f16 copy of every row (rounded or widened), the copy's
    /// count of 4-value quads and the launch of its conversion kernel (a thread per quad, at
    /// most 16 blocks per multiprocessor, looping); None where the device has no room.
    fn f16_copy_buffer(&self, ws: &mut Workspace<D>) -> Result<Option<(DevicePtr, usize, Launch)>> {
        let values = self.len * self.dim;
        let driver = self.driver().clone();
        let copy = match ws.rounded_rows.get(&driver, values * 2) {
            Ok(copy) => copy,
            Err(HiveGpuError::VramLimitExceeded { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let quads = values / 4;
        let blocks = quads.div_ceil(BLOCK as usize).min(driver.multiprocessors() as usize * 16).max(1);
        Ok(Some((copy, quads, Launch::new((blocks as u32, 1), BLOCK))))
    }

    /// Row tiles each block of the fused filter streams for `qc` queries over `n` rows, and
    /// the grid's row groups. A block loads its 128 queries once for all its tiles, so more
    /// tiles a block read fewer bytes; but the grid must also fill the device: 100k rows x
    /// 1,000 queries at 32 tiles a block are 200 blocks for 132 multiprocessors, each running
    /// two at a time (docs/PERFORMANCE.md, "The fused filter's grid follows the problem").
    /// So the tiles shrink until the grid holds `Tuning::fused_blocks_per_sm` blocks a
    /// multiprocessor (0: always `Tuning::fused_tiles`), and grow past that where the row
    /// groups would not fit the grid's second dimension.
    fn fused_grid(&self, n: usize, qc: usize) -> (usize, usize) {
        let (most, per_sm) = (self.tuning.fused_tiles, self.tuning.fused_blocks_per_sm);
        fused_grid(n, qc, self.driver().multiprocessors() as usize, per_sm, most)
    }

    /// Each query's fused-filter threshold and smallest dropped entry, written to `tau` and
    /// `evicted` on the device (`hg_sample_tau`): the approximate distance its j-th nearest row
    /// of the sample (every `SAMPLE_STRIDE`-th slot) reaches, with j such that about 2k + 8 *
    /// SAMPLE_STRIDE rows of the collection are expected below it, widened by
    /// `SAMPLE_WIDEN` of the query's gate bands. The sample's products are the path's GEMM,
    /// with the whole sample in one tile per chunk of queries. +inf where the sample is too
    /// small (every row then passes, and an overflowing buffer flags the query).
    ///
    /// The threshold is a guess that the finalize proves or rejects: a query whose band
    /// reaches past it is flagged and searched again on a narrower path. So it needs no exact
    /// search of the sample and no trip through the host, which together took 0.27 ms of a
    /// 1,000-query batch over 100k rows (docs/PERFORMANCE.md, the shape sweep's follow-up).
    #[allow(clippy::too_many_arguments)]
    fn sample_thresholds(
        &self,
        ws: &mut Workspace<D>,
        inputs: &Inputs,
        nq: usize,
        k: usize,
        metric: GpuDistanceMetric,
        path: Approximation,
        profile: &mut Profiler,
        tau: DevicePtr,
        evicted: DevicePtr,
    ) -> Result<()> {
        let driver = self.driver().clone();
        // hg_sample_tau ranks one value per thread: j <= BLOCK (sample_rank keeps j far below
        // it for every k the filter's buffer admits).
        let Some(j) = self.sample_rank(ws, k).filter(|&j| j <= BLOCK as usize) else {
            let infinite = vec![f32::INFINITY; nq];
            let evicted_keys = vec![entry_key(f32::INFINITY, 0); nq];
            // The staging buffer may still feed the inputs' upload (or be reallocated): wait.
            driver.synchronize(&ws.stream)?;
            let host = ws.staging.get(&*driver, align(nq * 4) + nq * 8)?;
            host[..nq * 4].copy_from_slice(bytemuck::cast_slice(&infinite));
            host[align(nq * 4)..align(nq * 4) + nq * 8].copy_from_slice(bytemuck::cast_slice(&evicted_keys));
            driver.upload_at(&ws.stream, tau, host, 0, nq * 4)?;
            driver.upload_at(&ws.stream, evicted, host, align(nq * 4), nq * 8)?;
            return Ok(());
        };
        let (stride, dim) = (SAMPLE_STRIDE, self.dim);
        let n = self.len.div_ceil(stride);
        let (rows, norms, dead) = self.arrays_ptrs(ws)?;
        let norms = if metric == GpuDistanceMetric::DotProduct {
            norms
        } else {
            self.sample_norms(ws, norms, stride)?
        };
        let operands = self.product_operands(inputs, path, rows);
        // A leading dimension of whole 16-byte units.
        let ldc = n.div_ceil(4) * 4;
        let chunk = (self.tuning.tile_bytes / (ldc * 4)).clamp(1, nq);
        let tile = ws.tiles[0].get(&driver, chunk * ldc * 4)?;
        let [gemm_done, tau_done] = &ws.events[0];
        for q0 in (0..nq).step_by(chunk) {
            let qc = chunk.min(nq - q0);
            let products = GemmTn {
                m: n,
                n: qc,
                k: dim,
                a: operands.rows,
                lda: dim * stride,
                b: operands.queries + q0 as u64 * dim as u64 * operands.element,
                ldb: dim,
                c: tile,
                ldc,
                inputs: operands.kind,
            };
            // cuBLAS runs on the GEMM stream (the one with a handle), after the inputs are in
            // place and the previous chunk's thresholds have read the tile.
            driver.record(tau_done, &ws.stream)?;
            driver.wait(&ws.gemm_stream, tau_done)?;
            self.products(&ws.gemm_stream, &products, metric, inputs)?;
            driver.record(gemm_done, &ws.gemm_stream)?;
            driver.wait(&ws.stream, gemm_done)?;
            self.device.launch(
                &ws.stream,
                self.device.kernels.sample_tau,
                Launch::new((qc as u32, 1), BLOCK),
                &SampleTau {
                    dots: tile,
                    ldc: ldc as u32,
                    rows_n: n as u32,
                    stride: stride as u32,
                    norms,
                    dead,
                    metric: metric_code(metric),
                    inv_scale: if operands.inv_scale == 0 { 0 } else { operands.inv_scale + q0 as u64 * 4 },
                    gate_add: inputs.gate_add + q0 as u64 * 4,
                    j: j as u32,
                    widen: SAMPLE_WIDEN,
                    tau: tau + q0 as u64 * 4,
                    evicted: evicted + q0 as u64 * 8,
                },
            )?;
        }
        profile.mark(&*driver, &ws.stream, "sample")?;
        Ok(())
    }

    /// The k smallest (key, slot) pairs of the re-ranked list `keys` / `slots` (`count` long),
    /// by a radix select of the composite (see `hg_select_hist` in `kernels/search.cu`): returns
    /// them, unsorted and padded with empty pairs to a power of two, with that length.
    pub(super) fn select_k_pairs(
        &self,
        ws: &mut Workspace<D>,
        keys: DevicePtr,
        slots: DevicePtr,
        count: usize,
        k: usize,
        radix: DevicePtr,
    ) -> Result<(DevicePtr, DevicePtr, usize)> {
        let driver = self.driver().clone();
        let kernels = &self.device.kernels;
        let padded = k.next_power_of_two();
        let selected_keys = ws.selected_keys.get(&driver, padded * 8)?;
        let selected_slots = ws.selected_slots.get(&driver, padded * 4)?;
        // Empty pairs (all ones: HG_NONE keys, slot 0xffffffff) sort last.
        driver.fill(&ws.stream, selected_keys, 0xff, padded * 8)?;
        driver.fill(&ws.stream, selected_slots, 0xff, padded * 4)?;
        // The radix buffer: the histogram (256 words), then the radix path's 4-word state, then
        // this selection's 8 words.
        let (hist, state) = (radix, radix + 1024 + 16);
        let start = SelectState { remaining: k as u32, ..bytemuck::Zeroable::zeroed() };
        let host = ws.staging.get(&*driver, std::mem::size_of::<SelectState>())?;
        driver.synchronize(&ws.stream)?;
        host[..std::mem::size_of::<SelectState>()].copy_from_slice(bytemuck::bytes_of(&start));
        driver.upload(&ws.stream, state, host, std::mem::size_of::<SelectState>())?;
        driver.fill(&ws.stream, hist, 0, 1024)?;
        let grid = (driver.multiprocessors() * 8).min(count.div_ceil(BLOCK as usize).max(1) as u32);
        for pass in 0..12u32 {
            self.device.launch(
                &ws.stream,
                kernels.select_hist,
                Launch::new((grid, 1), BLOCK),
                &SelectHist { keys, slots, n: count as u32, state, pass, hist },
            )?;
            self.device.launch(
                &ws.stream,
                kernels.select_pick,
                Launch::new((1, 1), 1),
                &SelectPick { hist, state, pass },
            )?;
        }
        self.device.launch(
            &ws.stream,
            kernels.select_collect,
            Launch::new((grid, 1), BLOCK),
            &SelectCollect {
                keys,
                slots,
                n: count as u32,
                state,
                out_keys: selected_keys,
                out_slots: selected_slots,
            },
        )?;
        // Exactly k pairs must have been kept (slots are unique, so the composite is): anything
        // else is a broken kernel, never a silently short result.
        let host = ws.staging.get(&*driver, std::mem::size_of::<SelectState>())?;
        driver.download(&ws.stream, host, state, std::mem::size_of::<SelectState>())?;
        driver.synchronize(&ws.stream)?;
        let kept = read_back::<SelectState>(host)?.count as usize;
        if kept != k {
            return Err(HiveGpuError::Internal(format!(
                "the selection kept {kept} of {count} pairs for k = {k}"
            )));
        }
        Ok((selected_keys, selected_slots, padded))
    }

    /// The radix-select path for query `q`: any k, any band size.
    #[allow(clippy::too_many_arguments)]
    fn radix_one(
        &self,
        ws: &mut Workspace<D>,
        inputs: &Inputs,
        q: usize,
        k: usize,
        metric: GpuDistanceMetric,
        outputs: &Outputs,
        gate: (f32, f32),
        q_norm: f64,
    ) -> Result<()> {
        let driver = self.driver().clone();
        let (n, dim) = (self.len, self.dim);
        let (rows, norms, dead) = self.arrays_ptrs(ws)?;
        let dist = ws.dist.get(&driver, n * 4)?;
        let cand = ws.cand.get(&driver, n * 4)?;
        let radix = ws.radix.get(&driver, 256 * 4 + 64)?;
        let (hist, state) = (radix, radix + 1024);
        let kernels = &self.device.kernels;
        let grid = driver.multiprocessors() * 8;
        let query = inputs.approx + (q * dim * 4) as u64;
        self.device.launch(
            &ws.stream,
            kernels.scan_all().get(self.precision),
            Launch::new((grid, 1), BLOCK),
            &ScanAll {
                rows,
                norms,
                dead,
                n: n as u32,
                dim: dim as u32,
                q: query,
                metric: metric_code(metric),
                dist,
            },
        )?;
        let start = RadixState { prefix: 0, mask: 0, remaining: k as u32, count: 0 };
        let host = ws.staging.get(&*driver, outputs.bytes.max(std::mem::size_of::<RadixState>()))?;
        driver.synchronize(&ws.stream)?;
        host[..std::mem::size_of::<RadixState>()].copy_from_slice(bytemuck::bytes_of(&start));
        driver.upload(&ws.stream, state, host, std::mem::size_of::<RadixState>())?;
        driver.fill(&ws.stream, hist, 0, 1024)?;
        for shift in [24u32, 16, 8, 0] {
            self.device.launch(
                &ws.stream,
                kernels.radix_hist,
                Launch::new((grid, 1), BLOCK),
                &RadixHist { dist, n: n as u32, state, shift, hist },
            )?;
            self.device.launch(
                &ws.stream,
                kernels.radix_pick,
                Launch::new((1, 1), 1),
                &RadixPick { hist, state, shift },
            )?;
        }
        self.device.launch(
            &ws.stream,
            kernels.radix_collect,
            Launch::new((grid, 1), BLOCK),
            &RadixCollect { dist, n: n as u32, state, mul: gate.0, add: gate.1, cand },
        )?;
        let host = ws.staging.get(&*driver, outputs.bytes.max(std::mem::size_of::<RadixState>()))?;
        driver.download(&ws.stream, host, state, std::mem::size_of::<RadixState>())?;
        driver.synchronize(&ws.stream)?;
        let count = read_back::<RadixState>(host)?.count as usize;
        if count < k || count > n {
            return Err(HiveGpuError::Internal(format!(
                "radix select found {count} candidates for k = {k} of {n}"
            )));
        }
        let padded = count.next_power_of_two();
        let pairs = Pairs {
            keys: ws.keys.get(&driver, padded * 8)?,
            slots: ws.slots.get(&driver, padded * 4)?,
            count,
            padded,
        };
        let query = inputs.exact + (q * dim * 4) as u64;
        self.rerank_keys(ws, cand, count, query, q_norm, metric, pairs)?;
        self.write_top_k(ws, pairs, k, radix, ResultSlot::of(outputs, q, k))
    }
}

/// `GpuRows::fused_grid` for a device of `multiprocessors`: (row tiles a block, row groups).
fn fused_grid(n: usize, qc: usize, multiprocessors: usize, per_sm: usize, most: usize) -> (usize, usize) {
    let row_tiles = n.div_ceil(MMA_TILE);
    let most = most.max(1);
    let tiles = match per_sm {
        0 => most,
        per_sm => {
            let wanted = multiprocessors.saturating_mul(per_sm).max(1);
            row_tiles.saturating_mul(qc.div_ceil(MMA_TILE)).div_ceil(wanted).clamp(1, most)
        }
    };
    let tiles = tiles.max(row_tiles.div_ceil(MAX_GRID_Y));
    (tiles, row_tiles.div_ceil(tiles))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fused_grid_fills_the_device_on_mid_sizes_and_keeps_long_blocks_on_large_ones() {
        use super::{MAX_GRID_Y, MMA_TILE, fused_grid};
        // 100k rows x 1,000 queries on 132 multiprocessors: 782 x 8 tiles over 1,056 wanted
        // blocks is 6 tiles a block (32 gave 200 blocks, under two a multiprocessor).
        assert_eq!(fused_grid(100_000, 1_000, 132, 8, 32), (6, 131));
        // 1M rows x 2,000 queries has blocks to spare: the most tiles a block.
        assert_eq!(fused_grid(1_000_000, 2_000, 132, 8, 32), (32, 245));
        // Few rows: one tile a block; 0 aims at nothing and keeps the most.
        assert_eq!(fused_grid(10_253, 1_000, 132, 8, 32), (1, 81));
        assert_eq!(fused_grid(10_253, 1_000, 132, 0, 3), (3, 27));
        // Settings of 0 or huge never panic, and the row groups always fit the grid's y.
        for (n, qc, sms, per_sm, most) in
            [(1, 1, 0, 8, 0), (5_000_000_000, 4096, 132, usize::MAX, 32), (10_000_000_000, 1, 1, 1, 1)]
        {
            let (tiles, groups) = fused_grid(n, qc, sms, per_sm, most);
            assert!(tiles >= 1 && groups <= MAX_GRID_Y, "{n} {qc}: {tiles} {groups}");
            assert!(tiles * groups >= n.div_ceil(MMA_TILE), "{n}: rows left out");
        }
    }

    #[test]
    fn the_block_lists_merge_to_the_k_least_pairs_reading_each_only_to_the_heads_bound() {
        // Blocks of up to 32 rows as the kernel lists them: each block's min(k, 32) best
        // ascending, padded with empty pairs; many equal keys across and within blocks, blocks
        // with few or no rows, k up to 128 (above 32 a list is its whole block), and up to 200
        // blocks so that the heads' bound is at work in most cases.
        let mut seed = 7u64;
        let mut next = move |below: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % below
        };
        let mut bounded = 0;
        for case in 0..400 {
            let blocks = 1 + next(200) as usize;
            let full = 1 + next(super::FEW_ROWS as u64) as usize;
            let k = 1 + next(128) as usize;
            let kb = k.min(super::FEW_ROWS);
            let mut all = Vec::new();
            let (mut heads, mut keys, mut slots) = (Vec::new(), Vec::new(), Vec::new());
            for b in 0..blocks {
                let rows = if next(4) == 0 { next(full as u64 + 1) as usize } else { full };
                let mut list: Vec<(u64, u32)> =
                    (0..rows).map(|r| (next(50), (b * super::FEW_ROWS + r) as u32)).collect();
                list.sort_unstable();
                all.extend_from_slice(&list);
                list.truncate(kb);
                // Past a block's live rows the kernel's keys are all ones and its slots mean
                // nothing: here, slots of the block's own.
                while list.len() < kb {
                    list.push((u64::MAX, (b * super::FEW_ROWS + list.len()) as u32));
                }
                heads.push(list[0].0);
                keys.extend(list.iter().map(|p| p.0));
                slots.extend(list.iter().map(|p| p.1));
            }
            all.sort_unstable();
            let what = format!("case {case}: {blocks} blocks of {full}, k {k}");
            let bound = super::heads_bound(&heads, k);
            if all.len() >= k {
                // Sound: no pair of the k best lies above it.
                assert!(all[k - 1].0 <= bound, "{what}");
            }
            let mut real: Vec<u64> = heads.iter().copied().filter(|&key| key != u64::MAX).collect();
            real.sort_unstable();
            if real.len() >= k {
                // Tight: the k-th least head, below every empty pair.
                assert_eq!(bound, real[k - 1], "{what}");
                bounded += 1;
            } else {
                assert_eq!(bound, u64::MAX - 1, "{what}");
            }
            let got = super::merge_block_lists(&heads, &keys, &slots, kb, k);
            if all.len() < k {
                assert_eq!(got, None, "{what}");
            } else {
                assert_eq!(got, Some(all[..k].to_vec()), "{what}");
            }
        }
        assert!(bounded >= 100, "only {bounded} cases had a bound below every pair");
    }
}
