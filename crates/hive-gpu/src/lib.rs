//! # hive-gpu
//!
//! Exact vector similarity search behind one API on every backend, chosen at run time: NVIDIA
//! GPUs through CUDA, any Vulkan GPU through wgpu, AMD GPUs through ROCm (HIP) and a SIMD CPU
//! backend that is always there. Building needs no GPU toolkit: the GPU libraries are opened
//! at run time, and [`detect_available_backends`] says for each backend whether it can run
//! here and, if not, why.
//!
//! What ships: exact k-NN (flat) search of f32 and f16 vectors under Euclidean, cosine and
//! inner-product metrics, single queries and batches, upserts and removals, payloads returned
//! with results, and exact filtered search ([`Filter`]: id lists and predicates over typed
//! payload fields). Approximate indexes ([`IndexSpec`]: IVF-Flat, IVF-SQ8, IVF-PQ, and flat SQ8,
//! PQ and binary codes) end in an exact re-rank. The CPU and CUDA backends and the wgpu backend on
//! NVIDIA's Vulkan driver and on Mesa's software Vulkan are tested; the ROCm backend compiles its
//! kernels for AMD targets but has never run on an AMD GPU. Collections are saved to and opened
//! from one checksummed file ([`GpuVectorStorage::save`], [`GpuContext::open_storage`]) and kept
//! durable with a write-ahead log ([`GpuContext::open_durable`]). Several devices hold one
//! collection as shards ([`ShardedStorage`], merged exactly) or as replicas
//! ([`ReplicatedStorage`]); [`list_devices`] and [`GpuContext::on_devices`] name them. Not there
//! yet: graph indexes and Python bindings.
//!
//! ```
//! use hive_gpu::{GpuContext, GpuDistanceMetric, GpuVector};
//!
//! # fn main() -> Result<(), hive_gpu::HiveGpuError> {
//! let context = GpuContext::new()?; // HIVE_GPU_BACKEND=cpu|cuda|rocm|vulkan overrides
//! let storage = context.create_storage(3, GpuDistanceMetric::Euclidean)?;
//! storage.add_vectors(&[
//!     GpuVector::new("a", vec![0.0, 0.0, 1.0]),
//!     GpuVector::new("b", vec![0.0, 1.0, 0.0]),
//!     GpuVector::new("c", vec![1.0, 0.0, 0.0]),
//! ])?;
//! // Adding an existing id replaces it (upsert).
//! storage.add_vectors(&[GpuVector::new("c", vec![0.0, 0.9, 0.1])])?;
//!
//! let hits = storage.search(&[0.0, 1.0, 0.0], 2)?;
//! assert_eq!(hits[0].id, "b");
//! assert_eq!(hits[1].id, "c");
//! assert!(hits[0].score < 1e-6); // Euclidean score: the distance, lower is better
//!
//! // Many queries at once (row-major), one result list per query.
//! let batch = storage.search_batch(&[1.0, 0.0, 0.0, 0.0, 0.0, 1.0], 1)?;
//! assert_eq!(batch[1][0].id, "a");
//!
//! storage.remove_vectors(&["a"])?;
//! assert_eq!(storage.vector_count(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! Every search is exact: the neighbours are those an f64 brute force finds (ties ordered by
//! storage order) and scores are computed in f64. See [`GpuSearchResult`] for what `score`
//! means per metric.

#![warn(missing_docs)]

pub mod backend;
mod collection;
pub mod devices;
pub mod error;
mod exact;
mod exec;
mod filter;
mod id_slots;
mod index;
pub mod io;
mod memory;
mod multi;
mod payload;
pub mod persist;
mod results;
pub mod slots;
pub mod tuning;
pub mod types;

use std::path::Path;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub use backend::{GpuBackend, Neighbor, RowStore, detect_available_backends, select_best_backend};
pub use devices::{DeviceSelector, list_devices};
pub use error::{HiveGpuError, Result};
pub use filter::{Filter, MAX_FILTER_DEPTH, PreparedFilter};
pub use index::kmeans::{KMeans, KMeansParams};
pub use index::spec::IndexSpec;
pub use multi::{ReplicatedStorage, ShardedStorage};
pub use payload::{Payload, PayloadValue};
pub use persist::{Durability, DurableOptions, LogStats};
pub use results::{ResultRow, SearchResults};
pub use tuning::Tuning;
pub use types::{
    BackendStatus, DEFAULT_BINARY_REFINE_FACTOR, DEFAULT_NPROBE, DEFAULT_PQ_REFINE_FACTOR,
    DEFAULT_REFINE_FACTOR, GpuBackendType, GpuDeviceInfo, GpuDistanceMetric, GpuSearchResult, GpuVector,
    IndexStats, Metadata, SearchOptions, SearchPrecision, SmolStr, StorageConfig, StoragePrecision,
};

