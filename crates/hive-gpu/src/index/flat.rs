//! Exact (brute-force) search: validation, the backend's fused k-NN, and the one place where
//! canonical distances become the metric's public score.

use crate::backend::{Neighbor, PARALLEL_RESULTS, profiling};
use crate::collection::{Collection, Subject, check_values};
use crate::error::{HiveGpuError, Result};
use crate::payload::Payload;
use crate::results::{RowsMut, SearchResults};
use crate::slots::SlotSet;
use crate::tuning::Tuning;
use crate::types::{GpuDistanceMetric, GpuSearchResult, Metadata, SearchOptions, SmolStr, StorageConfig};
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
    tuning: &Tuning,
) -> Result<Vec<Vec<GpuSearchResult>>> {
    let with_payload = options.with_metadata;
    let plan = Plan::of(collection, queries, k, options, tuning)?;
    if plan.k == 0 {
        return Ok(vec![Vec::new(); plan.nq]);
    }
    let pieces = search_pieces(collection, queries, &plan, |_, neighbours| {
        to_results(collection, neighbours, plan.k, with_payload)
    })?;
    Ok(pieces.into_iter().flatten().collect())
}

/// [`search`] into flat arrays ([`SearchResults`]): every piece writes its own rows of them in
/// place, in parallel, as it finishes; no structure per neighbour and no concatenation.
pub(crate) fn search_results(
    collection: &Collection,
    queries: &[f32],
    k: usize,
    options: &SearchOptions,
    tuning: &Tuning,
) -> Result<SearchResults> {
    let with_payload = options.with_metadata;
    let plan = Plan::of(collection, queries, k, options, tuning)?;
    let mut results = SearchResults::padded(plan.nq, plan.k, with_payload);
    if plan.k == 0 {
        return Ok(results);
    }
    let sizes: Vec<usize> = (0..plan.pieces.count).map(|i| plan.pieces.range(i, plan.nq).len()).collect();
    let rows: Vec<std::sync::Mutex<Option<RowsMut<'_>>>> =
        results.split_rows(&sizes).into_iter().map(|r| std::sync::Mutex::new(Some(r))).collect();
    search_pieces(collection, queries, &plan, |i, neighbours| {
        let taken = rows[i].lock().ok().and_then(|mut r| r.take());
        let piece = taken.ok_or_else(|| HiveGpuError::Internal(format!("piece {i} written twice")))?;
        to_columns(collection, neighbours, piece)
    })?;
    drop(rows);
    Ok(results)
}

/// The `k` nearest neighbours of each query of a row-major batch in this one collection, with
/// the number of entries its lists hold (k, or fewer when fewer vectors pass the filter; 0 with
/// empty lists when none does): for a caller that merges several collections' neighbours
/// (the shards of `crate::multi`).
pub(crate) fn neighbours(
    collection: &Collection,
    queries: &[f32],
    k: usize,
    options: &SearchOptions,
    tuning: &Tuning,
) -> Result<(usize, Vec<Vec<Neighbor>>)> {
    let plan = Plan::of(collection, queries, k, options, tuning)?;
    if plan.k == 0 {
        return Ok((0, vec![Vec::new(); plan.nq]));
    }
    let pieces = search_pieces(collection, queries, &plan, |_, neighbours| Ok(neighbours))?;
    Ok((plan.k, pieces.into_iter().flatten().collect()))
}

/// Checks a search's `k` and its row-major batch of queries against `config` (whole queries,
/// valid values) and returns how many queries there are: what every search of one collection or
/// of several (`crate::multi`) checks first.
pub(crate) fn check_queries(config: &StorageConfig, queries: &[f32], k: usize) -> Result<usize> {
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
        check_values(q, config, Subject::Query(i))?;
    }
    Ok(queries.len() / dim)
}

/// A validated batch: its queries, the k its lists hold (0 when no vector passes the filter),
/// the filter's live slots and how the batch is cut.
struct Plan<'f> {
    nq: usize,
    k: usize,
    /// Lists per query through the collection's index; None searches every row exactly.
    probe: Option<crate::index::ivf::Probe>,
    allowed: Option<std::borrow::Cow<'f, SlotSet>>,
    pieces: Pieces,
}

