//! IVF-Flat, IVF-SQ8 and IVF-PQ (and the flat SQ8, PQ and binary indexes, each over one list):
//! the collection's vectors grouped into inverted lists by their nearest k-means centroid; a
//! search probes the `nprobe` centroids nearest each query and scans the rows of those lists,
//! exactly (IVF-Flat) or through their codes (8-bit scalar codes, [`crate::index::sq`];
//! product-quantizer codes, [`crate::index::pq`]; one bit per component) with an exact re-rank
//! of the best `refine_factor * k` of them.
//!
//! Written once over the backend op set: the centroids are a flat row store of the
//! collection's backend, so probing (and assigning new vectors) is its exact k-NN, and the
//! list scan is [`RowStore::scan_lists`]. The lists hold slots of the collection's own rows,
//! so the index adds 4 bytes per vector and no copy of them: an add appends each new slot to
//! its list, a removal leaves a tombstone the scan skips (the slot set every search reads),
//! and a compaction renumbers the lists as it renumbers the rows. Nothing needs retraining.
//!
//! Exactness: with `nprobe` equal to the number of lists every live row is scanned, and the
//! IVF-Flat scan is as exact as the flat search (f32 candidates, f64 re-rank), so the results
//! equal it. IVF-SQ8's codes only nominate candidates: its distances are always the exact
//! ones of the stored vectors, and with `refine_factor * k` covering every row scanned its
//! results equal IVF-Flat's.
//!
//! SQ8 codes add `dim + 4` bytes per vector (a byte per component and the decoded norm), PQ
//! codes `m * bits / 8 + 4` (the codes and each row's own distance term), binary codes
//! `dim / 8` rounded up to whole 64-bit words. They live on the host beside the lists; every
//! backend scans them through [`RowStore::scan_codes`], [`RowStore::scan_pq`] and
//! [`RowStore::scan_bits`].

use rayon::prelude::*;

use crate::backend::bits::{self, BitScan};
use crate::backend::{
    CodeScan, GpuBackend, ListCodes, ListProbes, Neighbor, PqScan, QuantizedScan, RowStore,
};
use crate::collection::{Collection, Subject};
use crate::error::{HiveGpuError, Result};
use crate::index::kmeans::{self, KMeansParams, SplitMix};
use crate::index::pq::ProductQuantizer;
use crate::index::spec::IndexSpec;
use crate::index::sq::ScalarQuantizer;
use crate::persist::format::StoredQuantizer;
use crate::slots::SlotSet;
use crate::types::{GpuDistanceMetric, SearchPrecision, StoragePrecision};

/// Training vectors per list at most (FAISS's default, 256 per centroid).
const TRAINING_PER_LIST: usize = 256;
/// Training vectors a quantized index samples at least (when the collection has them): what
/// its code ranges and centers are trained on.
const QUANTIZER_TRAINING: usize = 1 << 16;
/// Lloyd iterations of the coarse quantizer's training (FAISS's IVF default is 10).
const TRAINING_ITERATIONS: usize = 10;
/// Seed of the training sample and k-means.
const SEED: u64 = 1234;
/// Vectors assigned to lists per k-NN call, bounding the copy each call reads.
const ASSIGN_PIECE: usize = 1 << 16;

/// Rows one task of an encode takes: enough to outweigh a task's cost, few enough that a
/// piece of [`ASSIGN_PIECE`] rows spreads over the library's threads.
const ENCODE_PIECE: usize = 1 << 10;

/// A trained IVF index over one collection's slots.
#[derive(Debug)]
pub(crate) struct Ivf {
    /// What was built.
    spec: IndexSpec,
    metric: GpuDistanceMetric,
    /// `nlist x dim` centroids, kept on the host for saving and describing.
    centroids: Vec<f32>,
    /// The same centroids on the collection's backend: probing and assignment read them.
    probe: Box<dyn RowStore>,
    /// List `l` holds these slots, ascending. Removed slots stay until a compaction.
    lists: Vec<Vec<u32>>,
    /// A quantized index's codes.
    coded: Option<Coded>,
    /// The collection's storage precision: new vectors are encoded as they will be stored,
    /// so that a reopened collection, which encodes its stored rows, finds the same codes.
    precision: StoragePrecision,
    /// Renewed whenever `lists` change ([`ListProbes::generation`]): a GPU backend keeps the
    /// lists in device memory while it holds.
    generation: u64,
    /// Renewed whenever the lists change other than by appending rows (a build, an open, a
    /// compaction's renumbering, a clear): [`CodeScan::lineage`], so that a backend's copy of
    /// the codes made before some adds keeps what it holds and copies only the new rows.
    lineage: u64,
    /// What training measured.
    pub(crate) trained: Trained,
}

