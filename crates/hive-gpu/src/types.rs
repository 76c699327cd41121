//! The plain data types of the public API.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub use smol_str::SmolStr;

use crate::error::HiveGpuError;
use crate::filter::Filter;
use crate::payload::{Payload, PayloadValue};

/// Free-form key/value payload stored with a vector and optionally returned with results.
pub type Metadata = HashMap<String, String>;

/// A vector with its id and payload, as added to and read back from a collection.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuVector {
    /// The caller's id; unique within a collection. Adding an existing id replaces it (upsert).
    pub id: String,
    /// The components; must have the collection's dimension and be finite.
    pub data: Vec<f32>,
    /// String payload kept with the vector (each entry is also a string field filters can
    /// match, see [`crate::Filter`]).
    pub metadata: Metadata,
    /// Typed payload fields (strings, integers, floats, flags) that filters can match.
    pub payload: Payload,
}

impl GpuVector {
    /// A vector without payload.
    pub fn new(id: impl Into<String>, data: Vec<f32>) -> Self {
        Self { id: id.into(), data, metadata: Metadata::new(), payload: Payload::new() }
    }

    /// A vector with string payload.
    pub fn with_metadata(id: impl Into<String>, data: Vec<f32>, metadata: Metadata) -> Self {
        Self { id: id.into(), data, metadata, payload: Payload::new() }
    }

    /// This vector with the typed payload field `field` set to `value`.
    pub fn with_field(mut self, field: impl Into<String>, value: impl Into<PayloadValue>) -> Self {
        self.payload.insert(field.into(), value.into());
        self
    }
}

/// One neighbour found by a search.
///
/// `score` means, per metric (identical on every backend):
/// - [`GpuDistanceMetric::Euclidean`]: the Euclidean distance `sqrt(sum((q - x)^2))`; lower is better.
/// - [`GpuDistanceMetric::Cosine`]: the cosine similarity `q.x / (|q| |x|)` in [-1, 1]; higher is better.
/// - [`GpuDistanceMetric::DotProduct`]: the inner product `q.x`; higher is better.
/// - [`GpuDistanceMetric::Manhattan`]: the L1 distance `sum(|q - x|)`; lower is better.
/// - [`GpuDistanceMetric::Chebyshev`]: the L-infinity distance `max(|q - x|)`; lower is better.
///
/// Results come best first; equal scores are ordered by `index`, i.e. by the order in which
/// the vectors were stored, so the order is deterministic.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSearchResult {
    /// The id of the neighbour. A [`SmolStr`] derefs to `str` and compares with `&str` and
    /// `String`; ids of up to 23 bytes are stored inline, so results cost no allocation per id.
    pub id: SmolStr,
    /// The metric's score (see the type's documentation).
    pub score: f32,
    /// The neighbour's slot in storage at the time of the search. Slots change when removed
    /// vectors are compacted away; use `id` to refer to a vector.
    pub index: usize,
    /// The neighbour's payload, when the search asked for it (shared with the collection, not
    /// copied; an empty payload when the vector has none).
    pub metadata: Option<Arc<Metadata>>,
    /// The neighbour's typed payload fields, when the search asked for payloads (shared, not
    /// copied; empty when the vector has none).
    pub payload: Option<Arc<Payload>>,
}

/// How vectors are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuDistanceMetric {
    /// Cosine similarity; zero vectors are rejected.
    Cosine,
    /// Euclidean (L2) distance.
    Euclidean,
    /// Inner product.
    DotProduct,
    /// Manhattan (L1) distance: the sum of the components' absolute differences. Searched
    /// exactly on every backend; the approximate indexes (IVF, quantizers) refuse it.
    Manhattan,
    /// Chebyshev (L-infinity) distance: the largest absolute difference of any component.
    /// Searched exactly on every backend; the approximate indexes refuse it.
    Chebyshev,
}

impl GpuDistanceMetric {
    /// Every metric, in the order of their file codes.
    pub const ALL: [GpuDistanceMetric; 5] = [
        GpuDistanceMetric::Euclidean,
        GpuDistanceMetric::DotProduct,
        GpuDistanceMetric::Cosine,
        GpuDistanceMetric::Manhattan,
        GpuDistanceMetric::Chebyshev,
    ];