impl<'f> Plan<'f> {
    fn of(
        collection: &Collection,
        queries: &[f32],
        k: usize,
        options: &'f SearchOptions,
        tuning: &Tuning,
    ) -> Result<Self> {
        let nq = check_queries(collection.config(), queries, k)?;
        if nq == 0 {
            return Ok(Self { nq, k: 0, probe: None, allowed: None, pieces: Pieces::of(0, tuning) });
        }
        if collection.len() == 0 {
            return Err(HiveGpuError::EmptyCollection);
        }
        // A filter becomes the live slots that pass it, read by every kernel of the search.
        let allowed = options.filter.as_ref().map(|f| collection.allowed(f)).transpose()?;
        let searched = allowed.as_ref().map_or(collection.len(), |a| a.count());
        if options.nprobe == Some(0) || options.refine_factor == Some(0) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "nprobe and refine_factor must be at least 1 (nprobe {:?}, refine_factor {:?})",
                options.nprobe, options.refine_factor
            )));
        }
        let probe = match collection.index() {
            Some(_) if options.exact => None,
            Some(_) => Some(crate::index::ivf::Probe {
                nprobe: options.nprobe.unwrap_or(crate::types::DEFAULT_NPROBE),
                refine_factor: options.refine_factor,
            }),
            None => None,
        };
        let pieces = Pieces::of(nq, tuning);
        Ok(Self { nq, k: k.min(searched), probe, allowed, pieces })
    }
}

/// Searches a planned batch piece by piece and turns piece `i`'s neighbours into results with
/// `assemble(i, neighbours)`; the pieces' results come back in query order.
fn search_pieces<T: Send + Sync>(
    collection: &Collection,
    queries: &[f32],
    plan: &Plan<'_>,
    assemble: impl Fn(usize, Vec<Vec<Neighbor>>) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let config = *collection.config();
    let dim = config.dimension;
    let (nq, k, pieces) = (plan.nq, plan.k, &plan.pieces);
    let allowed = plan.allowed.as_deref();
    if pieces.count == 1 {
        let neighbours = collection.neighbours(queries, k, allowed, plan.probe)?;
        return Ok(vec![assemble(0, neighbours)?]);
    }
    // Pieces are searched by `pieces.workers` threads in turn, and each piece's results are built on
    // other threads while its worker searches the next: the device is not left idle while
    // the host prepares queries or builds result structures.
    //
    // The workers are threads of their own, not jobs of the library's pool: a worker blocks on
    // its device for a whole piece, and a pool thread that waits inside its own parallel work
    // (a piece's query preparation) runs whatever job it can steal meanwhile. Were the workers
    // pool jobs, a preparation could steal a queued piece and finish only after it: with two
    // devices searched at once, pieces waited 80 to 150 ms in "prepare+upload" for the other
    // device's pieces (HIVE_GPU_PROFILE on two H200s, docs/PERFORMANCE.md, multi-GPU section).
    // The pool keeps the short jobs: preparations and the results' assembly.
    let done: Vec<OnceLock<Result<T>>> = (0..pieces.count).map(|_| OnceLock::new()).collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let assemble = &assemble;
    // On the library's pool (`crate::exec`): the caller holds the collection's lock.
    crate::exec::run(|| {
        rayon::scope(|scope| {
            let work = || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= pieces.count || failed.load(Ordering::Relaxed) {
                    break;
                }
                let range = pieces.range(i, nq);
                let piece = &queries[range.start * dim..range.end * dim];
                match collection.neighbours(piece, k, allowed, plan.probe) {
                    Ok(neighbours) => {
                        let slot = &done[i];
                        scope.spawn(move |_| {
                            let _ = slot.set(assemble(i, neighbours));
                        });
                    }
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        let _ = done[i].set(Err(e));
                    }
                }
            };
            std::thread::scope(|threads| {
                let started = (0..pieces.workers)
                    .filter(|w| {
                        std::thread::Builder::new()
                            .name(format!("hive-gpu-piece-{w}"))
                            .spawn_scoped(threads, work)
                            .is_ok()
                    })
                    .count();
                // Where the OS refuses every thread, this one works through the pieces.
                if started == 0 {
                    work();
                }
            });
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
                assemble(i, collection.neighbours(piece, k, allowed, plan.probe)?)?
            }
            Some(Err(e)) => return Err(e),
        };
        results.push(found);
    }
    Ok(results)
}

