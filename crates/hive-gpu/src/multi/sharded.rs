//! [`ShardedStorage`]: each vector on one of several shards (devices, or logical shards of
//! one), every search on all of them at once, their top-k merged exactly.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::merge::{Placed, merge};
use super::route::Router;
use super::{
    Subset, check_contexts, check_queries, lock, logged, memory_weights, on_each, read_all, remove_all,
    upsert_all, write_all,
};
use crate::backend::{Neighbor, PARALLEL_RESULTS};
use crate::collection::{Collection, FlatBatch, check_batch};
use crate::error::{HiveGpuError, Result};
use crate::index::flat::{Resolved, fill_columns};
use crate::index::spec::IndexSpec;
use crate::persist::durable::{Log, Logged};
use crate::persist::log::{PendingRecord, SnapshotId};
use crate::persist::manifest::{self, Manifest, ShardEntry};
use crate::results::SearchResults;
use crate::types::{GpuVector, IndexStats, SearchOptions, StorageConfig};
use crate::{GpuContext, GpuVectorStorage};

/// What a sharded collection's manifest is called in errors.
const MANIFEST_NAME: &str = "hive-gpu sharded collection manifest";

/// A collection spread over several shards, each a collection on its own device (or several
/// on one device: logical shards), searched as one.
///
/// Every id lives on exactly one shard, chosen by a hash of the id weighted by the shards'
/// free device memory when the storage was created ([`ShardedStorage::create`]; or by the
/// caller's weights, [`ShardedStorage::create_weighted`]): adds and removes go to the shard
/// that owns the id, so the shards together hold more than any one device could. A search runs
/// on every shard at once, each on its own thread and device, and their top-k lists are merged
/// exactly, on the first shard's device where the others can copy theirs there
/// ([`ShardedStorage::merges_on_device`]), else on the host: the results are those of one
/// collection holding the same vectors, ties included (each vector keeps its place in the
/// storage's write order, and ties go by it, as one collection's go by slot). Results report that place as the neighbour's `index` (a slot of
/// one collection would be ambiguous across shards).
///
/// Writes are all or nothing over the shards (every shard stages its part, memory and uploads
/// included, before any commits), and a search sees a write on every shard or on none. Every
/// index type shards the same way: [`ShardedStorage::build_index`] trains one index per shard on
/// that shard's vectors, and a search probes each shard's lists (an IVF search with `nprobe`
/// scans `nprobe` lists of every shard).
///
/// [`ShardedStorage::save`] writes one collection file per shard and a manifest naming them
/// (`docs/FORMAT.md`, "Sharded collections"); [`ShardedStorage::open`] opens them on any
/// number of contexts (shard `i` on context `i % contexts.len()`).
///
/// ```
/// use hive_gpu::{GpuBackendType, GpuContext, GpuDistanceMetric, ShardedStorage, StorageConfig};
///
/// let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0)?;
/// // Two logical shards on one device; on a machine with GPUs, `GpuContext::all_devices()?`.
/// let storage = ShardedStorage::create(&[cpu.clone(), cpu], StorageConfig::new(2, GpuDistanceMetric::Euclidean))?;
/// storage.add_vectors_flat(&["a", "b", "c", "d"], &[0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])?;
/// let hits = storage.search(&[0.9, 0.1], 2)?;
/// assert_eq!(hits[0].id, "b");
/// assert_eq!(storage.shard_sizes().iter().sum::<usize>(), 4);
/// # Ok::<(), hive_gpu::HiveGpuError>(())
/// ```
#[derive(Debug)]
pub struct ShardedStorage {
    config: StorageConfig,
    shards: Vec<GpuVectorStorage>,
    router: Router,
    /// Held by every write, save and checkpoint from start to end, so that writes take effect
    /// one at a time, in the order of their keys and of the log.
    writes: Mutex<()>,
    /// The order key the next write's first vector gets (changed only under `writes`).
    next_order: AtomicU64,
    /// The write-ahead log of a durable storage ([`ShardedStorage::open_durable`]).
    log: Option<Log>,
}

impl ShardedStorage {
    super::shared_methods!(ShardedStorage, "shard");

