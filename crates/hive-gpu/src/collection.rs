//! Ids and slots, payloads, tombstones and compaction: everything about a collection that does
//! not depend on the backend. Rows live in the backend's [`RowStore`]; this module decides
//! which slot holds which id.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use rayon::prelude::*;
use smol_str::SmolStr;

use crate::backend::RowStore;
use crate::error::{HiveGpuError, Result};
use crate::filter::{Filter, PreparedFilter, Target};
use crate::index::ivf::{Assigned, Ivf, Probe};
use crate::index::spec::IndexSpec;

/// Collection ids, unique in the process (see [`Collection::uid`]).
static NEXT_UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
use crate::id_slots::IdSlots;
use crate::payload::{INDEXED_VALUE_BYTES, Payload, PayloadIndex, PayloadValue, check_payload};
use crate::slots::SlotSet;
use crate::types::{GpuDistanceMetric, GpuVector, Metadata, StorageConfig, StoragePrecision};

/// Squared norms above this could overflow f32 arithmetic in distance kernels
/// (|q - x|^2 <= 2(|q|^2 + |x|^2) must stay under f32::MAX).
const MAX_SQUARED_NORM: f64 = 1e37;

/// Under cosine a stored vector's squared norm must be a normal f32 with room to spare: the
/// kernels scale products by 1/|x|, which amplifies underflow in them beyond any useful bound.
/// Cosine ignores scale, so such a vector can simply be scaled up.
const MIN_COSINE_SQUARED_NORM: f64 = 1e-36;

/// Host bytes one stored id costs: its entry, and its key and slot in the id map with the
/// map's spare room (a SwissTable runs up to 7/8 full). Ids beyond 23 bytes cost their length
/// more; payloads their own size.
const ENTRY_BYTES: usize =
    std::mem::size_of::<Option<Entry>>() + (std::mem::size_of::<(SmolStr, usize)>() + 1) * 8 / 7;

/// Vectors appended per call into the row store, bounding the temporary copy.
const APPEND_CHUNK: usize = 8192;

/// Bytes of stored rows appended per step of [`Collection::restore`]: several of a GPU's
/// upload chunks (so that filling one overlaps uploading another) and one step of a progress
/// bar.
const RESTORE_STEP_BYTES: usize = 128 << 20;

/// Values a small write may carry (`Collection::is_small_write`): no more than the smallest
/// amount any row store appends in parallel (the CPU rows' `PARALLEL_VALUES`, which wgpu's
/// host copy shares; the GPU engine stages 65,536 values per task), so a small write makes no
/// rayon call anywhere.
const SMALL_WRITE_VALUES: usize = 1 << 14;

/// Vectors per task of the parallel passes over a batch: small batches stay on the calling
/// thread.
const MIN_PARALLEL: usize = 512;

/// The id maps hash with foldhash (seeded per map, so still resistant to chosen collisions):
/// SipHash was a large share of adding vectors.
type IdMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Debug)]
struct Entry {
    /// Also the key in `slot_of`. Ids of up to 23 bytes live inline; longer ones share one
    /// allocation. Either way a search result's copy costs no allocation.
    id: SmolStr,
    /// None for an empty payload (the common case). Shared with the results that return it.
    metadata: Option<Arc<Metadata>>,
    /// None for no typed field (the common case). Shared with the results that return it.
    payload: Option<Arc<Payload>>,
}

impl Entry {
    fn new(id: &str, metadata: &Metadata, payload: &Payload) -> Self {
        Self {
            id: SmolStr::new(id),
            metadata: (!metadata.is_empty()).then(|| Arc::new(metadata.clone())),
            payload: (!payload.is_empty()).then(|| Arc::new(payload.clone())),
        }
    }

    /// [`Entry::new`], keeping the maps it is given instead of copying them.
    fn from_parts(id: &str, metadata: Metadata, payload: Payload) -> Self {
        Self {
            id: SmolStr::new(id),
            metadata: (!metadata.is_empty()).then(|| Arc::new(metadata)),
            payload: (!payload.is_empty()).then(|| Arc::new(payload)),
        }
    }

    /// Its string metadata and typed payload, as the payload index takes them.
    fn fields(&self) -> (&Metadata, &Payload) {
        (self.metadata(), self.payload())
    }

    fn metadata(&self) -> &Arc<Metadata> {
        static EMPTY: LazyLock<Arc<Metadata>> = LazyLock::new(Arc::default);
        self.metadata.as_ref().unwrap_or(&EMPTY)
    }

    fn payload(&self) -> &Arc<Payload> {
        static EMPTY: LazyLock<Arc<Payload>> = LazyLock::new(Arc::default);
        self.payload.as_ref().unwrap_or(&EMPTY)
    }
}

/// A collection: a row store plus the bookkeeping that maps ids to its slots.
#[derive(Debug)]
pub(crate) struct Collection {
    config: StorageConfig,
    rows: Box<dyn RowStore>,
    /// One per slot; None for a removed (tombstoned) slot.
    entries: Vec<Option<Entry>>,
    slot_of: IdSlots,
    /// The removed slots (the row store keeps the same set for its searches).
    removed: SlotSet,
    /// Every payload field's index, for filters.
    payloads: PayloadIndex,
    /// Which collection this is, process-wide, and how many changes it has seen: what a
    /// prepared filter checks before reusing its slots.
    uid: u64,
    version: u64,
    /// The approximate index searches go through unless they ask for exact results.
    index: Option<Ivf>,
    /// Each slot's place in the write order of the storage this collection is a shard of
    /// (`crate::multi`): strictly increasing with the slot, so that the shards' results merge
    /// with ties in the order one collection would give them. None for a collection of its own.
    order: Option<Vec<u64>>,
}