/// How a batch is cut for [`search_pieces`]: `count` pieces of at most `size` queries, searched by
/// `workers` threads.
struct Pieces {
    count: usize,
    size: usize,
    workers: usize,
}

impl Pieces {
    /// Pieces of about `tuning.piece_queries` for `tuning.piece_workers` threads (one piece
    /// below two pieces' worth, or with one worker).
    ///
    /// IVF batches too: on the H100 (docs/PERFORMANCE.md, IVF pieces) 10,000 queries at nprobe 4
    /// ran within the noise of one another as 5 pieces on 4 workers, 8 on 4, 4 on 4, 3 on 3
    /// and 5 on 5, and slower whole or in 2 pieces on 2 workers.
    fn of(nq: usize, tuning: &Tuning) -> Self {
        let size = tuning.piece_queries.max(1);
        let workers = tuning.piece_workers.max(1);
        if nq < 2 * size || workers == 1 {
            return Self { count: 1, size: nq, workers: 1 };
        }
        let count = nq.div_ceil(size);
        let size = nq.div_ceil(count);
        // Whole pieces of `size` (the last one shorter): none is left empty.
        Self { count: nq.div_ceil(size), size, workers }
    }

    fn range(&self, i: usize, nq: usize) -> std::ops::Range<usize> {
        i * self.size..((i + 1) * self.size).min(nq)
    }
}

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

/// One neighbour as a result row shows it.
pub(crate) struct Resolved<'a> {
    /// What the row reports as the neighbour's slot.
    pub(crate) slot: usize,
    pub(crate) id: &'a SmolStr,
    pub(crate) metadata: &'a Arc<Metadata>,
    pub(crate) payload: &'a Arc<Payload>,
    /// The canonical distance, turned into the metric's score here.
    pub(crate) distance: f64,
}

/// One row of [`SearchResults`] being written.
struct RowMut<'a> {
    len: &'a mut usize,
    slots: &'a mut [usize],
    ids: &'a mut [SmolStr],
    scores: &'a mut [f32],
    metadata: Option<&'a mut [Arc<Metadata>]>,
    payloads: Option<&'a mut [Arc<Payload>]>,
}

/// Writes one piece's neighbours into its rows of the flat arrays, rows in parallel for a big
/// piece.
fn to_columns(collection: &Collection, neighbours: Vec<Vec<Neighbor>>, rows: RowsMut<'_>) -> Result<()> {
    let began = std::time::Instant::now();
    fill_columns(collection.config().metric, &neighbours, rows, |n: &Neighbor| {
        let (id, metadata, payload) = collection
            .entry(n.slot)
            .ok_or_else(|| HiveGpuError::Internal(format!("backend returned removed slot {}", n.slot)))?;
        Ok(Resolved { slot: n.slot, id, metadata, payload, distance: n.distance })
    })?;
    if profiling() {
        eprintln!("hive-gpu profile (columnar results, ms): {:.3}", began.elapsed().as_secs_f64() * 1e3);
    }
    Ok(())
}

