//! The CPU backend's scan of an SQ8 index's lists ([`RowStore::scan_codes`]) over a packed
//! copy of their codes: each list's byte codes in blocks of 16 rows, component-major
//! ([`packed`]), so one 16-byte load holds a component of 16 rows and widens to one vector of
//! f32 in registers ([`packed::code_products`]). The distance is [`codes`]'s; its selection is
//! the IVF-Flat scan's (`lists.rs`): queries grouped by list, a [`Collector`] per query and
//! list sharing the query's gate across lists ([`SharedGate`]), small scans on the caller's
//! thread.
//!
//! The host scan every other backend falls back to ([`codes::scan_on_host`]) widens each list's
//! codes into f32 GEMM tiles per batch and keeps its k best in a binary heap; on SIFT10K's
//! IVF-SQ8 (100 lists of about 100 rows, nprobe 8) the widening, the heap and the GEMM's fixed
//! cost per small tile were most of a batch (docs/PERFORMANCE.md, "Packed SQ8 codes"). It still
//! answers where there is no copy: lists without a generation, packing off
//! ([`crate::Tuning::cpu_packed_lists`]), or a copy the host's memory budget refused.
//!
//! A row whose code distance overflows f32 (a query farther from a centroid than f32's range
//! allows) is never nominated, as in IVF-Flat's scan; the host scan may nominate such rows,
//! whose f64 re-rank would then be finite.
//!
//! The copy belongs to one generation of the lists (their codes are a function of it) and adds
//! the codes' bytes again (a quarter of an f32 collection's rows, besides the rows the exact
//! re-rank reads); it is counted in [`RowStore::memory_bytes`]. A new generation of the same
//! [`CodeScan::lineage`] (vectors added since) keeps every list's packed rows and packs only the
//! rows appended after them; any other new generation repacks every list: unlike f32 rows,
//! which the store holds by slot, codes come with the index, and a retrained or compacted index
//! may file the same slots with other codes.
//!
//! [`RowStore::scan_codes`]: crate::backend::RowStore::scan_codes
//! [`RowStore::memory_bytes`]: crate::backend::RowStore::memory_bytes
//! [`codes`]: crate::backend::codes
//! [`codes::scan_on_host`]: crate::backend::codes::scan_on_host

use std::sync::{Arc, PoisonError};

use rayon::prelude::*;

use super::CpuRows;
use super::lists::SharedGate;
use super::paths::{QUERY_BLOCK, ROW_TILE};
use crate::backend::candidates::ListAskers;
use crate::backend::cpu::topk::{Collector, ErrorBound};
use crate::backend::cpu::{filter, packed};
use crate::backend::{CodeScan, Neighbor};

/// Every list of one generation's codes, packed.
#[derive(Debug)]
pub(super) struct PackedCodes {
    /// The [`CodeScan::generation`] of the codes copied.
    generation: u64,
    /// Their [`CodeScan::lineage`]: a later generation of it only appended rows.
    lineage: u64,
    /// Components per row (bytes per row of codes).
    dim: usize,
    /// List `l`'s codes, `packed::packed_len(rows[l], dim)` bytes (rows padded to whole
    /// blocks of 16, which for short lists adds up to 15 rows' bytes to the copy).
    lists: Vec<Vec<u8>>,
    /// Rows of each list copied.
    rows: Vec<usize>,
}

impl PackedCodes {
    /// Bytes of host memory held.
    pub(super) fn bytes(&self) -> usize {
        self.lists.iter().map(Vec::capacity).sum::<usize>()
            + self.lists.capacity() * std::mem::size_of::<Vec<u8>>()
    }

    /// Whether this copy holds `scan`'s codes: same generation, dimension and list shapes.
    fn holds(&self, scan: &CodeScan<'_>) -> bool {
        scan.generation != 0
            && self.generation == scan.generation
            && self.dim == scan.dim
            && self.lists.len() == scan.codes.len()
            && self.rows.iter().zip(scan.codes).all(|(&r, c)| r == c.len())
    }
}

/// The selection's bound: the code distances are what is ranked, not estimates of another
/// value, so the collectors keep exactly the rows at or below the k-th.
const EXACT: ErrorBound = ErrorBound { absolute: 0.0, relative: 0.0 };

