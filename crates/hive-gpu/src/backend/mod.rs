//! The op set every backend implements, and finding which backends this machine has.
//!
//! Collections and indexes never name a backend: they call [`GpuBackend`] and [`RowStore`].
//! Each backend is a small set of operations: store rows; the fused distance + top-k over the
//! stored rows for a batch of queries, optionally restricted to a slot set (`knn`); and the
//! primitives approximate indexes are written on: `refine` (candidate lists to the exact top-k,
//! where IVF and graph searches end), `select_k` (scores to top-k) and `gather` (slots to rows).
//! The conformance suite checks every backend against an f64 reference through exactly these
//! operations, each on its own (`tests/primitives.rs`).
//!
//! # Soundness
//!
//! The CPU backend runs AVX-512, AVX2 or NEON code according to what the processor reports at
//! run time, and nothing public lets safe code choose otherwise: its kernels and their
//! instruction-set level are internal. This must not compile:
//!
//! ```compile_fail
//! use hive_gpu::backend::cpu::simd::{Kernel, SimdLevel, distances};
//! let mut out = [0.0f32; 1];
//! distances(SimdLevel::Avx512, Kernel::L2, &[1.0; 16], &[2.0; 16], &mut out);
//! ```
//!
//! while the public way in, a context on the CPU backend, picks the level itself:
//!
//! ```
//! let context = hive_gpu::GpuContext::with_backend(hive_gpu::GpuBackendType::Cpu, 0)?;
//! let storage = context.create_storage(16, hive_gpu::GpuDistanceMetric::Euclidean)?;
//! storage.add_vectors(&[hive_gpu::GpuVector::new("x", vec![2.0; 16])])?;
//! assert_eq!(storage.search(&[1.0; 16], 1)?[0].score, 4.0);
//! # Ok::<(), hive_gpu::HiveGpuError>(())
//! ```

// The CPU backend's kernels stay inside the crate: they trust the instruction-set level they are
// given (`cpu::simd::SimdLevel`), which only `SimdLevel::detect` may produce.
pub mod bits;
pub mod candidates;
pub mod codes;
pub(crate) mod cpu;
// The engine is compiled in every build, so its host code is checked without the features,
// but only the CUDA and ROCm backends call it.
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
pub(crate) mod gpu;
pub mod merge;
pub mod pq;

#[cfg(feature = "vulkan")]
pub(crate) mod wgpu;

pub use bits::BitScan;
pub use candidates::{Candidates, ListProbes};
pub use codes::{CodeScan, ListCodes};
pub use merge::{MergeBuffer, Merged, SourceList};
pub use pq::PqScan;