/// Writes `lists[q]` into row `q` of `rows`, each neighbour shown as `resolve` says; rows in
/// parallel (on the library's pool) when there are many entries.
pub(crate) fn fill_columns<'c, N: Sync>(
    metric: GpuDistanceMetric,
    lists: &[Vec<N>],
    rows: RowsMut<'_>,
    resolve: impl Fn(&N) -> Result<Resolved<'c>> + Sync,
) -> Result<()> {
    let RowsMut { k, lens, slots, ids, scores, metadata, payloads } = rows;
    if lists.len() != lens.len() {
        return Err(HiveGpuError::Internal(format!(
            "a piece of {} rows returned {} lists",
            lens.len(),
            lists.len()
        )));
    }
    let write = |(q, list): (usize, &Vec<N>), row: RowMut<'_>| -> Result<()> {
        let RowMut { len, slots, ids, scores, mut metadata, mut payloads } = row;
        if list.len() > k {
            return Err(HiveGpuError::Internal(format!("query {q}: {} neighbours for k = {k}", list.len())));
        }
        for (j, n) in list.iter().enumerate() {
            let found = resolve(n)?;
            slots[j] = found.slot;
            ids[j] = found.id.clone();
            scores[j] = score(metric, found.distance);
            if let Some(metadata) = metadata.as_deref_mut() {
                metadata[j] = Arc::clone(found.metadata);
            }
            if let Some(payloads) = payloads.as_deref_mut() {
                payloads[j] = Arc::clone(found.payload);
            }
        }
        *len = list.len();
        Ok(())
    };
    let rows = lens.len();
    if rows * k >= PARALLEL_RESULTS {
        let metadata_rows: Vec<Option<&mut [Arc<Metadata>]>> = match metadata {
            Some(m) => m.chunks_mut(k).map(Some).collect(),
            None => (0..rows).map(|_| None).collect(),
        };
        let payload_rows: Vec<Option<&mut [Arc<Payload>]>> = match payloads {
            Some(p) => p.chunks_mut(k).map(Some).collect(),
            None => (0..rows).map(|_| None).collect(),
        };
        crate::exec::run(|| {
            lists
                .par_iter()
                .enumerate()
                .zip(
                    lens.par_iter_mut()
                        .zip(slots.par_chunks_mut(k))
                        .zip(ids.par_chunks_mut(k))
                        .zip(scores.par_chunks_mut(k))
                        .zip(metadata_rows.into_par_iter())
                        .zip(payload_rows.into_par_iter()),
                )
                .try_for_each(|(list, (((((len, slots), ids), scores), metadata), payloads))| {
                    write(list, RowMut { len, slots, ids, scores, metadata, payloads })
                })
        })??;
    } else {
        let mut metadata = metadata.map(|m| m.chunks_mut(k));
        let mut payloads = payloads.map(|p| p.chunks_mut(k));
        for ((((q, list), len), (s, i)), c) in lists
            .iter()
            .enumerate()
            .zip(lens.iter_mut())
            .zip(slots.chunks_mut(k).zip(ids.chunks_mut(k)))
            .zip(scores.chunks_mut(k))
        {
            let m = metadata.as_mut().and_then(Iterator::next);
            let p = payloads.as_mut().and_then(Iterator::next);
            write((q, list), RowMut { len, slots: s, ids: i, scores: c, metadata: m, payloads: p })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuning(piece_queries: usize, piece_workers: usize) -> Tuning {
        Tuning { piece_queries, piece_workers, ..Tuning::default() }
    }

    #[test]
    fn pieces_cover_every_query_once_and_none_is_empty() {
        for nq in [0, 1, 9, 10, 11, 100, 4095, 4096, 4097, 10_000, 65_537] {
            for (size, workers) in [(1, 4), (3, 4), (2048, 4), (2048, 1), (1000, 8), (5000, 3)] {
                let pieces = Pieces::of(nq, &tuning(size, workers));
                let mut next = 0;
                for i in 0..pieces.count {
                    let range = pieces.range(i, nq);
                    assert_eq!(range.start, next, "nq {nq} size {size} workers {workers} piece {i}");
                    assert!(!range.is_empty() || nq == 0, "nq {nq} size {size}: piece {i} is empty");
                    next = range.end;
                }
                assert_eq!(next, nq, "nq {nq} size {size} workers {workers}: queries left out");
            }
        }
    }

    #[test]
    fn the_piece_knobs_decide_the_cut_and_a_batch_under_two_pieces_stays_whole() {
        let defaults = Tuning::default();
        let cut = Pieces::of(10_000, &defaults);
        assert_eq!((cut.count, cut.size, cut.workers), (5, 2000, 4));
        assert_eq!(Pieces::of(4095, &defaults).count, 1);
        let five = Pieces::of(10_000, &tuning(2500, 5));
        assert_eq!((five.count, five.size, five.workers), (4, 2500, 5));
        assert_eq!(Pieces::of(10_000, &tuning(2048, 1)).count, 1);
    }
}
