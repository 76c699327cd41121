//! Rows of one wgpu collection: device buffers split into chunks no larger than the adapter's
//! storage-binding limit (128 MiB on lavapipe), filled through one reusable staging buffer, a
//! tombstone bitmap on the device, and an exact host copy (the CPU backend's storage) for the
//! f64 re-rank and reads.

use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::WgpuDevice;
use super::params::{Blocks, Params, SelectState};
use crate::backend::cpu::SimdLevel;
use crate::backend::cpu::rows::CpuRows;
use crate::backend::{Neighbor, RowStore};
use crate::error::{HiveGpuError, Result};
use crate::exact::gates::{self as bounds, Approximation};
use crate::slots::{SearchMask, SlotSet};
use crate::tuning::Tuning;
use crate::types::{GpuDistanceMetric, StoragePrecision};

/// Bytes of one kernel parameter block (16 words, `Params` in `common.wgsl`).
pub(super) const PARAMS_BYTES: u64 = 64;
/// Parameter blocks sit at this alignment (the largest `min_uniform_buffer_offset_alignment`).
pub(super) const PARAMS_STRIDE: u64 = 256;
/// Workgroups per dispatch dimension allowed by every adapter.
pub(super) const MAX_GROUPS: usize = 65_535;
/// Workgroups per selection dispatch over all the queries of a tile.
pub(super) const SELECT_GROUPS: usize = 16_384;
/// Rows per workgroup of `scan_select` (`SELECT_ROWS` in `search.wgsl`).
const SELECT_ROWS: usize = 2048;
/// The largest k single queries select with `scan_select` lists; larger k takes the radix
/// passes over every distance.
const LIST_MAX_K: usize = 256;

#[derive(Debug)]
pub(super) struct Chunk {
    pub(super) rows: wgpu::Buffer,
    pub(super) scale: wgpu::Buffer,
    pub(super) first: usize,
    capacity: usize,
}

/// Filtered batches of at least this many queries over at most half the rows search a copy of
/// the passing rows; fewer queries scan every row masked (the copy's upload would cost more).
const GATHER_MIN_QUERIES: usize = 8;

/// What cached bind groups were made for: the buffers' generation, and the skip words of a
/// filtered search (0 for the removed-row bitmap).
pub(super) type GroupsKey = (u64, u64);

/// A filtered search's skip words on the device, with an id no other search's words share.
#[derive(Debug)]
pub(super) struct Skip {
    pub(super) buffer: wgpu::Buffer,
    pub(super) id: u64,
}

/// Per-search buffers, grown on demand and reused; the bind groups over them are rebuilt only
/// when a buffer or the row chunks change.
#[derive(Debug, Default)]
pub(super) struct Work {
    /// The buffers every search path uses (`ensure_shared`).
    pub(super) shared: SharedBuffers,
    queries: Option<wgpu::Buffer>,
    groups: Option<(GroupsKey, Vec<wgpu::BindGroup>, wgpu::BindGroup)>,
    /// The filter path's f16 queries (`filter.rs`).
    pub(super) half_queries: Option<wgpu::Buffer>,
    /// The filter's bind groups: one per chunk, and the selection's.
    pub(super) filter_groups: Option<(GroupsKey, Vec<wgpu::BindGroup>, wgpu::BindGroup)>,
    pub(super) generation: u64,
}

/// The buffers of [`Work`] that the plain and the filter paths share, apart from the paths' own
/// (query) buffers, so that their references borrow only this part of the workspace.
#[derive(Debug, Default)]
pub(super) struct SharedBuffers {
    params: Option<wgpu::Buffer>,
    dist: Option<wgpu::Buffer>,
    state: Option<wgpu::Buffer>,
    hist: Option<wgpu::Buffer>,
    cand: Option<wgpu::Buffer>,
    gate: Option<wgpu::Buffer>,
    readback: Option<wgpu::Buffer>,
}

/// The shared buffers of a workspace once [`WgpuRows::ensure_shared`] has sized them.
pub(super) struct Shared<'a> {
    pub(super) params: &'a wgpu::Buffer,
    pub(super) dist: &'a wgpu::Buffer,
    pub(super) state: &'a wgpu::Buffer,
    pub(super) hist: &'a wgpu::Buffer,
    pub(super) cand: &'a wgpu::Buffer,
    pub(super) gate: &'a wgpu::Buffer,
    pub(super) readback: &'a wgpu::Buffer,
}

/// A collection's rows on a wgpu device.
#[derive(Debug)]
pub(crate) struct WgpuRows {
    pub(super) device: Arc<WgpuDevice>,
    pub(super) host: CpuRows,
    pub(super) dim: usize,
    pub(super) precision: StoragePrecision,
    pub(super) rows_per_chunk: usize,
    pub(super) chunks: Vec<Chunk>,
    pub(super) dead: Option<wgpu::Buffer>,
    /// Bumped whenever a device buffer of the rows is replaced.
    pub(super) chunks_generation: u64,
    /// At least the largest `1 / |x|` of any stored row (bounds cosine with f16 flushing).
    pub(super) max_inv_norm: f32,
    /// Set when the device copy may lag the host (a failed upload): the next search re-uploads
    /// everything first.
    stale: bool,
    /// The knobs of the context that created the collection.
    pub(super) tuning: Tuning,
    pub(super) work: Mutex<Work>,
}