    /// Whether a higher score is better (true for cosine and dot product).
    pub fn higher_is_better(self) -> bool {
        matches!(self, GpuDistanceMetric::Cosine | GpuDistanceMetric::DotProduct)
    }

    /// Whether the metric is a distance over the components' differences that the inner-product
    /// machinery (GEMM, tensor cores, the quantizers' lookup tables) cannot compute: L1 and
    /// L-infinity, which every backend scans directly.
    pub fn is_difference_norm(self) -> bool {
        matches!(self, GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev)
    }
}

impl fmt::Display for GpuDistanceMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuDistanceMetric::Cosine => "cosine",
            GpuDistanceMetric::Euclidean => "l2",
            GpuDistanceMetric::DotProduct => "dot",
            GpuDistanceMetric::Manhattan => "l1",
            GpuDistanceMetric::Chebyshev => "linf",
        })
    }
}

impl FromStr for GpuDistanceMetric {
    type Err = HiveGpuError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "l2" | "euclidean" => Ok(GpuDistanceMetric::Euclidean),
            "cosine" | "cos" => Ok(GpuDistanceMetric::Cosine),
            "dot" | "ip" | "dotproduct" | "inner" => Ok(GpuDistanceMetric::DotProduct),
            "l1" | "manhattan" | "cityblock" => Ok(GpuDistanceMetric::Manhattan),
            "linf" | "l-inf" | "chebyshev" => Ok(GpuDistanceMetric::Chebyshev),
            other => Err(HiveGpuError::InvalidArgument(format!(
                "unknown metric {other:?} (expected l2, cosine, dot, l1 or linf)"
            ))),
        }
    }
}

/// How a collection stores its vectors. Every search is exact over the stored values: a
/// precision decides what is stored (and how much memory it takes), never how exactly it is
/// searched. More types may come, so matches need a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum StoragePrecision {
    /// 32-bit floats: exact storage.
    #[default]
    F32,
    /// 16-bit IEEE floats: half the memory. Vectors are rounded to f16 when stored (to
    /// nearest); values beyond f16's range (|x| > 65504) are refused.
    F16,
    /// bfloat16 (f32's range, 8 significant bits): half the memory, for embeddings that come
    /// out of a model in bf16. Vectors are rounded to bf16 when stored (to nearest, ties to
    /// even).
    Bf16,
    /// Signed bytes: a quarter of the memory, for integer data (int8 embeddings). Only
    /// integers in -128..=127 are stored; any other value is refused, never rounded.
    I8,
    /// Unsigned bytes: a quarter of the memory, for integer data (SIFT's `bvecs`, pixels).
    /// Only integers in 0..=255 are stored; any other value is refused, never rounded.
    U8,
}

impl StoragePrecision {
    /// Every storage precision, in the order of their file codes.
    pub const ALL: [StoragePrecision; 5] = [
        StoragePrecision::F32,
        StoragePrecision::F16,
        StoragePrecision::Bf16,
        StoragePrecision::I8,
        StoragePrecision::U8,
    ];

    /// Bytes per stored component.
    pub fn element_bytes(self) -> usize {
        crate::exact::elements::element_bytes(self)
    }
}

impl fmt::Display for StoragePrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoragePrecision::F32 => "f32",
            StoragePrecision::F16 => "f16",
            StoragePrecision::Bf16 => "bf16",
            StoragePrecision::I8 => "i8",
            StoragePrecision::U8 => "u8",
        })
    }
}

impl FromStr for StoragePrecision {
    type Err = HiveGpuError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" => Ok(StoragePrecision::F32),
            "f16" | "fp16" | "half" => Ok(StoragePrecision::F16),
            "bf16" | "bfloat16" => Ok(StoragePrecision::Bf16),
            "i8" | "int8" => Ok(StoragePrecision::I8),
            "u8" | "uint8" => Ok(StoragePrecision::U8),
            other => Err(HiveGpuError::InvalidArgument(format!(
                "unknown precision {other:?} (expected f32, f16, bf16, i8 or u8)"
            ))),
        }
    }
}