/// An upsert whose fallible part is done ([`Collection::stage_upsert`]): its rows are appended
/// to the row store (no search sees them while the writer holds the collection), and nothing
/// else has changed. [`Collection::commit_upsert`] makes it visible, [`Collection::abort_upsert`]
/// forgets it: how a write spread over several collections (shards, replicas) is all or nothing.
#[must_use = "a staged upsert must be committed or aborted"]
pub(crate) struct StagedUpsert {
    first_slot: usize,
    replaced: Vec<usize>,
    added: Vec<Entry>,
    assigned: Option<Assigned>,
    /// The new slots' order keys (empty for a collection without them).
    orders: Vec<u64>,
}

/// A collection file's contents in its slot order, for [`Collection::restore`].
pub(crate) struct Stored<'a> {
    /// One per slot; empty for a removed slot.
    pub(crate) ids: &'a [&'a str],
    /// One per slot (the restore takes them: an open's entries own what the file held).
    pub(crate) metadata: &'a mut [Metadata],
    /// One per slot (taken as the metadata is).
    pub(crate) payloads: &'a mut [Payload],
    /// The removed slots.
    pub(crate) removed: &'a SlotSet,
    /// Every slot's order key, for a shard's file (see `Collection::order`).
    pub(crate) order: Option<&'a [u64]>,
    /// The file's payload index section, unread (the restore reads it and checks it against
    /// the records); None for a file of a format before 4 (or without fields): then the index
    /// is built.
    pub(crate) payload_index: Option<(crate::persist::format::Section, &'a [u8])>,
    /// Every slot's row as the file stores it (little-endian elements of the precision).
    pub(crate) rows: &'a [u8],
    /// The same rows in a mapping that may outlive the open, for a row store that searches
    /// them in place.
    pub(crate) mapped: Option<crate::persist::MappedRows>,
}

/// The rows of `kept` (ascending file slots of `stored`) appended to `rows` as stored, in runs
/// of consecutive slots cut into steps of [`RESTORE_STEP_BYTES`].
fn append_stored_rows(
    rows: &mut dyn RowStore,
    stored: &Stored<'_>,
    kept: &[usize],
    dim: usize,
    precision: StoragePrecision,
    progress: crate::persist::Progress<'_>,
) -> Result<()> {
    let row_bytes = dim * crate::exact::elements::element_bytes(precision);
    rows.reserve(kept.len())?;
    let step = (RESTORE_STEP_BYTES / row_bytes).max(1);
    let (mut at, mut done) = (0, 0);
    while at < kept.len() {
        // A run of consecutive slots, at most a step long.
        let mut end = at + 1;
        while end < kept.len() && end - at < step && kept[end] == kept[end - 1] + 1 {
            end += 1;
        }
        rows.append_stored(
            &stored.rows[kept[at] * row_bytes..(kept[end - 1] + 1) * row_bytes],
            precision,
            dim,
        )?;
        done += end - at;
        progress(done as u64, kept.len() as u64);
        at = end;
    }
    Ok(())
}

/// Whose values are being checked, for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Subject<'a> {
    Vector(&'a str),
    Query(usize),
}

/// Checks that `values` can be stored or searched: right dimension, finite, bounded, and
/// non-zero under cosine.
fn subject_text(subject: Subject<'_>) -> String {
    match subject {
        Subject::Vector(_) => String::new(),
        Subject::Query(i) => format!("query {i}: "),
    }
}

/// The f64 sum of the squared values, in eight independent partial sums: one running sum is
/// a chain of dependent additions (about 4 cycles each, 0.17 us a 128-dimensional row), which
/// made checking the values of a million rows most of an open's restore on the development
/// VM (docs/PERFORMANCE.md, opening). Every check of a vector's norm goes through here, so a
/// vector is judged the same wherever it comes from.
fn squared_norm(values: &[f32]) -> f64 {
    let mut partial = [0f64; 8];
    let mut chunks = values.chunks_exact(8);
    for chunk in &mut chunks {
        for (sum, &x) in partial.iter_mut().zip(chunk) {
            *sum += f64::from(x) * f64::from(x);
        }
    }
    let rest: f64 = chunks.remainder().iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    partial.iter().sum::<f64>() + rest
}

