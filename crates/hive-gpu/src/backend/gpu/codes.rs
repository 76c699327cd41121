//! The scans of coded inverted lists on the device: [`RowStore::scan_codes`] (SQ8),
//! [`RowStore::scan_pq`] (product quantization) and [`RowStore::scan_bits`] (binary codes),
//! what the quantized indexes run after probing, before their exact re-rank. One block per
//! query scores every row of its lists from terms it readies per list in shared memory (the
//! PQ lookup table once per query), as `kernels/codes.cu` states.
//!
//! An index's codes, their rows' terms and slots and its quantizer (centroids, codebooks or
//! the SQ8 grid) live on the device as one buffer, uploaded once per generation of the lists
//! and reused while it holds (as `lists.rs` keeps inverted lists). Each call uploads its
//! queries, probes and, where rows are removed or a filter applies, the bitmap of slots to
//! skip, and reads back each query's `k` entries.
//!
//! Where a kernel does not apply (its shared memory beyond a block's, more rows than 32-bit
//! offsets name) or [`crate::Tuning::code_scan`] is off, the host scan answers, as on every
//! backend.
//!
//! [`RowStore::scan_codes`]: crate::backend::RowStore::scan_codes
//! [`RowStore::scan_pq`]: crate::backend::RowStore::scan_pq
//! [`RowStore::scan_bits`]: crate::backend::RowStore::scan_bits

use std::sync::Arc;

use super::abi::{BitsListScan, Kernel, KernelParams, Launch, PqListScan, Sq8ListScan};
use super::driver::{DevicePtr, Driver};
use super::kernels::BLOCK;
use super::memory::DeviceBuffer;
use super::primitives::{RefineFrom, RefineQueries, query_norms};
use super::rows::GpuRows;
use super::search::{MAX_LIST, Outputs, Profiler, align, list_size};
use crate::backend::Candidates;
use crate::backend::pq::{PqScan, code_bytes};
use crate::backend::{BitScan, CodeScan, Neighbor, bits, codes, pq};
use crate::error::{HiveGpuError, Result};
use crate::exact::metric_code;
use crate::slots::{SearchMask, SlotSet};
use crate::types::GpuDistanceMetric;

/// Shared memory of the tile a coded scan stages its rows in: a row per thread, 128 bytes of
/// each per pass at a pitch of 132 (`HG_CODE_CHUNK`, `HG_CODE_PITCH` in `kernels/codes.cu`).
const TILE_BYTES: usize = BLOCK as usize * 132;

/// Which codes a device copy holds, with the shape that decides its layout: a cached copy
/// serves a scan only where all of it (and the generation) match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sq8,
    Pq { m: usize, bits: usize },
    Bits,
}

/// The parts of a device copy, in buffer order.
const OFFSETS: usize = 0;
const SLOTS: usize = 1;
const TERMS: usize = 2;
const CODES: usize = 3;
/// The quantizer's arrays follow: centroids, then the codebooks (PQ) or base and step (SQ8).
const QUANTIZER: usize = 4;

/// An index's coded lists in device memory (see the module docs).
#[derive(Debug)]
pub(super) struct DeviceCodes<D: Driver> {
    generation: u64,
    kind: Kind,
    lists: usize,
    dim: usize,
    /// One past the largest slot in the lists: the skip bitmap's length.
    slot_bound: usize,
    /// Whether every slot is in the lists at most once (checked at upload).
    distinct: bool,
    buffer: DeviceBuffer<D>,
    /// Byte offset of each part in `buffer`.
    starts: Vec<usize>,
}

impl<D: Driver> DeviceCodes<D> {
    /// Bytes of device memory it holds.
    pub(super) fn bytes(&self) -> usize {
        self.buffer.bytes()
    }

    fn part(&self, index: usize) -> DevicePtr {
        self.buffer.ptr() + self.starts[index] as u64
    }
}

/// What a scan hands to [`GpuRows::coded_scan`]: its lists as the host holds them.
struct HostCodes<'a> {
    generation: u64,
    kind: Kind,
    dim: usize,
    slots: &'a [Vec<u32>],
    /// Per list: its rows' codes and (empty for binary codes) terms.
    rows: Vec<(&'a [u8], &'a [f32])>,
    /// Bytes per row of codes.
    row_bytes: usize,
    /// The quantizer's arrays (see [`QUANTIZER`]).
    quantizer: Vec<&'a [f32]>,
}

