//! A copy of an IVF index's inverted lists in the packed layout ([`packed`]): each list's f32
//! rows one after another in blocks, so a list scan streams them and needs no horizontal sums.
//! What FAISS's IVF-Flat stores as its lists; the collection keeps its own rows besides (exact
//! re-rank, reads by id, saving), so the copy doubles the memory of an f32 collection's rows
//! (those of lists long enough to pack, [`MIN_ROWS`]) and is reported in
//! [`RowStore::memory_bytes`](crate::backend::RowStore::memory_bytes).
//! [`crate::Tuning::cpu_packed_lists`] turns it off. Rows mapped from a file are not copied
//! (they are searched where they lie so as not to hold them in memory), nor made where the
//! host's memory budget refuses the copy: those scans read the rows in place.
//!
//! The copy belongs to one state of the lists, named by [`ListProbes::generation`], and to the
//! rows as they stand: slots are written once, so only a truncate, compaction, clear or adoption
//! of the rows drops it (`CpuRows::forget_packed_lists`), and so does a change of the
//! collection's index ([`RowStore::release_scratch`](crate::backend::RowStore::release_scratch)).
//! When the generation moves on (vectors added after training), a list whose slots still start
//! with the ones packed keeps them and packs only its new slots; any other list is packed again.
//!
//! Removed rows stay in the copy until a compaction renumbers the lists; the scan skips them as
//! it skips rows a filter leaves out.

use std::sync::{Arc, PoisonError};

use rayon::prelude::*;

use super::{CpuRows, Elements};
use crate::backend::candidates::ListProbes;
use crate::backend::cpu::{int8, packed};
use crate::error::{HiveGpuError, Result};

/// Lists of fewer rows than this are not packed: their scans read the rows in place. A list
/// of one or two blocks wastes up to half of each block's lanes on padding, and the queries'
/// components, laid side by side once per list and group of queries, cost as much as the
/// multiply-adds of a block: on fmnistsmall (lists of about 10 rows) the packed scan ran at
/// 0.8x of the in-place one (docs/PERFORMANCE.md, "Packed lists"). From two blocks the packed
/// scan is ahead: SIFT10K's IVF-Flat ran 5-10% faster with lists of 32-63 rows packed than
/// with them in place (docs/PERFORMANCE.md, "Small searches without serial chains"); one block
/// gained less.
pub(super) const MIN_ROWS: usize = 2 * packed::BLOCK;

/// One inverted list, packed (left empty where the list has fewer than [`MIN_ROWS`] rows).
#[derive(Debug, Default)]
pub(super) struct PackedList {
    /// The list's slots in its order: row `i` of the blocks is slot `slots[i]`.
    pub(super) slots: Vec<u32>,
    /// `packed::packed_len(slots.len(), dim)` values.
    pub(super) blocks: Vec<f32>,
    /// Each row's squared norm, in the order of `slots`.
    pub(super) norms: Vec<f32>,
    /// Where the copy is of byte-valued rows ([`PackedLists::bytes`]): the same rows as
    /// [`int8`] packs them (unsigned quads, groups of [`int8::ROW_GROUP`]), else empty.
    pub(super) bytes: Vec<u32>,
    /// Each byte row's component sum ([`int8::pack_rows`]), padded as `bytes`.
    pub(super) sums: Vec<i32>,
}

impl PackedList {
    /// Bytes of host memory held.
    fn bytes_held(&self) -> usize {
        (self.slots.capacity()
            + self.blocks.capacity()
            + self.norms.capacity()
            + self.bytes.capacity()
            + self.sums.capacity())
            * 4
    }
}

/// Every list of one generation, packed.
#[derive(Debug)]
pub(super) struct PackedLists {
    /// The [`ListProbes::generation`] of the lists copied.
    generation: u64,
    /// List `l` of those lists, packed.
    pub(super) lists: Vec<PackedList>,
    /// Whether every packed list also holds its rows as bytes ([`PackedList::bytes`]): every
    /// stored value was an integer in 0..=255 when the copy was made (SIFT, BIGANN, image
    /// pixels) and the CPU has AVX512-VNNI. A batch of byte-valued queries then multiplies
    /// them exactly in integers at four times the rate of f32 multiply-adds, a quarter of
    /// the bytes read (docs/PERFORMANCE.md, "Byte-valued lists").
    pub(super) bytes: bool,
}

