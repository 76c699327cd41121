//! Exact (brute-force) search: validation, the backend's fused k-NN, and the one place where
//! canonical distances become the metric's public score.

use crate::backend::{Neighbor, PARALLEL_RESULTS, profiling};
use crate::collection::{Collection, Subject, check_values};
use crate::error::{HiveGpuError, Result};
use crate::slots::SlotSet;
use crate::types::{GpuDistanceMetric, GpuSearchResult, SearchOptions};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

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
    options: &SearchOptions,
) -> Result<Vec<Vec<GpuSearchResult>>> {
    let config = *collection.config();
    let with_payload = options.with_metadata;
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
    let nq = queries.len() / dim;
    // A filter becomes the live slots that pass it, read by every kernel of the search.
    let allowed = options.filter.as_ref().map(|f| collection.allowed(f)).transpose()?;
    let allowed = allowed.as_ref();
    let searched = allowed.map_or(collection.len(), SlotSet::count);
    if searched == 0 {
        return Ok(vec![Vec::new(); nq]);
    }
    let k = k.min(searched);
    let pieces = Pieces::of(nq);
    if pieces.count == 1 {
        let neighbours = collection.rows().knn(queries, k, config.metric, allowed)?;
        return to_results(collection, neighbours, k, with_payload);
    }
    // Pieces are searched by `WORKERS` threads in turn, and each piece's results are built on
    // other threads while its worker searches the next: the device is not left idle while
    // the host prepares queries or builds result structures.
    let done: Vec<OnceLock<Result<Vec<Vec<GpuSearchResult>>>>> =
        (0..pieces.count).map(|_| OnceLock::new()).collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    // On the library's pool (`crate::exec`): the caller holds the collection's lock.
    crate::exec::run(|| {
        rayon::scope(|scope| {
            for _ in 0..pieces.workers {
                scope.spawn(|scope| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= pieces.count || failed.load(Ordering::Relaxed) {
                            break;
                        }
                        let range = pieces.range(i, nq);
                        let piece = &queries[range.start * dim..range.end * dim];
                        match collection.rows().knn(piece, k, config.metric, allowed) {
                            Ok(neighbours) => {
                                let slot = &done[i];
                                scope.spawn(move |_| {
                                    let _ = slot.set(to_results(collection, neighbours, k, with_payload));
                                });
                            }
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                let _ = done[i].set(Err(e));
                            }
                        }
                    }
                });
            }
        })
    })?;
    let mut results = Vec::with_capacity(nq);
    for (i, piece) in done.into_iter().enumerate() {
        let found = match piece.into_inner() {
            Some(Ok(found)) => found,
            // Pieces side by side need more device memory than one alone: a piece that ran
            // out of it, and those skipped after it, run again on their own.
            Some(Err(HiveGpuError::VramLimitExceeded { .. })) | None => {
                // The other pieces' idle workspaces would keep their memory: free them first.
                collection.rows().release_scratch();
                let range = pieces.range(i, nq);
                let piece = &queries[range.start * dim..range.end * dim];
                to_results(
                    collection,
                    collection.rows().knn(piece, k, config.metric, allowed)?,
                    k,
                    with_payload,
                )?
            }
            Some(Err(e)) => return Err(e),
        };
        results.extend(found);
    }
    Ok(results)
}

/// How a batch is cut for [`search`]: `count` pieces of at most `size` queries, searched by
/// `workers` threads.
struct Pieces {
    count: usize,
    size: usize,
    workers: usize,
}

impl Pieces {
    fn of(nq: usize) -> Self {
        if nq < 2 * PIECE_QUERIES {
            return Self { count: 1, size: nq, workers: 1 };
        }
        let count = nq.div_ceil(PIECE_QUERIES);
        Self { count, size: nq.div_ceil(count), workers: WORKERS }
    }

    fn range(&self, i: usize, nq: usize) -> std::ops::Range<usize> {
        i * self.size..((i + 1) * self.size).min(nq)
    }
}

/// Queries per piece of a large batch: enough to fill a big GPU (2,048 queries are 16 x 245
/// blocks of the fused filter over a million rows), few enough that pieces overlap host and
/// device work. Measured on the H200 against 1,024, 1,536 and 3,334 (docs/PERFORMANCE.md).
const PIECE_QUERIES: usize = 2048;
/// Pieces searched at once, so that one piece's host work has others' device work beside it.
/// On the H200, 1 and 2 were slower than 3 and 4, and 5 to 8 no faster (docs/PERFORMANCE.md).
const WORKERS: usize = 4;

/// The public results of one piece's neighbours.
fn to_results(
    collection: &Collection,
    neighbours: Vec<Vec<Neighbor>>,
    k: usize,
    with_payload: bool,
) -> Result<Vec<Vec<GpuSearchResult>>> {
    let config = *collection.config();
    let began = std::time::Instant::now();
    // Built on one thread, a big batch's results cost more than the GPU search itself.
    let one = |list: Vec<Neighbor>| -> Result<Vec<GpuSearchResult>> {
        list.into_iter()
            .map(|n| {
                let (id, metadata, payload) = collection.entry(n.slot).ok_or_else(|| {
                    HiveGpuError::Internal(format!("backend returned removed slot {}", n.slot))
                })?;
                Ok(GpuSearchResult {
                    id: id.clone(),
                    score: score(config.metric, n.distance),
                    index: n.slot,
                    metadata: with_payload.then(|| Arc::clone(metadata)),
                    payload: with_payload.then(|| Arc::clone(payload)),
                })
            })
            .collect()
    };
    let results = if neighbours.len() * k >= PARALLEL_RESULTS {
        crate::exec::run(|| neighbours.into_par_iter().map(one).collect())?
    } else {
        neighbours.into_iter().map(one).collect()
    };
    if profiling() {
        eprintln!("hive-gpu profile (results, ms): {:.3}", began.elapsed().as_secs_f64() * 1e3);
    }
    results
}
