//! The three ways the CPU backend produces candidates: a SIMD scan per query, f32 GEMM tiles,
//! and packed bf16 / byte tiles. Each fuses distance computation with selection, so only
//! candidates leave a tile; the exact re-rank happens in the parent module.

use rayon::prelude::*;

use super::CpuRows;
use crate::backend::cpu::simd::{self, Kernel};
use crate::backend::cpu::topk::{Collector, ErrorBound};
use crate::backend::cpu::{bf16, filter, int8};
pub(super) use crate::exact::products::inner_products;
use crate::slots::SlotSet;
use crate::types::GpuDistanceMetric;

/// Batches of at least this many queries go through GEMM tiles: below it, re-reading the rows
/// once per query costs less than a thin matrix product.
pub(super) const GEMM_MIN_QUERIES: usize = 4;
/// Batches of at least this many queries use the bf16 kernel where the CPU has it: enough
/// queries to amortise converting each row tile.
pub(super) const BF16_MIN_QUERIES: usize = 16;
/// Target bytes of one packed row tile (stays in L2 while every query group reads it).
const PACKED_TILE_BYTES: usize = 128 * 1024;
/// Rows per register block of the packed kernels (both use two vectors of 16 lanes).
const ROW_GROUP: usize = 32;

/// The reduced-precision product kernels that feed the same bounded selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TileKernel {
    /// bf16 pairs (AVX512-BF16): any data, bounded by the rounding residuals.
    Bf16,
    /// Byte quads (AVX512-VNNI): exact for data whose components are integers in 0..=255.
    Bytes,
}

impl TileKernel {
    /// u32 words per packed vector.
    fn words(self, dim: usize) -> usize {
        match self {
            TileKernel::Bf16 => bf16::pairs(dim),
            TileKernel::Bytes => int8::quads(dim),
        }
    }

    fn query_group(self) -> usize {
        match self {
            TileKernel::Bf16 => bf16::QUERY_GROUP,
            TileKernel::Bytes => int8::QUERY_GROUP,
        }
    }

    fn pack_queries(self, queries: &[f32], dim: usize, out: &mut Vec<u32>) {
        match self {
            TileKernel::Bf16 => bf16::pack_queries(queries, dim, out),
            TileKernel::Bytes => int8::pack_queries(queries, dim, out),
        }
    }

    fn pack_rows(self, rows: &[f32], dim: usize, out: &mut Vec<u32>, sums: &mut Vec<i32>) {
        match self {
            TileKernel::Bf16 => bf16::pack_rows(rows, dim, out),
            TileKernel::Bytes => int8::pack_rows(rows, dim, out, sums),
        }
    }

    fn products(
        self,
        queries: &[u32],
        rows: &[u32],
        words: usize,
        stride: usize,
        sums: &[i32],
        out: &mut [f32],
    ) -> bool {
        match self {
            TileKernel::Bf16 => bf16::products(queries, rows, words, stride, out),
            TileKernel::Bytes => int8::products(queries, rows, words, stride, sums, out),
        }
    }
}
/// Queries per GEMM tile.
pub(super) const QUERY_BLOCK: usize = 192;
/// Rows per GEMM tile: a `QUERY_BLOCK x ROW_TILE` f32 tile stays in a core's L2.
pub(super) const ROW_TILE: usize = 512;
/// Target f32 values per scan block, so a block of rows stays in L1/L2.
const SCAN_BLOCK_VALUES: usize = 8192;
/// Rows per parallel scan task (at least): small enough that one query over 10,000 rows uses
/// more than one thread (16,384 left SIFT10K's single L2 and L1 queries on one thread: 3,780
/// and 3,498 QPS on the 2-core development machine, against 4,503 and 4,345 at 4,096;
/// 100k x 128 went from 722 to 856 L1 QPS: docs/PERFORMANCE.md, "L1 and L-infinity").
const SCAN_TASK_ROWS: usize = 4096;
/// Scattered rows read in place are asked for this many rows ahead of their scoring
/// (`CpuRows::prefetch_row`): enough to cover a memory access behind a few rows' arithmetic.
const PREFETCH_AHEAD: usize = 4;
/// Rows per parallel task when scattered rows are read in place (`CpuRows::scan_slots`).
const SCATTERED_TASK_ROWS: usize = 2048;

