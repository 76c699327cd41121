//! Exact (brute-force) search: validation, the backend's fused k-NN, and the one place where
//! canonical distances become the metric's public score.

use crate::backend::{MergeBuffer, Neighbor, profiling};
use crate::collection::{Collection, Subject, check_values};
use crate::error::{HiveGpuError, Result};
use crate::exec::Pieces;
use crate::index::spec::IndexSpec;
use crate::payload::Payload;
use crate::results::{RowsMut, SearchResults};
use crate::slots::SlotSet;
use crate::tuning::Tuning;
use crate::types::{GpuDistanceMetric, GpuSearchResult, Metadata, SearchOptions, SmolStr, StorageConfig};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The public score of a canonical distance (see [`GpuSearchResult`] for the meanings).
pub(crate) fn score(metric: GpuDistanceMetric, distance: f64) -> f32 {
    match metric {
        GpuDistanceMetric::Euclidean => distance.max(0.0).sqrt() as f32,
        GpuDistanceMetric::DotProduct => (-distance) as f32,
        GpuDistanceMetric::Cosine => (-distance).clamp(-1.0, 1.0) as f32,
        GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => distance as f32,
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
    let batch = check_queries(collection.config(), queries, k)?;
    let plan = Plan::of(collection, batch, k, options, tuning)?;
    let _one_off = OneOffFilter::of(&plan, &[collection]);
    if plan.k == 0 {
        return Ok(vec![Vec::new(); plan.nq]);
    }
    let pieces = search_pieces(&[collection], queries, &plan, |_, _, neighbours| {
        to_results(collection, neighbours, plan.k, with_payload, tuning.parallel_results)
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
    let mut results = SearchResults::default();
    search_results_into(collection, queries, k, options, tuning, &mut results)?;
    Ok(results)
}

/// [`search_results`] into `out`, whose arrays are reused where they hold enough room (see
/// [`SearchResults::reuse_for`]).
pub(crate) fn search_results_into(
    collection: &Collection,
    queries: &[f32],
    k: usize,
    options: &SearchOptions,
    tuning: &Tuning,
    out: &mut SearchResults,
) -> Result<()> {
    search_results_across(
        &[collection],
        check_queries(collection.config(), queries, k)?,
        k,
        options,
        tuning,
        out,
    )
}

/// [`search_results`] over several collections that hold the same vectors in the same slots
/// (the replicas of `crate::multi`): the batch is cut into pieces ([`Pieces::across`]), and each
/// member's workers take the next piece left, so a member that runs faster (or has less else
/// to do) answers more of them. The results are the same whichever member answers a
/// piece. A batch of one piece runs on `members[0]`. The results go to `out`, reusing its
/// arrays where they hold enough room; after an error `out` holds no meaningful rows.
pub(crate) fn search_results_across(
    members: &[&Collection],
    batch: Checked<'_>,
    k: usize,
    options: &SearchOptions,
    tuning: &Tuning,
    out: &mut SearchResults,
) -> Result<()> {
    let first =
        members.first().ok_or_else(|| HiveGpuError::Internal("a search over no collection".into()))?;
    let with_payload = options.with_metadata;
    let queries = batch.queries;
    let mut plan = Plan::of(first, batch, k, options, tuning)?;
    plan.pieces = if members.iter().any(|m| m.rows().streamed()) {
        Pieces::whole(plan.nq, members.len())
    } else if members.len() == 1 {
        // One collection: the pieces `Plan::of` chose for it (finer over few rows).
        plan.pieces
    } else {
        Pieces::across(plan.nq, tuning, members.len())
    };
    if plan.pieces.count > 1 {
        plan.others_allowed = members[1..]
            .iter()
            .map(|m| options.filter.as_ref().map(|f| m.allowed(f)).transpose())
            .collect::<Result<_>>()?;
    }
    let _one_off = OneOffFilter::of(&plan, members);
    let began = profiling().then(std::time::Instant::now);
    out.reuse_for(plan.nq, plan.k, with_payload);
    let results = out;
    if let Some(began) = began {
        // Results' work before any search: the arrays, padded or reused (Timeline reports the
        // rest).
        eprintln!(
            "hive-gpu profile (columnar arrays of {} x {}, ms): {:.3}",
            plan.nq,
            plan.k,
            began.elapsed().as_secs_f64() * 1e3
        );
    }
    if plan.k == 0 {
        return Ok(());
    }
    let sizes: Vec<usize> = (0..plan.pieces.count).map(|i| plan.pieces.range(i, plan.nq).len()).collect();
    let rows: Vec<std::sync::Mutex<Option<RowsMut<'_>>>> =
        results.split_rows(&sizes).into_iter().map(|r| std::sync::Mutex::new(Some(r))).collect();
    search_pieces(members, queries, &plan, |i, member, neighbours| {
        let taken = rows[i].lock().ok().and_then(|mut r| r.take());
        let piece = taken.ok_or_else(|| HiveGpuError::Internal(format!("piece {i} written twice")))?;
        to_columns(member, neighbours, piece, tuning.parallel_results)
    })?;
    drop(rows);
    Ok(())
}

/// The `k` nearest neighbours of each query of a row-major batch in this one collection, with
/// the number of entries its lists hold (k, or fewer when fewer vectors pass the filter; 0 with
/// empty lists when none does): for a caller that merges several collections' neighbours
/// (the shards of `crate::multi`).
pub(crate) fn neighbours(
    collection: &Collection,
    batch: Checked<'_>,
    k: usize,
    options: &SearchOptions,
    tuning: &Tuning,
) -> Result<(usize, Vec<Vec<Neighbor>>)> {
    let queries = batch.queries;
    let plan = Plan::of(collection, batch, k, options, tuning)?;
    let _one_off = OneOffFilter::of(&plan, &[collection]);
    if plan.k == 0 {
        return Ok((0, vec![Vec::new(); plan.nq]));
    }
    let pieces = search_pieces(&[collection], queries, &plan, |_, _, neighbours| Ok(neighbours))?;
    Ok((plan.k, pieces.into_iter().flatten().collect()))
}

/// [`neighbours`], each query's list written into list `list` of a device merge buffer
/// (`crate::backend::merge`) instead of returned, after recording its width there (the `k`
/// this collection can give, 0 where no row passes). Only for an exact search: a search
/// through the collection's index is refused.
pub(crate) fn neighbours_into(
    collection: &Collection,
    batch: Checked<'_>,
    k: usize,
    options: &SearchOptions,
    tuning: &Tuning,
    buffer: &dyn MergeBuffer,
    list: usize,
) -> Result<()> {
    let mut plan = Plan::of(collection, batch, k, options, tuning)?;
    let _one_off = OneOffFilter::of(&plan, &[collection]);
    if plan.probe.is_some() {
        return Err(HiveGpuError::Internal("an index search cannot write into a merge buffer".into()));
    }
    buffer.set_width(list, plan.k)?;
    if plan.k == 0 {
        return Ok(());
    }
    plan.into = Some((buffer, list));
    search_pieces(&[collection], batch.queries, &plan, |_, _, _| Ok(())).map(drop)
}

/// A row-major batch of queries that passed [`check_queries`] against a collection's (or a
/// multi-device storage's) configuration, and how many queries it holds: the members of a
/// sharded or replicated storage search it without checking every value again.
#[derive(Clone, Copy)]
pub(crate) struct Checked<'q> {
    pub(crate) queries: &'q [f32],
    pub(crate) nq: usize,
}

/// Query bytes (f32) an IVF-Flat piece holds at most where its batch is kept in few pieces
/// (`Pieces::over_lists`): 65,536 queries of 1,024 components, 131,072 of 512.
const WHOLE_LIST_PIECE_BYTES: usize = 256 << 20;

/// Values from which a batch's check runs on the library's pool: below it, handing the check
/// over costs more than it saves (about 2 ms for 10,000 x 128 serially, a chain of f64 adds per
/// query; `hive-gpu bench-multi`, docs/PERFORMANCE.md, multi-GPU section).
const PARALLEL_CHECK_VALUES: usize = 1 << 16;

/// Checks a search's `k` and its row-major batch of queries against `config` (whole queries,
/// valid values): what every search of one collection or of several (`crate::multi`) checks
/// first. An invalid batch is refused by its first invalid query.
pub(crate) fn check_queries<'q>(config: &StorageConfig, queries: &'q [f32], k: usize) -> Result<Checked<'q>> {
    let dim = config.dimension;
    if k == 0 {
        return Err(HiveGpuError::InvalidArgument("k must be at least 1".into()));
    }
    if dim == 0 || !queries.len().is_multiple_of(dim) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "a batch of {} values is not a whole number of {dim}-dimensional queries",
            queries.len()
        )));
    }
    let valid = |q: &[f32]| check_values(q, config, Subject::Query(0)).is_ok();
    let first_invalid = if queries.len() >= PARALLEL_CHECK_VALUES && queries.len() > dim {
        crate::exec::run(|| queries.par_chunks_exact(dim).position_first(|q| !valid(q)))?
    } else {
        queries.chunks_exact(dim).position(|q| !valid(q))
    };
    if let Some(i) = first_invalid {
        check_values(&queries[i * dim..(i + 1) * dim], config, Subject::Query(i))?;
    }
    Ok(Checked { queries, nq: queries.len() / dim })
}

