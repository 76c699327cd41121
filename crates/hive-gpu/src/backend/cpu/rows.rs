//! Row storage of the CPU backend and its exact k-NN: a SIMD scan for a few queries, GEMM
//! tiles fused with per-query selection for batches, then an exact f64 re-rank.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::simd::{self, Kernel, SimdLevel};
use super::topk::{self, Collector, ErrorBound};
use super::{available_memory_bytes, filter};
use super::{bf16, int8};
use crate::backend::{Neighbor, RowStore};
use crate::error::{HiveGpuError, Result};
use crate::types::{GpuBackendType, GpuDistanceMetric, StoragePrecision};

/// Batches of at least this many queries go through GEMM tiles: below it, re-reading the rows
/// once per query costs less than a thin matrix product.
const GEMM_MIN_QUERIES: usize = 4;
/// Batches of at least this many queries use the bf16 kernel where the CPU has it: enough
/// queries to amortise converting each row tile.
const BF16_MIN_QUERIES: usize = 16;
/// Target bytes of one packed row tile (stays in L2 while every query group reads it).
const PACKED_TILE_BYTES: usize = 128 * 1024;
/// Rows per register block of the packed kernels (both use two vectors of 16 lanes).
const ROW_GROUP: usize = 32;

/// The reduced-precision product kernels that feed the same bounded selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TileKernel {
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
const QUERY_BLOCK: usize = 192;
/// Rows per GEMM tile: a `QUERY_BLOCK x ROW_TILE` f32 tile stays in a core's L2.
const ROW_TILE: usize = 512;
/// Target f32 values per scan block, so a block of rows stays in L1/L2.
const SCAN_BLOCK_VALUES: usize = 8192;
/// Rows per parallel scan task (at least).
const SCAN_TASK_ROWS: usize = 16384;

#[derive(Debug, Clone)]
enum Elements {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// Rows in host memory, a squared norm per row and a tombstone bitmap.
#[derive(Debug)]
pub struct CpuRows {
    dim: usize,
    elements: Elements,
    /// Squared norm of each stored row (computed in f64, rounded to f32).
    sq_norms: Vec<f32>,
    /// At least the largest squared norm of any slot, removed ones included.
    max_sq_norm: f32,
    /// At least the largest `|x - bf16(x)|` of any slot: bounds the bf16 kernel's error.
    max_residual: f32,
    /// At least the largest `|x - bf16(x)| / |x|` of any slot (for cosine).
    max_relative_residual: f32,
    /// Whether every stored component is an integer in 0..=255 (exact byte kernel applies).
    all_bytes: bool,
    dead: Vec<u64>,
    dead_count: usize,
    simd: SimdLevel,
}

impl CpuRows {
    pub(super) fn new(dim: usize, precision: StoragePrecision, simd: SimdLevel) -> Self {
        let elements = match precision {
            StoragePrecision::F32 => Elements::F32(Vec::new()),
            StoragePrecision::F16 => Elements::F16(Vec::new()),
        };
        Self {
            dim,
            elements,
            sq_norms: Vec::new(),
            max_sq_norm: 0.0,
            max_residual: 0.0,
            max_relative_residual: 0.0,
            all_bytes: true,
            dead: Vec::new(),
            dead_count: 0,
            simd,
        }
    }

    fn is_dead(&self, slot: usize) -> bool {
        self.dead_count > 0 && self.dead[slot / 64] & (1 << (slot % 64)) != 0
    }

    fn set_dead(&mut self, slot: usize, dead: bool) {
        let (word, bit) = (slot / 64, 1u64 << (slot % 64));
        let was = self.dead[word] & bit != 0;
        if was != dead {
            self.dead[word] ^= bit;
            if dead {
                self.dead_count += 1;
            } else {
                self.dead_count -= 1;
            }
        }
    }

