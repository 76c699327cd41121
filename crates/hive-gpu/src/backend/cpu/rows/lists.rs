//! The CPU backend's inverted-list scan ([`RowStore::scan_lists`]): a batch's queries grouped
//! by the lists they probe, so that each list is read once per batch and meets all of its
//! queries in GEMM tiles fused with selection, where a scan per query (FAISS's IVF-Flat on
//! the CPU) reads each list once per query that probes it. f32 rows are read from the lists'
//! packed copy ([`super::packed_lists`]: blocks of rows that stream, products without
//! horizontal sums), for any number of queries; without one, few queries scan their lists'
//! rows in place and more multiply them in place or in gathered GEMM tiles.
//!
//! Exactness is the flat search's: the tiles' f32 distances only nominate candidates within
//! the error bound of the k-th (`topk::Collector`), and the candidates are re-ranked in f64.
//!
//! [`RowStore::scan_lists`]: crate::backend::RowStore::scan_lists

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rayon::prelude::*;

use super::packed_lists::{PackedList, PackedLists};
use super::paths::{GEMM_MIN_QUERIES, QUERY_BLOCK, ROW_TILE, inner_products};
use super::{CpuRows, Elements};
use crate::backend::Neighbor;
use crate::backend::candidates::{ListAskers, ListProbes, check_scan};
use crate::backend::cpu::topk::{Collector, ErrorBound};
use crate::backend::cpu::{few, filter, int8, packed};
use crate::error::{HiveGpuError, Result};
use crate::slots::SlotSet;
use crate::types::GpuDistanceMetric;

/// Lists asked by at most this many queries of a batch are multiplied in place
/// ([`few::products`]) rather than gathered into GEMM tiles.
const FEW_QUERIES: usize = 16;

impl CpuRows {
    /// The packed copy of `probes.lists` where a scan of `queries` over them is small enough to
    /// run on the caller's thread, with no parallel section (as a small flat search does,
    /// `CpuRows::searches_here`): at most `Tuning::cpu_here_products` products (the rows the
    /// batch's queries probe, summed over the queries, times the dimension) over lists already
    /// packed for their generation (a copy the memory budget refused counts: its lists are all
    /// scanned in place, on this thread too). A single query of SIFT10K at nprobe 8 multiplies
    /// 800 rows, about 2 us of work, which the hand-over to the pool and back tripled
    /// (docs/PERFORMANCE.md, "Small searches without serial chains"). The scan then uses this
    /// thread's scan buffers (`SCRATCH`, one tile of rows and one of products at most), which
    /// stay with the thread as the pool's threads' buffers do. A batch of many queries goes to
    /// the pool however few its products (`spreads`).
    pub(super) fn scans_here(
        &self,
        queries: &[f32],
        probes: &ListProbes<'_>,
        metric: GpuDistanceMetric,
    ) -> Option<Arc<PackedLists>> {
        if self.here_products == 0 || metric.is_difference_norm() || probes.nprobe == 0 {
            return None;
        }
        let rows: usize = probes
            .probes
            .iter()
            .map(|&l| probes.lists.get(l as usize).map_or(0, Vec::len))
            .fold(0, usize::saturating_add);
        let nq = queries.len() / self.dim.max(1);
        if rows.saturating_mul(self.dim) > self.here_products || nq > QUERY_BLOCK || super::spreads(nq) {
            return None;
        }
        self.current_packed_lists(probes)
    }