/// One of the coded scans a quantized index runs, for [`RowStore::scan_and_refine`]. Each
/// scan's lists hold every slot at most once (an index files a row in one list).
#[derive(Debug, Clone, Copy)]
pub enum QuantizedScan<'a> {
    /// Scalar-quantized lists ([`RowStore::scan_codes`]).
    Sq8(CodeScan<'a>),
    /// Product-quantized lists ([`RowStore::scan_pq`]).
    Pq(PqScan<'a>),
    /// Binary codes ([`RowStore::scan_bits`]).
    Bits(BitScan<'a>),
}

use crate::error::{HiveGpuError, Result};
use crate::persist::MappedRows;
use crate::slots::SlotSet;
use crate::types::{
    BackendStatus, GpuBackendType, GpuDeviceInfo, GpuDistanceMetric, SearchPrecision, StoragePrecision,
};

/// One neighbour as a backend reports it: a storage slot and the metric's distance.
///
/// `distance` is the metric's canonical "lower is better" value, computed exactly (in f64
/// over the stored values): the squared Euclidean distance, the negated inner product, or the
/// negated cosine similarity. Scores are derived from it in one place above the backends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Neighbor {
    /// Slot of the row in its [`RowStore`].
    pub slot: usize,
    /// Canonical distance (see the type's documentation).
    pub distance: f64,
}

/// The neighbours found among gathered rows, renumbered to the slots they were gathered from:
/// row i of the gathered store is slot `gathered_from[i]` (ascending, so ties still go to the
/// lower slot). Every backend's search over few passing rows ends here.
///
/// In place, and spread over the library's threads for large results: a 2,000-query piece at
/// k = 100 maps 200,000 slots, which on one thread kept a batch over a gather of 90% of 1M
/// rows slower than the unfiltered batch on the H100 (docs/PERFORMANCE.md, filtered search).
pub(crate) fn ungather(mut found: Vec<Vec<Neighbor>>, gathered_from: &[usize]) -> Vec<Vec<Neighbor>> {
    let map = |list: &mut Vec<Neighbor>| {
        for neighbor in list {
            neighbor.slot = gathered_from[neighbor.slot];
        }
    };
    let results: usize = found.iter().map(Vec::len).sum();
    let parallel = results >= PARALLEL_RESULTS
        && crate::exec::run(|| {
            use rayon::prelude::*;
            found.par_iter_mut().with_min_len(64).for_each(map);
        })
        .is_ok();
    if !parallel {
        found.iter_mut().for_each(map);
    }
    found
}

/// [`RowStore::nearest_rows`] through the store's exact [`RowStore::knn`]: the trait's
/// default, and where an override cannot prove its own pick.
pub(crate) fn nearest_by_knn<S: RowStore + ?Sized>(store: &S, points: &[f32]) -> Result<Vec<usize>> {
    store
        .knn(points, 1, GpuDistanceMetric::Euclidean, None)?
        .into_iter()
        .map(|found| {
            found
                .first()
                .map(|n| n.slot)
                .ok_or_else(|| HiveGpuError::Internal("the 1-NN of a point found no row".into()))
        })
        .collect()
}

/// Result counts (queries x k) from which turning a search's results into host structures is
/// spread over threads: at 10k queries x k = 100 that is a million small allocations. The
/// default of `Tuning::parallel_results` (a flat search's public results), and the count where
/// no tuning reaches (the engines' own lists, merges, padding).
pub(crate) const PARALLEL_RESULTS: usize = 1 << 14;

/// Whether `HIVE_GPU_PROFILE=1` asks searches to report their phase times on stderr (read once
/// per process).
pub(crate) fn profiling() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("HIVE_GPU_PROFILE").as_deref() == Ok("1"))
}

/// Bytes widened to f32 per piece by the default [`RowStore::append_stored`].
const STORED_PIECE_BYTES: usize = 16 << 20;

/// The default [`RowStore::append_stored`]: the stored elements widened to f32 in bounded
/// pieces, each appended.
pub(crate) fn append_widened<S: RowStore + ?Sized>(
    store: &mut S,
    bytes: &[u8],
    precision: StoragePrecision,
    dim: usize,
) -> Result<()> {
    let row_bytes = dim * crate::exact::elements::element_bytes(precision);
    if row_bytes == 0 || !bytes.len().is_multiple_of(row_bytes) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "{} bytes are not whole stored rows of dimension {dim}",
            bytes.len()
        )));
    }
    let mut values = Vec::new();
    for piece in bytes.chunks((STORED_PIECE_BYTES / row_bytes).max(1) * row_bytes) {
        crate::exact::elements::widen(piece, precision, &mut values);
        store.append(&values)?;
    }
    Ok(())
}

/// A device a collection can live on: the factory of [`RowStore`]s.
pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    /// Which backend this is.
    fn backend_type(&self) -> GpuBackendType;
    /// The device's description, read now (free memory changes).
    fn device_info(&self) -> GpuDeviceInfo;
    /// Empty row storage for vectors of `dim` components, searched with `tuning`'s knobs.
    fn new_rows(
        &self,
        dim: usize,
        precision: StoragePrecision,
        search: SearchPrecision,
        tuning: &crate::tuning::Tuning,
    ) -> Result<Box<dyn RowStore>>;
}

