//! The typed kernel ABI: one `#[repr(C)]` parameter struct per kernel family, whose fields are
//! the kernel's parameters in the order and under the names `kernels/*.cu` declares them, and
//! the kernel handle that only launches with its own struct.
//!
//! A launch used to be a list of positional [`Arg`]s, so a parameter added, removed or swapped
//! on one side compiled on both and failed on a GPU (or, worse, ran with the wrong value). Now
//! the compiler ties each loaded kernel to its struct ([`Kernel`]), a launch names every field,
//! and `declared_signatures_match_the_kernel_sources` (a unit test that needs no GPU) reads each
//! `extern "C" __global__` signature of the sources and checks it against the struct: the same
//! parameter names, in the same order, of the same kinds. Every kernel of the sources must be
//! declared here, so a new one cannot skip the check.
//!
//! CUDA and HIP take kernel parameters one by one (each passed by address), which is how
//! [`KernelParams::with_args`] hands them to the driver; the struct is `#[repr(C)]` so that it
//! reads as the parameter list it mirrors.

use super::driver::{Arg, DevicePtr, Driver};
use crate::error::Result;
use std::marker::PhantomData;

/// The kind of one kernel parameter, as the C source declares it.
// Read by the signature check (tests) only: launches are typed by the structs themselves.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArgKind {
    /// `u32` / `unsigned int`.
    U32,
    /// `int`.
    I32,
    /// `u64` / `unsigned long long`.
    U64,
    /// `float`.
    F32,
    /// `double`.
    F64,
    /// Any device pointer (its element type may differ between a family's kernels: the f32
    /// and f16 variants of one kernel take the same struct).
    Ptr,
}

/// A kernel family's parameter struct.
pub(crate) trait KernelParams {
    /// The kernels that take this struct.
    const KERNELS: &'static [&'static str];
    /// `(name, kind)` of each parameter, in declaration order.
    #[cfg_attr(not(test), allow(dead_code))]
    const SIGNATURE: &'static [(&'static str, ArgKind)];
    /// Calls `f` with the fields as launch arguments, in declaration order.
    fn with_args<R>(&self, f: impl FnOnce(&[Arg]) -> R) -> R;
}

/// A loaded kernel that takes `P`: launching it with any other struct does not compile.
pub(crate) struct Kernel<F, P> {
    function: F,
    params: PhantomData<fn(&P)>,
}

impl<F: Copy, P> Kernel<F, P> {
    /// Wraps a function loaded under one of `P::KERNELS`' names.
    pub(crate) fn new(function: F) -> Self {
        Self { function, params: PhantomData }
    }
}

impl<F: Copy, P> Clone for Kernel<F, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F: Copy, P> Copy for Kernel<F, P> {}

impl<F: std::fmt::Debug, P> std::fmt::Debug for Kernel<F, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.function.fmt(f)
    }
}

/// How a kernel is launched: its grid, threads per block and dynamic shared memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch {
    /// Blocks along x and y.
    pub(crate) grid: (u32, u32),
    /// Threads per block.
    pub(crate) block: u32,
    /// Dynamic shared memory per block, in bytes.
    pub(crate) shared_bytes: u32,
}

impl Launch {
    /// `grid` blocks of `block` threads without dynamic shared memory.
    pub(crate) fn new(grid: (u32, u32), block: u32) -> Self {
        Self { grid, block, shared_bytes: 0 }
    }

    /// The same launch with `bytes` of dynamic shared memory per block.
    pub(crate) fn shared(self, bytes: u32) -> Self {
        Self { shared_bytes: bytes, ..self }
    }
}

impl<D: Driver> super::Device<D> {
    /// Queues `kernel` with `params` on `stream`.
    pub(crate) fn launch<P: KernelParams>(
        &self,
        stream: &D::Stream,
        kernel: Kernel<D::Function, P>,
        launch: Launch,
        params: &P,
    ) -> Result<()> {
        params.with_args(|args| {
            self.driver.launch(stream, kernel.function, launch.grid, launch.block, launch.shared_bytes, args)
        })
    }
}