impl CpuRows {
    /// Candidates of one query by scanning every row, split across threads.
    pub(super) fn scan(
        &self,
        skip: &SlotSet,
        q: &[f32],
        metric: GpuDistanceMetric,
        k: usize,
        bound: ErrorBound,
    ) -> Collector {
        let n = self.len_slots();
        let tasks = n.div_ceil(SCAN_TASK_ROWS).max(1);
        let per_task = n.div_ceil(tasks);
        (0..tasks)
            .into_par_iter()
            .map(|t| {
                let (start, end) = (t * per_task, ((t + 1) * per_task).min(n));
                self.scan_range(skip, q, metric, k, bound, start..end)
            })
            .reduce_with(|mut a, b| {
                a.merge(b);
                self.thin(&mut a, q, metric);
                a
            })
            .unwrap_or_else(|| Collector::new(k, bound))
    }

    /// Candidates of one query among the rows `slots` (ascending), read in place, split across
    /// threads. The collector holds positions in `slots`, not slots.
    pub(super) fn scan_slots(
        &self,
        q: &[f32],
        metric: GpuDistanceMetric,
        k: usize,
        bound: ErrorBound,
        slots: &[usize],
    ) -> Collector {
        let kernel = Kernel::for_metric(metric);
        // Rows read in place cost more each than streamed ones (the passing rows are scattered):
        // smaller tasks than the scan's, so that a few thousand rows still use every thread.
        let tasks = slots.len().div_ceil(SCATTERED_TASK_ROWS).max(1);
        let per_task = slots.len().div_ceil(tasks).max(1);
        let q_norm = crate::exact::query_norm(metric, q);
        let thin = |c: &mut Collector| {
            if c.crowded() {
                let mut scratch = Vec::new();
                c.shrink(|at, out| {
                    let picked = at.iter().map(|&at| slots[at as usize]);
                    self.exact_distances(q, q_norm, picked, metric, &mut scratch, out)
                });
            }
        };
        slots
            .par_chunks(per_task)
            .enumerate()
            .map(|(t, task)| {
                let mut collector = Collector::new(k, bound);
                let block = 256;
                let (mut raw, mut scale, mut offset) =
                    (vec![0f32; block], vec![0f32; block], vec![0f32; block]);
                let mut scratch = Vec::new();
                for (b, chunk) in task.chunks(block).enumerate() {
                    for (j, &slot) in chunk.iter().enumerate() {
                        if let Some(&ahead) = task.get(b * block + j + PREFETCH_AHEAD) {
                            self.prefetch_row(ahead);
                        }
                        let row = self.rows_f32(slot, 1, &mut scratch);
                        simd::distances(self.simd, kernel, q, row, &mut raw[j..j + 1]);
                        (scale[j], offset[j]) = self.row_transform(metric, true, slot);
                    }
                    let n = chunk.len();
                    let first = t * per_task + b * block;
                    filter::collect(self.simd, &mut collector, &raw[..n], &scale[..n], &offset[..n], first);
                    thin(&mut collector);
                }
                collector
            })
            .reduce_with(|mut a, b| {
                a.merge(b);
                thin(&mut a);
                a
            })
            .unwrap_or_else(|| Collector::new(k, bound))
    }

    fn scan_range(
        &self,
        skip: &SlotSet,
        q: &[f32],
        metric: GpuDistanceMetric,
        k: usize,
        bound: ErrorBound,
        rows: std::ops::Range<usize>,
    ) -> Collector {
        let (start, end) = (rows.start, rows.end);
        let kernel = Kernel::for_metric(metric);
        let block = (SCAN_BLOCK_VALUES / self.dim).clamp(1, 256);
        let mut collector = Collector::new(k, bound);
        let (mut raw, mut scale, mut offset) = (vec![0f32; block], vec![0f32; block], vec![0f32; block]);
        let mut scratch = Vec::new();
        let mut at = start;
        while at < end {
            let count = block.min(end - at);
            let rows = self.rows_f32(at, count, &mut scratch);
            simd::distances(self.simd, kernel, q, rows, &mut raw[..count]);
            self.block_transform(skip, metric, true, at, &mut scale[..count], &mut offset[..count]);
            filter::collect(self.simd, &mut collector, &raw[..count], &scale[..count], &offset[..count], at);
            self.thin(&mut collector, q, metric);
            at += count;
        }
        collector
    }