    /// [`RowStore::scan_lists`](crate::backend::RowStore::scan_lists): on the library's pool,
    /// or with `here` (the current packed copy, from [`CpuRows::scans_here`]) on this thread,
    /// one list and one query after another.
    pub(super) fn scan_lists_in(
        &self,
        queries: &[f32],
        probes: &ListProbes<'_>,
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
        here: Option<Arc<PackedLists>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let dim = self.dim;
        let nq = check_scan(dim, queries, probes, k)?;
        let sequential = here.is_some();
        // L1 and L-infinity have no products: their scans read the rows where they lie.
        let packed_lists = match here {
            Some(packed) => Some(packed),
            None if metric.is_difference_norm() => None,
            None => self.packed_lists(probes)?,
        };
        if packed_lists.is_none() && (nq < GEMM_MIN_QUERIES || metric.is_difference_norm()) {
            // Few queries (or L1 / L-infinity, which have no product tiles): each reads its
            // lists' rows where they lie, split over the threads.
            return queries
                .chunks_exact(dim)
                .enumerate()
                .map(|(q, query)| {
                    let mut members = Vec::new();
                    for &list in probes.of(q) {
                        members.extend(self.live_members(&probes.lists[list as usize], allowed)?);
                    }
                    members.sort_unstable();
                    Ok(self.knn_among(query, k, metric, &members))
                })
                .collect();
        }
        // Cosine ignores the query's scale: the tiles get unit queries, as in the flat search.
        let kernel_queries = super::kernel_queries(queries, dim, metric);
        let kernel_queries = &kernel_queries[..];
        let bounds = self.f32_bounds(kernel_queries, metric);
        // A copy with byte rows and a batch of byte-valued queries: their quads, for the exact
        // integer products (`int8`). One query with a fraction keeps the batch on f32.
        // Only where a probed list holds byte rows (lists too short to pack have none).
        let byte_queries: Option<Vec<u32>> = packed_lists
            .as_ref()
            .filter(|packed| {
                packed.bytes
                    && probes
                        .probes
                        .iter()
                        .any(|&l| packed.lists.get(l as usize).is_some_and(|l| !l.bytes.is_empty()))
                    && int8::all_bytes(kernel_queries)
            })
            .map(|_| {
                let mut quads = Vec::new();
                int8::append_queries(kernel_queries, dim, &mut quads);
                quads
            });
        let askers = ListAskers::new(probes.probes, probes.nprobe, probes.lists.len());
        let order = askers.by_work(|l| probes.lists[l].len());
        // Each query's best gate so far, shared by the scans of its lists on every thread: a
        // list scanned after another of the same query takes in only rows that can still beat
        // the k rows found there (`Collector::adopt_gate`), instead of a k of its own.
        let gates: Vec<SharedGate> = (0..nq).map(|_| SharedGate::new()).collect();
        // Each thread keeps its buffers from call to call: a list asked by one or two queries
        // would otherwise cost little less than the fresh pages of its tile.
        let scan = |&l: &usize| -> Result<Vec<Collector>> {
            let asking = askers.of(l);
            let batch = Batch {
                kernel_queries,
                byte_queries: byte_queries.as_deref(),
                bounds: &bounds,
                gates: &gates,
                metric,
                k,
            };
            // The scans start no parallel work, so no other scan on this thread can borrow
            // the buffers while one holds them.
            // A list too short to pack is read in place (`packed_lists::MIN_ROWS`).
            if let Some(packed) = &packed_lists
                && packed.lists[l].slots.len() == probes.lists[l].len()
            {
                let list = &packed.lists[l];
                return Ok(SCRATCH.with(|scratch| {
                    self.scan_packed_list(list, asking, allowed, &batch, &mut scratch.borrow_mut())
                }));
            }
            let members = self.live_members(&probes.lists[l], allowed)?;
            Ok(SCRATCH.with(|scratch| self.scan_list(&members, asking, &batch, &mut scratch.borrow_mut())))
        };
        let scanned: Vec<Vec<Collector>> = if sequential {
            order.iter().map(scan).collect::<Result<_>>()?
        } else {
            order.par_iter().map(scan).collect::<Result<_>>()?
        };
        // Each query's collectors, one per list it probed, merged and re-ranked exactly.
        let mut per_query: Vec<Vec<Collector>> = (0..nq).map(|_| Vec::new()).collect();
        for (&l, collectors) in order.iter().zip(scanned) {
            for (&q, collector) in askers.of(l).iter().zip(collectors) {
                per_query[q as usize].push(collector);
            }
        }
        let merge = |((collectors, q), gate): ((Vec<Collector>, &[f32]), &SharedGate)| {
            let mut merged = Collector::new(k, ErrorBound { absolute: 0.0, relative: 0.0 });
            let mut parts = collectors.into_iter();
            if let Some(first) = parts.next() {
                merged = first;
                merged.adopt_gate(gate.get());
                for part in parts {
                    merged.merge(part);
                    self.thin(&mut merged, q, metric);
                }
            }
            self.rerank(q, &merged.into_slots(), k, metric)
        };
        Ok(if sequential {
            per_query.into_iter().zip(queries.chunks_exact(dim)).zip(gates.iter()).map(merge).collect()
        } else {
            per_query.into_par_iter().zip(queries.par_chunks_exact(dim)).zip(&gates).map(merge).collect()
        })
    }