/// How a GPU backend computes the candidates of an exact search. Every mode returns the
/// exact k nearest (each candidate pass has a proven error bound, and every row within it is
/// re-ranked in f64); the modes differ in speed and in how many rows are re-ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SearchPrecision {
    /// f32 arithmetic throughout (f16 storage uses f16 tensor cores with f32 accumulation).
    #[default]
    Exact,
    /// Batches of f32 vectors use TF32 tensor cores for the candidate pass. The CPU backend,
    /// which is exact at full speed already, treats this as `Exact`.
    Fast,
}

/// Everything that defines a collection; [`crate::GpuContext::create_storage_with`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageConfig {
    /// Number of components per vector (at least 1).
    pub dimension: usize,
    /// The metric searches use.
    pub metric: GpuDistanceMetric,
    /// How vectors are stored.
    pub precision: StoragePrecision,
    /// How GPU searches compute their candidates (results are exact either way).
    pub search: SearchPrecision,
}

impl StorageConfig {
    /// An f32 collection of `dimension` components compared by `metric`.
    pub fn new(dimension: usize, metric: GpuDistanceMetric) -> Self {
        Self { dimension, metric, precision: StoragePrecision::F32, search: SearchPrecision::Exact }
    }

    /// The same configuration with another storage precision.
    pub fn with_precision(mut self, precision: StoragePrecision) -> Self {
        self.precision = precision;
        self
    }

    /// The same configuration with another search precision.
    pub fn with_search_precision(mut self, search: SearchPrecision) -> Self {
        self.search = search;
        self
    }
}

/// Options of one search call. Options will be added (filters, search parameters of the
/// approximate indexes), so it is built with [`SearchOptions::default`] and its `with_*`
/// methods, never literally, and adding one breaks no caller.
///
/// ```
/// let options = hive_gpu::SearchOptions::default().with_metadata(true);
/// assert!(options.with_metadata);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct SearchOptions {
    /// Return each neighbour's payload in [`GpuSearchResult::metadata`] and
    /// [`GpuSearchResult::payload`].
    pub with_metadata: bool,
    /// Return only vectors that pass this filter (exactly the k nearest of them).
    pub filter: Option<Filter>,
    /// Lists an IVF index scans per query (its `nprobe` nearest centroids); None for the
    /// default, [`DEFAULT_NPROBE`] or every list when there are fewer. Ignored without an
    /// index.
    pub nprobe: Option<usize>,
    /// A quantized index (IVF-SQ8, SQ8, IVF-PQ, PQ, binary) re-ranks exactly the best
    /// `refine_factor * k` rows its codes nominate; None for the index's default
    /// ([`DEFAULT_REFINE_FACTOR`] for SQ8, [`DEFAULT_PQ_REFINE_FACTOR`] for PQ,
    /// [`DEFAULT_BINARY_REFINE_FACTOR`] for binary). Larger finds more of the true
    /// neighbours its codes misrank, at the cost of more exact distances. Ignored by other
    /// indexes.
    pub refine_factor: Option<usize>,
    /// Search every vector exactly even where the collection has an approximate index.
    pub exact: bool,
}

/// Lists an IVF search scans per query when the call names no `nprobe` (cuVS's default).
pub const DEFAULT_NPROBE: usize = 20;

/// Candidates per result a quantized index re-ranks exactly when the call names no
/// `refine_factor`: twice k, which recovers most of the order its 8-bit codes lose at the
/// cost of 2k exact distances per query (docs/PERFORMANCE.md, IVF-SQ8).
pub const DEFAULT_REFINE_FACTOR: usize = 2;

/// Candidates per result the binary index re-ranks exactly when the call names no
/// `refine_factor`: a bit per component ranks coarsely, so 16k rows are scored exactly
/// (docs/PERFORMANCE.md, binary).
pub const DEFAULT_BINARY_REFINE_FACTOR: usize = 16;

/// Candidates per result a product-quantized index re-ranks exactly when the call names no
/// `refine_factor`: PQ's codes lose more of the order than SQ8's (16 bytes for 128 components
/// against 128), so 8k rows are scored exactly (docs/PERFORMANCE.md, IVF-PQ).
pub const DEFAULT_PQ_REFINE_FACTOR: usize = 8;

