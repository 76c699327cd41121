//! The inverted-list scan on the device: [`RowStore::scan_lists`] (IVF-Flat's search after
//! probing its centroids).
//!
//! The (query, probed list) pairs of a batch are ordered by list and cut into groups of up to
//! [`LIST_GROUP`] queries that probe the same list. One block of `hg_list_topk` per group
//! reads each row of the list once, through its slot, and scores it against every query of
//! the group; each query keeps its own candidate list as the single-query scan does (the
//! same distances, gate and merges). Each query's `nprobe` lists then go through the exact
//! search's finalize (band check, f64 re-rank, top-k), so the results are exact over the
//! scanned rows, as on every backend. A query whose band overflowed its lists (heavy ties)
//! is answered again through `refine`.
//!
//! The lists live on the device as one array: `nlist + 1` offsets, then every list's slots.
//! It is uploaded once per [`ListProbes::generation`] and reused while that holds; a
//! compaction or a clear of the rows drops it.
//!
//! [`RowStore::scan_lists`]: crate::backend::RowStore::scan_lists

use std::sync::Arc;

use super::abi::{Launch, ListTopk};
use super::driver::Driver;
use super::kernels::{BLOCK, LIST_GROUP};
use super::memory::{DeviceBuffer, Workspace};
use super::prepare::prepare;
use super::rows::GpuRows;
use super::search::{Inputs, Lists, MAX_LIST, Profiler, align, copy_bytes, list_size};
use crate::backend::Neighbor;
use crate::backend::candidates::{ListProbes, check_scan, scan_by_refine};
use crate::error::{HiveGpuError, Result};
use crate::exact::gates::Approximation;
use crate::exact::metric_code;
use crate::slots::SlotSet;
use crate::types::GpuDistanceMetric;
use crate::types::StoragePrecision;

/// Candidate lists of one launch (queries x nprobe x splits x kcap entries) stay under this
/// many bytes: a batch with more runs in pieces of queries.
const CANDIDATE_BYTES: usize = 256 << 20;

/// A batch with fewer groups than this many per multiprocessor splits each list between
/// blocks (one query's 4 lists would keep 4 of the H100's 132 multiprocessors busy).
const GROUPS_PER_SM: usize = 2;

/// Rows a block scans at least when lists are split: one round of the kernel's 8 warps.
const MIN_SPLIT_ROWS: usize = 128;

/// Parts a list is split into, at most.
const MAX_SPLITS: usize = 32;

/// A copy of inverted lists in device memory: `lists + 1` u32 offsets, then the slots.
#[derive(Debug)]
pub(super) struct DeviceLists<D: Driver> {
    generation: u64,
    lists: usize,
    buffer: DeviceBuffer<D>,
}

impl<D: Driver> DeviceLists<D> {
    /// Bytes of device memory it holds.
    pub(super) fn bytes(&self) -> usize {
        self.buffer.bytes()
    }
}

impl<D: Driver> GpuRows<D> {
    /// [`RowStore::scan_lists`] on the device (see the module docs). Where the kernel does not
    /// apply (k beyond on-chip lists, a batch of more than 2^32 pairs) the default through
    /// `refine` answers.
    pub(super) fn scan_lists_on_device(
        &self,
        queries: &[f32],
        probes: &ListProbes<'_>,
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nq = check_scan(self.dim, queries, probes, k)?;
        let fits = list_size(k) <= MAX_LIST
            && self.group_size(k) >= 1
            && u32::try_from(nq * probes.nprobe).is_ok()
            && self.tuning.list_scan
            && !metric.is_difference_norm()
            // `hg_list_topk` is built for f32 and f16 rows; the others are refined.
            && matches!(self.precision, StoragePrecision::F32 | StoragePrecision::F16);
        if !fits {
            return scan_by_refine(self, queries, probes, k, metric, allowed);
        }
        let lists = self.device_lists(probes)?;
        if nq == 0 || self.len == 0 {
            return Ok(vec![Vec::new(); nq]);
        }
        self.refresh_dead()?;
        let mut ws = self.checkout()?;
        let outcome = self
            .mask_workspace(&mut ws, allowed, None)
            .and_then(|()| self.scan_lists_in(&mut ws, queries, probes, &lists, k, metric));
        ws.filtered = None;
        if outcome.is_ok() {
            self.checkin(ws);
        }
        let mut found = outcome?;
        // Queries whose band overflowed their lists: the exact refine of their members.
        let flagged: Vec<usize> = (0..nq).filter(|&q| found[q].is_none()).collect();
        let mut results = Vec::with_capacity(nq);
        if !flagged.is_empty() {
            let dim = self.dim;
            let subset: Vec<f32> =
                flagged.iter().flat_map(|&q| queries[q * dim..(q + 1) * dim].iter().copied()).collect();
            let subset_probes: Vec<u32> =
                flagged.iter().flat_map(|&q| probes.of(q).iter().copied()).collect();
            let again = ListProbes { probes: &subset_probes, ..*probes };
            let answers = scan_by_refine(self, &subset, &again, k, metric, allowed)?;
            for (&q, answer) in flagged.iter().zip(answers) {
                found[q] = Some(answer);
            }
        }
        for answer in found {
            results.push(answer.ok_or_else(|| HiveGpuError::Internal("a list scan stayed flagged".into()))?);
        }
        Ok(results)
    }

