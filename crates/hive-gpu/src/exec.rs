//! The library's own worker threads, and the one rule that keeps callers' thread pools from
//! deadlocking on a collection's lock.
//!
//! A collection's methods hold its lock while they run parallel work (validating a batch,
//! scanning rows, building results). A rayon thread that waits for parallel work does not sleep:
//! it runs other queued jobs of its pool meanwhile. Were that parallel work on the caller's
//! pool, a waiting thread could pick up another of the caller's jobs (say an `add_vectors` on
//! the same collection) and block on the lock that it itself holds further down its stack, for
//! good. So:
//!
//! - every parallel section under a collection's lock runs on this module's pool, which runs
//!   nothing but hive-gpu's own jobs, and none of those takes a collection's lock (the caller's
//!   thread takes it before entering, and releases it after). Writes enter the pool as a whole;
//!   searches where their parallel work arises (a CPU search, a big batch's preparation, its
//!   results), so a single GPU query, which has none, keeps the caller's thread and pays no
//!   hand-over (about 15 us on the H100 machine, 7% of that query: docs/PERFORMANCE.md), and
//!   so do a small unfiltered CPU search and a small scan of packed IVF lists of few queries,
//!   written without a parallel section for that (`Tuning::cpu_here_products`; one of 32
//!   queries or more enters the pool in parts). No
//!   code under a collection's lock calls rayon except inside [`run`] or a scope of
//!   [`run_off_pool`];
//! - no pool thread blocks on work that needs other pool threads to finish: a section that
//!   waits for long on a device or threads of its own ([`run_off_pool`]: a batch searched in
//!   pieces) waits off the pool and only hands its short jobs to it;
//! - the caller's thread waits for the pool without running anything else: a plain thread
//!   blocks inside `install`; a worker of another rayon pool (where `install` would keep it busy
//!   with that pool's jobs) hands the section to a plain scoped thread and blocks on joining it;
//! - inside the pool, a waiting worker may run another section's jobs; that is safe because no
//!   job of ours blocks on anything another job holds across a parallel wait (the backends' own
//!   mutexes guard short device calls, never a parallel section: see `backend/`). The one
//!   exception is a streamed GPU collection's windows (`backend/gpu/streamed.rs`): their lock
//!   spans a whole search, parallel sections included, which is safe because no pool job
//!   searches a collection (searches run on callers' threads and piece threads, off the pool).
//!
//! The pool has rayon's default size (`RAYON_NUM_THREADS`, else one thread per core) and is
//! started on first use.

use std::sync::OnceLock;

use crate::error::{HiveGpuError, Result};
use crate::tuning::Tuning;

thread_local! {
    /// Set while this thread searches a piece of a batch whose workers prepare their own
    /// queries ([`Pieces::prepare_here`]).
    static PIECE_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `work` (one piece's search) with this thread marked as a piece worker that prepares
/// its piece's queries itself, on this thread ([`prepares_here`]); the piece's other parallel
/// work (its results) still goes to the pool. The mark is lifted when `work` returns or
/// unwinds.
pub(crate) fn as_piece_worker<R>(work: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            PIECE_WORKER.with(|w| w.set(self.0));
        }
    }
    let _restore = Restore(PIECE_WORKER.with(|w| w.replace(true)));
    work()
}

/// Whether this thread is a piece worker that prepares its own queries ([`as_piece_worker`]).
pub(crate) fn prepares_here() -> bool {
    PIECE_WORKER.with(std::cell::Cell::get)
}

/// Runs `section` on the library's pool and returns its result; the calling thread runs no
/// foreign job meanwhile (see the module documentation).
pub(crate) fn run<R: Send>(section: impl FnOnce() -> R + Send) -> Result<R> {
    let pool = pool()?;
    if pool.current_thread_index().is_some() {
        // Already one of ours (a section calling a section): just run it.
        return Ok(section());
    }
    if rayon::current_thread_index().is_none() {
        // A plain thread waits on a lock inside `install`: it runs nothing else.
        return Ok(pool.install(section));
    }
    // A worker of another pool would run that pool's jobs while it waits in `install`.
    on_plain_thread(|| pool.install(section))
}

