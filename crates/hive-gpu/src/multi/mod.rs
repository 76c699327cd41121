//! Storages spread over several devices: [`ShardedStorage`] (each vector on one device, every
//! search on all of them, merged exactly) and [`ReplicatedStorage`] (every vector on every
//! device, searches spread over them).
//!
//! Both are made of ordinary collections, one per member (a shard or a replica), each on its
//! own [`crate::GpuContext`]: a member runs exactly the code a [`crate::GpuVectorStorage`] runs,
//! so every index type, filter and backend works on them unchanged. Two members may share a
//! device (logical shards): that is how CI, with one CPU and no GPU, runs the same routing,
//! staging and merging that two GPUs run.
//!
//! Writes are all or nothing across the members: a write takes every member's write lock, stages
//! its part on each (validation, memory, the rows' upload: everything that can fail,
//! [`Collection::stage_upsert`]) and commits on all of them only once every member has staged,
//! else aborts on all. Searches hold every member's read lock, so a search sees a write on all
//! members or on none. Locks are always taken in member order, so a writer and a reader cannot
//! wait on each other.

/// The methods every multi-device storage has in the same words, written over its
/// `search_batch_results`, its `config`, `writes` and `log` and its `members()` (the
/// [`GpuVectorStorage`]s it is made of), so that the storages cannot drift apart.
macro_rules! shared_methods {
    ($storage:ident, $member:literal) => {
        /// The `k` nearest neighbours of `query`, best first.
        pub fn search(&self, query: &[f32], k: usize) -> crate::Result<Vec<crate::GpuSearchResult>> {
            self.search_with(query, k, &crate::SearchOptions::default())
        }

        /// The `k` nearest neighbours of `query` among the vectors that pass `filter`.
        pub fn search_filtered(
            &self,
            query: &[f32],
            k: usize,
            filter: &crate::Filter,
        ) -> crate::Result<Vec<crate::GpuSearchResult>> {
            self.search_with(query, k, &crate::SearchOptions::default().with_filter(filter.clone()))
        }

        #[doc = concat!("[`", stringify!($storage), "::search`] with options.")]
        pub fn search_with(
            &self,
            query: &[f32],
            k: usize,
            options: &crate::SearchOptions,
        ) -> crate::Result<Vec<crate::GpuSearchResult>> {
            super::check_query(&self.config, query)?;
            let mut lists = self.search_batch_results(query, k, options)?.to_lists();
            lists.pop().ok_or_else(|| crate::HiveGpuError::Internal("search returned no result list".into()))
        }

        /// The `k` nearest neighbours of every query of a row-major batch, one list per query.
        pub fn search_batch(&self, queries: &[f32], k: usize) -> crate::Result<Vec<Vec<crate::GpuSearchResult>>> {
            self.search_batch_with(queries, k, &crate::SearchOptions::default())
        }

        #[doc = concat!("[`", stringify!($storage), "::search_batch`] with options.")]
        pub fn search_batch_with(
            &self,
            queries: &[f32],
            k: usize,
            options: &crate::SearchOptions,
        ) -> crate::Result<Vec<Vec<crate::GpuSearchResult>>> {
            Ok(self.search_batch_results(queries, k, options)?.to_lists())
        }

        #[doc = concat!("`filter` turned into every ", $member, "'s slots now, for many searches to reuse (see")]
        /// [`crate::GpuVectorStorage::prepare_filter`]).
        pub fn prepare_filter(&self, filter: &crate::Filter) -> crate::Result<crate::PreparedFilter> {
            let guards = super::read_all(self.members());
            let parts = guards.iter().map(|g| g.prepare(filter)).collect::<crate::Result<Vec<_>>>()?;
            crate::PreparedFilter::combine(parts)
                .ok_or_else(|| crate::HiveGpuError::Internal(concat!("a storage without a ", $member).into()))
        }

        /// Components per vector.
        pub fn dimension(&self) -> usize {
            self.config.dimension
        }

        /// The metric searches use.
        pub fn metric(&self) -> crate::GpuDistanceMetric {
            self.config.metric
        }

        #[doc = concat!("The storage's configuration (every ", $member, "'s).")]
        pub fn config(&self) -> crate::StorageConfig {
            self.config
        }

        #[doc = concat!("On a durable storage ([`", stringify!($storage), "::open_durable`]): writes a new snapshot")]
        /// and empties the log, so the next open replays nothing. Writes wait while it runs;
        /// searches do not. A storage that is not durable has no log: an error.
        pub fn checkpoint(&self) -> crate::Result<()> {
            let Some(log) = &self.log else {
                return Err(crate::HiveGpuError::InvalidArgument(
                    concat!("checkpoint needs a durable storage (", stringify!($storage), "::open_durable)").into(),
                ));
            };
            let _writing = super::lock(&self.writes);
            log.checkpoint(self)
        }

        /// The write-ahead log's counters, on a durable storage.
        pub fn log_stats(&self) -> Option<crate::LogStats> {
            self.log.as_ref().map(|log| log.stats())
        }
    };
}
use shared_methods;