    /// An empty sharded collection with one shard per context, each routed a share of ids
    /// proportional to its device's free memory now (a device listed several times splits its
    /// memory among its shards; where a device does not report free memory, all shards weigh
    /// the same).
    pub fn create(contexts: &[GpuContext], config: StorageConfig) -> Result<Self> {
        check_contexts(contexts, "sharded")?;
        Self::create_weighted(contexts, config, &memory_weights(contexts))
    }

    /// [`ShardedStorage::create`] with the caller's routing weights, one per context (finite and
    /// positive): shard `i` receives a share `weights[i] / sum(weights)` of the ids.
    pub fn create_weighted(contexts: &[GpuContext], config: StorageConfig, weights: &[f64]) -> Result<Self> {
        check_contexts(contexts, "sharded")?;
        if weights.len() != contexts.len() || !weights.iter().all(|w| w.is_finite() && *w > 0.0) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{} contexts need as many finite, positive weights; got {weights:?}",
                contexts.len()
            )));
        }
        let shards = contexts.iter().map(|c| c.create_shard(config)).collect::<Result<Vec<_>>>()?;
        Ok(Self::of(config, shards, Router::new(weights.to_vec(), 0), 0))
    }

    fn of(config: StorageConfig, shards: Vec<GpuVectorStorage>, router: Router, next_order: u64) -> Self {
        Self {
            config,
            shards,
            router,
            writes: Mutex::new(()),
            next_order: AtomicU64::new(next_order),
            log: None,
        }
    }

    /// The shards, for the shared methods.
    fn members(&self) -> &[GpuVectorStorage] {
        &self.shards
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Live vectors on each shard, in shard order.
    pub fn shard_sizes(&self) -> Vec<usize> {
        self.shards.iter().map(GpuVectorStorage::vector_count).collect()
    }

    /// Each shard's routing weight, in shard order.
    pub fn shard_weights(&self) -> &[f64] {
        self.router.weights()
    }

    /// The shard that owns `id` (whether or not it is stored).
    pub fn shard_of(&self, id: &str) -> usize {
        self.router.shard_of(id)
    }

    /// Whether exact batches merge the shards' top-k lists on a device: the first shard's,
    /// every other shard copying its lists there (through peer access from another device).
    /// True for CUDA shards on one device or on devices with peer access to one another (with
    /// [`crate::Tuning::device_merge`] on), for batches of at least
    /// [`crate::Tuning::device_merge_min_queries`]; otherwise, and for searches through an
    /// index, the lists come back to the host and are merged there.
    pub fn merges_on_device(&self) -> bool {
        let guards = read_all(&self.shards);
        let collections: Vec<&Collection> = guards.iter().map(|g| &**g).collect();
        let exact = SearchOptions { exact: true, ..SearchOptions::default() };
        let nq = self.shards.first().map_or(1, |s| s.tuning.device_merge_min_queries);
        matches!(device_merge_buffer(&self.shards, &collections, nq, 1, &exact), Ok(Some(_)))
    }

    /// Each shard's device, in shard order.
    pub fn shard_devices(&self) -> Vec<crate::GpuDeviceInfo> {
        self.shards.iter().map(|s| s.backend.device_info()).collect()
    }

    /// Adds vectors, each to the shard that owns its id; an id already stored is replaced
    /// (upsert). All or nothing, as [`GpuVectorStorage::add_vectors`]: the batch is checked
    /// whole first, then every shard stages its part (memory, uploads) before any commits.
    pub fn add_vectors(&self, vectors: &[GpuVector]) -> Result<()> {
        self.upsert(vectors)
    }

    /// [`ShardedStorage::add_vectors`] for vectors without payloads in one row-major array
    /// (`ids.len() * dimension` values).
    pub fn add_vectors_flat<S: AsRef<str> + Sync>(&self, ids: &[S], values: &[f32]) -> Result<()> {
        self.upsert(&FlatBatch { ids, values })
    }

    fn upsert<B: crate::collection::Batch + ?Sized>(&self, batch: &B) -> Result<()> {
        crate::exec::run(|| check_batch(&self.config, batch))??;
        let dim = self.config.dimension;
        let record = || {
            PendingRecord::upsert(batch.len(), dim, |i| {
                (batch.id(i), batch.values(i, dim), batch.metadata(i), batch.payload(i))
            })
        };
        self.logged(record, || self.apply_upsert(batch))
    }

    /// Applies a checked batch (call with `writes` held): each shard stages its part, then all
    /// commit, or all abort.
    fn apply_upsert<B: crate::collection::Batch + ?Sized>(&self, batch: &B) -> Result<()> {
        let routed = self.route(batch.len(), |i| batch.id(i))?;
        let first_order = self.next_order.load(Ordering::Relaxed);
        let mut guards = write_all(&self.shards);
        let collections: Vec<&mut Collection> = guards.iter_mut().map(|g| &mut **g).collect();
        let parts = routed
            .iter()
            .map(|indices| (!indices.is_empty()).then_some(Subset { batch, indices, first_order }))
            .collect();
        upsert_all(collections, parts)?;
        self.next_order.store(first_order + batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn logged(
        &self,
        record: impl FnOnce() -> PendingRecord,
        change: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        logged(&self.writes, self.log.as_ref(), self, record, change)
    }

    /// Each shard's indices of a batch of `count` ids.
    fn route<'a>(&self, count: usize, id: impl Fn(usize) -> &'a str + Sync) -> Result<Vec<Vec<usize>>> {
        let owners: Vec<u32> = if count < 4096 {
            (0..count).map(|i| self.router.shard_of(id(i)) as u32).collect()
        } else {
            crate::exec::run(|| {
                (0..count).into_par_iter().map(|i| self.router.shard_of(id(i)) as u32).collect()
            })?
        };
        let mut routed = vec![Vec::new(); self.shards.len()];
        for (i, owner) in owners.into_iter().enumerate() {
            routed[owner as usize].push(i);
        }
        Ok(routed)
    }

    /// Removes vectors by id, each from its shard. Every id must be present and listed once;
    /// otherwise nothing is removed on any shard.
    pub fn remove_vectors<S: AsRef<str> + Sync>(&self, ids: &[S]) -> Result<()> {
        self.logged(|| PendingRecord::remove(ids), || self.apply_remove(ids))
    }

    /// Removes `ids` from their shards (call with `writes` held), all or none.
    fn apply_remove<S: AsRef<str> + Sync>(&self, ids: &[S]) -> Result<()> {
        let mut seen = std::collections::HashMap::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            if let Some(first) = seen.insert(id.as_ref(), i) {
                return Err(HiveGpuError::DuplicateId { id: id.as_ref().to_string(), first, second: i });
            }
        }
        let routed = self.route(ids.len(), |i| ids[i].as_ref())?;
        let mut guards = write_all(&self.shards);
        let mut slots = Vec::with_capacity(guards.len());
        for (guard, indices) in guards.iter().zip(&routed) {
            let mine: Vec<&str> = indices.iter().map(|&i| ids[i].as_ref()).collect();
            slots.push(guard.slots_to_remove(&mine)?);
        }
        let collections: Vec<(&mut Collection, Vec<usize>)> =
            guards.iter_mut().map(|g| &mut **g).zip(slots).filter(|(_, s)| !s.is_empty()).collect();
        remove_all(collections);
        Ok(())
    }

    /// [`ShardedStorage::search_batch_with`] into flat arrays ([`SearchResults`]); each
    /// neighbour's slot is its place in the storage's write order.
    pub fn search_batch_results(
        &self,
        queries: &[f32],
        k: usize,
        options: &SearchOptions,
    ) -> Result<SearchResults> {
        let guards = read_all(&self.shards);
        let collections: Vec<&Collection> = guards.iter().map(|g| &**g).collect();
        search_shards(&self.config, &self.shards, &collections, queries, k, options)
    }

    /// The stored vector and its payload, from the shard that owns `id`.
    pub fn get_vector(&self, id: &str) -> Result<Option<GpuVector>> {
        self.shards[self.router.shard_of(id)].get_vector(id)
    }

    /// Whether `id` is stored.
    pub fn contains(&self, id: &str) -> bool {
        self.shards[self.router.shard_of(id)].contains(id)
    }

    /// Live vectors over every shard.
    pub fn vector_count(&self) -> usize {
        self.shard_sizes().into_iter().sum()
    }

    /// Removes every vector from every shard.
    pub fn clear(&self) -> Result<()> {
        self.logged(PendingRecord::clear, || {
            self.apply_clear();
            Ok(())
        })
    }

    fn apply_clear(&self) {
        for mut guard in write_all(&self.shards) {
            guard.clear();
        }
    }

    /// Reclaims removed slots on every shard now.
    pub fn compact(&self) -> Result<()> {
        let _writing = lock(&self.writes);
        on_each(self.shards.iter().collect(), |_, shard| shard.compact()).into_iter().collect()
    }

    /// Builds `spec`'s index on every shard, each trained on its own vectors, at once; searches
    /// then go through them ([`IndexSpec::Flat`] drops them). All or nothing: if any shard's
    /// training fails (fewer vectors than lists, say), no shard's index changes.
    /// On a durable storage the build ends with a checkpoint, so the indexes survive a crash
    /// once it returns (an error from that checkpoint is returned with the indexes built).
    pub fn build_index(&self, spec: IndexSpec) -> Result<()> {
        let _writing = lock(&self.writes);
        build_everywhere(&self.shards, spec)?;
        match &self.log {
            Some(log) => log.checkpoint(self),
            None => Ok(()),
        }
    }

    /// The index searches go through ([`IndexSpec::Flat`] when none).
    pub fn index_spec(&self) -> IndexSpec {
        self.shards[0].index_spec()
    }

    /// Each shard's index, in shard order (None where a shard has none).
    pub fn index_stats(&self) -> Vec<Option<IndexStats>> {
        self.shards.iter().map(GpuVectorStorage::index_stats).collect()
    }

    /// Bytes the vectors and indexes occupy on the devices, over every shard.
    pub fn memory_bytes(&self) -> usize {
        self.shards.iter().map(GpuVectorStorage::memory_bytes).sum()
    }

    /// Writes the collection to `path`: each shard to a collection file of its own beside it
    /// (named after `path` and this save), then a manifest at `path` naming them, replaced in
    /// one rename. A crash at any moment leaves the previous save or this one whole: the
    /// manifest names the previous save's files until the rename, and those are deleted only
    /// after it. Writes wait while it runs; searches do not.
    ///
    /// On a durable storage, saving to its own manifest's path is a
    /// [`ShardedStorage::checkpoint`].
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if let Some(log) = &self.log
            && crate::same_file(path, log.snapshot())
        {
            return self.checkpoint();
        }
        let _writing = lock(&self.writes);
        self.save_locked(path).map(|_| ())
    }

    /// [`ShardedStorage::save`] with `writes` held (or the storage not yet shared): returns the
    /// manifest's identity (what a write-ahead log names as its base).
    fn save_locked(&self, path: &Path) -> Result<SnapshotId> {
        if path.file_name().is_none() {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{} names no file to save to",
                path.display()
            )));
        }
        let guards = read_all(&self.shards);
        let collections: Vec<&Collection> = guards.iter().map(|g| &**g).collect();
        let generation = next_generation(path)?;
        let files: Vec<Result<SnapshotId>> = on_each(collections.clone(), |i, collection| {
            crate::persist::save(collection, &manifest::shard_path(path, generation, i), &mut |_, _| {})
        });
        let remove_new = || {
            for i in 0..self.shards.len() {
                let _ = std::fs::remove_file(manifest::shard_path(path, generation, i));
            }
        };
        let mut shards = Vec::with_capacity(files.len());
        for ((file, weight), collection) in files.into_iter().zip(self.router.weights()).zip(&collections) {
            match file {
                Ok(file) => {
                    shards.push(ShardEntry { weight: *weight, file, vectors: collection.len() as u64 })
                }
                Err(error) => {
                    remove_new();
                    return Err(error);
                }
            }
        }
        let next_order = self.next_order.load(Ordering::Relaxed);
        let manifest = Manifest { generation, next_order, seed: self.router.seed(), shards };
        let bytes = manifest::encode(&manifest);
        if let Err(error) = write_manifest(path, &bytes) {
            remove_new();
            return Err(error);
        }
        remove_stale(path, generation);
        Ok(SnapshotId::of_header(&bytes, bytes.len() as u64))
    }

    /// Opens the durable sharded collection at `path` on `contexts` (shard `i` on context
    /// `i % contexts.len()`), creating it (empty, as `config` describes, one shard per
    /// context weighted as [`ShardedStorage::create`] weighs them) when there is no manifest
    /// there. Durable as [`crate::GpuContext::open_durable`] is: every add, removal and clear
    /// returns only once its record is in the write-ahead log at `path` + `.wal` as
    /// `options.durability` says, concurrent writers share the log's flushes, an open replays
    /// the log over the last snapshot (the manifest and its shard files) and drops a torn last
    /// record, and [`ShardedStorage::checkpoint`] (or a log past `options.checkpoint_log_bytes`)
    /// folds the log into a new snapshot. One storage at a time holds the collection (a lock at
    /// `path` + `.lock`). An existing collection must have `config`'s dimension, metric and
    /// storage precision.
    pub fn open_durable(
        path: impl AsRef<Path>,
        contexts: &[GpuContext],
        config: StorageConfig,
        options: crate::DurableOptions,
    ) -> Result<Self> {
        check_contexts(contexts, "sharded")?;
        let (mut storage, log) = super::open_durable_with(
            path.as_ref(),
            config,
            options,
            || Self::create(contexts, config),
            |path| {
                let bytes = read_manifest(path)?;
                let base = SnapshotId::of_header(&bytes, bytes.len() as u64);
                Ok((Self::open(path, contexts)?, base))
            },
        )?;
        storage.log = Some(log);
        Ok(storage)
    }

    /// Opens the sharded collection saved at `path` ([`ShardedStorage::save`]), shard `i` on
    /// `contexts[i % contexts.len()]` (so any number of devices opens it, one included). The
    /// manifest and every shard file are checked whole, and each shard file must be the one the
    /// manifest names (its length and header checksum): a damaged, foreign or mismatched file is
    /// [`HiveGpuError::InvalidFormat`] naming it. Every stored id must belong to the shard that
    /// holds it, so a file cannot break the routing later writes rely on. Removed vectors are
    /// not loaded (each shard opens compacted).
    pub fn open(path: impl AsRef<Path>, contexts: &[GpuContext]) -> Result<Self> {
        let path = path.as_ref();
        check_contexts(contexts, "sharded")?;
        let invalid = |path: &Path, reason: String| HiveGpuError::InvalidFormat {
            path: path.to_path_buf(),
            format: MANIFEST_NAME,
            reason,
        };
        let bytes = read_manifest(path)?;
        let manifest =
            crate::exec::run(|| manifest::parse(&bytes))?.map_err(|e| invalid(path, e.to_string()))?;
        let router = Router::new(manifest.shards.iter().map(|s| s.weight).collect(), manifest.seed);
        let opened: Vec<Result<GpuVectorStorage>> = on_each(manifest.shards.iter().collect(), |i, entry| {
            let file = manifest::shard_path(path, manifest.generation, i);
            let context = &contexts[i % contexts.len()];
            crate::persist::with_checked(&file, false, |checked| {
                if checked.id != entry.file {
                    return Err(invalid(
                        &file,
                        format!(
                            "shard {i}'s file has {} bytes and header checksum {:#010x}, the manifest names {} bytes and {:#010x} (a file of another save?)",
                            checked.id.file_bytes,
                            checked.id.header_crc,
                            entry.file.file_bytes,
                            entry.file.header_crc
                        ),
                    ));
                }
                context.storage_from(checked, &file, false, &mut |_, _| {})
            })
        });
        let shards = opened.into_iter().collect::<Result<Vec<_>>>()?;
        let config = shards[0].config();
        for (i, shard) in shards.iter().enumerate() {
            let file = manifest::shard_path(path, manifest.generation, i);
            if shard.config() != config {
                return Err(invalid(&file, format!("shard {i} is {:?}, shard 0 {config:?}", shard.config())));
            }
            let collection = shard.read();
            let Some(orders) = collection.orders() else {
                return Err(invalid(&file, format!("shard {i}'s file has no order section")));
            };
            if let Some(&last) = orders.last()
                && last >= manifest.next_order
            {
                return Err(invalid(
                    &file,
                    format!(
                        "shard {i} holds order key {last}, at or past the manifest's next key {}",
                        manifest.next_order
                    ),
                ));
            }
            let misplaced = crate::exec::run(|| {
                (0..collection.slots()).into_par_iter().find_map_any(|slot| {
                    let (id, _, _) = collection.entry(slot)?;
                    (router.shard_of(id) != i).then(|| id.to_string())
                })
            })?;
            if let Some(id) = misplaced {
                return Err(invalid(
                    &file,
                    format!("shard {i} holds id {id:?}, which shard {} owns", router.shard_of(&id)),
                ));
            }
        }
        Ok(Self::of(config, shards, router, manifest.next_order))
    }
}

