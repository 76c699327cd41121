//! [`ReplicatedStorage`]: every vector on every device, each search on the replicas least busy,
//! a batch split across them.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{
    Whole, check_contexts, check_queries, lock, logged, on_each, read_all, remove_all, upsert_all, write_all,
};
use crate::collection::{Collection, FlatBatch, check_batch};
use crate::error::{HiveGpuError, Result};
use crate::index::spec::IndexSpec;
use crate::persist::durable::{Log, Logged};
use crate::persist::log::{PendingRecord, SnapshotId};
use crate::results::SearchResults;
use crate::types::{GpuVector, IndexStats, SearchOptions, StorageConfig};
use crate::{GpuContext, GpuVectorStorage};

/// A collection copied onto several devices: each holds every vector, so any one answers any
/// search, and more devices answer more queries per second.
///
/// A batch is cut into pieces that every replica's workers take in turn, so that a faster or
/// less busy device answers more of them, and the pieces' results are put back in query order;
/// a search of one piece goes to the replica with the fewest searches running (single queries
/// from many threads spread over the devices). Writes go to every replica, all or nothing:
/// each stages the write (memory, uploads) before any commits, so the replicas always hold the
/// same vectors in the same write order, and every search returns exactly what one collection
/// would, on whichever replica it runs. (Their slots can differ after a compaction that failed
/// on one replica: each piece's filter is turned into its own replica's slots.)
/// [`ReplicatedStorage::build_index`] trains the same index on each replica (training is
/// deterministic: same vectors, same seed, same index on every backend).
///
/// [`ReplicatedStorage::save`] writes an ordinary collection file (one replica's);
/// [`ReplicatedStorage::open`] opens one on every context.
///
/// ```
/// use hive_gpu::{GpuBackendType, GpuContext, GpuDistanceMetric, ReplicatedStorage, StorageConfig};
///
/// let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0)?;
/// let storage = ReplicatedStorage::create(&[cpu.clone(), cpu], StorageConfig::new(2, GpuDistanceMetric::Euclidean))?;
/// storage.add_vectors_flat(&["a", "b"], &[0.0, 0.0, 1.0, 0.0])?;
/// let batch = storage.search_batch(&[0.9, 0.0, 0.1, 0.0], 1)?;
/// assert_eq!((batch[0][0].id.as_str(), batch[1][0].id.as_str()), ("b", "a"));
/// # Ok::<(), hive_gpu::HiveGpuError>(())
/// ```
#[derive(Debug)]
pub struct ReplicatedStorage {
    config: StorageConfig,
    replicas: Vec<GpuVectorStorage>,
    /// Searches running on each replica now.
    running: Vec<AtomicUsize>,
    /// Where the next search starts looking for an idle replica, so that ties rotate.
    turn: AtomicUsize,
    /// Held by every write, save and checkpoint from start to end: writes take effect one at a
    /// time, on every replica in the same order (and in the log's).
    writes: Mutex<()>,
    /// The write-ahead log of a durable storage ([`ReplicatedStorage::open_durable`]).
    log: Option<Log>,
}