/// The f64 norm of a query.
pub(super) fn norm(q: &[f32]) -> f64 {
    q.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt()
}

/// A query as the kernels see it: unit for cosine (divided in f64, rounded once), else itself.
pub(super) fn kernel_query(q: &[f32], metric: GpuDistanceMetric) -> std::borrow::Cow<'_, [f32]> {
    if metric == GpuDistanceMetric::Cosine {
        let n = norm(q);
        std::borrow::Cow::Owned(q.iter().map(|&x| (f64::from(x) / n) as f32).collect())
    } else {
        std::borrow::Cow::Borrowed(q)
    }
}

fn buffer_len(buffer: &Option<wgpu::Buffer>) -> u64 {
    buffer.as_ref().map_or(0, |b| b.size())
}

impl WgpuRows {
    pub(super) fn new(
        device: Arc<WgpuDevice>,
        dim: usize,
        precision: StoragePrecision,
        tuning: Tuning,
    ) -> Result<Self> {
        let element = precision.element_bytes();
        let binding =
            device.limits.max_storage_buffer_binding_size.min(device.limits.max_buffer_size) as usize;
        if dim.saturating_mul(element).saturating_add(16) > binding {
            return Err(HiveGpuError::InvalidArgument(format!(
                "dimension {dim} is too large for this adapter: one row needs {} bytes, one binding holds {binding}",
                dim * element
            )));
        }
        // Room to round a chunk up to whole 16-byte vectors, and few enough rows for one dispatch.
        let rows_per_chunk = ((binding - 16) / (dim * element)).clamp(1, MAX_GROUPS * 16);
        Ok(Self {
            device,
            host: CpuRows::new(dim, precision, SimdLevel::detect())
                .with_bf16_min_rows(tuning.cpu_bf16_min_rows)
                .with_here_products(tuning.cpu_here_products),
            dim,
            precision,
            rows_per_chunk,
            chunks: Vec::new(),
            dead: None,
            chunks_generation: 0,
            max_inv_norm: 0.0,
            stale: false,
            work: Mutex::new(Work::default()),
            tuning,
        })
    }

