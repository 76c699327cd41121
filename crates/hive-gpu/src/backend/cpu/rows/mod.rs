//! Row storage of the CPU backend and its exact k-NN: candidates from one of the search paths
//! ([`paths`]), bounded by [`bounds`], then an exact f64 re-rank here.

mod bounds;
mod code_lists;
mod lists;
mod packed_lists;
mod paths;
mod values;

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use self::paths::{BF16_MIN_QUERIES, GEMM_MIN_QUERIES, TileKernel};
use self::values::Values;
use super::simd::{self, SimdLevel};
use super::topk::{self, ErrorBound};
use super::{bf16, int8};
use crate::backend::candidates::{Candidates, check_refine, check_select, live_candidates};
use crate::backend::{CodeScan, Neighbor, RowStore};
use crate::error::{HiveGpuError, Result};
use crate::exact::lanes;
use crate::persist::MappedRows;
use crate::slots::{SearchMask, SlotSet};
use crate::types::{GpuBackendType, GpuDistanceMetric, StoragePrecision};

/// Values per task when stored rows are copied and measured in parallel.
const PARALLEL_VALUES: usize = 1 << 14;

/// A filtered batch whose passing rows are at most `GATHER_SHARE` of the slots searches a copy
/// of just those rows: the copy reads each passing row once, where the masked scan computes
/// every row's distance for every query. At half the rows of 1M x 128 the masked scan ran at
/// 0.91x of no filter, the copy at 1.46x (docs/PERFORMANCE.md, filtered search).
const GATHER_SHARE: (usize, usize) = (3, 4);
/// A filtered search of a few queries whose passing rows are at most 1 in `IN_PLACE_FRACTION`
/// of the slots reads just those rows where they are: one row at a time costs about 4x a
/// streamed row of the scan (about 0.10 against 0.023 us at 128 dimensions on the development
/// machine, docs/PERFORMANCE.md), so below a quarter of the rows it wins.
const IN_PLACE_FRACTION: usize = 4;

/// What [`CpuRows`] keeps about each stored row: its squared norm, its bf16 rounding
/// residual and whether its components are all bytes.
struct RowStats {
    norm: f64,
    residual: f64,
    bytes: bool,
}

/// The stored values, in the collection's storage type (`exact/elements.rs`).
#[derive(Debug, Clone)]
enum Elements {
    F32(Values<f32>),
    F16(Values<f16>),
    Bf16(Values<half::bf16>),
    I8(Values<i8>),
    U8(Values<u8>),
}

/// `$body` with `$v` bound to the values of whichever type `$elements` holds (the same code
/// for each: generic over [`Element`]).
macro_rules! each_elements {
    ($elements:expr, $v:ident => $body:expr) => {
        match $elements {
            Elements::F32($v) => $body,
            Elements::F16($v) => $body,
            Elements::Bf16($v) => $body,
            Elements::I8($v) => $body,
            Elements::U8($v) => $body,
        }
    };
}

/// A stored element type: made from an f32 the collection checked it can hold
/// (`exact::elements::unrepresentable`), and widened back exactly.
trait Element: bytemuck::Pod + Send + Sync {
    fn from_f32(x: f32) -> Self;
    fn widen(from: &[Self], to: &mut [f32]);
}

impl Element for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
    fn widen(from: &[Self], to: &mut [f32]) {
        to.copy_from_slice(from);
    }
}

impl Element for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn widen(from: &[Self], to: &mut [f32]) {
        from.convert_to_f32_slice(to);
    }
}

impl Element for half::bf16 {
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn widen(from: &[Self], to: &mut [f32]) {
        from.convert_to_f32_slice(to);
    }
}

impl Element for i8 {
    fn from_f32(x: f32) -> Self {
        x as i8
    }
    fn widen(from: &[Self], to: &mut [f32]) {
        to.iter_mut().zip(from).for_each(|(t, &f)| *t = f32::from(f));
    }
}

impl Element for u8 {
    fn from_f32(x: f32) -> Self {
        x as u8
    }
    fn widen(from: &[Self], to: &mut [f32]) {
        to.iter_mut().zip(from).for_each(|(t, &f)| *t = f32::from(f));
    }
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
    dead: SlotSet,
    simd: SimdLevel,
    /// Batches over fewer rows stay off the bf16 kernel ([`crate::Tuning::cpu_bf16_min_rows`]).
    bf16_min_rows: usize,
    /// Unfiltered searches of at most this many products run on the caller's thread
    /// ([`crate::Tuning::cpu_here_products`]).
    here_products: usize,
    /// Whether list scans keep a packed copy of the lists ([`crate::Tuning::cpu_packed_lists`]).
    pack_lists: bool,
    /// That copy, for the lists' generation it was made for ([`packed_lists`]).
    packed: std::sync::Mutex<Option<std::sync::Arc<packed_lists::PackedLists>>>,
    /// The packed copy of an SQ8 index's codes, for their generation ([`code_lists`]).
    packed_codes: std::sync::Mutex<Option<std::sync::Arc<code_lists::PackedCodes>>>,
}

impl CpuRows {
    pub(crate) fn new(dim: usize, precision: StoragePrecision, simd: SimdLevel) -> Self {
        let elements = match precision {
            StoragePrecision::F32 => Elements::F32(Values::Owned(Vec::new())),
            StoragePrecision::F16 => Elements::F16(Values::Owned(Vec::new())),
            StoragePrecision::Bf16 => Elements::Bf16(Values::Owned(Vec::new())),
            StoragePrecision::I8 => Elements::I8(Values::Owned(Vec::new())),
            StoragePrecision::U8 => Elements::U8(Values::Owned(Vec::new())),
        };
        Self {
            dim,
            elements,
            sq_norms: Vec::new(),
            max_sq_norm: 0.0,
            max_residual: 0.0,
            max_relative_residual: 0.0,
            all_bytes: true,
            dead: SlotSet::default(),
            simd,
            bf16_min_rows: crate::tuning::Tuning::default().cpu_bf16_min_rows,
            here_products: crate::tuning::Tuning::default().cpu_here_products,
            pack_lists: crate::tuning::Tuning::default().cpu_packed_lists,
            packed: Default::default(),
            packed_codes: Default::default(),
        }
    }