/// A validated batch: its queries, the k its lists hold (0 when no vector passes the filter),
/// the filter's live slots and how the batch is cut.
/// The members of a search whose filter was evaluated for it alone (not a prepared filter
/// still current): when the search ends, what their backends derived from it is freed
/// (`RowStore::release_filter_copies`), as no later search can name that filter again.
struct OneOffFilter<'a>(Vec<(&'a Collection, u64)>);

impl<'a> OneOffFilter<'a> {
    /// For `members[i]` searched with `plan`'s set of member i (the first's `allowed`, the
    /// others' `others_allowed`): the stamps of the sets made for this search alone.
    fn of(plan: &Plan<'_>, members: &[&'a Collection]) -> Self {
        let sets = std::iter::once(&plan.allowed).chain(&plan.others_allowed);
        Self(
            members
                .iter()
                .zip(sets)
                .filter_map(|(&member, set)| match set {
                    Some(std::borrow::Cow::Owned(set)) => Some((member, set.stamp())),
                    _ => None,
                })
                .collect(),
        )
    }
}

impl Drop for OneOffFilter<'_> {
    fn drop(&mut self) {
        for (member, filter) in &self.0 {
            member.rows().release_filter_copies(*filter);
        }
    }
}

struct Plan<'f> {
    nq: usize,
    k: usize,
    /// Lists per query through the collection's index; None searches every row exactly.
    probe: Option<crate::index::ivf::Probe>,
    allowed: Option<std::borrow::Cow<'f, SlotSet>>,
    /// The filter's live slots in each further member of a search over several (replicas hold
    /// the same vectors, but a compaction that failed on one of them leaves its slots apart).
    others_allowed: Vec<Option<std::borrow::Cow<'f, SlotSet>>>,
    pieces: Pieces,
    /// Where the pieces' lists go instead of coming back: list `.1` of a device merge buffer
    /// (a sharded search's shard, `crate::backend::merge`).
    into: Option<(&'f dyn MergeBuffer, usize)>,
}