pub(crate) fn check_values(values: &[f32], config: &StorageConfig, subject: Subject<'_>) -> Result<()> {
    let subject_id = || match subject {
        Subject::Vector(id) => Some(id.to_string()),
        Subject::Query(_) => None,
    };
    if values.len() != config.dimension {
        return Err(HiveGpuError::DimensionMismatch {
            expected: config.dimension,
            actual: values.len(),
            id: subject_id(),
        });
    }
    // The common case (valid input) allocates nothing: ids and texts are built on error only.
    // A vector must also be storable in the collection's type; a query need not.
    let stored_type = match subject {
        Subject::Vector(_) => config.precision,
        Subject::Query(_) => StoragePrecision::F32,
    };
    let storable = || match stored_type {
        StoragePrecision::F32 => crate::exact::all_finite(values),
        _ => values
            .iter()
            .all(|&x| x.is_finite() && crate::exact::elements::unrepresentable(x, stored_type).is_none()),
    };
    if !matches!(config.metric, GpuDistanceMetric::Cosine)
        && storable()
        && squared_norm(values) <= MAX_SQUARED_NORM
    {
        return Ok(());
    }
    let (id, what) = (subject_id(), subject_text(subject));
    if let Some((i, x)) = values.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(HiveGpuError::InvalidVector { id, reason: format!("{what}{x} at component {i}") });
    }
    let squared_norm = squared_norm(values);
    if squared_norm > MAX_SQUARED_NORM {
        return Err(HiveGpuError::InvalidVector {
            id,
            reason: format!("{what}squared norm {squared_norm:e} exceeds the supported {MAX_SQUARED_NORM:e}"),
        });
    }
    if config.metric == GpuDistanceMetric::Cosine && squared_norm == 0.0 {
        return Err(HiveGpuError::InvalidVector {
            id,
            reason: format!("{what}zero vector has no cosine similarity"),
        });
    }
    if let Subject::Vector(_) = subject
        && config.metric == GpuDistanceMetric::Cosine
        && squared_norm < MIN_COSINE_SQUARED_NORM
    {
        return Err(HiveGpuError::InvalidVector {
            id,
            reason: format!(
                "norm {:e} is too small for cosine (at least 1e-18); cosine ignores scale, so scale the vector up",
                squared_norm.sqrt()
            ),
        });
    }
    if let Subject::Vector(_) = subject
        && config.precision != StoragePrecision::F32
    {
        // Stored values are what searches see: each must exist in the stored type, and a
        // cosine row must not round to zero.
        let precision = config.precision;
        if let Some((i, x, why)) = values
            .iter()
            .enumerate()
            .find_map(|(i, &x)| crate::exact::elements::unrepresentable(x, precision).map(|why| (i, x, why)))
        {
            return Err(HiveGpuError::InvalidVector { id, reason: format!("{x} at component {i} {why}") });
        }
        let all_zero = values.iter().all(|&x| crate::exact::elements::stored_value(x, precision) == 0.0);
        if config.metric == GpuDistanceMetric::Cosine && all_zero {
            return Err(HiveGpuError::InvalidVector {
                id,
                reason: format!(
                    "becomes a zero vector when rounded to {precision}, which has no cosine similarity"
                ),
            });
        }
    }
    Ok(())
}

/// Checks a batch for an upsert into a collection of `config`, changing nothing: whole rows
/// (a flat batch), no empty id, valid values and payloads (the first bad vector of the batch is
/// reported), and no id twice.
pub(crate) fn check_batch<B: Batch + ?Sized>(config: &StorageConfig, batch: &B) -> Result<()> {
    let count = batch.len();
    if let Some(values) = batch.flat_values()
        && count.checked_mul(config.dimension) != Some(values.len())
    {
        return Err(HiveGpuError::InvalidArgument(format!(
            "{count} ids of dimension {} need {count} x {} values, got {}",
            config.dimension,
            config.dimension,
            values.len()
        )));
    }
    // Contents are checked in parallel (the first bad vector of the batch is reported), ids in
    // order.
    let check = |i: usize| {
        let id = batch.id(i);
        if id.is_empty() {
            return Some(HiveGpuError::InvalidArgument(format!("vector {i} of the batch has an empty id")));
        }
        check_values(batch.values(i, config.dimension), config, Subject::Vector(id))
            .and_then(|()| check_payload(id, batch.metadata(i), batch.payload(i)))
            .err()
    };
    // A small batch stays on this thread (see `exec::run_small`): no rayon call at all.
    let invalid = if count < MIN_PARALLEL / 8 {
        (0..count).find_map(check)
    } else {
        (0..count).into_par_iter().with_min_len(MIN_PARALLEL / 8).find_map_first(check)
    };
    if let Some(error) = invalid {
        return Err(error);
    }
    let mut first_seen: IdMap<&str, usize> = IdMap::with_capacity_and_hasher(count, Default::default());
    for i in 0..count {
        if let Some(first) = first_seen.insert(batch.id(i), i) {
            return Err(HiveGpuError::DuplicateId { id: batch.id(i).to_string(), first, second: i });
        }
    }
    Ok(())
}

impl Collection {
    pub(crate) fn new(config: StorageConfig, rows: Box<dyn RowStore>) -> Self {
        Self {
            config,
            rows,
            entries: Vec::new(),
            slot_of: IdSlots::default(),
            removed: SlotSet::default(),
            payloads: PayloadIndex::default(),
            uid: NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            version: 0,
            index: None,
            order: None,
        }
    }

    /// An empty collection whose slots carry order keys: a shard of a storage spread over
    /// several collections (`crate::multi`).
    pub(crate) fn new_ordered(config: StorageConfig, rows: Box<dyn RowStore>) -> Self {
        Self { order: Some(Vec::new()), ..Self::new(config, rows) }
    }

    /// Slot `slot`'s order key, for a collection that keeps them.
    pub(crate) fn order_of(&self, slot: usize) -> Option<u64> {
        self.order.as_ref()?.get(slot).copied()
    }

    /// Every slot's order key, for a collection that keeps them.
    pub(crate) fn orders(&self) -> Option<&[u64]> {
        self.order.as_deref()
    }

    pub(crate) fn config(&self) -> &StorageConfig {
        &self.config
    }

    pub(crate) fn rows(&self) -> &dyn RowStore {
        self.rows.as_ref()
    }