    fn create_buffer(&self, label: &str, size: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer> {
        self.device.create_buffer(label, size, usage)
    }

    /// Stored bytes of host slots `[from, to)`; with `scales`, also each row's cosine factor
    /// `1 / |x|` (computed in f64, rounded once) from the same read.
    fn encode_rows(&mut self, from: usize, to: usize, mut scales: Option<&mut Vec<u8>>) -> Result<Vec<u8>> {
        let mut bytes = Vec::with_capacity((to - from) * self.dim * 4);
        for slot in from..to {
            let row = self.host.read_row(slot)?;
            bytes.extend_from_slice(&crate::exact::elements::narrow(&row, self.precision));
            if let Some(scales) = scales.as_deref_mut() {
                let norm = row.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
                let inv = if norm > 0.0 { (1.0 / norm) as f32 } else { 0.0 };
                self.max_inv_norm = self.max_inv_norm.max(inv * (1.0 + 1e-6));
                scales.extend(inv.to_ne_bytes());
            }
        }
        Ok(bytes)
    }

    fn write(&self, dst: &wgpu::Buffer, offset: u64, bytes: &[u8]) -> Result<()> {
        self.device.write(dst, offset, bytes)
    }

    fn row_bytes(&self) -> usize {
        self.dim * self.precision.element_bytes()
    }

    /// Device room for `total` rows: chunks grow by doubling; a regrown chunk gets the rows
    /// the host already holds for it. Fails (changing nothing the host sees) when the device
    /// lacks the memory.
    fn grow_device(&mut self, total: usize) -> Result<()> {
        let row_bytes = self.row_bytes();
        let present = self.host.len();
        for c in 0..total.div_ceil(self.rows_per_chunk) {
            let first = c * self.rows_per_chunk;
            let needed = (total - first).min(self.rows_per_chunk);
            if self.chunks.get(c).is_some_and(|chunk| chunk.capacity >= needed) {
                continue;
            }
            // At least 256 rows where a chunk holds that many; very wide rows (past 2^17 f32
            // components on a 128 MiB binding) hold fewer, and `clamp` would panic on them.
            let capacity = needed.next_power_of_two().max(256).min(self.rows_per_chunk);
            let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
            // Whole 16-byte vectors: the kernels bind rows as vectors of 4 components.
            let rows =
                self.create_buffer("rows", (capacity * row_bytes).next_multiple_of(16) as u64, usage)?;
            let scale = self.create_buffer("scale", (capacity * 4) as u64, usage)?;
            let chunk = Chunk { rows, scale, first, capacity };
            if c < self.chunks.len() {
                self.chunks[c] = chunk;
            } else {
                self.chunks.push(chunk);
            }
            self.chunks_generation += 1;
            let held = present.saturating_sub(first).min(self.rows_per_chunk);
            self.upload(first, first + held)?;
        }
        Ok(())
    }

    /// Copies host slots `[from, to)` (and their cosine scales) to the device.
    fn upload(&mut self, from: usize, to: usize) -> Result<()> {
        let row_bytes = self.row_bytes();
        let mut slot = from;
        while slot < to {
            let c = slot / self.rows_per_chunk;
            let first = c * self.rows_per_chunk;
            let end = to.min(first + self.rows_per_chunk);
            let mut scales = Vec::with_capacity((end - slot) * 4);
            let mut bytes = self.encode_rows(slot, end, Some(&mut scales))?;
            let Some((rows, scale)) =
                self.chunks.get(c).map(|chunk| (chunk.rows.clone(), chunk.scale.clone()))
            else {
                return Err(HiveGpuError::Internal(format!("no device chunk for slot {slot}")));
            };
            let mut offset = ((slot - first) * row_bytes) as u64;
            // Copies need 4-byte multiples: packed 2- and 1-byte rows may start or end mid-word,
            // and the neighbouring rows' bytes (re-encoded from the host) complete the words.
            let lead = (offset % 4) as usize;
            if lead > 0 {
                // The rows of this chunk from the one holding the word's first byte.
                let from = first + (offset as usize - lead) / row_bytes;
                let previous = self.encode_rows(from, slot, None)?;
                bytes.splice(0..0, previous[previous.len() - lead..].iter().copied());
                offset -= lead as u64;
            }
            let tail = (4 - bytes.len() % 4) % 4;
            if tail > 0 {
                // Up to 3 bytes from the next rows of this chunk, zeros past its stored rows.
                let next_end = (end + tail).min(self.host.len()).min(first + self.rows_per_chunk);
                let mut next =
                    if end < next_end { self.encode_rows(end, next_end, None)? } else { Vec::new() };
                next.resize(tail.max(next.len()), 0);
                bytes.extend_from_slice(&next[..tail]);
            }
            self.write(&rows, offset, &bytes)?;
            self.write(&scale, ((slot - first) * 4) as u64, &scales)?;
            slot = end;
        }
        Ok(())
    }

    /// Copies the host's tombstone words `words` (clamped to the bitmap) to the device; all
    /// of them when the device buffer had to be (re)created.
    fn sync_dead(&mut self, words: std::ops::Range<usize>) -> Result<()> {
        let needed = SlotSet::words_for(self.host.len()).max(1);
        let mut words = words;
        if buffer_len(&self.dead) < (needed * 4) as u64 {
            let size = (needed * 4).next_power_of_two() as u64;
            self.dead = Some(self.create_buffer(
                "dead",
                size,
                wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            )?);
            self.chunks_generation += 1;
            words = 0..needed;
        }
        let Some(dead) = self.dead.clone() else { return Ok(()) };
        let host = self.host.removed().words();
        let end = words.end.min(needed);
        if words.start >= end {
            return Ok(());
        }
        // Words the host bitmap does not cover yet are all live.
        let bytes: Vec<u8> =
            (words.start..end).flat_map(|w| host.get(w).copied().unwrap_or(0).to_ne_bytes()).collect();
        self.write(&dead, (words.start * 4) as u64, &bytes)
    }

    /// Every tombstone word.
    fn all_dead_words(&self) -> std::ops::Range<usize> {
        0..SlotSet::words_for(self.host.len()).max(1)
    }

    /// Re-uploads every row and the bitmap after a failed upload.
    fn resync(&mut self) -> Result<()> {
        if self.stale {
            self.upload(0, self.host.len())?;
            self.sync_dead(self.all_dead_words())?;
            self.stale = false;
        }
        Ok(())
    }

    pub(super) fn ensure(
        &self,
        slot: &mut Option<wgpu::Buffer>,
        generation: &mut u64,
        label: &str,
        bytes: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<()> {
        if buffer_len(slot) < bytes {
            // Grown by doubling, but never past what one binding may cover.
            let limit =
                self.device.limits.max_storage_buffer_binding_size.min(self.device.limits.max_buffer_size);
            let size = bytes.next_power_of_two().min(limit).max(bytes);
            *slot = None;
            *slot = Some(self.create_buffer(label, size, usage)?);
            *generation += 1;
        }
        Ok(())
    }

    /// The error-band gate of one query (the kernels' f32 sums, see `gpu::bounds`), widened for
    /// adapters that flush f16 subnormals to zero when unpacking.
    fn gate(&self, metric: GpuDistanceMetric, q: &[f32]) -> [f32; 2] {
        let q_norm = norm(q);
        let (mul, add) = bounds::gate(
            metric,
            Approximation::Scan,
            q_norm,
            f64::from(self.host.max_squared_norm()),
            self.dim,
        );
        let mut add = f64::from(add);
        if self.precision == StoragePrecision::F16 {
            let flush = 2f64.powi(-14);
            let mut extra = self.flush_extra(metric, q_norm, flush);
            if metric == GpuDistanceMetric::Euclidean {
                // The scan's differences square the flushed components too.
                extra += self.dim as f64 * flush * flush;
            }
            add += 2.0 * extra * 1.01;
        }
        [mul, (add * (1.0 + 1e-6)) as f32]
    }

    /// The error a product of the query (of norm `q_norm`, as the kernels see it) with a row
    /// gains from the row's components flushed to zero below `flush` (in the rows' units), in
    /// the metric's distance.
    pub(super) fn flush_extra(&self, metric: GpuDistanceMetric, q_norm: f64, flush: f64) -> f64 {
        let d = self.dim as f64;
        match metric {
            GpuDistanceMetric::Euclidean => 2.0 * flush * d.sqrt() * q_norm,
            GpuDistanceMetric::DotProduct => flush * d.sqrt() * q_norm,
            GpuDistanceMetric::Cosine => flush * d.sqrt() * q_norm * f64::from(self.max_inv_norm),
            // Each flushed component moves one difference by at most `flush`.
            GpuDistanceMetric::Manhattan => flush * d,
            GpuDistanceMetric::Chebyshev => flush,
        }
    }

    fn search(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let (dim, len) = (self.dim, self.host.len());
        let mask = SearchMask::new(self.host.removed(), len, allowed);
        let live = mask.live;
        if k == 0 || k > live || queries.is_empty() || !queries.len().is_multiple_of(dim) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "knn needs 1 <= k <= {live} live rows (k = {k}) and whole {dim}-dimensional queries ({} values)",
                queries.len()
            )));
        }
        let nq = queries.len() / dim;
        // A batch over at most half the rows: those rows alone, uploaded into rows of their own.
        // A masked batch under half the rows has no sample for the filter and takes the plain
        // tiles over every row (on the H100, 10,000 queries over 1M x 128 with a tenth passing:
        // 331 ms, against 61 ms unfiltered; docs/PERFORMANCE.md, filtered search).
        if mask.filtered && nq >= GATHER_MIN_QUERIES && live.saturating_mul(2) <= len {
            return self.search_gathered(queries, k, metric, &mask.kept(len));
        }
        let skip = self.skip_buffer(&mask)?;
        let skip = skip.as_ref();
        let cap = (k + (k / 4).max(64)).next_power_of_two().min(len);
        let binding =
            self.device.limits.max_storage_buffer_binding_size.min(self.device.limits.max_buffer_size);
        let plain_tile = ((binding as usize) / (len * 4)).clamp(1, 256).min(nq).min(MAX_GROUPS);
        let plan = self.filter_plan(nq, k, live, metric);
        let tile = plan.map_or(plain_tile, |plan| plan.tile);
        let mut results = Vec::with_capacity(nq);
        // With HIVE_GPU_PROFILE=1: wall time on the device's side (submit to results mapped)
        // against the whole search, on stderr.
        let profile = crate::backend::profiling();
        let began = std::time::Instant::now();
        let mut device_time = std::time::Duration::ZERO;
        let mut retried = 0;
        for q0 in (0..nq).step_by(tile) {
            let t = tile.min(nq - q0);
            let block = &queries[q0 * dim..(q0 + t) * dim];
            let started = std::time::Instant::now();
            let candidates = match &plan {
                Some(plan) => {
                    // The filter is a shortcut: a driver error in it (not a lack of memory,
                    // which the caller handles) sends the tile down the plain path.
                    let mut found = match self.filter_candidates(plan, block, t, k, metric, skip) {
                        Err(HiveGpuError::VulkanError(_)) => vec![None; t],
                        other => other?,
                    };
                    retried += self.retry_plain(&mut found, block, k, cap, metric, plain_tile, skip)?;
                    found
                }
                None => self.candidates(block, t, k, cap, metric, skip)?,
            };
            device_time += started.elapsed();
            // On the library's pool (`crate::exec`): the caller may hold a collection's lock.
            let ranked: Vec<Vec<Neighbor>> = crate::exec::run(|| {
                candidates
                    .into_par_iter()
                    .enumerate()
                    .map(|(i, found)| {
                        let q = &block[i * dim..(i + 1) * dim];
                        Ok(match found {
                            Some(slots) => self.host.rerank(q, &slots, k, metric),
                            // The band held more rows than the buffer: the exact host search.
                            None => self.host.knn(q, k, metric, allowed)?.pop().unwrap_or_default(),
                        })
                    })
                    .collect::<Result<_>>()
            })??;
            results.extend(ranked);
        }
        if profile {
            eprintln!(
                "hive-gpu profile (wgpu nq {nq} k {k}, tiles of {tile}, filter {}, retried {retried}, ms): \
                 candidates {:.3}, total {:.3}",
                plan.is_some(),
                device_time.as_secs_f64() * 1e3,
                began.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(results)
    }

    /// The exact k nearest of the rows `passing` (ascending) for each query: those rows are
    /// copied from the host copy into new rows on the device and searched there, their slots
    /// mapped back (ties still go to the lower slot).
    fn search_gathered(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        passing: &[usize],
    ) -> Result<Vec<Vec<Neighbor>>> {
        let values = self.host.values_of(passing)?;
        let mut gathered = WgpuRows::new(self.device.clone(), self.dim, self.precision, self.tuning.clone())?;
        gathered.append(&values)?;
        drop(values);
        Ok(crate::backend::ungather(gathered.knn(queries, k, metric, None)?, passing))
    }

    /// A filtered search's skip words on the device (None for an unfiltered search, which
    /// reads the removed-row bitmap): written once per search, bound in place of that bitmap.
    fn skip_buffer(&self, mask: &SearchMask<'_>) -> Result<Option<Skip>> {
        if !mask.filtered {
            return Ok(None);
        }
        let words = mask.skip.words();
        let bytes: &[u8] = if words.is_empty() { &[0; 4] } else { bytemuck::cast_slice(words) };
        let buffer = self.create_buffer(
            "skip",
            bytes.len() as u64,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        )?;
        self.write(&buffer, 0, bytes)?;
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Some(Skip { buffer, id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed) }))
    }

    /// Searches the queries the filter left unproven (None) again on the plain path, in tiles
    /// of `tile`; returns how many there were.
    #[allow(clippy::too_many_arguments)]
    fn retry_plain(
        &self,
        found: &mut [Option<Vec<usize>>],
        block: &[f32],
        k: usize,
        cap: usize,
        metric: GpuDistanceMetric,
        tile: usize,
        skip: Option<&Skip>,
    ) -> Result<usize> {
        let dim = self.dim;
        let failed: Vec<usize> = (0..found.len()).filter(|&i| found[i].is_none()).collect();
        for group in failed.chunks(tile) {
            let queries: Vec<f32> =
                group.iter().flat_map(|&i| block[i * dim..(i + 1) * dim].iter().copied()).collect();
            let again = self.candidates(&queries, group.len(), k, cap, metric, skip)?;
            for (&i, slots) in group.iter().zip(again) {
                found[i] = slots;
            }
        }
        Ok(failed.len())
    }

    /// Candidate slots of each query of a tile (None where the band overflowed `cap`).
    fn candidates(
        &self,
        block: &[f32],
        t: usize,
        k: usize,
        cap: usize,
        metric: GpuDistanceMetric,
        skip: Option<&Skip>,
    ) -> Result<Vec<Option<Vec<usize>>>> {
        let (dim, len) = (self.dim, self.host.len());
        let device = &self.device;
        let mut guard =
            self.work.lock().map_err(|_| HiveGpuError::Internal("wgpu workspace poisoned".into()))?;
        let work = &mut *guard;
        let storage =
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        // Parameter blocks: one per row chunk, four radix passes, and the collect or merge.
        let dispatches = self.chunks.len() + 5;
        // Single queries: per-workgroup lists (see `scan_select`), laid out in `dist`.
        let lists = (t == 1 && k <= LIST_MAX_K).then(|| {
            let list_cap = cap.min(SELECT_ROWS);
            let per_chunk: Vec<usize> = self
                .chunks
                .iter()
                .map(|c| len.saturating_sub(c.first).min(self.rows_per_chunk).div_ceil(SELECT_ROWS))
                .collect();
            (list_cap, 1 + 2 * list_cap, per_chunk)
        });
        let dist_words = match &lists {
            Some((_, words, per_chunk)) => (t * len).max(words * per_chunk.iter().sum::<usize>()),
            None => t * len,
        };
        let mut generation = work.generation;
        self.ensure(&mut work.queries, &mut generation, "queries", (t * dim * 4) as u64, storage)?;
        let Shared { params, dist, state, hist, cand, gate, readback } =
            self.ensure_shared(&mut work.shared, &mut generation, t, cap, dispatches, dist_words)?;
        work.generation = generation;
        let key = (generation ^ (self.chunks_generation << 32), skip.map_or(0, |s| s.id));
        let missing = |name: &str| HiveGpuError::Internal(format!("wgpu buffer {name} missing"));
        let queries = work.queries.as_ref().ok_or_else(|| missing("queries"))?;
        let dead = match skip {
            Some(skip) => &skip.buffer,
            None => self.dead.as_ref().ok_or_else(|| missing("dead"))?,
        };
        // Everything the search creates or submits reports its validation errors here.
        let scope = device.device.push_error_scope(wgpu::ErrorFilter::Validation);
        if work.groups.as_ref().is_none_or(|(k0, _, _)| *k0 != key) {
            let params_binding = |_: ()| {
                wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: params,
                    offset: 0,
                    size: std::num::NonZeroU64::new(PARAMS_BYTES),
                })
            };
            let search_groups = self
                .chunks
                .iter()
                .map(|chunk| {
                    device.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("search"),
                        layout: &device.kernels.search_layout,
                        entries: &[
                            wgpu::BindGroupEntry { binding: 0, resource: params_binding(()) },
                            wgpu::BindGroupEntry { binding: 1, resource: chunk.rows.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 2, resource: chunk.scale.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 3, resource: dead.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 4, resource: queries.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 5, resource: dist.as_entire_binding() },
                        ],
                    })
                })
                .collect();
            let select_group = self.select_group("select", params, [dist, state, hist, cand, gate]);
            work.groups = Some((key, search_groups, select_group));
        }
        let Some((_, search_groups, select_group)) = &work.groups else {
            return Err(missing("bind groups"));
        };

        // Inputs: kernel queries (unit for cosine), gates, state {0, 0, k, 0}, parameters.
        let mut kernel_queries = Vec::with_capacity(t * dim * 4);
        let mut gates = Vec::with_capacity(t * 8);
        let mut first_gate = [0f32; 2];
        for q in block.chunks_exact(dim) {
            let q_kernel = kernel_query(q, metric);
            kernel_queries.extend(q_kernel.iter().flat_map(|x| x.to_ne_bytes()));
            let gate = self.gate(metric, &q_kernel);
            if gates.is_empty() {
                first_gate = gate;
            }
            gates.extend(gate.iter().flat_map(|x| x.to_ne_bytes()));
        }
        let states = vec![SelectState::start(k); t];
        // Every dispatch's block shares the query tile's shape and metric.
        let tile = Params {
            dim: dim as u32,
            nq: t as u32,
            metric: crate::exact::metric_code(metric) as u32,
            stride: len as u32,
            cap: cap as u32,
            ..Params::default()
        };
        // Single-query lists: k, the dispatch's first list, words per list, lists in all, the
        // query's band and a list's capacity.
        let [gate_mul, gate_add] = first_gate;
        let with_lists = |block: Params, list_base: usize| match &lists {
            Some((list_cap, words, per_chunk)) => Params {
                k: k as u32,
                list_base: list_base as u32,
                list_words: *words as u32,
                lists: per_chunk.iter().sum::<usize>() as u32,
                gate_mul,
                gate_add,
                list_cap: *list_cap as u32,
                ..block
            },
            None => block,
        };
        let list_bases: Vec<usize> = match &lists {
            Some((_, _, per_chunk)) => per_chunk
                .iter()
                .scan(0, |total, &n| {
                    let base = *total;
                    *total += n;
                    Some(base)
                })
                .collect(),
            None => vec![0; self.chunks.len()],
        };
        let mut blocks = Blocks::default();
        let chunk_offsets: Vec<u32> = self
            .chunks
            .iter()
            .zip(&list_bases)
            .map(|(c, &base)| {
                let rows = len.saturating_sub(c.first).min(self.rows_per_chunk);
                let chunk = Params { n_rows: rows as u32, row_offset: c.first as u32, ..tile };
                blocks.push(with_lists(chunk, base), PARAMS_STRIDE)
            })
            .collect();
        let all_rows = Params { n_rows: len as u32, ..tile };
        let radix_offsets: Vec<u32> = [24u32, 16, 8, 0]
            .iter()
            .map(|&shift| blocks.push(Params { shift, ..all_rows }, PARAMS_STRIDE))
            .collect();
        let collect_offset = blocks.push(with_lists(all_rows, 0), PARAMS_STRIDE);
        // One workgroup (or row of workgroups) per query of the tile.
        let tq = t as u32;
        let queue = &device.queue;
        queue.write_buffer(params, 0, blocks.bytes());
        queue.write_buffer(queries, 0, &kernel_queries);
        queue.write_buffer(gate, 0, &gates);
        queue.write_buffer(state, 0, bytemuck::cast_slice(&states));

        let mut encoder =
            device.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("knn") });
        encoder.clear_buffer(hist, 0, Some((t * 256 * 4) as u64));
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("knn"),
                timestamp_writes: None,
            });
            let pipelines = device.row_pipelines(self.precision);
            for ((chunk, group), &offset) in self.chunks.iter().zip(search_groups).zip(&chunk_offsets) {
                // Reserved chunks beyond the stored rows hold nothing yet.
                let rows_here = len.saturating_sub(chunk.first).min(self.rows_per_chunk);
                if rows_here == 0 {
                    continue;
                }
                pass.set_bind_group(0, group, &[offset]);
                if lists.is_some() {
                    let wide = pipelines
                        .scan_select_wide
                        .as_ref()
                        .filter(|_| dim.is_multiple_of(4) && self.tuning.wgpu_subgroups);
                    pass.set_pipeline(wide.unwrap_or(&pipelines.scan_select));
                    pass.dispatch_workgroups(rows_here.div_ceil(SELECT_ROWS) as u32, 1, 1);
                } else if t == 1 {
                    pass.set_pipeline(&pipelines.scan);
                    pass.dispatch_workgroups(rows_here.div_ceil(256) as u32, 1, 1);
                } else {
                    pass.set_pipeline(&pipelines.distances);
                    pass.dispatch_workgroups(rows_here.div_ceil(128) as u32, t.div_ceil(64) as u32, 1);
                }
            }
            // Enough workgroups in all to fill any device, each looping over many rows: one
            // workgroup per 256 rows of every query would spend its time clearing and
            // flushing its histogram.
            let groups_x = len.div_ceil(256).min(MAX_GROUPS).min((SELECT_GROUPS / t).max(1)) as u32;
            if lists.is_some() {
                pass.set_bind_group(0, select_group, &[collect_offset]);
                pass.set_pipeline(&device.kernels.merge_lists);
                pass.dispatch_workgroups(1, 1, 1);
            }
            for &offset in radix_offsets.iter().filter(|_| lists.is_none()) {
                pass.set_bind_group(0, select_group, &[offset]);
                pass.set_pipeline(&device.kernels.radix_hist);
                pass.dispatch_workgroups(groups_x, tq, 1);
                pass.set_pipeline(&device.kernels.radix_pick);
                pass.dispatch_workgroups(tq, 1, 1);
            }
            if lists.is_none() {
                pass.set_bind_group(0, select_group, &[collect_offset]);
                pass.set_pipeline(&device.kernels.collect);
                pass.dispatch_workgroups(groups_x, tq, 1);
            }
        }
        let outcome = self.read_candidates(encoder, state, cand, readback, t, k, cap);
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(HiveGpuError::VulkanError(format!("search: {error}")));
        }
        device.take_error("search")?;
        outcome
    }

    /// Grows the buffers every search path shares to a tile of `t` queries: `dispatches`
    /// parameter blocks, `dist_words` words of distances (or lists), and per query a state, a
    /// histogram, `cap` candidates, a gate and their readback. Returns them.
    pub(super) fn ensure_shared<'a>(
        &self,
        buffers: &'a mut SharedBuffers,
        generation: &mut u64,
        t: usize,
        cap: usize,
        dispatches: usize,
        dist_words: usize,
    ) -> Result<Shared<'a>> {
        let storage =
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        let uniform = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
        let b = buffers;
        self.ensure(&mut b.params, generation, "params", dispatches as u64 * PARAMS_STRIDE, uniform)?;
        self.ensure(&mut b.dist, generation, "dist", (dist_words * 4) as u64, storage)?;
        self.ensure(&mut b.state, generation, "state", (t * 16) as u64, storage)?;
        self.ensure(&mut b.hist, generation, "hist", (t * 256 * 4) as u64, storage)?;
        self.ensure(&mut b.cand, generation, "cand", (t * cap * 4) as u64, storage)?;
        self.ensure(&mut b.gate, generation, "gate", (t * 8) as u64, storage)?;
        let readback = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        self.ensure(&mut b.readback, generation, "readback", (t * 16 + t * cap * 4) as u64, readback)?;
        let (Some(params), Some(dist), Some(state), Some(hist), Some(cand), Some(gate), Some(readback)) =
            (&b.params, &b.dist, &b.state, &b.hist, &b.cand, &b.gate, &b.readback)
        else {
            return Err(HiveGpuError::Internal("wgpu workspace buffers missing".into()));
        };
        Ok(Shared { params, dist, state, hist, cand, gate, readback })
    }

    /// The selection kernels' bind group over a workspace's parameters and its distances,
    /// states, histograms, candidates and gates.
    pub(super) fn select_group(
        &self,
        label: &str,
        params: &wgpu::Buffer,
        buffers: [&wgpu::Buffer; 5],
    ) -> wgpu::BindGroup {
        let params = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: params,
            offset: 0,
            size: std::num::NonZeroU64::new(PARAMS_BYTES),
        });
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: params }];
        entries.extend(
            buffers.iter().enumerate().map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.as_entire_binding(),
            }),
        );
        self.device.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &self.device.kernels.select_layout,
            entries: &entries,
        })
    }

    /// Copies each query's state and candidates to `readback` after the work in `encoder`,
    /// submits, waits and reads them: None where the count passed `cap` or fell short of k.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_candidates(
        &self,
        mut encoder: wgpu::CommandEncoder,
        state: &wgpu::Buffer,
        cand: &wgpu::Buffer,
        readback: &wgpu::Buffer,
        t: usize,
        k: usize,
        cap: usize,
    ) -> Result<Vec<Option<Vec<usize>>>> {
        let device = &self.device;
        let state_bytes = (t * std::mem::size_of::<SelectState>()) as u64;
        let cand_bytes = (t * cap * 4) as u64;
        encoder.copy_buffer_to_buffer(state, 0, readback, 0, state_bytes);
        encoder.copy_buffer_to_buffer(cand, 0, readback, state_bytes, cand_bytes);
        device.queue.submit([encoder.finish()]);
        let slice = readback.slice(0..state_bytes + cand_bytes);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        let read = || -> Result<Vec<Option<Vec<usize>>>> {
            device
                .device
                .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
                .map_err(|e| HiveGpuError::VulkanError(format!("waiting for the search: {e}")))?;
            let view = slice
                .get_mapped_range()
                .map_err(|e| HiveGpuError::VulkanError(format!("reading results: {e}")))?;
            // The queries' states, then `cap` candidate slots per query.
            let (states, slots) = view.split_at(state_bytes as usize);
            let states: Vec<SelectState> = bytemuck::pod_collect_to_vec(states);
            let slots: Vec<u32> = bytemuck::pod_collect_to_vec(slots);
            let mut out = Vec::with_capacity(t);
            for (q, state) in states.iter().enumerate() {
                let count = state.count as usize;
                if count > cap || count < k {
                    out.push(None);
                } else {
                    let found = &slots[q * cap..q * cap + count];
                    out.push(Some(found.iter().map(|&slot| slot as usize).collect()));
                }
            }
            Ok(out)
        };
        let outcome = read();
        // Unmapped on every path, so a failed search leaves the buffer usable.
        readback.unmap();
        outcome
    }
}

