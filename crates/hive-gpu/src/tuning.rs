//! Every knob of the search engines, read in one place: [`Tuning`].
//!
//! A context reads the `HIVE_GPU_*` tuning variables once, when it opens
//! ([`Tuning::from_env`]), and every collection it creates keeps that copy: no search code reads
//! the environment. Code and tests that want a path forced build a [`Tuning`] and open their
//! context with it ([`crate::GpuContext::with_tuning`]), not through process-global variables.
//!
//! Not here: the users' own switches (`HIVE_GPU_BACKEND`, `HIVE_GPU_ADAPTER`,
//! `HIVE_GPU_PROFILE`), and `HIVE_GPU_CPU_SIMD`, which lowers the CPU's instruction-set level
//! for the whole process (the level is detected once and is what makes the kernels sound).

use crate::error::{HiveGpuError, Result};

/// The knobs of the search engines, with the defaults the measurements in
/// `docs/PERFORMANCE.md` chose. Start from [`Tuning::default`] (or [`Tuning::from_env`]) and set
/// the fields to change; new knobs may be added, so the struct cannot be built literally.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tuning {
    /// CUDA/ROCm batch GEMMs on the engine's own kernel instead of cuBLAS/rocBLAS (the path ROCm
    /// takes without rocBLAS). `HIVE_GPU_OWN_GEMM=1`.
    pub own_gemm: bool,
    /// CUDA batches may take the fused tensor-core filter (false: cuBLAS tiles, for
    /// comparison). `HIVE_GPU_FUSED=0` turns it off.
    pub fused: bool,
    /// The collection size from which CUDA and wgpu batches take the fused filter (at least 1;
    /// tests use 1). `HIVE_GPU_FUSED_MIN_ROWS`.
    pub fused_min_rows: usize,
    /// Below `fused_min_rows`, a CUDA batch (piece) still takes the fused filter when its rows
    /// times its queries reach this (at least 1). `HIVE_GPU_FUSED_MIN_WORK`.
    pub fused_min_work: usize,
    /// Row tiles each block of CUDA's fused filter streams (at least 1; tests use 3).
    /// `HIVE_GPU_FUSED_TILES`.
    pub fused_tiles: usize,
    /// Blocks per multiprocessor that CUDA's fused filter's grid aims for: a block streams
    /// fewer than `fused_tiles` row tiles where the grid would otherwise hold fewer (0: always
    /// `fused_tiles`; tests use 0 to keep blocks of several tiles covered).
    /// `HIVE_GPU_FUSED_BLOCKS_PER_SM`.
    pub fused_blocks_per_sm: usize,
    /// CUDA's fused filter multiplies f32 rows rounded to f16 where their range allows (false:
    /// TF32 always). `HIVE_GPU_F16_FILTER=0` turns it off.
    pub f16_filter: bool,
    /// The largest f16 copy of the f32 rows one CUDA search makes for the f16 filter, in bytes;
    /// 0: no copy, the filter rounds every staged step itself. `HIVE_GPU_ROUNDED_COPY_BYTES`.
    pub rounded_copy_bytes: usize,
    /// A CUDA batch (piece) of fewer queries than this rounds f32 rows inside the f16 filter
    /// instead of making the copy (`rounded_copy_bytes`; bf16 rows always copy). Without the
    /// copy every tile of 128 queries reads 4 bytes a value; the copy reads 4 and writes 2 once,
    /// then every tile reads 2: the two break even at three tiles, so up to two the copy saves
    /// nothing (tests use 0). Counted in queries, so a `tile_queries` below 128 (many small
    /// launches) makes the copy pay earlier than this says. `HIVE_GPU_ROUNDED_COPY_MIN_QUERIES`.
    pub rounded_copy_min_queries: usize,
    /// Result entries (queries x k) of one piece of a flat search (a whole batch up to
    /// `piece_queries`; a sharded search's merged lists) from which its public results are
    /// built on the library's pool rather than the calling thread (at least 1).
    /// `HIVE_GPU_PARALLEL_RESULTS`.
    pub parallel_results: usize,
    /// Re-ranked lists of the radix path at least this long are cut to their k best by a linear
    /// selection before they are sorted (at least 1; tests use 1). `HIVE_GPU_SELECT_MIN`.
    pub select_min_candidates: usize,
    /// Queries per GPU tile (at least 1). `HIVE_GPU_TILE_QUERIES`.
    pub tile_queries: usize,
    /// Bytes of one tile of distances (at least 1). `HIVE_GPU_TILE_BYTES`.
    pub tile_bytes: usize,
    /// Rows per tile, where set (else derived from `tile_bytes`). `HIVE_GPU_TILE_ROWS`.
    pub tile_rows: Option<usize>,
    /// Blocks per multiprocessor of the single-query scan (at least 1).
    /// `HIVE_GPU_SCAN_BLOCKS_PER_SM`.
    pub scan_blocks_per_sm: usize,
    /// A CUDA single query over at most this many stored values (rows x dimension, at most
    /// 16,384 rows) computes every row's exact distance in one pass (`kernels/few.cu`) instead
    /// of the scan's approximate pass, band and re-rank (0: never; tests use 0 in one variant
    /// to keep the scan covered on small collections). The pass returns its lists through
    /// mapped host memory, which the HIP driver does not map yet: ROCm keeps the scan.
    /// `HIVE_GPU_FEW_VALUES`.
    pub few_values: usize,
    /// Scan passes between merge checks, at most (the kernel caps it further so the buffer
    /// stays half free; at least 1). `HIVE_GPU_SCAN_SUBROUNDS`.
    pub scan_subrounds: usize,
    /// wgpu batches may take the cooperative-matrix filter where the adapter has it (false: the
    /// plain tiles, for comparison). `HIVE_GPU_WGPU_COOP=0` turns it off.
    pub wgpu_coop: bool,
    /// wgpu single queries may read a row with eight lanes where subgroups allow it (false: a
    /// row per thread). `HIVE_GPU_WGPU_SUBGROUPS=0` turns it off.
    pub wgpu_subgroups: bool,
    /// A filtered CUDA/ROCm search of fewer than 8 queries whose passing rows are at most 1 in
    /// `gather_fraction` of the slots gathers them on the device and searches only those;
    /// others scan every row with the rest masked (0: never gather; tests use 1, always).
    /// `HIVE_GPU_GATHER_FRACTION`.
    pub gather_fraction: usize,
    /// The same for batches of 8 queries and more, whose gather is made once for all the
    /// batch's pieces and kept for the next batch of the filter: 1 (the default) gathers
    /// whatever share passes, as reading only the passing rows never costs more than masking
    /// the others once the copy is made. `HIVE_GPU_BATCH_GATHER_FRACTION`.
    pub batch_gather_fraction: usize,
    /// CUDA/ROCm IVF searches scan their lists with the device's list kernel (false: each
    /// query's list members go through `refine`, for comparison). `HIVE_GPU_LIST_SCAN=0`
    /// turns it off.
    pub list_scan: bool,
    /// CUDA/ROCm `refine` answers every query with at most this many candidates in one launch
    /// for the whole batch (further capped by what a block's shared memory holds); a query
    /// with more goes alone through the re-rank, selection and sort kernels (0: every query
    /// alone; tests use 0 to cover that path). `HIVE_GPU_REFINE_BATCH_CANDIDATES`.
    pub refine_batch_candidates: usize,
    /// CUDA/ROCm scans of SQ8, product-quantized and binary codes run on the device (false: on
    /// the host's threads, every backend's default, for comparison). `HIVE_GPU_CODE_SCAN=0`
    /// turns it off.
    pub code_scan: bool,
    /// CUDA/ROCm `nearest_rows` (the 1-NN of k-means, IVF adds, product-quantization encoding
    /// and IVF probes at nprobe 1) runs the device's nearest-row kernel, with the exact k-NN only for the points
    /// whose pick it cannot prove (false: every point through the exact k-NN, every backend's
    /// default, for comparison). `HIVE_GPU_NEAREST_KERNEL=0` turns it off.
    pub nearest_kernel: bool,
    /// The nearest-row kernel (`nearest_kernel`) runs for calls of at least this many points
    /// (at least 1); fewer take the exact k-NN, which answers a few points sooner than the
    /// kernel's one pass over every row per 64 points. `HIVE_GPU_NEAREST_MIN_POINTS`.
    pub nearest_min_points: usize,
    /// Bytes of points (and their results) per launch of the nearest-row kernel at most (at
    /// least 1), bounding its staging and device buffers; larger calls go in pieces (tests use
    /// a few KiB to cut every call). `HIVE_GPU_NEAREST_PIECE_BYTES`.
    pub nearest_piece_bytes: usize,
    /// Queries per piece of a large batch (at least 1): a batch of at least twice as many is
    /// searched in pieces, `piece_workers` at a time, so that preparing queries and building
    /// results overlaps the device's work. `HIVE_GPU_PIECE_QUERIES`.
    pub piece_queries: usize,
    /// Pieces searched at once (at least 1; 1 searches a batch whole). A GPU keeps up to this
    /// many search workspaces (or `small_piece_workers`, where more). `HIVE_GPU_PIECE_WORKERS`.
    pub piece_workers: usize,
    /// A batch on a CUDA/ROCm device that searches at most this many rows (a small collection,
    /// or a filter that leaves few) for at most `small_search_max_k` neighbours is cut into
    /// pieces of `small_piece_queries` on `small_piece_workers` instead (0: never). Its device
    /// work is small beside each piece's host work, so more of that overlaps.
    /// `HIVE_GPU_SMALL_SEARCH_ROWS`.
    pub small_search_rows: usize,
    /// See `small_search_rows` (larger k make each piece's device work and results larger).
    /// `HIVE_GPU_SMALL_SEARCH_MAX_K`.
    pub small_search_max_k: usize,
    /// Queries per piece of a batch over few rows (at least 1). `HIVE_GPU_SMALL_PIECE_QUERIES`.
    pub small_piece_queries: usize,
    /// Pieces of a batch over few rows searched at once (at least 1).
    /// `HIVE_GPU_SMALL_PIECE_WORKERS`.
    pub small_piece_workers: usize,
    /// A CUDA/ROCm search (or piece of a batch) of at least this many queries prepares them on
    /// the library's pool, fewer on the calling thread (at least 1).
    /// `HIVE_GPU_PREPARE_PARALLEL_QUERIES`.
    pub prepare_parallel_queries: usize,
    /// Whether a sharded search merges its shards' lists on a device where every shard can
    /// copy into the first shard's device (`crate::backend::merge`); off, the host merges
    /// them. `HIVE_GPU_DEVICE_MERGE`.
    pub device_merge: bool,
    /// Queries from which a sharded batch merges on a device (at least 1; fewer merge on the
    /// host, where one query's few lists cost less than the device merge's copies and waits).
    /// `HIVE_GPU_DEVICE_MERGE_MIN_QUERIES`.
    pub device_merge_min_queries: usize,
    /// The CPU backend's batches of 16 queries and more multiply in bf16 (where the CPU has
    /// AVX512-BF16) over collections of at least this many slots (rows stored, removed ones
    /// included; also the host rows the wgpu backend re-ranks from), else in f32 (0: bf16 over any
    /// collection, as tests use to cover that kernel with small data). Below it the bf16
    /// kernel's looser error bound sends more candidates to the exact re-rank than its speed
    /// saves. `HIVE_GPU_CPU_BF16_MIN_ROWS`.
    pub cpu_bf16_min_rows: usize,
    /// The CPU backend searches an unfiltered batch of queries x rows x dimension up to this
    /// many products on the caller's thread instead of handing it to the library's pool (0:
    /// every search goes to the pool, as tests use to cover the pool's paths with small data).
    /// A hand-over costs a thread's wake-up each way: on the 2-core VM a fifth of a 100-query
    /// search over 100 rows of 128 dimensions (SIFT10K's IVF probe; docs/PERFORMANCE.md, small
    /// searches). The same bound sends an IVF list scan (filtered or not) over lists already
    /// packed to the caller's thread: the rows its queries probe times the dimension
    /// (`CpuRows::scans_here`). A batch of 32 queries or more still uses the pool where it has
    /// two threads or more: a search split by queries, a list scan by lists (`spreads`).
    /// `HIVE_GPU_CPU_HERE_PRODUCTS`.
    pub cpu_here_products: usize,
    /// The CPU backend keeps an IVF-Flat index's lists as a packed copy of their f32 rows
    /// (blocks of 16 rows, component-major), made at the first search of each state of the
    /// lists, and scans that copy instead of the rows where they lie (false: in place, as tests
    /// use to cover that path). The copy doubles the memory of the collection's rows; on the
    /// 2-core VM it made SIFT10K's IVF-Flat batches faster (docs/PERFORMANCE.md, "Packed
    /// lists"). The same switch governs the packed copy of an IVF-SQ8 index's byte codes
    /// (`rows/code_lists.rs`; a quarter of the f32 rows' memory), whose scan ran IVF-SQ8 on
    /// SIFT10K about twice as fast as the host scan (docs/PERFORMANCE.md, "Packed SQ8 codes").
    /// `HIVE_GPU_CPU_PACKED_LISTS`.
    pub cpu_packed_lists: bool,
    /// The most bytes of rows one CUDA/ROCm collection keeps in device memory, where set (else
    /// as much as the device has). A collection that outgrows it, or the device, moves its
    /// rows to page-locked host memory and streams them through the device for each search
    /// (`backend/gpu/streamed.rs`); tests set it low to take that path on any GPU.
    /// `HIVE_GPU_DEVICE_ROWS_BYTES`.
    pub device_rows_bytes: Option<usize>,
    /// Bytes of rows per window of a streamed collection (at least 1): the piece uploaded while
    /// the previous one is searched. Two windows live on the device.
    /// `HIVE_GPU_STREAM_WINDOW_BYTES`.
    pub stream_window_bytes: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            own_gemm: false,
            fused: true,
            fused_min_rows: 131_072,
            // 100 queries over 100k rows (1e7) ran 5-42% faster on the fused filter than on
            // cuBLAS tiles on the H200 since its thresholds come from the device
            // (docs/PERFORMANCE.md, "Cosine on the rounded filter"); before that, on the H100,
            // 1.8x slower.
            fused_min_work: 10_000_000,
            fused_tiles: 32,
            // Two blocks of the f16 filter fit a multiprocessor at d = 128: 8 is four waves.
            fused_blocks_per_sm: 8,
            f16_filter: true,
            rounded_copy_bytes: 512 << 20,
            // One query tile (100 queries) over 1M rows at d 64-128 ran 15-23% faster without
            // the copy, eight tiles (1,000) 2-14% faster with it (H200, docs/PERFORMANCE.md,
            // "Cosine on the rounded filter"); two tiles were not measured.
            rounded_copy_min_queries: 256,
            parallel_results: crate::backend::PARALLEL_RESULTS,
            select_min_candidates: 8192,
            tile_queries: 4096,
            tile_bytes: 256 << 20,
            tile_rows: None,
            scan_blocks_per_sm: 4,
            // 16,384 rows of 128: a prepared filter's 10,253 gathered rows in one query
            // (docs/PERFORMANCE.md, "One exact pass for a query over few rows").
            few_values: 1 << 21,
            scan_subrounds: 64,
            wgpu_coop: true,
            wgpu_subgroups: true,
            // Measured on the H100 over 1M x 128 (docs/PERFORMANCE.md, filtered search): one
            // query gathered 1,024 passing rows in 0.31 ms against 0.52 ms masked, but 100,050
            // in 1.24 ms against 0.43 ms; a 10,000-query batch gathered 100,050 in 18 ms
            // against 98 ms masked (a masked batch under half the rows has no sample for the
            // fused filter). A gather of at most 1/16 of the rows stays with the workspace for
            // the filter's next search (a prepared filter's 10,253 rows: 0.034-0.037 ms a query
            // against 0.20 unfiltered, 0.20 masked), hence 1 in 64 for single queries, not 1 in
            // 256.
            gather_fraction: 64,
            batch_gather_fraction: 1,
            list_scan: true,
            refine_batch_candidates: usize::MAX,
            code_scan: true,
            nearest_kernel: true,
            // IVF-Flat's probe at nprobe 1 over 1,024 centroids on the H100 (docs/PERFORMANCE.md,
            // "Builds faster than FAISS GPU"): the kernel lost at 1 to 1,000 queries a call (by
            // 3.9x at 1, 18-24% fewer queries a second at 1,000) and was level at 2,000.
            nearest_min_points: 2048,
            // Three launches for a k-means sample of 262,144 points of 128 components.
            nearest_piece_bytes: 64 << 20,
            // 2,048 queries are 16 x 245 blocks of the fused filter over a million rows: enough
            // to fill a big GPU, few enough that pieces overlap host and device work. Measured on
            // the H200 against 1,024, 1,536 and 3,334; 4 workers against 1 and 2 (slower) and 5
            // to 8 (no faster) (docs/PERFORMANCE.md).
            piece_queries: 2048,
            piece_workers: 4,
            // See docs/PERFORMANCE.md, "Filtered batches over few rows".
            small_search_rows: 16_384,
            small_search_max_k: 16,
            small_piece_queries: 1024,
            small_piece_workers: 8,
            prepare_parallel_queries: 64,
            device_merge: true,
            // Two H100s with NVLink, 2M x 128 over two shards (docs/PERFORMANCE.md, multi-GPU
            // section, device merge): batches of 200 to 2,000 queries ran 3-9% faster merged on
            // the device, 100 within the noise, 10 about 7% slower; single queries 40-70 us
            // slower.
            device_merge_min_queries: 128,
            // See docs/PERFORMANCE.md, "IVF-Flat on small collections".
            cpu_bf16_min_rows: 4096,
            cpu_here_products: 1 << 21,
            cpu_packed_lists: true,
            device_rows_bytes: None,
            // 1 GiB uploads in about 40 ms at 25 GB/s, so a window's fixed search costs (well
            // under a millisecond) stay small beside its copy (docs/PERFORMANCE.md, streaming).
            stream_window_bytes: 1 << 30,
        }
    }
}