/// Trains `spec`'s index on every member at once and installs them all, or none if any
/// training fails. (Replicas train the same index each: training is deterministic.)
pub(super) fn build_everywhere(members: &[GpuVectorStorage], spec: IndexSpec) -> Result<()> {
    let mut guards = write_all(members);
    if spec == IndexSpec::Flat {
        for (member, guard) in members.iter().zip(&mut guards) {
            guard.build_index(member.backend.as_ref(), &member.tuning, IndexSpec::Flat)?;
        }
        return Ok(());
    }
    let built = {
        let collections: Vec<(&GpuVectorStorage, &Collection)> =
            members.iter().zip(guards.iter().map(|g| &**g)).collect();
        on_each(collections, |_, (member, collection)| {
            crate::exec::run(|| {
                crate::index::ivf::Ivf::build(member.backend.as_ref(), &member.tuning, collection, spec)
            })
            .and_then(|built| built)
        })
    };
    let built = built.into_iter().collect::<Result<Vec<_>>>()?;
    for (guard, index) in guards.iter_mut().zip(built) {
        guard.set_index(index);
    }
    Ok(())
}

/// The exact top-k of a batch over `collections` (the shards, read-locked), merged.
fn search_shards(
    config: &StorageConfig,
    shards: &[GpuVectorStorage],
    collections: &[&Collection],
    queries: &[f32],
    k: usize,
    options: &SearchOptions,
) -> Result<SearchResults> {
    let batch = check_queries(config, queries, k)?;
    let nq = batch.nq;
    if nq == 0 {
        return Ok(SearchResults::padded(0, 0, options.with_metadata));
    }
    if collections.iter().all(|c| c.len() == 0) {
        return Err(HiveGpuError::EmptyCollection);
    }
    let began = std::time::Instant::now();
    let key = |shard: usize, slot: usize| collections[shard].order_of(slot).unwrap_or(slot as u64);
    if let Some(buffer) = device_merge_buffer(shards, collections, nq, k, options)? {
        let written = on_each(collections.iter().zip(shards).collect(), |list, (collection, shard)| {
            if collection.len() == 0 {
                return buffer.set_width(list, 0);
            }
            crate::index::flat::neighbours_into(collection, batch, k, options, &shard.tuning, &*buffer, list)
        });
        written.into_iter().collect::<Result<()>>()?;
        let searched_at = began.elapsed();
        let merged = buffer.merge()?;
        let placed = placed_from(&merged, nq, key)?;
        let at = (began, searched_at, "device");
        return fill_merged(config, shards, collections, &placed, merged.k, options, at);
    }
    let found: Vec<Result<(usize, Vec<Vec<Neighbor>>)>> =
        on_each(collections.iter().zip(shards).collect(), |_, (collection, shard)| {
            if collection.len() == 0 {
                return Ok((0, vec![Vec::new(); nq]));
            }
            crate::index::flat::neighbours(collection, batch, k, options, &shard.tuning)
        });
    let found = found.into_iter().collect::<Result<Vec<_>>>()?;
    let searched_at = began.elapsed();
    let k = k.min(found.iter().map(|(k, _)| k).sum());
    if k == 0 {
        return Ok(SearchResults::padded(nq, 0, options.with_metadata));
    }
    let merge_one = |q: usize| {
        let lists: Vec<&[Neighbor]> = found.iter().map(|(_, lists)| lists[q].as_slice()).collect();
        merge(&lists, k, key)
    };
    let merged: Vec<Vec<Placed>> = if nq * k >= PARALLEL_RESULTS {
        crate::exec::run(|| (0..nq).into_par_iter().map(merge_one).collect())?
    } else {
        (0..nq).map(merge_one).collect()
    };
    drop(found);
    fill_merged(config, shards, collections, &merged, k, options, (began, searched_at, "host"))
}