    /// Shared-memory words (u64) one query of a group takes: its candidate list, then its
    /// values in whole 16-byte units (as `hg_list_topk` lays them out).
    fn group_stride(&self, k: usize) -> usize {
        Self::scan_sort_size(k) + self.dim.div_ceil(4) * 2
    }

    /// Queries per group of the list kernel: [`LIST_GROUP`], or fewer where their lists do not
    /// fit the block's shared memory (0: not even one).
    fn group_size(&self, k: usize) -> usize {
        (self.shared_limit() / (self.group_stride(k) * 8)).min(LIST_GROUP)
    }

    /// Parts each list is split into for a batch of `nq` queries in groups of `group`: 1 for
    /// batches that fill the device with groups, else enough for [`GROUPS_PER_SM`] blocks per
    /// multiprocessor while a part of an average probed list keeps [`MIN_SPLIT_ROWS`].
    fn splits(&self, probes: &ListProbes<'_>, nq: usize, group: usize) -> usize {
        let wanted = self.driver().multiprocessors() as usize * GROUPS_PER_SM;
        // Groups at least (pairs / group), at most pairs: the fewest decide.
        let blocks = (nq * probes.nprobe).div_ceil(group.max(1)).max(1);
        if blocks >= wanted {
            return 1;
        }
        let rows: usize = probes.probes.iter().map(|&l| probes.lists[l as usize].len()).sum();
        let average = rows / (nq * probes.nprobe).max(1);
        wanted.div_ceil(blocks).min(average / MIN_SPLIT_ROWS).clamp(1, MAX_SPLITS)
    }

    /// The device copy of `probes.lists`: the cached one while its generation holds, else a
    /// fresh upload (kept when the generation is not 0). Every slot is checked against the
    /// stored rows first.
    fn device_lists(&self, probes: &ListProbes<'_>) -> Result<Arc<DeviceLists<D>>> {
        let cache =
            || self.lists_cache.lock().map_err(|_| HiveGpuError::Internal("list cache poisoned".into()));
        if probes.generation != 0
            && let Some(cached) = cache()?.as_ref()
            && cached.generation == probes.generation
            && cached.lists == probes.lists.len()
        {
            return Ok(cached.clone());
        }
        let total: usize = probes.lists.iter().map(Vec::len).sum();
        if u32::try_from(total).is_err() {
            return Err(HiveGpuError::InvalidArgument(format!(
                "scan_lists: the lists hold {total} slots, more than a device list holds"
            )));
        }
        let words = probes.lists.len() + 1 + total;
        crate::memory::check(|| format!("copying {total} list slots to the device"), (words * 4) as u64)?;
        let mut host: Vec<u32> = Vec::with_capacity(words);
        let mut offset = 0u32;
        host.push(0);
        for list in probes.lists {
            offset += list.len() as u32;
            host.push(offset);
        }
        for list in probes.lists {
            if let Some(&slot) = list.iter().find(|&&s| s as usize >= self.len) {
                return Err(HiveGpuError::InvalidArgument(format!(
                    "scan_lists: list slot {slot} is past the {} stored rows",
                    self.len
                )));
            }
            host.extend_from_slice(list);
        }
        let driver = self.driver().clone();
        let buffer = DeviceBuffer::new(&driver, words * 4)?;
        {
            let mut ws = self.checkout()?;
            let staging = ws.staging.get(&*driver, words * 4)?;
            staging[..words * 4].copy_from_slice(bytemuck::cast_slice(&host));
            driver.upload(&ws.stream, buffer.ptr(), staging, words * 4)?;
            driver.synchronize(&ws.stream)?;
            self.checkin(ws);
        }
        let lists =
            Arc::new(DeviceLists { generation: probes.generation, lists: probes.lists.len(), buffer });
        if probes.generation != 0 {
            *cache()? = Some(lists.clone());
        }
        Ok(lists)
    }