mod merge;
mod replicated;
mod route;
mod sharded;

pub use replicated::ReplicatedStorage;
pub use sharded::ShardedStorage;

use std::sync::{Mutex, MutexGuard, RwLockReadGuard, RwLockWriteGuard};

use crate::collection::{Batch, Collection, StagedUpsert};
use crate::error::{HiveGpuError, Result};
use crate::index::flat::check_queries;
use crate::payload::Payload;
use crate::types::{Metadata, StorageConfig};
use crate::{GpuContext, GpuVectorStorage};

/// The durable open both storages over several devices share ([`crate::GpuContext::open_durable`]
/// is the one-collection one): claims `path` (its lock), and where nothing is there creates the
/// storage with `create` and a new log; else opens the snapshot with `open` (the storage and the
/// snapshot's identity), refuses it unless it has `config`'s dimension,
/// metric and storage precision, and replays the log into it. The caller keeps the log.
fn open_durable_with<S: crate::persist::durable::Logged>(
    path: &std::path::Path,
    config: StorageConfig,
    options: crate::DurableOptions,
    create: impl FnOnce() -> Result<S>,
    open: impl FnOnce(&std::path::Path) -> Result<(S, crate::persist::log::SnapshotId)>,
) -> Result<(S, crate::persist::durable::Log)> {
    use crate::persist::durable::{Log, check_config, claim};
    let (path, lock, exists) = claim(path)?;
    if !exists {
        let storage = create()?;
        let log = Log::create(lock, &path, &storage, options)?;
        return Ok((storage, log));
    }
    let (mut storage, base) = open(&path)?;
    check_config(&path, &storage.config(), &config)?;
    let log = Log::open(lock, &path, base, &mut storage, options)?;
    Ok((storage, log))
}

/// Runs `work(i, item)` for every item at once: the first on the calling thread, the others on
/// the members' long-lived threads (`crate::exec::run_on_members`: each member's search or write
/// blocks on its device; several members must block at the same time). Results come back in
/// the items' order. Where those threads cannot be started, the items run here one after
/// another.
fn on_each<T: Send, R: Send>(items: Vec<T>, work: impl Fn(usize, T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.into_iter().enumerate().map(|(i, item)| work(i, item)).collect();
    }
    let count = items.len();
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|item| Mutex::new(Some(item))).collect();
    let done: Vec<Mutex<Option<R>>> = (0..count).map(|_| Mutex::new(None)).collect();
    let run = |i: usize| {
        let item = lock(&slots[i]).take();
        if let Some(item) = item {
            let result = work(i, item);
            *lock(&done[i]) = Some(result);
        }
    };
    let ran = crate::exec::run_on_members(|scope| {
        for i in 1..count {
            let run = &run;
            scope.spawn(move |_| run(i));
        }
        run(0);
    });
    if ran.is_err() {
        (0..count).for_each(run);
    }
    done.into_iter()
        .map(|d| {
            d.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner).expect("every item runs once")
        })
        .collect()
}