/// Runs `work` on a plain thread of its own and blocks on joining it: how a thread of a rayon
/// pool waits without running that pool's jobs meanwhile.
fn on_plain_thread<R: Send>(work: impl FnOnce() -> R + Send) -> Result<R> {
    std::thread::scope(|scope| {
        let waiter = std::thread::Builder::new()
            .name("hive-gpu-waiter".into())
            .spawn_scoped(scope, work)
            .map_err(|e| HiveGpuError::Internal(format!("cannot start a thread to wait on: {e}")))?;
        Ok(waiter.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })
}

/// Runs `section` off the library's pool, with a scope whose spawned jobs run on the pool, and
/// returns once the section and every job it spawned are done: for a section that blocks for
/// long on something other than the pool (a device, threads of its own), such as a batch
/// searched in pieces by worker threads.
///
/// Inside the pool (through [`run`]), such a section would hold a pool thread for all its
/// blocking, while the jobs it waits for (its workers' preparations and results) need pool
/// threads of their own: with as many of those sections at once as the pool has threads (the
/// shards of a sharded search, each searched in pieces, on a two-core machine) no job could
/// start and every section waited for good. Off the pool, the section runs on the calling
/// thread, or, where that is a thread of some rayon pool, on a plain thread that the caller
/// blocks on, running nothing else meanwhile. A caller that is one of our own pool's threads
/// (a user's callback run inside a section, such as a save's progress) still holds that thread
/// while it blocks: with a pool of one thread, a batch searched in pieces from such a callback
/// cannot finish. Callbacks run by the library must not search.
pub(crate) fn run_off_pool<'scope, R: Send>(
    section: impl FnOnce(&rayon::Scope<'scope>) -> R + Send,
) -> Result<R> {
    scope_waiting_off_rayon(pool()?, section)
}

/// `pool.in_place_scope(section)`, with the caller waiting where it runs no foreign job: right
/// here from a plain thread, else on a plain thread of its own.
fn scope_waiting_off_rayon<'scope, R: Send>(
    pool: &rayon::ThreadPool,
    section: impl FnOnce(&rayon::Scope<'scope>) -> R + Send,
) -> Result<R> {
    if rayon::current_thread_index().is_none() {
        return Ok(pool.in_place_scope(section));
    }
    on_plain_thread(|| pool.in_place_scope(section))
}

/// Runs `section` with a scope whose spawned jobs run on the members' pool: long-lived threads
/// for the members of a sharded or replicated storage, each of which blocks on its own device
/// for a whole search or write while the others do the same (`crate::multi`). Returns once the
/// section and every job it spawned are done.
///
/// A thread started per member and per search cost about 0.2 ms of a sharded single query
/// (the thread, and its first calls into the device's driver: `HIVE_GPU_PROFILE` on two H200s,
/// docs/PERFORMANCE.md, multi-GPU section); these threads are started once. The jobs follow
/// this module's rules: a member job that needs the library's pool enters it through [`run`]
/// or [`run_off_pool`], which treat the members' threads as another pool's (they wait on a
/// plain thread, stealing nothing), and no member job waits on another. The caller waits as in
/// [`run_off_pool`]: right here from a plain thread, else on a plain thread of its own.
pub(crate) fn run_on_members<'scope, R: Send>(
    section: impl FnOnce(&rayon::Scope<'scope>) -> R + Send,
) -> Result<R> {
    scope_waiting_off_rayon(members()?, section)
}

/// The members' pool, started on first use: two threads per core, at least 16, so that the
/// members of several storages searched at once from many threads each find a thread.
fn members() -> Result<&'static rayon::ThreadPool> {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    if let Some(pool) = POOL.get() {
        return Ok(pool);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads((2 * cores).clamp(16, 256))
        .thread_name(|i| format!("hive-gpu-member-{i}"))
        .build()
        .map_err(|e| HiveGpuError::Internal(format!("cannot start hive-gpu's member threads: {e}")))?;
    Ok(POOL.get_or_init(|| built))
}