/// The codes of a quantized index, list by list (row `i` of list `l` for `lists[l][i]`).
#[derive(Debug)]
enum Coded {
    /// A byte per component on the quantizer's grid, with each row's decoded norm.
    Sq8 { quantizer: ScalarQuantizer, codes: Vec<ListCodes> },
    /// A bit per component ([`crate::backend::bits`]): `bits::words(dim)` words per row.
    Bits { codes: Vec<Vec<u64>> },
    /// `m` product-quantizer codes per row ([`crate::backend::pq`]'s layout), with each
    /// row's own term of the scan's Euclidean distance.
    Pq { quantizer: ProductQuantizer, codes: Vec<ListCodes> },
}

impl Coded {
    /// The byte codes of an SQ8 or PQ index, with the bytes of one row.
    fn byte_codes(&mut self, dim: usize) -> Option<(&mut Vec<ListCodes>, usize)> {
        match self {
            Coded::Sq8 { codes, .. } => Some((codes, dim)),
            Coded::Pq { quantizer, codes } => {
                let bytes = quantizer.code_bytes();
                Some((codes, bytes))
            }
            Coded::Bits { .. } => None,
        }
    }
}

/// New vectors' lists and, for a quantized index, their codes (row-major; SQ8's and PQ's with
/// each row's own term): what an add computes before the collection changes.
#[derive(Debug, Default)]
pub(crate) struct Assigned {
    lists: Vec<u32>,
    codes: ListCodes,
    bits: Vec<u64>,
}

impl Assigned {
    /// Appends `more`'s vectors after these.
    pub(crate) fn append(&mut self, more: Assigned) {
        self.lists.extend(more.lists);
        self.codes.codes.extend(more.codes.codes);
        self.codes.norms.extend(more.codes.norms);
        self.bits.extend(more.bits);
    }
}

/// The search parameters of an IVF index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probe {
    /// Lists scanned per query.
    pub(crate) nprobe: usize,
    /// A quantized index re-ranks exactly the best `refine_factor * k` rows its codes
    /// nominate; None for the index's default ([`IndexSpec::default_refine_factor`]).
    pub(crate) refine_factor: Option<usize>,
}

/// What an index's training found, for `hive-gpu info` and the benchmark.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Trained {
    /// Vectors k-means trained on.
    pub(crate) training_vectors: usize,
    /// Lloyd iterations run.
    pub(crate) iterations: usize,
}

