//! k-means (Lloyd's iterations) on any backend: the coarse quantizer of the IVF indexes and the
//! codebooks of product quantization train with it.
//!
//! The centroids live in a flat row store of the context's backend, so every assignment step is
//! the backend's exact 1-NN of the training vectors over them ([`RowStore::nearest_rows`]: the
//! device's nearest-row kernel on CUDA/ROCm, `nearest_sets` at n = 1 on the CPU, the exact
//! k-NN elsewhere), and probing a trained index is that store's `nearest_sets` with `nprobe`
//! (`nearest_rows` again at nprobe 1). The
//! update step sums each cluster's members on the host in f64, cluster by cluster over the
//! members in their order, so it is deterministic: exact search breaks ties by slot on every
//! backend, hence the same seed gives the same centroids, bit for bit, on every backend.
//!
//! Initialisation is k-means++ where it is cheap (a pass over the training vectors per
//! centroid, on the host), else distinct training vectors sampled uniformly (FAISS's default,
//! for an IVF's thousands of lists). Training uses at
//! most `max_training_vectors` of the input, sampled. A cluster left empty takes half of the
//! largest one: both centroids move apart by a relative `1/1024` along the largest's own
//! direction, as FAISS splits them.

use rayon::prelude::*;

use crate::backend::{GpuBackend, RowStore};
use crate::collection::{Subject, check_values};
use crate::error::{HiveGpuError, Result};
use crate::types::{GpuDistanceMetric, SearchPrecision, StorageConfig, StoragePrecision};

/// How to train k-means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KMeansParams {
    /// Clusters (centroids) to find; at least 1, at most the training vectors.
    pub clusters: usize,
    /// Lloyd iterations at most (training stops early once no vector changes cluster).
    pub iterations: usize,
    /// Training vectors used at most: a larger input is sampled down to this many (FAISS's
    /// default is 256 per centroid).
    pub max_training_vectors: usize,
    /// Seed of the sampling and the initial centroids.
    pub seed: u64,
}

impl KMeansParams {
    /// `clusters` clusters, 20 iterations, at most 256 training vectors per cluster, seed 1234.
    pub fn new(clusters: usize) -> Self {
        Self { clusters, iterations: 20, max_training_vectors: clusters.saturating_mul(256), seed: 1234 }
    }
}

/// Trained centroids.
#[derive(Debug, Clone, PartialEq)]
pub struct KMeans {
    /// Components per vector.
    pub dim: usize,
    /// `clusters x dim` values, row-major.
    pub centroids: Vec<f32>,
    /// Sum of the squared distances of the training vectors to their centroids, after the last
    /// assignment.
    pub inertia: f64,
    /// Lloyd iterations run.
    pub iterations: usize,
    /// Training vectors used (after sampling).
    pub training_vectors: usize,
}

impl KMeans {
    /// Clusters found.
    pub fn clusters(&self) -> usize {
        self.centroids.len() / self.dim.max(1)
    }

    /// Centroid `c`.
    pub fn centroid(&self, c: usize) -> &[f32] {
        &self.centroids[c * self.dim..(c + 1) * self.dim]
    }
}

/// k-means++ initialisation runs where it costs at most this many multiply-adds (clusters x
/// candidates per step x training vectors x dimension: a fraction of a second on two cores);
/// larger trainings sample their initial centroids (an IVF's thousands of lists, where FAISS
/// samples too).
const PLUS_PLUS_WORK: usize = 1 << 28;

/// The relative distance a split moves two centroids apart.
const SPLIT: f32 = 1.0 / 1024.0;