    /// The same rows store with batches over fewer than `rows` rows kept off the bf16 kernel
    /// ([`crate::Tuning::cpu_bf16_min_rows`]).
    pub(crate) fn with_bf16_min_rows(mut self, rows: usize) -> Self {
        self.bf16_min_rows = rows;
        self
    }

    /// These rows with unfiltered searches of at most `products` on the caller's thread
    /// ([`crate::Tuning::cpu_here_products`]).
    pub(crate) fn with_here_products(mut self, products: usize) -> Self {
        self.here_products = products;
        self
    }

    /// These rows with list scans keeping a packed copy of the lists or not
    /// ([`crate::Tuning::cpu_packed_lists`]).
    pub(crate) fn with_packed_lists(mut self, pack: bool) -> Self {
        self.pack_lists = pack;
        self
    }

    /// Rows `start..start + count` as f32, widening other storage types into `scratch`.
    fn rows_f32<'a>(&'a self, start: usize, count: usize, scratch: &'a mut Vec<f32>) -> &'a [f32] {
        let range = start * self.dim..(start + count) * self.dim;
        if let Elements::F32(v) = &self.elements {
            return &v[range];
        }
        scratch.resize(range.len(), 0.0);
        each_elements!(&self.elements, v => Element::widen(&v[range], scratch));
        scratch
    }

    /// The storage type of the values.
    fn precision(&self) -> StoragePrecision {
        match self.elements {
            Elements::F32(_) => StoragePrecision::F32,
            Elements::F16(_) => StoragePrecision::F16,
            Elements::Bf16(_) => StoragePrecision::Bf16,
            Elements::I8(_) => StoragePrecision::I8,
            Elements::U8(_) => StoragePrecision::U8,
        }
    }

    /// Starts loading row `slot` into the cache without waiting for it: the rows a filtered
    /// search or a refine reads in place are scattered, and each one's first touch would
    /// otherwise wait on memory. A hint only: it changes no result, and faults on nothing.
    fn prefetch_row(&self, slot: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let range = slot * self.dim..(slot + 1) * self.dim;
            let (start, bytes) = each_elements!(&self.elements, v => match v.get(range) {
                Some(row) => (row.as_ptr().cast::<u8>(), std::mem::size_of_val(row)),
                None => return,
            });
            for offset in (0..bytes).step_by(64) {
                // SAFETY: a prefetch reads nothing into the program's state and cannot fault;
                // the address is inside the row's slice besides.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        start.add(offset).cast::<i8>(),
                    )
                };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    /// Norm and rounding residuals of the stored row in `slot`.
    fn row_stats(&self, slot: usize, scratch: &mut Vec<f32>) -> RowStats {
        let row = self.rows_f32(slot, 1, scratch);
        RowStats {
            norm: simd::squared_norm_f64(row),
            residual: bf16::residual(row),
            bytes: int8::all_bytes(row),
        }
    }

    /// Records the statistics of the stored rows from `first` on, measured in parallel.
    fn note_rows_from(&mut self, first: usize) {
        let per_task = PARALLEL_VALUES.div_ceil(self.dim);
        let stats: Vec<RowStats> = if self.len_slots() - first <= per_task {
            // One task's worth stays on this thread: a small write makes no rayon call.
            let mut scratch = Vec::new();
            (first..self.len_slots()).map(|slot| self.row_stats(slot, &mut scratch)).collect()
        } else {
            (first..self.len_slots())
                .into_par_iter()
                .with_min_len(per_task)
                .map_init(Vec::new, |scratch, slot| self.row_stats(slot, scratch))
                .collect()
        };
        for (slot, stats) in (first..).zip(stats) {
            self.record(slot, stats);
        }
    }

    /// The rows of `slots` (ascending) as a store of their own, slot i holding `slots[i]`:
    /// what a search over few passing rows reads instead of every row. The parent's bounds
    /// (largest norm and residuals) hold for any subset of its rows, so they are kept, not
    /// recomputed.
    fn gathered(&self, slots: &[usize]) -> CpuRows {
        let dim = self.dim;
        // Row by row with `extend_from_slice` (a memcpy each): element by element was most of
        // a filtered single query's time.
        fn copy<T: Copy>(values: &[T], slots: &[usize], dim: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(slots.len() * dim);
            for &s in slots {
                out.extend_from_slice(&values[s * dim..(s + 1) * dim]);
            }
            out
        }
        let elements = match &self.elements {
            Elements::F32(v) => Elements::F32(Values::Owned(copy(v, slots, dim))),
            Elements::F16(v) => Elements::F16(Values::Owned(copy(v, slots, dim))),
            Elements::Bf16(v) => Elements::Bf16(Values::Owned(copy(v, slots, dim))),
            Elements::I8(v) => Elements::I8(Values::Owned(copy(v, slots, dim))),
            Elements::U8(v) => Elements::U8(Values::Owned(copy(v, slots, dim))),
        };
        let mut dead = SlotSet::default();
        dead.cover(slots.len());
        CpuRows {
            dim,
            elements,
            sq_norms: slots.iter().map(|&s| self.sq_norms[s]).collect(),
            max_sq_norm: self.max_sq_norm,
            max_residual: self.max_residual,
            max_relative_residual: self.max_relative_residual,
            all_bytes: self.all_bytes,
            dead,
            simd: self.simd,
            bf16_min_rows: self.bf16_min_rows,
            here_products: self.here_products,
            pack_lists: self.pack_lists,
            packed: Default::default(),
            packed_codes: Default::default(),
        }
    }

    /// The stored values of `slots` as f32, one row after another: [`RowStore::gather`], and
    /// what wgpu uploads the passing rows of a filtered batch from. One allocation for all,
    /// checked against the host's memory first.
    pub(crate) fn values_of(&self, slots: &[usize]) -> Result<Vec<f32>> {
        let count = slots.len() * self.dim;
        let what = || format!("gathering {} rows of a filtered search", slots.len());
        crate::memory::check(what, (count * 4) as u64)?;
        let mut values = Vec::new();
        values.try_reserve_exact(count).map_err(|_| HiveGpuError::OutOfMemory {
            what: what(),
            requested: (count * 4) as u64,
            available: 0,
            limited_by: "allocator".into(),
        })?;
        let mut scratch = Vec::new();
        for &slot in slots {
            if slot >= self.len_slots() {
                return Err(HiveGpuError::InvalidArgument(format!("slot {slot} of {}", self.len_slots())));
            }
            values.extend_from_slice(self.rows_f32(slot, 1, &mut scratch));
        }
        Ok(values)
    }