/// Results of the shards' lists merged: `k` columns, each query's list at most `k` long (an
/// index search's may be shorter: its probed lists can hold fewer rows). `timing` is when the
/// search began, when the shards had answered, and where the lists were merged, for the
/// profile.
fn fill_merged(
    config: &StorageConfig,
    shards: &[GpuVectorStorage],
    collections: &[&Collection],
    merged: &[Vec<Placed>],
    k: usize,
    options: &SearchOptions,
    timing: (std::time::Instant, std::time::Duration, &str),
) -> Result<SearchResults> {
    let (began, searched_at, merged_on) = timing;
    let nq = merged.len();
    let mut results = SearchResults::padded(nq, k, options.with_metadata);
    if k == 0 {
        return Ok(results);
    }
    let merged_at = began.elapsed();
    let rows =
        results.split_rows(&[nq]).pop().ok_or_else(|| HiveGpuError::Internal("no rows to fill".into()))?;
    // The first shard's knob, as for the device merge (the shards share one context's).
    let parallel_from = shards.first().map_or(PARALLEL_RESULTS, |s| s.tuning.parallel_results);
    fill_columns(config.metric, merged, rows, parallel_from, |p: &Placed| {
        let (id, metadata, payload) =
            collections[p.shard as usize].entry(p.neighbour.slot).ok_or_else(|| {
                HiveGpuError::Internal(format!(
                    "shard {} returned removed slot {}",
                    p.shard, p.neighbour.slot
                ))
            })?;
        Ok(Resolved { slot: p.key as usize, id, metadata, payload, distance: p.neighbour.distance })
    })?;
    if crate::backend::profiling() {
        eprintln!(
            "hive-gpu profile (sharded batch of {nq}, ms): shards {:.3}, merge on the {merged_on} {:.3}, results {:.3}",
            searched_at.as_secs_f64() * 1e3,
            (merged_at - searched_at).as_secs_f64() * 1e3,
            (began.elapsed() - merged_at).as_secs_f64() * 1e3
        );
    }
    Ok(results)
}