/// Trains k-means on `vectors` (row-major, `dim` per vector) with assignments on `backend`.
pub(crate) fn train(
    backend: &dyn GpuBackend,
    tuning: &crate::tuning::Tuning,
    vectors: &[f32],
    dim: usize,
    params: &KMeansParams,
) -> Result<KMeans> {
    if dim == 0 || !vectors.len().is_multiple_of(dim) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "k-means needs whole vectors of a dimension of at least 1 ({} values, dimension {dim})",
            vectors.len()
        )));
    }
    let n = vectors.len() / dim;
    let k = params.clusters;
    if k == 0 || k > n || params.iterations == 0 || params.max_training_vectors < k {
        return Err(HiveGpuError::InvalidArgument(format!(
            "k-means of {k} clusters needs 1 to {n} clusters (the vectors given), at least one \
             iteration ({}) and at least as many training vectors as clusters ({})",
            params.iterations, params.max_training_vectors
        )));
    }
    let config = StorageConfig::new(dim, GpuDistanceMetric::Euclidean);
    if let Some(error) = vectors
        .par_chunks_exact(dim)
        .enumerate()
        .find_map_first(|(i, v)| check_values(v, &config, Subject::Query(i)).err())
    {
        return Err(error);
    }
    let mut rng = SplitMix(params.seed);
    // The training vectors: all of them, or a sample in input order.
    let training: Vec<f32>;
    let points: &[f32] = if n > params.max_training_vectors {
        let mut chosen = sample(&mut rng, n, params.max_training_vectors);
        chosen.sort_unstable();
        training = chosen.iter().flat_map(|&i| vectors[i * dim..(i + 1) * dim].iter().copied()).collect();
        &training
    } else {
        vectors
    };
    let count = points.len() / dim;
    let work = k.saturating_mul(plus_plus_trials(k)).saturating_mul(count).saturating_mul(dim);
    let seeds =
        if work <= PLUS_PLUS_WORK { plus_plus(&mut rng, points, dim, k) } else { sample(&mut rng, count, k) };
    let mut centroids: Vec<f32> =
        seeds.iter().flat_map(|&i| points[i * dim..(i + 1) * dim].iter().copied()).collect();
    let mut store = backend.new_rows(dim, StoragePrecision::F32, SearchPrecision::Exact, tuning)?;
    let mut assigned: Vec<usize> = Vec::new();
    let mut iterations = 0;
    let profile = crate::backend::profiling();
    while iterations < params.iterations {
        let began = std::time::Instant::now();
        let next = assign(store.as_mut(), &centroids, points, dim)?;
        let assigned_in = began.elapsed();
        iterations += 1;
        let settled = next == assigned;
        assigned = next;
        if settled {
            break;
        }
        centroids = update(points, dim, k, &assigned);
        split_empty(&mut centroids, dim, &assigned, k);
        if profile {
            eprintln!(
                "hive-gpu profile (k-means iteration {iterations}, ms): assign {:.3}, update {:.3}",
                assigned_in.as_secs_f64() * 1e3,
                (began.elapsed() - assigned_in).as_secs_f64() * 1e3
            );
        }
    }
    if iterations == params.iterations {
        // The centroids moved after the last assignment: measure them as returned.
        assigned = assign(store.as_mut(), &centroids, points, dim)?;
    }
    let inertia = inertia(points, dim, &centroids, &assigned);
    Ok(KMeans { dim, centroids, inertia, iterations, training_vectors: count })
}

/// Each point's nearest centroid (ties to the lower centroid), on the backend
/// ([`RowStore::nearest_rows`]).
fn assign(store: &mut dyn RowStore, centroids: &[f32], points: &[f32], dim: usize) -> Result<Vec<usize>> {
    store.clear();
    store.append(centroids)?;
    let assigned = store.nearest_rows(points)?;
    if assigned.len() != points.len() / dim {
        return Err(HiveGpuError::Internal("k-means assignment returned no centroid for a vector".into()));
    }
    Ok(assigned)
}

/// The sum of each point's squared distance to its centroid, in f64 on the host, summed in
/// point order: the same number on every backend and every run for the same assignment.
fn inertia(points: &[f32], dim: usize, centroids: &[f32], assigned: &[usize]) -> f64 {
    let distances: Vec<f64> = points
        .par_chunks_exact(dim)
        .zip(assigned.par_iter())
        .map(|(p, &c)| {
            p.iter()
                .zip(&centroids[c * dim..(c + 1) * dim])
                .map(|(&x, &y)| {
                    let d = f64::from(x) - f64::from(y);
                    d * d
                })
                .sum::<f64>()
        })
        .collect();
    distances.iter().sum()
}

/// The mean of each cluster's members (f64 sums, members in order: deterministic); an empty
/// cluster's row is left zero for [`split_empty`].
fn update(points: &[f32], dim: usize, k: usize, assigned: &[usize]) -> Vec<f32> {
    // Members listed per cluster (a counting sort keeps them in input order).
    let mut starts = vec![0usize; k + 1];
    for &c in assigned {
        starts[c + 1] += 1;
    }
    for c in 0..k {
        starts[c + 1] += starts[c];
    }
    let mut members = vec![0usize; assigned.len()];
    let mut next = starts.clone();
    for (i, &c) in assigned.iter().enumerate() {
        members[next[c]] = i;
        next[c] += 1;
    }
    let mut centroids = vec![0f32; k * dim];
    centroids.par_chunks_exact_mut(dim).enumerate().for_each(|(c, centroid)| {
        let own = &members[starts[c]..starts[c + 1]];
        if own.is_empty() {
            return;
        }
        let mut sum = vec![0f64; dim];
        for &i in own {
            for (s, &x) in sum.iter_mut().zip(&points[i * dim..(i + 1) * dim]) {
                *s += f64::from(x);
            }
        }
        for (out, s) in centroid.iter_mut().zip(sum) {
            *out = (s / own.len() as f64) as f32;
        }
    });
    centroids
}

