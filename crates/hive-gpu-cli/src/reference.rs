//! The yardstick for recall when a data set has no (applicable) ground truth: a plain f64
//! brute force, independent of every backend, on a sample of the queries.

use hive_gpu::GpuDistanceMetric;
use hive_gpu::io::Matrix;
use rayon::prelude::*;

/// Scalar f64 multiply-adds the reference may spend (bounds its run time to seconds).
const WORK_BUDGET: f64 = 4e9;

/// Evenly spaced query indices the reference can afford: at most 100, at least 10.
pub fn sample(nq: usize, n: usize, dim: usize) -> Vec<usize> {
    let affordable = (WORK_BUDGET / (n as f64 * dim as f64)).floor() as usize;
    let count = affordable.clamp(10, 100).min(nq);
    (0..count).map(|i| i * nq / count).collect()
}

/// Exact k nearest base rows of each sampled query, ties by row index.
pub fn knn(
    base: &Matrix,
    queries: &Matrix,
    sample: &[usize],
    k: usize,
    metric: GpuDistanceMetric,
) -> Vec<Vec<usize>> {
    let all: Vec<usize> = (0..base.rows).collect();
    knn_among(base, &all, queries, sample, k, metric)
}

/// Exact k nearest of the base rows `among` (ascending) for each sampled query, ties by row
/// index.
pub fn knn_among(
    base: &Matrix,
    among: &[usize],
    queries: &Matrix,
    sample: &[usize],
    k: usize,
    metric: GpuDistanceMetric,
) -> Vec<Vec<usize>> {
    sample
        .par_iter()
        .map(|&qi| {
            let q = queries.row(qi);
            let q_norm = norm(q);
            let mut scored: Vec<(f64, usize)> = among
                .iter()
                .map(|&i| {
                    let x = base.row(i);
                    let d = match metric {
                        GpuDistanceMetric::Euclidean => {
                            q.iter().zip(x).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum()
                        }
                        GpuDistanceMetric::DotProduct => -dot(q, x),
                        GpuDistanceMetric::Cosine => -dot(q, x) / (q_norm * norm(x)).max(f64::MIN_POSITIVE),
                        GpuDistanceMetric::Manhattan => {
                            q.iter().zip(x).map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs()).sum()
                        }
                        GpuDistanceMetric::Chebyshev => q
                            .iter()
                            .zip(x)
                            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
                            .fold(0.0, f64::max),
                    };
                    (d, i)
                })
                .collect();
            let by = |a: &(f64, usize), b: &(f64, usize)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
            let k = k.min(scored.len());
            if k == 0 {
                return Vec::new();
            }
            scored.select_nth_unstable_by(k - 1, by);
            scored.truncate(k);
            scored.sort_unstable_by(by);
            scored.into_iter().map(|(_, i)| i).collect()
        })
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum()
}

fn norm(a: &[f32]) -> f64 {
    dot(a, a).sqrt()
}

/// Mean fraction of each truth list's first k ids found in the matching result list.
pub fn recall(results: &[Vec<usize>], truth: &[Vec<usize>], k: usize) -> f64 {
    if results.is_empty() {
        return 0.0;
    }
    let total: f64 = results
        .iter()
        .zip(truth)
        .map(|(got, want)| {
            let want = &want[..k.min(want.len())];
            let hits = got.iter().take(k).filter(|id| want.contains(id)).count();
            hits as f64 / want.len().max(1) as f64
        })
        .sum();
    total / results.len() as f64
}
