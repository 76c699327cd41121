//! Rows on the device: elements (f32 or f16), an f32 squared norm per row and a tombstone
//! bitmap, grown by doubling with device-to-device copies and compacted on the device.

use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::Device;
use super::abi::{Gather, Launch, Norms};
use super::driver::Driver;
use super::kernels::BLOCK;
use super::memory::{DeviceBuffer, Scratch, Staging, Workspace};
use crate::backend::{Neighbor, RowStore};
use crate::error::{HiveGpuError, Result};
use crate::slots::SlotSet;
use crate::tuning::Tuning;
use crate::types::{GpuDistanceMetric, SearchPrecision, StoragePrecision};

/// Rows staged per upload: large enough to keep the copy engine busy, small enough to
/// overlap with converting the next chunk.
const UPLOAD_CHUNK_BYTES: usize = 32 << 20;

/// Appends of at most this many rows bound their norms on the host (from the staged values)
/// instead of reading the device's norms back: one stream synchronisation per append instead
/// of three, which is most of a single-vector upsert (docs/PERFORMANCE.md, durable writes).
const HOST_NORM_BOUND_MAX_ROWS: usize = 64;

/// Values converted per task when staging rows in parallel.
const FILL_GRAIN: usize = 1 << 16;

/// Writes `values` into `staging` as the stored element type (little-endian bytes, the
/// device's order), in parallel: one thread cannot keep up with the copy engine.
fn fill_staging(staging: &mut [u8], values: &[f32], precision: StoragePrecision) {
    let narrow = crate::exact::elements::narrow_into;
    if values.len() <= FILL_GRAIN {
        // One task's worth stays on this thread: a small write makes no rayon call.
        narrow(values, precision, staging);
        return;
    }
    let size = precision.element_bytes();
    staging
        .par_chunks_mut(FILL_GRAIN * size)
        .zip(values.par_chunks(FILL_GRAIN))
        .for_each(|(dst, src)| narrow(src, precision, dst));
}

/// Bounds (below, above) on the squared norm the device computes for each of these stored
/// rows, as `upload_rows` folds them into `least_sq_norm` and `max_sq_norm` (the streamed
/// store bounds its rows above the same way).
fn stored_sq_norm_bounds(stored: &[u8], precision: StoragePrecision, dim: usize) -> (f32, f32) {
    let (least, largest) = squared_norm_range(stored, precision, dim);
    (device_sq_norm_floor(least, dim), device_sq_norm_bound(largest, dim))
}

/// The least and the largest f64 squared norms of the whole rows of stored elements in
/// `bytes` (+inf and 0 for none).
fn squared_norm_range(bytes: &[u8], precision: StoragePrecision, dim: usize) -> (f64, f64) {
    let mut row = Vec::with_capacity(dim);
    bytes
        .chunks_exact(dim * precision.element_bytes())
        .map(|stored| {
            row.clear();
            crate::exact::elements::widen(stored, precision, &mut row);
            crate::exact::squared_norm_f64(&row)
        })
        .fold((f64::INFINITY, 0.0), |(least, largest), n| (least.min(n), largest.max(n)))
}

/// The largest f64 squared norm of the whole rows of stored elements in `bytes`.
pub(super) fn largest_squared_norm(bytes: &[u8], precision: StoragePrecision, dim: usize) -> f64 {
    squared_norm_range(bytes, precision, dim).1
}

/// `largest` (an f64 squared norm) widened into a bound on what any device computes for it: a
/// device sums a norm in f32 (or in f64, rounding once), within `dim * 2^-24` of the f64 sum
/// relatively, so this widening keeps the bound above it, rounding to f32 included.
pub(super) fn device_sq_norm_bound(largest: f64, dim: usize) -> f32 {
    (largest * (1.0 + (dim as f64 + 2.0) * f64::powi(2.0, -22))) as f32
}

/// `least` (a squared norm, f64 or as a device computed it) narrowed into a bound below both:
/// the mirror of [`device_sq_norm_bound`], whose margin (four times the device's `dim * 2^-24`)
/// also covers the rounding to f32. 0 where the margin would reach the whole norm.
fn device_sq_norm_floor(least: f64, dim: usize) -> f32 {
    (least * (1.0 - (dim as f64 + 2.0) * f64::powi(2.0, -22))).max(0.0) as f32
}

/// The launch of `hg_gather` over `count` rows of `row_bytes`: a thread per unit it copies (4,
/// 2 or 1 bytes, the widest that divides the row).
pub(super) fn gather_launch(row_bytes: usize, count: usize) -> Launch {
    let unit = [4, 2, 1].into_iter().find(|u| row_bytes.is_multiple_of(*u)).unwrap_or(1);
    let total = (row_bytes / unit) as u64 * count as u64;
    Launch::new((total.div_ceil(u64::from(BLOCK)).min(65535) as u32, 1), BLOCK)
}

/// The device arrays of one collection.
#[derive(Debug)]
pub(super) struct Arrays<D: Driver> {
    pub(super) rows: DeviceBuffer<D>,
    pub(super) norms: DeviceBuffer<D>,
    pub(super) dead: DeviceBuffer<D>,
    pub(super) capacity: usize,
}

/// What mutations use: two streams and two staging buffers. An append fills one buffer while
/// the other uploads, each buffer's uploads on its own stream, so that refilling a buffer
/// waits for that buffer's last upload only.
#[derive(Debug)]
struct Maintenance<D: Driver> {
    stream: D::Stream,
    upload_stream: D::Stream,
    staging: [Staging<D>; 2],
}