    /// Records the statistics of the stored row in `slot` (the next one or an existing one).
    fn record(&mut self, slot: usize, RowStats { norm, residual, bytes }: RowStats) {
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
        each_elements!(&self.elements, v => v.len() / self.dim)
    }

    /// The `scale` and `offset` that turn row `slot`'s raw kernel value into its canonical
    /// distance (`raw * scale + offset`).
    fn row_transform(&self, metric: GpuDistanceMetric, raw_is_l2: bool, slot: usize) -> (f32, f32) {
        let norm = self.sq_norms[slot];
        match metric {
            GpuDistanceMetric::Euclidean if raw_is_l2 => (1.0, 0.0),
            // The kernels compute these distances themselves.
            GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => (1.0, 0.0),
            GpuDistanceMetric::Euclidean => (-2.0, norm),
            GpuDistanceMetric::DotProduct => (-1.0, 0.0),
            GpuDistanceMetric::Cosine if norm > 0.0 => (-1.0 / norm.sqrt(), 0.0),
            GpuDistanceMetric::Cosine => (0.0, 0.0),
        }
    }

    /// Per-row `scale` and `offset` that turn a block's raw kernel values into canonical
    /// distances (`raw * scale + offset`); removed rows get `+inf`.
    fn block_transform(
        &self,
        skip: &SlotSet,
        metric: GpuDistanceMetric,
        raw_is_l2: bool,
        start: usize,
        scale: &mut [f32],
        offset: &mut [f32],
    ) {
        // The skipped rows' bits, read a word at a time, and applied without a branch: under a
        // filter of about half the rows the skipped ones are random, and a branch on each
        // mispredicted half the time (one query at a time at S = 0.5 ran at 0.88x of unfiltered,
        // 0.92x without it: docs/PERFORMANCE.md, filtered search on the CPU).
        let words = if skip.count() > 0 { skip.words() } else { &[] };
        for (j, (s, o)) in scale.iter_mut().zip(offset.iter_mut()).enumerate() {
            let slot = start + j;
            let (row_scale, row_offset) = self.row_transform(metric, raw_is_l2, slot);
            let bit = words.get(slot / 32).map_or(0, |w| (w >> (slot % 32)) & 1);
            let skipped = bit.wrapping_neg();
            *s = f32::from_bits(row_scale.to_bits() & !skipped);
            *o = f32::from_bits((row_offset.to_bits() & !skipped) | (f32::INFINITY.to_bits() & skipped));
        }
    }

    /// The exact k best of `slots` for query `q` (f64 distances, ties by slot): one query of
    /// [`RowStore::refine`], and the re-rank of wgpu's candidates on its host copy.
    pub(crate) fn rerank(
        &self,
        q: &[f32],
        slots: &[usize],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Vec<Neighbor> {
        let q_norm = crate::exact::query_norm(metric, q);
        let mut distances = Vec::new();
        self.exact_distances(q, q_norm, slots.iter().copied(), metric, &mut Vec::new(), &mut distances);
        let scored = slots.iter().copied().zip(distances).collect();
        topk::best_k(scored, k).into_iter().map(|(slot, distance)| Neighbor { slot, distance }).collect()
    }

    /// Exact k nearest of the rows `slots` (ascending) for one query, reading them in place:
    /// the scan's kernels and bound, then the exact re-rank.
    fn knn_among(&self, q: &[f32], k: usize, metric: GpuDistanceMetric, slots: &[usize]) -> Vec<Neighbor> {
        let q_norm = crate::exact::query_norm(metric, q);
        // Cosine ignores the query's scale: the kernels get the unit query (as in the scan).
        let unit: Vec<f32>;
        let kernel_q = if metric == GpuDistanceMetric::Cosine {
            unit = q.iter().map(|&x| (f64::from(x) / q_norm) as f32).collect();
            &unit[..]
        } else {
            q
        };
        let bound = self.bound(metric, crate::exact::norm_for_bound(kernel_q) as f32, false);
        let collector = self.scan_slots(kernel_q, metric, k, bound, slots);
        let picked: Vec<usize> = collector.into_slots().into_iter().map(|at| slots[at]).collect();
        let mut distances = Vec::new();
        self.exact_distances(q, q_norm, picked.iter().copied(), metric, &mut Vec::new(), &mut distances);
        let scored = picked.into_iter().zip(distances).collect();
        topk::best_k(scored, k).into_iter().map(|(slot, distance)| Neighbor { slot, distance }).collect()
    }

    /// Shrinks the collector of query `q` once it is crowded (many rows tie with its k-th),
    /// scoring its candidates exactly: see [`topk::Collector::shrink`].
    fn thin(&self, collector: &mut topk::Collector, q: &[f32], metric: GpuDistanceMetric) {
        if collector.crowded() {
            let q_norm = crate::exact::query_norm(metric, q);
            let mut scratch = Vec::new();
            collector.shrink(|slots, out| {
                self.exact_distances(q, q_norm, slots.iter().map(|&s| s as usize), metric, &mut scratch, out)
            });
        }
    }

    /// The removed rows (GPU backends upload its words as they are).
    // Only the wgpu backend, which keeps its host rows here, calls this.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    pub(crate) fn removed(&self) -> &SlotSet {
        &self.dead
    }

