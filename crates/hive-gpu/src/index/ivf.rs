//! IVF-Flat: the collection's vectors grouped into inverted lists by their nearest k-means
//! centroid; a search probes the `nprobe` centroids nearest each query and scans exactly the
//! rows of those lists.
//!
//! Written once over the backend op set: the centroids are a flat row store of the
//! collection's backend, so probing (and assigning new vectors) is its exact k-NN, and the
//! list scan is [`RowStore::scan_lists`]. The lists hold slots of the collection's own rows,
//! so the index adds 4 bytes per vector and no copy of them: an add appends each new slot to
//! its list, a removal leaves a tombstone the scan skips (the slot set every search reads),
//! and a compaction renumbers the lists as it renumbers the rows. Nothing needs retraining.
//!
//! Exactness: with `nprobe` equal to the number of lists every live row is scanned, and the
//! scan is as exact as the flat search (f32 candidates, f64 re-rank), so the results equal it.

use crate::backend::{GpuBackend, ListProbes, Neighbor, RowStore};
use crate::collection::{Collection, Subject};
use crate::error::{HiveGpuError, Result};
use crate::index::kmeans::{self, KMeansParams, SplitMix};
use crate::index::spec::IndexSpec;
use crate::slots::SlotSet;
use crate::types::{GpuDistanceMetric, SearchPrecision, StoragePrecision};

/// Training vectors per list at most (FAISS's default, 256 per centroid).
const TRAINING_PER_LIST: usize = 256;
/// Lloyd iterations of the coarse quantizer's training (FAISS's IVF default is 10).
const TRAINING_ITERATIONS: usize = 10;
/// Seed of the training sample and k-means.
const SEED: u64 = 1234;
/// Vectors assigned to lists per k-NN call, bounding the copy each call reads.
const ASSIGN_PIECE: usize = 1 << 16;

/// A trained IVF-Flat index over one collection's slots.
#[derive(Debug)]
pub(crate) struct IvfFlat {
    metric: GpuDistanceMetric,
    /// `nlist x dim` centroids, kept on the host for saving and describing.
    centroids: Vec<f32>,
    /// The same centroids on the collection's backend: probing and assignment read them.
    probe: Box<dyn RowStore>,
    /// List `l` holds these slots, ascending. Removed slots stay until a compaction.
    lists: Vec<Vec<u32>>,
    /// Renewed whenever `lists` change ([`ListProbes::generation`]): a GPU backend keeps the
    /// lists in device memory while it holds.
    generation: u64,
    /// What training measured.
    pub(crate) trained: Trained,
}

/// What an index's training found, for `hive-gpu info` and the benchmark.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Trained {
    /// Vectors k-means trained on.
    pub(crate) training_vectors: usize,
    /// Lloyd iterations run.
    pub(crate) iterations: usize,
}