use collection::Collection;

/// A handle on one device of one backend; creates collections there. Cheap to clone, `Send`
/// and `Sync`.
#[derive(Debug, Clone)]
pub struct GpuContext {
    backend: Arc<dyn GpuBackend>,
    /// The engines' knobs, read once when the context opened; every collection keeps a copy.
    tuning: Tuning,
}

impl GpuContext {
    /// A context on the best available backend (see [`select_best_backend`]); the
    /// `HIVE_GPU_BACKEND` environment variable (`cpu`, `cuda`, `rocm`, `vulkan`, `auto`)
    /// overrides the choice, and naming an unavailable backend is an error. Where
    /// `HIVE_GPU_DEVICES` is set ([`devices::DEVICES_VARIABLE`]), the context is on the first
    /// device it names.
    pub fn new() -> Result<Self> {
        if let Some(list) = devices::from_environment() {
            let (backend, ordinal) = devices::parse_device_list(&list, select_best_backend)?
                .into_iter()
                .next()
                .ok_or_else(|| HiveGpuError::InvalidArgument("HIVE_GPU_DEVICES names no device".into()))?;
            return Self::with_backend(backend, ordinal);
        }
        Self::with_backend(select_best_backend()?, 0)
    }

    /// A context on the device of `backend` that `device` names: an ordinal, or a PCI bus id
    /// (which stays the same when devices are renumbered). A PCI bus id no device has is an
    /// error listing the ones there are.
    pub fn with_device(backend: GpuBackendType, device: &DeviceSelector) -> Result<Self> {
        Self::with_backend(backend, devices::resolve(backend, device)?)
    }

    /// One context per device of a device list in `HIVE_GPU_DEVICES`'s syntax
    /// ([`devices::DEVICES_VARIABLE`]: `cuda:0,cuda:1`, `vulkan:all`, `0000:3b:00.0`), in its
    /// order; entries without a backend are on [`select_best_backend`]'s. What a sharded or
    /// replicated storage is made over.
    pub fn on_devices(list: &str) -> Result<Vec<Self>> {
        let tuning = Tuning::from_env()?;
        devices::parse_device_list(list, select_best_backend)?
            .into_iter()
            .map(|(backend, ordinal)| {
                Ok(Self { backend: backend::open(backend, ordinal)?, tuning: tuning.clone() })
            })
            .collect()
    }

    /// The devices this process is told to use: those of `HIVE_GPU_DEVICES` where it is set
    /// ([`GpuContext::on_devices`]), else every device of the best available backend.
    pub fn all_devices() -> Result<Vec<Self>> {
        match devices::from_environment() {
            Some(list) => Self::on_devices(&list),
            None => Self::on_devices(&format!("{}:all", select_best_backend()?.name())),
        }
    }

    /// A context on device `ordinal` of `backend`, tuned by the `HIVE_GPU_*` tuning variables
    /// set now ([`Tuning::from_env`]; a malformed one is an error naming it).
    pub fn with_backend(backend: GpuBackendType, ordinal: usize) -> Result<Self> {
        let tuning = Tuning::from_env()?;
        Ok(Self { backend: backend::open(backend, ordinal)?, tuning })
    }

    /// This context with `tuning` instead (for the collections it creates from now on): how
    /// code and tests force a path without touching the process's environment.
    pub fn with_tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// The knobs this context's collections run with.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// The backend this context runs on.
    pub fn backend_type(&self) -> GpuBackendType {
        self.backend.backend_type()
    }

    /// A context on a backend of the caller's: a [`GpuBackend`] implementation of its own,
    /// or one that wraps a real backend (to inject faults in tests, to count calls).
    pub fn from_backend(backend: Arc<dyn GpuBackend>) -> Self {
        Self { backend, tuning: Tuning::default() }
    }

    /// The backend's op set, for code that drives row stores directly.
    pub fn backend(&self) -> &dyn GpuBackend {
        self.backend.as_ref()
    }

    /// The backend as a shared handle (to wrap it, see [`GpuContext::from_backend`]).
    pub fn shared_backend(&self) -> Arc<dyn GpuBackend> {
        self.backend.clone()
    }