    /// Live vectors.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.removed.count()
    }

    /// Every payload field's index (a save stores it).
    pub(crate) fn payload_index(&self) -> &PayloadIndex {
        &self.payloads
    }

    /// The removed slots.
    pub(crate) fn removed(&self) -> &SlotSet {
        &self.removed
    }

    /// Slots in use, removed ones included.
    pub(crate) fn slots(&self) -> usize {
        self.entries.len()
    }

    /// Id, metadata and typed payload of a live slot.
    pub(crate) fn entry(&self, slot: usize) -> Option<(&SmolStr, &Arc<Metadata>, &Arc<Payload>)> {
        self.entries.get(slot)?.as_ref().map(|e| (&e.id, e.metadata(), e.payload()))
    }

    /// The live slots that pass `filter`.
    pub(crate) fn allowed<'f>(&self, filter: &'f Filter) -> Result<std::borrow::Cow<'f, SlotSet>> {
        let len = self.entries.len();
        let slot_of = |id: &str| self.slot_of.get(id).copied();
        let target = Target {
            len,
            index: &self.payloads,
            slot_of: &slot_of,
            collection: self.uid,
            version: self.version,
        };
        // A prepared filter still current holds live slots already (see `prepare`).
        if let Filter::Prepared(prepared) = filter
            && let Some(slots) = prepared.current_slots(self.uid, self.version)
        {
            return Ok(std::borrow::Cow::Borrowed(slots));
        }
        Ok(std::borrow::Cow::Owned(filter.slots(&target)?.and_not(&self.removed)))
    }

    /// `filter` turned into slots now, reused by searches until the collection changes.
    pub(crate) fn prepare(&self, filter: &Filter) -> Result<PreparedFilter> {
        let slots = self.allowed(filter)?.into_owned();
        Ok(PreparedFilter::new(filter.clone(), self.uid, self.version, slots))
    }

    /// Inserts new ids and replaces existing ones, all or nothing.
    ///
    /// Slots are written once: a replaced id's new values go to a new slot at the end and its
    /// old slot is removed, like any removal. Every fallible step comes before the first change
    /// anyone can see ([`Collection::stage_upsert`]): validation, memory for the rows, the ids
    /// and the payloads, and the rows' appends (rolled back by [`RowStore::truncate`] when one
    /// fails). What follows cannot fail ([`Collection::commit_upsert`]): tombstones and the id
    /// maps.
    pub(crate) fn upsert<B: Batch + ?Sized>(&mut self, batch: &B) -> Result<()> {
        check_batch(&self.config, batch)?;
        let staged = self.stage_upsert(batch)?;
        self.commit_upsert(staged);
        Ok(())
    }

    /// The fallible part of an upsert of `batch`, which [`check_batch`] has passed: memory for
    /// it, its index lists, and its rows appended to the row store. On an error nothing has
    /// changed.
    pub(crate) fn stage_upsert<B: Batch + ?Sized>(&mut self, batch: &B) -> Result<StagedUpsert> {
        let count = batch.len();
        // The slots of ids already stored are looked up in parallel.
        let slot_of = &self.slot_of;
        let lookup = |i: usize| slot_of.get(batch.id(i)).copied();
        let stored: Vec<Option<usize>> = if count < MIN_PARALLEL {
            (0..count).map(lookup).collect()
        } else {
            (0..count).into_par_iter().with_min_len(MIN_PARALLEL).map(lookup).collect()
        };
        let replaced: Vec<usize> = stored.into_iter().flatten().collect();

        // Ids and payload handles live in host memory on every backend: claimed from the
        // process's budget like the CPU backend's rows (see `memory::claim`).
        let host_bytes = (count * ENTRY_BYTES + batch.payload_bytes()) as u64;
        crate::memory::claim(host_bytes).map_err(|(requested, available)| {
            HiveGpuError::VramLimitExceeded {
                backend: crate::types::GpuBackendType::Cpu,
                requested,
                available,
            }
        })?;
        self.rows.reserve(count)?;
        self.removed.try_reserve(self.entries.len() + count).map_err(|_| out_of_memory(count))?;
        let inserted = count - replaced.len();
        self.entries.try_reserve(count).map_err(|_| out_of_memory(count))?;
        self.slot_of.try_reserve(inserted).map_err(|_| out_of_memory(inserted))?;
        let orders: Vec<u64> = match &mut self.order {
            Some(order) => {
                order.try_reserve(count).map_err(|_| out_of_memory(count))?;
                // A shard file opened as a collection of its own keeps increasing keys when
                // written to directly (a save must find them increasing to write a readable file).
                let next = order.last().map_or(0, |&last| last + 1);
                (0..count).map(|i| batch.order(i).unwrap_or(next + i as u64)).collect()
            }
            None => Vec::new(),
        };
        let entry = |i: usize| Entry::new(batch.id(i), batch.metadata(i), batch.payload(i));
        let added: Vec<Entry> = if count < MIN_PARALLEL {
            (0..count).map(entry).collect()
        } else {
            (0..count).into_par_iter().with_min_len(MIN_PARALLEL).map(entry).collect()
        };

        let first_slot = self.rows.len();
        // The index's lists for the new rows, found before anything changes.
        let assigned = match &self.index {
            Some(index) => {
                Ivf::check_slots(first_slot + count)?;
                Some(self.assign_rows(index, batch)?)
            }
            None => None,
        };
        if let Err(error) = self.append_rows(batch) {
            self.rows.truncate(first_slot);
            return Err(error);
        }
        Ok(StagedUpsert { first_slot, replaced, added, assigned, orders })
    }

    /// Forgets a staged upsert: its rows leave the row store, and the collection is as it was
    /// before [`Collection::stage_upsert`].
    pub(crate) fn abort_upsert(&mut self, staged: StagedUpsert) {
        self.rows.truncate(staged.first_slot);
    }

    /// Makes a staged upsert visible. Cannot fail (a compaction it sets off is an optimisation
    /// that stays undone on an error).
    pub(crate) fn commit_upsert(&mut self, staged: StagedUpsert) {
        let StagedUpsert { first_slot, replaced, added, assigned, orders } = staged;
        self.version += 1;
        self.rows.tombstone(&replaced);
        for &slot in &replaced {
            self.entries[slot] = None;
            self.removed.set(slot, true);
        }
        // A batch of new ids only (listed once: `check_batch`) goes into the map all at once,
        // on every core when large, into the room `stage_upsert` reserved. A replaced id's
        // entry is overwritten in place, one after another, as it allocates nothing.
        let items = |offset: usize| Some((&added[offset].id, first_slot + offset));
        if !replaced.is_empty() || self.slot_of.insert_all(&items, added.len()).is_err() {
            for (offset, entry) in added.iter().enumerate() {
                self.slot_of.insert(entry.id.clone(), first_slot + offset);
            }
        }
        for (offset, entry) in added.into_iter().enumerate() {
            self.payloads.insert(first_slot + offset, entry.metadata(), entry.payload());
            self.entries.push(Some(entry));
        }
        if let Some(order) = &mut self.order {
            order.extend_from_slice(&orders);
        }
        if let (Some(index), Some(assigned)) = (&mut self.index, assigned) {
            index.push(first_slot, &assigned);
        }
        self.compact_if_worth_it();
    }

    /// The index list (and codes) of every vector of `batch`, in bounded pieces.
    fn assign_rows<B: Batch + ?Sized>(&self, index: &Ivf, batch: &B) -> Result<Assigned> {
        let dim = self.config.dimension;
        if let Some(values) = batch.flat_values() {
            return index.assign(values);
        }
        let count = batch.len();
        let mut assigned = Assigned::default();
        let mut flat = Vec::new();
        for start in (0..count).step_by(APPEND_CHUNK) {
            let end = (start + APPEND_CHUNK).min(count);
            flat.clear();
            for i in start..end {
                flat.extend_from_slice(batch.values(i, dim));
            }
            assigned.append(index.assign(&flat)?);
        }
        Ok(assigned)
    }

    /// Trains `spec`'s index on the live vectors and makes searches go through it (`Flat`
    /// drops the index). The collection is unchanged if training fails.
    pub(crate) fn build_index(
        &mut self,
        backend: &dyn crate::backend::GpuBackend,
        tuning: &crate::tuning::Tuning,
        spec: IndexSpec,
    ) -> Result<()> {
        // The index files live slots only; removed ones are left where they are (compacting
        // first would copy every row for nothing, and renumber slots even if training failed).
        self.index = match spec {
            IndexSpec::Flat => None,
            spec => Some(Ivf::build(backend, tuning, self, spec)?),
        };
        // A GPU backend's device copy of the old index's lists would stay until a compaction.
        self.rows().release_scratch();
        self.version += 1;
        Ok(())
    }

    /// Makes searches go through `index`, built over this collection's current slots.
    pub(crate) fn set_index(&mut self, index: Ivf) {
        self.index = Some(index);
        self.rows().release_scratch();
        self.version += 1;
    }

    /// The index searches go through, if any.
    pub(crate) fn index(&self) -> Option<&Ivf> {
        self.index.as_ref()
    }

    /// The `k` nearest of each query among the live rows (in `allowed` where given): exactly,
    /// or through the index with `probe`'s parameters.
    pub(crate) fn neighbours(
        &self,
        queries: &[f32],
        k: usize,
        allowed: Option<&SlotSet>,
        probe: Option<Probe>,
    ) -> Result<Vec<Vec<crate::backend::Neighbor>>> {
        match (&self.index, probe) {
            (Some(index), Some(probe)) => {
                index.search(self.rows.as_ref(), &self.removed, queries, k, probe, allowed)
            }
            _ => self.rows.knn(queries, k, self.config.metric, allowed),
        }
    }

    /// Appends the batch's values as rows, in order; a flat batch goes as it is, in pieces,
    /// others through a bounded copy.
    fn append_rows<B: Batch + ?Sized>(&mut self, batch: &B) -> Result<()> {
        let dim = self.config.dimension;
        if let Some(values) = batch.flat_values() {
            for piece in values.chunks(APPEND_CHUNK * dim) {
                self.rows.append(piece)?;
            }
            return Ok(());
        }
        let count = batch.len();
        let mut flat = Vec::new();
        flat.try_reserve_exact(APPEND_CHUNK.min(count) * dim)
            .map_err(|_| out_of_memory(APPEND_CHUNK.min(count)))?;
        for start in (0..count).step_by(APPEND_CHUNK) {
            let end = (start + APPEND_CHUNK).min(count);
            flat.clear();
            flat.resize((end - start) * dim, 0.0);
            let copy = |(i, row): (usize, &mut [f32])| row.copy_from_slice(batch.values(start + i, dim));
            if end - start < MIN_PARALLEL {
                flat.chunks_exact_mut(dim).enumerate().for_each(copy);
            } else {
                flat.par_chunks_exact_mut(dim).with_min_len(MIN_PARALLEL).enumerate().for_each(copy);
            }
            self.rows.append(&flat)?;
        }
        Ok(())
    }

    /// Fills this new, empty collection with a collection file's contents in one pass, the
    /// bulk path of an open: the values and payloads are checked as any add checks them, the
    /// ids once (a repeated id is an error naming both slots), and the rows go to the row store
    /// as the file stores them ([`RowStore::append_stored`], in steps reported to `progress`).
    /// Where `stored.mapped` is given and the row store takes it ([`RowStore::adopt_mapped`]),
    /// the rows stay in the mapped file and keep the file's slots, removed ones as tombstones;
    /// otherwise removed slots are left out and the collection opens compacted.
    ///
    /// The checks and the id map run on one side while the rows go in on the other: this
    /// collection is new and is dropped whole on any error, so nothing anyone sees changes
    /// before every check has passed, and an open costs the longer of the two, not their sum.
    pub(crate) fn restore(
        &mut self,
        mut stored: Stored<'_>,
        progress: crate::persist::Progress<'_>,
    ) -> Result<()> {
        let config = self.config;
        let (dim, precision) = (config.dimension, config.precision);
        let row_bytes = dim * crate::exact::elements::element_bytes(precision);
        let slots = stored.ids.len();
        if !self.entries.is_empty()
            || !self.rows.is_empty()
            || stored.rows.len() != slots * row_bytes
            || stored.metadata.len() != slots
            || stored.payloads.len() != slots
        {
            return Err(HiveGpuError::Internal("restore needs an empty collection and whole slots".into()));
        }
        let removed = stored.removed;
        let live_slots = slots - removed.count();
        // Ids and payload handles live in host memory on every backend (see `upsert`).
        let payload_bytes: usize = (0..slots)
            .into_par_iter()
            .with_min_len(MIN_PARALLEL)
            .map(|slot| payload_bytes(&stored.metadata[slot], &stored.payloads[slot]))
            .sum();
        crate::memory::claim((slots * ENTRY_BYTES + payload_bytes) as u64).map_err(
            |(requested, available)| HiveGpuError::VramLimitExceeded {
                backend: crate::types::GpuBackendType::Cpu,
                requested,
                available,
            },
        )?;
        let mapped = match &stored.mapped {
            Some(rows) => self.rows.adopt_mapped(rows, precision, dim)?,
            None => false,
        };
        // The file's slots kept: all of them when the rows stay mapped, the live ones otherwise.
        let kept: Vec<usize> = if mapped {
            (0..slots).collect()
        } else {
            (0..slots).filter(|&s| !removed.contains(s)).collect()
        };
        self.entries.try_reserve_exact(kept.len()).map_err(|_| out_of_memory(kept.len()))?;
        self.slot_of.try_reserve(live_slots).map_err(|_| out_of_memory(live_slots))?;
        // The entries take the parsed payloads over (no copy of a million small maps).
        let ids = stored.ids;
        self.entries.par_extend(
            stored
                .metadata
                .par_iter_mut()
                .zip(stored.payloads.par_iter_mut())
                .enumerate()
                .with_min_len(MIN_PARALLEL)
                .filter(|&(slot, _)| mapped || !removed.contains(slot))
                .map(|(slot, (metadata, payload))| {
                    (!removed.contains(slot)).then(|| {
                        Entry::from_parts(ids[slot], std::mem::take(metadata), std::mem::take(payload))
                    })
                }),
        );

        // Four independent jobs side by side: the values checked and the ids mapped to their
        // slots, the payloads indexed (each on every thread),
        // and the rows appended (uploaded, on a device backend). On the H100 machine the map
        // alone took about as long as the upload (docs/PERFORMANCE.md, opening).
        let started = std::time::Instant::now();
        let mark = |what: &str| {
            if crate::backend::profiling() {
                eprintln!("hive-gpu profile (restore): {what} at {:.3} s", started.elapsed().as_secs_f64());
            }
        };
        let (entries, slot_of, rows, payloads) =
            (&self.entries, &mut self.slot_of, &mut self.rows, &mut self.payloads);
        let values_checked = || -> Option<HiveGpuError> {
            let check =
                |scratch: &mut Vec<f32>, (entry, &slot): (&Option<Entry>, &usize)| -> Option<HiveGpuError> {
                    let entry = entry.as_ref()?;
                    let id = stored.ids[slot];
                    let row = &stored.rows[slot * row_bytes..(slot + 1) * row_bytes];
                    let values: &[f32] = match (precision, bytemuck::try_cast_slice::<u8, f32>(row)) {
                        (StoragePrecision::F32, Ok(values)) if cfg!(target_endian = "little") => values,
                        _ => {
                            crate::exact::elements::widen(row, precision, scratch);
                            scratch
                        }
                    };
                    check_values(values, &config, Subject::Vector(id))
                        .and_then(|()| check_payload(id, entry.metadata(), entry.payload()))
                        .err()
                };
            let invalid = entries
                .par_iter()
                .zip(kept.par_iter())
                .with_min_len(MIN_PARALLEL)
                .map_init(Vec::new, |scratch, item| check(scratch, item))
                .find_map_first(|error| error);
            mark("values checked");
            invalid
        };
        let ids_mapped = || -> Result<()> {
            let items = |slot: usize| entries[slot].as_ref().map(|entry| (&entry.id, slot));
            let mapped = slot_of.insert_all(&items, entries.len()).map_err(|(slot, first)| {
                HiveGpuError::InvalidArgument(format!(
                    "id {:?} is stored twice, in slots {} and {}",
                    entries[slot].as_ref().map_or("", |e| e.id.as_str()),
                    kept[first],
                    kept[slot]
                ))
            });
            mark("ids mapped");
            mapped
        };
        let stored_index = stored.payload_index.take();
        let payloads_indexed = || -> Result<()> {
            *payloads = match stored_index {
                // Read and checked against the records (in the file's slots), then renumbered
                // as the rows are where removed ones are left out (kept slots stay in order, so
                // every list stays ascending).
                Some((section, body)) => {
                    // Kept slot of each file slot (the identity where every slot is kept).
                    let compacted = kept.len() != slots;
                    let mut new_of = Vec::new();
                    if compacted {
                        new_of = vec![u32::MAX; slots];
                        for (new, &old) in kept.iter().enumerate() {
                            new_of[old] = new as u32;
                        }
                    }
                    let kept_slot = |s: usize| if compacted { new_of[s] as usize } else { s };
                    let records =
                        |s: usize| entries.get(kept_slot(s)).and_then(Option::as_ref).map(Entry::fields);
                    let mut index =
                        crate::persist::payload_index::decode(section, body, slots, removed, records)
                            .map_err(|e| HiveGpuError::InvalidArgument(e.to_string()))?;
                    if compacted {
                        index.renumber(&new_of);
                    }
                    index
                }
                None => PayloadIndex::build(entries.len(), |slot| entries[slot].as_ref().map(Entry::fields)),
            };
            mark("payloads indexed");
            Ok(())
        };
        // A bad value is reported before a repeated id, as one pass would meet them, and both
        // before a payload index that disagrees with the records.
        let checked = || -> Result<()> {
            let (invalid, (ids, indexed)) =
                rayon::join(values_checked, || rayon::join(ids_mapped, payloads_indexed));
            invalid.map_or(ids, Err).and(indexed)
        };
        let appended = || -> Result<()> {
            if mapped {
                let dead: Vec<usize> = (0..slots).filter(|&s| removed.contains(s)).collect();
                rows.tombstone(&dead);
                progress(live_slots as u64, live_slots as u64);
                return Ok(());
            }
            let appended = append_stored_rows(rows.as_mut(), &stored, &kept, dim, precision, progress);
            mark("rows appended");
            appended
        };
        let (checked, appended) = rayon::join(checked, appended);
        if let Err(error) = checked.and(appended) {
            self.clear();
            return Err(error);
        }
        if mapped {
            self.removed = removed.clone();
        }
        // A shard's file keeps its slots' order keys; a collection file of its own opened as
        // a shard numbers its slots in order.
        match (stored.order, &mut self.order) {
            (Some(order), _) => self.order = Some(kept.iter().map(|&s| order[s]).collect()),
            (None, Some(order)) => *order = (0..kept.len() as u64).collect(),
            (None, None) => {}
        }
        self.version += 1;
        Ok(())
    }

    /// Makes room for `additional` more vectors without reallocating.
    pub(crate) fn reserve(&mut self, additional: usize) -> Result<()> {
        self.rows.reserve(additional)?;
        self.entries.try_reserve(additional).map_err(|_| out_of_memory(additional))?;
        self.slot_of.try_reserve(additional).map_err(|_| out_of_memory(additional))?;
        Ok(())
    }

    /// Removes ids; every id must be present and listed once, else nothing is removed.
    pub(crate) fn remove<S: AsRef<str>>(&mut self, ids: &[S]) -> Result<()> {
        let slots = self.slots_to_remove(ids)?;
        self.commit_remove(&slots);
        Ok(())
    }

    /// The slots of `ids`, changing nothing: every id must be present and listed once.
    pub(crate) fn slots_to_remove<S: AsRef<str>>(&self, ids: &[S]) -> Result<Vec<usize>> {
        let mut slots = Vec::with_capacity(ids.len());
        let mut first_seen: IdMap<&str, usize> =
            IdMap::with_capacity_and_hasher(ids.len(), Default::default());
        for (i, id) in ids.iter().enumerate() {
            let id = id.as_ref();
            if let Some(first) = first_seen.insert(id, i) {
                return Err(HiveGpuError::DuplicateId { id: id.to_string(), first, second: i });
            }
            match self.slot_of.get(id) {
                Some(&slot) => slots.push(slot),
                None => return Err(HiveGpuError::VectorNotFound { id: id.to_string() }),
            }
        }
        Ok(slots)
    }

    /// Removes the live slots `slots` ([`Collection::slots_to_remove`]'s). Cannot fail.
    pub(crate) fn commit_remove(&mut self, slots: &[usize]) {
        self.version += 1;
        self.rows.tombstone(slots);
        for &slot in slots {
            if let Some(entry) = self.entries[slot].take() {
                self.slot_of.remove(&entry.id);
            }
            self.removed.set(slot, true);
        }
        self.compact_if_worth_it();
    }

    /// Whether a write of `count` vectors or ids is small enough to run on the caller's
    /// thread (`exec::run_small`): a few vectors, and too few to set off a compaction (the
    /// one part of a small write that works on the whole collection).
    pub(crate) fn is_small_write(&self, count: usize) -> bool {
        count < MIN_PARALLEL / 8
            && count * self.config.dimension <= SMALL_WRITE_VALUES
            && (self.removed.count() + count) * 4 < self.entries.len()
    }

    /// Reclaims removed slots once they are a quarter of the storage. Reclaiming is an
    /// optimisation: if the device cannot do it now, the tombstones stay valid and the next
    /// write tries again.
    fn compact_if_worth_it(&mut self) {
        if self.removed.count() > 0 && self.removed.count() * 4 >= self.entries.len() {
            let _ = self.compact();
        }
    }

    /// Drops removed slots, renumbering live ones in their order.
    pub(crate) fn compact(&mut self) -> Result<()> {
        if self.removed.count() == 0 {
            return Ok(());
        }
        let keep: Vec<usize> = (0..self.entries.len()).filter(|&s| self.entries[s].is_some()).collect();
        self.rows.compact(&keep)?;
        if let Some(index) = &mut self.index {
            index.remap(&keep, self.entries.len());
        }
        if let Some(order) = &mut self.order {
            *order = keep.iter().map(|&s| order[s]).collect();
        }
        let entries: Vec<Option<Entry>> =
            std::mem::take(&mut self.entries).into_iter().flatten().map(Some).collect();
        for (slot, entry) in entries.iter().enumerate() {
            if let Some(e) = entry
                && let Some(s) = self.slot_of.get_mut(&e.id)
            {
                *s = slot;
            }
        }
        // The payload indexes list slots: rebuilt for the new numbering.
        self.payloads = PayloadIndex::build(entries.len(), |slot| entries[slot].as_ref().map(Entry::fields));
        self.entries = entries;
        self.removed = SlotSet::default();
        self.version += 1;
        Ok(())
    }

    pub(crate) fn get(&self, id: &str) -> Result<Option<GpuVector>> {
        let Some(&slot) = self.slot_of.get(id) else { return Ok(None) };
        let Some(entry) = self.entries[slot].as_ref() else { return Ok(None) };
        let data = self.rows.read_row(slot)?;
        Ok(Some(GpuVector {
            id: entry.id.to_string(),
            data,
            metadata: Metadata::clone(entry.metadata()),
            payload: Payload::clone(entry.payload()),
        }))
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.slot_of.contains_key(id)
    }

    pub(crate) fn clear(&mut self) {
        self.rows.clear();
        if let Some(index) = &mut self.index {
            index.clear();
        }
        self.entries = Vec::new();
        self.slot_of = IdSlots::default();
        self.removed = SlotSet::default();
        self.payloads = PayloadIndex::default();
        if let Some(order) = &mut self.order {
            order.clear();
        }
        self.version += 1;
    }
}

