//! The backend primitives on the GPU engine: `gather` (slots to rows), `refine` (candidate
//! lists to the exact top-k) and `select_k` (scores to top-k), on the device, with the kernels
//! the fused search uses.
//!
//! The exact top-k of a list of (f64 key, slot) pairs is written once, in
//! [`GpuRows::write_top_k`]: the radix path of the fused search ends in it, and so do
//! `refine` and `select_k`. The exact keys of candidate slots come from one place,
//! [`GpuRows::rerank_keys`], which the radix path and `refine` share.
//!
//! These run one query (or score row) after another on one stream: the launches are queued
//! back to back and read back once. A batched refine over many short lists (IVF's) is the
//! IVF issue's work; correctness and the contract come first here.

use rayon::prelude::*;

use super::abi::{BitonicStep, Gather, Launch, RefineLists, RerankList, WriteResults};
use super::driver::{DevicePtr, Driver};
use super::kernels::BLOCK;
use super::memory::Workspace;
use super::rows::GpuRows;
use super::search::{Outputs, Profiler, align};
use crate::backend::Neighbor;
use crate::backend::candidates::{Candidates, check_refine, check_select, live_candidates};
use crate::error::{HiveGpuError, Result};
use crate::exact::{metric_code, squared_norm_f64};
use crate::types::GpuDistanceMetric;

/// Shared memory a block of `hg_refine_lists` takes at most when it stages rows for the
/// re-rank: the default per-block size, so that several blocks share a multiprocessor.
const STAGED_SHARED_BYTES: usize = 48 << 10;

/// The sortable key of an f64 distance, as `hg_f64_key` in `kernels/common.cuh` computes it:
/// unsigned order is numeric order (with -0 before +0, as `f64::total_cmp`).
fn f64_key(distance: f64) -> u64 {
    let bits = distance.to_bits();
    if bits >> 63 == 1 { !bits } else { bits | 1 << 63 }
}

/// The f64 distance of a sortable key: [`f64_key`] undone (`hg_key_f64` in
/// `kernels/common.cuh`).
pub(super) fn key_f64(key: u64) -> f64 {
    f64::from_bits(if key >> 63 == 1 { key & !(1 << 63) } else { !key })
}

/// A list of (key, slot) pairs on the device: `count` real ones, padded with empty pairs
/// (all ones, which sort last) to `padded`, a power of two.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pairs {
    pub(super) keys: DevicePtr,
    pub(super) slots: DevicePtr,
    pub(super) count: usize,
    pub(super) padded: usize,
}

/// Each query's f64 norm, as `hg_refine_lists` takes them (`q_norms`).
pub(super) fn query_norms(queries: &[f32], dim: usize) -> Vec<f64> {
    queries.chunks_exact(dim).map(|q| squared_norm_f64(q).sqrt()).collect()
}

/// Where `hg_refine_lists` reads each query's candidates on the device.
#[derive(Debug, Clone, Copy)]
pub(super) enum RefineFrom {
    /// Query q's slots are `cand[offsets[q]..offsets[q + 1]]` (u32 each).
    Lists { cand: DevicePtr, offsets: DevicePtr },
    /// Query q's slots are the leading entries of `entries[q * stride..(q + 1) * stride]`
    /// (a coded scan's output, u64 `hg_entry`s, all ones past the rows it found).
    Entries { entries: DevicePtr, stride: usize },
}

/// The queries of a refine launch on the device: `nq` exact rows of the store's dimension at
/// `queries` (f32), their f64 norms at `q_norms`, at most `longest` candidates each.
#[derive(Debug, Clone, Copy)]
pub(super) struct RefineQueries {
    pub(super) nq: usize,
    pub(super) longest: usize,
    pub(super) queries: DevicePtr,
    pub(super) q_norms: DevicePtr,
}

/// Where one query's results go: `k` slots, `k` f64 distances and its flag.
#[derive(Debug, Clone, Copy)]
pub(super) struct ResultSlot {
    pub(super) slots: DevicePtr,
    pub(super) dist: DevicePtr,
    pub(super) flag: DevicePtr,
}

impl ResultSlot {
    /// Query `q`'s place in `outputs` laid out for `k` neighbours per query.
    pub(super) fn of(outputs: &Outputs, q: usize, k: usize) -> Self {
        Self {
            slots: outputs.slots + (q * k * 4) as u64,
            dist: outputs.dist + (q * k * 8) as u64,
            flag: outputs.flags + (q * 4) as u64,
        }
    }
}

