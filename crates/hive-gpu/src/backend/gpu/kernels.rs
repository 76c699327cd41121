//! The kernel sources (`kernels/*.cu`, one set for CUDA and HIP) and their loaded functions.

use super::abi::*;
use super::driver::Driver;
use crate::error::Result;

/// Threads per block of every kernel.
pub(crate) const BLOCK: u32 = 256;

/// Queries that probe one inverted list scored together by one block of `hg_list_topk` (each
/// row read once for all of them), at most.
pub(crate) const LIST_GROUP: usize = 8;
// The kernel keeps one bit per query of a group (`hg_list_merges`).
const _: () = assert!(LIST_GROUP >= 1 && LIST_GROUP <= 32);

const COMMON: &str = include_str!("kernels/common.cuh");
const SEARCH: &str = include_str!("kernels/search.cu");
const ROWS: &str = include_str!("kernels/rows.cu");
const GEMM: &str = include_str!("kernels/gemm.cu");
const FUSED: &str = include_str!("kernels/fused.cu");
const LISTS: &str = include_str!("kernels/lists.cu");
const CODES: &str = include_str!("kernels/codes.cu");
const MERGE: &str = include_str!("kernels/merge.cu");

/// Kernels only devices with [`Driver::tensor_cores`] compile (`kernels/fused.cu`).
pub(crate) const TENSOR_NAMES: &[&str] =
    &["hg_mma_filter_tf32", "hg_mma_filter_f16", "hg_mma_filter_f32h", "hg_round_rows_f16"];

/// Dynamic shared memory of the `hg_mma_filter` kernels for stored elements of `row_element`
/// bytes multiplied as `operand_element` bytes, rows of `dim` of them: the resident query tile
/// (128 lines of whole 128-byte steps of operands plus 4 words), the staged steps of 128 rows
/// (36 words each, the last 4 holding norms; 2 stages on TF32, else 3) and, where f32 rows are
/// multiplied in f16, two f16 buffers of 128 lines of 20 words, as `kernels/fused.cu` lays
/// them out.
pub(crate) fn mma_shared_bytes(row_element: usize, operand_element: usize, dim: usize) -> usize {
    let query_pitch = (operand_element * dim).div_ceil(128) * 32 + 4;
    let stages = if row_element == 4 && operand_element == 4 { 2 } else { 3 };
    let halves = if row_element == operand_element { 0 } else { 2 * 20 };
    (MMA_TILE * query_pitch + stages * MMA_TILE * 36 + halves * MMA_TILE) * 4
}

/// Most lists `hg_merge_lists` merges (`kernels/merge.cu`'s `HG_MERGE_LISTS`).
pub(crate) const MERGE_LISTS: usize = 64;

/// Rows (and queries) one `hg_mma_filter` block covers.
pub(crate) const MMA_TILE: usize = 128;

/// The full program for a device with `warp` threads per warp: defines, the vendor prelude
/// (its shuffle intrinsic), then the shared sources, and the tensor-core kernels if `tensor`.
pub(crate) fn source(prelude: &str, warp: u32, tensor: bool) -> String {
    let fused = if tensor { FUSED } else { "" };
    format!(
        "#define HG_WARP {warp}\n#define HG_BLOCK {BLOCK}\n#define HG_LIST_GROUP {LIST_GROUP}\n#define HG_MERGE_LISTS {MERGE_LISTS}\n{prelude}\n{COMMON}\n{SEARCH}\n{LISTS}\n{CODES}\n{MERGE}\n{ROWS}\n{GEMM}\n{fused}\n"
    )
}

/// The tensor-core kernels of `kernels/fused.cu`.
#[derive(Debug)]
pub(crate) struct TensorKernels<F> {
    /// Filter over f32 rows on TF32 tensor cores.
    pub(crate) tf32: Kernel<F, MmaFilter>,
    /// Filter over f16 rows on f16 tensor cores.
    pub(crate) f16: Kernel<F, MmaFilter>,
    /// Filter over f32 rows rounded to f16 on the device, on f16 tensor cores.
    pub(crate) f32h: Kernel<F, MmaFilter>,
    /// f32 rows scaled and rounded to an f16 copy, for the f16 filter.
    pub(crate) round_rows: Kernel<F, RoundRows>,
}