/// What a coded scan's nominees are refined to before they come back (see
/// [`crate::backend::RowStore::scan_and_refine`]): the exact queries, `k` and the metric.
#[derive(Debug, Clone, Copy)]
pub(super) struct RefineAfter<'a> {
    pub(super) queries: &'a [f32],
    pub(super) k: usize,
    pub(super) metric: GpuDistanceMetric,
}

/// Where a launch finds a scan's inputs: the device copy of its lists, the queries, the
/// probes and the skip bitmap (0: none).
struct ScanInputs<'a, D: Driver> {
    codes: &'a DeviceCodes<D>,
    queries: DevicePtr,
    probes: DevicePtr,
    skip: DevicePtr,
    kcap: u32,
    sortn: u32,
}

impl<D: Driver> GpuRows<D> {
    /// [`crate::backend::RowStore::scan_codes`] on the device (see the module docs).
    pub(super) fn scan_codes_on_device(
        &self,
        scan: &CodeScan<'_>,
        k: usize,
        refine: Option<RefineAfter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nq = scan.check(k)?;
        let shared = TILE_BYTES + 2 * scan.dim * 4;
        if !self.code_scan_fits(scan.slots, nq, k, shared) {
            let found = crate::exec::run(|| codes::scan_on_host(scan, k))??;
            return self.then_refine(found, refine);
        }
        let host = HostCodes {
            generation: scan.generation,
            kind: Kind::Sq8,
            dim: scan.dim,
            slots: scan.slots,
            rows: scan.codes.iter().map(|c| (c.codes.as_slice(), c.norms.as_slice())).collect(),
            row_bytes: scan.dim,
            quantizer: vec![scan.centroids, scan.base, scan.step],
        };
        let kernel = self.device.kernels.sq8_scan;
        self.coded_scan(
            &host,
            scan.queries,
            scan.probes,
            scan.removed,
            scan.allowed,
            k,
            shared,
            refine,
            |inputs| {
                let c = inputs.codes;
                (
                    kernel,
                    Sq8ListScan {
                        codes: c.part(CODES),
                        terms: c.part(TERMS),
                        offsets: c.part(OFFSETS),
                        slots: c.part(SLOTS),
                        centroids: c.part(QUANTIZER),
                        base: c.part(QUANTIZER + 1),
                        step: c.part(QUANTIZER + 2),
                        probes: inputs.probes,
                        nprobe: scan.nprobe as u32,
                        queries: inputs.queries,
                        dim: scan.dim as u32,
                        skip: inputs.skip,
                        metric: metric_code(scan.metric),
                        k: k as u32,
                        kcap: inputs.kcap,
                        sortn: inputs.sortn,
                        out: 0,
                    },
                )
            },
        )
    }

    /// [`crate::backend::RowStore::scan_pq`] on the device (see the module docs).
    pub(super) fn scan_pq_on_device(
        &self,
        scan: &PqScan<'_>,
        k: usize,
        refine: Option<RefineAfter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nq = scan.check(k)?;
        let shared = TILE_BYTES + (scan.m << scan.bits) * 4 + scan.dim * 4;
        if !self.code_scan_fits(scan.slots, nq, k, shared) {
            let found = crate::exec::run(|| pq::scan_on_host(scan, k))??;
            return self.then_refine(found, refine);
        }
        let host = HostCodes {
            generation: scan.generation,
            kind: Kind::Pq { m: scan.m, bits: scan.bits },
            dim: scan.dim,
            slots: scan.slots,
            rows: scan.codes.iter().map(|c| (c.codes.as_slice(), c.norms.as_slice())).collect(),
            row_bytes: code_bytes(scan.m, scan.bits),
            quantizer: vec![scan.centroids, scan.codebooks],
        };
        let kernel = self.device.kernels.pq_scan;
        self.coded_scan(
            &host,
            scan.queries,
            scan.probes,
            scan.removed,
            scan.allowed,
            k,
            shared,
            refine,
            |inputs| {
                let c = inputs.codes;
                (
                    kernel,
                    PqListScan {
                        codes: c.part(CODES),
                        row_bytes: code_bytes(scan.m, scan.bits) as u32,
                        terms: c.part(TERMS),
                        offsets: c.part(OFFSETS),
                        slots: c.part(SLOTS),
                        centroids: c.part(QUANTIZER),
                        codebooks: c.part(QUANTIZER + 1),
                        m: scan.m as u32,
                        bits: scan.bits as u32,
                        probes: inputs.probes,
                        nprobe: scan.nprobe as u32,
                        queries: inputs.queries,
                        dim: scan.dim as u32,
                        skip: inputs.skip,
                        metric: metric_code(scan.metric),
                        k: k as u32,
                        kcap: inputs.kcap,
                        sortn: inputs.sortn,
                        out: 0,
                    },
                )
            },
        )
    }