    /// At least the largest squared norm of any slot.
    // Only the wgpu backend, which keeps its host rows here, calls this.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    pub(crate) fn max_squared_norm(&self) -> f32 {
        self.max_sq_norm
    }

    /// The exact canonical distance (f64, [`lanes::distances_f64`]) of each of `slots` to `q`, in
    /// their order, appended to `out`: up to two groups of [`lanes::LANES`] rows at a time, their
    /// sums side by side (bit for bit the one-row sums).
    fn exact_distances(
        &self,
        q: &[f32],
        q_norm: f64,
        slots: impl ExactSizeIterator<Item = usize> + Clone,
        metric: GpuDistanceMetric,
        scratch: &mut Vec<f32>,
        out: &mut Vec<f64>,
    ) {
        let dim = self.dim;
        out.reserve(slots.len());
        // The candidates are scattered rows that the scan before did not read (an IVF scan
        // reads its packed copy, a coded scan its codes): each group's loads waited on memory,
        // about half of the re-rank's samples (`perf`, docs/PERFORMANCE.md "Byte-valued
        // lists"). Rows are asked for a few groups ahead of their sums, within about
        // 16 KiB, so they arrive while the groups before are summed.
        let row_bytes = dim * crate::exact::elements::element_bytes(self.precision());
        let ahead_rows = (16 * 1024 / row_bytes.max(1)).clamp(lanes::LANES, 4 * lanes::LANES);
        let mut ahead = slots.clone();
        for slot in ahead.by_ref().take(ahead_rows) {
            self.prefetch_row(slot);
        }
        // Two lane groups a call (`lanes::distances_f64_wide`): a re-rank's 10 to 20 rows in one.
        const WIDE: usize = 2 * lanes::LANES;
        let mut group = [0usize; WIDE];
        let mut filled = 0;
        let flush = |group: &[usize], scratch: &mut Vec<f32>, out: &mut Vec<f64>| {
            let mut rows: [&[f32]; WIDE] = [&[]; WIDE];
            let scored = if let Elements::F32(v) = &self.elements {
                for (row, &s) in rows.iter_mut().zip(group) {
                    *row = &v[s * dim..(s + 1) * dim];
                }
                lanes::distances_f64_wide(metric, q, q_norm, &rows[..group.len()])
            } else {
                // Other element types are widened first, the group's rows one after another.
                scratch.resize(group.len() * dim, 0.0);
                for (&s, to) in group.iter().zip(scratch.chunks_exact_mut(dim)) {
                    each_elements!(&self.elements, v => Element::widen(&v[s * dim..(s + 1) * dim], to));
                }
                for (row, values) in rows.iter_mut().zip(scratch.chunks_exact(dim)) {
                    *row = values;
                }
                lanes::distances_f64_wide(metric, q, q_norm, &rows[..group.len()])
            };
            out.extend_from_slice(&scored[..group.len()]);
        };
        for slot in slots {
            if let Some(next) = ahead.next() {
                self.prefetch_row(next);
            }
            group[filled] = slot;
            filled += 1;
            if filled == WIDE {
                flush(&group, scratch, out);
                filled = 0;
            }
        }
        if filled > 0 {
            flush(&group[..filled], scratch, out);
        }
    }

    /// [`RowStore::knn`]'s work, on the library's pool.
    fn knn_on_pool(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let dim = self.dim;
        let mask = SearchMask::new(&self.dead, self.len_slots(), allowed);
        let live = mask.live;
        check_knn(queries, dim, k, live)?;
        let skip: &SlotSet = &mask.skip;
        // Few rows pass the filter: search a copy of just those rows, whose slots keep their
        // order (so ties still go to the lower slot), where the host has the memory for it.
        let element_bytes = self.precision().element_bytes();
        let gathered_bytes = (live * (dim * element_bytes + 4)) as u64;
        if mask.filtered
            && live.saturating_mul(GATHER_SHARE.1) <= self.len_slots().saturating_mul(GATHER_SHARE.0)
            && crate::memory::claim(gathered_bytes).is_ok()
        {
            let passing = mask.kept(self.len_slots());
            let few = queries.len() / dim < GEMM_MIN_QUERIES;
            if few && live.saturating_mul(IN_PLACE_FRACTION) <= self.len_slots() {
                // Few queries: the passing rows are read where they are, each once per query.
                return Ok(queries
                    .chunks_exact(dim)
                    .map(|q| self.knn_among(q, k, metric, &passing))
                    .collect());
            }
            if !few {
                // Batches: one copy of the passing rows feeds the matrix tiles of every query.
                let found = self.gathered(&passing).knn_on_pool(queries, k, metric, None)?;
                return Ok(crate::backend::ungather(found, &passing));
            }
        }
        let nq = queries.len() / dim;
        let q_norms: Vec<f64> =
            queries.chunks_exact(dim).map(|q| crate::exact::query_norm(metric, q)).collect();
        let bytes = self.all_bytes
            && !metric.is_difference_norm()
            && dim <= int8::MAX_DIM
            && int8::available()
            && int8::all_bytes(queries);
        let collectors = if nq >= BF16_MIN_QUERIES && bytes {
            // Exact integer products; only the f32 conversion rounds, well inside the f32 bound.
            let bounds = self.f32_bounds(queries, metric);
            self.tiled_collect(skip, TileKernel::Bytes, queries, metric, k, &bounds)
        } else {
            self.approximate_collect(skip, queries, &q_norms, metric, k)
        };
        Ok(collectors
            .into_par_iter()
            .zip(queries.par_chunks_exact(dim))
            .zip(q_norms.par_iter())
            .map(|((collector, q), &q_norm)| {
                let slots = collector.into_slots();
                let mut distances = Vec::new();
                self.exact_distances(
                    q,
                    q_norm,
                    slots.iter().copied(),
                    metric,
                    &mut Vec::new(),
                    &mut distances,
                );
                let scored = slots.into_iter().zip(distances).collect();
                topk::best_k(scored, k)
                    .into_iter()
                    .map(|(slot, distance)| Neighbor { slot, distance })
                    .collect()
            })
            .collect())
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
        let values = additional * self.dim;
        let element_bytes = self.precision().element_bytes();
        // Claimed from what this process may still allocate (cgroup and rlimit included) on
        // every reservation, room or not: memory the kernel granted but never backed (a Vec's
        // spare capacity) gets the process killed when the rows are written, long after
        // `try_reserve` said yes.
        let requested = (additional * (self.dim * element_bytes + 4)) as u64;
        let too_much = |available: u64| HiveGpuError::VramLimitExceeded {
            backend: GpuBackendType::Cpu,
            requested,
            available,
        };
        crate::memory::claim(requested).map_err(|(_, available)| too_much(available))?;
        // Amortised growth may ask for up to twice the rows held; under an address-space limit
        // that can fail where the rows asked for still fit, so exactly those are tried next.
        // Rows still in a mapped file move into memory first: appends go after them.
        let reserved = each_elements!(&mut self.elements, v => {
            let v = v.owned()?;
            v.try_reserve(values).or_else(|_| v.try_reserve_exact(values))
        });
        reserved
            .and_then(|_| self.sq_norms.try_reserve(additional))
            .and_then(|_| self.dead.try_reserve(self.len_slots() + additional))
            .map_err(|_| too_much(crate::memory::available_bytes().unwrap_or(0)))
    }

    fn append(&mut self, rows: &[f32]) -> Result<()> {
        crate::exact::elements::check_storable(rows, self.precision())?;
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
        let first = self.len_slots();
        fn extend<T: Element>(values: &mut Values<T>, rows: &[f32]) -> Result<()> {
            let owned = values.owned()?;
            if rows.len() <= PARALLEL_VALUES {
                owned.extend(rows.iter().map(|&x| T::from_f32(x)));
            } else {
                owned.par_extend(rows.par_iter().with_min_len(PARALLEL_VALUES).map(|&x| T::from_f32(x)));
            }
            Ok(())
        }
        each_elements!(&mut self.elements, v => extend(v, rows))?;
        self.note_rows_from(first);
        self.dead.cover(self.len_slots());
        Ok(())
    }

    fn append_stored(&mut self, bytes: &[u8], precision: StoragePrecision, dim: usize) -> Result<()> {
        let stored = self.precision();
        let row_bytes = self.dim * crate::exact::elements::element_bytes(precision);
        if precision != stored || dim != self.dim || cfg!(target_endian = "big") {
            return crate::backend::append_widened(self, bytes, precision, dim);
        }
        if !bytes.len().is_multiple_of(row_bytes)
            || self.len_slots().saturating_add(bytes.len() / row_bytes) > u32::MAX as usize
        {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{} bytes are not whole stored rows of dimension {dim}, or too many for a CPU collection",
                bytes.len()
            )));
        }
        let first = self.len_slots();
        // The file's elements are the stored ones: copied as they are (in parallel; the cast
        // fails only on a misaligned buffer, which widens instead).
        fn extend<T: bytemuck::Pod + Send + Sync>(values: &mut Values<T>, bytes: &[u8]) -> Result<bool> {
            let Ok(elements) = bytemuck::try_cast_slice::<u8, T>(bytes) else { return Ok(false) };
            let owned = values.owned()?;
            if elements.len() <= PARALLEL_VALUES {
                owned.extend_from_slice(elements);
            } else {
                owned.par_extend(elements.par_iter().with_min_len(PARALLEL_VALUES).copied());
            }
            Ok(true)
        }
        let copied = each_elements!(&mut self.elements, v => extend(v, bytes)?);
        if !copied {
            return crate::backend::append_widened(self, bytes, precision, dim);
        }
        self.note_rows_from(first);
        self.dead.cover(self.len_slots());
        Ok(())
    }

    fn read_stored(
        &self,
        start: usize,
        count: usize,
        precision: StoragePrecision,
        out: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        crate::backend::check_row_range(start, count, self.len_slots())?;
        let range = start * self.dim..(start + count) * self.dim;
        // The stored elements are the file's: their own memory goes out as it is.
        if precision == self.precision() && cfg!(target_endian = "little") {
            return each_elements!(&self.elements, v => out(bytemuck::cast_slice(&v[range])));
        }
        let mut scratch = Vec::new();
        out(&crate::exact::elements::narrow(self.rows_f32(start, count, &mut scratch), precision))
    }

    fn adopt_mapped(&mut self, rows: &MappedRows, precision: StoragePrecision, dim: usize) -> Result<bool> {
        let row_bytes = dim * crate::exact::elements::element_bytes(precision);
        if self.len_slots() != 0
            || dim != self.dim
            || !rows.bytes().len().is_multiple_of(row_bytes)
            || rows.bytes().len() / row_bytes > u32::MAX as usize
        {
            return Ok(false);
        }
        if precision != self.precision() {
            return Ok(false);
        }
        let elements = match &self.elements {
            Elements::F32(_) => Values::mapped(rows).map(Elements::F32),
            Elements::F16(_) => Values::mapped(rows).map(Elements::F16),
            Elements::Bf16(_) => Values::mapped(rows).map(Elements::Bf16),
            Elements::I8(_) => Values::mapped(rows).map(Elements::I8),
            Elements::U8(_) => Values::mapped(rows).map(Elements::U8),
        };
        let Some(elements) = elements else { return Ok(false) };
        self.forget_packed_lists();
        // Norms, 4 bytes a row, stay in memory: claimed like an append's.
        let count = rows.bytes().len() / row_bytes;
        crate::memory::claim((count * 4) as u64).map_err(|(requested, available)| {
            HiveGpuError::VramLimitExceeded { backend: GpuBackendType::Cpu, requested, available }
        })?;
        self.sq_norms.try_reserve_exact(count).map_err(|_| HiveGpuError::VramLimitExceeded {
            backend: GpuBackendType::Cpu,
            requested: (count * 4) as u64,
            available: crate::memory::available_bytes().unwrap_or(0),
        })?;
        self.elements = elements;
        self.note_rows_from(0);
        self.dead.cover(self.len_slots());
        Ok(true)
    }

    fn truncate(&mut self, len: usize) {
        if len >= self.len_slots() {
            return;
        }
        self.forget_packed_lists();
        self.dead.clear_from(len);
        each_elements!(&mut self.elements, v => v.truncate(len * self.dim));
        self.sq_norms.truncate(len);
    }

    fn tombstone(&mut self, slots: &[usize]) {
        for &slot in slots {
            if slot < self.len_slots() {
                self.dead.set(slot, true);
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
        // The kept rows are copied before anything changes, into memory asked for first: a
        // compaction that cannot get it leaves the rows as they were.
        fn gather<T: Copy>(v: &[T], keep: &[usize], dim: usize) -> Option<Vec<T>> {
            let mut out = Vec::new();
            out.try_reserve_exact(keep.len() * dim).ok()?;
            out.extend(keep.iter().flat_map(|&s| v[s * dim..(s + 1) * dim].iter().copied()));
            Some(out)
        }
        let element_bytes = self.precision().element_bytes();
        let requested = (keep.len() * dim * element_bytes) as u64;
        let too_much = || HiveGpuError::VramLimitExceeded {
            backend: GpuBackendType::Cpu,
            requested,
            available: crate::memory::available_bytes().unwrap_or(0),
        };
        if crate::memory::available_bytes().is_some_and(|available| requested > available) {
            return Err(too_much());
        }
        let gathered = match &self.elements {
            Elements::F32(v) => gather(v, keep, dim).map(|v| Elements::F32(Values::Owned(v))),
            Elements::F16(v) => gather(v, keep, dim).map(|v| Elements::F16(Values::Owned(v))),
            Elements::Bf16(v) => gather(v, keep, dim).map(|v| Elements::Bf16(Values::Owned(v))),
            Elements::I8(v) => gather(v, keep, dim).map(|v| Elements::I8(Values::Owned(v))),
            Elements::U8(v) => gather(v, keep, dim).map(|v| Elements::U8(Values::Owned(v))),
        };
        self.elements = gathered.ok_or_else(too_much)?;
        self.forget_packed_lists();
        self.dead.reset(keep.len());
        self.sq_norms = Vec::with_capacity(keep.len());
        (self.max_sq_norm, self.max_residual, self.max_relative_residual) = (0.0, 0.0, 0.0);
        self.all_bytes = true;
        self.note_rows_from(0);
        Ok(())
    }

    fn clear(&mut self) {
        self.forget_packed_lists();
        each_elements!(&mut self.elements, v => *v = Values::Owned(Vec::new()));
        self.sq_norms = Vec::new();
        self.dead = SlotSet::default();
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
        let values = each_elements!(&self.elements, v => v.heap_bytes());
        let codes = self
            .packed_codes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or(0, |c| c.bytes());
        values + self.sq_norms.capacity() * 4 + self.dead.capacity_bytes() + self.packed_lists_bytes() + codes
    }

    fn knn(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        crate::backend::candidates::check_finite_queries("knn", self.dim, queries)?;
        // A small unfiltered search of few queries runs on the caller's thread, without a
        // parallel section (of many queries, in parts on the pool: `split_here`); every other
        // is parallel: on the library's pool, since the caller may hold a collection's lock
        // (`crate::exec`).
        if allowed.is_none() && self.searches_here(queries.len() / self.dim.max(1)) {
            // The whole batch is checked here, so that an error names it and not a part.
            check_knn(queries, self.dim, k, self.len_slots() - self.dead.count())?;
            return self.split_here(queries, |part| self.knn_here(part, k, metric));
        }
        crate::exec::run(|| self.knn_on_pool(queries, k, metric, allowed))?
    }

    /// The 1-NN set of each point: [`RowStore::nearest_sets`] at n = 1 picks the very row
    /// `knn` at k = 1 would (a lone candidate is proven the nearest; ties go through the exact
    /// re-rank, lower slot first), without re-ranking every point's one candidate. An IVF
    /// probe at nprobe 1 took the re-rank and ran slower than at nprobe 2 (docs/PERFORMANCE.md,
    /// "Byte-valued lists"); k-means assigns through this too.
    fn nearest_rows(&self, points: &[f32]) -> Result<Vec<usize>> {
        Ok(self
            .nearest_sets(points, 1, GpuDistanceMetric::Euclidean)?
            .into_iter()
            .map(|slot| slot as usize)
            .collect())
    }

    fn nearest_sets(&self, queries: &[f32], n: usize, metric: GpuDistanceMetric) -> Result<Vec<u32>> {
        crate::backend::candidates::check_finite_queries("nearest_sets", self.dim, queries)?;
        if !self.searches_here(queries.len() / self.dim.max(1)) {
            let found = crate::exec::run(|| self.knn_on_pool(queries, n, metric, None))??;
            return Ok(found.iter().flatten().map(|neighbor| neighbor.slot as u32).collect());
        }
        // `knn_here` is the exact re-rank of these very candidates down to n; where they are
        // exactly n it keeps them all, so they are its set without their distances. (They are
        // never fewer: every true n-nearest row is a candidate, `topk`.) Rows that tie exactly
        // at the n-th are all candidates, so a choice among ties always goes through the
        // re-rank, which takes the lower slot as `knn` does. In an IVF probe of SIFT10K (100
        // centroids, nprobe 8) the re-rank was a tenth of the batch (docs/PERFORMANCE.md,
        // "Small searches without serial chains").
        check_knn(queries, self.dim, n, self.len_slots() - self.dead.count())?;
        self.split_here(queries, |part| self.sets_here(part, n, metric))
    }

    fn gather(&self, slots: &[usize]) -> Result<Vec<f32>> {
        self.values_of(slots)
    }

    fn refine(
        &self,
        queries: &[f32],
        candidates: &Candidates,
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nq = check_refine(self.dim, queries, candidates, k)?;
        let one = |q: usize| -> Result<Vec<Neighbor>> {
            let live = live_candidates(candidates, q, self.len_slots(), &self.dead)?;
            let query = &queries[q * self.dim..(q + 1) * self.dim];
            // Many candidates per neighbour asked (a quantized index's refine_factor * k): the
            // scan's f32 kernels and error bound drop those that cannot be among the k best, and
            // only the rest are scored in f64 (scoring all 80 of IVF-PQ's default candidates in
            // f64 was most of its search: docs/PERFORMANCE.md). `live` is ascending, as
            // `knn_among` needs.
            if live.len() > 2 * k + REFINE_FILTER_SLACK {
                return Ok(self.knn_among(query, k, metric, &live));
            }
            Ok(self.rerank(query, &live, k, metric))
        };
        // Queries in parallel once there is enough work to share (a few hundred row reads).
        if candidates.total() * self.dim >= PARALLEL_REFINE_VALUES {
            crate::exec::run(|| (0..nq).into_par_iter().map(one).collect())?
        } else {
            (0..nq).map(one).collect()
        }
    }

    fn release_scratch(&self) {
        // The packed copy of an index's lists (as large as the rows): kept for the next scan,
        // which a replaced or dropped index will never make.
        *self.packed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        *self.packed_codes.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    fn scan_lists(
        &self,
        queries: &[f32],
        probes: &crate::backend::ListProbes<'_>,
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        if let Some(packed) = self.scans_here(queries, probes, metric) {
            return self.scan_lists_in(queries, probes, k, metric, allowed, Some(packed));
        }
        crate::exec::run(|| self.scan_lists_in(queries, probes, k, metric, allowed, None))?
    }

    fn scan_codes(&self, scan: &CodeScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        scan.check(k)?;
        if let Some(packed) = self.codes_here(scan) {
            return Ok(self.scan_packed_codes(scan, k, &packed, true));
        }
        crate::exec::run(|| match self.packed_codes(scan) {
            Some(packed) => Ok(self.scan_packed_codes(scan, k, &packed, false)),
            None => crate::backend::codes::scan_on_host(scan, k),
        })?
    }

    fn select_k(&self, scores: &[f32], width: usize, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        let rows = check_select(scores, width, k)?;
        let one = |row: &[f32]| -> Vec<Neighbor> {
            let scored = row.iter().enumerate().map(|(column, &s)| (column, f64::from(s))).collect();
            topk::best_k(scored, k).into_iter().map(|(slot, distance)| Neighbor { slot, distance }).collect()
        };
        if scores.len() >= PARALLEL_REFINE_VALUES {
            crate::exec::run(|| scores.par_chunks_exact(width).map(one).collect())
        } else {
            Ok(scores.chunks_exact(width).map(one).take(rows).collect())
        }
    }
}

/// Candidates beyond `2 * k` from which [`RowStore::refine`] first filters them with the f32
/// kernels and their error bound (below that, scoring all of them in f64 is as cheap).
const REFINE_FILTER_SLACK: usize = 16;

/// The queries as the product kernels take them: unit queries under cosine, which ignores a
/// query's scale (so a tiny or huge query cannot underflow or overflow the products), else the
/// queries themselves.
pub(super) fn kernel_queries(
    queries: &[f32],
    dim: usize,
    metric: GpuDistanceMetric,
) -> std::borrow::Cow<'_, [f32]> {
    if metric != GpuDistanceMetric::Cosine {
        return std::borrow::Cow::Borrowed(queries);
    }
    queries
        .chunks_exact(dim)
        .flat_map(|q| {
            let norm = simd::squared_norm_f64(q).sqrt();
            q.iter().map(move |&x| (f64::from(x) / norm) as f32)
        })
        .collect()
}

/// The knn request's shape, checked: `1 <= k <= live` and whole `dim`-long queries.
fn check_knn(queries: &[f32], dim: usize, k: usize, live: usize) -> Result<()> {
    if k == 0 || k > live || !queries.len().is_multiple_of(dim) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "knn needs 1 <= k <= {live} live rows (k = {k}) and whole {dim}-dimensional queries ({} values)",
            queries.len()
        )));
    }
    Ok(())
}