impl IvfFlat {
    /// Trains `nlist` centroids on a sample of `collection`'s live vectors and assigns every
    /// live vector to its list.
    pub(crate) fn build(
        backend: &dyn GpuBackend,
        tuning: &crate::tuning::Tuning,
        collection: &Collection,
        nlist: usize,
    ) -> Result<Self> {
        let config = *collection.config();
        let dim = config.dimension;
        let live: Vec<usize> =
            (0..collection.slots()).filter(|&s| !collection.removed().contains(s)).collect();
        if live.len() < nlist {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{} needs at least {nlist} vectors to train its lists; the collection holds {}",
                IndexSpec::IvfFlat { nlist },
                live.len()
            )));
        }
        if collection.slots() > u32::MAX as usize {
            return Err(HiveGpuError::InvalidArgument(format!(
                "an IVF index holds at most {} slots; the collection has {}",
                u32::MAX,
                collection.slots()
            )));
        }
        let began = std::time::Instant::now();
        let wanted = nlist.saturating_mul(TRAINING_PER_LIST).min(live.len());
        let sampled: Vec<usize>;
        let training_slots: &[usize] = if wanted < live.len() {
            let mut chosen: Vec<usize> = kmeans::sample(&mut SplitMix(SEED), live.len(), wanted)
                .into_iter()
                .map(|i| live[i])
                .collect();
            chosen.sort_unstable();
            sampled = chosen;
            &sampled
        } else {
            &live
        };
        let mut training = collection.rows().gather(training_slots)?;
        if config.metric == GpuDistanceMetric::Cosine {
            // Cosine compares directions: cluster the unit vectors.
            for v in training.chunks_exact_mut(dim) {
                let norm = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
                v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
            }
        }
        let params = KMeansParams {
            clusters: nlist,
            iterations: TRAINING_ITERATIONS,
            max_training_vectors: training_slots.len(),
            seed: SEED,
        };
        let sampled_in = began.elapsed();
        let mut trained = kmeans::train(backend, tuning, &training, dim, &params)?;
        let trained_in = began.elapsed();
        if config.metric == GpuDistanceMetric::Cosine {
            // Probed by direction: unit centroids. A mean of unit vectors can be (almost) zero,
            // which has no direction: such a centroid takes a training vector's instead.
            for (c, centroid) in trained.centroids.chunks_exact_mut(dim).enumerate() {
                let norm = centroid.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
                if norm < 1e-9 {
                    let i = c % (training.len() / dim);
                    centroid.copy_from_slice(&training[i * dim..(i + 1) * dim]);
                } else {
                    centroid.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
                }
            }
        }
        drop(training);
        let mut probe = backend.new_rows(dim, StoragePrecision::F32, SearchPrecision::Exact, tuning)?;
        probe.append(&trained.centroids)?;
        let mut index = Self {
            metric: config.metric,
            centroids: trained.centroids,
            probe,
            lists: vec![Vec::new(); nlist],
            generation: ListProbes::next_generation(),
            trained: Trained { training_vectors: trained.training_vectors, iterations: trained.iterations },
        };
        for piece in live.chunks(ASSIGN_PIECE) {
            let values = collection.rows().gather(piece)?;
            let assigned = index.assign(&values)?;
            for (&slot, &list) in piece.iter().zip(&assigned) {
                index.lists[list as usize].push(slot as u32);
            }
        }
        if crate::backend::profiling() {
            eprintln!(
                "hive-gpu profile (ivf build, ms): sample {:.3}, k-means {:.3}, assign {:.3}",
                sampled_in.as_secs_f64() * 1e3,
                (trained_in - sampled_in).as_secs_f64() * 1e3,
                (began.elapsed() - trained_in).as_secs_f64() * 1e3
            );
        }
        Ok(index)
    }

    /// Lists (centroids).
    pub(crate) fn nlist(&self) -> usize {
        self.lists.len()
    }

    /// The spec this index was built from.
    pub(crate) fn spec(&self) -> IndexSpec {
        IndexSpec::IvfFlat { nlist: self.nlist() }
    }

    /// The centroids, `nlist x dim` row-major.
    pub(crate) fn centroids(&self) -> &[f32] {
        &self.centroids
    }

    /// Each list's slots (removed ones included until a compaction).
    pub(crate) fn lists(&self) -> &[Vec<u32>] {
        &self.lists
    }

    /// The index a collection file saved ([`crate::persist::format::StoredIndex`], checked:
    /// finite centroids of the collection's dimension, every live slot once), its slots
    /// renumbered by `slot_of` (file slot to collection slot), on `backend`.
    pub(crate) fn from_stored(
        backend: &dyn GpuBackend,
        tuning: &crate::tuning::Tuning,
        metric: GpuDistanceMetric,
        dim: usize,
        stored: &crate::persist::format::StoredIndex,
        slot_of: impl Fn(u32) -> u32,
    ) -> Result<Self> {
        // Centroids are probed as vectors of the collection are searched: the same checks.
        let config = crate::types::StorageConfig::new(dim, metric);
        for (c, centroid) in stored.centroids.chunks_exact(dim).enumerate() {
            crate::collection::check_values(centroid, &config, Subject::Vector(&format!("centroid {c}")))?;
        }
        let mut probe = backend.new_rows(dim, StoragePrecision::F32, SearchPrecision::Exact, tuning)?;
        probe.append(&stored.centroids)?;
        Ok(Self {
            metric,
            centroids: stored.centroids.clone(),
            probe,
            lists: stored.lists.iter().map(|l| l.iter().map(|&s| slot_of(s)).collect()).collect(),
            generation: ListProbes::next_generation(),
            trained: Trained {
                training_vectors: stored.training_vectors as usize,
                iterations: stored.iterations as usize,
            },
        })
    }

    /// Each list's length, removed slots included.
    pub(crate) fn list_lengths(&self) -> Vec<usize> {
        self.lists.iter().map(Vec::len).collect()
    }

    /// The list of each vector of `values` (row-major, the collection's dimension): its
    /// nearest centroid under the collection's metric, as a search probes them.
    pub(crate) fn assign(&self, values: &[f32]) -> Result<Vec<u32>> {
        let dim = self.centroids.len() / self.nlist();
        let mut assigned = Vec::with_capacity(values.len() / dim);
        for piece in values.chunks(ASSIGN_PIECE * dim) {
            for found in self.probe.knn(piece, 1, self.metric, None)? {
                let nearest = found
                    .first()
                    .ok_or_else(|| HiveGpuError::Internal("assignment found no centroid".into()))?;
                assigned.push(nearest.slot as u32);
            }
        }
        Ok(assigned)
    }

    /// Checks that slots up to `end` fit the lists' 32-bit entries: the fallible half of an add.
    pub(crate) fn check_slots(end: usize) -> Result<()> {
        if end > u32::MAX as usize {
            return Err(HiveGpuError::InvalidArgument(format!(
                "an IVF index holds at most {} slots; this add would need {end}",
                u32::MAX
            )));
        }
        Ok(())
    }

    /// Appends the new slots `first..first + assigned.len()` to their lists (from
    /// [`IvfFlat::assign`], slots checked by [`IvfFlat::check_slots`]).
    pub(crate) fn push(&mut self, first: usize, assigned: &[u32]) {
        self.generation = ListProbes::next_generation();
        for (offset, &list) in assigned.iter().enumerate() {
            if let Some(members) = self.lists.get_mut(list as usize) {
                members.push((first + offset) as u32);
            }
        }
    }

    /// Follows a compaction that kept the slots `keep` (ascending), renumbered `0..keep.len()`.
    pub(crate) fn remap(&mut self, keep: &[usize], old_slots: usize) {
        const GONE: u32 = u32::MAX;
        self.generation = ListProbes::next_generation();
        let mut renumbered = vec![GONE; old_slots];
        for (new, &old) in keep.iter().enumerate() {
            renumbered[old] = new as u32;
        }
        for list in &mut self.lists {
            list.retain_mut(|slot| match renumbered.get(*slot as usize) {
                Some(&new) if new != GONE => {
                    *slot = new;
                    true
                }
                _ => false,
            });
        }
    }

    /// Empties every list; the centroids stay trained.
    pub(crate) fn clear(&mut self) {
        self.generation = ListProbes::next_generation();
        self.lists.iter_mut().for_each(Vec::clear);
    }

    /// Bytes the index adds to the collection: its lists on the host and its centroids.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.lists.iter().map(|l| l.capacity() * 4).sum::<usize>()
            + self.centroids.len() * 4
            + self.probe.memory_bytes()
    }

    /// The exact `k` nearest of each query among the live rows (in `allowed` where given) of
    /// its `nprobe` nearest lists.
    pub(crate) fn search(
        &self,
        rows: &dyn RowStore,
        queries: &[f32],
        k: usize,
        nprobe: usize,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nprobe = nprobe.clamp(1, self.nlist());
        let began = std::time::Instant::now();
        let nearest = self.probe.knn(queries, nprobe, self.metric, None)?;
        let probed = began.elapsed();
        let mut probes = Vec::with_capacity(nearest.len() * nprobe);
        for found in &nearest {
            if found.len() != nprobe {
                return Err(HiveGpuError::Internal(format!(
                    "probing found {} of {nprobe} lists",
                    found.len()
                )));
            }
            probes.extend(found.iter().map(|n| n.slot as u32));
        }
        let probes = ListProbes { lists: &self.lists, probes: &probes, nprobe, generation: self.generation };
        let found = rows.scan_lists(queries, &probes, k, self.metric, allowed);
        if crate::backend::profiling() {
            eprintln!(
                "hive-gpu profile (ivf probe, scan; ms): {:.3} {:.3}",
                probed.as_secs_f64() * 1e3,
                (began.elapsed() - probed).as_secs_f64() * 1e3
            );
        }
        found
    }
}