    /// [`crate::backend::RowStore::scan_bits`] on the device (see the module docs).
    pub(super) fn scan_bits_on_device(
        &self,
        scan: &BitScan<'_>,
        k: usize,
        refine: Option<RefineAfter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nq = scan.check(k)?;
        let words = bits::words(scan.dim);
        let shared = TILE_BYTES + words * 8 + scan.dim * 4;
        if !self.code_scan_fits(scan.slots, nq, k, shared) {
            let found = crate::exec::run(|| bits::scan_on_host(scan, k))??;
            return self.then_refine(found, refine);
        }
        let host = HostCodes {
            generation: scan.generation,
            kind: Kind::Bits,
            dim: scan.dim,
            slots: scan.slots,
            rows: scan.codes.iter().map(|c| (bytemuck::cast_slice(c.as_slice()), &[][..])).collect(),
            row_bytes: words * 8,
            quantizer: vec![scan.centroids],
        };
        let kernel = self.device.kernels.bits_scan;
        self.coded_scan(
            &host,
            scan.queries,
            scan.probes,
            scan.removed,
            scan.allowed,
            k,
            shared,
            refine,
            |inputs| {
                let c = inputs.codes;
                (
                    kernel,
                    BitsListScan {
                        codes: c.part(CODES),
                        offsets: c.part(OFFSETS),
                        slots: c.part(SLOTS),
                        centroids: c.part(QUANTIZER),
                        probes: inputs.probes,
                        nprobe: scan.nprobe as u32,
                        queries: inputs.queries,
                        dim: scan.dim as u32,
                        skip: inputs.skip,
                        k: k as u32,
                        kcap: inputs.kcap,
                        sortn: inputs.sortn,
                        out: 0,
                    },
                )
            },
        )
    }

    /// Whether the device scan applies: the switch is on, k within on-chip lists, the block's
    /// shared memory (candidates plus the kernel's own `shared` bytes) within the device's,
    /// and rows and queries that 32-bit numbers name.
    fn code_scan_fits(&self, slots: &[Vec<u32>], nq: usize, k: usize, shared: usize) -> bool {
        let rows: usize = slots.iter().map(Vec::len).sum();
        self.tuning.code_scan
            && list_size(k) <= MAX_LIST
            && Self::scan_sort_size(k) * 8 + shared <= self.shared_limit()
            && u32::try_from(rows).is_ok()
            && u32::try_from(nq).is_ok()
    }