    /// The slots of `list` a search reads: stored, not removed, and in `allowed` where given.
    /// A slot past the stored rows is an error naming it.
    fn live_members(&self, list: &[u32], allowed: Option<&SlotSet>) -> Result<Vec<usize>> {
        let n = self.len_slots();
        let mut members = Vec::with_capacity(list.len());
        for &slot in list {
            let slot = slot as usize;
            if slot >= n {
                return Err(HiveGpuError::InvalidArgument(format!(
                    "scan_lists: list slot {slot} is past the {n} stored rows"
                )));
            }
            if !self.dead.contains(slot) && allowed.is_none_or(|a| a.contains(slot)) {
                members.push(slot);
            }
        }
        Ok(members)
    }

    /// One list's candidates for each query in `asking` (indices into the batch): its rows
    /// gathered a tile at a time, each tile multiplied with every asking query.
    fn scan_list(
        &self,
        members: &[usize],
        asking: &[u32],
        batch: &Batch<'_>,
        scratch: &mut Scratch,
    ) -> Vec<Collector> {
        let metric = batch.metric;
        let dim = self.dim;
        let mut collectors = batch.collectors(asking);
        if members.is_empty() {
            return collectors;
        }
        let block = asking.len().min(QUERY_BLOCK);
        let tile = members.len().min(ROW_TILE);
        let Scratch { block_queries, rows, products, scale, offset, slots, widened, .. } = scratch;
        products.resize(block * tile, 0.0);
        scale.resize(tile, 0.0);
        offset.resize(tile, 0.0);
        slots.resize(tile, 0);
        // A list asked by few queries is multiplied where its f32 rows lie (`few::products`);
        // others, and other storage types, gather each tile's rows for a GEMM.
        let in_place = match &self.elements {
            Elements::F32(values) if asking.len() <= FEW_QUERIES => Some(values),
            _ => None,
        };
        for chunk in members.chunks(tile) {
            let count = chunk.len();
            rows.clear();
            for (j, &slot) in chunk.iter().enumerate() {
                if in_place.is_none() {
                    rows.extend_from_slice(self.rows_f32(slot, 1, widened));
                }
                (scale[j], offset[j]) = self.row_transform(metric, false, slot);
                slots[j] = slot as u32;
            }
            for (b, group) in asking.chunks(block).enumerate() {
                batch.gather_queries(group, dim, block_queries);
                let products = &mut products[..group.len() * count];
                let row = |j: usize| match in_place {
                    Some(values) => &values[chunk[j] * dim..(chunk[j] + 1) * dim],
                    None => &rows[j * dim..(j + 1) * dim],
                };
                if in_place.is_none() || !few::products(self.simd, block_queries, dim, count, row, products) {
                    if rows.is_empty() {
                        for &slot in chunk {
                            rows.extend_from_slice(self.rows_f32(slot, 1, widened));
                        }
                    }
                    inner_products(block_queries, rows, dim, group.len(), count, products);
                }
                let offered =
                    Offered { scale: &scale[..count], offset: &offset[..count], slots: &slots[..count] };
                let first = b * block;
                self.collect_group(
                    &mut collectors[first..first + group.len()],
                    group,
                    products,
                    count,
                    &offered,
                    batch,
                );
            }
        }
        collectors
    }