/// Queries from which a search small enough for the caller's thread is split over the pool's
/// threads instead ([`CpuRows::split_here`]): parts of about half of this or more.
const SPLIT_HERE_QUERIES: usize = 32;

/// Whether a batch of `nq` queries small enough in products for the caller's thread has
/// enough queries to be worth the pool's threads instead: [`SPLIT_HERE_QUERIES`] or more, and
/// a pool of two threads or more. A list scan of 100 queries at nprobe 1 over 100-row lists
/// (1.28M products) ran on one thread of two and slower than the same batch at nprobe 2
/// (docs/PERFORMANCE.md, "Byte-valued lists").
pub(super) fn spreads(nq: usize) -> bool {
    nq >= SPLIT_HERE_QUERIES && crate::exec::pool_threads() > 1
}

/// Values (candidates x dimension, or scores) from which a refine or a selection spreads its
/// queries over threads.
const PARALLEL_REFINE_VALUES: usize = 1 << 16;

impl CpuRows {
    /// Whether an unfiltered search of `nq` queries is small enough for [`CpuRows::knn_here`]:
    /// at most `here_products` products (queries x slots, removed ones included, x dimension;
    /// none at 0) and at most one query block ([`paths::QUERY_BLOCK`], 192 queries).
    fn searches_here(&self, nq: usize) -> bool {
        self.here_products > 0
            && nq.saturating_mul(self.len_slots()).saturating_mul(self.dim) <= self.here_products
            && nq <= paths::QUERY_BLOCK
    }