macro_rules! kernel_table {
    ($($field:ident: $params:ident),* $(,)?) => {
        /// Every kernel of the engine, loaded for one device, each typed by its parameter
        /// struct (`abi.rs`).
        #[derive(Debug)]
        pub(crate) struct Kernels<D: Driver> {
            $(pub(crate) $field: Kernel<D::Function, $params>,)*
            /// Present on devices with [`Driver::tensor_cores`].
            pub(crate) tensor: Option<TensorKernels<D::Function>>,
        }

        // Each kernel is loaded with the struct whose declaration names it.
        $(const _: () = assert!(
            declares(<$params as KernelParams>::KERNELS, concat!("hg_", stringify!($field))),
            concat!("hg_", stringify!($field), " is not declared by ", stringify!($params))
        );)*
        const _: () = assert!(declares(<MmaFilter as KernelParams>::KERNELS, TENSOR_NAMES[0]));
        const _: () = assert!(declares(<MmaFilter as KernelParams>::KERNELS, TENSOR_NAMES[1]));
        const _: () = assert!(declares(<MmaFilter as KernelParams>::KERNELS, TENSOR_NAMES[2]));
        const _: () = assert!(declares(<RoundRows as KernelParams>::KERNELS, TENSOR_NAMES[3]));

        impl<D: Driver> Kernels<D> {
            /// Kernel names, in the order of the table.
            pub(crate) const NAMES: &'static [&'static str] = &[$(concat!("hg_", stringify!($field)),)*];

            /// Compiles the sources for `driver`'s device and loads every kernel.
            pub(crate) fn compile(driver: &D, prelude: &str) -> Result<Self> {
                let tensor = driver.tensor_cores();
                let mut names = Self::NAMES.to_vec();
                if tensor {
                    names.extend_from_slice(TENSOR_NAMES);
                }
                let functions = driver.compile(&source(prelude, driver.warp_size(), tensor), &names)?;
                let mut it = functions.into_iter();
                let mut next = || it.next().ok_or_else(|| crate::error::HiveGpuError::Internal("kernel table".into()));
                $(let $field = Kernel::new(next()?);)*
                let tensor = if tensor {
                    Some(TensorKernels {
                        tf32: Kernel::new(next()?),
                        f16: Kernel::new(next()?),
                        f32h: Kernel::new(next()?),
                        round_rows: Kernel::new(next()?),
                    })
                } else {
                    None
                };
                Ok(Self { $($field,)* tensor })
            }
        }
    };
}

kernel_table!(
    scan_topk_f32: ScanTopk,
    scan_topk_f16: ScanTopk,
    list_topk_f32: ListTopk,
    list_topk_f16: ListTopk,
    scan_all_f32: ScanAll,
    scan_all_f16: ScanAll,
    tile_topk: TileTopk,
    finalize_f32: Finalize,
    finalize_f16: Finalize,
    radix_hist: RadixHist,
    radix_pick: RadixPick,
    radix_collect: RadixCollect,
    rerank_list_f32: RerankList,
    rerank_list_f16: RerankList,
    refine_lists_f32: RefineLists,
    refine_lists_f16: RefineLists,
    sq8_scan: Sq8ListScan,
    pq_scan: PqListScan,
    bits_scan: BitsListScan,
    select_hist: SelectHist,
    select_pick: SelectPick,
    select_collect: SelectCollect,
    bitonic_step: BitonicStep,
    write_results: WriteResults,
    merge_lists: MergeLists,
    norms_f32: Norms,
    norms_f16: Norms,
    gather: Gather,
    strided_norms: StridedNorms,
    gemm_tn_f32: GemmTnParams,
    gemm_tn_f16: GemmTnParams,
    differences_f32: Differences,
    differences_f16: Differences,
);