/// [`run`], except that a `small` section called from a thread of no rayon pool runs right
/// here: handing a write of one vector to the pool and back cost more than the write itself
/// (two thread switches per write; `hive-gpu bench-writes`, docs/PERFORMANCE.md). A section
/// may be called small only if it takes no parallel path at all (`Collection::is_small_write`
/// keeps writes below every row store's parallel threshold): a rayon call from here would go
/// to the global pool, which may be the caller's, and wait there under the collection's lock.
pub(crate) fn run_small<R: Send>(small: bool, section: impl FnOnce() -> R + Send) -> Result<R> {
    if small && rayon::current_thread_index().is_none() {
        return Ok(section());
    }
    run(section)
}

/// The threads of the library's pool (1 where it cannot start: its callers then run alone).
pub(crate) fn pool_threads() -> usize {
    pool().map_or(1, rayon::ThreadPool::current_num_threads)
}

/// The pool, started on first use. A failure to start it (the OS refused threads) is
/// reported, and the next call tries again.
fn pool() -> Result<&'static rayon::ThreadPool> {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    if let Some(pool) = POOL.get() {
        return Ok(pool);
    }
    let built = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("hive-gpu-{i}"))
        .build()
        .map_err(|e| HiveGpuError::Internal(format!("cannot start hive-gpu's worker threads: {e}")))?;
    // Two first calls may race: the loser's pool is dropped (its threads exit).
    Ok(POOL.get_or_init(|| built))
}

/// How a batch is cut into pieces searched side by side (the collection layer's
/// `index::flat::search_pieces`, and a streamed store's windows): `count` pieces of sizes that differ by one query at
/// most (none empty while there are queries), searched by `workers` threads (per member).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pieces {
    /// Pieces.
    pub(crate) count: usize,
    /// Threads searching them (per member).
    pub(crate) workers: usize,
    /// Whether each worker prepares its piece's queries itself ([`as_piece_worker`]) instead
    /// of handing that to the library's pool.
    pub(crate) prepare_here: bool,
}

impl Pieces {
    /// Pieces of about `tuning.piece_queries` for `tuning.piece_workers` threads (one piece
    /// below two pieces' worth, or with one worker).
    ///
    /// IVF batches too: on the H100 (docs/PERFORMANCE.md, IVF pieces) 10,000 queries at nprobe 4
    /// ran within the noise of one another as 5 pieces on 4 workers, 8 on 4, 4 on 4, 3 on 3
    /// and 5 on 5, and slower whole or in 2 pieces on 2 workers.
    pub(crate) fn of(nq: usize, tuning: &Tuning) -> Self {
        let size = tuning.piece_queries.max(1);
        let workers = tuning.piece_workers.max(1);
        if nq < size.saturating_mul(2) || workers == 1 {
            return Self { count: 1, workers: 1, prepare_here: false };
        }
        Self { count: nq.div_ceil(size), workers, prepare_here: false }
    }

    /// These pieces for a batch through an inverted-file index of `nlist` lists whose scan reads
    /// each probed list once per piece (IVF-Flat's), probed `nprobe` at a time: where a piece
    /// would hold fewer (query, list) pairs than there are lists, the batch goes in pieces of
    /// `most` queries (at least 1) instead, whole below that. Such small pieces read most lists
    /// for one query each: on the H100, 10,000 queries at nprobe 1 over 4,096 lists ran at 852k
    /// QPS in 5 pieces and at 1.01M whole (docs/PERFORMANCE.md, IVF-Flat list scan). `most`
    /// bounds what one piece stages and allocates, as the pieces did.
    pub(crate) fn over_lists(self, nq: usize, nprobe: usize, nlist: usize, most: usize) -> Self {
        let pairs = nq.div_ceil(self.count.max(1)).saturating_mul(nprobe.clamp(1, nlist.max(1)));
        if self.count <= 1 || pairs >= nlist {
            return self;
        }
        let count = nq.div_ceil(most.max(1)).max(1);
        Self { count, workers: self.workers.min(count), prepare_here: self.prepare_here }
    }