/// A buffer on the first shard's device into which every shard's search can write its lists
/// (`crate::backend::merge`), for an exact search with the device merge on and at least
/// `Tuning::device_merge_min_queries` queries: None where some
/// shard cannot reach it (another backend, no peer access between the devices, more shards
/// than one merge takes), where a shard searches through its index, or where that device has
/// no room; the host merges then.
fn device_merge_buffer(
    shards: &[GpuVectorStorage],
    collections: &[&Collection],
    nq: usize,
    k: usize,
    options: &SearchOptions,
) -> Result<Option<Box<dyn crate::backend::MergeBuffer>>> {
    let Some(first) = collections.first() else { return Ok(None) };
    let wanted =
        shards.first().is_some_and(|s| s.tuning.device_merge && nq >= s.tuning.device_merge_min_queries);
    if !wanted || collections.len() < 2 || collections.iter().any(|c| c.index().is_some() && !options.exact) {
        return Ok(None);
    }
    // No list holds more than its shard's rows, nor the merge more than all of them.
    let width = k.min(collections.iter().map(|c| c.len()).max().unwrap_or(0)).max(1);
    let k = k.min(collections.iter().map(|c| c.len()).sum()).max(1);
    let Some(buffer) = first.rows().merge_buffer(nq, collections.len(), width, k)? else { return Ok(None) };
    Ok(collections.iter().all(|c| c.rows().can_write_into(&*buffer)).then_some(buffer))
}