/// The shape of a collection's index ([`crate::GpuVectorStorage::index_stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IndexStats {
    /// What was built.
    pub spec: crate::IndexSpec,
    /// Vectors per list, removed ones included until a compaction.
    pub list_lengths: Vec<usize>,
    /// Vectors the centroids trained on (a sample of at most 256 per list).
    pub training_vectors: usize,
    /// Lloyd iterations the training ran.
    pub iterations: usize,
    /// Bytes the index adds to the collection (its lists and centroids, codes and quantizer).
    pub memory_bytes: usize,
    /// Bytes of codes each vector has in a quantized index (the codes and any per-row term
    /// its scan reads: `dim + 4` for SQ8, `m * bits / 8 + 4` for PQ, whole 64-bit words of
    /// bits for binary), 0 for IVF-Flat; beside the 4-byte list entry every index has.
    pub code_size: usize,
    /// Bytes the trained quantizer takes whatever the number of vectors (the SQ8 grid, the
    /// PQ codebooks on the host and the backend), within `memory_bytes`.
    pub quantizer_bytes: usize,
}

impl SearchOptions {
    /// These options, returning payloads with the results or not.
    pub fn with_metadata(mut self, yes: bool) -> Self {
        self.with_metadata = yes;
        self
    }

    /// These options, restricted to the vectors that pass `filter`.
    pub fn with_filter(mut self, filter: Filter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// These options, scanning `nprobe` lists per query on an IVF index.
    pub fn with_nprobe(mut self, nprobe: usize) -> Self {
        self.nprobe = Some(nprobe);
        self
    }

    /// These options, re-ranking the best `refine_factor * k` code-ranked rows exactly on a
    /// quantized index.
    pub fn with_refine_factor(mut self, refine_factor: usize) -> Self {
        self.refine_factor = Some(refine_factor);
        self
    }

    /// These options, searching exactly (over every vector) or through the collection's index.
    pub fn with_exact(mut self, exact: bool) -> Self {
        self.exact = exact;
        self
    }

    /// These options with search parameters given as text, comma-separated: `nprobe=N`,
    /// `refine=N` (or `refine_factor=N`), `exact` (what `hive-gpu bench --search` takes). An unknown name or a bad value is an
    /// error naming it.
    ///
    /// ```
    /// let options = hive_gpu::SearchOptions::default().with_params("nprobe=32")?;
    /// assert_eq!(options.nprobe, Some(32));
    /// assert!(hive_gpu::SearchOptions::default().with_params("nprobe=0").is_err());
    /// # Ok::<(), hive_gpu::HiveGpuError>(())
    /// ```
    pub fn with_params(mut self, text: &str) -> crate::Result<Self> {
        let mut params = crate::index::spec::Params::parse(text, text)?;
        if let Some(value) = params.take("nprobe") {
            self.nprobe = Some(crate::index::spec::parse_count(text, "nprobe", value)?);
        }
        let mut refine_given = false;
        for name in ["refine", "refine_factor"] {
            if let Some(value) = params.take(name) {
                if std::mem::replace(&mut refine_given, true) {
                    return Err(crate::HiveGpuError::InvalidArgument(format!(
                        "{text:?}: refine and refine_factor name one parameter; give it once"
                    )));
                }
                self.refine_factor = Some(crate::index::spec::parse_count(text, name, value)?);
            }
        }
        if let Some(value) = params.take("exact") {
            self.exact = match value {
                "" | "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                other => {
                    return Err(crate::HiveGpuError::InvalidArgument(format!(
                        "{text:?}: exact takes true or false, got {other:?}"
                    )));
                }
            };
        }
        params.finish()?;
        Ok(self)
    }
}

/// The kinds of backend hive-gpu knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuBackendType {
    /// NVIDIA GPUs through the CUDA driver.
    Cuda,
    /// AMD GPUs through HIP.
    Rocm,
    /// Any Vulkan GPU through wgpu.
    Vulkan,
    /// Apple GPUs through wgpu's Metal path.
    Metal,
    /// The SIMD CPU backend; always available.
    Cpu,
}