    /// Candidates of every query through GEMM tiles fused with selection; the full
    /// queries x rows matrix never exists, only one `QUERY_BLOCK x ROW_TILE` tile per task.
    /// L1 and L-infinity, which have no product form, fill the same tiles with the scan kernel.
    pub(super) fn gemm_collect(
        &self,
        skip: &SlotSet,
        queries: &[f32],
        metric: GpuDistanceMetric,
        k: usize,
        bounds: &[ErrorBound],
    ) -> Vec<Collector> {
        let (dim, n) = (self.dim, self.len_slots());
        let nq = queries.len() / dim;
        let query_blocks = nq.div_ceil(QUERY_BLOCK);
        let threads = rayon::current_num_threads().max(1);
        // With fewer query blocks than threads, split the rows too and merge afterwards.
        let row_ranges = if query_blocks >= 2 * threads {
            1
        } else {
            (2 * threads).div_ceil(query_blocks).min(n.div_ceil(ROW_TILE)).max(1)
        };
        let range_len = n.div_ceil(row_ranges).div_ceil(ROW_TILE) * ROW_TILE;
        let tasks: Vec<(usize, usize)> =
            (0..query_blocks).flat_map(|b| (0..row_ranges).map(move |r| (b, r))).collect();
        let partial: Vec<Vec<Collector>> = tasks
            .par_iter()
            .map(|&(b, r)| {
                let (q0, q1) = (b * QUERY_BLOCK, ((b + 1) * QUERY_BLOCK).min(nq));
                let (r0, r1) = ((r * range_len).min(n), ((r + 1) * range_len).min(n));
                self.gemm_task(skip, &queries[q0 * dim..q1 * dim], metric, k, &bounds[q0..q1], r0..r1)
            })
            .collect();
        // Tasks come ordered by query block, then row range.
        let mut parts = partial.into_iter();
        let mut out = Vec::with_capacity(nq);
        for b in 0..query_blocks {
            let first = b * QUERY_BLOCK;
            out.extend(merge_ranges(parts.by_ref().take(row_ranges), |i, c| {
                self.thin(c, &queries[(first + i) * dim..(first + i + 1) * dim], metric)
            }));
        }
        out
    }

    /// One task's candidates: `queries` against the rows in `rows`, a tile at a time, on
    /// this thread (no parallel section).
    pub(super) fn gemm_task(
        &self,
        skip: &SlotSet,
        queries: &[f32],
        metric: GpuDistanceMetric,
        k: usize,
        bounds: &[ErrorBound],
        rows: std::ops::Range<usize>,
    ) -> Vec<Collector> {
        let (start, end) = (rows.start, rows.end);
        let dim = self.dim;
        let nq = queries.len() / dim;
        let mut collectors: Vec<Collector> = bounds.iter().map(|&b| Collector::new(k, b)).collect();
        let mut products = vec![0f32; nq * ROW_TILE];
        let (mut scale, mut offset) = (vec![0f32; ROW_TILE], vec![0f32; ROW_TILE]);
        let mut scratch = Vec::new();
        let mut at = start;
        while at < end {
            let count = ROW_TILE.min(end - at);
            let rows = self.rows_f32(at, count, &mut scratch);
            let products = &mut products[..nq * count];
            if metric.is_difference_norm() {
                // No product form: each query runs the scan kernel over the tile, which sits in
                // cache for all of them.
                let kernel = Kernel::for_metric(metric);
                for (q, out) in queries.chunks_exact(dim).zip(products.chunks_exact_mut(count)) {
                    simd::distances(self.simd, kernel, q, rows, out);
                }
            } else {
                inner_products(queries, rows, dim, nq, count, products);
            }
            self.block_transform(skip, metric, false, at, &mut scale[..count], &mut offset[..count]);
            for ((c, p), q) in
                collectors.iter_mut().zip(products.chunks_exact(count)).zip(queries.chunks_exact(dim))
            {
                filter::collect(self.simd, c, p, &scale[..count], &offset[..count], at);
                self.thin(c, q, metric);
            }
            at += count;
        }
        collectors
    }