/// Rows to upload: f32 values, or a collection file's stored elements of the rows' own
/// precision (little-endian, which is the device's order), copied as they are.
#[derive(Clone, Copy)]
enum Source<'a> {
    Values(&'a [f32]),
    Stored(&'a [u8]),
}

/// Bytes copied per task when staging stored elements in parallel.
const COPY_GRAIN: usize = 1 << 20;

/// Copies stored elements into `staging`, in parallel for more than a task's worth.
fn copy_staging(staging: &mut [u8], stored: &[u8]) {
    if stored.len() <= COPY_GRAIN {
        staging.copy_from_slice(stored);
    } else {
        staging
            .par_chunks_mut(COPY_GRAIN)
            .zip(stored.par_chunks(COPY_GRAIN))
            .for_each(|(dst, src)| dst.copy_from_slice(src));
    }
}

/// A collection's rows on a GPU.
#[derive(Debug)]
pub(crate) struct GpuRows<D: Driver> {
    pub(super) device: Arc<Device<D>>,
    pub(super) dim: usize,
    pub(super) precision: StoragePrecision,
    pub(super) search: SearchPrecision,
    /// The knobs of the context that created the collection.
    pub(super) tuning: Tuning,
    pub(super) len: usize,
    pub(super) arrays: Option<Arrays<D>>,
    /// Host copy of the tombstone bitmap (the device holds the same words).
    pub(super) dead: SlotSet,
    /// Set when a tombstone upload failed: the next search uploads the whole bitmap first
    /// (under this lock, so concurrent searches wait for it).
    dead_stale: Mutex<bool>,
    /// At least the largest squared norm of any slot, removed ones included.
    pub(super) max_sq_norm: f32,
    /// At most the least squared norm of any slot, removed ones included, both as stored
    /// (f64) and as the device computed it: +inf before any row is stored, 0 where unknown (a
    /// streamed window's rows). It never rises while rows are removed (the bound stays a
    /// bound), only at `clear`. Cosine's rounded f16 filter needs it (`search.rs`).
    pub(super) least_sq_norm: f32,
    /// Names the rows' contents, slots and removed rows: a new stamp at every change
    /// ([`GpuRows::touch`]). What a search derives from the rows and a filter (its skip words,
    /// the passing rows gathered) is kept under this and the filter's [`SlotSet::stamp`].
    pub(super) rows_stamp: u64,
    maintenance: Mutex<Maintenance<D>>,
    pub(super) pool: Mutex<Vec<Workspace<D>>>,
    /// The inverted lists of the last list scan, kept while their generation holds
    /// (`lists.rs`).
    pub(super) lists_cache: Mutex<Option<Arc<super::lists::DeviceLists<D>>>>,
    /// The coded lists of the last SQ8, PQ or binary scan, kept while their generation holds
    /// (`codes.rs`).
    pub(super) codes_cache: Mutex<Option<Arc<super::codes::DeviceCodes<D>>>>,
    /// The passing rows of the last batch filter too large to keep with a workspace, gathered
    /// once for every piece of the batch and for the next batch of the same filter
    /// (`search.rs`, `shared_gather`); dropped by any change of the rows.
    pub(super) gather_cache: Mutex<Option<Arc<super::memory::Gathered<D>>>>,
}

impl<D: Driver> GpuRows<D> {
    pub(super) fn new(
        device: Arc<Device<D>>,
        dim: usize,
        precision: StoragePrecision,
        search: SearchPrecision,
        tuning: Tuning,
    ) -> Result<Self> {
        let stream = device.driver.stream(false)?;
        let upload_stream = device.driver.stream(false)?;
        Ok(Self {
            device,
            dim,
            precision,
            search,
            tuning,
            len: 0,
            arrays: None,
            dead: SlotSet::default(),
            dead_stale: Mutex::new(false),
            max_sq_norm: 0.0,
            least_sq_norm: f32::INFINITY,
            rows_stamp: crate::slots::new_stamp(),
            maintenance: Mutex::new(Maintenance {
                stream,
                upload_stream,
                staging: [Staging::new(), Staging::new()],
            }),
            pool: Mutex::new(Vec::new()),
            lists_cache: Mutex::new(None),
            codes_cache: Mutex::new(None),
            gather_cache: Mutex::new(None),
        })
    }

    pub(super) fn element_bytes(&self) -> usize {
        self.precision.element_bytes()
    }

    /// Records a change of the rows, their slots or their removed set: what was derived from
    /// them before no longer matches (see `rows_stamp`). Every `&mut self` method that changes
    /// any of them calls it.
    fn touch(&mut self) {
        self.rows_stamp = crate::slots::new_stamp();
        // A gather of the old rows can never match again: its device memory goes back now.
        if let Ok(cache) = self.gather_cache.get_mut() {
            *cache = None;
        }
    }

    fn row_bytes(&self) -> usize {
        self.dim * self.element_bytes()
    }

    pub(super) fn driver(&self) -> &Arc<D> {
        &self.device.driver
    }

    fn maintenance(&self) -> Result<std::sync::MutexGuard<'_, Maintenance<D>>> {
        self.maintenance.lock().map_err(|_| HiveGpuError::Internal("GPU maintenance lock poisoned".into()))
    }

    fn dead_words(capacity: usize) -> usize {
        capacity.div_ceil(32).max(1)
    }

    /// Device arrays for `capacity` rows, holding the first `self.len` rows of the current ones.
    fn grow_to(&mut self, capacity: usize) -> Result<()> {
        let driver = self.driver().clone();
        let row_bytes = self.row_bytes();
        let words = Self::dead_words(capacity);
        let requested = (capacity * (row_bytes + 4) + words * 4) as u64;
        // Out of memory names the whole growth; any other failure passes through unchanged.
        let whole = |e: HiveGpuError| match e {
            HiveGpuError::VramLimitExceeded { backend, available, .. } => {
                HiveGpuError::VramLimitExceeded { backend, requested, available }
            }
            other => other,
        };
        // The test knob that makes a small collection take the streamed path on any GPU.
        if let Some(limit) = self.tuning.device_rows_bytes
            && requested > limit as u64
        {
            return Err(HiveGpuError::VramLimitExceeded {
                backend: self.device.backend,
                requested,
                available: limit as u64,
            });
        }
        let rows = DeviceBuffer::new(&driver, capacity * row_bytes).map_err(whole)?;
        let norms = DeviceBuffer::new(&driver, capacity * 4).map_err(whole)?;
        let dead = DeviceBuffer::new(&driver, words * 4).map_err(whole)?;
        let maintenance = self.maintenance()?;
        let stream = &maintenance.stream;
        driver.fill(stream, dead.ptr(), 0, words * 4)?;
        if let Some(old) = &self.arrays {
            driver.copy(stream, rows.ptr(), old.rows.ptr(), self.len * row_bytes)?;
            driver.copy(stream, norms.ptr(), old.norms.ptr(), self.len * 4)?;
            driver.copy(stream, dead.ptr(), old.dead.ptr(), Self::dead_words(self.len) * 4)?;
        }
        driver.synchronize(stream)?;
        drop(maintenance);
        self.arrays = Some(Arrays { rows, norms, dead, capacity });
        self.dead.cover(capacity);
        Ok(())
    }

    fn ensure_capacity(&mut self, needed: usize) -> Result<()> {
        let capacity = self.arrays.as_ref().map_or(0, |a| a.capacity);
        if needed <= capacity {
            return Ok(());
        }
        // Amortised doubling, falling back to the exact size when doubling does not fit.
        let doubled = needed.max(capacity * 2).max(1024);
        let attempt = match self.grow_to(doubled) {
            Err(HiveGpuError::VramLimitExceeded { .. }) if doubled > needed => self.grow_to(needed),
            other => other,
        };
        match attempt {
            // Idle search workspaces hold scratch memory: release them and try once more.
            Err(HiveGpuError::VramLimitExceeded { .. }) => {
                self.release_scratch();
                self.grow_to(needed)
            }
            other => other,
        }
    }

    /// Uploads `rows` (whole rows, already validated) into slots starting at `first`, then
    /// computes their norms on the device and folds them into `max_sq_norm` and
    /// `least_sq_norm`.
    fn upload_rows(&mut self, first: usize, rows: Source<'_>) -> Result<()> {
        self.touch();
        let row_bytes = self.row_bytes();
        let count = match rows {
            Source::Values(values) => values.len() / self.dim,
            Source::Stored(bytes) => bytes.len() / row_bytes,
        };
        let driver = self.driver().clone();
        let (dim, precision) = (self.dim, self.precision);
        let Some(arrays) = &self.arrays else {
            return Err(HiveGpuError::Internal("rows uploaded before allocation".into()));
        };
        let (rows_ptr, norms_ptr) = (arrays.rows.ptr(), arrays.norms.ptr());
        let mut guard = self.maintenance()?;
        let Maintenance { stream, upload_stream, staging } = &mut *guard;
        let streams = [&*stream, &*upload_stream];
        let rows_per_chunk = (UPLOAD_CHUNK_BYTES / row_bytes).max(1);
        let mut host_bound = None;
        for (i, start) in (0..count).step_by(rows_per_chunk).enumerate() {
            let end = (start + rows_per_chunk).min(count);
            let bytes = (end - start) * row_bytes;
            let side = i % 2;
            // This buffer's previous upload (two chunks ago) must be done before it is refilled;
            // the other buffer's, on the other stream, goes on meanwhile.
            if i >= 2 {
                driver.synchronize(streams[side])?;
            }
            let buffer = staging[side].get(&driver, bytes)?;
            match rows {
                Source::Values(values) => {
                    fill_staging(&mut buffer[..bytes], &values[start * dim..end * dim], precision)
                }
                Source::Stored(stored) => {
                    copy_staging(&mut buffer[..bytes], &stored[start * row_bytes..end * row_bytes])
                }
            }
            // Only for an append that goes up in one chunk: the bound is of this chunk's rows
            // (rows of over 512 KiB make several chunks of a few rows).
            if count <= HOST_NORM_BOUND_MAX_ROWS && count <= rows_per_chunk {
                host_bound = Some(stored_sq_norm_bounds(&buffer[..bytes], precision, dim));
            }
            let offset = (first + start) * row_bytes;
            driver.upload(streams[side], rows_ptr + offset as u64, buffer, bytes)?;
        }
        // The norms read every uploaded row: both streams' uploads finish first (one chunk
        // went up on `stream`, which the norms' launch follows anyway).
        if count > rows_per_chunk {
            driver.synchronize(streams[1])?;
        }
        let kernel = self.device.kernels.norms().get(precision);
        let warps_per_block = (BLOCK / driver.warp_size()) as usize;
        let grid = count.div_ceil(warps_per_block).min(65535) as u32;
        self.device.launch(
            stream,
            kernel,
            Launch::new((grid, 1), BLOCK),
            &Norms {
                rows: rows_ptr,
                dim: dim as u32,
                first: first as u32,
                count: count as u32,
                norms: norms_ptr,
            },
        )?;
        // The uploads from both staging buffers finish before one is reused (or regrown), and
        // the norms before any search reads them (on another stream).
        driver.synchronize(stream)?;
        if let Some((least, largest)) = host_bound {
            drop(guard);
            self.max_sq_norm = self.max_sq_norm.max(largest);
            self.least_sq_norm = self.least_sq_norm.min(least);
            return Ok(());
        }
        let host = staging[0].get(&driver, count * 4)?;
        driver.download(stream, host, norms_ptr + (first * 4) as u64, count * 4)?;
        driver.synchronize(stream)?;
        let (least, max) = host[..count * 4]
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .fold((f32::INFINITY, 0f32), |(least, max), n| (least.min(n), max.max(n)));
        drop(guard);
        // Widened a little so bounds built on it stay bounds after rounding.
        self.max_sq_norm = self.max_sq_norm.max(max * (1.0 + 1e-6));
        self.least_sq_norm = self.least_sq_norm.min(device_sq_norm_floor(f64::from(least), dim));
        Ok(())
    }

    /// Uploads the host tombstone words `[from, to)`.
    fn upload_dead(&self, from: usize, to: usize) -> Result<()> {
        let Some(arrays) = &self.arrays else { return Ok(()) };
        if from >= to {
            return Ok(());
        }
        let driver = self.driver().clone();
        let mut guard = self.maintenance()?;
        let Maintenance { stream, staging, .. } = &mut *guard;
        let bytes = (to - from) * 4;
        let buffer = staging[0].get(&driver, bytes)?;
        for (dst, word) in buffer[..bytes].chunks_exact_mut(4).zip(&self.dead.words()[from..to]) {
            dst.copy_from_slice(&word.to_ne_bytes());
        }
        driver.upload(stream, arrays.dead.ptr() + (from * 4) as u64, buffer, bytes)?;
        driver.synchronize(stream)
    }

    fn mark_dead_stale(&self) {
        if let Ok(mut stale) = self.dead_stale.lock() {
            *stale = true;
        }
    }

    /// New device arrays of room for `capacity` rows holding the rows of `keep` (ascending
    /// slots in range), in order, with their norms; no row removed. Compaction keeps them; a
    /// search over few passing rows reads them instead of every row.
    /// `reuse`: arrays of an earlier gather, written over when they hold room for `keep`;
    /// `keep_scratch`: where the slot list goes on the device (else a buffer of its own).
    pub(super) fn gather_arrays(
        &self,
        keep: &[usize],
        capacity: usize,
        reuse: Option<Arrays<D>>,
        keep_scratch: Option<&mut Scratch<D>>,
    ) -> Result<Arrays<D>> {
        let Some(old) = &self.arrays else { return Err(HiveGpuError::EmptyCollection) };
        let driver = self.driver().clone();
        let count = keep.len();
        let row_bytes = self.row_bytes();
        let (rows, norms, dead, capacity) = match reuse {
            Some(a) if a.capacity >= count => (a.rows, a.norms, a.dead, a.capacity),
            _ => (
                DeviceBuffer::new(&driver, capacity.max(1) * row_bytes)?,
                DeviceBuffer::new(&driver, capacity.max(1) * 4)?,
                DeviceBuffer::new(&driver, Self::dead_words(capacity) * 4)?,
                capacity,
            ),
        };
        let words = Self::dead_words(capacity);
        let own_keep;
        let keep_ptr = match keep_scratch {
            Some(scratch) => scratch.get(&driver, count.max(1) * 4)?,
            None => {
                own_keep = DeviceBuffer::new(&driver, count.max(1) * 4)?;
                own_keep.ptr()
            }
        };
        let mut guard = self.maintenance()?;
        let Maintenance { stream, staging, .. } = &mut *guard;
        let buffer = staging[0].get(&driver, count.max(1) * 4)?;
        for (dst, &slot) in buffer.chunks_exact_mut(4).zip(keep) {
            dst.copy_from_slice(&(slot as u32).to_ne_bytes());
        }
        driver.upload(stream, keep_ptr, buffer, count * 4)?;
        driver.fill(stream, dead.ptr(), 0, words * 4)?;
        if count > 0 {
            self.device.launch(
                stream,
                self.device.kernels.gather,
                gather_launch(row_bytes, count),
                &Gather {
                    src: old.rows.ptr(),
                    dst: rows.ptr(),
                    row_bytes: row_bytes as u64,
                    keep: keep_ptr,
                    count: count as u32,
                    norms_src: old.norms.ptr(),
                    norms_dst: norms.ptr(),
                },
            )?;
        }
        driver.synchronize(stream)?;
        Ok(Arrays { rows, norms, dead, capacity })
    }

    /// The rows of `keep` (ascending slots) as rows of their own on the same device, slot i
    /// holding `keep[i]`: the parent's largest norm still bounds them, and they have no
    /// removed row.
    /// `reuse`: the rows of an earlier gather of this collection, whose stream and arrays are
    /// used again (a new stream and new device memory were most of a gathered single query's
    /// fixed cost); `keep_scratch` holds the slot list on the device.
    pub(super) fn gathered(
        &self,
        keep: &[usize],
        reuse: Option<Box<Self>>,
        keep_scratch: &mut Scratch<D>,
    ) -> Result<Box<Self>> {
        let mut rows = match reuse {
            Some(rows) => rows,
            None => Box::new(Self::new(
                self.device.clone(),
                self.dim,
                self.precision,
                self.search,
                self.tuning.clone(),
            )?),
        };
        let earlier = rows.arrays.take();
        rows.arrays = Some(self.gather_arrays(keep, keep.len(), earlier, Some(keep_scratch))?);
        rows.touch();
        rows.len = keep.len();
        rows.dead.reset(keep.len());
        rows.max_sq_norm = self.max_sq_norm;
        rows.least_sq_norm = self.least_sq_norm;
        Ok(rows)
    }

    /// Empty rows with device room for exactly `capacity`: a window of a streamed collection
    /// (`streamed.rs`).
    pub(super) fn window(
        device: Arc<Device<D>>,
        dim: usize,
        precision: StoragePrecision,
        search: SearchPrecision,
        tuning: Tuning,
        capacity: usize,
    ) -> Result<Self> {
        let mut rows = Self::new(device, dim, precision, search, tuning)?;
        rows.grow_to(capacity)?;
        Ok(rows)
    }

    /// Makes `page`'s first `count` rows (stored elements, whole rows) this window's rows,
    /// with `dead` as their removed slots and `max_sq_norm` bounding their norms, and computes
    /// their norms; returns once they are on the device. It runs on the window's own upload
    /// stream while another window is searched (`streamed.rs`).
    ///
    /// The rows go up in pieces of `UPLOAD_CHUNK_BYTES`, at most two queued at a time: a copy
    /// engine takes the copies queued on it in order, whatever their streams, so a search's own
    /// upload (its queries) queued behind a whole window would wait for all of it. On the H100
    /// a 1,000-query search's query upload waited 8-9 ms behind a 512 MiB window, which undid
    /// the overlap (docs/PERFORMANCE.md, streaming); behind two pieces it waits about a
    /// millisecond.
    pub(super) fn fill_window(
        &mut self,
        page: &D::Pinned,
        count: usize,
        dead: SlotSet,
        max_sq_norm: f32,
    ) -> Result<()> {
        let row_bytes = self.row_bytes();
        let Some(arrays) =
            self.arrays.as_ref().filter(|a| a.capacity >= count && page.len() >= count * row_bytes)
        else {
            return Err(HiveGpuError::Internal(format!("a window got {count} rows it has no room for")));
        };
        let (rows_ptr, norms_ptr, dead_ptr) = (arrays.rows.ptr(), arrays.norms.ptr(), arrays.dead.ptr());
        let driver = self.driver().clone();
        let words = Self::dead_words(count);
        // A fill that fails part way leaves an empty window, never a torn one.
        self.touch();
        self.len = 0;
        self.dead = SlotSet::default();
        {
            let mut guard = self.maintenance()?;
            let Maintenance { upload_stream, staging, .. } = &mut *guard;
            let queued = (|| -> Result<()> {
                let buffer = staging[1].get(&driver, words * 4)?;
                for (i, dst) in buffer[..words * 4].chunks_exact_mut(4).enumerate() {
                    dst.copy_from_slice(&dead.words().get(i).copied().unwrap_or(0).to_ne_bytes());
                }
                driver.upload(upload_stream, dead_ptr, buffer, words * 4)?;
                let piece = (UPLOAD_CHUNK_BYTES / row_bytes).max(1) * row_bytes;
                for (i, start) in (0..count * row_bytes).step_by(piece).enumerate() {
                    // Two pieces queued at most: wait for those before queuing the next pair.
                    if i > 0 && i % 2 == 0 {
                        driver.synchronize(upload_stream)?;
                    }
                    let bytes = piece.min(count * row_bytes - start);
                    driver.upload_at(upload_stream, rows_ptr + start as u64, page, start, bytes)?;
                }
                if count > 0 {
                    let warps_per_block = (BLOCK / driver.warp_size()) as usize;
                    self.device.launch(
                        upload_stream,
                        self.device.kernels.norms().get(self.precision),
                        Launch::new((count.div_ceil(warps_per_block).min(65535) as u32, 1), BLOCK),
                        &Norms {
                            rows: rows_ptr,
                            dim: self.dim as u32,
                            first: 0,
                            count: count as u32,
                            norms: norms_ptr,
                        },
                    )?;
                }
                Ok(())
            })();
            // Queued in full or not, nothing queued may outlive this call: the page and the
            // staging buffer are the caller's again once it returns.
            let finished = driver.synchronize(upload_stream);
            queued.and(finished)?;
        }
        self.len = count;
        self.dead = dead;
        self.dead.cover(self.capacity());
        self.max_sq_norm = max_sq_norm;
        // Unknown: the streamed store bounds its rows' norms above only.
        self.least_sq_norm = 0.0;
        Ok(())
    }

    /// Room for rows in this store's device arrays.
    pub(super) fn capacity(&self) -> usize {
        self.arrays.as_ref().map_or(0, |a| a.capacity)
    }

    pub(super) fn live(&self) -> usize {
        self.len - self.dead.count()
    }
}

