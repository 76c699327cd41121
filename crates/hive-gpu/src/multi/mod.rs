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

mod merge;
mod replicated;
mod route;
mod sharded;

pub use replicated::ReplicatedStorage;
pub use sharded::ShardedStorage;

use std::sync::{Mutex, MutexGuard, RwLockReadGuard, RwLockWriteGuard};

use crate::collection::{Batch, Collection, StagedUpsert, check_values};
use crate::error::{HiveGpuError, Result};
use crate::payload::Payload;
use crate::types::{Metadata, StorageConfig};
use crate::{GpuContext, GpuVectorStorage};

/// Runs `work(i, item)` for every item at once: the first on the calling thread, the others on
/// threads of their own (each member's search or write blocks on its device; several members
/// must block at the same time). Results come back in the items' order. An item whose thread
/// the OS refuses runs on the calling thread, after the first.
fn on_each<T: Send, R: Send>(items: Vec<T>, work: impl Fn(usize, T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.into_iter().enumerate().map(|(i, item)| work(i, item)).collect();
    }
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|item| Mutex::new(Some(item))).collect();
    let take = |i: usize| lock(&slots[i]).take();
    let run = |i: usize| take(i).map(|item| work(i, item));
    std::thread::scope(|scope| {
        let spawned: Vec<_> = (1..slots.len())
            .map(|i| {
                let run = &run;
                std::thread::Builder::new()
                    .name(format!("hive-gpu-member-{i}"))
                    .spawn_scoped(scope, move || run(i))
            })
            .collect();
        let mut out = vec![run(0)];
        for (i, handle) in (1..).zip(spawned) {
            out.push(match handle {
                Ok(handle) => handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => run(i),
            });
        }
        out.into_iter().map(|r| r.expect("every item runs once")).collect()
    })
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
    on_each(commits, |_, (collection, staged)| {
        // A commit's compaction may run parallel work: on the library's pool. (Only starting
        // the pool can fail here, and then the commit has not run: it runs right here.)
        let mut staged = Some(staged);
        if crate::exec::run(|| collection.commit_upsert(staged.take().expect("staged once"))).is_err()
            && let Some(staged) = staged
        {
            collection.commit_upsert(staged);
        }
    });
    Ok(())
}

/// Checks a batch of queries against `config` as a single collection's search does, and
/// returns how many there are.
fn check_queries(config: &StorageConfig, queries: &[f32], k: usize) -> Result<usize> {
    let dim = config.dimension;
    if k == 0 {
        return Err(HiveGpuError::InvalidArgument("k must be at least 1".into()));
    }
    if !queries.len().is_multiple_of(dim) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "a batch of {} values is not a whole number of {dim}-dimensional queries",
            queries.len()
        )));
    }
    for (i, q) in queries.chunks_exact(dim).enumerate() {
        check_values(q, config, crate::collection::Subject::Query(i))?;
    }
    Ok(queries.len() / dim)
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
    fn order(&self, i: usize) -> u64 {
        self.first_order + self.indices[i] as u64
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
