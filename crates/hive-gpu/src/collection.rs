//! Ids and slots, payloads, tombstones and compaction: everything about a collection that does
//! not depend on the backend. Rows live in the backend's [`RowStore`]; this module decides
//! which slot holds which id.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use rayon::prelude::*;
use smol_str::SmolStr;

use crate::backend::RowStore;
use crate::error::{HiveGpuError, Result};
use crate::types::{GpuDistanceMetric, GpuVector, Metadata, StorageConfig, StoragePrecision};

/// Squared norms above this could overflow f32 arithmetic in distance kernels
/// (|q - x|^2 <= 2(|q|^2 + |x|^2) must stay under f32::MAX).
const MAX_SQUARED_NORM: f64 = 1e37;

/// Under cosine a stored vector's squared norm must be a normal f32 with room to spare: the
/// kernels scale products by 1/|x|, which amplifies underflow in them beyond any useful bound.
/// Cosine ignores scale, so such a vector can simply be scaled up.
const MIN_COSINE_SQUARED_NORM: f64 = 1e-36;

/// Vectors appended per call into the row store, bounding the temporary copy.
const APPEND_CHUNK: usize = 8192;

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
}

impl Entry {
    fn new(id: &str, metadata: &Metadata) -> Self {
        Self { id: SmolStr::new(id), metadata: shared(metadata) }
    }

    fn metadata(&self) -> &Arc<Metadata> {
        static EMPTY: LazyLock<Arc<Metadata>> = LazyLock::new(Arc::default);
        self.metadata.as_ref().unwrap_or(&EMPTY)
    }
}

fn shared(metadata: &Metadata) -> Option<Arc<Metadata>> {
    (!metadata.is_empty()).then(|| Arc::new(metadata.clone()))
}

/// A collection: a row store plus the bookkeeping that maps ids to its slots.
#[derive(Debug)]
pub(crate) struct Collection {
    config: StorageConfig,
    rows: Box<dyn RowStore>,
    /// One per slot; None for a removed (tombstoned) slot.
    entries: Vec<Option<Entry>>,
    slot_of: IdMap<SmolStr, usize>,
    removed: usize,
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
    let (id, what) = if values.iter().all(|x| x.is_finite())
        && !matches!(config.metric, GpuDistanceMetric::Cosine)
        && config.precision == StoragePrecision::F32
    {
        let squared_norm: f64 = values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        if squared_norm <= MAX_SQUARED_NORM {
            return Ok(());
        }
        (subject_id(), subject_text(subject))
    } else {
        (subject_id(), subject_text(subject))
    };
    if let Some((i, x)) = values.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(HiveGpuError::InvalidVector { id, reason: format!("{what}{x} at component {i}") });
    }
    let squared_norm: f64 = values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
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
    if let (Subject::Vector(_), StoragePrecision::F16) = (subject, config.precision) {
        // Stored values are what searches see: they must exist in f16 too.
        if let Some((i, x)) = values.iter().enumerate().find(|(_, x)| half::f16::from_f32(**x).is_infinite())
        {
            return Err(HiveGpuError::InvalidVector {
                id,
                reason: format!("{x} at component {i} is outside the f16 storage range (|x| <= 65504)"),
            });
        }
        let all_zero = values.iter().all(|&x| half::f16::from_f32(x).to_f32() == 0.0);
        if config.metric == GpuDistanceMetric::Cosine && all_zero {
            return Err(HiveGpuError::InvalidVector {
                id,
                reason: "becomes a zero vector when rounded to f16, which has no cosine similarity".into(),
            });
        }
    }
    Ok(())
}

impl Collection {
    pub(crate) fn new(config: StorageConfig, rows: Box<dyn RowStore>) -> Self {
        Self { config, rows, entries: Vec::new(), slot_of: IdMap::default(), removed: 0 }
    }

    pub(crate) fn config(&self) -> &StorageConfig {
        &self.config
    }

    pub(crate) fn rows(&self) -> &dyn RowStore {
        self.rows.as_ref()
    }

