//! Exact (brute-force) search: validation, the backend's fused k-NN, and the one place where
//! canonical distances become the metric's public score.

use crate::backend::{Neighbor, PARALLEL_RESULTS, profiling};
use crate::collection::{Collection, Subject, check_values};
use crate::error::{HiveGpuError, Result};
use crate::results::SearchResults;
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

/// The exact `k` nearest neighbours of each query of a row-major batch, one list per query.
pub(crate) fn search(
    collection: &Collection,
    queries: &[f32],
    k: usize,
    options: &SearchOptions,
) -> Result<Vec<Vec<GpuSearchResult>>> {
    let with_payload = options.with_metadata;
    let pieces = search_pieces(collection, queries, k, options, |neighbours, k| {
        to_results(collection, neighbours, k, with_payload)
    })?;
    match pieces {
        Searched::Pieces(pieces) => Ok(pieces.into_iter().flatten().collect()),
        Searched::NothingPasses(nq) => Ok(vec![Vec::new(); nq]),
    }
}

/// [`search`] into flat arrays ([`SearchResults`]): no structure per neighbour.
pub(crate) fn search_results(
    collection: &Collection,
    queries: &[f32],
    k: usize,
    options: &SearchOptions,
) -> Result<SearchResults> {
    let with_payload = options.with_metadata;
    let pieces = search_pieces(collection, queries, k, options, |neighbours, k| {
        to_columns(collection, neighbours, k, with_payload)
    })?;
    match pieces {
        Searched::Pieces(pieces) => {
            let mut pieces = pieces.into_iter();
            let mut all = pieces.next().unwrap_or_else(|| SearchResults::with_capacity(0, 0, with_payload));
            for piece in pieces {
                all.append(piece);
            }
            Ok(all)
        }
        Searched::NothingPasses(nq) => {
            let mut none = SearchResults::with_capacity(nq, 0, with_payload);
            (0..nq).for_each(|_| none.end_row());
            Ok(none)
        }
    }
}

/// What [`search_pieces`] found: each piece's assembled results in query order, or that no
/// vector passes the filter (so each of the queries gets an empty list).
enum Searched<T> {
    Pieces(Vec<T>),
    NothingPasses(usize),
}

/// Validates a batch, resolves its filter, searches it piece by piece and turns each piece's
/// neighbours into results with `assemble(neighbours, k)`.
fn search_pieces<T: Send + Sync>(
    collection: &Collection,
    queries: &[f32],
    k: usize,
    options: &SearchOptions,
    assemble: impl Fn(Vec<Vec<Neighbor>>, usize) -> Result<T> + Sync,
) -> Result<Searched<T>> {
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
        return Ok(Searched::Pieces(Vec::new()));
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
        return Ok(Searched::NothingPasses(nq));
    }
    let k = k.min(searched);
    let pieces = Pieces::of(nq);
    if pieces.count == 1 {
        let neighbours = collection.rows().knn(queries, k, config.metric, allowed)?;
        return Ok(Searched::Pieces(vec![assemble(neighbours, k)?]));
    }
    // Pieces are searched by `WORKERS` threads in turn, and each piece's results are built on
    // other threads while its worker searches the next: the device is not left idle while
    // the host prepares queries or builds result structures.
    let done: Vec<OnceLock<Result<T>>> = (0..pieces.count).map(|_| OnceLock::new()).collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let assemble = &assemble;
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
                                    let _ = slot.set(assemble(neighbours, k));
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
    let mut results = Vec::with_capacity(pieces.count);
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
                assemble(collection.rows().knn(piece, k, config.metric, allowed)?, k)?
            }
            Some(Err(e)) => return Err(e),
        };
        results.push(found);
    }
    Ok(Searched::Pieces(results))
}

/// How a batch is cut for [`search_pieces`]: `count` pieces of at most `size` queries, searched by
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

/// One piece's neighbours as flat arrays. Rows are built in parallel chunks for a big piece and
/// joined (one copy of three flat arrays, cheaper than a list per query).
fn to_columns(
    collection: &Collection,
    neighbours: Vec<Vec<Neighbor>>,
    k: usize,
    with_payload: bool,
) -> Result<SearchResults> {
    let metric = collection.config().metric;
    let began = std::time::Instant::now();
    let build = |lists: &[Vec<Neighbor>]| -> Result<SearchResults> {
        let mut out = SearchResults::with_capacity(lists.len(), k, with_payload);
        for list in lists {
            for n in list {
                let (id, metadata, payload) = collection.entry(n.slot).ok_or_else(|| {
                    HiveGpuError::Internal(format!("backend returned removed slot {}", n.slot))
                })?;
                out.push(n.slot, id, score(metric, n.distance), with_payload.then_some((metadata, payload)));
            }
            out.end_row();
        }
        Ok(out)
    };
    let results = if neighbours.len() * k >= PARALLEL_RESULTS {
        let chunk = (PARALLEL_RESULTS / k.max(1)).max(1);
        let parts: Vec<SearchResults> =
            crate::exec::run(|| neighbours.par_chunks(chunk).map(build).collect::<Result<_>>())??;
        let mut parts = parts.into_iter();
        let mut all = parts.next().unwrap_or_default();
        for part in parts {
            all.append(part);
        }
        Ok(all)
    } else {
        build(&neighbours)
    };
    if profiling() {
        eprintln!("hive-gpu profile (columnar results, ms): {:.3}", began.elapsed().as_secs_f64() * 1e3);
    }
    results
}