    /// The device's description, with memory figures read now.
    pub fn device_info(&self) -> GpuDeviceInfo {
        let mut info = self.backend.device_info();
        if self.tuning.own_gemm
            && matches!(self.backend.backend_type(), GpuBackendType::Cuda | GpuBackendType::Rocm)
            && let Some(driver) = info.driver_version.as_mut()
        {
            driver.push_str("; GEMMs on hive-gpu's own kernel (Tuning::own_gemm)");
        }
        info
    }

    /// An empty f32 collection of `dimension`-component vectors compared by `metric`.
    pub fn create_storage(&self, dimension: usize, metric: GpuDistanceMetric) -> Result<GpuVectorStorage> {
        self.create_storage_with(StorageConfig::new(dimension, metric))
    }

    /// An empty collection as `config` describes (dimension, metric, storage precision).
    pub fn create_storage_with(&self, config: StorageConfig) -> Result<GpuVectorStorage> {
        if config.dimension == 0 {
            return Err(HiveGpuError::InvalidArgument("dimension must be at least 1".into()));
        }
        let rows = self.backend.new_rows(config.dimension, config.precision, config.search, &self.tuning)?;
        Ok(GpuVectorStorage {
            backend: self.backend.clone(),
            tuning: self.tuning.clone(),
            inner: RwLock::new(Collection::new(config, rows)),
            log: None,
        })
    }

    /// An empty shard of a multi-device storage: a collection whose slots carry order keys.
    pub(crate) fn create_shard(&self, config: StorageConfig) -> Result<GpuVectorStorage> {
        if config.dimension == 0 {
            return Err(HiveGpuError::InvalidArgument("dimension must be at least 1".into()));
        }
        let rows = self.backend.new_rows(config.dimension, config.precision, config.search, &self.tuning)?;
        Ok(GpuVectorStorage {
            backend: self.backend.clone(),
            tuning: self.tuning.clone(),
            inner: RwLock::new(Collection::new_ordered(config, rows)),
            log: None,
        })
    }
}

impl GpuContext {
    /// Trains k-means on `vectors` (row-major, `dim` components each) with this context's
    /// device doing the assignments (the exact 1-NN of every training vector over the
    /// centroids): Lloyd's iterations from centroids sampled among the vectors, at most
    /// `params.max_training_vectors` of them used (sampled), empty clusters repaired by splitting
    /// the largest. Deterministic: the same input and seed give the same centroids on every
    /// backend. Vectors must be finite; clusters between 1 and the number of vectors.
    pub fn kmeans(&self, vectors: &[f32], dim: usize, params: &KMeansParams) -> Result<KMeans> {
        exec::run(|| index::kmeans::train(self.backend.as_ref(), &self.tuning, vectors, dim, params))?
    }
}

impl GpuContext {
    /// Opens the collection file at `path` (written by [`GpuVectorStorage::save`], on any
    /// backend) on this context's device. The whole file is checked (`docs/FORMAT.md`): a
    /// damaged or foreign file is [`HiveGpuError::InvalidFormat`] naming the part and the byte
    /// offset where it went wrong, and its vectors pass the same validation as
    /// [`GpuVectorStorage::add_vectors`]. Removed vectors are not loaded, so the collection
    /// opens compacted; the order of the rest (and so the order of ties) is kept.
    pub fn open_storage(&self, path: impl AsRef<Path>) -> Result<GpuVectorStorage> {
        let path = path.as_ref();
        self.open_storage_with_progress(path, &mut |_, _| {})
    }

    /// [`GpuContext::open_storage`], telling `progress` how many of the file's vectors are in
    /// the collection so far, and how many there are (for a progress bar).
    pub fn open_storage_with_progress(
        &self,
        path: impl AsRef<Path>,
        progress: persist::Progress<'_>,
    ) -> Result<GpuVectorStorage> {
        let path = path.as_ref();
        persist::with_checked(path, false, |file| self.storage_from(file, path, false, progress))
    }

    /// [`GpuContext::open_storage`], except that on the CPU backend the rows stay in the
    /// file, memory-mapped, and are searched where they lie: the open copies no vector, and a
    /// collection larger than this machine's memory opens and searches (the page cache keeps
    /// what fits). Only each row's norm (4 bytes) and the ids and payloads go to memory. The
    /// file's removed slots stay removed slots (the collection does not open compacted). The
    /// first write that adds vectors copies the rows into memory (and needs the memory for
    /// them); removals do not. On a GPU backend the rows go to the device as with
    /// [`GpuContext::open_storage`], and the mapping is dropped once they are there.
    ///
    /// # Safety
    ///
    /// The file must not be written to or truncated by anyone while the storage (or a clone
    /// of it) lives. hive-gpu itself never writes a collection file in place: a save writes a
    /// new file and renames it over the old one, which leaves this mapping on the old data, so
    /// saving the storage to its own path is fine. A change made in place by another program
    /// would change rows under the searches' feet (memory that Rust assumes immutable), and a
    /// truncation kills the process with SIGBUS at the next search.
    pub unsafe fn open_storage_mapped(&self, path: impl AsRef<Path>) -> Result<GpuVectorStorage> {
        // SAFETY: the caller's contract is this function's own.
        unsafe { self.open_storage_mapped_with_progress(path, &mut |_, _| {}) }
    }