/// Gives every empty cluster half of the largest one: the two centroids move apart along the
/// largest's own direction (FAISS's split), and the sizes are halved for the next empty one.
fn split_empty(centroids: &mut [f32], dim: usize, assigned: &[usize], k: usize) {
    let mut sizes = vec![0usize; k];
    for &c in assigned {
        sizes[c] += 1;
    }
    for empty in 0..k {
        if sizes[empty] > 0 {
            continue;
        }
        // The largest cluster, the lowest index among equals (deterministic).
        let largest = (0..k).max_by_key(|&c| (sizes[c], std::cmp::Reverse(c))).unwrap_or(0);
        for j in 0..dim {
            let x = centroids[largest * dim + j];
            // A zero component moves too, so that two copies of the origin still part.
            let step = if x == 0.0 { SPLIT } else { x * SPLIT };
            centroids[empty * dim + j] = x + step;
            centroids[largest * dim + j] = x - step;
        }
        sizes[empty] = sizes[largest] / 2;
        sizes[largest] -= sizes[empty];
    }
}

/// Greedy k-means++ seeds (as scikit-learn's): the first uniformly; for each next, `trials`
/// candidates drawn with probability proportional to their squared distance to the nearest seed
/// so far, and the one that leaves the smallest total kept. One candidate alone lands in an
/// already covered cluster now and then (once in a few hundred thousand draws per point there,
/// but a training draws many); the best of several does not. Once every point coincides with a
/// seed, the rest are drawn uniformly among the others.
fn plus_plus(rng: &mut SplitMix, points: &[f32], dim: usize, k: usize) -> Vec<usize> {
    let count = points.len() / dim;
    let distance = |a: usize, b: usize| -> f64 {
        points[a * dim..(a + 1) * dim]
            .iter()
            .zip(&points[b * dim..(b + 1) * dim])
            .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
            .sum()
    };
    let trials = plus_plus_trials(k);
    let mut seeds = vec![(rng.next() % count as u64) as usize];
    let mut nearest: Vec<f64> = (0..count).map(|i| distance(i, seeds[0])).collect();
    let mut chosen = vec![false; count];
    chosen[seeds[0]] = true;
    while seeds.len() < k {
        let total: f64 = nearest.iter().sum();
        let mut best: Option<(f64, usize, Vec<f64>)> = None;
        if total > 0.0 {
            for _ in 0..trials {
                let target = rng.unit() * total;
                let mut running = 0.0;
                let mut pick = None;
                for (i, &d) in nearest.iter().enumerate() {
                    running += d;
                    if d > 0.0 && running >= target {
                        pick = Some(i);
                        break;
                    }
                }
                // Rounding can leave the target past the last positive term: take that term.
                let Some(candidate) = pick.or_else(|| nearest.iter().rposition(|&d| d > 0.0)) else { break };
                let kept: Vec<f64> =
                    nearest.par_iter().enumerate().map(|(i, &d)| d.min(distance(i, candidate))).collect();
                let left: f64 = kept.iter().sum();
                if best.as_ref().is_none_or(|(b, _, _)| left < *b) {
                    best = Some((left, candidate, kept));
                }
            }
        }
        let next = match best {
            Some((_, candidate, kept)) => {
                nearest = kept;
                candidate
            }
            None => {
                let free: Vec<usize> = (0..count).filter(|&i| !chosen[i]).collect();
                let pick = free[(rng.next() % free.len() as u64) as usize];
                nearest.par_iter_mut().enumerate().for_each(|(i, d)| *d = d.min(distance(i, pick)));
                pick
            }
        };
        chosen[next] = true;
        seeds.push(next);
    }
    seeds
}

/// Candidates per greedy k-means++ step: scikit-learn's 2 + ln k.
fn plus_plus_trials(k: usize) -> usize {
    2 + (k as f64).ln() as usize
}

/// `count` distinct indices below `n`, in random order (a partial Fisher-Yates shuffle).
pub(crate) fn sample(rng: &mut SplitMix, n: usize, count: usize) -> Vec<usize> {
    let mut indices: Vec<usize> = (0..n).collect();
    for i in 0..count.min(n) {
        let j = i + (rng.next() % (n - i) as u64) as usize;
        indices.swap(i, j);
    }
    indices.truncate(count.min(n));
    indices
}

/// SplitMix64: a small, seedable generator (the sampling needs no more).
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