impl<'f> Plan<'f> {
    fn of(
        collection: &Collection,
        batch: Checked<'_>,
        k: usize,
        options: &'f SearchOptions,
        tuning: &Tuning,
    ) -> Result<Self> {
        let nq = batch.nq;
        if nq == 0 {
            return Ok(Self {
                nq,
                k: 0,
                probe: None,
                allowed: None,
                others_allowed: Vec::new(),
                pieces: Pieces::of(0, tuning),
                into: None,
            });
        }
        if collection.len() == 0 {
            return Err(HiveGpuError::EmptyCollection);
        }
        // A filter becomes the live slots that pass it, read by every kernel of the search.
        let began = std::time::Instant::now();
        let allowed = options.filter.as_ref().map(|f| collection.allowed(f)).transpose()?;
        let searched = allowed.as_ref().map_or(collection.len(), |a| a.count());
        if profiling() && allowed.is_some() {
            eprintln!(
                "hive-gpu profile (filter to {searched} slots, ms): {:.3}",
                began.elapsed().as_secs_f64() * 1e3
            );
        }
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
        let pieces = if collection.rows().streamed() {
            Pieces::whole(nq, 1)
        } else if collection.rows().finer_pieces_when_few_rows()
            && searched <= tuning.small_search_rows
            && k <= tuning.small_search_max_k
        {
            Pieces::of_few_rows(nq, tuning)
        } else {
            let pieces = Pieces::of(nq, tuning);
            match (collection.index(), &probe) {
                // Only IVF-Flat's scan reads a list once per piece; the coded scans take a
                // block per query.
                (Some(index), Some(p)) if matches!(index.spec(), IndexSpec::IvfFlat { .. }) => {
                    let most = (WHOLE_LIST_PIECE_BYTES / (collection.config().dimension.max(1) * 4)).max(1);
                    pieces.over_lists(nq, p.nprobe, index.nlist(), most)
                }
                _ => pieces,
            }
        };
        Ok(Self { nq, k: k.min(searched), probe, allowed, others_allowed: Vec::new(), pieces, into: None })
    }