    /// Live vectors.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.removed
    }

    /// Slots in use, removed ones included.
    pub(crate) fn slots(&self) -> usize {
        self.entries.len()
    }

    /// Id and payload of a live slot.
    pub(crate) fn entry(&self, slot: usize) -> Option<(&SmolStr, &Arc<Metadata>)> {
        self.entries.get(slot)?.as_ref().map(|e| (&e.id, e.metadata()))
    }

    /// Inserts new ids and replaces existing ones. Validates the whole batch first: a batch
    /// with any bad vector changes nothing.
    pub(crate) fn upsert(&mut self, vectors: &[GpuVector]) -> Result<()> {
        // Contents are checked in parallel (the first bad vector of the batch is reported),
        // ids in order.
        let config = self.config;
        let invalid = vectors.par_iter().enumerate().find_map_first(|(i, v)| {
            if v.id.is_empty() {
                return Some(HiveGpuError::InvalidArgument(format!(
                    "vector {i} of the batch has an empty id"
                )));
            }
            check_values(&v.data, &config, Subject::Vector(&v.id)).err()
        });
        if let Some(error) = invalid {
            return Err(error);
        }
        // The slots of ids already stored are looked up in parallel, duplicates found in order.
        let slot_of = &self.slot_of;
        let stored: Vec<Option<usize>> = vectors
            .par_iter()
            .with_min_len(MIN_PARALLEL)
            .map(|v| slot_of.get(v.id.as_str()).copied())
            .collect();
        let mut first_seen: IdMap<&str, usize> =
            IdMap::with_capacity_and_hasher(vectors.len(), Default::default());
        let mut updates = Vec::new();
        let mut inserts = Vec::with_capacity(vectors.len());
        for (i, (v, slot)) in vectors.iter().zip(stored).enumerate() {
            if let Some(first) = first_seen.insert(v.id.as_str(), i) {
                return Err(HiveGpuError::DuplicateId { id: v.id.clone(), first, second: i });
            }
            match slot {
                Some(slot) => updates.push((slot, v)),
                None => inserts.push(v),
            }
        }
        self.rows.reserve(inserts.len())?;
        self.entries.try_reserve(inserts.len()).map_err(|_| out_of_memory(inserts.len()))?;
        self.slot_of.try_reserve(inserts.len()).map_err(|_| out_of_memory(inserts.len()))?;

        for (slot, v) in updates {
            self.rows.overwrite(slot, &v.data)?;
            if let Some(entry) = &mut self.entries[slot] {
                entry.metadata = shared(&v.metadata);
            }
        }
        let dim = self.config.dimension;
        let mut flat = vec![0.0; APPEND_CHUNK.min(inserts.len()) * dim];
        for chunk in inserts.chunks(APPEND_CHUNK) {
            let flat = &mut flat[..chunk.len() * dim];
            flat.par_chunks_exact_mut(dim)
                .with_min_len(MIN_PARALLEL)
                .zip(chunk)
                .for_each(|(row, v)| row.copy_from_slice(&v.data));
            self.rows.append(flat)?;
            let added: Vec<Entry> =
                chunk.par_iter().with_min_len(MIN_PARALLEL).map(|v| Entry::new(&v.id, &v.metadata)).collect();
            for entry in added {
                self.slot_of.insert(entry.id.clone(), self.entries.len());
                self.entries.push(Some(entry));
            }
        }
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
        self.rows.tombstone(&slots);
        for &slot in &slots {
            if let Some(entry) = self.entries[slot].take() {
                self.slot_of.remove(&entry.id);
            }
        }
        self.removed += slots.len();
        if self.removed > 0 && self.removed * 4 >= self.entries.len() {
            // Reclaiming is an optimisation: if the device cannot do it now, the tombstones
            // stay valid and the next removal tries again.
            let _ = self.compact();
        }
        Ok(())
    }

    /// Drops removed slots, renumbering live ones in their order.
    pub(crate) fn compact(&mut self) -> Result<()> {
        if self.removed == 0 {
            return Ok(());
        }
        let keep: Vec<usize> = (0..self.entries.len()).filter(|&s| self.entries[s].is_some()).collect();
        self.rows.compact(&keep)?;
        let entries: Vec<Option<Entry>> =
            std::mem::take(&mut self.entries).into_iter().flatten().map(Some).collect();
        for (slot, entry) in entries.iter().enumerate() {
            if let Some(e) = entry
                && let Some(s) = self.slot_of.get_mut(&e.id)
            {
                *s = slot;
            }
        }
        self.entries = entries;
        self.removed = 0;
        Ok(())
    }

    pub(crate) fn get(&self, id: &str) -> Result<Option<GpuVector>> {
        let Some(&slot) = self.slot_of.get(id) else { return Ok(None) };
        let Some(entry) = self.entries[slot].as_ref() else { return Ok(None) };
        let data = self.rows.read_row(slot)?;
        Ok(Some(GpuVector { id: entry.id.to_string(), data, metadata: Metadata::clone(entry.metadata()) }))
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.slot_of.contains_key(id)
    }

    pub(crate) fn clear(&mut self) {
        self.rows.clear();
        self.entries = Vec::new();
        self.slot_of = IdMap::default();
        self.removed = 0;
    }
}

fn out_of_memory(vectors: usize) -> HiveGpuError {
    HiveGpuError::VramLimitExceeded {
        backend: crate::types::GpuBackendType::Cpu,
        requested: (vectors * std::mem::size_of::<Option<Entry>>()) as u64,
        available: crate::memory::available_bytes().unwrap_or(0),
    }
}