/// The device merge's picks as the host merge gives them: the queries it flagged (a tie
/// between shards) merged here from the shards' lists, in order-key order.
fn placed_from(
    merged: &crate::backend::Merged,
    nq: usize,
    key: impl Fn(usize, usize) -> u64 + Sync,
) -> Result<Vec<Vec<Placed>>> {
    let k = merged.k;
    let pick = |q: usize| -> Vec<Placed> {
        (q * k..(q + 1) * k)
            .map(|e| {
                let (shard, slot) = (merged.lists[e], merged.slots[e] as usize);
                let neighbour = Neighbor { slot, distance: merged.distances[e] };
                Placed { shard, neighbour, key: key(shard as usize, slot) }
            })
            .collect()
    };
    let mut placed: Vec<Vec<Placed>> = if nq * k >= PARALLEL_RESULTS {
        crate::exec::run(|| (0..nq).into_par_iter().map(pick).collect())?
    } else {
        (0..nq).map(pick).collect()
    };
    for &q in &merged.tied {
        let lists: Vec<Vec<Neighbor>> = merged.sources.iter().map(|s| s.of(q)).collect();
        let lists: Vec<&[Neighbor]> = lists.iter().map(Vec::as_slice).collect();
        placed[q] = merge(&lists, k, &key);
    }
    Ok(placed)
}