    /// The scan itself: `None` for a query whose band overflowed.
    fn scan_lists_in(
        &self,
        ws: &mut Workspace<D>,
        queries: &[f32],
        probes: &ListProbes<'_>,
        lists: &DeviceLists<D>,
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Option<Vec<Neighbor>>>> {
        let driver = self.driver().clone();
        let (dim, nprobe) = (self.dim, probes.nprobe);
        let nq = queries.len() / dim;
        let mut profile = Profiler::new();
        let path = Approximation::Scan;
        let prepared = prepare(
            queries,
            dim,
            metric,
            path,
            path,
            f64::from(self.max_sq_norm),
            self.tuning.prepare_parallel_queries,
        )?;
        let cosine = metric == GpuDistanceMetric::Cosine;
        let kcap = list_size(k);
        let sortn = Self::scan_sort_size(k);
        let group = self.group_size(k);
        let splits = self.splits(probes, nq, group);
        let per_query = nprobe * splits * kcap * 8;
        let chunk = (CANDIDATE_BYTES / per_query).clamp(1, nq);
        let work = list_order(probes, nq, chunk);
        let (groups, chunk_groups) = list_groups(probes, &work, nq, chunk, group);

        // One upload: exact queries, the scanned ones (unit under cosine), f64 norms, gates,
        // probes and the blocks' order.
        let pairs = nq * nprobe;
        let sizes = [
            align(nq * dim * 4),
            if cosine { align(nq * dim * 4) } else { 0 },
            align(nq * 8),
            align(nq * 4),
            align(nq * 4),
            align(pairs * 4),
            align(pairs * 4),
            align(groups.len() * 4),
        ];
        let input_bytes: usize = sizes.iter().sum();
        let outputs = self.outputs(ws, nq, k)?;
        let base = ws.inputs.get(&driver, input_bytes)?;
        driver.synchronize(&ws.stream)?;
        let staging = ws.staging.get(&*driver, input_bytes.max(outputs.bytes))?;
        let mut offset = 0usize;
        // A big batch's queries are copied on several threads (`copy_bytes`): 5 MB of them took
        // a good part of the 1.4-2.1 ms this phase took for 10,000 queries on the H100 machine
        // (docs/PERFORMANCE.md, IVF-Flat list scan).
        let mut put = |bytes: &[u8], size: usize| -> Result<u64> {
            copy_bytes(&mut staging[offset..offset + bytes.len()], bytes)?;
            let at = base + offset as u64;
            offset += size;
            Ok(at)
        };
        let exact = put(bytemuck::cast_slice(queries), sizes[0])?;
        let approx = if cosine { put(bytemuck::cast_slice(&prepared.unit), sizes[1])? } else { exact };
        let q_norms = put(bytemuck::cast_slice(&prepared.q_norms), sizes[2])?;
        let gate_mul = put(bytemuck::cast_slice(&prepared.gate_mul), sizes[3])?;
        let gate_add = put(bytemuck::cast_slice(&prepared.gate_add), sizes[4])?;
        let probes_ptr = put(bytemuck::cast_slice(probes.probes), sizes[5])?;
        let work_ptr = put(bytemuck::cast_slice(&work), sizes[6])?;
        let groups_ptr = put(bytemuck::cast_slice(&groups), sizes[7])?;
        driver.upload(&ws.stream, base, staging, input_bytes)?;
        let inputs =
            Inputs { exact, approx, half: 0, inv_scale: 0, q_norms, gate_mul, gate_add, product_rows: 0 };
        profile.mark(&*driver, &ws.stream, "prepare+upload")?;

        let (rows, norms, dead) = self.arrays_ptrs(ws)?;
        let kernel = if self.precision == StoragePrecision::F16 {
            self.device.kernels.list_topk_f16
        } else {
            self.device.kernels.list_topk_f32
        };
        // `hg_list_topk` has arithmetic for these three only (its last branch is cosine).
        debug_assert!(matches!(
            metric,
            GpuDistanceMetric::Euclidean | GpuDistanceMetric::DotProduct | GpuDistanceMetric::Cosine
        ));
        let offsets = lists.buffer.ptr();
        let slots = offsets + (lists.lists as u64 + 1) * 4;
        let shared = group * self.group_stride(k) * 8;
        for (piece, q0) in (0..nq).step_by(chunk).enumerate() {
            let qn = (nq - q0).min(chunk);
            let (pair0, count) = (q0 * nprobe, qn * nprobe);
            let first_group = chunk_groups[piece];
            let blocks = (chunk_groups[piece + 1] - first_group) * splits;
            let candidates = ws.lists.get(&driver, count * splits * kcap * 8)?;
            let evicted = ws.evicted.get(&driver, count * splits * 8)?;
            self.device.launch(
                &ws.stream,
                kernel,
                Launch::new((blocks as u32, 1), BLOCK).shared(shared as u32),
                &ListTopk {
                    rows,
                    norms,
                    dead,
                    dim: dim as u32,
                    offsets,
                    slots,
                    probes: probes_ptr,
                    work: work_ptr,
                    groups: groups_ptr + first_group as u64 * 8,
                    splits: splits as u32,
                    nprobe: nprobe as u32,
                    pair0: pair0 as u32,
                    queries: approx,
                    gate_mul,
                    gate_add,
                    metric: metric_code(metric),
                    k: k as u32,
                    kcap: kcap as u32,
                    sortn: sortn as u32,
                    max_sub: self.tuning.scan_subrounds as u32,
                    lists: candidates,
                    evicted,
                },
            )?;
            profile.mark(&*driver, &ws.stream, "scan")?;
            let segments = nprobe * splits;
            let candidates = Lists { entries: candidates, evicted, segments, len: kcap, sorted: true };
            self.finalize(ws, &inputs, q0, qn, k, candidates, kcap, metric, &outputs)?;
            profile.mark(&*driver, &ws.stream, "finalize")?;
        }
        let found = self.download_results(ws, &outputs, nq, k, true)?;
        profile.mark(&*driver, &ws.stream, "download")?;
        profile.report(&format!("list scan nq {nq} nprobe {nprobe} k {k}"));
        Ok(found)
    }
}

/// The order the scan's blocks take the (query, probe) pairs: within each piece of `chunk`
/// queries, pair `q * nprobe + j` sorted by the list it scans (a counting sort), so the blocks
/// of one list run side by side.
fn list_order(probes: &ListProbes<'_>, nq: usize, chunk: usize) -> Vec<u32> {
    let nprobe = probes.nprobe;
    let mut work = vec![0u32; nq * nprobe];
    let mut starts = vec![0usize; probes.lists.len() + 1];
    for q0 in (0..nq).step_by(chunk.max(1)) {
        let pairs = q0 * nprobe..(q0 + chunk).min(nq) * nprobe;
        starts.iter_mut().for_each(|s| *s = 0);
        for &list in &probes.probes[pairs.clone()] {
            starts[list as usize + 1] += 1;
        }
        for l in 0..probes.lists.len() {
            starts[l + 1] += starts[l];
        }
        for p in pairs.clone() {
            let list = probes.probes[p] as usize;
            work[pairs.start + starts[list]] = p as u32;
            starts[list] += 1;
        }
    }
    work
}

/// The groups of `work` (from [`list_order`]) the kernel's blocks take: consecutive pairs that
/// probe one list, at most `group` of them, never across a piece of `chunk` queries; within a
/// piece the groups of longer lists come first, so the longest scans start first instead of
/// ending the launch alone. Returns each group's first and end pair side by side (group b is
/// `work[groups[2b]..groups[2b + 1]]`) and, per piece and one past the last, the number of
/// groups before it.
fn list_groups(
    probes: &ListProbes<'_>,
    work: &[u32],
    nq: usize,
    chunk: usize,
    group: usize,
) -> (Vec<u32>, Vec<usize>) {
    let nprobe = probes.nprobe;
    let list_of = |i: usize| probes.probes[work[i] as usize] as usize;
    let mut groups = Vec::new();
    let mut pieces = Vec::new();
    let mut piece: Vec<(usize, usize)> = Vec::new();
    for q0 in (0..nq).step_by(chunk.max(1)) {
        pieces.push(groups.len() / 2);
        let end = (q0 + chunk).min(nq) * nprobe;
        let mut i = q0 * nprobe;
        piece.clear();
        while i < end {
            let mut j = i + 1;
            while j < end && j - i < group.max(1) && list_of(j) == list_of(i) {
                j += 1;
            }
            piece.push((i, j));
            i = j;
        }
        piece.sort_by_key(|&(first, _)| std::cmp::Reverse(probes.lists[list_of(first)].len()));
        groups.extend(piece.iter().flat_map(|&(first, end)| [first as u32, end as u32]));
    }
    pieces.push(groups.len() / 2);
    (groups, pieces)
}

#[cfg(test)]
mod tests {
    use super::{list_groups, list_order};
    use crate::backend::ListProbes;