    /// The filter's live slots in member `m` of the search.
    fn allowed_in(&self, m: usize) -> Option<&SlotSet> {
        match m {
            0 => self.allowed.as_deref(),
            _ => self.others_allowed.get(m - 1).and_then(|a| a.as_deref()),
        }
    }

    /// Searches the queries `range` of the batch (`piece`) on member `m`: its neighbours, or
    /// none where they go into the plan's merge buffer.
    fn search_piece(
        &self,
        m: usize,
        member: &Collection,
        range: std::ops::Range<usize>,
        piece: &[f32],
    ) -> Result<Vec<Vec<Neighbor>>> {
        match self.into {
            Some((buffer, list)) => {
                let metric = member.config().metric;
                member.rows().knn_into(
                    piece,
                    self.k,
                    metric,
                    self.allowed_in(m),
                    buffer,
                    list,
                    range.start,
                )?;
                Ok(Vec::new())
            }
            None => member.neighbours(piece, self.k, self.allowed_in(m), self.probe),
        }
    }
}

/// Searches a planned batch piece by piece on `members` (collections holding the same vectors
/// in the same slots; one for a plain search) and turns piece `i`'s neighbours, found by
/// `member`, into results with `assemble(i, member, neighbours)`; the pieces' results come back
/// in query order.
fn search_pieces<T: Send + Sync>(
    members: &[&Collection],
    queries: &[f32],
    plan: &Plan<'_>,
    assemble: impl Fn(usize, &Collection, Vec<Vec<Neighbor>>) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let first =
        *members.first().ok_or_else(|| HiveGpuError::Internal("a search over no collection".into()))?;
    let dim = first.config().dimension;
    let (nq, pieces) = (plan.nq, &plan.pieces);
    let timeline = Timeline::new();
    if pieces.count == 1 {
        let neighbours = plan.search_piece(0, first, 0..nq, queries)?;
        timeline.searched();
        let began = timeline.began();
        let built = assemble(0, first, neighbours)?;
        timeline.assembled(began);
        timeline.report(nq, 1, 1);
        return Ok(vec![built]);
    }
    // Pieces are searched by `pieces.workers` threads per member, each taking the next piece
    // left, and each piece's results are built on other threads while its worker searches the
    // next: the device is not left idle while the host prepares queries or builds result
    // structures.
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
    let timeline = &timeline;
    let workers = AtomicUsize::new(0);
    let assemble = |i: usize, member: &Collection, neighbours: Vec<Vec<Neighbor>>| {
        let began = timeline.began();
        let built = assemble(i, member, neighbours);
        timeline.assembled(began);
        built
    };
    let assemble = &assemble;
    // The pieces' results are built on the library's pool (`crate::exec`: the caller holds the
    // collections' locks), while this thread only waits for the workers, off the pool.
    crate::exec::run_off_pool(|scope| {
        let work = |m: usize| loop {
            let member = members[m];
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= pieces.count || failed.load(Ordering::Relaxed) {
                break;
            }
            let range = pieces.range(i, nq);
            let piece = &queries[range.start * dim..range.end * dim];
            let searched = if pieces.prepare_here {
                crate::exec::as_piece_worker(|| plan.search_piece(m, member, range, piece))
            } else {
                plan.search_piece(m, member, range, piece)
            };
            match searched {
                Ok(neighbours) => {
                    timeline.searched();
                    let slot = &done[i];
                    scope.spawn(move |_| {
                        let _ = slot.set(assemble(i, member, neighbours));
                    });
                }
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    let _ = done[i].set(Err(e));
                }
            }
        };
        let work = &work;
        std::thread::scope(|threads| {
            // Started member by member in turn, so that the first pieces taken alternate.
            let started = (0..pieces.workers)
                .flat_map(|w| (0..members.len()).map(move |m| (w, m)))
                .filter(|&(w, m)| {
                    std::thread::Builder::new()
                        .name(format!("hive-gpu-piece-{m}-{w}"))
                        .spawn_scoped(threads, move || work(m))
                        .is_ok()
                })
                .count();
            // Where the OS refuses every thread, this one works through the pieces.
            if started == 0 {
                work(0);
            }
            workers.store(started.max(1), Ordering::Relaxed);
        });
    })?;
    let mut results = Vec::with_capacity(pieces.count);
    for (i, piece) in done.into_iter().enumerate() {
        let found = match piece.into_inner() {
            Some(Ok(found)) => found,
            // Pieces side by side need more device memory than one alone: a piece that ran
            // out of it, and those skipped after it, run again on their own.
            Some(Err(HiveGpuError::VramLimitExceeded { .. })) | None => {
                // The other pieces' idle workspaces would keep their memory: free them first.
                first.rows().release_scratch();
                let range = pieces.range(i, nq);
                let piece = &queries[range.start * dim..range.end * dim];
                let neighbours = plan.search_piece(0, first, range, piece)?;
                timeline.searched();
                assemble(i, first, neighbours)?
            }
            Some(Err(e)) => return Err(e),
        };
        results.push(found);
    }
    timeline.report(nq, pieces.count, workers.load(Ordering::Relaxed));
    Ok(results)
}