    /// The launch every coded scan shares: the device copy of `host`'s lists (cached per
    /// generation), one upload of queries, probes and skip bitmap, one launch of the kernel
    /// `params` names (`out` filled in here), and one read back: of `k` entries per query, or,
    /// with `refine`, of the exact top-k of those entries, refined on the device by
    /// `hg_refine_lists` straight from the scan's output where [`Self::refines_in_place`]
    /// allows (else read back and refined through [`Self::then_refine`]).
    #[allow(clippy::too_many_arguments)]
    fn coded_scan<P: KernelParams + HasOutput>(
        &self,
        host: &HostCodes<'_>,
        queries: &[f32],
        probes: &[u32],
        removed: &SlotSet,
        allowed: Option<&SlotSet>,
        k: usize,
        shared: usize,
        refine: Option<RefineAfter<'_>>,
        params: impl FnOnce(&ScanInputs<'_, D>) -> (Kernel<D::Function, P>, P),
    ) -> Result<Vec<Vec<Neighbor>>> {
        // A refine on the device takes its queries without `refine`'s own check: make it here.
        if let Some(r) = &refine {
            crate::backend::candidates::check_finite_queries("refine", self.dim, r.queries)?;
        }
        let nq = queries.len() / host.dim;
        if nq == 0 {
            return self.then_refine(Vec::new(), refine);
        }
        let codes = self.device_codes(host)?;
        let in_place = refine.filter(|r| self.refines_in_place(&codes, r, probes, nq, k));
        // A refine on the device scores no removed row: the store's own removed slots are
        // skipped with the scan's (the index's removed set is the same in every collection).
        let removed_here;
        let removed = if in_place.is_some() && self.dead.count() > 0 {
            removed_here = removed.or(&self.dead);
            &removed_here
        } else {
            removed
        };
        let mask = SearchMask::new(removed, codes.slot_bound, allowed);
        let skip: Vec<u32> = if mask.skip.count() == 0 {
            Vec::new()
        } else {
            (0..SlotSet::words_for(codes.slot_bound))
                .map(|i| mask.skip.words().get(i).copied().unwrap_or(0))
                .collect()
        };
        let (kcap, sortn) = (list_size(k), Self::scan_sort_size(k));
        let driver = self.driver().clone();
        let mut ws = self.checkout()?;
        // The exact queries and their f64 norms go up with the scan's inputs when the refine
        // follows on the device (the scan's queries are reused where they are the same).
        let exact: &[f32] = match &in_place {
            Some(r) if !std::ptr::eq(r.queries, queries) => r.queries,
            _ => &[],
        };
        let q_norms: Vec<f64> = match &in_place {
            Some(r) => query_norms(r.queries, self.dim),
            None => Vec::new(),
        };
        let sizes = [
            align(queries.len() * 4),
            align(probes.len() * 4),
            align(skip.len() * 4),
            align(exact.len() * 4),
            q_norms.len() * 8,
        ];
        let input_bytes: usize = sizes.iter().sum();
        let out_bytes = nq * k * 8;
        let result = (|| -> Result<Vec<Vec<Neighbor>>> {
            let mut profile = Profiler::new();
            let base = ws.inputs.get(&driver, input_bytes)?;
            let out = ws.lists.get(&driver, out_bytes)?;
            let outputs = match &in_place {
                Some(r) => Some(Outputs::at(ws.outputs.get(&driver, Outputs::bytes_for(nq, r.k))?, nq, r.k)),
                None => None,
            };
            driver.synchronize(&ws.stream)?;
            // Room for every transfer of this call, taken before the first is queued: a larger
            // request later would free the buffer an upload still reads.
            let read_back = outputs.as_ref().map_or(out_bytes, |o| o.bytes.max(out_bytes));
            let staging = ws.staging.get(&*driver, input_bytes.max(read_back))?;
            let parts: [&[u8]; 5] = [
                bytemuck::cast_slice(queries),
                bytemuck::cast_slice(probes),
                bytemuck::cast_slice(&skip),
                bytemuck::cast_slice(exact),
                bytemuck::cast_slice(&q_norms),
            ];
            let mut at = 0;
            let mut starts = [0u64; 5];
            for ((bytes, size), start) in parts.into_iter().zip(sizes).zip(&mut starts) {
                staging[at..at + bytes.len()].copy_from_slice(bytes);
                *start = base + at as u64;
                at += size;
            }
            driver.upload(&ws.stream, base, staging, input_bytes)?;
            profile.mark(&*driver, &ws.stream, "upload")?;
            let inputs = ScanInputs {
                codes: &codes,
                queries: starts[0],
                probes: starts[1],
                skip: if skip.is_empty() { 0 } else { starts[2] },
                kcap: kcap as u32,
                sortn: sortn as u32,
            };
            let (kernel, mut params) = params(&inputs);
            params.set_output(out);
            self.device.launch(
                &ws.stream,
                kernel,
                Launch::new((nq as u32, 1), BLOCK).shared((sortn * 8 + shared) as u32),
                &params,
            )?;
            profile.mark(&*driver, &ws.stream, "scan")?;
            if let (Some(r), Some(outputs)) = (&in_place, &outputs) {
                let from = RefineFrom::Entries { entries: out, stride: k };
                let exact_at = if exact.is_empty() { starts[0] } else { starts[3] };
                let on = RefineQueries { nq, longest: k, queries: exact_at, q_norms: starts[4] };
                self.launch_refine(&ws, from, on, r.k, r.metric, outputs)?;
                profile.mark(&*driver, &ws.stream, "refine")?;
                let found = self.read_top_k(
                    &mut ws,
                    outputs,
                    nq,
                    r.k,
                    |_, slots| slots.iter().take_while(|&&s| s != u32::MAX).count(),
                    codes.slot_bound,
                );
                profile.mark(&*driver, &ws.stream, "download")?;
                profile.report(&format!("coded scan and refine nq {nq} wanted {k} k {}", r.k));
                return found;
            }
            let staging = ws.staging.get(&*driver, out_bytes)?;
            driver.download(&ws.stream, staging, out, out_bytes)?;
            driver.synchronize(&ws.stream)?;
            profile.mark(&*driver, &ws.stream, "download")?;
            profile.report(&format!("coded scan nq {nq} k {k}"));
            let entries: Vec<u64> = bytemuck::pod_collect_to_vec(&staging[..out_bytes]);
            entries.chunks_exact(k).map(|row| read_entries(row, codes.slot_bound)).collect()
        })();
        if result.is_ok() {
            self.checkin(ws);
        }
        match (result, in_place, refine) {
            (Ok(found), None, Some(_)) => self.then_refine(found, refine),
            (result, ..) => result,
        }
    }

    /// Whether a scan's `k` entries per query can be refined where they lie: the lists hold
    /// each slot once and no query probes a list twice (so each query's entries are distinct
    /// rows, as `hg_refine_lists` reads them), the store holds rows and every slot in the
    /// lists is one of them, `k` fits one block's refine, and the exact queries are whole rows
    /// of this store's dimension for each of the `nq`. Anything else takes
    /// [`Self::then_refine`], which drops repeats and removed rows as the trait's default does.
    fn refines_in_place(
        &self,
        codes: &DeviceCodes<D>,
        refine: &RefineAfter<'_>,
        probes: &[u32],
        nq: usize,
        k: usize,
    ) -> bool {
        codes.distinct
            && self.len > 0
            && codes.slot_bound <= self.len
            && refine.k >= 1
            && k <= self.refine_room_limit()
            && refine.queries.len() == nq * self.dim
            && probes_distinct(probes, nq)
    }

    /// `found` (each query's nominees), refined to `refine`'s exact top-k where asked
    /// ([`crate::backend::RowStore::refine`] on the device), else as it is.
    fn then_refine(
        &self,
        found: Vec<Vec<Neighbor>>,
        refine: Option<RefineAfter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let Some(r) = refine else { return Ok(found) };
        self.refine_lists(r.queries, &Candidates::from_nominees(&found), r.k, r.metric)
    }

    /// The device copy of `host`'s lists: the cached one while its generation and shape hold,
    /// else a fresh upload (kept when the generation is not 0).
    fn device_codes(&self, host: &HostCodes<'_>) -> Result<Arc<DeviceCodes<D>>> {
        let cache =
            || self.codes_cache.lock().map_err(|_| HiveGpuError::Internal("code list cache poisoned".into()));
        if host.generation != 0
            && let Some(cached) = cache()?.as_ref()
            && cached.generation == host.generation
            && cached.kind == host.kind
            && cached.lists == host.slots.len()
            && cached.dim == host.dim
        {
            return Ok(cached.clone());
        }
        let rows: usize = host.slots.iter().map(Vec::len).sum();
        let lists = host.slots.len();
        let mut sizes =
            vec![align((lists + 1) * 4), align(rows * 4), align(rows * 4), align(rows * host.row_bytes)];
        sizes.extend(host.quantizer.iter().map(|q| align(q.len() * 4)));
        let total: usize = sizes.iter().sum();
        crate::memory::check(|| format!("copying {rows} coded rows to the device"), total as u64)?;
        let mut starts = Vec::with_capacity(sizes.len());
        let mut at = 0;
        for &size in &sizes {
            starts.push(at);
            at += size;
        }
        let mut image = vec![0u8; total];
        let mut put = |part: usize, offset: usize, bytes: &[u8]| {
            let from = starts[part] + offset;
            image[from..from + bytes.len()].copy_from_slice(bytes);
        };
        let (mut row, mut slot_bound) = (0usize, 0usize);
        for (l, (slots, &(codes, terms))) in host.slots.iter().zip(&host.rows).enumerate() {
            put(SLOTS, row * 4, bytemuck::cast_slice(slots));
            put(TERMS, row * 4, bytemuck::cast_slice(terms));
            put(CODES, row * host.row_bytes, codes);
            row += slots.len();
            put(OFFSETS, (l + 1) * 4, bytemuck::bytes_of(&(row as u32)));
            slot_bound = slot_bound.max(slots.iter().max().map_or(0, |&s| s as usize + 1));
        }
        for (i, values) in host.quantizer.iter().enumerate() {
            put(QUANTIZER + i, 0, bytemuck::cast_slice(values));
        }
        // Once per generation: whether a slot is filed twice (an index files each row once; a
        // refine on the device relies on it, `refines_in_place`).
        let mut seen = SlotSet::empty(slot_bound);
        let distinct = host.slots.iter().flatten().all(|&slot| seen.set(slot as usize, true));
        let driver = self.driver().clone();
        let buffer = DeviceBuffer::new(&driver, total.max(4))?;
        let mut ws = self.checkout()?;
        // In pieces, so the staging buffer stays the size of a search's.
        let piece = 64usize << 20;
        for first in (0..total).step_by(piece) {
            let n = piece.min(total - first);
            let staging = ws.staging.get(&*driver, n)?;
            staging[..n].copy_from_slice(&image[first..first + n]);
            driver.upload(&ws.stream, buffer.ptr() + first as u64, staging, n)?;
            driver.synchronize(&ws.stream)?;
        }
        self.checkin(ws);
        let copy = Arc::new(DeviceCodes {
            generation: host.generation,
            kind: host.kind,
            lists,
            dim: host.dim,
            slot_bound,
            distinct,
            buffer,
            starts,
        });
        if host.generation != 0 {
            *cache()? = Some(copy.clone());
        }
        Ok(copy)
    }
}

/// Whether each of the `nq` queries' probes (`probes.len() / nq` each) names a list once.
fn probes_distinct(probes: &[u32], nq: usize) -> bool {
    let Some(nprobe) = probes.len().checked_div(nq) else { return true };
    let mut sorted = Vec::with_capacity(nprobe);
    probes.chunks(nprobe.max(1)).all(|lists| {
        sorted.clear();
        sorted.extend_from_slice(lists);
        sorted.sort_unstable();
        sorted.windows(2).all(|pair| pair[0] != pair[1])
    })
}

/// The kernel parameters of a coded scan name where its entries go.
trait HasOutput {
    fn set_output(&mut self, out: DevicePtr);
}

macro_rules! has_output {
    ($($params:ident),*) => {
        $(impl HasOutput for $params {
            fn set_output(&mut self, out: DevicePtr) {
                self.out = out;
            }
        })*
    };
}
has_output!(Sq8ListScan, PqListScan, BitsListScan);

/// One query's entries as the kernel wrote them (ascending, all ones past the rows found):
/// its neighbours, each slot checked against the lists' bound.
fn read_entries(row: &[u64], slot_bound: usize) -> Result<Vec<Neighbor>> {
    row.iter()
        .take_while(|&&e| e != u64::MAX)
        .map(|&e| {
            let slot = (e & 0xFFFF_FFFF) as usize;
            if slot >= slot_bound {
                return Err(HiveGpuError::Internal(format!(
                    "a coded scan returned slot {slot}, past the lists' {slot_bound}"
                )));
            }
            Ok(Neighbor { slot, distance: f64::from(entry_distance(e)) })
        })
        .collect()
}

/// The f32 distance of a device entry (`hg_entry`: the distance's sortable key, then the slot).
fn entry_distance(entry: u64) -> f32 {
    let key = (entry >> 32) as u32;
    f32::from_bits(if key & 0x8000_0000 != 0 { key & 0x7FFF_FFFF } else { !key })
}

#[cfg(test)]
mod tests {
    use super::{entry_distance, probes_distinct, read_entries};
    use crate::backend::gpu::search::entry_key;

    #[test]
    fn a_query_probing_a_list_twice_is_not_distinct_and_no_queries_are() {
        assert!(probes_distinct(&[0, 1, 2, 3, 3, 0], 3));
        assert!(!probes_distinct(&[0, 1, 2, 3, 1, 3], 2));
        assert!(!probes_distinct(&[5, 5], 1));
        assert!(probes_distinct(&[], 0));
        assert!(probes_distinct(&[], 3));
    }

    #[test]
    fn entry_distances_invert_the_devices_sortable_keys() {
        for d in [-3.5f32, -0.0, 0.0, 1e-30, 2.25, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(entry_distance(entry_key(d, 7)).to_bits(), d.to_bits(), "{d}");
        }
    }

    #[test]
    fn entries_stop_at_the_first_empty_one_and_a_slot_past_the_lists_is_an_error() {
        let got = read_entries(&[entry_key(-1.0, 4), entry_key(2.0, 9), u64::MAX, entry_key(0.5, 1)], 10)
            .expect("in range");
        assert_eq!(got.iter().map(|n| (n.slot, n.distance)).collect::<Vec<_>>(), vec![(4, -1.0), (9, 2.0)]);
        assert!(read_entries(&[entry_key(1.0, 10)], 10).is_err());
    }
}