    /// [`GpuContext::open_storage_mapped`], telling `progress` how many of the file's vectors
    /// are in the collection so far, and how many there are (for a progress bar: on a GPU
    /// backend the rows are uploaded; on the CPU the rows stay in the file and one report
    /// says so).
    ///
    /// # Safety
    ///
    /// As for [`GpuContext::open_storage_mapped`]: nobody may write to or truncate the file
    /// while the storage lives.
    pub unsafe fn open_storage_mapped_with_progress(
        &self,
        path: impl AsRef<Path>,
        progress: persist::Progress<'_>,
    ) -> Result<GpuVectorStorage> {
        let path = path.as_ref();
        persist::with_checked(path, true, |file| self.storage_from(file, path, true, progress))
    }

    /// A new collection holding the checked file `file` (at `path`), its vectors reported to
    /// `progress` as they go in; with `keep_mapped`, rows that a CPU store searches in place.
    fn storage_from(
        &self,
        file: &mut persist::Checked<'_>,
        path: &Path,
        keep_mapped: bool,
        progress: persist::Progress<'_>,
    ) -> Result<GpuVectorStorage> {
        let storage = self.create_storage_with(file.config())?;
        {
            let mut guard = storage.write();
            let collection: &mut Collection = &mut guard;
            exec::run(|| collection.restore(file.stored(keep_mapped), progress))?.map_err(|e| match e {
                HiveGpuError::VramLimitExceeded { .. } | HiveGpuError::OutOfMemory { .. } => e,
                other => HiveGpuError::InvalidFormat {
                    path: path.to_path_buf(),
                    format: persist::FORMAT_NAME,
                    reason: format!("its vectors do not load: {other}"),
                },
            })?;
            if let Some(stored) = file.index() {
                // An open that compacted numbers the live slots in order.
                let compacted = collection.slots() != file.slots();
                let mut rank = Vec::new();
                if compacted {
                    let removed = file.removed();
                    let mut next = 0u32;
                    rank = (0..file.slots())
                        .map(|s| {
                            let r = next;
                            next += u32::from(!removed.contains(s));
                            r
                        })
                        .collect();
                }
                let slot_of = |s: u32| if compacted { rank[s as usize] } else { s };
                let config = file.config();
                let index = exec::run(|| {
                    index::ivf::Ivf::from_stored(
                        self.backend.as_ref(),
                        &self.tuning,
                        &config,
                        collection.rows(),
                        stored,
                        slot_of,
                    )
                })?
                .map_err(|e| match e {
                    HiveGpuError::VramLimitExceeded { .. } | HiveGpuError::OutOfMemory { .. } => e,
                    other => HiveGpuError::InvalidFormat {
                        path: path.to_path_buf(),
                        format: persist::FORMAT_NAME,
                        reason: format!("its index does not load: {other}"),
                    },
                })?;
                collection.set_index(index);
            }
        }
        Ok(storage)
    }
}

impl GpuContext {
    /// Opens the durable collection at `path` on this context's device, creating it (empty,
    /// as `config` describes) when there is no file there. A durable collection is a snapshot
    /// file at `path` and a write-ahead log next to it (`path` with `.wal` added): every
    /// [`GpuVectorStorage::add_vectors`], [`GpuVectorStorage::add_vectors_flat`],
    /// [`GpuVectorStorage::remove_vectors`] and [`GpuVectorStorage::clear`] returns only once
    /// its record is in the log as `options.durability` says, so an acknowledged write
    /// survives a crash; concurrent writers share the log's flushes (group commit). Opening
    /// replays the log over the snapshot; a torn last record (a crash inside an append) is
    /// dropped. [`GpuVectorStorage::checkpoint`] folds the log into a new snapshot, as does a
    /// write that leaves the log longer than `options.checkpoint_log_bytes`.
    ///
    /// A write that fails is not logged and changes nothing. A write whose log flush fails
    /// took effect in this process but may not be durable: its error says so, and the log
    /// refuses writes until a checkpoint succeeds.
    ///
    /// An existing collection must have `config`'s dimension, metric and storage precision
    /// (an error says which differs). One storage at a time holds a durable collection (a lock
    /// on `path` with `.lock` added): a second open, in this process or another, fails until
    /// the first storage is dropped.
    pub fn open_durable(
        &self,
        path: impl AsRef<Path>,
        config: StorageConfig,
        options: DurableOptions,
    ) -> Result<GpuVectorStorage> {
        self.open_durable_with_progress(path, config, options, &mut |_, _| {})
    }