impl RowStore for WgpuRows {
    fn len(&self) -> usize {
        self.host.len()
    }

    fn reserve(&mut self, additional: usize) -> Result<()> {
        self.host.reserve(additional)?;
        self.grow_device(self.host.len().saturating_add(additional))
    }

    fn append(&mut self, rows: &[f32]) -> Result<()> {
        crate::exact::elements::check_storable(rows, self.precision)?;
        self.resync()?;
        let from = self.host.len();
        self.grow_device(from + rows.len() / self.dim)?;
        self.host.append(rows)?;
        let outcome = self
            .upload(from, self.host.len())
            .and_then(|()| self.sync_dead(from / 32..SlotSet::words_for(self.host.len())))
            .and_then(|()| self.device.take_error("uploading rows"));
        if outcome.is_err() {
            // Host and device stay in step: the rows the device did not take are dropped.
            self.host.truncate(from);
            self.stale = true;
        }
        outcome
    }

    fn truncate(&mut self, len: usize) {
        // The host copy is the truth searches and uploads follow: device rows past its length
        // are never read, and appends re-upload their tombstone words.
        self.host.truncate(len);
    }

    fn tombstone(&mut self, slots: &[usize]) {
        self.host.tombstone(slots);
        let lo = slots.iter().min().map_or(0, |s| s / 32);
        let hi = slots.iter().max().map_or(0, |s| s / 32 + 1);
        if self.sync_dead(lo..hi).is_err() {
            // Cannot fail here (the trait's tombstone is infallible): the next search resyncs.
            self.stale = true;
        }
    }