    /// `work` (a search on the caller's thread, [`CpuRows::searches_here`]) over `queries`, or
    /// over parts of them side by side on the library's pool where they are many: a batch of
    /// [`SPLIT_HERE_QUERIES`] or more whose products fit one thread (an IVF probe of 100
    /// queries over 100 centroids) would otherwise leave the other threads idle for the whole
    /// of it, serial before the parallel list scans (docs/PERFORMANCE.md, "Byte-valued
    /// lists"). Each part runs the same lean path; results stay in query order.
    fn split_here<T: Send>(
        &self,
        queries: &[f32],
        work: impl Fn(&[f32]) -> Result<Vec<T>> + Sync,
    ) -> Result<Vec<T>> {
        let nq = queries.len() / self.dim.max(1);
        if !spreads(nq) {
            return work(queries);
        }
        let parts = crate::exec::pool_threads().min(nq / (SPLIT_HERE_QUERIES / 2));
        let per = nq.div_ceil(parts) * self.dim;
        let found =
            crate::exec::run(|| queries.par_chunks(per).map(&work).collect::<Result<Vec<Vec<T>>>>())??;
        Ok(found.into_iter().flatten().collect())
    }

    /// [`RowStore::nearest_sets`] on this thread.
    fn sets_here(&self, queries: &[f32], n: usize, metric: GpuDistanceMetric) -> Result<Vec<u32>> {
        let mut sets = Vec::with_capacity(queries.len() / self.dim.max(1) * n);
        for (candidates, q) in
            self.here_candidates(queries, n, metric)?.into_iter().zip(queries.chunks_exact(self.dim))
        {
            debug_assert!(candidates.len() >= n, "fewer candidates than the n nearest");
            if candidates.len() == n {
                sets.extend(candidates.iter().map(|&slot| slot as u32));
            } else {
                sets.extend(
                    self.rerank(q, &candidates, n, metric).iter().map(|neighbor| neighbor.slot as u32),
                );
            }
        }
        Ok(sets)
    }