/// The rows of one collection, held where the backend computes, with a tombstone per slot.
///
/// Slots are dense indices `0..len()`. Collections validate vector contents (dimension,
/// finite values) before calling; a `RowStore` still rejects arguments that would break it
/// (slots out of range, k of 0, shapes that are not whole rows) with an error, never a panic.
pub trait RowStore: Send + Sync + std::fmt::Debug {
    /// Number of slots, tombstoned ones included.
    fn len(&self) -> usize;
    /// Whether no slot is in use.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Makes room for `additional` more rows, so that a following [`RowStore::append`] of
    /// that many rows cannot fail. Fails with [`HiveGpuError::VramLimitExceeded`] when the
    /// device lacks the memory, changing nothing.
    fn reserve(&mut self, additional: usize) -> Result<()>;
    /// Appends rows (row-major, a multiple of the dimension) as new live slots. Slots are
    /// written once: a collection replaces a vector by appending its new values and removing
    /// the old slot, which keeps every change but the appends infallible.
    fn append(&mut self, rows: &[f32]) -> Result<()>;
    /// [`RowStore::append`] of rows given as a collection file stores them: little-endian
    /// elements of `precision` (f32, or f16 bits), whole rows. A store that keeps those
    /// elements takes them as they are, with no round trip through f32 (what an open of a
    /// collection file appends); this default widens them to f32 in bounded pieces.
    fn append_stored(&mut self, bytes: &[u8], precision: StoragePrecision, dim: usize) -> Result<()> {
        append_widened(self, bytes, precision, dim)
    }
    /// Hands the rows `start..start + count` to `out` as a collection file stores them
    /// (little-endian elements of `precision`, whole rows of `dim`), in one or more pieces in
    /// order: what a save writes. A store that keeps those elements hands out its own memory
    /// (or a device's download) with no conversion; this default gathers and converts them.
    fn read_stored(
        &self,
        start: usize,
        count: usize,
        precision: StoragePrecision,
        out: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let slots: Vec<usize> = (start..start + count).collect();
        let values = self.gather(&slots)?;
        out(&crate::exact::elements::narrow(&values, precision))
    }
    /// Takes `rows` (a mapped file's little-endian elements of `precision`, whole rows of
    /// `dim`) as the rows of this empty store, searched where they lie, with no copy: true
    /// when it did. False, changing nothing, where the rows must live elsewhere (on a device)
    /// or cannot be read in place; the caller then appends them.
    fn adopt_mapped(&mut self, rows: &MappedRows, precision: StoragePrecision, dim: usize) -> Result<bool> {
        let _ = (rows, precision, dim);
        Ok(false)
    }
    /// Drops every slot from `len` on: the rollback of appends whose batch could not be
    /// finished. Cannot fail: it only forgets rows (a failed append may have left any number
    /// of them written beyond what the store reported).
    fn truncate(&mut self, len: usize);
    /// Marks slots as removed: searches skip them.
    fn tombstone(&mut self, slots: &[usize]);
    /// Keeps only the rows in `keep` (ascending slots), renumbered `0..keep.len()` in order.
    fn compact(&mut self, keep: &[usize]) -> Result<()>;
    /// Drops every row.
    fn clear(&mut self);
    /// The stored row as f32 (after the storage precision's rounding).
    fn read_row(&self, slot: usize) -> Result<Vec<f32>>;
    /// Bytes of memory the rows occupy on the device.
    fn memory_bytes(&self) -> usize;
    /// Whether the rows live in host memory and stream through a device for each search (a
    /// GPU collection larger than its device); false where they live where they are searched.
    fn streamed(&self) -> bool {
        false
    }
    /// Whether a batch over few rows is better cut into smaller pieces on more workers
    /// ([`crate::Tuning::small_search_rows`]): true where each piece's fixed host work
    /// (preparing queries, staging, reading results back) outweighs the device's work on few
    /// rows, so more of it should overlap; false on the CPU, whose pieces share its cores.
    fn finer_pieces_when_few_rows(&self) -> bool {
        false
    }
    /// Exact k nearest rows for each query of a row-major batch, best first, ties by slot,
    /// among the live rows, or with `allowed` among the live rows that are members of it (a
    /// filter's [`SlotSet`]: slots it does not cover are not allowed). `k` must be at least 1
    /// and at most the number of rows searched, and every query value finite: a NaN or
    /// infinite component is an error naming its query (`InvalidArgument`), on every path.
    fn knn(
        &self,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>>;
    /// Each point's nearest live row under the squared Euclidean distance, ties to the lower
    /// slot: [`RowStore::knn`] of the row-major `points` with k = 1 under
    /// [`GpuDistanceMetric::Euclidean`], slots only; an error where that `knn` fails (no live
    /// row, a partial point, a non-finite component). The 1-NN of many
    /// points over few rows that k-means assignments, IVF adds and product-quantization
    /// encoding run. This default is that `knn` ([`nearest_by_knn`]); a backend overrides it
    /// with a cheaper pass that must pick the same rows (the CUDA/ROCm engine's
    /// `hg_nearest_rows`, whose picks are proven before they are kept; the CPU backend's
    /// [`RowStore::nearest_sets`] at n = 1, a lone candidate proven, ties re-ranked).
    fn nearest_rows(&self, points: &[f32]) -> Result<Vec<usize>> {
        nearest_by_knn(self, points)
    }
    /// Each query's `n` nearest live rows under `metric` as a set: the slots that
    /// [`RowStore::knn`] with k = `n` returns for a row-major batch, `n` per query one query
    /// after another, in no particular order within a query, without their distances; an
    /// error where that `knn` fails. What every IVF search probes its centroids with: its
    /// scan reads the union of the lists (rows or codes), so it needs which ones, not how far
    /// or in what order. This default is that `knn`; a backend overrides it with a pass that must pick the
    /// same rows (the CPU backend's keeps a query's f32 candidates without the exact re-rank
    /// where they are exactly `n`, which proves them the set).
    fn nearest_sets(&self, queries: &[f32], n: usize, metric: GpuDistanceMetric) -> Result<Vec<u32>> {
        let found = self.knn(queries, n, metric, None)?;
        let mut sets = Vec::with_capacity(found.len() * n);
        for found in found {
            sets.extend(found.iter().map(|neighbor| neighbor.slot as u32));
        }
        Ok(sets)
    }
    /// The stored rows of `slots` as f32 (after the storage precision's rounding), one after
    /// another in the order given, repeats included: how an index reads its candidates'
    /// vectors. A slot at or past [`RowStore::len`] is an error naming it.
    fn gather(&self, slots: &[usize]) -> Result<Vec<f32>>;
    /// The exact `k` best of each query's candidates (`candidates.of(q)` for query `q` of a
    /// row-major batch), best first, ties by slot, distances in f64 as [`RowStore::knn`]
    /// reports them: the re-rank every approximate index (IVF, a graph) ends in. Repeated and
    /// removed slots are scored once and never, and a query with fewer than `k` distinct
    /// live candidates gets them all. `k` must be at least 1; a candidate past
    /// [`RowStore::len`] is an error naming it, and so is a query value that is not finite.
    fn refine(
        &self,
        queries: &[f32],
        candidates: &Candidates,
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>>;
    /// The exact `k` best rows of each query's inverted lists: query `q` of a row-major batch
    /// scans the lists `probes.of(q)`, skipping removed rows and, with `allowed`, rows it does
    /// not hold. Best first, ties by slot, distances in f64 as [`RowStore::knn`] reports them;
    /// a query whose lists hold fewer than `k` such rows gets them all. What an IVF-Flat
    /// search runs after probing its centroids. A query value that is not finite is an error
    /// naming its query. This default hands each query's list members to
    /// [`RowStore::refine`]; a backend overrides it to read each list once per batch.
    fn scan_lists(
        &self,
        queries: &[f32],
        probes: &ListProbes<'_>,
        k: usize,
        metric: GpuDistanceMetric,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        candidates::scan_by_refine(self, queries, probes, k, metric, allowed)
    }
    /// The `k` smallest approximate distances of each query among the scalar-quantized rows
    /// of its probed lists (the distance is [`codes`]'s), skipping `scan.removed` and, with
    /// `scan.allowed`, the slots it does not hold: ascending, ties by slot, fewer where the
    /// lists hold fewer. What IVF-SQ8 runs before its exact [`RowStore::refine`]. The codes are
    /// the index's, not this store's rows; this default scans them on the host's threads (the
    /// CPU backend's path, and every GPU backend's until its kernel lands).
    fn scan_codes(&self, scan: &CodeScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        crate::exec::run(|| codes::scan_on_host(scan, k))?
    }
    /// The `k` smallest Hamming distances of each query among the binary codes of its probed
    /// lists (the distance is [`bits`]'s), skipping `scan.removed` and, with `scan.allowed`,
    /// the slots it does not hold: ascending, ties by slot, fewer where the lists hold fewer.
    /// What the binary index runs before its exact [`RowStore::refine`]; this default scans the
    /// codes on the host's threads (every backend's path until a device kernel lands).
    fn scan_bits(&self, scan: &BitScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        crate::exec::run(|| bits::scan_on_host(scan, k))?
    }
    /// The `k` smallest approximate distances of each query among the product-quantized rows
    /// of its probed lists (the distance is [`pq`]'s, from one lookup table per query),
    /// skipping `scan.removed` and, with `scan.allowed`, the slots it does not hold: ascending,
    /// ties by slot, fewer where the lists hold fewer. What IVF-PQ runs before its exact
    /// [`RowStore::refine`]; this default scans the codes on the host's threads (every
    /// backend's path until a device kernel lands).
    fn scan_pq(&self, scan: &PqScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        crate::exec::run(|| pq::scan_on_host(scan, k))?
    }
    /// The exact `k` best of the rows a coded scan nominates: `scan` run for its `wanted`
    /// best of each query ([`RowStore::scan_codes`], [`RowStore::scan_pq`] or
    /// [`RowStore::scan_bits`]), then [`RowStore::refine`] of those against `queries` (the
    /// exact queries; the scan's own may be their unit vectors). What every quantized index
    /// runs after probing. This default runs the two in turn; a backend overrides it to keep
    /// the nominees where it scanned them (the CUDA/ROCm engine: on the device).
    fn scan_and_refine(
        &self,
        scan: QuantizedScan<'_>,
        wanted: usize,
        queries: &[f32],
        k: usize,
        metric: GpuDistanceMetric,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nominated = match scan {
            QuantizedScan::Sq8(scan) => self.scan_codes(&scan, wanted)?,
            QuantizedScan::Pq(scan) => self.scan_pq(&scan, wanted)?,
            QuantizedScan::Bits(scan) => self.scan_bits(&scan, wanted)?,
        };
        self.refine(queries, &Candidates::from_nominees(&nominated), k, metric)
    }
    /// The `k` smallest of each row of `scores` (row-major, `width` per row; lower is better),
    /// ascending, ties by column: a [`Neighbor`] per pick with the column as `slot` and the
    /// score as `distance`. Rows with fewer than `k` columns give them all. NaN scores are
    /// refused. It reads no stored row: it is the device's selection, for scores an index
    /// computed itself (IVF's coarse assignment).
    fn select_k(&self, scores: &[f32], width: usize, k: usize) -> Result<Vec<Vec<Neighbor>>>;
    /// A buffer on this store's device for the top-k lists of `lists` searches of a batch of
    /// `queries`, at most `width` entries per query each, and their merge there into at most `k`
    /// per query (see [`merge`]); None where this backend merges on the host (this default) or
    /// the device has no room.
    fn merge_buffer(
        &self,
        _queries: usize,
        _lists: usize,
        _width: usize,
        _k: usize,
    ) -> Result<Option<Box<dyn MergeBuffer>>> {
        Ok(None)
    }
    /// Whether [`RowStore::knn_into`] can write into `buffer`: a buffer of this backend on this
    /// store's device, or on a device this one copies into directly (peer access).
    fn can_write_into(&self, _buffer: &dyn MergeBuffer) -> bool {
        false
    }
    /// [`RowStore::knn`] of a piece of a batch (queries `first_query..` of the buffer's batch),
    /// its lists written into list `list` of `buffer` instead of returned. `k` must be the
    /// list's width ([`MergeBuffer::set_width`]); only after [`RowStore::can_write_into`] said
    /// yes for `buffer`.
    #[allow(clippy::too_many_arguments)]
    fn knn_into(
        &self,
        _queries: &[f32],
        _k: usize,
        _metric: GpuDistanceMetric,
        _allowed: Option<&SlotSet>,
        _buffer: &dyn MergeBuffer,
        _list: usize,
        _first_query: usize,
    ) -> Result<()> {
        Err(HiveGpuError::Internal("this backend writes no lists into a merge buffer".into()))
    }
    /// Frees the scratch memory idle searches keep for reuse (a GPU backend's workspaces and
    /// its device copy of inverted lists, the CPU backend's packed copy of them). Called before a search that ran out of device memory
    /// beside others runs again alone, and when a collection's index is replaced or dropped.
    fn release_scratch(&self) {}
    /// Frees what searches derived from the filter whose set has the stamp `filter`
    /// ([`SlotSet::stamp`]) when no later search can name it again (a filter evaluated for one
    /// search, not a prepared one): a GPU backend's copy of the rows that passed a batch's
    /// filter. What was derived from other filters stays. Called when such a search ends.
    fn release_filter_copies(&self, _filter: u64) {}
}

/// The check every [`RowStore::read_stored`] starts with: rows `start..start + count` lie
/// within the `len` stored.
pub(crate) fn check_row_range(start: usize, count: usize, len: usize) -> Result<()> {
    if start.checked_add(count).is_none_or(|end| end > len) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "rows {start}..{} of {len}",
            start.saturating_add(count)
        )));
    }
    Ok(())
}