    /// [`GpuContext::open_durable`], telling `progress` how many of the snapshot's vectors
    /// are in the collection so far, and how many there are (for a progress bar; the log's
    /// writes are replayed after them).
    pub fn open_durable_with_progress(
        &self,
        path: impl AsRef<Path>,
        config: StorageConfig,
        options: DurableOptions,
        progress: persist::Progress<'_>,
    ) -> Result<GpuVectorStorage> {
        let (path, lock, exists) = persist::durable::claim(path.as_ref())?;
        let path = &path;
        let mut storage = if exists {
            persist::with_checked(path, false, |file| {
                persist::durable::check_config(path, &file.config(), &config)?;
                let storage = self.storage_from(file, path, false, progress)?;
                let log = persist::durable::Log::open(lock, path, file.id, &mut *storage.write(), options)?;
                Ok((storage, log))
            })?
        } else {
            let storage = self.create_storage_with(config)?;
            let log = persist::durable::Log::create(lock, path, &*storage.read(), options)?;
            (storage, log)
        };
        storage.0.log = Some(storage.1);
        Ok(storage.0)
    }
}

/// Whether `a` and `b` name the same file (the same path, or the same file on disk).
fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
}

/// A collection of vectors with string ids on one device, searched exactly.
///
/// All methods take `&self`: searches run concurrently with each other, and a write (add,
/// remove, clear) waits for running searches and blocks new ones while it runs. Share it
/// between threads with `Arc`.
#[derive(Debug)]
pub struct GpuVectorStorage {
    backend: Arc<dyn GpuBackend>,
    /// The context's knobs, for the stores an index creates.
    tuning: Tuning,
    inner: RwLock<Collection>,
    /// The write-ahead log of a durable collection ([`GpuContext::open_durable`]).
    log: Option<persist::durable::Log>,
}

impl GpuVectorStorage {
    // A panic cannot leave a collection half-updated (every update validates before it
    // writes), so a poisoned lock still guards consistent data.
    fn read(&self) -> RwLockReadGuard<'_, Collection> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Collection> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `change` under the write lock; on a durable collection, logs `record()` once the
    /// change has taken effect (still under the lock, so the log's order is the order of the
    /// changes) and returns once the log holds it durably. A change that fails is not logged.
    fn write_logged(
        &self,
        count: usize,
        record: impl FnOnce() -> persist::log::PendingRecord,
        change: impl FnOnce(&mut Collection) -> Result<()> + Send,
    ) -> Result<()> {
        let Some(log) = &self.log else {
            let mut guard = self.write();
            let collection: &mut Collection = &mut guard;
            let small = collection.is_small_write(count);
            return exec::run_small(small, || change(collection))?;
        };
        // Encoded before the lock is taken: other writers need not wait for it.
        let record = record();
        let ticket = {
            let mut guard = self.write();
            log.check_writable()?;
            let collection: &mut Collection = &mut guard;
            let small = collection.is_small_write(count);
            exec::run_small(small, || change(collection))??;
            log.append(&record)
        };
        log.wait(ticket)?;
        if log.wants_checkpoint() {
            // The write is durable in the log whatever happens here: a failed checkpoint is
            // reported by the next write (the log refuses writes until one succeeds) and by
            // `checkpoint`, not by this write.
            let _ = log.checkpoint_if_due(&*self.read());
        }
        Ok(())
    }

    /// Adds vectors; an id already present is replaced with the new data and payload (upsert),
    /// and a removed id can be added again. A batch is all or nothing: it is checked first
    /// (dimension, finite values, no id twice, non-zero under cosine), and a failure anywhere
    /// (a bad vector, memory, a device error) leaves the collection as it was.
    pub fn add_vectors(&self, vectors: &[GpuVector]) -> Result<()> {
        self.write_logged(
            vectors.len(),
            || {
                persist::log::PendingRecord::upsert(vectors.len(), self.dimension(), |i| {
                    let v = &vectors[i];
                    (&v.id, &v.data, &v.metadata, &v.payload)
                })
            },
            |collection| collection.upsert(vectors),
        )
    }