    /// [`CpuRows::scan_list`] over a list's packed copy: its rows streamed a block at a time
    /// from the copy, removed rows and rows `allowed` leaves out offered as `+inf` (never
    /// taken).
    fn scan_packed_list(
        &self,
        list: &PackedList,
        asking: &[u32],
        allowed: Option<&SlotSet>,
        batch: &Batch<'_>,
        scratch: &mut Scratch,
    ) -> Vec<Collector> {
        let metric = batch.metric;
        let dim = self.dim;
        let mut collectors = batch.collectors(asking);
        let rows = list.slots.len();
        if rows == 0 {
            return collectors;
        }
        let block = asking.len().min(QUERY_BLOCK);
        // Whole blocks per tile (of both layouts), so that every tile after the first starts
        // on a block.
        const { assert!(ROW_TILE.is_multiple_of(packed::BLOCK) && ROW_TILE.is_multiple_of(int8::ROW_GROUP)) };
        let tile = rows.min(ROW_TILE);
        let stride = tile.next_multiple_of(packed::BLOCK.max(int8::ROW_GROUP));
        let byte_queries = batch.byte_queries.filter(|_| !list.bytes.is_empty());
        let nquads = int8::quads(dim);
        let Scratch { block_queries, group_quads, products, scale, offset, .. } = scratch;
        products.resize(block * stride, 0.0);
        scale.resize(tile, 0.0);
        offset.resize(tile, 0.0);
        for start in (0..rows).step_by(tile) {
            let slots = &list.slots[start..(start + tile).min(rows)];
            let count = slots.len();
            // The rows' norms lie in list order beside the copy: reading each from the
            // collection's array by slot waited on memory at every row, a sixth of a single
            // query's scan (`perf`, docs/PERFORMANCE.md "Byte-valued lists").
            transforms(metric, &list.norms[start..start + count], &mut scale[..count], &mut offset[..count]);
            if self.dead.count() > 0 || allowed.is_some() {
                for (j, &slot) in slots.iter().enumerate() {
                    let slot = slot as usize;
                    if self.dead.contains(slot) || allowed.is_some_and(|a| !a.contains(slot)) {
                        (scale[j], offset[j]) = (0.0, f32::INFINITY);
                    }
                }
            }
            let blocks = &list.blocks[start * dim..][..packed::packed_len(count, dim)];
            let offered = Offered { scale: &scale[..count], offset: &offset[..count], slots };
            for (b, group) in asking.chunks(block).enumerate() {
                let exact = byte_queries.is_some_and(|quads| {
                    group_quads.clear();
                    for &q in group {
                        group_quads.extend_from_slice(&quads[q as usize * nquads..(q as usize + 1) * nquads]);
                    }
                    let padded = count.next_multiple_of(int8::ROW_GROUP);
                    let (bytes, sums) = (&list.bytes[start * nquads..], &list.sums[start..]);
                    int8::products_any(
                        group_quads,
                        &bytes[..padded * nquads],
                        nquads,
                        stride,
                        &sums[..padded],
                        products,
                    )
                });
                // The shapes are the copy's own: a refusal here would be a defect, not a CPU
                // without VNNI (the copy has no byte rows then).
                debug_assert!(exact || byte_queries.is_none(), "the byte products refused their shapes");
                if !exact {
                    batch.gather_queries(group, dim, block_queries);
                    packed::products(self.simd, block_queries, dim, blocks, products, stride);
                }
                let first = b * block;
                self.collect_group(
                    &mut collectors[first..first + group.len()],
                    group,
                    products,
                    stride,
                    &offered,
                    batch,
                );
            }
        }
        collectors
    }

    /// Offers query `group[i]`'s products `products[i * stride..][..count]` with the rows in
    /// `offered` to `collectors[i]`, each first taking its query's shared gate and then
    /// reporting its own.
    fn collect_group(
        &self,
        collectors: &mut [Collector],
        group: &[u32],
        products: &[f32],
        stride: usize,
        offered: &Offered<'_>,
        batch: &Batch<'_>,
    ) {
        let Batch { kernel_queries, gates, metric, .. } = *batch;
        let dim = self.dim;
        let count = offered.slots.len();
        for ((c, &q), p) in collectors.iter_mut().zip(group).zip(products.chunks(stride)) {
            let q = q as usize;
            c.adopt_gate(gates[q].get());
            filter::collect_at(self.simd, c, &p[..count], offered.scale, offered.offset, offered.slots);
            self.thin(c, &kernel_queries[q * dim..(q + 1) * dim], metric);
            gates[q].lower(c.gate());
        }
    }
}