impl PackedLists {
    /// Bytes of host memory held.
    pub(super) fn bytes(&self) -> usize {
        self.lists.iter().map(PackedList::bytes_held).sum::<usize>()
            + self.lists.capacity() * std::mem::size_of::<PackedList>()
    }
}

impl CpuRows {
    /// The packed copy of `probes.lists` where one is already made for their generation, else
    /// `None` (nothing is made here).
    pub(super) fn current_packed_lists(&self, probes: &ListProbes<'_>) -> Option<Arc<PackedLists>> {
        let held = self.packed.lock().unwrap_or_else(PoisonError::into_inner);
        held.as_ref()
            .filter(|current| {
                probes.generation != 0
                    && current.generation == probes.generation
                    && current.lists.len() == probes.lists.len()
            })
            .map(Arc::clone)
    }

    /// The packed copy of `probes.lists`, made or brought up to date first; `None` where the
    /// scan reads the rows in place: packing is off, the lists have no generation, or the rows
    /// are not f32 or are mapped. Where the host lacks the memory for the copy, a copy whose
    /// lists are all empty (each scanned in place). A list slot past the stored
    /// rows is an error naming it, as on the in-place path.
    pub(super) fn packed_lists(&self, probes: &ListProbes<'_>) -> Result<Option<Arc<PackedLists>>> {
        let Elements::F32(values) = &self.elements else { return Ok(None) };
        if !self.pack_lists || probes.generation == 0 || values.is_mapped() {
            return Ok(None);
        }
        // The lock is never held across parallel work: a pool thread waiting in it could
        // otherwise pick up another search's scan that asks for the same lock.
        let old = {
            let mut held = self.packed.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(current) = held.as_ref()
                && current.generation == probes.generation
                && current.lists.len() == probes.lists.len()
            {
                return Ok(Some(Arc::clone(current)));
            }
            held.take()
        };
        let n = self.len_slots();
        for list in probes.lists {
            if let Some(&slot) = list.iter().find(|&&s| s as usize >= n) {
                return Err(HiveGpuError::InvalidArgument(format!(
                    "scan_lists: list slot {slot} is past the {n} stored rows"
                )));
            }
        }
        let dim = self.dim;
        let as_bytes = self.all_bytes && dim <= int8::MAX_DIM && int8::available();
        // A byte row: its quads and its sum.
        let byte_row = if as_bytes { (int8::quads(dim) + 1) * 4 } else { 0 };
        let wanted: usize = probes
            .lists
            .iter()
            .filter(|l| l.len() >= MIN_ROWS)
            .map(|l| {
                packed::packed_len(l.len(), dim) * 4
                    + l.len() * 8
                    + l.len().next_multiple_of(int8::ROW_GROUP) * byte_row
            })
            .sum();
        // The old copy's lists are reused where no other scan still reads them; their byte
        // rows only where the old copy had them too.
        let (mut old, old_bytes): (Vec<PackedList>, bool) =
            old.and_then(|o| Arc::try_unwrap(o).ok()).map(|o| (o.lists, o.bytes)).unwrap_or_default();
        let reusable: usize = old.iter().map(PackedList::bytes_held).sum();
        // Claimed like an append's rows (with its headroom): a copy as large as the rows must
        // not take the memory later adds were promised. Refused, the scan reads in place.
        if crate::memory::claim(wanted.saturating_sub(reusable) as u64).is_err() {
            return Ok(Some(self.keep_unpacked(probes)));
        }
        old.resize_with(probes.lists.len(), PackedList::default);
        let lists: Option<Vec<PackedList>> = old
            .into_par_iter()
            .zip(probes.lists.par_iter())
            .map(|(mut packed, list)| {
                // Vectors added after training only append to their lists: what was packed
                // stays, and only the new slots are packed.
                let keeps =
                    packed.slots.len() <= list.len() && list[..packed.slots.len()] == packed.slots[..];
                if !keeps || list.len() < MIN_ROWS {
                    packed.slots = Vec::new();
                    packed.blocks = Vec::new();
                    packed.norms = Vec::new();
                }
                if !keeps || list.len() < MIN_ROWS || !as_bytes || !old_bytes {
                    packed.bytes = Vec::new();
                    packed.sums = Vec::new();
                }
                if list.len() < MIN_ROWS {
                    return Some(packed);
                }
                let from = packed.slots.len();
                // Byte rows kept, or none (packed again from the list's first row).
                let bytes_from = if packed.bytes.is_empty() { 0 } else { from };
                // Reserved first, so that an allocation the budget did not foresee fails here
                // (the copy is given up) instead of aborting the process.
                let more = packed::packed_len(list.len(), dim).saturating_sub(packed.blocks.len());
                packed.blocks.try_reserve_exact(more).ok()?;
                packed.slots.try_reserve_exact(list.len() - from).ok()?;
                packed.norms.try_reserve_exact(list.len() - from).ok()?;
                let row = |&s: &u32| &values[s as usize * dim..(s as usize + 1) * dim];
                if as_bytes {
                    let rows = list.len().next_multiple_of(int8::ROW_GROUP);
                    packed
                        .bytes
                        .try_reserve_exact((rows * int8::quads(dim)).saturating_sub(packed.bytes.len()))
                        .ok()?;
                    packed.sums.try_reserve_exact(rows.saturating_sub(packed.sums.len())).ok()?;
                    int8::append_rows(
                        &mut packed.bytes,
                        &mut packed.sums,
                        bytes_from,
                        list[bytes_from..].iter().map(row),
                        dim,
                    );
                }
                packed::append(&mut packed.blocks, from, list[from..].iter().map(row), dim);
                packed.slots.extend_from_slice(&list[from..]);
                packed.norms.extend(list[from..].iter().map(|&s| self.sq_norms[s as usize]));
                Some(packed)
            })
            .collect();
        let Some(lists) = lists else { return Ok(Some(self.keep_unpacked(probes))) };
        let fresh = Arc::new(PackedLists { generation: probes.generation, lists, bytes: as_bytes });
        *self.packed.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&fresh));
        Ok(Some(fresh))
    }

    /// Records that this generation's lists stay unpacked (the memory for the copy was
    /// refused): every list empty, so each scan reads its rows in place, and the next scan of
    /// the same lists neither asks the budget again nor checks their slots again.
    fn keep_unpacked(&self, probes: &ListProbes<'_>) -> Arc<PackedLists> {
        let lists = probes.lists.iter().map(|_| PackedList::default()).collect();
        let unpacked = Arc::new(PackedLists { generation: probes.generation, lists, bytes: false });
        *self.packed.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&unpacked));
        unpacked
    }

    /// Drops the packed lists: the rows they copy changed (or, through
    /// [`RowStore::release_scratch`](crate::backend::RowStore::release_scratch), the index whose
    /// lists they are).
    pub(super) fn forget_packed_lists(&mut self) {
        *self.packed.get_mut().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Bytes the packed lists hold.
    pub(super) fn packed_lists_bytes(&self) -> usize {
        self.packed.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map_or(0, |p| p.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RowStore;
    use crate::backend::cpu::simd::{SimdLevel, test_value};
    use crate::slots::SlotSet;
    use crate::types::{GpuDistanceMetric, StoragePrecision};

    /// Every query's exact k nearest among the live (and allowed) rows of its lists, by the
    /// store's own exact distances: what any scan must return.
    fn scanned_by_refine(
        rows: &CpuRows,
        queries: &[f32],
        probes: &ListProbes<'_>,
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Vec<Vec<crate::backend::Neighbor>> {
        crate::backend::candidates::scan_by_refine(rows, queries, probes, k, metric, allowed).expect("refine")
    }

    #[test]
    fn the_packed_copy_follows_added_removed_filtered_compacted_and_truncated_rows() {
        // Lists that grow after packing (only their new slots are packed), a list renumbered
        // (packed again), removed rows and a filter (skipped, though still in the copy), then
        // a compaction and a truncate (the copy dropped): each scan must equal the in-place
        // answer through `refine`, on every metric with products, at one query and a batch.
        let dim = 21;
        let mut seed = 3u64;
        let mut values =
            |n: usize| -> Vec<f32> { (0..n * dim).map(|_| test_value(&mut seed) * 4.0).collect() };
        let mut rows = CpuRows::new(dim, StoragePrecision::F32, SimdLevel::detect()).with_packed_lists(true);
        rows.append(&values(600)).expect("append");
        let queries = values(9);
        let deal = |n: usize, lists: usize| -> Vec<Vec<u32>> {
            let mut out = vec![Vec::new(); lists];
            for s in 0..n as u32 {
                out[(s as usize * 7 + s as usize / 5) % lists].push(s);
            }
            out
        };
        let check =
            |rows: &CpuRows, lists: &[Vec<u32>], generation: u64, allowed: Option<&SlotSet>, what: &str| {
                for nq in [1usize, 9] {
                    let probes: Vec<u32> =
                        (0..nq).flat_map(|q| [q % 6, (q + 1) % 6, (q + 2) % 6].map(|l| l as u32)).collect();
                    let probes = ListProbes { lists, probes: &probes, nprobe: 3, generation };
                    for metric in [
                        GpuDistanceMetric::Euclidean,
                        GpuDistanceMetric::DotProduct,
                        GpuDistanceMetric::Cosine,
                    ] {
                        for k in [1, 10, 200] {
                            let q = &queries[..nq * dim];
                            let got = rows.scan_lists(q, &probes, k, metric, allowed).expect("scan");
                            let want = scanned_by_refine(rows, q, &probes, k, metric, allowed);
                            assert_eq!(got, want, "{what}: {nq} queries, {metric:?}, k = {k}");
                        }
                    }
                }
            };
        // Five lists of about 120 rows, packed, and one of 20, read in place.
        let mut lists = deal(600, 5);
        let cut = lists[0].len() - 20;
        let short = lists[0].split_off(cut);
        lists.push(short);
        check(&rows, &lists, 1, None, "first packing");
        // The five long lists' blocks, slots and norms (the list of lists adds a few hundred
        // bytes; where the rows are byte-valued, their byte copy adds more: not these rows).
        let copied: usize =
            lists[..5].iter().map(|l| packed::packed_len(l.len(), dim) * 4 + l.len() * 8).sum();
        let bytes = rows.packed_lists_bytes();
        assert!(bytes >= copied, "the copy is counted: {bytes} of {copied}");
        assert!(bytes < copied + 20 * dim * 4, "the short list is not copied: {bytes} of {copied}");
        // Added rows appended to their lists; list 4 renumbered instead.
        rows.append(&values(50)).expect("append");
        for s in 600..650u32 {
            lists[(s % 4) as usize].push(s);
        }
        lists[4].reverse();
        check(&rows, &lists, 2, None, "after adds");
        rows.tombstone(&[0, 7, 601, 649]);
        let mut allowed = SlotSet::default();
        allowed.cover(650);
        for s in (0..650).step_by(3) {
            allowed.set(s, true);
        }
        check(&rows, &lists, 2, None, "removed rows");
        check(&rows, &lists, 2, Some(&allowed), "a filter");
        let keep: Vec<usize> = (0..650).filter(|s| s % 4 != 1).collect();
        rows.compact(&keep).expect("compact");
        assert_eq!(rows.packed_lists_bytes(), 0, "a compaction drops the copy");
        let lists = deal(keep.len(), 6);
        check(&rows, &lists, 3, None, "after a compaction");
        rows.truncate(400);
        assert_eq!(rows.packed_lists_bytes(), 0, "a truncate drops the copy");
        let lists = deal(400, 6);
        check(&rows, &lists, 4, None, "after a truncate");
        // A list slot past the rows is an error naming it, packed or not.
        let bad = vec![(0..70u32).chain([400]).collect::<Vec<u32>>(), vec![70]];
        let probes = ListProbes { lists: &bad, probes: &[0, 1], nprobe: 2, generation: 5 };
        let err =
            rows.scan_lists(&queries[..dim], &probes, 1, GpuDistanceMetric::Euclidean, None).unwrap_err();
        assert!(err.to_string().contains("list slot 400"), "{err}");
    }

    #[test]
    fn byte_valued_lists_multiply_in_integers_through_tiles_adds_filters_and_a_value_with_a_fraction() {
        // Byte-valued rows (every value an integer in 0..=255, as SIFT's) get a byte copy
        // beside the f32 blocks, and byte-valued batches multiply it exactly in integers: a
        // list of three tiles (1,100 rows, the last tile partial), lists asked by 1 to 40
        // queries (every register block: 8, 4, 2, 1), a dimension that is not a multiple of
        // 4, removed rows and a filter, rows added within the lineage (the byte rows kept and
        // the new ones packed after them), a batch with one value with a fraction (the f32
        // blocks), then a stored row with a fraction (no byte copy any more). Every scan must
        // equal the exact answer through `refine`. (Under cosine the kernels take unit queries,
        // which are not byte-valued: those batches check the f32 blocks beside the bytes.)
        let dim = 19;
        let mut seed = 5u64;
        let mut bytes = |n: usize| -> Vec<f32> {
            (0..n * dim).map(|_| (test_value(&mut seed) * 1e4).abs().floor() % 256.0).collect()
        };
        let mut rows = CpuRows::new(dim, StoragePrecision::F32, SimdLevel::detect()).with_packed_lists(true);
        rows.append(&bytes(1400)).expect("append");
        let mut lists: Vec<Vec<u32>> =
            vec![(0..1100).collect(), (1100..1170).collect(), (1170..1400).rev().collect()];
        let queries = bytes(40);
        let byte_copy = |rows: &CpuRows| {
            let held = rows.packed.lock().unwrap_or_else(PoisonError::into_inner);
            // Every list's byte rows and sums cover its slots, padded to whole groups.
            held.as_ref().is_some_and(|p| {
                p.bytes
                    && p.lists.iter().all(|l| {
                        let rows = l.slots.len().next_multiple_of(int8::ROW_GROUP);
                        l.bytes.len() == rows * int8::quads(dim) && l.sums.len() == rows
                    })
            })
        };
        let check = |rows: &CpuRows,
                     lists: &[Vec<u32>],
                     generation: u64,
                     queries: &[f32],
                     allowed: Option<&SlotSet>,
                     what: &str| {
            for nq in [1usize, 3, 7, 40] {
                // Query q probes lists q % 3 and (q + 1) % 3: each list is asked by about
                // two thirds of the batch.
                let probes: Vec<u32> = (0..nq as u32).flat_map(|q| [q % 3, (q + 1) % 3]).collect();
                let probes = ListProbes { lists, probes: &probes, nprobe: 2, generation };
                for metric in
                    [GpuDistanceMetric::Euclidean, GpuDistanceMetric::DotProduct, GpuDistanceMetric::Cosine]
                {
                    for k in [1, 10, 150] {
                        let q = &queries[..nq * dim];
                        let got = rows.scan_lists(q, &probes, k, metric, allowed).expect("scan");
                        let want = scanned_by_refine(rows, q, &probes, k, metric, allowed);
                        assert_eq!(got, want, "{what}: {nq} queries, {metric:?}, k = {k}");
                    }
                }
            }
        };
        check(&rows, &lists, 1, &queries, None, "byte rows");
        assert_eq!(byte_copy(&rows), int8::available(), "a byte copy where the CPU has VNNI");
        rows.tombstone(&[0, 513, 1100, 1399]);
        let allowed = SlotSet::from_slots(1400, (0..1400).filter(|s| s % 5 != 2));
        check(&rows, &lists, 1, &queries, Some(&allowed), "removed rows and a filter");
        // Rows added within the lineage: appended to every list.
        rows.append(&bytes(90)).expect("append");
        for s in 1400..1490u32 {
            lists[(s % 3) as usize].push(s);
        }
        check(&rows, &lists, 2, &queries, None, "after adds");
        assert_eq!(byte_copy(&rows), int8::available(), "the byte copy follows the adds");
        let mut fraction = queries.clone();
        fraction[3 * dim + 5] += 0.5;
        check(&rows, &lists, 2, &fraction, None, "a query with a fraction");
        // A stored value with a fraction: the next copy has no byte rows.
        let mut odd = bytes(1);
        odd[4] = 7.25;
        rows.append(&odd).expect("append");
        lists[1].push(1490);
        check(&rows, &lists, 3, &queries, None, "a stored value with a fraction");
        assert!(!byte_copy(&rows), "no byte copy once a stored value has a fraction");
    }

    #[test]
    fn lists_longer_than_a_tile_and_batches_wider_than_a_query_block_scan_exactly() {
        // A list of 1,100 rows (three tiles of 512, the last one partial and not a whole
        // block) asked by 200 queries (two query blocks of 192): every tile and block start of
        // the packed scan. The results must equal the in-place answer through `refine`; then
        // a change of index (`release_scratch`) frees the copy.
        let dim = 17;
        let mut seed = 9u64;
        let mut values =
            |n: usize| -> Vec<f32> { (0..n * dim).map(|_| test_value(&mut seed) * 4.0).collect() };
        let mut rows = CpuRows::new(dim, StoragePrecision::F32, SimdLevel::detect()).with_packed_lists(true);
        rows.append(&values(1300)).expect("append");
        let lists: Vec<Vec<u32>> = vec![(0..1100).collect(), (1100..1300).collect()];
        let queries = values(200);
        let probes: Vec<u32> = (0..200u32).flat_map(|q| if q % 3 == 0 { [1, 0] } else { [0, 1] }).collect();
        let probes = ListProbes { lists: &lists, probes: &probes, nprobe: 2, generation: 7 };
        for k in [1, 10, 37] {
            let metric = GpuDistanceMetric::Euclidean;
            let got = rows.scan_lists(&queries, &probes, k, metric, None).expect("scan");
            assert!(rows.packed_lists_bytes() > 0, "the packed copy was made");
            assert_eq!(got, scanned_by_refine(&rows, &queries, &probes, k, metric, None), "k = {k}");
        }
        rows.release_scratch();
        assert_eq!(rows.packed_lists_bytes(), 0, "a change of index frees the copy");
    }

    #[test]
    fn a_small_list_scan_on_the_callers_thread_returns_what_the_pool_returns() {
        // Once the lists are packed, a scan of few probed rows runs on this thread (no parallel
        // section) and a larger one on the pool; before they are packed, or with the knob at 0,
        // every scan goes to the pool. Lists short enough to stay in place, removed rows, a
        // filter, every metric with products and k past the probed rows: both ways must give
        // the in-place answer through `refine`.
        let dim = 13;
        let mut seed = 11u64;
        let mut values =
            |n: usize| -> Vec<f32> { (0..n * dim).map(|_| test_value(&mut seed) * 4.0).collect() };
        let stored = values(500);
        let queries = values(5);
        let lists: Vec<Vec<u32>> =
            vec![(0..200).collect(), (200..260).collect(), (260..270).collect(), (270..500).rev().collect()];
        let probes: Vec<u32> = vec![0, 2, 1, 3, 3, 2, 0, 1, 2, 1];
        let probes = ListProbes { lists: &lists, probes: &probes, nprobe: 2, generation: 5 };
        let allowed = SlotSet::from_slots(500, (0..500).filter(|s| s % 7 != 3));
        for here in [usize::MAX, 1, 0] {
            let mut rows = CpuRows::new(dim, StoragePrecision::F32, SimdLevel::detect())
                .with_packed_lists(true)
                .with_here_products(here);
            rows.append(&stored).expect("append");
            rows.tombstone(&[1, 201, 499]);
            assert!(
                rows.scans_here(&queries, &probes, GpuDistanceMetric::Euclidean).is_none(),
                "not packed yet"
            );
            for metric in
                [GpuDistanceMetric::Euclidean, GpuDistanceMetric::DotProduct, GpuDistanceMetric::Cosine]
            {
                for filter in [None, Some(&allowed)] {
                    for k in [1, 9, 300] {
                        let got = rows.scan_lists(&queries, &probes, k, metric, filter).expect("scan");
                        let want = scanned_by_refine(&rows, &queries, &probes, k, metric, filter);
                        assert_eq!(
                            got,
                            want,
                            "here {here}, {metric:?}, k {k}, filtered {}",
                            filter.is_some()
                        );
                        let goes_here = rows.scans_here(&queries, &probes, metric).is_some();
                        assert_eq!(
                            goes_here,
                            here == usize::MAX,
                            "here {here}, {metric:?}: where the scan runs"
                        );
                    }
                }
            }
        }
    }
}