/// Where a batch's wall time went between searching its pieces and building their results,
/// under `HIVE_GPU_PROFILE` (a no-op otherwise): the building overlaps the next pieces' searches,
/// so its summed time overstates what it costs the batch; what it adds to the wall time is the
/// part after the last piece's search returned.
struct Timeline {
    /// When the batch began; `None` (nothing timed, no clock read) without the profile.
    start: Option<std::time::Instant>,
    /// Nanoseconds from `start` to the end of the last search of a piece.
    searched: AtomicU64,
    /// Nanoseconds of building results, summed over the pieces.
    building: AtomicU64,
}

impl Timeline {
    fn new() -> Self {
        Self {
            start: profiling().then(std::time::Instant::now),
            searched: AtomicU64::new(0),
            building: AtomicU64::new(0),
        }
    }

    /// Nanoseconds since `start` (0 without the profile).
    fn began(&self) -> u64 {
        self.start.map_or(0, |start| u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    fn searched(&self) {
        if self.start.is_some() {
            self.searched.fetch_max(self.began(), Ordering::Relaxed);
        }
    }

    fn assembled(&self, began: u64) {
        if self.start.is_some() {
            self.building.fetch_add(self.began().saturating_sub(began), Ordering::Relaxed);
        }
    }

    fn report(&self, nq: usize, pieces: usize, workers: usize) {
        if self.start.is_some() {
            let ms = |ns: u64| ns as f64 / 1e6;
            let (wall, searched) = (self.began(), self.searched.load(Ordering::Relaxed));
            eprintln!(
                "hive-gpu profile (batch of {nq} in {pieces} pieces on {workers} workers, ms): wall {:.3}, \
                 searches done {:.3}, results after them {:.3} ({:.1}% of the wall), results built {:.3} summed",
                ms(wall),
                ms(searched),
                ms(wall.saturating_sub(searched)),
                100.0 * wall.saturating_sub(searched) as f64 / wall.max(1) as f64,
                ms(self.building.load(Ordering::Relaxed)),
            );
        }
    }
}

/// The public results of one piece's neighbours, built on the library's pool from
/// `parallel_from` entries (`Tuning::parallel_results`).
fn to_results(
    collection: &Collection,
    neighbours: Vec<Vec<Neighbor>>,
    k: usize,
    with_payload: bool,
    parallel_from: usize,
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
    let results = if neighbours.len() * k >= parallel_from {
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
fn to_columns(
    collection: &Collection,
    neighbours: Vec<Vec<Neighbor>>,
    rows: RowsMut<'_>,
    parallel_from: usize,
) -> Result<()> {
    let began = std::time::Instant::now();
    fill_columns(collection.config().metric, &neighbours, rows, parallel_from, |n: &Neighbor| {
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
/// parallel (on the library's pool) from `parallel_from` entries.
pub(crate) fn fill_columns<'c, N: Sync>(
    metric: GpuDistanceMetric,
    lists: &[Vec<N>],
    rows: RowsMut<'_>,
    parallel_from: usize,
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
    // Every entry of a row is written, the padding past its neighbours too: arrays reused from
    // an earlier batch (`search_results_into`) hold that batch's entries until then.
    let (empty_metadata, empty_payload) = (Arc::<Metadata>::default(), Arc::<Payload>::default());
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
        for j in list.len()..k {
            slots[j] = usize::MAX;
            ids[j] = SmolStr::default();
            scores[j] = f32::NAN;
            if let Some(metadata) = metadata.as_deref_mut() {
                metadata[j] = Arc::clone(&empty_metadata);
            }
            if let Some(payloads) = payloads.as_deref_mut() {
                payloads[j] = Arc::clone(&empty_payload);
            }
        }
        *len = list.len();
        Ok(())
    };
    let rows = lens.len();
    if rows * k >= parallel_from {
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
        for nq in [0, 1, 2, 3, 9, 10, 11, 100, 4095, 4096, 4097, 10_000, 65_537] {
            for (size, workers) in [(1, 4), (3, 4), (2048, 4), (2048, 1), (1000, 8), (5000, 3)] {
                for members in 1..=3 {
                    let pieces = Pieces::across(nq, &tuning(size, workers), members);
                    let at = format!("nq {nq} size {size} workers {workers} members {members}");
                    assert!(pieces.workers >= 1 && pieces.workers <= workers.max(1), "{at}");
                    if members > 1 && nq >= members {
                        // Every member has pieces to take, as many as every other's.
                        assert!(
                            pieces.count.is_multiple_of(members) || pieces.count == nq,
                            "{at}: {} pieces",
                            pieces.count
                        );
                        assert!(pieces.workers * members <= pieces.count, "{at}: more workers than pieces");
                    }
                    assert_covered(&pieces, nq, &at);
                }
                let pieces = Pieces::of(nq, &tuning(size, workers));
                assert_covered(&pieces, nq, &format!("nq {nq} size {size} workers {workers}"));
            }
            for members in 1..=3 {
                // A streamed collection's batch: one piece per member, never two on one member.
                let pieces = Pieces::whole(nq, members);
                assert_eq!((pieces.count, pieces.workers), (members.min(nq).max(1), 1), "nq {nq}");
                assert_covered(&pieces, nq, &format!("nq {nq} whole over {members}"));
            }
        }
    }

    fn assert_covered(pieces: &Pieces, nq: usize, at: &str) {
        let mut next = 0;
        for i in 0..pieces.count {
            let range = pieces.range(i, nq);
            assert_eq!(range.start, next, "{at} piece {i}");
            assert!(!range.is_empty() || nq == 0, "{at}: piece {i} is empty");
            next = range.end;
        }
        assert_eq!(next, nq, "{at}: queries left out");
    }

    #[test]
    fn the_piece_knobs_decide_the_cut_and_a_batch_under_two_pieces_stays_whole() {
        let defaults = Tuning::default();
        let cut = Pieces::of(10_000, &defaults);
        assert_eq!((cut.count, cut.range(0, 10_000).len(), cut.workers), (5, 2000, 4));
        assert_eq!(Pieces::of(4095, &defaults).count, 1);
        let five = Pieces::of(10_000, &tuning(2500, 5));
        assert_eq!((five.count, five.range(3, 10_000).len(), five.workers), (4, 2500, 5));
        assert_eq!(Pieces::of(10_000, &tuning(2048, 1)).count, 1);
        // Two replicas: the five pieces of one device become two rounds of two per replica.
        let two = Pieces::across(10_000, &defaults, 2);
        assert_eq!((two.count, two.workers), (8, 2));
        assert!(!cut.prepare_here && !two.prepare_here);
    }

    #[test]
    fn an_ivf_batch_stays_whole_where_its_pieces_would_probe_fewer_pairs_than_lists() {
        let cut = Pieces::of(10_000, &Tuning::default());
        // 2,000 queries a piece at nprobe 1 over 4,096 lists: most lists read for one query.
        let whole = cut.over_lists(10_000, 1, 4096, 65_536);
        assert_eq!((whole.count, whole.workers), (1, 1));
        assert_covered(&whole, 10_000, "whole");
        // A batch larger than `most` queries goes in pieces of at most `most`, never more
        // workers than pieces.
        let bounded = cut.over_lists(10_000, 1, 4096, 3000);
        assert_eq!((bounded.count, bounded.workers), (4, 4));
        assert!((0..4).all(|i| bounded.range(i, 10_000).len() <= 3000));
        assert_eq!(cut.over_lists(10_000, 1, 4096, 6000).workers, 2);
        assert_eq!(cut.over_lists(10_000, 1, 4096, 0).count, 10_000);
        // 2,000 x 4 pairs over 1,024 lists, 2,000 x 3 over 4,096, 2,000 x 1 over 2,000: cut.
        for (nprobe, nlist) in [(4, 1024), (3, 4096), (1, 2000), (1, 1), (1, 0)] {
            let kept = cut.over_lists(10_000, nprobe, nlist, 65_536);
            assert_eq!((kept.count, kept.workers), (5, 4), "nprobe {nprobe} nlist {nlist}");
        }
        // nprobe above nlist counts as nlist; a batch already whole stays so.
        assert_eq!(cut.over_lists(10_000, usize::MAX, 4096, 65_536).count, 5);
        assert_eq!(Pieces::of(100, &Tuning::default()).over_lists(100, 1, 4096, 65_536).count, 1);
    }

    #[test]
    fn a_batch_over_few_rows_is_cut_finer_and_its_workers_prepare_their_own_queries() {
        let defaults = Tuning::default();
        let few = Pieces::of_few_rows(10_000, &defaults);
        assert_eq!((few.count, few.workers, few.prepare_here), (10, 8, true));
        assert_covered(&few, 10_000, "few rows");
        // Under two small pieces' worth the batch stays whole, and its one thread prepares on
        // the pool as any batch does.
        let whole = Pieces::of_few_rows(2047, &defaults);
        assert_eq!((whole.count, whole.workers, whole.prepare_here), (1, 1, false));
    }
}