impl<D: Driver> GpuRows<D> {
    /// Queues the exact f64 keys of `count` candidate slots at `cand` for the query at `query`
    /// (exact values; `q_norm` its f64 norm) into `keys` / `slots`, padded to `padded`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rerank_keys(
        &self,
        ws: &Workspace<D>,
        cand: DevicePtr,
        count: usize,
        query: DevicePtr,
        q_norm: f64,
        metric: GpuDistanceMetric,
        pairs: Pairs,
    ) -> Result<()> {
        let (rows, _, _) = self.arrays_ptrs(ws)?;
        let kernels = &self.device.kernels;
        let grid = pairs.padded.div_ceil(BLOCK as usize).min(65535) as u32;
        self.device.launch(
            &ws.stream,
            kernels.rerank_list().get(self.precision),
            Launch::new((grid, 1), BLOCK),
            &RerankList {
                cand,
                count: count as u32,
                padded: pairs.padded as u32,
                rows,
                dim: self.dim as u32,
                q: query,
                q_norm,
                metric: metric_code(metric),
                keys: pairs.keys,
                slots: pairs.slots,
            },
        )
    }

    /// Sorts `pairs` and writes their first `k` (at most `pairs.count`) to `out`, clearing its
    /// flag: the device's exact top-k. A long list is first cut to its k best in linear time
    /// (sorting all of it would cost count log^2 count). A `select_min_candidates` of 1 takes
    /// the selection wherever it applies (the GPU suite proves it that way). `radix` is the
    /// workspace's radix buffer (the selection's histogram and state).
    pub(super) fn write_top_k(
        &self,
        ws: &mut Workspace<D>,
        pairs: Pairs,
        k: usize,
        radix: DevicePtr,
        out: ResultSlot,
    ) -> Result<()> {
        let Pairs { count, .. } = pairs;
        let (keys, slots, padded) = if count >= self.tuning.select_min_candidates && count >= 2 * k {
            self.select_k_pairs(ws, pairs.keys, pairs.slots, count, k, radix)?
        } else {
            (pairs.keys, pairs.slots, pairs.padded)
        };
        let kernels = &self.device.kernels;
        let sort_grid = (padded / 2).max(1).div_ceil(BLOCK as usize) as u32;
        let mut size = 2;
        while size <= padded {
            let mut stride = size / 2;
            while stride > 0 {
                self.device.launch(
                    &ws.stream,
                    kernels.bitonic_step,
                    Launch::new((sort_grid, 1), BLOCK),
                    &BitonicStep { keys, slots, n: padded as u32, size: size as u32, stride: stride as u32 },
                )?;
                stride /= 2;
            }
            size *= 2;
        }
        let written = k.min(count);
        self.device.launch(
            &ws.stream,
            kernels.write_results,
            Launch::new((written.div_ceil(BLOCK as usize).max(1) as u32, 1), BLOCK),
            &WriteResults {
                keys,
                slots,
                k: written as u32,
                out_slots: out.slots,
                out_dist: out.dist,
                flag: out.flag,
            },
        )
    }

    /// [`crate::backend::RowStore::gather`] on the device: the rows copied side by side by
    /// `hg_gather`, then read back once.
    pub(super) fn gather_rows(&self, slots: &[usize]) -> Result<Vec<f32>> {
        if let Some(&slot) = slots.iter().find(|&&s| s >= self.len) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "gather: slot {slot} is past the {} stored rows",
                self.len
            )));
        }
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        let count = slots.len();
        let what = || format!("gathering {count} rows");
        crate::memory::check(what, (count * self.dim * 4) as u64)?;
        let mut ws = self.checkout()?;
        let result = self.gather_in(&mut ws, slots);
        self.checkin(ws);
        result
    }

    fn gather_in(&self, ws: &mut Workspace<D>, slots: &[usize]) -> Result<Vec<f32>> {
        let driver = self.driver().clone();
        let arrays = self.arrays.as_ref().ok_or(HiveGpuError::EmptyCollection)?;
        let count = slots.len();
        let row_bytes = self.dim * self.element_bytes();
        let (keep_bytes, rows_bytes) = (align(count * 4), align(count * row_bytes));
        let base = ws.gather_slots.get(&driver, keep_bytes + rows_bytes + count * 4)?;
        let (keep, dst, norms) = (base, base + keep_bytes as u64, base + (keep_bytes + rows_bytes) as u64);
        let keep_slots: Vec<u32> = slots.iter().map(|&s| s as u32).collect();
        // Nothing queued may still read the staging buffer when it is refilled or regrown;
        // sized once for the upload and the read back.
        driver.synchronize(&ws.stream)?;
        let host = ws.staging.get(&*driver, (count * 4).max(count * row_bytes))?;
        host[..count * 4].copy_from_slice(bytemuck::cast_slice(&keep_slots));
        driver.upload(&ws.stream, keep, host, count * 4)?;
        self.device.launch(
            &ws.stream,
            self.device.kernels.gather,
            super::rows::gather_launch(row_bytes, count),
            &Gather {
                src: arrays.rows.ptr(),
                dst,
                row_bytes: row_bytes as u64,
                keep,
                count: count as u32,
                norms_src: arrays.norms.ptr(),
                norms_dst: norms,
            },
        )?;
        driver.download(&ws.stream, host, dst, count * row_bytes)?;
        driver.synchronize(&ws.stream)?;
        let bytes = &host[..count * row_bytes];
        let mut values = Vec::with_capacity(count * self.dim);
        crate::exact::elements::widen(bytes, self.precision, &mut values);
        Ok(values)
    }

    /// [`crate::backend::RowStore::refine`] on the device: each query's live candidates get
    /// exact keys ([`Self::rerank_keys`]) and their top-k ([`Self::write_top_k`]).
    pub(super) fn refine_lists(
        &self,
        queries: &[f32],
        candidates: &Candidates,
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nq = check_refine(self.dim, queries, candidates, k)?;
        // Each query's list is sorted and deduplicated: on the library's threads, since a batch's
        // thousands of lists cost milliseconds on one (docs/PERFORMANCE.md, IVF-PQ on CUDA).
        let lists: Vec<Vec<usize>> = crate::exec::run_small(nq < 64, || {
            (0..nq)
                .into_par_iter()
                .map(|q| live_candidates(candidates, q, self.len, &self.dead))
                .collect::<Result<Vec<_>>>()
        })??;
        if lists.iter().all(Vec::is_empty) {
            return Ok(vec![Vec::new(); nq]);
        }
        let mut ws = self.checkout()?;
        let result = self.refine_in(&mut ws, queries, &lists, k, metric);
        self.checkin(ws);
        result
    }

    /// Every query whose candidates fit one block's shared memory goes through one launch of
    /// `hg_refine_lists` ([`Self::refine_batch`]); a longer list (rarer: a refine factor in the
    /// thousands) through [`Self::rerank_keys`] and [`Self::write_top_k`], one query at a time.
    fn refine_in(
        &self,
        ws: &mut Workspace<D>,
        queries: &[f32],
        lists: &[Vec<usize>],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let room_limit = self.refine_room_limit();
        let as_slices = |qs: &[usize]| qs.iter().map(|&q| lists[q].as_slice()).collect::<Vec<_>>();
        if lists.iter().all(|l| l.len() <= room_limit) {
            let all: Vec<usize> = (0..lists.len()).collect();
            return self.refine_batch(ws, queries, &as_slices(&all), k, metric);
        }
        let (short, long): (Vec<usize>, Vec<usize>) =
            (0..lists.len()).partition(|&q| lists[q].len() <= room_limit);
        let mut results = vec![Vec::new(); lists.len()];
        for (piece, batched) in [(short, true), (long, false)] {
            if piece.is_empty() {
                continue;
            }
            let dim = self.dim;
            let subset: Vec<f32> =
                piece.iter().flat_map(|&q| queries[q * dim..(q + 1) * dim].iter().copied()).collect();
            let answers = if batched {
                self.refine_batch(ws, &subset, &as_slices(&piece), k, metric)?
            } else {
                self.refine_one_by_one(ws, &subset, &as_slices(&piece), k, metric)?
            };
            for (q, answer) in piece.into_iter().zip(answers) {
                results[q] = answer;
            }
        }
        Ok(results)
    }

    /// The most candidates one query of [`Self::refine_batch`] may have: the largest power of
    /// two whose keys and slots (12 bytes each) fit the block's shared memory, at most
    /// [`crate::Tuning::refine_batch_candidates`].
    pub(super) fn refine_room_limit(&self) -> usize {
        let pairs = (self.shared_limit() / 12).max(2);
        (1 << pairs.ilog2()).min(self.tuning.refine_batch_candidates)
    }

    /// One launch of `hg_refine_lists` for the batch (every list at most
    /// [`Self::refine_room_limit`] long): the exact queries, their f64 norms, the lists'
    /// offsets and their slots go up in one upload, the top-k come back in one read.
    fn refine_batch(
        &self,
        ws: &mut Workspace<D>,
        queries: &[f32],
        lists: &[&[usize]],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let driver = self.driver().clone();
        let (dim, nq) = (self.dim, lists.len());
        let longest = lists.iter().map(|l| l.len()).max().unwrap_or(0);
        let mut offsets = Vec::with_capacity(nq + 1);
        let mut flat: Vec<u32> = Vec::with_capacity(lists.iter().map(|l| l.len()).sum());
        offsets.push(0u32);
        for list in lists {
            flat.extend(list.iter().map(|&s| s as u32));
            offsets.push(u32::try_from(flat.len()).map_err(|_| {
                HiveGpuError::InvalidArgument(format!(
                    "refine: {} candidates in one call are more than the device's 32-bit offsets",
                    flat.len()
                ))
            })?);
        }
        let q_norms = query_norms(queries, dim);
        // One upload: queries, norms, offsets, candidates, each from an aligned start.
        let (query_bytes, norm_bytes, offset_bytes) =
            (align(nq * dim * 4), align(nq * 8), align((nq + 1) * 4));
        let input_bytes = query_bytes + norm_bytes + offset_bytes + flat.len() * 4;
        let what = || format!("refining {} candidates of {nq} queries", flat.len());
        crate::memory::check(what, input_bytes as u64)?;
        let base = ws.inputs.get(&driver, input_bytes)?;
        let outputs = Outputs::at(ws.outputs.get(&driver, Outputs::bytes_for(nq, k))?, nq, k);
        driver.synchronize(&ws.stream)?;
        let mut profile = Profiler::new();
        let host = ws.staging.get(&*driver, input_bytes.max(outputs.bytes))?;
        let parts: [(&[u8], usize); 4] = [
            (bytemuck::cast_slice(queries), query_bytes),
            (bytemuck::cast_slice(&q_norms), norm_bytes),
            (bytemuck::cast_slice(&offsets), offset_bytes),
            (bytemuck::cast_slice(&flat), flat.len() * 4),
        ];
        let mut at = 0;
        for (bytes, size) in parts {
            host[at..at + bytes.len()].copy_from_slice(bytes);
            at += size;
        }
        driver.upload(&ws.stream, base, host, input_bytes)?;
        let ptr = |offset: usize| base + offset as u64;
        self.launch_refine(
            ws,
            RefineFrom::Lists {
                cand: ptr(query_bytes + norm_bytes + offset_bytes),
                offsets: ptr(query_bytes + norm_bytes),
            },
            RefineQueries { nq, longest, queries: ptr(0), q_norms: ptr(query_bytes) },
            k,
            metric,
            &outputs,
        )?;
        profile.mark(&*driver, &ws.stream, "upload+refine")?;
        let found = self.read_top_k(ws, &outputs, nq, k, |q, _| k.min(lists[q].len()), self.len);
        profile.mark(&*driver, &ws.stream, "download")?;
        profile.report(&format!("refine nq {nq} candidates {}", flat.len()));
        found
    }

    /// One launch of `hg_refine_lists` over `queries` (on the device already), reading each
    /// query's candidates from `from` (at most `queries.longest` each, within
    /// [`Self::refine_room_limit`]) and writing its top-k into `outputs`.
    pub(super) fn launch_refine(
        &self,
        ws: &Workspace<D>,
        from: RefineFrom,
        queries: RefineQueries,
        k: usize,
        metric: GpuDistanceMetric,
        outputs: &Outputs,
    ) -> Result<()> {
        let RefineQueries { nq, longest, queries, q_norms } = queries;
        let dim = self.dim;
        // Within the limit, the list's padded room stays within the shared memory's power of
        // two that caps the limit (a limit of 0 lets only empty lists through, as refine_in).
        if longest > self.refine_room_limit() {
            return Err(HiveGpuError::Internal(format!(
                "a refine of {longest} candidates per query is past one block's {}",
                self.refine_room_limit()
            )));
        }
        let room = longest.next_power_of_two().max(2);
        // Stage rows for the f64 re-rank (see hg_rerank) within 48 KiB of shared memory in all,
        // which leaves several blocks resident on each multiprocessor.
        let keys_bytes = room * 12;
        let line = (dim | 1) * 8;
        let lines =
            (STAGED_SHARED_BYTES.saturating_sub(keys_bytes) / line).min(longest.min(BLOCK as usize) + 1);
        let stage_bytes = if lines >= 2 { lines * line } else { 0 };
        let (rows, _, _) = self.arrays_ptrs(ws)?;
        let grid = u32::try_from(nq).map_err(|_| {
            HiveGpuError::InvalidArgument(format!(
                "refine: {nq} queries in one call are more than the device's grid"
            ))
        })?;
        let (cand, offsets, entries, stride) = match from {
            RefineFrom::Lists { cand, offsets } => (cand, offsets, 0, 0),
            RefineFrom::Entries { entries, stride } => (0, 0, entries, stride as u32),
        };
        self.device.launch(
            &ws.stream,
            self.device.kernels.refine_lists().get(self.precision),
            Launch::new((grid, 1), BLOCK).shared((keys_bytes + stage_bytes) as u32),
            &RefineLists {
                cand,
                offsets,
                rows,
                dim: dim as u32,
                queries,
                q_norms,
                metric: metric_code(metric),
                k: k as u32,
                room: room as u32,
                out_slots: outputs.slots,
                out_dist: outputs.dist,
                stage_bytes: stage_bytes as u32,
                entries,
                stride,
            },
        )
    }

    /// Each query in turn: its exact keys ([`Self::rerank_keys`]) and their top-k
    /// ([`Self::write_top_k`]), for lists longer than a block's shared memory holds.
    fn refine_one_by_one(
        &self,
        ws: &mut Workspace<D>,
        queries: &[f32],
        lists: &[&[usize]],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let driver = self.driver().clone();
        let (dim, nq) = (self.dim, lists.len());
        let flat: Vec<u32> = lists.iter().flat_map(|l| l.iter()).map(|&s| s as u32).collect();
        let longest = lists.iter().map(|l| l.len()).max().unwrap_or(0);
        // One upload: the exact queries, then every query's candidates.
        let query_bytes = align(nq * dim * 4);
        let input_bytes = query_bytes + flat.len() * 4;
        let base = ws.inputs.get(&driver, input_bytes)?;
        let padded = longest.next_power_of_two();
        let keys = ws.keys.get(&driver, padded * 8)?;
        let slots = ws.slots.get(&driver, padded * 4)?;
        let radix = ws.radix.get(&driver, 256 * 4 + 64)?;
        let outputs = Outputs::at(ws.outputs.get(&driver, Outputs::bytes_for(nq, k))?, nq, k);
        driver.synchronize(&ws.stream)?;
        let host = ws.staging.get(&*driver, input_bytes.max(outputs.bytes))?;
        host[..nq * dim * 4].copy_from_slice(bytemuck::cast_slice(queries));
        host[query_bytes..input_bytes].copy_from_slice(bytemuck::cast_slice(&flat));
        driver.upload(&ws.stream, base, host, input_bytes)?;
        let mut first = 0;
        for (q, list) in lists.iter().enumerate() {
            let count = list.len();
            if count == 0 {
                continue;
            }
            let query = &queries[q * dim..(q + 1) * dim];
            let pairs = Pairs { keys, slots, count, padded: count.next_power_of_two() };
            let cand = base + (query_bytes + first * 4) as u64;
            let query_ptr = base + (q * dim * 4) as u64;
            self.rerank_keys(ws, cand, count, query_ptr, squared_norm_f64(query).sqrt(), metric, pairs)?;
            self.write_top_k(ws, pairs, k, radix, ResultSlot::of(&outputs, q, k))?;
            first += count;
        }
        self.read_top_k(ws, &outputs, nq, k, |q, _| k.min(lists[q].len()), self.len)
    }

    /// [`crate::backend::RowStore::select_k`] on the device: each row's scores become exact
    /// keys with their columns as slots, then [`Self::write_top_k`].
    pub(super) fn select_rows(&self, scores: &[f32], width: usize, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        let rows = check_select(scores, width, k)?;
        if rows == 0 {
            return Ok(Vec::new());
        }
        if u32::try_from(width).is_err() {
            return Err(HiveGpuError::InvalidArgument(format!(
                "select_k: rows of {width} scores are wider than the device's 32-bit columns"
            )));
        }
        let mut ws = self.checkout()?;
        let result = self.select_in(&mut ws, scores, rows, width, k);
        self.checkin(ws);
        result
    }

    fn select_in(
        &self,
        ws: &mut Workspace<D>,
        scores: &[f32],
        rows: usize,
        width: usize,
        k: usize,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let driver = self.driver().clone();
        let padded = width.next_power_of_two();
        let kept = k.min(width);
        // Every row's pairs side by side (the sort works in place), padded with empty pairs.
        let (key_bytes, slot_bytes) = (align(rows * padded * 8), rows * padded * 4);
        let what = || format!("selecting from {rows} rows of {width} scores");
        crate::memory::check(what, (key_bytes + slot_bytes) as u64)?;
        let base = ws.inputs.get(&driver, key_bytes + slot_bytes)?;
        let radix = ws.radix.get(&driver, 256 * 4 + 64)?;
        let outputs = Outputs::at(ws.outputs.get(&driver, Outputs::bytes_for(rows, kept))?, rows, kept);
        let mut keys = vec![u64::MAX; rows * padded];
        let mut columns = vec![u32::MAX; rows * padded];
        for (r, row) in scores.chunks_exact(width).enumerate() {
            for (c, &score) in row.iter().enumerate() {
                keys[r * padded + c] = f64_key(f64::from(score));
                columns[r * padded + c] = c as u32;
            }
        }
        driver.synchronize(&ws.stream)?;
        let host = ws.staging.get(&*driver, (key_bytes + slot_bytes).max(outputs.bytes))?;
        host[..rows * padded * 8].copy_from_slice(bytemuck::cast_slice(&keys));
        host[key_bytes..key_bytes + slot_bytes].copy_from_slice(bytemuck::cast_slice(&columns));
        driver.upload(&ws.stream, base, host, key_bytes + slot_bytes)?;
        for r in 0..rows {
            let pairs = Pairs {
                keys: base + (r * padded * 8) as u64,
                slots: base + (key_bytes + r * padded * 4) as u64,
                count: width,
                padded,
            };
            self.write_top_k(ws, pairs, kept, radix, ResultSlot::of(&outputs, r, kept))?;
        }
        self.read_top_k(ws, &outputs, rows, kept, |_, _| kept, width)
    }

    /// Reads back `outputs` (`nq` lists laid out for `k` each): list `q` holds
    /// `written(q, its k slots as read)` entries (at most `k`), every slot below `bound`.
    pub(super) fn read_top_k(
        &self,
        ws: &mut Workspace<D>,
        outputs: &Outputs,
        nq: usize,
        k: usize,
        written: impl Fn(usize, &[u32]) -> usize,
        bound: usize,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let driver = self.driver().clone();
        let host = ws.staging.get(&*driver, outputs.bytes)?;
        driver.download(&ws.stream, host, outputs.slots, outputs.bytes)?;
        driver.synchronize(&ws.stream)?;
        let view = outputs.view(host, nq, k)?;
        (0..nq)
            .map(|q| {
                (q * k..q * k + written(q, &view.slots[q * k..(q + 1) * k]).min(k))
                    .map(|i| {
                        let slot = view.slots[i] as usize;
                        if slot >= bound {
                            return Err(HiveGpuError::Internal(format!(
                                "the device returned slot {slot} of {bound}"
                            )));
                        }
                        Ok(Neighbor { slot, distance: view.dist[i] })
                    })
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{f64_key, key_f64};

    #[test]
    fn a_sortable_key_turns_back_into_its_distance_bit_for_bit() {
        for d in [f64::NEG_INFINITY, -3.5, -1e-300, -0.0, 0.0, 5e-324, 1e-300, 2.0, 1e300, f64::INFINITY] {
            assert_eq!(key_f64(f64_key(d)).to_bits(), d.to_bits(), "{d}");
        }
    }

    #[test]
    fn f64_keys_order_as_total_cmp() {
        let values = [f64::NEG_INFINITY, -3.5, -1e-300, -0.0, 0.0, 1e-300, 2.0, f64::INFINITY];
        for pair in values.windows(2) {
            assert!(f64_key(pair[0]) < f64_key(pair[1]), "{} vs {}", pair[0], pair[1]);
        }
    }
}