impl<D: Driver> GpuRows<D> {
    /// Re-uploads the tombstone bitmap if an earlier upload failed. Every search passes this
    /// lock, so none runs while the bitmap is re-uploaded.
    pub(super) fn refresh_dead(&self) -> Result<()> {
        let mut stale =
            self.dead_stale.lock().map_err(|_| HiveGpuError::Internal("tombstone lock poisoned".into()))?;
        if *stale {
            self.upload_dead(0, self.dead.words().len())?;
            *stale = false;
        }
        Ok(())
    }

    /// Forgets the device copy of inverted lists: their slots no longer name these rows.
    fn drop_lists(&self) {
        if let Ok(mut cache) = self.lists_cache.lock() {
            *cache = None;
        }
        if let Ok(mut cache) = self.codes_cache.lock() {
            *cache = None;
        }
    }
}

impl<D: Driver> GpuRows<D> {
    /// `buffer` as this engine's, where this store's searches can write into it: on this
    /// store's device, or on one it copies into directly.
    fn merge_target<'b>(
        &self,
        buffer: &'b dyn crate::backend::MergeBuffer,
    ) -> Option<&'b super::merge::GpuMergeBuffer<D>> {
        let target = buffer.as_any().downcast_ref::<super::merge::GpuMergeBuffer<D>>()?;
        (Arc::ptr_eq(&target.device, &self.device) || self.driver().peer_access(&target.device.driver))
            .then_some(target)
    }
}