    /// [`GpuVectorStorage::add_vectors`] for vectors without payloads given as one row-major
    /// array: `ids.len() * dimension` values, vector `i` at `values[i * dimension..]`. Nothing
    /// is copied per vector, so loading a large matrix costs no more memory than the matrix.
    pub fn add_vectors_flat<S: AsRef<str> + Sync>(&self, ids: &[S], values: &[f32]) -> Result<()> {
        let batch = collection::FlatBatch { ids, values };
        self.write_logged(
            ids.len(),
            || {
                // Looked up only for a durable collection: a plain write takes one lock.
                let dim = self.dimension();
                // A batch whose values do not match its ids fails in the upsert; its record
                // (never logged) holds what there is.
                let (empty_metadata, empty_payload) = (Metadata::new(), Payload::new());
                persist::log::PendingRecord::upsert(ids.len(), dim, |i| {
                    let row = values.get(i * dim..(i + 1) * dim).unwrap_or(&[]);
                    (ids[i].as_ref(), row, &empty_metadata, &empty_payload)
                })
            },
            |collection| collection.upsert(&batch),
        )
    }

    /// Makes room for `additional` more vectors, so that adding them does not reallocate
    /// (like `Vec::reserve`). Fails with [`HiveGpuError::VramLimitExceeded`] when the device
    /// lacks the memory, changing nothing.
    pub fn reserve(&self, additional: usize) -> Result<()> {
        let mut guard = self.write();
        let collection: &mut Collection = &mut guard;
        exec::run(|| collection.reserve(additional))?
    }

    /// The `k` nearest neighbours of `query`, best first. `k` larger than the collection
    /// returns every vector.
    pub fn search(&self, query: &[f32], k: usize) -> Result<Vec<GpuSearchResult>> {
        self.search_with(query, k, &SearchOptions::default())
    }

    /// `filter` turned into this collection's slots now, for many searches to reuse
    /// (`SearchOptions::with_filter(Filter::Prepared(..))`, or [`Self::search_filtered`]): the
    /// slots are read as they are while the collection is unchanged, and the filter is
    /// evaluated again by searches after a change, so a prepared filter is never stale.
    pub fn prepare_filter(&self, filter: &Filter) -> Result<PreparedFilter> {
        self.read().prepare(filter)
    }

    /// The `k` nearest neighbours of `query` among the vectors that pass `filter`, best first
    /// (all of them when fewer than `k` pass; none when none does). Exact, like every search.
    pub fn search_filtered(&self, query: &[f32], k: usize, filter: &Filter) -> Result<Vec<GpuSearchResult>> {
        self.search_with(query, k, &SearchOptions::default().with_filter(filter.clone()))
    }

    /// [`GpuVectorStorage::search`] with options (e.g. returning payloads).
    pub fn search_with(
        &self,
        query: &[f32],
        k: usize,
        options: &SearchOptions,
    ) -> Result<Vec<GpuSearchResult>> {
        let dim = self.dimension();
        if query.len() != dim {
            return Err(HiveGpuError::DimensionMismatch { expected: dim, actual: query.len(), id: None });
        }
        // Parallel work of a search runs on the library's pool where it arises (`exec`): a
        // single GPU query has none, and keeps the caller's thread.
        let mut lists = index::flat::search(&self.read(), query, k, options, &self.tuning)?;
        lists.pop().ok_or_else(|| HiveGpuError::Internal("search returned no result list".into()))
    }

    /// The `k` nearest neighbours of every query in `queries` (row-major, `nq * dimension`
    /// values), one list per query in order. Batches run as matrix products tiled with the
    /// selection, much faster than one call per query. Batches of 4,096 queries and more are
    /// searched in pieces of about 2,048, four at a time (by default: [`Tuning::piece_queries`]
    /// and [`Tuning::piece_workers`]), so that preparing queries and building results overlaps
    /// the device's work; a CUDA/ROCm batch over at most 16,384 rows at k <= 16 in pieces of
    /// 1,024, eight at a time ([`Tuning::small_search_rows`]). A GPU keeps up to as many search
    /// workspaces as pieces it searched at once.
    pub fn search_batch(&self, queries: &[f32], k: usize) -> Result<Vec<Vec<GpuSearchResult>>> {
        self.search_batch_with(queries, k, &SearchOptions::default())
    }