/// The argument check every [`GpuBackend::new_rows`] starts with.
pub(crate) fn check_new_rows(dim: usize) -> Result<()> {
    if dim == 0 {
        return Err(HiveGpuError::InvalidArgument("dimension must be at least 1".into()));
    }
    Ok(())
}

/// Every backend hive-gpu knows, whether it can run here and why not, with its devices.
pub fn detect_available_backends() -> Vec<BackendStatus> {
    GpuBackendType::ALL.into_iter().map(probe).collect()
}

pub(crate) fn probe(backend: GpuBackendType) -> BackendStatus {
    match backend {
        GpuBackendType::Cpu => {
            let info = cpu::CpuBackend::new().device_info();
            BackendStatus {
                backend,
                available: true,
                reason: format!("{} cores, {}", info.compute_units, info.compute_capability),
                devices: vec![info],
            }
        }
        #[cfg(feature = "cuda")]
        GpuBackendType::Cuda => probe_cuda(),
        #[cfg(feature = "rocm")]
        GpuBackendType::Rocm => probe_rocm(),
        #[cfg(feature = "vulkan")]
        GpuBackendType::Vulkan => match wgpu::probe() {
            Ok(devices) => BackendStatus {
                backend,
                available: true,
                reason: devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>().join(", "),
                devices,
            },
            Err(reason) => BackendStatus { backend, available: false, reason, devices: Vec::new() },
        },
        other => BackendStatus {
            backend: other,
            available: false,
            reason: not_built_reason(other).to_string(),
            devices: Vec::new(),
        },
    }
}