impl CpuRows {
    /// The packed copy of `scan`'s codes where a scan of it is small enough to run on the
    /// caller's thread, with no parallel section: at most `Tuning::cpu_here_products` products
    /// (the rows the batch's queries probe, summed over the queries, times the dimension) and
    /// at most one query block, over codes already packed for their generation (as
    /// `CpuRows::scans_here` decides for IVF-Flat).
    pub(super) fn codes_here(&self, scan: &CodeScan<'_>) -> Option<Arc<PackedCodes>> {
        if self.here_products == 0
            || scan.dim == 0
            || scan.queries.len() / scan.dim > QUERY_BLOCK
            || super::spreads(scan.queries.len() / scan.dim)
        {
            return None;
        }
        let rows: usize = scan
            .probes
            .iter()
            .map(|&l| scan.codes.get(l as usize).map_or(0, |c| c.len()))
            .fold(0, usize::saturating_add);
        if rows.saturating_mul(scan.dim) > self.here_products {
            return None;
        }
        self.current_packed_codes(scan)
    }

    /// The packed copy of `scan`'s codes where one is already made for their generation, else
    /// `None` (nothing is made here).
    fn current_packed_codes(&self, scan: &CodeScan<'_>) -> Option<Arc<PackedCodes>> {
        let held = self.packed_codes.lock().unwrap_or_else(PoisonError::into_inner);
        held.as_ref().filter(|current| current.holds(scan)).map(Arc::clone)
    }