impl<D: Driver> RowStore for GpuRows<D> {
    fn len(&self) -> usize {
        self.len
    }

    fn reserve(&mut self, additional: usize) -> Result<()> {
        // Kernels index slots and counts in 32 bits with headroom for grid-stride loops.
        if self.len.saturating_add(additional) > i32::MAX as usize {
            return Err(HiveGpuError::InvalidArgument(format!(
                "a GPU collection holds at most {} vectors ({} present, {additional} more asked)",
                i32::MAX,
                self.len
            )));
        }
        self.ensure_capacity(self.len + additional)
    }

    fn append(&mut self, rows: &[f32]) -> Result<()> {
        crate::exact::elements::check_storable(rows, self.precision)?;
        if !rows.len().is_multiple_of(self.dim) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "append needs whole {}-dimensional rows ({} values)",
                self.dim,
                rows.len()
            )));
        }
        let count = rows.len() / self.dim;
        if count == 0 {
            return Ok(());
        }
        self.reserve(count)?;
        let first = self.len;
        self.upload_rows(first, Source::Values(rows))?;
        self.len += count;
        Ok(())
    }

    fn append_stored(&mut self, bytes: &[u8], precision: StoragePrecision, dim: usize) -> Result<()> {
        if precision != self.precision || dim != self.dim || cfg!(target_endian = "big") {
            return crate::backend::append_widened(self, bytes, precision, dim);
        }
        let row_bytes = self.row_bytes();
        if !bytes.len().is_multiple_of(row_bytes) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{} bytes are not whole stored rows of dimension {dim}",
                bytes.len()
            )));
        }
        let count = bytes.len() / row_bytes;
        if count == 0 {
            return Ok(());
        }
        self.reserve(count)?;
        let first = self.len;
        self.upload_rows(first, Source::Stored(bytes))?;
        self.len += count;
        Ok(())
    }

    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        self.touch();
        self.len = len;
        // Slots past `len` were appended by the batch being rolled back and never removed, so
        // their bits are clear on both sides; should one be set, the device copy is refreshed
        // before the next search.
        let before = self.dead.count();
        self.dead.clear_from(len);
        if self.dead.count() != before {
            self.mark_dead_stale();
        }
    }

    fn tombstone(&mut self, slots: &[usize]) {
        self.touch();
        let (mut lo, mut hi) = (usize::MAX, 0);
        for &slot in slots {
            if slot < self.len && self.dead.set(slot, true) {
                lo = lo.min(slot / 32);
                hi = hi.max(slot / 32 + 1);
            }
        }
        // The trait's tombstone cannot fail; a failed upload leaves the device bitmap stale,
        // so the next search re-uploads it whole.
        if self.upload_dead(lo, hi).is_err() {
            self.mark_dead_stale();
        }
    }

    fn compact(&mut self, keep: &[usize]) -> Result<()> {
        if keep.windows(2).any(|w| w[0] >= w[1]) || keep.last().is_some_and(|&s| s >= self.len) {
            return Err(HiveGpuError::InvalidArgument("compact needs ascending slots in range".into()));
        }
        if self.arrays.is_none() {
            return Ok(());
        }
        let capacity = keep.len().max(1024);
        self.touch();
        self.arrays = Some(self.gather_arrays(keep, capacity, None, None)?);
        self.len = keep.len();
        self.drop_lists();
        self.dead.reset(capacity);
        if let Ok(mut stale) = self.dead_stale.lock() {
            *stale = false;
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.touch();
        self.drop_lists();
        self.arrays = None;
        self.len = 0;
        self.dead = SlotSet::default();
        self.max_sq_norm = 0.0;
        self.least_sq_norm = f32::INFINITY;
        if let Ok(mut stale) = self.dead_stale.lock() {
            *stale = false;
        }
    }

    fn read_row(&self, slot: usize) -> Result<Vec<f32>> {
        let Some(arrays) = self.arrays.as_ref().filter(|_| slot < self.len) else {
            return Err(HiveGpuError::InvalidArgument(format!("slot {slot} of {}", self.len)));
        };
        let driver = self.driver().clone();
        let row_bytes = self.row_bytes();
        let mut guard = self.maintenance()?;
        let Maintenance { stream, staging, .. } = &mut *guard;
        let buffer = staging[1].get(&driver, row_bytes)?;
        driver.download(stream, buffer, arrays.rows.ptr() + (slot * row_bytes) as u64, row_bytes)?;
        driver.synchronize(stream)?;
        let mut row = Vec::with_capacity(self.dim);
        crate::exact::elements::widen(&buffer[..row_bytes], self.precision, &mut row);
        Ok(row)
    }

    fn read_stored(
        &self,
        start: usize,
        count: usize,
        precision: StoragePrecision,
        out: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        crate::backend::check_row_range(start, count, self.len)?;
        let Some(arrays) = self.arrays.as_ref().filter(|_| count > 0) else { return Ok(()) };
        if precision != self.precision || cfg!(target_endian = "big") {
            let slots: Vec<usize> = (start..start + count).collect();
            return out(&crate::exact::elements::narrow(&self.gather(&slots)?, precision));
        }
        // The device holds the stored elements: downloaded as they are, a chunk at a time through
        // pinned memory into host buffers, by a thread of its own while the caller's `out` writes
        // the chunk before (a save is bound by the disk: the downloads and copies, about 5 ms a
        // chunk, hide behind its writes; docs/PERFORMANCE.md, persistence). Two host buffers
        // circulate between the two threads, so the chunks cost no allocation after the first.
        // `out` runs with the maintenance lock released: a save checksums in parallel there, and
        // no backend mutex may be held across parallel work (a pool worker waiting in it could
        // pick up another save of this collection, which would wait on the lock its own stack
        // holds: `crate::exec`). The downloading thread is a plain one, never a pool worker, and
        // takes the lock for one chunk at a time.
        let driver = self.driver().clone();
        let row_bytes = self.row_bytes();
        let rows_per_chunk = (UPLOAD_CHUNK_BYTES / row_bytes).max(1);
        let (filled_tx, filled_rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>>>(1);
        let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<u8>>();
        for _ in 0..2 {
            let _ = empty_tx.send(Vec::new());
        }
        std::thread::scope(|scope| {
            let downloader = std::thread::Builder::new().name("hive-gpu-save-download".into());
            let started = downloader.spawn_scoped(scope, move || {
                for first in (start..start + count).step_by(rows_per_chunk) {
                    // A closed channel means the writer stopped (its `out` failed): so do we.
                    let Ok(mut host) = empty_rx.recv() else { return };
                    let end = (first + rows_per_chunk).min(start + count);
                    let bytes = (end - first) * row_bytes;
                    let downloaded = self.maintenance().and_then(|mut guard| {
                        let Maintenance { stream, staging, .. } = &mut *guard;
                        let buffer = staging[0].get(&driver, bytes)?;
                        driver.download(
                            stream,
                            buffer,
                            arrays.rows.ptr() + (first * row_bytes) as u64,
                            bytes,
                        )?;
                        driver.synchronize(stream)?;
                        host.clear();
                        host.extend_from_slice(&buffer[..bytes]);
                        Ok(())
                    });
                    let failed = downloaded.is_err();
                    if filled_tx.send(downloaded.map(|()| host)).is_err() || failed {
                        return;
                    }
                }
            });
            if let Err(e) = started {
                return Err(HiveGpuError::Internal(format!("no thread for a save's downloads: {e}")));
            }
            // Every chunk arrives in order, until the downloader is done (its sender dropped)
            // or the first error. The receiving ends move into `write` and are dropped when it
            // returns, early or not: a downloader waiting for a buffer or a free place then
            // sees a closed channel and stops, so the scope's join cannot wait for ever.
            let mut write = move || -> Result<()> {
                for chunk in filled_rx.iter() {
                    let chunk = chunk?;
                    out(&chunk)?;
                    let _ = empty_tx.send(chunk);
                }
                Ok(())
            };
            write()
        })
    }

    fn memory_bytes(&self) -> usize {
        let lists = self.lists_cache.lock().ok().and_then(|c| c.as_ref().map(|l| l.bytes())).unwrap_or(0)
            + self.codes_cache.lock().ok().and_then(|c| c.as_ref().map(|l| l.bytes())).unwrap_or(0);
        self.arrays.as_ref().map_or(0, |a| a.rows.bytes() + a.norms.bytes() + a.dead.bytes()) + lists
    }

    fn knn(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.refresh_dead()?;
        self.search(queries, k, metric, allowed)
    }

    fn scan_lists(
        &self,
        queries: &[f32],
        probes: &crate::backend::ListProbes<'_>,
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.scan_lists_on_device(queries, probes, k, metric, allowed)
    }

    fn scan_codes(&self, scan: &crate::backend::CodeScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        self.scan_codes_on_device(scan, k, None)
    }

    fn scan_pq(&self, scan: &crate::backend::PqScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        self.scan_pq_on_device(scan, k, None)
    }

    fn scan_bits(&self, scan: &crate::backend::BitScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        self.scan_bits_on_device(scan, k, None)
    }

    fn scan_and_refine(
        &self,
        scan: crate::backend::QuantizedScan<'_>,
        wanted: usize,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let refine = Some(super::codes::RefineAfter { queries, k, metric });
        match scan {
            crate::backend::QuantizedScan::Sq8(scan) => self.scan_codes_on_device(&scan, wanted, refine),
            crate::backend::QuantizedScan::Pq(scan) => self.scan_pq_on_device(&scan, wanted, refine),
            crate::backend::QuantizedScan::Bits(scan) => self.scan_bits_on_device(&scan, wanted, refine),
        }
    }

    fn nearest_rows(&self, points: &[f32]) -> Result<Vec<usize>> {
        self.nearest_on_device(points)
    }

    fn gather(&self, slots: &[usize]) -> Result<Vec<f32>> {
        self.gather_rows(slots)
    }

    fn refine(
        &self,
        queries: &[f32],
        candidates: &crate::backend::Candidates,
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.refine_lists(queries, candidates, k, metric)
    }

    fn select_k(&self, scores: &[f32], width: usize, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        self.select_rows(scores, width, k)
    }

    fn merge_buffer(
        &self,
        queries: usize,
        lists: usize,
        width: usize,
        k: usize,
    ) -> Result<Option<Box<dyn crate::backend::MergeBuffer>>> {
        if lists > super::kernels::MERGE_LISTS {
            return Ok(None);
        }
        match super::merge::GpuMergeBuffer::new(&self.device, queries, lists, width, k) {
            Ok(buffer) => Ok(Some(Box::new(buffer))),
            // No room for it, or a batch past what one buffer indexes: the host merges.
            Err(HiveGpuError::VramLimitExceeded { .. } | HiveGpuError::InvalidArgument(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn can_write_into(&self, buffer: &dyn crate::backend::MergeBuffer) -> bool {
        self.merge_target(buffer).is_some()
    }

    fn knn_into(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
        buffer: &dyn crate::backend::MergeBuffer,
        list: usize,
        first_query: usize,
    ) -> Result<()> {
        let target = self.merge_target(buffer).ok_or_else(|| {
            HiveGpuError::Internal("a search was asked to write into a merge buffer it cannot reach".into())
        })?;
        self.refresh_dead()?;
        let sink = super::search::Sink { target, list, first_query };
        self.search_with(queries, k, metric, allowed, Some(&sink)).map(drop)
    }

    fn release_scratch(&self) {
        if let Ok(mut pool) = self.pool.lock() {
            pool.clear();
        }
        super::merge::release(&self.device);
        // The device copy of an index's lists is a cache too: the next list scan uploads it.
        self.drop_lists();
        // So is a batch filter's gather: the next batch of that filter gathers again.
        *self.gather_cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    fn release_filter_copies(&self, filter: u64) {
        // Only the copy of that filter: a prepared filter's copy stays through one-off searches.
        let mut cache = self.gather_cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.as_ref().is_some_and(|g| g.key.0 == filter) {
            *cache = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_norm_bounds_hold_every_f32_sum_a_device_may_compute_between_them() {
        // Rows whose squares span many exponents, so that f32 sums in any order round; each
        // order's sum must stay under the bound (it is what every gate over the rows rests on)
        // and over the floor (cosine's rounded filter divides by it), and so must the f64 sum.
        let mut state = 12345u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2f32.powi((state % 13) as i32 - 6)
        };
        for precision in StoragePrecision::ALL {
            for dim in [1, 3, 19, 128, 1000] {
                let values: Vec<f32> = (0..dim * 5).map(|_| next() * 100.0).collect();
                let values: Vec<f32> = match precision {
                    StoragePrecision::I8 | StoragePrecision::U8 => {
                        values.iter().map(|v| v.abs().clamp(0.0, 127.0).round()).collect()
                    }
                    _ => values,
                };
                let mut stored = vec![0u8; values.len() * precision.element_bytes()];
                crate::exact::elements::narrow_into(&values, precision, &mut stored);
                let (floor, bound) = stored_sq_norm_bounds(&stored, precision, dim);
                let mut widened = Vec::new();
                crate::exact::elements::widen(&stored, precision, &mut widened);
                for row in widened.chunks_exact(dim) {
                    let forward: f32 = row.iter().map(|v| v * v).sum();
                    let backward: f32 = row.iter().rev().map(|v| v * v).sum();
                    let mut sorted: Vec<f32> = row.iter().map(|v| v * v).collect();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    let largest_first: f32 = sorted.iter().sum();
                    for sum in [forward, backward, largest_first] {
                        assert!(sum <= bound, "{precision:?} dim {dim}: {sum} over {bound}");
                        assert!(sum >= floor, "{precision:?} dim {dim}: {sum} under {floor}");
                    }
                    let exact = crate::exact::squared_norm_f64(row);
                    assert!(exact >= f64::from(floor), "{precision:?} dim {dim}: {exact} under {floor}");
                }
                // Not merely 0: within a hair of the least row's norm.
                let least = widened
                    .chunks_exact(dim)
                    .map(crate::exact::squared_norm_f64)
                    .fold(f64::INFINITY, f64::min);
                assert!(
                    f64::from(floor) >= least * 0.999,
                    "{precision:?} dim {dim}: floor {floor}, least {least}"
                );
            }
        }
    }

    #[test]
    fn staging_holds_the_little_endian_stored_bytes_of_every_value() {
        // Several parallel tasks and a short last one, for every stored type.
        let values: Vec<f32> = (0..FILL_GRAIN * 3 + 5).map(|i| ((i % 200) as f32 - 100.0) * 0.37).collect();
        for precision in StoragePrecision::ALL {
            let values: Vec<f32> = match precision {
                // The integer types take integers in their range (the collection checks).
                StoragePrecision::I8 => values.iter().map(|x| x.round().clamp(-128.0, 127.0)).collect(),
                StoragePrecision::U8 => values.iter().map(|x| x.round().abs().min(255.0)).collect(),
                _ => values.clone(),
            };
            let mut staging = vec![0u8; values.len() * precision.element_bytes()];
            fill_staging(&mut staging, &values, precision);
            let expected: Vec<u8> = values
                .iter()
                .flat_map(|&x| match precision {
                    StoragePrecision::F32 => x.to_le_bytes().to_vec(),
                    StoragePrecision::F16 => half::f16::from_f32(x).to_le_bytes().to_vec(),
                    StoragePrecision::Bf16 => half::bf16::from_f32(x).to_le_bytes().to_vec(),
                    StoragePrecision::I8 => vec![(x as i8) as u8],
                    _ => vec![x as u8],
                })
                .collect();
            assert!(staging == expected, "{precision} staging differs");
        }
    }
}