    /// [`GpuVectorStorage::search_batch`] with options.
    pub fn search_batch_with(
        &self,
        queries: &[f32],
        k: usize,
        options: &SearchOptions,
    ) -> Result<Vec<Vec<GpuSearchResult>>> {
        index::flat::search(&self.read(), queries, k, options, &self.tuning)
    }

    /// [`GpuVectorStorage::search_batch_with`] into flat arrays: every neighbour's id, score
    /// and slot, row after row ([`SearchResults`]), without a list or a structure per query.
    /// The shape to hand to Python or over a network.
    pub fn search_batch_results(
        &self,
        queries: &[f32],
        k: usize,
        options: &SearchOptions,
    ) -> Result<SearchResults> {
        index::flat::search_results(&self.read(), queries, k, options, &self.tuning)
    }

    /// [`GpuVectorStorage::search_batch_results`] into `out`, reusing its arrays where they
    /// hold room enough: a server or a binding that searches batch after batch into the same
    /// results allocates and pads no fresh memory for each (FAISS's `search` into the caller's
    /// arrays). Every row is written, its padding too; after an error `out` holds no
    /// meaningful rows.
    ///
    /// ```
    /// use hive_gpu::{GpuBackendType, GpuContext, GpuDistanceMetric, GpuVector, SearchOptions, SearchResults};
    ///
    /// let context = GpuContext::with_backend(GpuBackendType::Cpu, 0)?;
    /// let storage = context.create_storage(2, GpuDistanceMetric::Euclidean)?;
    /// storage.add_vectors(&[GpuVector::new("a", vec![0.0, 0.0]), GpuVector::new("b", vec![1.0, 0.0])])?;
    /// let mut results = SearchResults::default();
    /// for batch in [[0.1, 0.0, 0.9, 0.0], [0.8, 0.0, 0.2, 0.0]] {
    ///     storage.search_batch_results_into(&batch, 2, &SearchOptions::default(), &mut results)?;
    ///     assert_eq!((results.len(), results.k()), (2, 2));
    /// }
    /// assert_eq!(results.row(0).ids, ["b", "a"]);
    /// # Ok::<(), hive_gpu::HiveGpuError>(())
    /// ```
    pub fn search_batch_results_into(
        &self,
        queries: &[f32],
        k: usize,
        options: &SearchOptions,
        out: &mut SearchResults,
    ) -> Result<()> {
        index::flat::search_results_into(&self.read(), queries, k, options, &self.tuning, out)
    }

    /// Builds `spec`'s index over the vectors stored now and sends later searches through it
    /// ([`IndexSpec::Flat`] drops the index). An IVF index trains `nlist` k-means centroids
    /// on a sample of the vectors (256 per list at most) on this storage's device and files
    /// every vector under its nearest; vectors added afterwards are filed as they come and
    /// removed ones skipped, with no retraining. Searches then scan the lists of the
    /// `nprobe` centroids nearest each query ([`SearchOptions::with_nprobe`], default
    /// [`DEFAULT_NPROBE`]): approximate, but exact among the vectors of those lists, and
    /// equal to the exact search when `nprobe` covers every list; [`SearchOptions::with_exact`]
    /// bypasses the index. Fails, changing nothing a search sees, with fewer vectors than
    /// lists. [`GpuVectorStorage::save`] writes the index with the vectors (format version 2,
    /// `docs/FORMAT.md`) and an open restores it without retraining; on a durable collection
    /// `build_index` ends with a checkpoint, so the index survives a crash once it returns (an
    /// error from that checkpoint is returned with the index built in memory).
    pub fn build_index(&self, spec: IndexSpec) -> Result<()> {
        let mut guard = self.write();
        let collection: &mut Collection = &mut guard;
        exec::run(|| collection.build_index(self.backend.as_ref(), &self.tuning, spec))??;
        if let Some(log) = &self.log {
            log.checkpoint(&*guard)?;
        }
        Ok(())
    }

    /// The index searches go through ([`IndexSpec::Flat`] when none).
    pub fn index_spec(&self) -> IndexSpec {
        self.read().index().map_or(IndexSpec::Flat, |i| i.spec())
    }

    /// The index's shape: vectors per list (removed ones included until a compaction) and how
    /// it trained; None without an index.
    pub fn index_stats(&self) -> Option<IndexStats> {
        let collection = self.read();
        let index = collection.index()?;
        Some(IndexStats {
            spec: index.spec(),
            list_lengths: index.list_lengths(),
            training_vectors: index.trained.training_vectors,
            iterations: index.trained.iterations,
            memory_bytes: index.memory_bytes(),
            code_size: index.code_size(),
            quantizer_bytes: index.quantizer_bytes(),
        })
    }