/// Locks a mutex that guards no invariant a panic could break (the write order's counter).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every member's collection, read-locked in member order.
fn read_all(members: &[GpuVectorStorage]) -> Vec<RwLockReadGuard<'_, Collection>> {
    members.iter().map(|m| m.read()).collect()
}

/// Every member's collection, write-locked in member order.
fn write_all(members: &[GpuVectorStorage]) -> Vec<RwLockWriteGuard<'_, Collection>> {
    members.iter().map(|m| m.write()).collect()
}

/// Stages `parts[i]` (None: nothing for member `i`) on every member at once and commits them
/// all, or, if any fails, aborts those that staged and returns the first member's error.
fn upsert_all<B: Batch + Send>(collections: Vec<&mut Collection>, parts: Vec<Option<B>>) -> Result<()> {
    let staged: Vec<(&mut Collection, Result<Option<StagedUpsert>>)> =
        on_each(collections.into_iter().zip(parts).collect(), |_, (collection, part)| {
            let staged = match part {
                Some(part) => crate::exec::run(|| collection.stage_upsert(&part)).and_then(|r| r).map(Some),
                None => Ok(None),
            };
            (collection, staged)
        });
    let mut first_error = None;
    let mut commits: Vec<(&mut Collection, StagedUpsert)> = Vec::new();
    for (collection, staged) in staged {
        match staged {
            Ok(Some(staged)) => commits.push((collection, staged)),
            Ok(None) => {}
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    if let Some(error) = first_error {
        for (collection, staged) in commits {
            collection.abort_upsert(staged);
        }
        return Err(error);
    }
    on_each(commits, |_, (collection, staged)| commit(collection, |c| c.commit_upsert(staged)));
    Ok(())
}

/// Removes `slots` from each member at once (each list checked by
/// [`Collection::slots_to_remove`]).
fn remove_all(removals: Vec<(&mut Collection, Vec<usize>)>) {
    on_each(removals, |_, (collection, slots)| commit(collection, |c| c.commit_remove(&slots)));
}

/// Runs a member's commit on the library's pool (a compaction it sets off runs parallel work
/// under the member's lock), or on this thread where the pool cannot start: a commit runs either
/// way, once.
fn commit(collection: &mut Collection, change: impl FnOnce(&mut Collection) + Send) {
    let mut change = Some(change);
    let on_pool = crate::exec::run(|| {
        if let Some(change) = change.take() {
            change(collection);
        }
    });
    if on_pool.is_err()
        && let Some(change) = change.take()
    {
        change(collection);
    }
}

/// One query's dimension check, as [`crate::GpuVectorStorage::search_with`] makes it.
fn check_query(config: &StorageConfig, query: &[f32]) -> Result<()> {
    if query.len() != config.dimension {
        return Err(HiveGpuError::DimensionMismatch {
            expected: config.dimension,
            actual: query.len(),
            id: None,
        });
    }
    Ok(())
}

/// The contexts' free device memory as routing weights: a device listed several times shares
/// its memory among its listings; where a device does not report its free memory, every
/// member weighs the same.
fn memory_weights(contexts: &[GpuContext]) -> Vec<f64> {
    let infos: Vec<crate::GpuDeviceInfo> = contexts.iter().map(|c| c.device_info()).collect();
    let same = |a: &crate::GpuDeviceInfo, b: &crate::GpuDeviceInfo| {
        a.backend == b.backend && a.device_id == b.device_id && a.pci_bus_id == b.pci_bus_id
    };
    let weights: Vec<f64> = infos
        .iter()
        .map(|info| {
            let sharing = infos.iter().filter(|other| same(info, other)).count().max(1);
            info.available_vram_bytes as f64 / sharing as f64
        })
        .collect();
    if weights.iter().all(|w| w.is_finite() && *w > 0.0) { weights } else { vec![1.0; contexts.len()] }
}

/// Runs `change` under `writes`; on a durable storage (`log`), logs `record()` once the change
/// has taken effect (still under `writes`, so the log's order is the order of the changes) and
/// returns once the log holds it durably, checkpointing `storage` when the log has grown past
/// its length. A change that fails is not logged. (The steps of one collection's
/// `GpuVectorStorage::write_logged`, with the storage's write lock for the collection's.)
fn logged(
    writes: &Mutex<()>,
    log: Option<&crate::persist::durable::Log>,
    storage: &dyn crate::persist::durable::Logged,
    record: impl FnOnce() -> crate::persist::log::PendingRecord,
    change: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let Some(log) = log else {
        let _writing = lock(writes);
        return change();
    };
    // Encoded before the lock is taken: other writers need not wait for it.
    let record = record();
    let ticket = {
        let _writing = lock(writes);
        log.check_writable()?;
        change()?;
        log.append(&record)
    };
    log.wait(ticket)?;
    if log.wants_checkpoint() {
        // Durable in the log whatever happens here: a failed checkpoint is reported by the next
        // write and by `checkpoint`.
        let _writing = lock(writes);
        let _ = log.checkpoint_if_due(storage);
    }
    Ok(())
}

/// Checks the members' contexts of a new storage.
fn check_contexts(contexts: &[GpuContext], what: &str) -> Result<()> {
    if contexts.is_empty() {
        return Err(HiveGpuError::InvalidArgument(format!("a {what} storage needs at least one context")));
    }
    if contexts.len() > crate::persist::MAX_SHARDS {
        return Err(HiveGpuError::InvalidArgument(format!(
            "{} contexts: a {what} storage has at most {}",
            contexts.len(),
            crate::persist::MAX_SHARDS
        )));
    }
    Ok(())
}

/// The part of a batch that goes to one shard: the vectors at `indices`, each keyed by its
/// place in the storage's write order (`first_order` plus its index in the whole batch).
struct Subset<'a, B: ?Sized> {
    batch: &'a B,
    indices: &'a [usize],
    first_order: u64,
}

impl<B: Batch + ?Sized> Batch for Subset<'_, B> {
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn id(&self, i: usize) -> &str {
        self.batch.id(self.indices[i])
    }
    fn values(&self, i: usize, dim: usize) -> &[f32] {
        self.batch.values(self.indices[i], dim)
    }
    fn metadata(&self, i: usize) -> &Metadata {
        self.batch.metadata(self.indices[i])
    }
    fn payload(&self, i: usize) -> &Payload {
        self.batch.payload(self.indices[i])
    }
    fn payload_bytes(&self) -> usize {
        self.indices
            .iter()
            .map(|&i| crate::collection::payload_bytes(self.batch.metadata(i), self.batch.payload(i)))
            .sum()
    }
    fn order(&self, i: usize) -> Option<u64> {
        Some(self.first_order + self.indices[i] as u64)
    }
}

/// A whole batch for each replica.
struct Whole<'a, B: ?Sized>(&'a B);

impl<B: Batch + ?Sized> Batch for Whole<'_, B> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn id(&self, i: usize) -> &str {
        self.0.id(i)
    }
    fn values(&self, i: usize, dim: usize) -> &[f32] {
        self.0.values(i, dim)
    }
    fn metadata(&self, i: usize) -> &Metadata {
        self.0.metadata(i)
    }
    fn payload(&self, i: usize) -> &Payload {
        self.0.payload(i)
    }
    fn payload_bytes(&self) -> usize {
        self.0.payload_bytes()
    }
    fn flat_values(&self) -> Option<&[f32]> {
        self.0.flat_values()
    }
}