/// CUDA is available when its libraries load, a device exists and the kernels compile for it.
#[cfg(feature = "cuda")]
fn probe_cuda() -> BackendStatus {
    probe_engine(GpuBackendType::Cuda, gpu::cuda::CudaDriver::device_count(), gpu::open_cuda, |count| {
        if count == 0 { Some("the NVIDIA driver loads but reports no CUDA device".into()) } else { None }
    })
}

/// ROCm is available when the HIP runtime and hiprtc load, an AMD GPU exists and the kernels
/// compile for it.
#[cfg(feature = "rocm")]
fn probe_rocm() -> BackendStatus {
    let count = gpu::hip::runtime().and_then(|runtime| runtime.device_count());
    probe_engine(GpuBackendType::Rocm, count, gpu::open_rocm, |count| {
        let runtime = gpu::hip::runtime().ok()?;
        (count == 0)
            .then(|| format!("ROCm runtime found ({}), but it reports no AMD GPU", runtime.describe()))
    })
}

/// Opens every device of a GPU engine backend, or says why it cannot: `count` is the number
/// of devices or why none can be counted, `none` the reason for a count of zero.
#[cfg(any(feature = "cuda", feature = "rocm"))]
fn probe_engine(
    backend: GpuBackendType,
    count: std::result::Result<usize, String>,
    open: fn(usize) -> Result<std::sync::Arc<dyn GpuBackend>>,
    none: impl FnOnce(usize) -> Option<String>,
) -> BackendStatus {
    let unavailable =
        |reason: String| BackendStatus { backend, available: false, reason, devices: Vec::new() };
    let count = match count {
        Ok(count) => count,
        Err(reason) => return unavailable(reason),
    };
    if let Some(reason) = none(count) {
        return unavailable(reason);
    }
    let mut devices = Vec::new();
    for ordinal in 0..count {
        match open(ordinal) {
            Ok(engine) => devices.push(engine.device_info()),
            Err(e) => return unavailable(format!("device {ordinal}: {e}")),
        }
    }
    let names: Vec<String> =
        devices.iter().map(|d| format!("{} (compute {})", d.name, d.compute_capability)).collect();
    BackendStatus { backend, available: true, reason: names.join(", "), devices }
}