impl Ivf {
    /// Trains `spec`'s centroids (and quantizer) on a sample of `collection`'s live vectors
    /// and files every live vector in its list. `spec` is an IVF kind or the flat SQ8 index.
    pub(crate) fn build(
        backend: &dyn GpuBackend,
        tuning: &crate::tuning::Tuning,
        collection: &Collection,
        spec: IndexSpec,
    ) -> Result<Self> {
        let nlist = spec.nlist();
        if nlist == 0 {
            return Err(HiveGpuError::Internal("the flat search has no lists to build".into()));
        }
        let config = *collection.config();
        if config.metric.is_difference_norm() {
            // k-means, the quantizers' tables and the list scans are built on inner products.
            return Err(HiveGpuError::InvalidArgument(format!(
                "{spec} supports the l2, cosine and dot metrics; this collection's metric is {} (search it exactly)",
                config.metric
            )));
        }
        let dim = config.dimension;
        let live: Vec<usize> =
            (0..collection.slots()).filter(|&s| !collection.removed().contains(s)).collect();
        if live.len() < nlist {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{spec} needs at least {nlist} vectors to train its lists; the collection holds {}",
                live.len()
            )));
        }
        if let Some((m, bits)) = spec.product_codes() {
            ProductQuantizer::check_shape(dim, m, bits)
                .map_err(|e| HiveGpuError::InvalidArgument(format!("{spec}: {e}")))?;
            if live.len() < 1 << bits {
                return Err(HiveGpuError::InvalidArgument(format!(
                    "{spec} trains {} centroids per sub-quantizer: it needs at least that many vectors; the collection holds {}",
                    1 << bits,
                    live.len()
                )));
            }
        }
        if collection.slots() > u32::MAX as usize {
            return Err(HiveGpuError::InvalidArgument(format!(
                "an IVF index holds at most {} slots; the collection has {}",
                u32::MAX,
                collection.slots()
            )));
        }
        let began = std::time::Instant::now();
        // A quantizer's ranges want more of the data than 256 vectors per list where lists are
        // few (the flat SQ8 and binary indexes have one).
        let floor = if spec.is_quantized() { QUANTIZER_TRAINING } else { 0 };
        let wanted = nlist.saturating_mul(TRAINING_PER_LIST).max(floor).min(live.len());
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
            training.chunks_exact_mut(dim).for_each(to_unit);
        }
        let params = KMeansParams {
            clusters: nlist,
            iterations: TRAINING_ITERATIONS,
            max_training_vectors: training_slots.len(),
            seed: SEED,
        };
        let sampled_in = began.elapsed();
        let mut trained = kmeans::train(backend, tuning, &training, dim, &params)?;
        if config.metric == GpuDistanceMetric::Cosine {
            // Probed by direction: unit centroids. A mean of unit vectors can be (almost) zero,
            // which has no direction: such a centroid takes a training vector's instead.
            for (c, centroid) in trained.centroids.chunks_exact_mut(dim).enumerate() {
                let norm = crate::exact::squared_norm_f64(centroid).sqrt();
                if norm < 1e-9 {
                    let i = c % (training.len() / dim);
                    centroid.copy_from_slice(&training[i * dim..(i + 1) * dim]);
                } else {
                    to_unit(centroid);
                }
            }
        }
        let mut probe = backend.new_rows(dim, StoragePrecision::F32, SearchPrecision::Exact, tuning)?;
        probe.append(&trained.centroids)?;
        let mut index = Self {
            spec,
            metric: config.metric,
            centroids: trained.centroids,
            probe,
            lists: vec![Vec::new(); nlist],
            coded: None,
            precision: config.precision,
            generation: ListProbes::next_generation(),
            lineage: ListProbes::next_generation(),
            trained: Trained { training_vectors: trained.training_vectors, iterations: trained.iterations },
        };
        if spec == IndexSpec::Binary {
            index.coded = Some(Coded::Bits { codes: vec![Vec::new(); nlist] });
        } else if spec.is_quantized() {
            // The grid spans the training vectors' residuals to their own lists.
            let lists = index.nearest_lists(&training)?;
            for (v, &l) in training.chunks_exact_mut(dim).zip(&lists) {
                index.subtract_centroid(v, l as usize);
            }
            index.coded = Some(match spec.product_codes() {
                Some((m, bits)) => Coded::Pq {
                    quantizer: ProductQuantizer::train(backend, tuning, &training, dim, m, bits)?,
                    codes: vec![ListCodes::default(); nlist],
                },
                None => Coded::Sq8 {
                    quantizer: ScalarQuantizer::train(&training, dim)?,
                    codes: vec![ListCodes::default(); nlist],
                },
            });
        }
        drop(training);
        let trained_in = began.elapsed();
        // Where the assignment's time goes, for the profile: gather, nearest lists, encode.
        let mut spent = [std::time::Duration::ZERO; 3];
        for piece in live.chunks(ASSIGN_PIECE) {
            let mut lap = std::time::Instant::now();
            let mut mark = |phase: usize| {
                spent[phase] += lap.elapsed();
                lap = std::time::Instant::now();
            };
            let values = collection.rows().gather(piece)?;
            mark(0);
            // Gathered rows are stored values already: no rounding to do.
            let lists = index.nearest_lists(&values)?;
            mark(1);
            let assigned = index.encode(&values, lists)?;
            index.file(piece.iter().map(|&s| s as u32), &assigned);
            mark(2);
        }
        // Filed by pushes, the lists hold up to twice their room: give it back once.
        index.lists.iter_mut().for_each(Vec::shrink_to_fit);
        match &mut index.coded {
            Some(Coded::Bits { codes }) => codes.iter_mut().for_each(Vec::shrink_to_fit),
            Some(coded) => {
                if let Some((codes, _)) = coded.byte_codes(dim) {
                    codes.iter_mut().for_each(|list| {
                        list.codes.shrink_to_fit();
                        list.norms.shrink_to_fit();
                    });
                }
            }
            None => {}
        }
        if crate::backend::profiling() {
            eprintln!(
                "hive-gpu profile (ivf build, ms): sample {:.3}, k-means {:.3}, assign {:.3} (gather {:.3}, nearest {:.3}, encode and file {:.3})",
                sampled_in.as_secs_f64() * 1e3,
                (trained_in - sampled_in).as_secs_f64() * 1e3,
                (began.elapsed() - trained_in).as_secs_f64() * 1e3,
                spent[0].as_secs_f64() * 1e3,
                spent[1].as_secs_f64() * 1e3,
                spent[2].as_secs_f64() * 1e3,
            );
        }
        Ok(index)
    }

    /// Lists (centroids).
    pub(crate) fn nlist(&self) -> usize {
        self.lists.len()
    }

    /// Components per vector.
    fn dim(&self) -> usize {
        self.centroids.len() / self.nlist()
    }

    /// The spec this index was built from.
    pub(crate) fn spec(&self) -> IndexSpec {
        self.spec
    }

    /// The centroids, `nlist x dim` row-major.
    pub(crate) fn centroids(&self) -> &[f32] {
        &self.centroids
    }

    /// Each list's slots (removed ones included until a compaction).
    pub(crate) fn lists(&self) -> &[Vec<u32>] {
        &self.lists
    }

    /// What a collection file keeps of the quantizer: the SQ8 grid or the PQ codebooks.
    pub(crate) fn stored_quantizer(&self) -> Option<StoredQuantizer> {
        match &self.coded {
            Some(Coded::Sq8 { quantizer, .. }) => {
                Some(StoredQuantizer::Scalar { base: quantizer.base.clone(), step: quantizer.step.clone() })
            }
            Some(Coded::Pq { quantizer, .. }) => Some(StoredQuantizer::Product {
                m: quantizer.m(),
                bits: quantizer.bits(),
                codebooks: quantizer.codebooks().to_vec(),
            }),
            Some(Coded::Bits { .. }) | None => None,
        }
    }

    /// The index a collection file saved ([`crate::persist::format::StoredIndex`], checked:
    /// finite centroids of the collection's dimension, every live slot once), its slots
    /// renumbered by `slot_of` (file slot to collection slot), on `backend`. A coded index
    /// encodes `rows` (the collection's, loaded) again: the codes are a function of the stored
    /// vectors, the centroids and the grid, so they are not saved.
    pub(crate) fn from_stored(
        backend: &dyn GpuBackend,
        tuning: &crate::tuning::Tuning,
        config: &crate::types::StorageConfig,
        rows: &dyn RowStore,
        stored: &crate::persist::format::StoredIndex,
        slot_of: impl Fn(u32) -> u32,
    ) -> Result<Self> {
        let (metric, dim) = (config.metric, config.dimension);
        // Centroids are probed as vectors of the collection are searched: the same checks.
        let probed = crate::types::StorageConfig::new(dim, metric);
        for (c, centroid) in stored.centroids.chunks_exact(dim).enumerate() {
            crate::collection::check_values(centroid, &probed, Subject::Vector(&format!("centroid {c}")))?;
        }
        let mut probe = backend.new_rows(dim, StoragePrecision::F32, SearchPrecision::Exact, tuning)?;
        probe.append(&stored.centroids)?;
        let nlist = stored.lists.len();
        let mut index = Self {
            spec: stored.spec,
            metric,
            centroids: stored.centroids.clone(),
            probe,
            lists: stored.lists.iter().map(|l| l.iter().map(|&s| slot_of(s)).collect()).collect(),
            coded: None,
            precision: config.precision,
            generation: ListProbes::next_generation(),
            lineage: ListProbes::next_generation(),
            trained: Trained {
                training_vectors: stored.training_vectors as usize,
                iterations: stored.iterations as usize,
            },
        };
        index.coded = match (&stored.quantizer, stored.spec) {
            (Some(StoredQuantizer::Scalar { base, step }), _) => {
                if base.len() != dim {
                    return Err(HiveGpuError::InvalidArgument(format!(
                        "the scalar quantizer has {} components, the collection {dim}",
                        base.len()
                    )));
                }
                let quantizer = ScalarQuantizer::from_parts(base.clone(), step.clone())?;
                Some(Coded::Sq8 { quantizer, codes: vec![ListCodes::default(); nlist] })
            }
            (Some(StoredQuantizer::Product { m, bits, codebooks }), _) => {
                let quantizer =
                    ProductQuantizer::from_parts(backend, tuning, dim, *m, *bits, codebooks.clone())?;
                Some(Coded::Pq { quantizer, codes: vec![ListCodes::default(); nlist] })
            }
            (None, IndexSpec::Binary) => Some(Coded::Bits { codes: vec![Vec::new(); nlist] }),
            (None, _) => None,
        };
        if index.coded.is_some() {
            // The stored vectors, encoded list by list as a build files them.
            for l in 0..nlist {
                for piece in index.lists[l].clone().chunks(ASSIGN_PIECE) {
                    let slots: Vec<usize> = piece.iter().map(|&s| s as usize).collect();
                    let values = rows.gather(&slots)?;
                    let assigned = index.encode(&values, vec![l as u32; piece.len()])?;
                    index.append_codes(&assigned);
                }
            }
        }
        Ok(index)
    }

    /// Each list's length, removed slots included.
    pub(crate) fn list_lengths(&self) -> Vec<usize> {
        self.lists.iter().map(Vec::len).collect()
    }

    /// Each vector's nearest centroid under the collection's metric, as a search probes them.
    fn nearest_lists(&self, values: &[f32]) -> Result<Vec<u32>> {
        let dim = self.dim();
        let mut assigned = Vec::with_capacity(values.len() / dim);
        if self.nlist() == 1 {
            assigned.resize(values.len() / dim, 0);
            return Ok(assigned);
        }
        for piece in values.chunks(ASSIGN_PIECE * dim) {
            if self.metric == GpuDistanceMetric::Euclidean {
                // The backend's 1-NN of many points over few rows (a kernel of its own on
                // CUDA/ROCm): the same picks as the k-NN below.
                assigned.extend(self.probe.nearest_rows(piece)?.into_iter().map(|slot| slot as u32));
                continue;
            }
            for found in self.probe.knn(piece, 1, self.metric, None)? {
                let nearest = found
                    .first()
                    .ok_or_else(|| HiveGpuError::Internal("assignment found no centroid".into()))?;
                assigned.push(nearest.slot as u32);
            }
        }
        Ok(assigned)
    }

    /// `v - centroid l`, in place.
    fn subtract_centroid(&self, v: &mut [f32], l: usize) {
        let dim = v.len();
        v.iter_mut().zip(&self.centroids[l * dim..(l + 1) * dim]).for_each(|(x, &c)| *x -= c);
    }

    /// `lists` (each vector's) with the codes of the stored vectors `values` in them. Rows are
    /// encoded independently, in pieces on the library's threads (a build encodes every row:
    /// one thread took most of an IVF-SQ8 build's assignment, docs/PERFORMANCE.md); the pieces
    /// join in row order.
    fn encode(&self, values: &[f32], lists: Vec<u32>) -> Result<Assigned> {
        let dim = self.dim();
        let mut assigned = Assigned { lists, ..Assigned::default() };
        let Some(coded) = &self.coded else { return Ok(assigned) };
        let (metric, centroids) = (self.metric, &self.centroids[..]);
        // A stored vector made the residual its codes encode: v - centroid l, of v as a unit
        // vector under cosine (the rows are searched as directions).
        let residual_of = move |v: &[f32], l: u32, out: &mut Vec<f32>| {
            out.clear();
            out.extend_from_slice(v);
            if metric == GpuDistanceMetric::Cosine {
                to_unit(out);
            }
            let l = l as usize;
            out.iter_mut().zip(&centroids[l * dim..(l + 1) * dim]).for_each(|(x, &c)| *x -= c);
        };
        let pieces = |rows: usize| values.par_chunks(rows * dim).zip(assigned.lists.par_chunks(rows));
        match coded {
            Coded::Pq { quantizer, .. } => {
                // Product codes are found a batch at a time (a 1-NN per sub-quantizer).
                let residuals: Vec<f32> = crate::exec::run(|| {
                    pieces(ENCODE_PIECE)
                        .flat_map_iter(|(rows, lists)| {
                            let mut residual = Vec::with_capacity(dim);
                            let mut out = Vec::with_capacity(rows.len());
                            for (v, &l) in rows.chunks_exact(dim).zip(lists) {
                                residual_of(v, l, &mut residual);
                                out.extend_from_slice(&residual);
                            }
                            out
                        })
                        .collect()
                })?;
                assigned.codes.codes = quantizer.encode(&residuals)?;
                let code_rows = &assigned.codes.codes;
                let bytes = quantizer.code_bytes();
                assigned.codes.norms = crate::exec::run(|| {
                    code_rows
                        .par_chunks(bytes * ENCODE_PIECE)
                        .zip(assigned.lists.par_chunks(ENCODE_PIECE))
                        .flat_map_iter(|(rows, lists)| {
                            let mut residual = vec![0.0; dim];
                            rows.chunks_exact(bytes)
                                .zip(lists)
                                .map(|(row, &l)| {
                                    let l = l as usize;
                                    quantizer.row_term(row, &centroids[l * dim..(l + 1) * dim], &mut residual)
                                })
                                .collect::<Vec<f32>>()
                        })
                        .collect()
                })?;
            }
            Coded::Sq8 { quantizer, .. } => {
                let parts: Vec<ListCodes> = crate::exec::run(|| {
                    pieces(ENCODE_PIECE)
                        .map(|(rows, lists)| {
                            let mut codes = ListCodes::default();
                            codes.codes.reserve(rows.len());
                            codes.norms.reserve(lists.len());
                            let mut residual = Vec::with_capacity(dim);
                            for (v, &l) in rows.chunks_exact(dim).zip(lists) {
                                residual_of(v, l, &mut residual);
                                quantizer.encode_into(&residual, &mut codes);
                            }
                            codes
                        })
                        .collect()
                })?;
                for part in parts {
                    assigned.codes.codes.extend_from_slice(&part.codes);
                    assigned.codes.norms.extend_from_slice(&part.norms);
                }
            }
            Coded::Bits { .. } => {
                let parts: Vec<Vec<u64>> = crate::exec::run(|| {
                    pieces(ENCODE_PIECE)
                        .map(|(rows, lists)| {
                            let mut words = Vec::with_capacity(lists.len() * bits::words(dim));
                            let mut unit = Vec::with_capacity(dim);
                            for (v, &l) in rows.chunks_exact(dim).zip(lists) {
                                let l = l as usize;
                                unit.clear();
                                unit.extend_from_slice(v);
                                if metric == GpuDistanceMetric::Cosine {
                                    to_unit(&mut unit);
                                }
                                bits::pack(&unit, &centroids[l * dim..(l + 1) * dim], &mut words);
                            }
                            words
                        })
                        .collect()
                })?;
                assigned.bits = parts.concat();
            }
        }
        Ok(assigned)
    }

    /// The list of each vector of `values` (row-major, the collection's dimension), and for a
    /// coded index its codes, as the collection will store it: the fallible half of an add.
    pub(crate) fn assign(&self, values: &[f32]) -> Result<Assigned> {
        match (&self.coded, self.precision) {
            (Some(_), StoragePrecision::F16 | StoragePrecision::Bf16) => {
                let precision = self.precision;
                let stored: Vec<f32> =
                    values.iter().map(|&x| crate::exact::elements::stored_value(x, precision)).collect();
                self.assign_stored(&stored)
            }
            // IVF-Flat files vectors without encoding them, and f32 and integer storage keep
            // them as given: no copy.
            _ => self.assign_stored(values),
        }
    }

    /// [`Ivf::assign`] of values that are stored values already.
    fn assign_stored(&self, values: &[f32]) -> Result<Assigned> {
        let lists = self.nearest_lists(values)?;
        self.encode(values, lists)
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
    /// [`Ivf::assign`], slots checked by [`Ivf::check_slots`]).
    pub(crate) fn push(&mut self, first: usize, assigned: &Assigned) {
        let count = assigned.lists.len() as u32;
        self.file(first as u32..first as u32 + count, assigned);
    }

    /// Files each slot of `slots` in its list of `assigned`, with its codes.
    fn file(&mut self, slots: impl Iterator<Item = u32>, assigned: &Assigned) {
        self.generation = ListProbes::next_generation();
        let nlist = self.lists.len();
        for (slot, &list) in slots.zip(&assigned.lists) {
            if let Some(members) = self.lists.get_mut(list as usize) {
                members.push(slot);
            }
        }
        if assigned.lists.iter().all(|&l| (l as usize) < nlist) {
            self.append_codes(assigned);
        }
    }

    /// Appends the codes of `assigned`'s vectors to their lists.
    fn append_codes(&mut self, assigned: &Assigned) {
        let dim = self.dim();
        match &mut self.coded {
            Some(Coded::Bits { codes }) => {
                let words = bits::words(dim);
                for (i, &l) in assigned.lists.iter().enumerate() {
                    codes[l as usize].extend_from_slice(&assigned.bits[i * words..(i + 1) * words]);
                }
            }
            Some(coded) => {
                if let Some((codes, bytes)) = coded.byte_codes(dim) {
                    for (i, &l) in assigned.lists.iter().enumerate() {
                        let list = &mut codes[l as usize];
                        list.codes.extend_from_slice(&assigned.codes.codes[i * bytes..(i + 1) * bytes]);
                        list.norms.push(assigned.codes.norms[i]);
                    }
                }
            }
            None => {}
        }
    }

    /// Follows a compaction that kept the slots `keep` (ascending), renumbered `0..keep.len()`.
    pub(crate) fn remap(&mut self, keep: &[usize], old_slots: usize) {
        const GONE: u32 = u32::MAX;
        self.generation = ListProbes::next_generation();
        self.lineage = ListProbes::next_generation();
        let dim = self.dim();
        let mut renumbered = vec![GONE; old_slots];
        for (new, &old) in keep.iter().enumerate() {
            renumbered[old] = new as u32;
        }
        let words = bits::words(dim);
        for (l, list) in self.lists.iter_mut().enumerate() {
            let mut kept = 0;
            for i in 0..list.len() {
                let Some(&new) = renumbered.get(list[i] as usize).filter(|&&n| n != GONE) else { continue };
                list[kept] = new;
                match &mut self.coded {
                    Some(Coded::Bits { codes }) => {
                        codes[l].copy_within(i * words..(i + 1) * words, kept * words)
                    }
                    Some(coded) => {
                        if let Some((codes, bytes)) = coded.byte_codes(dim) {
                            codes[l].codes.copy_within(i * bytes..(i + 1) * bytes, kept * bytes);
                            codes[l].norms[kept] = codes[l].norms[i];
                        }
                    }
                    None => {}
                }
                kept += 1;
            }
            list.truncate(kept);
            match &mut self.coded {
                Some(Coded::Bits { codes }) => codes[l].truncate(kept * words),
                Some(coded) => {
                    if let Some((codes, bytes)) = coded.byte_codes(dim) {
                        codes[l].codes.truncate(kept * bytes);
                        codes[l].norms.truncate(kept);
                    }
                }
                None => {}
            }
        }
    }

    /// Empties every list; the centroids (and quantizer) stay trained.
    pub(crate) fn clear(&mut self) {
        self.generation = ListProbes::next_generation();
        self.lineage = ListProbes::next_generation();
        self.lists.iter_mut().for_each(Vec::clear);
        match &mut self.coded {
            Some(Coded::Sq8 { codes, .. } | Coded::Pq { codes, .. }) => {
                codes.iter_mut().for_each(|c| *c = ListCodes::default())
            }
            Some(Coded::Bits { codes }) => codes.iter_mut().for_each(|c| *c = Vec::new()),
            None => {}
        }
    }

    /// Bytes of codes per vector (0 without codes).
    pub(crate) fn code_size(&self) -> usize {
        match &self.coded {
            Some(Coded::Sq8 { .. }) => self.dim() + 4,
            Some(Coded::Pq { quantizer, .. }) => quantizer.code_bytes() + 4,
            Some(Coded::Bits { .. }) => bits::words(self.dim()) * 8,
            None => 0,
        }
    }

    /// Bytes of the trained quantizer, whatever the number of vectors.
    pub(crate) fn quantizer_bytes(&self) -> usize {
        match &self.coded {
            Some(Coded::Sq8 { quantizer, .. }) => quantizer.dim() * 8,
            Some(Coded::Pq { quantizer, .. }) => quantizer.memory_bytes(),
            Some(Coded::Bits { .. }) | None => 0,
        }
    }

    /// Bytes the index adds to the collection: its lists (and codes) on the host and its
    /// centroids.
    pub(crate) fn memory_bytes(&self) -> usize {
        let codes = match &self.coded {
            Some(Coded::Sq8 { codes, .. } | Coded::Pq { codes, .. }) => {
                codes.iter().map(|l| l.codes.capacity() + l.norms.capacity() * 4).sum::<usize>()
            }
            Some(Coded::Bits { codes }) => codes.iter().map(|l| l.capacity() * 8).sum::<usize>(),
            None => 0,
        } + self.quantizer_bytes();
        self.lists.iter().map(|l| l.capacity() * 4).sum::<usize>()
            + codes
            + self.centroids.len() * 4
            + self.probe.memory_bytes()
    }

    /// The `k` nearest of each query among the live rows (in `allowed` where given) of its
    /// `nprobe` nearest lists: exactly (IVF-Flat), or the exact re-rank of the best
    /// `refine_factor * k` by their codes (IVF-SQ8).
    pub(crate) fn search(
        &self,
        rows: &dyn RowStore,
        removed: &SlotSet,
        queries: &[f32],
        k: usize,
        probe: Probe,
        allowed: Option<&SlotSet>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nprobe = probe.nprobe.clamp(1, self.nlist());
        let began = std::time::Instant::now();
        let mut probes = Vec::with_capacity(queries.len() / self.dim() * nprobe);
        if self.nlist() == 1 {
            probes.resize(queries.len() / self.dim(), 0);
        } else if nprobe == 1 && self.metric == GpuDistanceMetric::Euclidean {
            // One list a query: the 1-NN primitive, the same pick as the k-NN below without its
            // selection and lists (the nearest-row kernel on CUDA/ROCm).
            probes.extend(self.probe.nearest_rows(queries)?.into_iter().map(|slot| slot as u32));
        } else {
            // Every scan reads the union of a query's lists (IVF-Flat's rows, the coded indexes'
            // codes with terms per list): which lists is all it needs, not their order.
            probes = self.probe.nearest_sets(queries, nprobe, self.metric)?;
            if probes.len() != queries.len() / self.dim() * nprobe {
                return Err(HiveGpuError::Internal(format!(
                    "probing found {} lists for {} queries at nprobe {nprobe}",
                    probes.len(),
                    queries.len() / self.dim()
                )));
            }
        }
        let probed = began.elapsed();
        // When the lists' scan ended (IVF-Flat's includes its exact re-rank; a coded scan's
        // re-rank follows).
        let scanned;
        let found = match &self.coded {
            None => {
                let probes =
                    ListProbes { lists: &self.lists, probes: &probes, nprobe, generation: self.generation };
                let found = rows.scan_lists(queries, &probes, k, self.metric, allowed);
                scanned = began.elapsed();
                found
            }
            Some(coded) => {
                let dim = self.dim();
                let unit: Vec<f32>;
                let scanned_queries = if self.metric == GpuDistanceMetric::Cosine {
                    unit = queries
                        .chunks_exact(dim)
                        .flat_map(|q| {
                            let mut q = q.to_vec();
                            to_unit(&mut q);
                            q
                        })
                        .collect();
                    &unit[..]
                } else {
                    queries
                };
                let wanted =
                    k.saturating_mul(probe.refine_factor.unwrap_or(self.spec.default_refine_factor()).max(1));
                let scan = match coded {
                    Coded::Sq8 { quantizer, codes } => QuantizedScan::Sq8(CodeScan {
                        dim,
                        metric: self.metric,
                        queries: scanned_queries,
                        centroids: &self.centroids,
                        base: &quantizer.base,
                        step: &quantizer.step,
                        slots: &self.lists,
                        codes,
                        probes: &probes,
                        nprobe,
                        removed,
                        allowed,
                        generation: self.generation,
                        lineage: self.lineage,
                    }),
                    Coded::Pq { quantizer, codes } => QuantizedScan::Pq(PqScan {
                        dim,
                        metric: self.metric,
                        queries: scanned_queries,
                        centroids: &self.centroids,
                        m: quantizer.m(),
                        bits: quantizer.bits(),
                        codebooks: quantizer.codebooks(),
                        slots: &self.lists,
                        codes,
                        probes: &probes,
                        nprobe,
                        removed,
                        allowed,
                        generation: self.generation,
                    }),
                    Coded::Bits { codes } => QuantizedScan::Bits(BitScan {
                        dim,
                        queries: scanned_queries,
                        centroids: &self.centroids,
                        slots: &self.lists,
                        codes,
                        probes: &probes,
                        nprobe,
                        removed,
                        allowed,
                        generation: self.generation,
                    }),
                };
                // The scan and its exact re-rank are one step (one device round trip on CUDA):
                // the profile reports them together.
                scanned = began.elapsed();
                rows.scan_and_refine(scan, wanted, queries, k, self.metric)
            }
        };
        if crate::backend::profiling() {
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            let total = began.elapsed();
            if self.coded.is_some() {
                eprintln!(
                    "hive-gpu profile (ivf probe, scan and refine; ms): {:.3} {:.3}",
                    ms(probed),
                    ms(total - probed)
                );
            } else {
                eprintln!(
                    "hive-gpu profile (ivf probe, scan, refine; ms): {:.3} {:.3} {:.3}",
                    ms(probed),
                    ms(scanned.max(probed) - probed),
                    ms(total - scanned.max(probed))
                );
            }
        }
        found
    }
}

/// Scales `v` to unit length (a zero vector stays as it is).
fn to_unit(v: &mut [f32]) {
    let norm = crate::exact::squared_norm_f64(v).sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}
