//! The scan of product-quantized lists on the device: [`RowStore::scan_pq`] (IVF-PQ's and
//! the flat PQ index's search after probing), one block of `hg_pq_scan` per query with its
//! lookup table in shared memory (`kernels/pq.cu`).
//!
//! The codes, their rows' terms and slots, the centroids and the codebooks live on the device
//! as one buffer, uploaded once per [`PqScan::generation`] and reused while it holds (as
//! `lists.rs` keeps inverted lists). Each call uploads its queries, probes and, where rows
//! are removed or a filter applies, the bitmap of slots to skip; it reads back each query's
//! `k` entries.
//!
//! Where the kernel does not apply (a table or a candidate list beyond a block's shared
//! memory, more rows than 32-bit offsets name) or [`crate::Tuning::pq_scan`] is off, the host
//! scan answers, as on every backend.
//!
//! [`RowStore::scan_pq`]: crate::backend::RowStore::scan_pq

use std::sync::Arc;

use super::abi::{Launch, PqListScan};
use super::driver::Driver;
use super::kernels::BLOCK;
use super::memory::DeviceBuffer;
use super::rows::GpuRows;
use super::search::{MAX_LIST, align, list_size};
use crate::backend::Neighbor;
use crate::backend::pq::{PqScan, code_bytes, scan_on_host};
use crate::error::{HiveGpuError, Result};
use crate::exact::metric_code;
use crate::slots::{SearchMask, SlotSet};

/// A product-quantized index's lists in device memory (see the module docs), at the byte
/// offsets it records.
#[derive(Debug)]
pub(super) struct DevicePq<D: Driver> {
    /// The [`PqScan::generation`] it copies, with the shape that generation had.
    generation: u64,
    lists: usize,
    m: usize,
    bits: usize,
    dim: usize,
    /// One past the largest slot in the lists: the skip bitmap's length.
    slot_bound: usize,
    buffer: DeviceBuffer<D>,
    offsets: usize,
    slots: usize,
    terms: usize,
    centroids: usize,
    codebooks: usize,
    codes: usize,
}

impl<D: Driver> DevicePq<D> {
    /// Bytes of device memory it holds.
    pub(super) fn bytes(&self) -> usize {
        self.buffer.bytes()
    }

    fn holds(&self, scan: &PqScan<'_>) -> bool {
        scan.generation != 0
            && self.generation == scan.generation
            && self.lists == scan.slots.len()
            && (self.m, self.bits, self.dim) == (scan.m, scan.bits, scan.dim)
    }
}

impl<D: Driver> GpuRows<D> {
    /// [`crate::backend::RowStore::scan_pq`] on the device (see the module docs).
    pub(super) fn scan_pq_on_device(&self, scan: &PqScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        let nq = scan.check(k)?;
        let (kcap, sortn) = (list_size(k), Self::scan_sort_size(k));
        let shared = sortn * 8 + (scan.m << scan.bits) * 4 + scan.dim * 4;
        let rows: usize = scan.slots.iter().map(Vec::len).sum();
        let fits = self.tuning.pq_scan
            && kcap <= MAX_LIST
            && shared <= self.shared_limit()
            && u32::try_from(rows).is_ok()
            && u32::try_from(nq).is_ok()
            && u32::try_from(scan.dim).is_ok();
        if !fits {
            return crate::exec::run(|| scan_on_host(scan, k))?;
        }
        if nq == 0 {
            return Ok(Vec::new());
        }
        let lists = self.device_pq(scan)?;
        let mask = SearchMask::new(scan.removed, lists.slot_bound, scan.allowed);
        let skip: Vec<u32> = if mask.skip.count() == 0 {
            Vec::new()
        } else {
            let words = SlotSet::words_for(lists.slot_bound);
            (0..words).map(|i| mask.skip.words().get(i).copied().unwrap_or(0)).collect()
        };
        let driver = self.driver().clone();
        let mut ws = self.checkout()?;
        let sizes = [align(scan.queries.len() * 4), align(scan.probes.len() * 4), skip.len() * 4];
        let input_bytes: usize = sizes.iter().sum();
        let out_bytes = nq * k * 8;
        let result = (|| -> Result<Vec<Vec<Neighbor>>> {
            let base = ws.inputs.get(&driver, input_bytes)?;
            let out = ws.lists.get(&driver, out_bytes)?;
            driver.synchronize(&ws.stream)?;
            let host = ws.staging.get(&*driver, input_bytes.max(out_bytes))?;
            let parts: [&[u8]; 3] = [
                bytemuck::cast_slice(scan.queries),
                bytemuck::cast_slice(scan.probes),
                bytemuck::cast_slice(&skip),
            ];
            let mut at = 0;
            let mut starts = [0usize; 3];
            for (i, (bytes, size)) in parts.into_iter().zip(sizes).enumerate() {
                host[at..at + bytes.len()].copy_from_slice(bytes);
                starts[i] = at;
                at += size;
            }
            driver.upload(&ws.stream, base, host, input_bytes)?;
            let device = |offset: usize| lists.buffer.ptr() + offset as u64;
            self.device.launch(
                &ws.stream,
                self.device.kernels.pq_scan,
                Launch::new((nq as u32, 1), BLOCK).shared(shared as u32),
                &PqListScan {
                    codes: device(lists.codes),
                    row_bytes: code_bytes(scan.m, scan.bits) as u32,
                    terms: device(lists.terms),
                    offsets: device(lists.offsets),
                    slots: device(lists.slots),
                    centroids: device(lists.centroids),
                    codebooks: device(lists.codebooks),
                    m: scan.m as u32,
                    bits: scan.bits as u32,
                    probes: base + starts[1] as u64,
                    nprobe: scan.nprobe as u32,
                    queries: base,
                    dim: scan.dim as u32,
                    skip: if skip.is_empty() { 0 } else { base + starts[2] as u64 },
                    metric: metric_code(scan.metric),
                    k: k as u32,
                    kcap: kcap as u32,
                    sortn: sortn as u32,
                    out,
                },
            )?;
            let host = ws.staging.get(&*driver, out_bytes)?;
            driver.download(&ws.stream, host, out, out_bytes)?;
            driver.synchronize(&ws.stream)?;
            let entries: Vec<u64> = bytemuck::pod_collect_to_vec(&host[..out_bytes]);
            entries
                .chunks_exact(k)
                .map(|row| {
                    row.iter()
                        .take_while(|&&e| e != u64::MAX)
                        .map(|&e| {
                            let slot = (e & 0xFFFF_FFFF) as usize;
                            if slot >= lists.slot_bound {
                                return Err(HiveGpuError::Internal(format!(
                                    "the PQ scan returned slot {slot}, past the lists' {}",
                                    lists.slot_bound
                                )));
                            }
                            Ok(Neighbor { slot, distance: f64::from(entry_distance(e)) })
                        })
                        .collect()
                })
                .collect()
        })();
        if result.is_ok() {
            self.checkin(ws);
        }
        result
    }