    fn compact(&mut self, keep: &[usize]) -> Result<()> {
        self.host.compact(keep)?;
        self.chunks.truncate(self.host.len().div_ceil(self.rows_per_chunk));
        // The host copy has changed, so the collection renumbers its ids whatever the device
        // does: a failed upload leaves the device stale, and searches answer on the host until
        // the next mutation resyncs it.
        let outcome = self.upload(0, self.host.len()).and_then(|()| self.sync_dead(self.all_dead_words()));
        self.stale = outcome.is_err();
        Ok(())
    }

    fn clear(&mut self) {
        self.host.clear();
        self.chunks.clear();
        self.stale = false;
        self.chunks_generation += 1;
        if let Ok(mut work) = self.work.lock() {
            // Drops the cached bind groups, which hold the old buffers.
            work.groups = None;
            work.filter_groups = None;
        }
    }

    fn read_row(&self, slot: usize) -> Result<Vec<f32>> {
        self.host.read_row(slot)
    }

    fn memory_bytes(&self) -> usize {
        let device: u64 =
            self.chunks.iter().map(|c| c.rows.size() + c.scale.size()).sum::<u64>() + buffer_len(&self.dead);
        device as usize
    }

    fn knn(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        crate::backend::candidates::check_finite_queries("knn", self.dim, queries)?;
        if self.stale {
            // A device copy behind the host would miss candidates: answer exactly on the host
            // until a mutation succeeds in resyncing.
            return self.host.knn(queries, k, metric, allowed);
        }
        self.search(queries, k, metric, allowed)
    }

    // The primitives run on the host copy, where this backend's searches already re-rank
    // their candidates: the device holds the rows for the approximate scan only. A device
    // refine and selection for wgpu come with the indexes that need them at scale.
    fn gather(&self, slots: &[usize]) -> Result<Vec<f32>> {
        self.host.gather(slots)
    }

    fn refine(
        &self,
        queries: &[f32],
        candidates: &crate::backend::Candidates,
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.host.refine(queries, candidates, k, metric)
    }

    fn select_k(&self, scores: &[f32], width: usize, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        self.host.select_k(scores, width, k)
    }
}