/// Counts a search on a replica while it runs.
struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ReplicatedStorage {
    super::shared_methods!(ReplicatedStorage, "replica");

    /// An empty replicated collection with one replica per context.
    pub fn create(contexts: &[GpuContext], config: StorageConfig) -> Result<Self> {
        check_contexts(contexts, "replicated")?;
        let replicas = contexts.iter().map(|c| c.create_storage_with(config)).collect::<Result<Vec<_>>>()?;
        Ok(Self::of(config, replicas))
    }

    fn of(config: StorageConfig, replicas: Vec<GpuVectorStorage>) -> Self {
        let running = replicas.iter().map(|_| AtomicUsize::new(0)).collect();
        Self { config, replicas, running, turn: AtomicUsize::new(0), writes: Mutex::new(()), log: None }
    }

    /// The replicas, for the shared methods.
    fn members(&self) -> &[GpuVectorStorage] {
        &self.replicas
    }

    /// Number of replicas.
    pub fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    /// Each replica's device, in replica order.
    pub fn replica_devices(&self) -> Vec<crate::GpuDeviceInfo> {
        self.replicas.iter().map(|r| r.backend.device_info()).collect()
    }

    /// Adds vectors to every replica (an id already stored is replaced), all or nothing.
    pub fn add_vectors(&self, vectors: &[GpuVector]) -> Result<()> {
        self.upsert(vectors)
    }

    /// [`ReplicatedStorage::add_vectors`] for vectors without payloads in one row-major array.
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
        logged(&self.writes, self.log.as_ref(), self, record, || self.apply_upsert(batch))
    }

    /// Applies a checked batch to every replica (call with `writes` held), all or nothing.
    fn apply_upsert<B: crate::collection::Batch + ?Sized>(&self, batch: &B) -> Result<()> {
        let mut guards = write_all(&self.replicas);
        let collections: Vec<&mut Collection> = guards.iter_mut().map(|g| &mut **g).collect();
        let parts = (0..collections.len()).map(|_| Some(Whole(batch))).collect();
        upsert_all(collections, parts)
    }

    /// Removes vectors by id from every replica. Every id must be present and listed once;
    /// otherwise nothing is removed.
    pub fn remove_vectors<S: AsRef<str> + Sync>(&self, ids: &[S]) -> Result<()> {
        logged(
            &self.writes,
            self.log.as_ref(),
            self,
            || PendingRecord::remove(ids),
            || self.apply_remove(ids),
        )
    }

    /// Removes `ids` from every replica (call with `writes` held), all or none.
    fn apply_remove<S: AsRef<str>>(&self, ids: &[S]) -> Result<()> {
        let mut guards = write_all(&self.replicas);
        let slots = guards.iter().map(|g| g.slots_to_remove(ids)).collect::<Result<Vec<_>>>()?;
        let collections: Vec<(&mut Collection, Vec<usize>)> =
            guards.iter_mut().map(|g| &mut **g).zip(slots).collect();
        remove_all(collections);
        Ok(())
    }

    /// [`ReplicatedStorage::search_batch_with`] into flat arrays ([`SearchResults`]).
    pub fn search_batch_results(
        &self,
        queries: &[f32],
        k: usize,
        options: &SearchOptions,
    ) -> Result<SearchResults> {
        let batch = check_queries(&self.config, queries, k)?;
        let nq = batch.nq;
        let guards = read_all(&self.replicas);
        if nq == 0 {
            return Ok(SearchResults::padded(0, 0, options.with_metadata));
        }
        if guards[0].len() == 0 {
            return Err(HiveGpuError::EmptyCollection);
        }
        // Every replica takes pieces of the batch (a batch of one piece goes to the least busy).
        let chosen = self.least_busy(nq.min(self.replicas.len()));
        let _running: Vec<Running<'_>> = chosen
            .iter()
            .map(|&r| {
                self.running[r].fetch_add(1, Ordering::Relaxed);
                Running(&self.running[r])
            })
            .collect();
        let members: Vec<&Collection> = chosen.iter().map(|&r| &*guards[r]).collect();
        let mut results = SearchResults::default();
        crate::index::flat::search_results_across(
            &members,
            batch,
            k,
            options,
            &self.replicas[chosen[0]].tuning,
            &mut results,
        )?;
        Ok(results)
    }

    /// The `count` replicas with the fewest searches running, in replica order from a turn that
    /// rotates (so equal loads take turns).
    fn least_busy(&self, count: usize) -> Vec<usize> {
        let n = self.replicas.len();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        let mut order: Vec<usize> = (0..n).map(|i| (turn + i) % n).collect();
        order.sort_by_key(|&r| self.running[r].load(Ordering::Relaxed));
        order.truncate(count);
        order
    }

    /// The stored vector and its payload.
    pub fn get_vector(&self, id: &str) -> Result<Option<GpuVector>> {
        self.replicas[0].get_vector(id)
    }

    /// Whether `id` is stored.
    pub fn contains(&self, id: &str) -> bool {
        self.replicas[0].contains(id)
    }

    /// Live vectors (each replica holds them all).
    pub fn vector_count(&self) -> usize {
        self.replicas[0].vector_count()
    }

    /// Removes every vector from every replica.
    pub fn clear(&self) -> Result<()> {
        logged(&self.writes, self.log.as_ref(), self, PendingRecord::clear, || {
            self.apply_clear();
            Ok(())
        })
    }

    fn apply_clear(&self) {
        for mut guard in write_all(&self.replicas) {
            guard.clear();
        }
    }

    /// Reclaims removed slots on every replica now.
    pub fn compact(&self) -> Result<()> {
        let _writing = lock(&self.writes);
        on_each(self.replicas.iter().collect(), |_, replica| replica.compact()).into_iter().collect()
    }

    /// Builds `spec`'s index on every replica at once, all or nothing. On a durable storage the
    /// build ends with a checkpoint (an error from it is returned with the indexes built).
    pub fn build_index(&self, spec: IndexSpec) -> Result<()> {
        let _writing = lock(&self.writes);
        super::sharded::build_everywhere(&self.replicas, spec)?;
        match &self.log {
            Some(log) => log.checkpoint(self),
            None => Ok(()),
        }
    }

    /// The index searches go through ([`IndexSpec::Flat`] when none).
    pub fn index_spec(&self) -> IndexSpec {
        self.replicas[0].index_spec()
    }

    /// The index's shape (every replica's is the same).
    pub fn index_stats(&self) -> Option<IndexStats> {
        self.replicas[0].index_stats()
    }

    /// Bytes the vectors and indexes occupy on the devices, over every replica.
    pub fn memory_bytes(&self) -> usize {
        self.replicas.iter().map(GpuVectorStorage::memory_bytes).sum()
    }

    /// Writes the collection to `path` as an ordinary collection file (one replica's: they hold
    /// the same vectors), crash-safe as [`GpuVectorStorage::save`]. On a durable storage, saving
    /// to its own snapshot's path is a [`ReplicatedStorage::checkpoint`].
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if let Some(log) = &self.log
            && crate::same_file(path, log.snapshot())
        {
            return self.checkpoint();
        }
        let _writing = lock(&self.writes);
        crate::persist::save(&self.replicas[0].read(), path, &mut |_, _| {}).map(|_| ())
    }

    /// Opens the durable collection at `path` with one replica on each context, creating it
    /// (empty, as `config` describes) when there is no file there. Durable as
    /// [`crate::GpuContext::open_durable`] is, with the same files (a collection file at `path`
    /// and its write-ahead log at `path` + `.wal`): every write returns once its record is in the
    /// log as `options.durability` says, and an open replays the log into every replica.
    pub fn open_durable(
        path: impl AsRef<Path>,
        contexts: &[GpuContext],
        config: StorageConfig,
        options: crate::DurableOptions,
    ) -> Result<Self> {
        check_contexts(contexts, "replicated")?;
        let (mut storage, log) = super::open_durable_with(
            path.as_ref(),
            config,
            options,
            || Self::create(contexts, config),
            |path| {
                let base = crate::persist::snapshot_id(path)?;
                Ok((Self::open(path, contexts)?, base))
            },
        )?;
        storage.log = Some(log);
        Ok(storage)
    }

    /// Opens the collection file at `path` on every context, one replica each, at once.
    pub fn open(path: impl AsRef<Path>, contexts: &[GpuContext]) -> Result<Self> {
        check_contexts(contexts, "replicated")?;
        let path = path.as_ref();
        let opened = on_each(contexts.iter().collect(), |_, context| context.open_storage(path));
        let replicas = opened.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(Self::of(replicas[0].config(), replicas))
    }
}

/// A replicated storage's snapshot is one replica's collection file (they hold the same vectors);
/// replayed writes go to every replica. `write_snapshot` runs under `writes` (a checkpoint) or
/// before the storage is shared (its creation).
impl Logged for ReplicatedStorage {
    fn config(&self) -> StorageConfig {
        self.config
    }
    fn write_snapshot(&self, path: &Path) -> Result<SnapshotId> {
        crate::persist::save(&self.replicas[0].read(), path, &mut |_, _| {})
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