    /// The device copy of the scan's lists: the cached one while its generation holds, else a
    /// fresh upload (kept when the generation is not 0).
    fn device_pq(&self, scan: &PqScan<'_>) -> Result<Arc<DevicePq<D>>> {
        let cache =
            || self.pq_cache.lock().map_err(|_| HiveGpuError::Internal("PQ list cache poisoned".into()));
        if let Some(cached) = cache()?.as_ref()
            && cached.holds(scan)
        {
            return Ok(cached.clone());
        }
        let rows: usize = scan.slots.iter().map(Vec::len).sum();
        let row_bytes = code_bytes(scan.m, scan.bits);
        let lists = scan.slots.len();
        let sizes = [
            align((lists + 1) * 4),
            align(rows * 4),
            align(rows * 4),
            align(scan.centroids.len() * 4),
            align(scan.codebooks.len() * 4),
            rows * row_bytes,
        ];
        let total: usize = sizes.iter().sum();
        crate::memory::check(|| format!("copying {rows} PQ codes to the device"), total as u64)?;
        let mut host = vec![0u8; total];
        let mut starts = [0usize; 6];
        let mut at = 0;
        for (i, &size) in sizes.iter().enumerate() {
            starts[i] = at;
            at += size;
        }
        let mut put = |part: usize, index: usize, bytes: &[u8]| {
            host[starts[part] + index..starts[part] + index + bytes.len()].copy_from_slice(bytes);
        };
        let mut row = 0usize;
        let mut slot_bound = 0usize;
        put(0, 0, bytemuck::bytes_of(&0u32));
        for (l, (slots, codes)) in scan.slots.iter().zip(scan.codes).enumerate() {
            put(1, row * 4, bytemuck::cast_slice(slots));
            put(2, row * 4, bytemuck::cast_slice(&codes.norms));
            put(5, row * row_bytes, &codes.codes);
            row += slots.len();
            put(0, (l + 1) * 4, bytemuck::bytes_of(&(row as u32)));
            slot_bound = slot_bound.max(slots.iter().max().map_or(0, |&s| s as usize + 1));
        }
        put(3, 0, bytemuck::cast_slice(scan.centroids));
        put(4, 0, bytemuck::cast_slice(scan.codebooks));
        let driver = self.driver().clone();
        let buffer = DeviceBuffer::new(&driver, total.max(4))?;
        {
            let mut ws = self.checkout()?;
            // Staged in pieces: the staging buffer stays the size of a search's.
            let piece = (64usize << 20).min(total.max(1));
            let mut uploaded = Ok(());
            for first in (0..total).step_by(piece) {
                let n = piece.min(total - first);
                let staging = match ws.staging.get(&*driver, n) {
                    Ok(s) => s,
                    Err(e) => {
                        uploaded = Err(e);
                        break;
                    }
                };
                staging[..n].copy_from_slice(&host[first..first + n]);
                uploaded = driver
                    .upload(&ws.stream, buffer.ptr() + first as u64, staging, n)
                    .and_then(|()| driver.synchronize(&ws.stream));
                if uploaded.is_err() {
                    break;
                }
            }
            uploaded?;
            self.checkin(ws);
        }
        let copy = Arc::new(DevicePq {
            generation: scan.generation,
            lists,
            m: scan.m,
            bits: scan.bits,
            dim: scan.dim,
            slot_bound,
            buffer,
            offsets: starts[0],
            slots: starts[1],
            terms: starts[2],
            centroids: starts[3],
            codebooks: starts[4],
            codes: starts[5],
        });
        if scan.generation != 0 {
            *cache()? = Some(copy.clone());
        }
        Ok(copy)
    }
}

/// The f32 distance of a device entry (`hg_entry`: the distance's sortable key, then the slot).
fn entry_distance(entry: u64) -> f32 {
    let key = (entry >> 32) as u32;
    f32::from_bits(if key & 0x8000_0000 != 0 { key & 0x7FFF_FFFF } else { !key })
}

#[cfg(test)]
mod tests {
    use super::entry_distance;

    #[test]
    fn entry_distances_invert_the_devices_sortable_keys() {
        for d in [-3.5f32, -0.0, 0.0, 1e-30, 2.25, f32::INFINITY] {
            let bits = d.to_bits();
            let key = if bits & 0x8000_0000 != 0 { !bits } else { bits | 0x8000_0000 };
            let entry = (u64::from(key) << 32) | 7;
            assert_eq!(entry_distance(entry).to_bits(), d.to_bits(), "{d}");
        }
    }
}