/// A batch of vectors to upsert: a slice of [`GpuVector`]s, or ids with one row-major array.
pub(crate) trait Batch: Sync {
    /// Vectors in the batch.
    fn len(&self) -> usize;
    /// The id of vector `i`.
    fn id(&self, i: usize) -> &str;
    /// The values of vector `i` (`dim` is the collection's dimension; a vector of another
    /// length fails validation).
    fn values(&self, i: usize, dim: usize) -> &[f32];
    /// The string payload of vector `i`.
    fn metadata(&self, i: usize) -> &Metadata;
    /// The typed payload of vector `i`.
    fn payload(&self, i: usize) -> &Payload;
    /// Host bytes the batch's payloads will take, with their index entries (an estimate).
    fn payload_bytes(&self) -> usize;
    /// Every vector's values in one row-major array, where the batch has them so.
    fn flat_values(&self) -> Option<&[f32]> {
        None
    }
    /// Vector `i`'s order key, for a collection that keeps them: a shard's writes carry their
    /// place in the storage's write order (`crate::multi`). None (any other batch) continues
    /// after the collection's last key.
    fn order(&self, _i: usize) -> Option<u64> {
        None
    }
}

impl Batch for [GpuVector] {
    fn len(&self) -> usize {
        <[GpuVector]>::len(self)
    }
    fn id(&self, i: usize) -> &str {
        &self[i].id
    }
    fn values(&self, i: usize, _dim: usize) -> &[f32] {
        &self[i].data
    }
    fn metadata(&self, i: usize) -> &Metadata {
        &self[i].metadata
    }
    fn payload(&self, i: usize) -> &Payload {
        &self[i].payload
    }
    fn payload_bytes(&self) -> usize {
        self.iter().map(|v| payload_bytes(&v.metadata, &v.payload)).sum()
    }
}