/// Whether `name` is one of `names` (for the kernel table's compile-time check that each
/// kernel is loaded with the struct that declares it).
pub(crate) const fn declares(names: &[&str], name: &str) -> bool {
    let mut i = 0;
    while i < names.len() {
        let (a, b) = (names[i].as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return true;
            }
        }
        i += 1;
    }
    false
}

macro_rules! kernel_params {
    ($(
        $(#[doc = $doc:literal])*
        struct $name:ident for [$($kernel:literal),+ $(,)?] {
            $($(#[doc = $fdoc:literal])* $field:ident: $kind:ident),+ $(,)?
        }
    )+) => {
        $(
            $(#[doc = $doc])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy)]
            #[allow(non_snake_case)]
            pub(crate) struct $name {
                $($(#[doc = $fdoc])* pub(crate) $field: kernel_params!(@type $kind),)+
            }

            impl KernelParams for $name {
                const KERNELS: &'static [&'static str] = &[$($kernel),+];
                const SIGNATURE: &'static [(&'static str, ArgKind)] =
                    &[$((stringify!($field), ArgKind::$kind)),+];
                fn with_args<R>(&self, f: impl FnOnce(&[Arg]) -> R) -> R {
                    f(&[$(Arg::$kind(self.$field)),+])
                }
            }
        )+

        /// `(kernel, parameters)` of every kernel declared here, for the signature check.
        #[cfg(test)]
        pub(crate) const DECLARED: &[(&[&str], &[(&str, ArgKind)])] =
            &[$((<$name as KernelParams>::KERNELS, <$name as KernelParams>::SIGNATURE)),+];
    };
    (@type U32) => { u32 };
    (@type I32) => { i32 };
    (@type U64) => { u64 };
    (@type F32) => { f32 };
    (@type F64) => { f64 };
    (@type Ptr) => { DevicePtr };
}

kernel_params! {
    /// One block per (query, segment) scans every row of its segment and keeps the query's
    /// candidates inside its error band (`hg_scan_topk`).
    struct ScanTopk for [
        "hg_scan_topk_f32", "hg_scan_topk_f16", "hg_scan_topk_bf16", "hg_scan_topk_i8", "hg_scan_topk_u8",
    ] {
        rows: Ptr, norms: Ptr, dead: Ptr, n: U32, dim: U32, queries: Ptr, gate_mul: Ptr,
        gate_add: Ptr, metric: I32, k: U32, kcap: U32, sortn: U32, per: U32, max_sub: U32,
        lists: Ptr, evicted: Ptr,
    }

    /// One block per group of queries probing one inverted list scans the list's rows once
    /// and keeps each query's candidates inside its error band (`hg_list_topk`).
    struct ListTopk for ["hg_list_topk_f32", "hg_list_topk_f16"] {
        rows: Ptr, norms: Ptr, dead: Ptr, dim: U32, offsets: Ptr, slots: Ptr, probes: Ptr,
        work: Ptr, groups: Ptr, splits: U32, nprobe: U32, pair0: U32, queries: Ptr, gate_mul: Ptr,
        gate_add: Ptr, metric: I32, k: U32, kcap: U32, sortn: U32, max_sub: U32, lists: Ptr,
        evicted: Ptr,
    }

    /// The approximate distance of every row to one query (`hg_scan_all`).
    struct ScanAll for [
        "hg_scan_all_f32", "hg_scan_all_f16", "hg_scan_all_bf16", "hg_scan_all_i8", "hg_scan_all_u8",
    ] {
        rows: Ptr, norms: Ptr, dead: Ptr, n: U32, dim: U32, q: Ptr, metric: I32, dist: Ptr,
    }

    /// Folds one GEMM tile of dot products into the queries' candidate lists (`hg_tile_topk`).
    struct TileTopk for ["hg_tile_topk"] {
        dots: Ptr, ldc: U32, tile_rows: U32, row0: U32, seg: U32, norms: Ptr,
        dead: Ptr, metric: I32, inv_scale: Ptr, gate_mul: Ptr, gate_add: Ptr, k: U32, kcap: U32,
        sortn: U32, lists: Ptr, evicted: Ptr, thresholds: Ptr,
    }

    /// Each query's fused-filter threshold from its products with a sample of the rows
    /// (`hg_sample_tau`).
    struct SampleTau for ["hg_sample_tau"] {
        dots: Ptr, ldc: U32, rows_n: U32, stride: U32, norms: Ptr, dead: Ptr, metric: I32,
        inv_scale: Ptr, gate_add: Ptr, j: U32, widen: F32, tau: Ptr, evicted: Ptr,
    }

    /// Merges a query's candidate lists, checks its band, re-ranks in f64 and writes its
    /// results (`hg_finalize`).
    struct Finalize for [
        "hg_finalize_f32", "hg_finalize_f16", "hg_finalize_bf16", "hg_finalize_i8", "hg_finalize_u8",
    ] {
        lists: Ptr, evicted: Ptr, segments: U32, head: U32, sorted: U32, kcap_in: U32, k: U32,
        kcap: U32, sortn: U32, gate_mul: Ptr, gate_add: Ptr, rows: Ptr, dim: U32, queries: Ptr,
        q_norms: Ptr, metric: I32, out_slots: Ptr, out_dist: Ptr, flags: Ptr, stage_bytes: U32,
    }

    /// One query's exact distance to each of few rows, each block's best kept in order
    /// (`hg_few_topk`).
    struct FewTopk for [
        "hg_few_topk_f32", "hg_few_topk_f16", "hg_few_topk_bf16", "hg_few_topk_i8", "hg_few_topk_u8",
    ] {
        rows: Ptr, dead: Ptr, n: U32, dim: U32, q: Ptr, q_norm: F64, metric: I32, kb: U32,
        heads: Ptr, keys: Ptr, slots: Ptr,
    }

    /// One radix pass's histogram over approximate distances (`hg_radix_hist`).
    struct RadixHist for ["hg_radix_hist"] {
        dist: Ptr, n: U32, state: Ptr, shift: U32, hist: Ptr,
    }

    /// One radix pass's choice of digit (`hg_radix_pick`, one thread).
    struct RadixPick for ["hg_radix_pick"] {
        hist: Ptr, state: Ptr, shift: U32,
    }

    /// The rows at or below the selected distance plus the error band (`hg_radix_collect`).
    struct RadixCollect for ["hg_radix_collect"] {
        dist: Ptr, n: U32, state: Ptr, mul: F32, add: F32, cand: Ptr,
    }

    /// Exact f64 distances of one query's candidates, as sortable keys (`hg_rerank_list`).
    struct RerankList for [
        "hg_rerank_list_f32", "hg_rerank_list_f16", "hg_rerank_list_bf16", "hg_rerank_list_i8", "hg_rerank_list_u8",
    ] {
        cand: Ptr, count: U32, padded: U32, rows: Ptr, dim: U32, q: Ptr, q_norm: F64,
        metric: I32, keys: Ptr, slots: Ptr,
    }

    /// A batch's candidate lists to each query's exact top-k, one block per query
    /// (`hg_refine_lists`).
    struct RefineLists for [
        "hg_refine_lists_f32", "hg_refine_lists_f16", "hg_refine_lists_bf16", "hg_refine_lists_i8", "hg_refine_lists_u8",
    ] {
        cand: Ptr, offsets: Ptr, rows: Ptr, dim: U32, queries: Ptr, q_norms: Ptr, metric: I32,
        k: U32, room: U32, out_slots: Ptr, out_dist: Ptr, stage_bytes: U32, entries: Ptr, stride: U32,
    }

    /// Each query's best rows of its SQ8-coded lists (`hg_sq8_scan`).
    struct Sq8ListScan for ["hg_sq8_scan"] {
        codes: Ptr, terms: Ptr, offsets: Ptr, slots: Ptr, centroids: Ptr, base: Ptr, step: Ptr,
        probes: Ptr, nprobe: U32, queries: Ptr, dim: U32, skip: Ptr, metric: I32, k: U32,
        kcap: U32, sortn: U32, out: Ptr,
    }

    /// Each query's best rows of its binary-coded lists by Hamming distance (`hg_bits_scan`).
    struct BitsListScan for ["hg_bits_scan"] {
        codes: Ptr, offsets: Ptr, slots: Ptr, centroids: Ptr, probes: Ptr, nprobe: U32,
        queries: Ptr, dim: U32, skip: Ptr, k: U32, kcap: U32, sortn: U32, out: Ptr,
    }

    /// Each query's best rows of its product-quantized lists by lookup tables (`hg_pq_scan`).
    struct PqListScan for ["hg_pq_scan"] {
        codes: Ptr, row_bytes: U32, terms: Ptr, offsets: Ptr, slots: Ptr, centroids: Ptr,
        codebooks: Ptr, m: U32, bits: U32, probes: Ptr, nprobe: U32, queries: Ptr, dim: U32,
        skip: Ptr, metric: I32, k: U32, kcap: U32, sortn: U32, out: Ptr,
    }

    /// One pass's histogram of the composite (key, slot) select (`hg_select_hist`).
    struct SelectHist for ["hg_select_hist"] {
        keys: Ptr, slots: Ptr, n: U32, state: Ptr, pass: U32, hist: Ptr,
    }

    /// One pass's choice of digit of the composite select (`hg_select_pick`, one thread).
    struct SelectPick for ["hg_select_pick"] {
        hist: Ptr, state: Ptr, pass: U32,
    }

    /// The k pairs at or below the selected composite (`hg_select_collect`).
    struct SelectCollect for ["hg_select_collect"] {
        keys: Ptr, slots: Ptr, n: U32, state: Ptr, out_keys: Ptr, out_slots: Ptr,
    }

    /// One compare-exchange step of a bitonic sort (`hg_bitonic_step`).
    struct BitonicStep for ["hg_bitonic_step"] {
        keys: Ptr, slots: Ptr, n: U32, size: U32, stride: U32,
    }

    /// The first k sorted pairs as one query's results (`hg_write_results`).
    struct WriteResults for ["hg_write_results"] {
        keys: Ptr, slots: Ptr, k: U32, out_slots: Ptr, out_dist: Ptr, flag: Ptr,
    }

    /// The k best of each query over several lists written by the searches of a sharded
    /// storage's members (`hg_merge_lists`).
    struct MergeLists for ["hg_merge_lists"] {
        slots: Ptr, dist: Ptr, offsets: Ptr, widths: Ptr, lists: U32, nq: U32, k: U32,
        out_lists: Ptr, out_slots: Ptr, out_dist: Ptr, tied: Ptr,
    }

    /// Squared norms of `count` rows from `first` (`hg_norms`).
    struct Norms for [
        "hg_norms_f32", "hg_norms_f16", "hg_norms_bf16", "hg_norms_i8", "hg_norms_u8",
    ] {
        rows: Ptr, dim: U32, first: U32, count: U32, norms: Ptr,
    }

    /// `dst[i] = src[keep[i]]` for rows of `row_bytes` bytes, norms alongside (`hg_gather`).
    struct Gather for ["hg_gather"] {
        src: Ptr, dst: Ptr, row_bytes: U64, keep: Ptr, count: U32, norms_src: Ptr, norms_dst: Ptr,
    }

    /// Each point's nearest row by direct f32 differences, with the runner-up's distance for
    /// the host's proof of the pick (`hg_nearest_rows`).
    struct NearestRows for ["hg_nearest_rows"] {
        rows: Ptr, n: U32, dim: U32, points: Ptr, count: U32, nearest: Ptr, first: Ptr, second: Ptr,
    }

    /// Every `stride`-th norm, the norms of a sample (`hg_strided_norms`).
    struct StridedNorms for ["hg_strided_norms"] {
        norms: Ptr, stride: U32, count: U32, out: Ptr,
    }

    /// The engine's own `C = A^T B` where no BLAS runs it (`hg_gemm_tn`).
    struct GemmTnParams for ["hg_gemm_tn_f32", "hg_gemm_tn_f16"] {
        a: Ptr, lda: U32, b: Ptr, ldb: U32, c: Ptr, ldc: U32, m: U32, n: U32, k: U32,
    }

    /// A tile of rows of any stored type against a tile of f32 queries: L1 or L-infinity
    /// distances, else dot products, laid out as `GemmTnParams`' products (`hg_tiles`).
    struct Tiles for ["hg_tiles_f32", "hg_tiles_f16", "hg_tiles_bf16", "hg_tiles_i8", "hg_tiles_u8"] {
        a: Ptr, lda: U32, b: Ptr, ldb: U32, c: Ptr, ldc: U32, m: U32, n: U32, k: U32, metric: I32,
    }

    /// The tensor-core filter: every row against a tile of queries, candidates under each
    /// query's threshold (`hg_mma_filter`).
    struct MmaFilter for ["hg_mma_filter_tf32", "hg_mma_filter_f16", "hg_mma_filter_f32h"] {
        rows: Ptr, norms: Ptr, dead: Ptr, n: U32, tiles: U32, dim: U32, queries: Ptr, nq: U32,
        inv_scale: Ptr, row_scale: F32, tau: Ptr, metric: I32, cap: U32, cand: Ptr, counts: Ptr,
        evicted: Ptr,
    }

    /// Byte rows widened to an exact f16 copy (`hg_widen_bytes_f16`).
    struct WidenBytes for ["hg_widen_bytes_f16"] {
        rows: Ptr, out: Ptr, quads: U64, is_signed: I32,
    }

    /// f32 rows scaled and rounded to an f16 copy (`hg_round_rows_f16`).
    struct RoundRows for ["hg_round_rows_f16", "hg_round_bf16_rows_f16"] {
        rows: Ptr, out: Ptr, quads: U64, scale: F32,
    }
}

/// The radix-select state of `kernels/search.cu` (`state` of `hg_radix_*`), as read back.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RadixState {
    /// Bits of the selected distance key fixed so far.
    pub(crate) prefix: u32,
    /// Which bits of the key `prefix` fixes.
    pub(crate) mask: u32,
    /// Rank still to find inside the prefix.
    pub(crate) remaining: u32,
    /// Candidates `hg_radix_collect` kept.
    pub(crate) count: u32,
}

/// The composite select's state of `kernels/search.cu` (`state` of `hg_select_*`), as read
/// back.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct SelectState {
    /// Bits of the k-th key fixed so far (low word, high word).
    pub(crate) key_prefix: [u32; 2],
    /// Which key bits the prefix fixes (low word, high word).
    pub(crate) key_mask: [u32; 2],
    /// Bits of the k-th slot fixed so far.
    pub(crate) slot_prefix: u32,
    /// Which slot bits the prefix fixes.
    pub(crate) slot_mask: u32,
    /// Rank still to find inside the prefix.
    pub(crate) remaining: u32,
    /// Pairs `hg_select_collect` kept.
    pub(crate) count: u32,
}

/// A `T` read from the start of `bytes` (a device copy in host memory, of any alignment).
pub(crate) fn read_back<T: bytemuck::Pod>(bytes: &[u8]) -> Result<T> {
    let size = std::mem::size_of::<T>();
    bytes.get(..size).map(bytemuck::pod_read_unaligned).ok_or_else(|| {
        crate::error::HiveGpuError::Internal(format!("a read back of {} bytes, {size} expected", bytes.len()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(name, parameters)` of every `extern "C" __global__` kernel in `source`.
    fn source_kernels(source: &str) -> Vec<(String, Vec<(String, ArgKind)>)> {
        let mut found = Vec::new();
        let mut rest = source;
        while let Some(at) = rest.find("extern \"C\" __global__ void") {
            rest = &rest[at + "extern \"C\" __global__ void".len()..];
            let open = rest.find('(').expect("a kernel's parameter list");
            let mut head = &rest[..open];
            // `__launch_bounds__(...)` comes before the name.
            let mut after = open;
            if head.contains("__launch_bounds__") {
                let close = rest.find(')').expect("launch bounds closed");
                let open2 = close + rest[close..].find('(').expect("a kernel's parameter list");
                head = &rest[close + 1..open2];
                after = open2;
            }
            let name = head.trim().to_string();
            let close = after + rest[after..].find(')').expect("a parameter list closed");
            let params = rest[after + 1..close]
                .split(',')
                .map(|p| {
                    let words: Vec<&str> = p.split_whitespace().collect();
                    let (last, types) = words.split_last().expect("a named parameter");
                    let pointer = last.starts_with('*') || types.last().is_some_and(|t| t.ends_with('*'));
                    let name = last.trim_start_matches('*').to_string();
                    let kind = if pointer {
                        ArgKind::Ptr
                    } else {
                        match types
                            .iter()
                            .copied()
                            .filter(|t| *t != "const")
                            .collect::<Vec<_>>()
                            .join(" ")
                            .as_str()
                        {
                            "u32" | "unsigned int" | "unsigned" => ArgKind::U32,
                            "int" => ArgKind::I32,
                            "u64" | "unsigned long long" => ArgKind::U64,
                            "float" => ArgKind::F32,
                            "double" => ArgKind::F64,
                            other => panic!("kernel {name}: parameter type {other:?} has no ArgKind"),
                        }
                    };
                    (name, kind)
                })
                .collect();
            found.push((name, params));
            rest = &rest[close..];
        }
        found
    }

    fn all_sources() -> String {
        super::super::kernels::source("", 32, true)
    }

    #[test]
    fn declared_signatures_match_the_kernel_sources() {
        let kernels = source_kernels(&all_sources());
        assert!(kernels.len() >= 27, "found only {} kernels in the sources", kernels.len());
        for (name, params) in &kernels {
            let declared = DECLARED
                .iter()
                .find(|(names, _)| names.contains(&name.as_str()))
                .unwrap_or_else(|| panic!("kernel {name} has no parameter struct in abi.rs"));
            let declared: Vec<(String, ArgKind)> =
                declared.1.iter().map(|(n, k)| (n.to_string(), *k)).collect();
            assert_eq!(&declared, params, "kernel {name}: abi.rs and the source disagree");
        }
        for (names, _) in DECLARED {
            for name in *names {
                assert!(
                    kernels.iter().any(|(k, _)| k == name),
                    "abi.rs declares {name}, which no source defines"
                );
            }
        }
    }

    #[test]
    fn the_signature_reader_sees_a_swapped_parameter() {
        // The check above is only as good as the reader: a kernel whose two parameters changed
        // places must read differently.
        let a = source_kernels("extern \"C\" __global__ void hg_x(const float* rows, u32 n, int metric) {}");
        let b = source_kernels("extern \"C\" __global__ void hg_x(const float* rows, int metric, u32 n) {}");
        assert_eq!(
            a[0].1,
            vec![("rows".into(), ArgKind::Ptr), ("n".into(), ArgKind::U32), ("metric".into(), ArgKind::I32)]
        );
        assert_ne!(a, b);
        let bounded = source_kernels(
            "extern \"C\" __global__ void __launch_bounds__(HG_BLOCK, 2) hg_y(u64* keys, double q_norm) {}",
        );
        assert_eq!(
            bounded,
            vec![("hg_y".into(), vec![("keys".into(), ArgKind::Ptr), ("q_norm".into(), ArgKind::F64)])]
        );
    }

    #[test]
    fn read_back_states_have_the_kernels_word_layout() {
        // `hg_radix_*` index state as {prefix, mask, remaining, count}; `hg_select_*` as
        // {key prefix lo, hi, key mask lo, hi, slot prefix, slot mask, remaining, count}.
        assert_eq!(std::mem::offset_of!(RadixState, count), 3 * 4);
        assert_eq!(std::mem::offset_of!(SelectState, slot_prefix), 4 * 4);
        assert_eq!(std::mem::offset_of!(SelectState, count), 7 * 4);
        let words: Vec<u8> = (0u32..8).flat_map(|w| w.to_ne_bytes()).collect();
        let state: SelectState = read_back(&words).expect("32 bytes");
        assert_eq!((state.key_mask, state.remaining, state.count), ([2, 3], 6, 7));
        assert!(read_back::<SelectState>(&words[..31]).is_err());
        // A copy in host memory need not be aligned for the struct.
        let shifted = [&[0u8][..], &words].concat();
        assert_eq!(read_back::<SelectState>(&shifted[1..]).expect("32 bytes").count, 7);
    }
}