    /// Removes vectors by id. Every id must be present and listed once; otherwise nothing is
    /// removed. Space is reclaimed automatically once removed slots reach a quarter of the
    /// storage.
    pub fn remove_vectors<S: AsRef<str> + Sync>(&self, ids: &[S]) -> Result<()> {
        self.write_logged(
            ids.len(),
            || persist::log::PendingRecord::remove(ids),
            |collection| collection.remove(ids),
        )
    }

    /// The stored vector (after the storage precision's rounding) and its payload.
    pub fn get_vector(&self, id: &str) -> Result<Option<GpuVector>> {
        self.read().get(id)
    }

    /// Whether `id` is in the collection.
    pub fn contains(&self, id: &str) -> bool {
        self.read().contains(id)
    }

    /// Number of vectors (removed ones excluded).
    pub fn vector_count(&self) -> usize {
        self.read().len()
    }

    /// Components per vector.
    pub fn dimension(&self) -> usize {
        self.read().config().dimension
    }

    /// The metric searches use.
    pub fn metric(&self) -> GpuDistanceMetric {
        self.read().config().metric
    }

    /// The collection's configuration.
    pub fn config(&self) -> StorageConfig {
        *self.read().config()
    }

    /// Removes every vector.
    pub fn clear(&self) -> Result<()> {
        self.write_logged(0, persist::log::PendingRecord::clear, |collection| {
            collection.clear();
            Ok(())
        })
    }

    /// Reclaims the slots of removed vectors now instead of waiting for the automatic
    /// threshold.
    pub fn compact(&self) -> Result<()> {
        let mut guard = self.write();
        let collection: &mut Collection = &mut guard;
        exec::run(|| collection.compact())?
    }

    /// Writes the collection to `path` (format: `docs/FORMAT.md`), replacing any file there
    /// only once the new one is complete and on disk: a crash at any moment leaves the old
    /// file or the new one, never a torn one. Writes wait while it runs; searches do not.
    /// [`GpuContext::open_storage`] opens it on any backend.
    ///
    /// On a durable collection, saving to its own snapshot's path is a
    /// [`GpuVectorStorage::checkpoint`] (a plain save there would orphan its log).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.save_with_progress(path, &mut |_, _| {})
    }

    /// [`GpuVectorStorage::save`], telling `progress` how many vectors are written so far, and
    /// how many slots there are (for a progress bar).
    pub fn save_with_progress(&self, path: impl AsRef<Path>, progress: persist::Progress<'_>) -> Result<()> {
        let path = path.as_ref();
        if let Some(log) = &self.log
            && same_file(path, log.snapshot())
        {
            return self.checkpoint();
        }
        persist::save(&self.read(), path, progress).map(|_| ())
    }

    /// On a durable collection ([`GpuContext::open_durable`]): writes a new snapshot of the
    /// collection and empties its log, so the next open replays nothing. Writes wait while it
    /// runs; searches do not. A collection that is not durable has no log: an error.
    pub fn checkpoint(&self) -> Result<()> {
        let Some(log) = &self.log else {
            return Err(HiveGpuError::InvalidArgument(
                "checkpoint needs a durable collection (GpuContext::open_durable)".into(),
            ));
        };
        log.checkpoint(&*self.read())
    }

    /// The write-ahead log's counters, on a durable collection.
    pub fn log_stats(&self) -> Option<LogStats> {
        self.log.as_ref().map(|log| log.stats())
    }

    /// Slots in use, removed-but-not-yet-reclaimed ones included.
    pub fn slot_count(&self) -> usize {
        self.read().slots()
    }

    /// Bytes the vectors occupy on the device, with their index's lists and centroids.
    pub fn memory_bytes(&self) -> usize {
        let collection = self.read();
        collection.rows().memory_bytes() + collection.index().map_or(0, |i| i.memory_bytes())
    }

    /// Whether the vectors live in page-locked host memory and stream through the device for
    /// each search: a CUDA or ROCm collection that outgrew the device's memory does (searches
    /// stay exact; their speed is the host-to-device link's, docs/PERFORMANCE.md). Where the
    /// vectors are is otherwise the backend's: device memory on a GPU, host memory on the CPU.
    pub fn rows_streamed(&self) -> bool {
        self.read().rows().streamed()
    }

    /// The backend the collection lives on.
    pub fn backend_type(&self) -> GpuBackendType {
        self.backend.backend_type()
    }
}