    /// Rows `start..start + count` as f32, converting f16 storage into `scratch`.
    fn rows_f32<'a>(&'a self, start: usize, count: usize, scratch: &'a mut Vec<f32>) -> &'a [f32] {
        let range = start * self.dim..(start + count) * self.dim;
        match &self.elements {
            Elements::F32(v) => &v[range],
            Elements::F16(v) => {
                scratch.resize(range.len(), 0.0);
                v[range].convert_to_f32_slice(scratch);
                scratch
            }
        }
    }

    fn store_row(&mut self, row: &[f32]) {
        match &mut self.elements {
            Elements::F32(v) => v.extend_from_slice(row),
            Elements::F16(v) => v.extend(row.iter().map(|&x| f16::from_f32(x))),
        }
    }

    /// Records the norm and rounding residuals of the stored row in `slot`.
    fn note_row(&mut self, slot: usize) {
        let mut scratch = Vec::new();
        let row = self.rows_f32(slot, 1, &mut scratch);
        let norm = simd::squared_norm_f64(row);
        let residual = bf16::residual(row);
        let bytes = row.iter().all(|&x| int8::is_byte(x));
        let sq_norm = norm as f32;
        // Widened a little so the bounds built on them stay bounds after rounding to f32.
        self.max_sq_norm = self.max_sq_norm.max(sq_norm * (1.0 + 1e-6));
        self.max_residual = self.max_residual.max(residual as f32 * (1.0 + 1e-6));
        if norm > 0.0 {
            let relative = (residual / norm.sqrt()) as f32 * (1.0 + 1e-6);
            self.max_relative_residual = self.max_relative_residual.max(relative);
        }
        self.all_bytes &= bytes;
        if slot == self.sq_norms.len() {
            self.sq_norms.push(sq_norm);
        } else {
            self.sq_norms[slot] = sq_norm;
        }
    }

    fn len_slots(&self) -> usize {
        match &self.elements {
            Elements::F32(v) => v.len() / self.dim,
            Elements::F16(v) => v.len() / self.dim,
        }
    }

    /// Per-row `scale` and `offset` that turn a block's raw kernel values into canonical
    /// distances (`raw * scale + offset`); removed rows get `+inf`.
    fn block_transform(
        &self,
        metric: GpuDistanceMetric,
        raw_is_l2: bool,
        start: usize,
        scale: &mut [f32],
        offset: &mut [f32],
    ) {
        for (j, (s, o)) in scale.iter_mut().zip(offset.iter_mut()).enumerate() {
            let slot = start + j;
            let norm = self.sq_norms[slot];
            (*s, *o) = match metric {
                GpuDistanceMetric::Euclidean if raw_is_l2 => (1.0, 0.0),
                GpuDistanceMetric::Euclidean => (-2.0, norm),
                GpuDistanceMetric::DotProduct => (-1.0, 0.0),
                GpuDistanceMetric::Cosine if norm > 0.0 => (-1.0 / norm.sqrt(), 0.0),
                GpuDistanceMetric::Cosine => (0.0, 0.0),
            };
            if self.is_dead(slot) {
                (*s, *o) = (0.0, f32::INFINITY);
            }
        }
    }

    /// The error bound of the approximate distances one query sees on `path`.
    fn bound(&self, metric: GpuDistanceMetric, q_norm: f32, gemm_path: bool) -> ErrorBound {
        let gamma = ErrorBound::gamma(self.dim);
        let max_norm = self.max_sq_norm.sqrt();
        let tiny = f32::MIN_POSITIVE * self.dim as f32;
        match metric {
            GpuDistanceMetric::Euclidean if gemm_path => ErrorBound {
                absolute: gamma * (2.0 * q_norm * max_norm + self.max_sq_norm) + tiny,
                relative: 0.0,
            },
            GpuDistanceMetric::Euclidean => ErrorBound { absolute: tiny, relative: gamma },
            GpuDistanceMetric::DotProduct => {
                ErrorBound { absolute: gamma * q_norm * max_norm + tiny, relative: 0.0 }
            }
            GpuDistanceMetric::Cosine => ErrorBound { absolute: gamma * q_norm + tiny, relative: 0.0 },
        }
    }

