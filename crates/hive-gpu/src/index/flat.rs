//! Exact (brute-force) search: validation, the backend's fused k-NN, and the one place where
//! canonical distances become the metric's public score.

use crate::backend::{Neighbor, PARALLEL_RESULTS, profiling};
use crate::collection::{Collection, Subject, check_values};
use crate::error::{HiveGpuError, Result};
use crate::types::{GpuDistanceMetric, GpuSearchResult, SearchOptions};
use rayon::prelude::*;
use std::sync::Arc;

/// The public score of a canonical distance (see [`GpuSearchResult`] for the meanings).
pub(crate) fn score(metric: GpuDistanceMetric, distance: f64) -> f32 {
    match metric {
        GpuDistanceMetric::Euclidean => distance.max(0.0).sqrt() as f32,
        GpuDistanceMetric::DotProduct => (-distance) as f32,
        GpuDistanceMetric::Cosine => (-distance).clamp(-1.0, 1.0) as f32,
    }
}

/// The exact `k` nearest neighbours of each query of a row-major batch.
pub(crate) fn search(
    collection: &Collection,
    queries: &[f32],
    k: usize,
    options: SearchOptions,
) -> Result<Vec<Vec<GpuSearchResult>>> {
    let config = *collection.config();
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
        check_values(q, &config, Subject::Query(i))?;
    }
    if queries.is_empty() {
        return Ok(Vec::new());
    }
    if collection.len() == 0 {
        return Err(HiveGpuError::EmptyCollection);
    }
    let k = k.min(collection.len());
    let neighbours = collection.rows().knn(queries, k, config.metric)?;
    let began = std::time::Instant::now();
    // Built on one thread, a big batch's results cost more than the GPU search itself.
    let to_results = |list: Vec<Neighbor>| -> Result<Vec<GpuSearchResult>> {
        list.into_iter()
            .map(|n| {
                let (id, metadata) = collection.entry(n.slot).ok_or_else(|| {
                    HiveGpuError::Internal(format!("backend returned removed slot {}", n.slot))
                })?;
                Ok(GpuSearchResult {
                    id: id.clone(),
                    score: score(config.metric, n.distance),
                    index: n.slot,
                    metadata: options.with_metadata.then(|| Arc::clone(metadata)),
                })
            })
            .collect()
    };
    let results = if neighbours.len() * k >= PARALLEL_RESULTS {
        neighbours.into_par_iter().map(to_results).collect()
    } else {
        neighbours.into_iter().map(to_results).collect()
    };
    if profiling() {
        eprintln!("hive-gpu profile (results, ms): {:.3}", began.elapsed().as_secs_f64() * 1e3);
    }
    results
}