/// Host bytes one vector's metadata and typed payload take, with their index entries (an
/// estimate): what every [`Batch::payload_bytes`] sums.
pub(crate) fn payload_bytes(metadata: &Metadata, payload: &Payload) -> usize {
    let text = |k: &String, v: &str| k.len() + v.len() + 2 * std::mem::size_of::<String>();
    let strings = metadata.iter().map(|(k, x)| text(k, x) + INDEXED_VALUE_BYTES).sum::<usize>();
    let fields = payload
        .iter()
        .map(|(k, x)| {
            let s = match x {
                PayloadValue::String(s) => s.as_str(),
                _ => "",
            };
            text(k, s) + INDEXED_VALUE_BYTES
        })
        .sum::<usize>();
    strings + fields
}

/// Ids with their vectors in one row-major array (`ids.len() * dim` values, checked by
/// [`Collection::upsert`] before any access), without payloads.
pub(crate) struct FlatBatch<'a, S> {
    pub(crate) ids: &'a [S],
    pub(crate) values: &'a [f32],
}

impl<S: AsRef<str> + Sync> Batch for FlatBatch<'_, S> {
    fn len(&self) -> usize {
        self.ids.len()
    }
    fn id(&self, i: usize) -> &str {
        self.ids[i].as_ref()
    }
    fn values(&self, i: usize, dim: usize) -> &[f32] {
        &self.values[i * dim..(i + 1) * dim]
    }
    fn metadata(&self, _i: usize) -> &Metadata {
        static EMPTY: LazyLock<Metadata> = LazyLock::new(Metadata::new);
        &EMPTY
    }
    fn payload(&self, _i: usize) -> &Payload {
        static EMPTY: LazyLock<Payload> = LazyLock::new(Payload::new);
        &EMPTY
    }
    fn payload_bytes(&self) -> usize {
        0
    }
    fn flat_values(&self) -> Option<&[f32]> {
        Some(self.values)
    }
}

fn out_of_memory(vectors: usize) -> HiveGpuError {
    HiveGpuError::VramLimitExceeded {
        backend: crate::types::GpuBackendType::Cpu,
        requested: (vectors * std::mem::size_of::<Option<Entry>>()) as u64,
        available: crate::memory::available_bytes().unwrap_or(0),
    }
}