    /// Candidates of one query by scanning every row, split across threads.
    fn scan(&self, q: &[f32], metric: GpuDistanceMetric, k: usize, bound: ErrorBound) -> Collector {
        let n = self.len_slots();
        let tasks = n.div_ceil(SCAN_TASK_ROWS).max(1);
        let per_task = n.div_ceil(tasks);
        (0..tasks)
            .into_par_iter()
            .map(|t| {
                let (start, end) = (t * per_task, ((t + 1) * per_task).min(n));
                self.scan_range(q, metric, k, bound, start, end)
            })
            .reduce_with(|mut a, b| {
                a.merge(b);
                a
            })
            .unwrap_or_else(|| Collector::new(k, bound))
    }

    fn scan_range(
        &self,
        q: &[f32],
        metric: GpuDistanceMetric,
        k: usize,
        bound: ErrorBound,
        start: usize,
        end: usize,
    ) -> Collector {
        let kernel = if metric == GpuDistanceMetric::Euclidean { Kernel::L2 } else { Kernel::Dot };
        let block = (SCAN_BLOCK_VALUES / self.dim).clamp(1, 256);
        let mut collector = Collector::new(k, bound);
        let (mut raw, mut scale, mut offset) = (vec![0f32; block], vec![0f32; block], vec![0f32; block]);
        let mut scratch = Vec::new();
        let mut at = start;
        while at < end {
            let count = block.min(end - at);
            let rows = self.rows_f32(at, count, &mut scratch);
            simd::distances(self.simd, kernel, q, rows, &mut raw[..count]);
            self.block_transform(metric, true, at, &mut scale[..count], &mut offset[..count]);
            filter::collect(self.simd, &mut collector, &raw[..count], &scale[..count], &offset[..count], at);
            at += count;
        }
        collector
    }

    /// Candidates of every query through GEMM tiles fused with selection; the full
    /// queries x rows matrix never exists, only one `QUERY_BLOCK x ROW_TILE` tile per task.
    fn gemm_collect(
        &self,
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
        let mut partial: Vec<Vec<Collector>> = tasks
            .par_iter()
            .map(|&(b, r)| {
                let (q0, q1) = (b * QUERY_BLOCK, ((b + 1) * QUERY_BLOCK).min(nq));
                let (r0, r1) = ((r * range_len).min(n), ((r + 1) * range_len).min(n));
                self.gemm_task(&queries[q0 * dim..q1 * dim], metric, k, &bounds[q0..q1], r0, r1)
            })
            .collect();
        let mut out = Vec::with_capacity(nq);
        for block in partial.chunks_mut(row_ranges) {
            let mut merged = std::mem::take(&mut block[0]);
            for rest in &mut block[1..] {
                for (m, c) in merged.iter_mut().zip(std::mem::take(rest)) {
                    m.merge(c);
                }
            }
            out.extend(merged);
        }
        out
    }

    fn gemm_task(
        &self,
        queries: &[f32],
        metric: GpuDistanceMetric,
        k: usize,
        bounds: &[ErrorBound],
        start: usize,
        end: usize,
    ) -> Vec<Collector> {
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
            inner_products(queries, rows, dim, nq, count, products);
            self.block_transform(metric, false, at, &mut scale[..count], &mut offset[..count]);
            for (c, p) in collectors.iter_mut().zip(products.chunks_exact(count)) {
                filter::collect(self.simd, c, p, &scale[..count], &offset[..count], at);
            }
            at += count;
        }
        collectors
    }