impl Tuning {
    /// The defaults with every `HIVE_GPU_*` tuning variable that is set applied.
    ///
    /// # Errors
    /// [`HiveGpuError::InvalidArgument`] naming the variable when a value is not what it takes
    /// (a switch takes `0` or `1`; a size a whole number, at least 1 where the field says so):
    /// a typo is reported, never silently replaced by the default.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`Tuning::from_env`] over any source of variables (tests give a map).
    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut t = Self::default();
        let switch = |name: &str, value: &mut bool| -> Result<()> {
            match get(name).as_deref().map(str::trim) {
                None | Some("") => Ok(()),
                Some("1") => {
                    *value = true;
                    Ok(())
                }
                Some("0") => {
                    *value = false;
                    Ok(())
                }
                Some(other) => {
                    Err(HiveGpuError::InvalidArgument(format!("{name}={other:?}: expected 0 or 1")))
                }
            }
        };
        let size = |name: &str, min: usize| -> Result<Option<usize>> {
            match get(name).as_deref().map(str::trim) {
                None | Some("") => Ok(None),
                Some(text) => match text.parse::<usize>() {
                    Ok(value) if value >= min => Ok(Some(value)),
                    _ => Err(HiveGpuError::InvalidArgument(format!(
                        "{name}={text:?}: expected a whole number of at least {min}"
                    ))),
                },
            }
        };
        switch("HIVE_GPU_OWN_GEMM", &mut t.own_gemm)?;
        switch("HIVE_GPU_FUSED", &mut t.fused)?;
        switch("HIVE_GPU_F16_FILTER", &mut t.f16_filter)?;
        switch("HIVE_GPU_WGPU_COOP", &mut t.wgpu_coop)?;
        switch("HIVE_GPU_WGPU_SUBGROUPS", &mut t.wgpu_subgroups)?;
        switch("HIVE_GPU_LIST_SCAN", &mut t.list_scan)?;
        switch("HIVE_GPU_CODE_SCAN", &mut t.code_scan)?;
        switch("HIVE_GPU_CPU_PACKED_LISTS", &mut t.cpu_packed_lists)?;
        switch("HIVE_GPU_NEAREST_KERNEL", &mut t.nearest_kernel)?;
        switch("HIVE_GPU_DEVICE_MERGE", &mut t.device_merge)?;
        let sizes: [(&str, usize, &mut usize); 29] = [
            ("HIVE_GPU_FUSED_MIN_ROWS", 1, &mut t.fused_min_rows),
            ("HIVE_GPU_FUSED_MIN_WORK", 1, &mut t.fused_min_work),
            ("HIVE_GPU_FUSED_TILES", 1, &mut t.fused_tiles),
            ("HIVE_GPU_FUSED_BLOCKS_PER_SM", 0, &mut t.fused_blocks_per_sm),
            ("HIVE_GPU_ROUNDED_COPY_BYTES", 0, &mut t.rounded_copy_bytes),
            ("HIVE_GPU_ROUNDED_COPY_MIN_QUERIES", 0, &mut t.rounded_copy_min_queries),
            ("HIVE_GPU_PARALLEL_RESULTS", 1, &mut t.parallel_results),
            ("HIVE_GPU_SELECT_MIN", 1, &mut t.select_min_candidates),
            ("HIVE_GPU_TILE_QUERIES", 1, &mut t.tile_queries),
            ("HIVE_GPU_TILE_BYTES", 1, &mut t.tile_bytes),
            ("HIVE_GPU_SCAN_BLOCKS_PER_SM", 1, &mut t.scan_blocks_per_sm),
            ("HIVE_GPU_SCAN_SUBROUNDS", 1, &mut t.scan_subrounds),
            ("HIVE_GPU_FEW_VALUES", 0, &mut t.few_values),
            ("HIVE_GPU_GATHER_FRACTION", 0, &mut t.gather_fraction),
            ("HIVE_GPU_BATCH_GATHER_FRACTION", 0, &mut t.batch_gather_fraction),
            ("HIVE_GPU_PIECE_QUERIES", 1, &mut t.piece_queries),
            ("HIVE_GPU_NEAREST_MIN_POINTS", 1, &mut t.nearest_min_points),
            ("HIVE_GPU_NEAREST_PIECE_BYTES", 1, &mut t.nearest_piece_bytes),
            ("HIVE_GPU_PIECE_WORKERS", 1, &mut t.piece_workers),
            ("HIVE_GPU_REFINE_BATCH_CANDIDATES", 0, &mut t.refine_batch_candidates),
            ("HIVE_GPU_DEVICE_MERGE_MIN_QUERIES", 1, &mut t.device_merge_min_queries),
            ("HIVE_GPU_STREAM_WINDOW_BYTES", 1, &mut t.stream_window_bytes),
            ("HIVE_GPU_CPU_BF16_MIN_ROWS", 0, &mut t.cpu_bf16_min_rows),
            ("HIVE_GPU_CPU_HERE_PRODUCTS", 0, &mut t.cpu_here_products),
            ("HIVE_GPU_SMALL_SEARCH_ROWS", 0, &mut t.small_search_rows),
            ("HIVE_GPU_SMALL_SEARCH_MAX_K", 0, &mut t.small_search_max_k),
            ("HIVE_GPU_SMALL_PIECE_QUERIES", 1, &mut t.small_piece_queries),
            ("HIVE_GPU_SMALL_PIECE_WORKERS", 1, &mut t.small_piece_workers),
            ("HIVE_GPU_PREPARE_PARALLEL_QUERIES", 1, &mut t.prepare_parallel_queries),
        ];
        for (name, min, field) in sizes {
            if let Some(value) = size(name, min)? {
                *field = value;
            }
        }
        t.tile_rows = size("HIVE_GPU_TILE_ROWS", 1)?;
        t.device_rows_bytes = size("HIVE_GPU_DEVICE_ROWS_BYTES", 0)?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<Tuning> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Tuning::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn nothing_set_is_the_defaults() {
        assert_eq!(from(&[]).expect("defaults"), Tuning::default());
    }