/// Each row's `scale` and `offset` from its squared norm, as `CpuRows::row_transform` gives
/// them for products (`raw_is_l2` false): one loop per metric instead of a branch per row.
fn transforms(metric: GpuDistanceMetric, norms: &[f32], scale: &mut [f32], offset: &mut [f32]) {
    let pairs = scale.iter_mut().zip(offset.iter_mut()).zip(norms);
    match metric {
        GpuDistanceMetric::Euclidean => pairs.for_each(|((s, o), &norm)| (*s, *o) = (-2.0, norm)),
        GpuDistanceMetric::DotProduct => pairs.for_each(|((s, o), _)| (*s, *o) = (-1.0, 0.0)),
        GpuDistanceMetric::Cosine => pairs.for_each(|((s, o), &norm)| {
            (*s, *o) = (if norm > 0.0 { -1.0 / norm.sqrt() } else { 0.0 }, 0.0);
        }),
        GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => {
            pairs.for_each(|((s, o), _)| (*s, *o) = (1.0, 0.0));
        }
    }
}

/// The rows of one tile as the collectors take them: distance `product * scale[j] + offset[j]`
/// for slot `slots[j]`.
struct Offered<'a> {
    scale: &'a [f32],
    offset: &'a [f32],
    slots: &'a [u32],
}

thread_local! {
    /// This thread's list-scan buffers (a few hundred KiB at most: one tile of rows and one
    /// of products).
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// The buffers one thread's list scans reuse.
#[derive(Default)]
struct Scratch {
    block_queries: Vec<f32>,
    /// The byte quads of one group of queries.
    group_quads: Vec<u32>,
    rows: Vec<f32>,
    products: Vec<f32>,
    scale: Vec<f32>,
    offset: Vec<f32>,
    slots: Vec<u32>,
    /// f16 rows widened one at a time.
    widened: Vec<f32>,
}

/// What every list scan of one batch shares.
#[derive(Clone, Copy)]
struct Batch<'a> {
    /// The queries as the kernels see them (unit vectors under cosine), row-major.
    kernel_queries: &'a [f32],
    /// Each kernel query's quads ([`int8::append_queries`]), where the packed copy has byte
    /// rows and every query is byte-valued.
    byte_queries: Option<&'a [u32]>,
    /// Each query's error bound on the GEMM path.
    bounds: &'a [ErrorBound],
    /// Each query's best gate so far over the lists it probes.
    gates: &'a [SharedGate],
    metric: GpuDistanceMetric,
    k: usize,
}

impl Batch<'_> {
    /// A fresh collector for each query of `asking`, with its bound.
    fn collectors(&self, asking: &[u32]) -> Vec<Collector> {
        asking.iter().map(|&q| Collector::new(self.k, self.bounds[q as usize])).collect()
    }

    /// The kernel queries of `group` (each `dim` long), one after another, into `out`.
    fn gather_queries(&self, group: &[u32], dim: usize, out: &mut Vec<f32>) {
        out.clear();
        for &q in group {
            let q = q as usize;
            out.extend_from_slice(&self.kernel_queries[q * dim..(q + 1) * dim]);
        }
    }
}

/// One query's best [`Collector::gate`] so far, lowered by the scans of its lists on any
/// thread. Every value stored is a gate some collector of the query reported, so it rests on k
/// rows the query probes (see [`Collector::adopt_gate`]); it only goes down, and a scan that
/// reads a stale (higher) value takes in a few more rows, never fewer.
pub(super) struct SharedGate(AtomicU32);

impl SharedGate {
    /// A gate that lets every row in (`+inf`).
    pub(super) fn new() -> Self {
        SharedGate(AtomicU32::new(f32::INFINITY.to_bits()))
    }

    /// The least gate stored so far.
    pub(super) fn get(&self) -> f32 {
        f32::from_bits(self.0.load(Ordering::Relaxed))
    }

    /// Keeps the least of the stored gate and `gate` (a NaN is ignored).
    pub(super) fn lower(&self, gate: f32) {
        let mut current = self.0.load(Ordering::Relaxed);
        while gate < f32::from_bits(current) {
            match self.0.compare_exchange_weak(current, gate.to_bits(), Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }
}