impl GpuBackendType {
    /// Every backend in order of preference for automatic selection.
    pub const ALL: [GpuBackendType; 5] = [
        GpuBackendType::Cuda,
        GpuBackendType::Rocm,
        GpuBackendType::Vulkan,
        GpuBackendType::Metal,
        GpuBackendType::Cpu,
    ];

    /// The lower-case name used by `HIVE_GPU_BACKEND` and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            GpuBackendType::Cuda => "cuda",
            GpuBackendType::Rocm => "rocm",
            GpuBackendType::Vulkan => "vulkan",
            GpuBackendType::Metal => "metal",
            GpuBackendType::Cpu => "cpu",
        }
    }
}

impl fmt::Display for GpuBackendType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuBackendType::Cuda => "CUDA",
            GpuBackendType::Rocm => "ROCm",
            GpuBackendType::Vulkan => "Vulkan",
            GpuBackendType::Metal => "Metal",
            GpuBackendType::Cpu => "CPU",
        })
    }
}

impl FromStr for GpuBackendType {
    type Err = HiveGpuError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        GpuBackendType::ALL.into_iter().find(|b| b.name() == wanted).ok_or_else(|| {
            HiveGpuError::InvalidArgument(format!(
                "unknown backend {s:?} (expected cpu, cuda, rocm, vulkan or metal)"
            ))
        })
    }
}

/// What a backend knows about the device it runs on.
///
/// Every field is read from the device or the operating system; a value the platform does not
/// report is `None` (or 0 for counts), never invented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDeviceInfo {
    /// Device name (the CPU model for the CPU backend).
    pub name: String,
    /// The backend that drives it.
    pub backend: GpuBackendType,
    /// Device ordinal within its backend.
    pub device_id: usize,
    /// Total device memory in bytes (system RAM for the CPU backend).
    pub total_vram_bytes: u64,
    /// Free device memory in bytes when the info was read.
    pub available_vram_bytes: u64,
    /// Memory in use in bytes (`total - available`).
    pub used_vram_bytes: u64,
    /// Driver or runtime version, when known (the kernel release for the CPU backend).
    pub driver_version: Option<String>,
    /// Compute capability ("9.0"), gfx architecture ("gfx90a"), or the SIMD level for the CPU
    /// backend ("avx512", "avx2", "neon", "scalar").
    pub compute_capability: String,
    /// Largest thread block (1 for the CPU backend, which runs one thread per core).
    pub max_threads_per_block: u32,
    /// Largest shared memory per block in bytes (the per-core L2 size for the CPU backend,
    /// when known, else 0).
    pub max_shared_memory_per_block: u64,
    /// Parallel units: multiprocessors, compute units, or logical CPU cores.
    pub compute_units: u32,
    /// PCI bus id in "DDDD:BB:DD.F" form, when the device is on a PCI bus.
    pub pci_bus_id: Option<String>,
    /// Last-level (L2) cache size in bytes, when known.
    pub l2_cache_bytes: Option<u64>,
    /// Threads per warp or wavefront (32 on NVIDIA, 64 or 32 on AMD; 1 for the CPU backend).
    pub warp_size: u32,
    /// A software implementation of a GPU API running on the CPU (Mesa's lavapipe, say): it
    /// works, but the automatic backend choice prefers the CPU backend to it.
    pub software: bool,
}

impl GpuDeviceInfo {
    /// Percentage of device memory in use, 0.0 when the total is unknown.
    pub fn vram_usage_percent(&self) -> f64 {
        if self.total_vram_bytes == 0 {
            0.0
        } else {
            self.used_vram_bytes as f64 * 100.0 / self.total_vram_bytes as f64
        }
    }

    /// Whether at least `bytes` of device memory are free.
    pub fn has_available_vram(&self, bytes: u64) -> bool {
        self.available_vram_bytes >= bytes
    }
}

/// One backend as [`crate::detect_available_backends`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStatus {
    /// Which backend.
    pub backend: GpuBackendType,
    /// Whether a context can be created on it.
    pub available: bool,
    /// Why it is unavailable, or what was found ("1 device").
    pub reason: String,
    /// The devices it found.
    pub devices: Vec<GpuDeviceInfo>,
}