fn not_built_reason(backend: GpuBackendType) -> &'static str {
    match backend {
        GpuBackendType::Cuda => "not in this build: compiled without the `cuda` feature",
        GpuBackendType::Rocm => "not in this build: compiled without the `rocm` feature",
        GpuBackendType::Vulkan => "not in this build: compiled without the `vulkan` feature",
        GpuBackendType::Metal => "not in this build yet: Metal will come through the wgpu backend",
        GpuBackendType::Cpu => "always available",
    }
}

/// The backend a context gets when none is named: `HIVE_GPU_BACKEND` if set (an unknown or
/// unavailable value is an error, never silently replaced), else the first available of
/// CUDA > ROCm > Vulkan > Metal > CPU.
pub fn select_best_backend() -> Result<GpuBackendType> {
    if let Some(wanted) = backend_override()? {
        let status = probe(wanted);
        return if status.available {
            Ok(wanted)
        } else {
            Err(HiveGpuError::BackendUnavailable { backend: wanted, reason: status.reason })
        };
    }
    // A software Vulkan adapter (lavapipe) is slower than the CPU backend: never chosen by
    // default, only when named.
    Ok(GpuBackendType::ALL
        .into_iter()
        .find(|b| {
            let status = probe(*b);
            status.available && !status.devices.iter().all(|d| d.software)
        })
        .unwrap_or(GpuBackendType::Cpu))
}