    /// The packed copy of `scan`'s codes, made first where needed (call it on the library's
    /// pool: the lists are packed in parallel); `None` where the scan reads the codes as they
    /// are: packing is off, the lists have no generation, or the host's memory budget refuses
    /// the copy.
    pub(super) fn packed_codes(&self, scan: &CodeScan<'_>) -> Option<Arc<PackedCodes>> {
        if !self.pack_lists || scan.generation == 0 {
            return None;
        }
        // The lock is never held across parallel work: a pool thread waiting in it could
        // otherwise pick up another search's scan that asks for the same lock.
        let old = {
            let mut held = self.packed_codes.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(current) = held.as_ref().filter(|current| current.holds(scan)) {
                return Some(Arc::clone(current));
            }
            // The old copy is let go before the new one is made: only scans still reading it
            // keep it alive meanwhile. (Two first scans of one generation may both pack; the
            // later copy replaces the earlier.)
            held.take()
        };
        let dim = scan.dim;
        let lists = scan.codes.len();
        // A copy of an earlier generation of the same lineage keeps its rows: since it was
        // made, rows were only appended to the lists, so each list's first rows are the same
        // rows with the same codes (the lineage's contract), and only the rest are packed. A
        // single add thus costs the new rows, not a repack of every list (as 128 MB of codes
        // of 1M x 128 would). Any other copy is dropped, and so is one another scan still reads.
        let (mut blocks, mut packed_rows) = old
            .filter(|o| {
                scan.lineage != 0
                    && o.lineage == scan.lineage
                    && o.dim == dim
                    && o.lists.len() == lists
                    && o.rows.iter().zip(scan.codes).all(|(&r, c)| r <= c.len())
            })
            .and_then(|o| Arc::try_unwrap(o).ok())
            .map_or_else(|| (vec![Vec::new(); lists], vec![0; lists]), |o| (o.lists, o.rows));
        let wanted: usize = scan
            .codes
            .iter()
            .zip(&blocks)
            .map(|(c, b)| packed::packed_len(c.len(), dim).saturating_sub(b.len()))
            .sum();
        // Claimed like an append's rows: a copy must not take the memory later adds were
        // promised. Refused, the scan reads the codes as they are (and asks again next time).
        crate::memory::claim(wanted as u64).ok()?;
        let packed_all =
            blocks.par_iter_mut().zip(packed_rows.par_iter_mut()).zip(scan.codes.par_iter()).all(
                |((blocks, rows), list)| {
                    let total = packed::packed_len(list.len(), dim);
                    // Reserved first, so that an allocation the budget did not foresee fails here
                    // (the copy is given up) instead of aborting the process.
                    if blocks.try_reserve_exact(total.saturating_sub(blocks.len())).is_err() {
                        return false;
                    }
                    packed::append(blocks, *rows, list.codes[*rows * dim..].chunks_exact(dim), dim);
                    *rows = list.len();
                    true
                },
            );
        if !packed_all {
            return None;
        }
        let fresh = Arc::new(PackedCodes {
            generation: scan.generation,
            lineage: scan.lineage,
            dim,
            lists: blocks,
            rows: packed_rows,
        });
        *self.packed_codes.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&fresh));
        Some(fresh)
    }

    /// [`RowStore::scan_codes`](crate::backend::RowStore::scan_codes) over `packed`, a copy of
    /// `scan`'s codes (see the module docs), whose shapes [`CodeScan::check`] accepted: on
    /// the library's pool, or with `here` on this thread, one list after another.
    pub(super) fn scan_packed_codes(
        &self,
        scan: &CodeScan<'_>,
        k: usize,
        packed: &PackedCodes,
        here: bool,
    ) -> Vec<Vec<Neighbor>> {
        let nq = scan.queries.len() / scan.dim;
        let askers = ListAskers::new(scan.probes, scan.nprobe, scan.slots.len());
        let order = askers.by_work(|l| scan.codes[l].len());
        let gates: Vec<SharedGate> = (0..nq).map(|_| SharedGate::new()).collect();
        let one = |&l: &usize| -> Vec<Collector> {
            SCRATCH.with(|scratch| {
                self.scan_code_list(
                    scan,
                    l,
                    &packed.lists[l],
                    askers.of(l),
                    k,
                    &gates,
                    &mut scratch.borrow_mut(),
                )
            })
        };
        let scanned: Vec<Vec<Collector>> =
            if here { order.iter().map(one).collect() } else { order.par_iter().map(one).collect() };
        let mut per_query: Vec<Vec<Collector>> = (0..nq).map(|_| Vec::new()).collect();
        for (&l, collectors) in order.iter().zip(scanned) {
            for (&q, collector) in askers.of(l).iter().zip(collectors) {
                per_query[q as usize].push(collector);
            }
        }
        let merge = |(collectors, gate): (Vec<Collector>, &SharedGate)| -> Vec<Neighbor> {
            let mut parts = collectors.into_iter();
            let Some(mut merged) = parts.next() else { return Vec::new() };
            merged.adopt_gate(gate.get());
            for part in parts {
                merged.merge(part);
            }
            let mut best = merged.into_entries();
            let by_distance = |a: &(f32, u32), b: &(f32, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
            if best.len() > k {
                best.select_nth_unstable_by(k - 1, by_distance);
                best.truncate(k);
            }
            best.sort_unstable_by(by_distance);
            best.into_iter()
                .map(|(d, slot)| Neighbor { slot: slot as usize, distance: f64::from(d) })
                .collect()
        };
        if here {
            per_query.into_iter().zip(&gates).map(merge).collect()
        } else {
            per_query.into_par_iter().zip(&gates).map(merge).collect()
        }
    }

    /// List `l`'s candidates for each query in `asking` (indices into the batch): the queries'
    /// terms readied once per group of [`QUERY_BLOCK`], then the list's packed codes streamed a
    /// tile at a time against the group, removed rows and rows the filter leaves out offered
    /// as `+inf` (never taken).
    #[allow(clippy::too_many_arguments)]
    fn scan_code_list(
        &self,
        scan: &CodeScan<'_>,
        l: usize,
        blocks: &[u8],
        asking: &[u32],
        k: usize,
        gates: &[SharedGate],
        scratch: &mut Scratch,
    ) -> Vec<Collector> {
        let dim = scan.dim;
        let mut collectors: Vec<Collector> = asking.iter().map(|_| Collector::new(k, EXACT)).collect();
        let (slots, norms) = (&scan.slots[l], &scan.codes[l].norms);
        let rows = slots.len();
        // Whole blocks per tile, so that every tile after the first starts on a block.
        const { assert!(ROW_TILE.is_multiple_of(packed::BLOCK)) };
        let tile = rows.min(ROW_TILE);
        let stride = tile.next_multiple_of(packed::BLOCK);
        let block = asking.len().min(QUERY_BLOCK);
        let Scratch { weights, starts, products, offset, ones } = scratch;
        products.resize(block * stride, 0.0);
        offset.resize(tile, 0.0);
        // Only ever 1.0: grown when a longer tile needs it, never refilled.
        if ones.len() < tile {
            ones.resize(tile, 1.0);
        }
        for (b, group) in asking.chunks(block).enumerate() {
            weights.resize(group.len() * dim, 0.0);
            starts.clear();
            for (&q, w) in group.iter().zip(weights.chunks_exact_mut(dim)) {
                starts.push(scan.terms(q as usize, l, w));
            }
            let collectors = &mut collectors[b * block..b * block + group.len()];
            for first in (0..rows).step_by(tile) {
                let count = tile.min(rows - first);
                let tile_slots = &slots[first..first + count];
                let mut live = false;
                if scan.removed.count() == 0 && scan.allowed.is_none() {
                    // Every row is read: the offsets in one pass, with no test per row (the
                    // tests were most of this function's own time for one query).
                    for (o, &norm) in offset[..count].iter_mut().zip(&norms[first..first + count]) {
                        *o = scan.extra(norm);
                    }
                    live = count > 0;
                } else {
                    for (j, &slot) in tile_slots.iter().enumerate() {
                        let s = slot as usize;
                        offset[j] =
                            if scan.removed.contains(s) || scan.allowed.is_some_and(|a| !a.contains(s)) {
                                f32::INFINITY
                            } else {
                                live = true;
                                scan.extra(norms[first + j])
                            };
                    }
                }
                if !live {
                    continue;
                }
                let codes = &blocks[first * dim..][..packed::packed_len(count, dim)];
                packed::code_products(self.simd, weights, starts, dim, codes, products, stride);
                for ((c, &q), p) in collectors.iter_mut().zip(group).zip(products.chunks(stride)) {
                    let gate = &gates[q as usize];
                    c.adopt_gate(gate.get());
                    filter::collect_at(
                        self.simd,
                        c,
                        &p[..count],
                        &ones[..count],
                        &offset[..count],
                        tile_slots,
                    );
                    gate.lower(c.gate());
                }
            }
        }
        collectors
    }
}