/// A generation for a new save at `path`: past the current manifest's and past any shard file
/// left beside it (an interrupted save's), so a save never writes over a file a manifest names.
fn next_generation(path: &Path) -> Result<u64> {
    // Whatever is at `path` is read only if it could be a manifest (a large collection file saved
    // over is not read whole).
    let mut newest =
        read_manifest(path).ok().and_then(|bytes| manifest::parse(&bytes).ok()).map_or(0, |m| m.generation);
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let entries = std::fs::read_dir(dir).map_err(crate::persist::io_error(dir))?;
    for entry in entries.flatten() {
        if let Some(generation) = entry.file_name().to_str().and_then(|n| manifest::generation_of(path, n)) {
            newest = newest.max(generation);
        }
    }
    newest.checked_add(1).ok_or_else(|| {
        HiveGpuError::InvalidArgument(format!("{} has run out of save generations", path.display()))
    })
}

/// Replaces the file at `path` with `bytes` durably: a new file beside it, synced, renamed over
/// it, the directory synced.
fn write_manifest(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let temporary = crate::persist::temporary_path(path);
    let io = crate::persist::io_error(path);
    let written = (|| -> Result<()> {
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).open(&temporary).map_err(&io)?;
        file.write_all(bytes).map_err(&io)?;
        file.sync_all().map_err(&io)?;
        std::fs::rename(&temporary, path).map_err(&io)?;
        crate::persist::sync_directory_of(path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Deletes the shard files of every other generation beside `path` (the previous save's, an
/// interrupted save's): best effort, a file left behind is deleted by the next save.
fn remove_stale(path: &Path, keep: u64) {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if let Some(generation) = name.to_str().and_then(|n| manifest::generation_of(path, n))
            && generation != keep
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The manifest at `path`, refused without reading it when it is longer than any manifest.
fn read_manifest(path: &Path) -> Result<Vec<u8>> {
    let io = crate::persist::io_error(path);
    let longest = 64 + 32 * crate::persist::MAX_SHARDS as u64 + 4;
    let bytes = std::fs::metadata(path).map_err(&io)?.len();
    if bytes > longest {
        return Err(HiveGpuError::InvalidFormat {
            path: path.to_path_buf(),
            format: MANIFEST_NAME,
            reason: format!(
                "{bytes} bytes: a manifest has at most {longest} (is this a collection file? open it with GpuContext::open_storage)"
            ),
        });
    }
    std::fs::read(path).map_err(io)
}

/// A sharded storage's snapshot is its save (the shard files and the manifest); replayed writes
/// are routed as any write. The log's `write_snapshot` runs where no write can take effect: under
/// `writes` (a checkpoint), or before the storage is shared (its creation).
impl Logged for ShardedStorage {
    fn config(&self) -> StorageConfig {
        self.config
    }
    fn write_snapshot(&self, path: &Path) -> Result<SnapshotId> {
        self.save_locked(path)
    }
    fn replay_upsert(&mut self, batch: &crate::persist::Vectors) -> Result<()> {
        crate::exec::run(|| check_batch(&self.config, batch))??;
        self.apply_upsert(batch)
    }
    fn replay_remove(&mut self, ids: &[String]) -> Result<()> {
        self.apply_remove(ids)
    }
    fn replay_clear(&mut self) -> Result<()> {
        self.apply_clear();
        Ok(())
    }
}