    /// An unfiltered search on this thread, with no parallel section (so it may run under a
    /// collection's lock outside the pool: `crate::exec`): f32 products of every query with
    /// every row in one GEMM task, the bounded selection, the exact re-rank. Its candidates
    /// may differ from [`CpuRows::knn_on_pool`]'s (which scans for fewer than 4 queries and
    /// may take the byte or bf16 kernels), but both hold every row within their error bound of
    /// the k-th and end in the same exact re-rank, so the results are the same.
    fn knn_here(&self, queries: &[f32], k: usize, metric: GpuDistanceMetric) -> Result<Vec<Vec<Neighbor>>> {
        Ok(self
            .here_candidates(queries, k, metric)?
            .into_iter()
            .zip(queries.chunks_exact(self.dim))
            .map(|(candidates, q)| self.rerank(q, &candidates, k, metric))
            .collect())
    }

    /// [`CpuRows::knn_here`] before its exact re-rank: each query's candidates (every row
    /// within the error bound of its k-th), unordered.
    fn here_candidates(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<usize>>> {
        let dim = self.dim;
        check_knn(queries, dim, k, self.len_slots() - self.dead.count())?;
        let kernel_queries = kernel_queries(queries, dim, metric);
        let bounds = self.f32_bounds(&kernel_queries, metric);
        let collectors = self.gemm_task(&self.dead, &kernel_queries, metric, k, &bounds, 0..self.len_slots());
        Ok(collectors.into_iter().map(|collector| collector.into_slots()).collect())
    }

    /// Candidates from the floating-point kernels: the scan, f32 GEMM tiles or bf16 tiles.
    fn approximate_collect(
        &self,
        skip: &SlotSet,
        queries: &[f32],
        q_norms: &[f64],
        metric: GpuDistanceMetric,
        k: usize,
    ) -> Vec<topk::Collector> {
        let dim = self.dim;
        let nq = queries.len() / dim;
        // The kernels get unit queries under cosine ([`kernel_queries`]); the re-rank uses the
        // caller's.
        let unit = kernel_queries(queries, dim, metric);
        let queries = &unit[..];
        let unit_norms: Vec<f64> = match unit {
            std::borrow::Cow::Owned(_) => {
                queries.chunks_exact(dim).map(crate::exact::norm_for_bound).collect()
            }
            std::borrow::Cow::Borrowed(_) => q_norms.to_vec(),
        };
        let q_norms = &unit_norms;
        if nq >= BF16_MIN_QUERIES
            && self.len_slots() >= self.bf16_min_rows
            && bf16::available()
            && !metric.is_difference_norm()
        {
            let bounds: Vec<ErrorBound> = queries
                .chunks_exact(dim)
                .zip(q_norms.iter())
                .map(|(q, &qn)| self.bf16_bound(metric, q, qn))
                .collect();
            self.tiled_collect(skip, TileKernel::Bf16, queries, metric, k, &bounds)
        } else if nq >= GEMM_MIN_QUERIES {
            let bounds = self.f32_bounds(queries, metric);
            self.gemm_collect(skip, queries, metric, k, &bounds)
        } else {
            queries
                .chunks_exact(dim)
                .zip(q_norms)
                .map(|(q, &qn)| self.scan(skip, q, metric, k, self.bound(metric, qn as f32, false)))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_search_on_the_callers_thread_returns_what_the_pool_returns() {
        // More rows than a GEMM tile, 1 to 45 queries (the pool scans below 4 and may take the
        // bf16 kernel from 16; 45 are split over the pool's threads where it has two or more,
        // `split_here`), f32 and byte-valued data (the pool's byte kernel), f16 storage,
        // repeated rows (exact ties) and removed rows, every metric, k up to every live row:
        // the caller's thread takes one GEMM task instead, and both must end in the same exact
        // re-rank, or the same error.
        let (dim, n) = (19, 1300);
        let mut state = 7u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut floats: Vec<f32> = (0..n * dim).map(|_| (next() - 0.5) * 8.0).collect();
        floats.extend_from_within(10 * dim..20 * dim);
        let bytes: Vec<f32> = floats.iter().map(|x| ((x + 4.0) * 31.0).floor()).collect();
        let removed = [3, 11, n + 9];
        let live = n + 10 - removed.len();
        for (values, precision) in [
            (&floats, StoragePrecision::F32),
            (&bytes, StoragePrecision::F32),
            (&floats, StoragePrecision::F16),
        ] {
            for nq in [1, 3, 7, 20, 45] {
                let queries: Vec<f32> = values[..nq * dim].iter().map(|x| x + 1.0).collect();
                for metric in GpuDistanceMetric::ALL {
                    for k in [12, live, live + 1] {
                        let searches = [(usize::MAX, 4096), (0, 4096), (0, 0)].map(|(here, bf16_rows)| {
                            let mut rows = CpuRows::new(dim, precision, SimdLevel::detect())
                                .with_here_products(here)
                                .with_bf16_min_rows(bf16_rows);
                            rows.append(values).expect("rows");
                            rows.tombstone(&removed);
                            assert_eq!(rows.searches_here(nq), here > 0);
                            assert_eq!(spreads(nq), nq >= 32 && crate::exec::pool_threads() > 1);
                            rows.knn(&queries, k, metric, None).map_err(|e| e.to_string())
                        });
                        assert_eq!(searches[0], searches[1], "{precision:?} nq {nq} {metric:?} k {k}");
                        assert_eq!(searches[0], searches[2], "{precision:?} nq {nq} {metric:?} k {k}, bf16");
                        assert_eq!(searches[0].is_err(), k > live);
                    }
                }
            }
        }
    }

    #[test]
    fn more_rows_than_u32_slots_is_refused() {
        let mut rows = CpuRows::new(1, StoragePrecision::F32, SimdLevel::Scalar);
        let err = rows.reserve(1 << 33).unwrap_err();
        assert!(err.to_string().contains("at most"), "{err}");
        rows.append(&[1.0]).expect("still usable");
    }
}