    #[test]
    fn set_variables_reach_their_fields() {
        let t = from(&[
            ("HIVE_GPU_OWN_GEMM", "1"),
            ("HIVE_GPU_FUSED", "0"),
            ("HIVE_GPU_FUSED_MIN_ROWS", "1"),
            ("HIVE_GPU_FUSED_MIN_WORK", "77"),
            ("HIVE_GPU_FUSED_BLOCKS_PER_SM", "0"),
            ("HIVE_GPU_ROUNDED_COPY_BYTES", "0"),
            ("HIVE_GPU_ROUNDED_COPY_MIN_QUERIES", "0"),
            ("HIVE_GPU_PARALLEL_RESULTS", "9"),
            ("HIVE_GPU_TILE_ROWS", "512"),
            ("HIVE_GPU_WGPU_SUBGROUPS", "0"),
            ("HIVE_GPU_LIST_SCAN", "0"),
            ("HIVE_GPU_CODE_SCAN", "0"),
            ("HIVE_GPU_CPU_PACKED_LISTS", "0"),
            ("HIVE_GPU_NEAREST_KERNEL", "0"),
            ("HIVE_GPU_NEAREST_MIN_POINTS", "5"),
            ("HIVE_GPU_NEAREST_PIECE_BYTES", "4096"),
            ("HIVE_GPU_REFINE_BATCH_CANDIDATES", "0"),
            ("HIVE_GPU_PIECE_QUERIES", "1000"),
            ("HIVE_GPU_PIECE_WORKERS", "8"),
            ("HIVE_GPU_DEVICE_MERGE", "0"),
            ("HIVE_GPU_DEVICE_MERGE_MIN_QUERIES", "3"),
            ("HIVE_GPU_DEVICE_ROWS_BYTES", "4096"),
            ("HIVE_GPU_STREAM_WINDOW_BYTES", "1024"),
            ("HIVE_GPU_CPU_BF16_MIN_ROWS", "0"),
            ("HIVE_GPU_CPU_HERE_PRODUCTS", "0"),
            ("HIVE_GPU_SMALL_SEARCH_ROWS", "0"),
            ("HIVE_GPU_SMALL_PIECE_WORKERS", "6"),
            ("HIVE_GPU_FEW_VALUES", "0"),
        ])
        .expect("valid");
        assert_eq!((t.piece_queries, t.piece_workers), (1000, 8));
        assert_eq!((t.device_merge, t.device_merge_min_queries), (false, 3));
        assert!(t.own_gemm && !t.fused && !t.wgpu_subgroups && !t.list_scan && !t.code_scan);
        assert!(!t.nearest_kernel && !t.cpu_packed_lists);
        assert_eq!((t.nearest_min_points, t.nearest_piece_bytes), (5, 4096));
        assert_eq!(t.refine_batch_candidates, 0);
        assert_eq!((t.fused_min_rows, t.rounded_copy_bytes, t.tile_rows), (1, 0, Some(512)));
        assert_eq!((t.fused_min_work, t.fused_blocks_per_sm), (77, 0));
        assert_eq!((t.rounded_copy_min_queries, t.parallel_results), (0, 9));
        assert_eq!((t.device_rows_bytes, t.stream_window_bytes), (Some(4096), 1024));
        assert_eq!((t.cpu_bf16_min_rows, t.cpu_here_products), (0, 0));
        assert_eq!((t.small_search_rows, t.small_piece_workers), (0, 6));
        assert_eq!(t.few_values, 0);
        assert_eq!(t.tile_queries, Tuning::default().tile_queries);
    }

    #[test]
    fn a_typo_is_an_error_naming_the_variable_not_a_silent_default() {
        for (name, value) in [
            ("HIVE_GPU_FUSED", "no"),
            ("HIVE_GPU_TILE_QUERIES", "4k"),
            ("HIVE_GPU_FUSED_MIN_ROWS", "0"),
            ("HIVE_GPU_SCAN_SUBROUNDS", "-3"),
        ] {
            let err = from(&[(name, value)]).expect_err("refused");
            assert!(err.to_string().contains(name), "{err}");
        }
    }
}