    /// Candidates of every query through the bf16 kernel: tasks own row ranges, convert each
    /// row tile once, and run every query group over it while it sits in cache.
    pub(super) fn tiled_collect(
        &self,
        skip: &SlotSet,
        kernel: TileKernel,
        queries: &[f32],
        metric: GpuDistanceMetric,
        k: usize,
        bounds: &[ErrorBound],
    ) -> Vec<Collector> {
        let (dim, n) = (self.dim, self.len_slots());
        let np = kernel.words(dim);
        let group = kernel.query_group();
        let mut packed_queries = Vec::new();
        kernel.pack_queries(queries, dim, &mut packed_queries);
        let tile = (PACKED_TILE_BYTES / (4 * np)).clamp(ROW_GROUP, 1024) / ROW_GROUP * ROW_GROUP;
        let tiles = n.div_ceil(tile);
        // Every task warms up its own collectors, so use just enough tasks to balance the threads.
        let threads = rayon::current_num_threads();
        let tasks = if tiles >= threads * 16 { threads * 2 } else { threads }.min(tiles).max(1);
        let per_task = tiles.div_ceil(tasks) * tile;
        let partial: Option<Vec<Vec<Collector>>> = (0..tasks)
            .into_par_iter()
            .map(|t| {
                let (start, end) = ((t * per_task).min(n), ((t + 1) * per_task).min(n));
                let mut collectors: Vec<Collector> = bounds.iter().map(|&b| Collector::new(k, b)).collect();
                let (mut scratch, mut packed, mut sums) = (Vec::new(), Vec::new(), Vec::new());
                let mut products = vec![0f32; group * tile];
                let (mut scale, mut offset) = (vec![0f32; tile], vec![0f32; tile]);
                let mut at = start;
                while at < end {
                    let count = tile.min(end - at);
                    kernel.pack_rows(self.rows_f32(at, count, &mut scratch), dim, &mut packed, &mut sums);
                    self.block_transform(skip, metric, false, at, &mut scale[..count], &mut offset[..count]);
                    for (g, chunk) in collectors.chunks_mut(group).enumerate() {
                        let qs = &packed_queries[g * group * np..(g + 1) * group * np];
                        if !kernel.products(qs, &packed, np, tile, &sums, &mut products) {
                            return None;
                        }
                        for (i, (c, p)) in chunk.iter_mut().zip(products.chunks_exact(tile)).enumerate() {
                            filter::collect(self.simd, c, &p[..count], &scale[..count], &offset[..count], at);
                            let q = g * group + i;
                            self.thin(c, &queries[q * dim..(q + 1) * dim], metric);
                        }
                    }
                    at += count;
                }
                Some(collectors)
            })
            .collect();
        let Some(partial) = partial else {
            // The kernel declined (instructions missing): the f32 tiles give the same answer.
            return self.gemm_collect(skip, queries, metric, k, &self.f32_bounds(queries, metric));
        };
        merge_ranges(partial, |i, c| self.thin(c, &queries[i * dim..(i + 1) * dim], metric))
    }
}

/// One candidate list per query from lists of the same queries over different row ranges;
/// `thin(i, list)` keeps query `i`'s merged list short.
fn merge_ranges(
    parts: impl IntoIterator<Item = Vec<Collector>>,
    thin: impl Fn(usize, &mut Collector),
) -> Vec<Collector> {
    let mut parts = parts.into_iter();
    let mut merged = parts.next().unwrap_or_default();
    for part in parts {
        for (i, (m, c)) in merged.iter_mut().zip(part).enumerate() {
            m.merge(c);
            thin(i, m);
        }
    }
    merged
}