    /// The error bound of the bf16 kernel's distances for query `q`, from the rounding
    /// residuals of `q` and of the stored rows: `|q.x - bf(q).bf(x)| <= |q| |x - bf(x)| +
    /// |q - bf(q)| |bf(x)| + gamma |bf(q)| |bf(x)|`.
    fn bf16_bound(&self, metric: GpuDistanceMetric, q: &[f32], q_norm: f64) -> ErrorBound {
        let gamma = f64::from(ErrorBound::gamma(self.dim));
        let q_residual = bf16::residual(q);
        let q_rounded = q_norm + q_residual;
        let widen = 1.0 + 2f64.powi(-8);
        let max_norm = f64::from(self.max_sq_norm).sqrt();
        let tiny = self.dim as f64 * 1e-30;
        let absolute = match metric {
            GpuDistanceMetric::Cosine => {
                q_norm * f64::from(self.max_relative_residual)
                    + (q_residual + gamma * q_rounded) * widen
                    + gamma * q_norm
            }
            _ => {
                let product = q_norm * f64::from(self.max_residual)
                    + (q_residual + gamma * q_rounded) * max_norm * widen;
                if metric == GpuDistanceMetric::Euclidean {
                    2.0 * product + gamma * f64::from(self.max_sq_norm)
                } else {
                    product
                }
            }
        };
        ErrorBound { absolute: ((absolute + tiny) * 1.01) as f32, relative: 0.0 }
    }

    /// Candidates of every query through the bf16 kernel: tasks own row ranges, convert each
    /// row tile once, and run every query group over it while it sits in cache.
    fn tiled_collect(
        &self,
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
                    self.block_transform(metric, false, at, &mut scale[..count], &mut offset[..count]);
                    for (g, chunk) in collectors.chunks_mut(group).enumerate() {
                        let qs = &packed_queries[g * group * np..(g + 1) * group * np];
                        if !kernel.products(qs, &packed, np, tile, &sums, &mut products) {
                            return None;
                        }
                        for (c, p) in chunk.iter_mut().zip(products.chunks_exact(tile)) {
                            filter::collect(self.simd, c, &p[..count], &scale[..count], &offset[..count], at);
                        }
                    }
                    at += count;
                }
                Some(collectors)
            })
            .collect();
        let Some(partial) = partial else {
            // The kernel declined (instructions missing): the f32 tiles give the same answer.
            return self.gemm_collect(queries, metric, k, &self.f32_bounds(queries, metric));
        };
        let mut parts = partial.into_iter();
        let mut merged = parts.next().unwrap_or_default();
        for part in parts {
            for (m, c) in merged.iter_mut().zip(part) {
                m.merge(c);
            }
        }
        merged
    }

    fn f32_bounds(&self, queries: &[f32], metric: GpuDistanceMetric) -> Vec<ErrorBound> {
        queries
            .chunks_exact(self.dim)
            .map(|q| self.bound(metric, simd::squared_norm_f64(q).sqrt() as f32, true))
            .collect()
    }

    /// Exact canonical distance of one stored row to `q`, in f64.
    fn exact_distance(
        &self,
        q: &[f32],
        q_norm: f64,
        slot: usize,
        metric: GpuDistanceMetric,
        scratch: &mut Vec<f32>,
    ) -> f64 {
        let row = self.rows_f32(slot, 1, scratch);
        match metric {
            GpuDistanceMetric::Euclidean => {
                q.iter().zip(row).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum()
            }
            GpuDistanceMetric::DotProduct => -dot_f64(q, row),
            GpuDistanceMetric::Cosine => {
                let norm = simd::squared_norm_f64(row).sqrt();
                if norm == 0.0 || q_norm == 0.0 { 0.0 } else { -dot_f64(q, row) / (norm * q_norm) }
            }
        }
    }
}

fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum()
}