/// The backend named by `HIVE_GPU_BACKEND`, None when unset, empty or "auto".
fn backend_override() -> Result<Option<GpuBackendType>> {
    match std::env::var("HIVE_GPU_BACKEND") {
        Ok(value) if value.trim().is_empty() || value.trim().eq_ignore_ascii_case("auto") => Ok(None),
        Ok(value) => value.parse().map(Some).map_err(|_| {
            HiveGpuError::InvalidArgument(format!(
                "HIVE_GPU_BACKEND={value:?} is not a backend (expected auto, cpu, cuda, rocm, vulkan or metal)"
            ))
        }),
        Err(_) => Ok(None),
    }
}

/// Opens device `ordinal` of `backend`.
pub(crate) fn open(backend: GpuBackendType, ordinal: usize) -> Result<std::sync::Arc<dyn GpuBackend>> {
    match backend {
        GpuBackendType::Cpu => {
            if ordinal != 0 {
                return Err(HiveGpuError::DeviceNotFound { backend, ordinal, count: 1 });
            }
            Ok(std::sync::Arc::new(cpu::CpuBackend::new()))
        }
        #[cfg(feature = "cuda")]
        GpuBackendType::Cuda => gpu::open_cuda(ordinal),
        #[cfg(feature = "rocm")]
        GpuBackendType::Rocm => gpu::open_rocm(ordinal),
        #[cfg(feature = "vulkan")]
        GpuBackendType::Vulkan => Ok(std::sync::Arc::new(wgpu::WgpuBackend::open(ordinal)?)),
        other => Err(HiveGpuError::BackendUnavailable {
            backend: other,
            reason: not_built_reason(other).to_string(),
        }),
    }
}