    /// [`Pieces::of`] with [`Tuning::small_piece_queries`] and [`Tuning::small_piece_workers`]:
    /// a batch over at most [`Tuning::small_search_rows`] rows on a device, whose pieces cost
    /// more in host work than in device work. Its workers prepare their own queries: the
    /// workers already keep the cores busy, and a piece that handed its preparation to the
    /// pool waited there behind the others' (on the H100, 0.1 to 1.6 ms for 1,024 queries
    /// whose preparation takes about 0.1: docs/PERFORMANCE.md, "Filtered batches over few
    /// rows").
    pub(crate) fn of_few_rows(nq: usize, tuning: &Tuning) -> Self {
        let small = Tuning {
            piece_queries: tuning.small_piece_queries,
            piece_workers: tuning.small_piece_workers,
            ..Tuning::default()
        };
        let pieces = Self::of(nq, &small);
        let prepare_here = pieces.workers > 1;
        Self { prepare_here, ..pieces }
    }

    /// One piece per member (at most one per query): a batch over a collection whose rows stream
    /// from host memory (`RowStore::streamed`). Each piece streams every row through the
    /// device, so pieces of one member would read them once each, one after another (on an H100, a
    /// 10,000-query batch over 8 GiB streamed in 5 pieces took 1,050 ms, where uploading the rows
    /// once takes 150: docs/PERFORMANCE.md, streaming).
    pub(crate) fn whole(nq: usize, members: usize) -> Self {
        Self { count: members.min(nq).max(1), workers: 1, prepare_here: false }
    }

    /// Pieces for `members` collections searched at once: at most two workers per member (one
    /// piece on its device while the next is prepared), and pieces in whole rounds of one per
    /// worker (at least what [`Pieces::of`] gives, at most one per query). The workers of one
    /// device finish their pieces together; had a round fewer pieces than workers, the first
    /// device to finish would take them all and the other would wait: with 10 pieces for 2 x 4
    /// workers, 3 of 7 passes of a 10,000-query batch on two H200s took 96 ms instead of 80,
    /// what one device searching 6 of the 10 pieces takes (`scripts/gpu-replicated-sweep.sh`,
    /// docs/PERFORMANCE.md, multi-GPU section).
    pub(crate) fn across(nq: usize, tuning: &Tuning, members: usize) -> Self {
        let one = Self::of(nq, tuning);
        if members <= 1 || nq <= 1 {
            return one;
        }
        if one.count == 1 {
            // Under two pieces' worth: one part per member, as many as there are queries.
            return Self { count: members.min(nq), workers: 1, prepare_here: false };
        }
        let workers = tuning.piece_workers.clamp(1, 2);
        let round = members * workers;
        let count = one.count.max(round).next_multiple_of(round).min(nq);
        Self { count, workers: workers.min((count / members).max(1)), prepare_here: false }
    }

    /// Piece `i` of a batch of `nq` queries.
    pub(crate) fn range(&self, i: usize, nq: usize) -> std::ops::Range<usize> {
        nq * i / self.count..nq * (i + 1) / self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn sections_run_on_the_library_pool_from_any_thread() {
        let ours = |_: ()| pool().expect("pool").current_thread_index().is_some();
        assert!(run(|| ours(())).expect("from a plain thread"));
        let foreign = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool");
        assert!(foreign.install(|| run(|| ours(())).expect("from a foreign worker")));
        // Nested: a section inside a section stays where it is.
        assert!(run(|| run(|| ours(())).expect("nested")).expect("outer"));
    }

    #[test]
    fn a_foreign_worker_waiting_on_a_section_runs_none_of_its_pool_s_jobs() {
        // One foreign thread: if it stole while waiting, the job queued behind it would run on
        // it before the section ends, and observe `inside` set.
        let foreign = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a pool");
        let inside = std::sync::atomic::AtomicBool::new(false);
        let stole = std::sync::atomic::AtomicBool::new(false);
        foreign.install(|| {
            rayon::scope(|s| {
                s.spawn(|_| {
                    if inside.load(std::sync::atomic::Ordering::SeqCst) {
                        stole.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                });
                run(|| {
                    inside.store(true, std::sync::atomic::Ordering::SeqCst);
                    // Parallel work inside the section, long enough to give a thief a chance.
                    let sum: u64 = (0..2_000_000u64).into_par_iter().map(|x| x % 7).sum();
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    inside.store(false, std::sync::atomic::Ordering::SeqCst);
                    sum
                })
                .expect("section");
            });
        });
        assert!(!stole.load(std::sync::atomic::Ordering::SeqCst));
    }
}