/// `products[i][j] = queries[i] . rows[j]` for `nq` queries and `count` rows (row-major).
fn inner_products(queries: &[f32], rows: &[f32], dim: usize, nq: usize, count: usize, products: &mut [f32]) {
    assert!(queries.len() >= nq * dim && rows.len() >= count * dim && products.len() >= nq * count);
    // SAFETY: the assert above bounds every access: lhs is nq x dim row-major (row stride dim),
    // rhs is the transpose of `rows` (dim x count, column stride dim), dst is nq x count
    // row-major (row stride count). The three buffers are distinct borrows, so they do not alias.
    unsafe {
        gemm::gemm(
            nq,
            count,
            dim,
            products.as_mut_ptr(),
            1,
            count as isize,
            false,
            queries.as_ptr(),
            1,
            dim as isize,
            rows.as_ptr(),
            dim as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

impl RowStore for CpuRows {
    fn len(&self) -> usize {
        self.len_slots()
    }

    fn reserve(&mut self, additional: usize) -> Result<()> {
        // Selection keeps slots as u32.
        if self.len_slots().saturating_add(additional) > u32::MAX as usize {
            return Err(HiveGpuError::InvalidArgument(format!(
                "a CPU collection holds at most {} vectors ({} present, {additional} more asked)",
                u32::MAX,
                self.len_slots()
            )));
        }
        let element_bytes = match self.elements {
            Elements::F32(_) => 4,
            Elements::F16(_) => 2,
        };
        let requested = (additional * (self.dim * element_bytes + 4)) as u64;
        let too_much = |available: u64| HiveGpuError::VramLimitExceeded {
            backend: GpuBackendType::Cpu,
            requested,
            available,
        };
        if let Some(available) = available_memory_bytes()
            && requested > available
        {
            return Err(too_much(available));
        }
        let values = additional * self.dim;
        let reserved = match &mut self.elements {
            Elements::F32(v) => v.try_reserve(values),
            Elements::F16(v) => v.try_reserve(values),
        };
        reserved
            .and_then(|_| self.sq_norms.try_reserve(additional))
            .and_then(|_| self.dead.try_reserve((self.len_slots() + additional).div_ceil(64)))
            .map_err(|_| too_much(available_memory_bytes().unwrap_or(0)))
    }

    fn append(&mut self, rows: &[f32]) -> Result<()> {
        if self.len_slots().saturating_add(rows.len() / self.dim) > u32::MAX as usize {
            return Err(HiveGpuError::InvalidArgument(format!(
                "a CPU collection holds at most {} vectors",
                u32::MAX
            )));
        }
        if !rows.len().is_multiple_of(self.dim) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{} values are not whole rows of dimension {}",
                rows.len(),
                self.dim
            )));
        }
        for row in rows.chunks_exact(self.dim) {
            self.store_row(row);
            self.note_row(self.len_slots() - 1);
        }
        self.dead.resize(self.len_slots().div_ceil(64), 0);
        Ok(())
    }

    fn overwrite(&mut self, slot: usize, row: &[f32]) -> Result<()> {
        if slot >= self.len_slots() || row.len() != self.dim {
            return Err(HiveGpuError::InvalidArgument(format!("overwrite of slot {slot} out of range")));
        }
        let range = slot * self.dim..(slot + 1) * self.dim;
        match &mut self.elements {
            Elements::F32(v) => v[range].copy_from_slice(row),
            Elements::F16(v) => v[range].convert_from_f32_slice(row),
        }
        self.note_row(slot);
        self.set_dead(slot, false);
        Ok(())
    }

    fn tombstone(&mut self, slots: &[usize]) {
        for &slot in slots {
            if slot < self.len_slots() {
                self.set_dead(slot, true);
            }
        }
    }

    fn compact(&mut self, keep: &[usize]) -> Result<()> {
        let ascending = keep.windows(2).all(|w| w[0] < w[1]);
        if !ascending || keep.last().is_some_and(|&s| s >= self.len_slots()) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "compaction needs ascending slots below {}",
                self.len_slots()
            )));
        }
        let dim = self.dim;
        fn gather<T: Copy>(v: &[T], keep: &[usize], dim: usize) -> Vec<T> {
            keep.iter().flat_map(|&s| v[s * dim..(s + 1) * dim].iter().copied()).collect()
        }
        self.elements = match &self.elements {
            Elements::F32(v) => Elements::F32(gather(v, keep, dim)),
            Elements::F16(v) => Elements::F16(gather(v, keep, dim)),
        };
        self.dead = vec![0; keep.len().div_ceil(64)];
        self.dead_count = 0;
        self.sq_norms = Vec::with_capacity(keep.len());
        (self.max_sq_norm, self.max_residual, self.max_relative_residual) = (0.0, 0.0, 0.0);
        self.all_bytes = true;
        for slot in 0..keep.len() {
            self.note_row(slot);
        }
        Ok(())
    }

    fn clear(&mut self) {
        match &mut self.elements {
            Elements::F32(v) => *v = Vec::new(),
            Elements::F16(v) => *v = Vec::new(),
        }
        self.sq_norms = Vec::new();
        self.dead = Vec::new();
        self.dead_count = 0;
        (self.max_sq_norm, self.max_residual, self.max_relative_residual) = (0.0, 0.0, 0.0);
        self.all_bytes = true;
    }

    fn read_row(&self, slot: usize) -> Result<Vec<f32>> {
        if slot >= self.len_slots() {
            return Err(HiveGpuError::InvalidArgument(format!(
                "slot {slot} out of range ({} rows)",
                self.len_slots()
            )));
        }
        let mut scratch = Vec::new();
        Ok(self.rows_f32(slot, 1, &mut scratch).to_vec())
    }

    fn memory_bytes(&self) -> usize {
        let values = match &self.elements {
            Elements::F32(v) => v.capacity() * 4,
            Elements::F16(v) => v.capacity() * 2,
        };
        values + self.sq_norms.capacity() * 4 + self.dead.capacity() * 8
    }

    fn knn(&self, queries: &[f32], k: usize, metric: GpuDistanceMetric) -> Result<Vec<Vec<Neighbor>>> {
        let dim = self.dim;
        let live = self.len_slots() - self.dead_count;
        if k == 0 || k > live || !queries.len().is_multiple_of(dim) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "knn needs 1 <= k <= {live} live rows (k = {k}) and whole {dim}-dimensional queries ({} values)",
                queries.len()
            )));
        }
        let nq = queries.len() / dim;
        let q_norms: Vec<f64> = queries.chunks_exact(dim).map(|q| simd::squared_norm_f64(q).sqrt()).collect();
        let bytes = self.all_bytes
            && dim <= int8::MAX_DIM
            && int8::available()
            && queries.iter().all(|&x| int8::is_byte(x));
        let collectors = if nq >= BF16_MIN_QUERIES && bytes {
            // Exact integer products; only the f32 conversion rounds, well inside the f32 bound.
            let bounds = self.f32_bounds(queries, metric);
            self.tiled_collect(TileKernel::Bytes, queries, metric, k, &bounds)
        } else if nq >= BF16_MIN_QUERIES && bf16::available() {
            let bounds: Vec<ErrorBound> = queries
                .chunks_exact(dim)
                .zip(&q_norms)
                .map(|(q, &qn)| self.bf16_bound(metric, q, qn))
                .collect();
            self.tiled_collect(TileKernel::Bf16, queries, metric, k, &bounds)
        } else if nq >= GEMM_MIN_QUERIES {
            let bounds = self.f32_bounds(queries, metric);
            self.gemm_collect(queries, metric, k, &bounds)
        } else {
            queries
                .chunks_exact(dim)
                .zip(&q_norms)
                .map(|(q, &qn)| self.scan(q, metric, k, self.bound(metric, qn as f32, false)))
                .collect()
        };
        Ok(collectors
            .into_par_iter()
            .zip(queries.par_chunks_exact(dim))
            .zip(q_norms.par_iter())
            .map(|((collector, q), &q_norm)| {
                let mut scratch = Vec::new();
                let scored = collector
                    .into_slots()
                    .into_iter()
                    .map(|slot| (slot, self.exact_distance(q, q_norm, slot, metric, &mut scratch)))
                    .collect();
                topk::best_k(scored, k)
                    .into_iter()
                    .map(|(slot, distance)| Neighbor { slot, distance })
                    .collect()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_rows_than_u32_slots_is_refused() {
        let mut rows = CpuRows::new(1, StoragePrecision::F32, SimdLevel::Scalar);
        let err = rows.reserve(1 << 33).unwrap_err();
        assert!(err.to_string().contains("at most"), "{err}");
        rows.append(&[1.0]).expect("still usable");
    }
}