    #[test]
    fn list_order_groups_pairs_by_list_within_each_piece_of_queries() {
        let lists = vec![Vec::new(); 4];
        // Three queries of two probes, pieces of two queries: the third stays in its own piece.
        let probes = [3, 1, 1, 0, 2, 1];
        let scan = ListProbes { lists: &lists, probes: &probes, nprobe: 2, generation: 0 };
        let work = list_order(&scan, 3, 2);
        assert_eq!(work, vec![3, 1, 2, 0, 5, 4]);
        // Every pair once.
        let mut sorted = list_order(&scan, 3, 3);
        assert_eq!(sorted.iter().map(|&p| probes[p as usize]).collect::<Vec<_>>(), vec![0, 1, 1, 1, 2, 3]);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..6).collect::<Vec<_>>());
    }

    #[test]
    fn groups_hold_one_list_at_most_group_pairs_never_cross_a_piece_and_start_with_the_longest() {
        // List 2 is the longest, then 1, 0 and 3.
        let lists = vec![vec![0; 5], vec![0; 9], vec![0; 20], vec![0; 1]];
        // Five queries of two probes: list 1 is probed four times in the first piece.
        let probes = [1, 0, 1, 2, 1, 3, 1, 0, 1, 2];
        let scan = ListProbes { lists: &lists, probes: &probes, nprobe: 2, generation: 0 };
        let work = list_order(&scan, 5, 4);
        let (groups, pieces) = list_groups(&scan, &work, 5, 4, 3);
        // Piece 0 (pairs 0..8) ordered by list: 1, 7 | 0, 2, 4 | 6 | 3 | 5; piece 1: 8 | 9.
        assert_eq!(work, vec![1, 7, 0, 2, 4, 6, 3, 5, 8, 9]);
        // Longest list first: list 2 (work 6..7), list 1 (2..5, 5..6), list 0 (0..2), list 3.
        assert_eq!(groups, vec![6, 7, 2, 5, 5, 6, 0, 2, 7, 8, 9, 10, 8, 9]);
        assert_eq!(pieces, vec![0, 5, 7]);
        for b in 0..groups.len() / 2 {
            let members = &work[groups[2 * b] as usize..groups[2 * b + 1] as usize];
            assert!(!members.is_empty() && members.len() <= 3, "group {b}: {members:?}");
            assert!(members.iter().all(|&p| probes[p as usize] == probes[members[0] as usize]), "group {b}");
        }
    }
}