thread_local! {
    /// This thread's code-scan buffers (a query block's terms and one tile of products: a few
    /// hundred KiB at most), kept from call to call as the pool's threads keep theirs.
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// The buffers one thread's code scans reuse.
#[derive(Default)]
struct Scratch {
    /// The group's weights, one query after another.
    weights: Vec<f32>,
    /// The group's offsets (where each query's sums start).
    starts: Vec<f32>,
    /// One tile's sums for the group, a query's at a stride of whole blocks.
    products: Vec<f32>,
    /// Each row's own term, `+inf` for a row not to be returned.
    offset: Vec<f32>,
    /// The collectors' scale: 1 for every row.
    ones: Vec<f32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::simd::{SimdLevel, test_value};
    use crate::backend::{ListCodes, ListProbes, RowStore, codes};
    use crate::slots::SlotSet;
    use crate::types::{GpuDistanceMetric, StoragePrecision};

    /// The code distance of `codes`' documentation in f64.
    fn reference(scan: &CodeScan<'_>, q: usize, l: usize, row: usize) -> f64 {
        let dim = scan.dim;
        let query = &scan.queries[q * dim..(q + 1) * dim];
        let codes = &scan.codes[l].codes[row * dim..(row + 1) * dim];
        let decoded = (0..dim).map(|d| {
            f64::from(scan.centroids[l * dim + d])
                + f64::from(scan.base[d])
                + f64::from(scan.step[d]) * f64::from(codes[d])
        });
        match scan.metric {
            GpuDistanceMetric::Euclidean => {
                decoded.zip(query).map(|(x, &v)| (f64::from(v) - x).powi(2)).sum()
            }
            _ => -decoded.zip(query).map(|(x, &v)| f64::from(v) * x).sum::<f64>(),
        }
    }

    /// Asserts that `got` is each query's k best live rows of its lists by the reference
    /// distance: as many as there are (up to k), each within a small tolerance of its own
    /// reference distance and of the k-th, ascending.
    fn assert_best(scan: &CodeScan<'_>, k: usize, got: &[Vec<Neighbor>], what: &str) {
        let nq = scan.queries.len() / scan.dim;
        assert_eq!(got.len(), nq, "{what}");
        for (q, got) in got.iter().enumerate() {
            let mut want: Vec<(usize, f64)> = Vec::new();
            for &l in &scan.probes[q * scan.nprobe..(q + 1) * scan.nprobe] {
                for (row, &slot) in scan.slots[l as usize].iter().enumerate() {
                    let s = slot as usize;
                    if !scan.removed.contains(s) && scan.allowed.is_none_or(|a| a.contains(s)) {
                        want.push((s, reference(scan, q, l as usize, row)));
                    }
                }
            }
            want.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            want.truncate(k);
            assert_eq!(got.len(), want.len(), "{what}: query {q}");
            let scale = want.iter().map(|w| w.1.abs()).fold(1.0, f64::max);
            let tolerance = 1e-5 * scale;
            let kth = want.last().map_or(f64::INFINITY, |w| w.1);
            for n in got {
                let own = want.iter().find(|w| w.0 == n.slot).map(|w| w.1);
                let own = own.unwrap_or_else(|| {
                    // Not among the reference's k: it must tie with the k-th within the tolerance.
                    let l = scan.probes[q * scan.nprobe..(q + 1) * scan.nprobe]
                        .iter()
                        .find(|&&l| scan.slots[l as usize].contains(&(n.slot as u32)))
                        .expect("a slot of the query's lists");
                    let row =
                        scan.slots[*l as usize].iter().position(|&s| s as usize == n.slot).expect("row");
                    reference(scan, q, *l as usize, row)
                });
                assert!(
                    own <= kth + tolerance,
                    "{what}: query {q}: slot {} ({own}) past the k-th {kth}",
                    n.slot
                );
                assert!((n.distance - own).abs() <= tolerance, "{what}: query {q}: {} vs {own}", n.distance);
            }
            assert!(got.windows(2).all(|p| p[0].distance <= p[1].distance), "{what}: query {q} out of order");
            let mut slots: Vec<usize> = got.iter().map(|n| n.slot).collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), got.len(), "{what}: query {q} repeats a slot");
        }
    }

    #[test]
    fn the_packed_code_scan_here_and_on_the_pool_ranks_as_the_reference_across_tiles_groups_and_generations()
    {
        // Lists empty, shorter than a block, of whole blocks, and longer than a tile of 512
        // (three tiles, the last partial); 200 queries (two query groups of 192 for the long
        // list); removed rows, a filter, a list whose rows are all removed; every metric with a
        // code distance; k of 1, a few and past the rows probed. On this thread (small scans),
        // on the pool, and on the host scan every other backend falls back to, each against
        // the f64 reference. Then a new generation with other codes of the same shapes must
        // be packed afresh, not served from the old copy.
        let dim = 19;
        let mut seed = 17u64;
        let mut value = move || test_value(&mut seed);
        let sizes = [0usize, 7, 32, 1100, 45, 16];
        let mut slots: Vec<Vec<u32>> = Vec::new();
        let mut next = 0u32;
        for &n in &sizes {
            // Slots out of order within each list.
            let mut list: Vec<u32> = (next..next + n as u32).collect();
            list.reverse();
            next += n as u32;
            slots.push(list);
        }
        let total = next as usize;
        let base: Vec<f32> = (0..dim).map(|_| value() - 1.0).collect();
        let step: Vec<f32> =
            (0..dim).map(|d| if d == 3 { 0.0 } else { 0.01 + 0.02 * value().abs() }).collect();
        let centroids: Vec<f32> = (0..sizes.len() * dim).map(|_| value() * 4.0).collect();
        let mut make_codes = |salt: u8| -> Vec<ListCodes> {
            sizes
                .iter()
                .map(|&n| {
                    let mut list = ListCodes::default();
                    for _ in 0..n {
                        let row: Vec<u8> = (0..dim).map(|_| ((value() + 0.5) * 255.0) as u8 ^ salt).collect();
                        let norm: f64 = (0..dim)
                            .map(|d| (f64::from(base[d]) + f64::from(step[d]) * f64::from(row[d])).powi(2))
                            .sum();
                        list.codes.extend_from_slice(&row);
                        list.norms.push(norm as f32);
                    }
                    list
                })
                .collect()
        };
        let first_codes = make_codes(0);
        let second_codes = make_codes(0x5a);
        let nq = 200;
        let queries: Vec<f32> = (0..nq * dim).map(|_| value() * 4.0).collect();
        let unit: Vec<f32> = queries
            .chunks_exact(dim)
            .flat_map(|q| {
                let n = q.iter().map(|x| x * x).sum::<f32>().sqrt();
                q.iter().map(move |x| x / n).collect::<Vec<f32>>()
            })
            .collect();
        // Every query probes the long list and two others.
        let probes: Vec<u32> = (0..nq as u32).flat_map(|q| [3, q % 3, 4 + q % 2]).collect();
        // List 1 (slots 0-6) wholly removed.
        let removed = SlotSet::from_slots(total, (0..total).filter(|s| s % 11 == 0 || *s < 7));
        let allowed = SlotSet::from_slots(total, (0..total).filter(|s| s % 5 != 2));
        // Two trainings of one index: same slots, other codes, each its own lineage.
        let generations = [
            (&first_codes, ListProbes::next_generation(), ListProbes::next_generation()),
            (&second_codes, ListProbes::next_generation(), ListProbes::next_generation()),
        ];
        for here in [usize::MAX, 0] {
            // One store for both generations: the second's codes, of the same shapes as the
            // first's, must be packed afresh, not served from the first's copy.
            let rows = CpuRows::new(dim, StoragePrecision::F32, SimdLevel::detect())
                .with_packed_lists(true)
                .with_here_products(here);
            for (codes, generation, lineage) in generations {
                for metric in
                    [GpuDistanceMetric::Euclidean, GpuDistanceMetric::DotProduct, GpuDistanceMetric::Cosine]
                {
                    for filter in [None, Some(&allowed)] {
                        for (batch, k) in
                            [(1usize, 1usize), (1, 10), (nq, 1), (nq, 10), (nq, 2000), (5, 2000)]
                        {
                            let q = if metric == GpuDistanceMetric::Cosine { &unit } else { &queries };
                            let scan = CodeScan {
                                dim,
                                metric,
                                queries: &q[..batch * dim],
                                centroids: &centroids,
                                base: &base,
                                step: &step,
                                slots: &slots,
                                codes,
                                probes: &probes[..batch * 3],
                                nprobe: 3,
                                removed: &removed,
                                allowed: filter,
                                generation,
                                lineage,
                            };
                            let what = format!(
                                "generation {generation}, here {here}, {metric:?}, filtered {}, {batch} queries, k {k}",
                                filter.is_some()
                            );
                            let got = rows.scan_codes(&scan, k).expect("a packed scan");
                            assert_best(&scan, k, &got, &what);
                            let host = codes::scan_on_host(&scan, k).expect("the host scan");
                            assert_best(&scan, k, &host, &format!("{what}, host"));
                            // Where it ran: a scan of one query block here once the copy is made.
                            let small = batch <= QUERY_BLOCK;
                            assert_eq!(
                                rows.codes_here(&scan).is_some(),
                                here == usize::MAX && small,
                                "{what}"
                            );
                        }
                    }
                }
            }
            let copy = sizes.iter().map(|&n| packed::packed_len(n, dim)).sum::<usize>();
            let before = rows.memory_bytes();
            assert!(before >= copy, "{before} bytes counted, the copy holds {copy}");
            rows.release_scratch();
            assert!(rows.memory_bytes() + copy <= before, "the copy is freed");
        }
    }

    #[test]
    fn without_a_generation_or_with_packing_off_the_codes_are_scanned_as_they_are() {
        let dim = 4;
        let slots = vec![(0..40u32).collect::<Vec<u32>>()];
        let mut codes = ListCodes::default();
        for r in 0..40u8 {
            let row = [r, r.wrapping_mul(3), 7, 255 - r];
            codes.codes.extend_from_slice(&row);
            // Base 0 and step 1: the decoded row is the codes themselves.
            codes.norms.push(row.iter().map(|&c| f32::from(c) * f32::from(c)).sum());
        }
        let codes = vec![codes];
        let removed = SlotSet::default();
        let queries = [0.5f32, -1.0, 2.0, 0.25];
        let scan = |generation| CodeScan {
            dim,
            metric: GpuDistanceMetric::Euclidean,
            queries: &queries,
            centroids: &[0.0; 4],
            base: &[0.0; 4],
            step: &[1.0; 4],
            slots: &slots,
            codes: &codes,
            probes: &[0],
            nprobe: 1,
            removed: &removed,
            allowed: None,
            generation,
            lineage: 0,
        };
        for (pack, generation) in [(true, 0), (false, ListProbes::next_generation())] {
            let rows = CpuRows::new(dim, StoragePrecision::F32, SimdLevel::detect()).with_packed_lists(pack);
            let got = rows.scan_codes(&scan(generation), 5).expect("scan");
            assert_best(&scan(generation), 5, &got, &format!("pack {pack}, generation {generation}"));
            assert!(rows.packed_codes.lock().expect("lock").is_none(), "no copy made");
        }
    }

    #[test]
    fn rows_appended_within_a_lineage_are_packed_after_the_rows_kept_and_rank_as_the_reference() {
        // Adds after a first scan: a list that was empty, one whose last block was partial
        // and fills past it, one untouched, one growing by a row; then more adds. Each state
        // is a new generation of one lineage, so the copy keeps what it holds (the untouched
        // list's blocks stay where they were) and packs only the new rows; every scan, here and
        // on the pool, must rank as the f64 reference.
        let dim = 9;
        let mut seed = 29u64;
        let mut value = move || test_value(&mut seed);
        let base: Vec<f32> = (0..dim).map(|_| value() - 0.5).collect();
        let step: Vec<f32> = (0..dim).map(|_| 0.02 + 0.01 * value().abs()).collect();
        let centroids: Vec<f32> = (0..4 * dim).map(|_| value() * 3.0).collect();
        let queries: Vec<f32> = (0..3 * dim).map(|_| value() * 3.0).collect();
        let mut slots: Vec<Vec<u32>> = vec![Vec::new(); 4];
        let mut codes: Vec<ListCodes> = vec![ListCodes::default(); 4];
        let mut next_slot = 0u32;
        let mut add = |slots: &mut Vec<Vec<u32>>, codes: &mut Vec<ListCodes>, list: usize, n: usize| {
            for _ in 0..n {
                let row: Vec<u8> = (0..dim).map(|_| ((value() + 0.5) * 255.0) as u8).collect();
                let norm: f64 = (0..dim)
                    .map(|d| (f64::from(base[d]) + f64::from(step[d]) * f64::from(row[d])).powi(2))
                    .sum();
                codes[list].codes.extend_from_slice(&row);
                codes[list].norms.push(norm as f32);
                slots[list].push(next_slot);
                next_slot += 1;
            }
        };
        add(&mut slots, &mut codes, 1, 5);
        add(&mut slots, &mut codes, 2, 16);
        add(&mut slots, &mut codes, 3, 40);
        let probes: Vec<u32> = vec![0, 1, 2, 1, 2, 3, 3, 0, 2];
        let removed = SlotSet::default();
        let lineage = ListProbes::next_generation();
        for here in [usize::MAX, 0] {
            let rows = CpuRows::new(dim, StoragePrecision::F32, SimdLevel::detect())
                .with_packed_lists(true)
                .with_here_products(here);
            let (mut slots, mut codes) = (slots.clone(), codes.clone());
            let mut untouched_at = None;
            for (round, growth) in [[0usize, 0, 0, 0], [3, 20, 0, 1], [1, 0, 0, 17]].into_iter().enumerate() {
                for (list, &n) in growth.iter().enumerate() {
                    add(&mut slots, &mut codes, list, n);
                }
                let scan = CodeScan {
                    dim,
                    metric: GpuDistanceMetric::Euclidean,
                    queries: &queries,
                    centroids: &centroids,
                    base: &base,
                    step: &step,
                    slots: &slots,
                    codes: &codes,
                    probes: &probes,
                    nprobe: 3,
                    removed: &removed,
                    allowed: None,
                    generation: ListProbes::next_generation(),
                    lineage,
                };
                for k in [1, 7, 100] {
                    let got = rows.scan_codes(&scan, k).expect("a packed scan");
                    assert_best(&scan, k, &got, &format!("here {here}, round {round}, k {k}"));
                }
                let held = rows.packed_codes.lock().expect("lock").clone().expect("a copy");
                assert_eq!(held.rows, codes.iter().map(ListCodes::len).collect::<Vec<_>>(), "round {round}");
                // List 2 never grows: its blocks are the ones first packed.
                let at = held.lists[2].as_ptr();
                assert_eq!(
                    *untouched_at.get_or_insert(at),
                    at,
                    "here {here}, round {round}: list 2 repacked"
                );
            }
        }
    }
}
