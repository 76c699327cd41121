//! The kernel sources (`kernels/*.cu`, one set for CUDA and HIP) and their loaded functions.

use super::abi::*;
use super::driver::Driver;
use crate::error::Result;

/// Threads per block of every kernel.
pub(crate) const BLOCK: u32 = 256;

/// Queries that probe one inverted list scored together by one block of `hg_list_topk` (each
/// row read once for all of them), at most.
pub(crate) const LIST_GROUP: usize = 8;
// The kernel keeps one bit per query of a group (`hg_list_merges`, at most 32) and spreads a
// group's queries over the 8 lanes that share a row (`hg_group_distances4`, at most 8).
const _: () = assert!(LIST_GROUP >= 1 && LIST_GROUP <= 8);

const COMMON: &str = include_str!("kernels/common.cuh");
const SEARCH: &str = include_str!("kernels/search.cu");
const ROWS: &str = include_str!("kernels/rows.cu");
const GEMM: &str = include_str!("kernels/gemm.cu");
const FUSED: &str = include_str!("kernels/fused.cu");
const LISTS: &str = include_str!("kernels/lists.cu");
const CODES: &str = include_str!("kernels/codes.cu");
const MERGE: &str = include_str!("kernels/merge.cu");
const NEAREST: &str = include_str!("kernels/nearest.cu");
const FEW: &str = include_str!("kernels/few.cu");

/// Kernels only devices with [`Driver::tensor_cores`] compile (`kernels/fused.cu`).
pub(crate) const TENSOR_NAMES: &[&str] = &[
    "hg_mma_filter_tf32",
    "hg_mma_filter_f16",
    "hg_mma_filter_f32h",
    "hg_round_rows_f16",
    "hg_widen_bytes_f16",
    "hg_round_bf16_rows_f16",
];

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

/// Rows one `hg_few_topk` block covers, defined for the kernels as `HG_FEW_ROWS` by
/// [`source`] (a multiple of 8: the block ranks its rows eight keys a step).
pub(crate) const FEW_ROWS: usize = 32;

/// Threads of one `hg_few_topk` block, defined for the kernels as `HG_FEW_THREADS` by [`source`].
pub(crate) const FEW_THREADS: u32 = 128;

/// Rows (and queries) one `hg_mma_filter` block covers.
pub(crate) const MMA_TILE: usize = 128;

/// The full program for a device with `warp` threads per warp: defines, the vendor prelude
/// (its shuffle intrinsic), then the shared sources, and the tensor-core kernels if `tensor`.
pub(crate) fn source(prelude: &str, warp: u32, tensor: bool) -> String {
    let fused = if tensor { FUSED } else { "" };
    format!(
        "#define HG_WARP {warp}\n#define HG_BLOCK {BLOCK}\n#define HG_LIST_GROUP {LIST_GROUP}\n#define HG_MERGE_LISTS {MERGE_LISTS}\n#define HG_FEW_ROWS {FEW_ROWS}\n#define HG_FEW_THREADS {FEW_THREADS}\n{prelude}\n{COMMON}\n{SEARCH}\n{FEW}\n{LISTS}\n{CODES}\n{MERGE}\n{NEAREST}\n{ROWS}\n{GEMM}\n{fused}\n"
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
    /// Byte rows widened to an exact f16 copy, for the f16 filter and tiles.
    pub(crate) widen_bytes: Kernel<F, WidenBytes>,
    /// bf16 rows scaled and rounded to an f16 copy, for the f16 filter.
    pub(crate) round_bf16_rows: Kernel<F, RoundRows>,
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
        const _: () = assert!(declares(<WidenBytes as KernelParams>::KERNELS, TENSOR_NAMES[4]));
        const _: () = assert!(declares(<RoundRows as KernelParams>::KERNELS, TENSOR_NAMES[5]));

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
                        widen_bytes: Kernel::new(next()?),
                        round_bf16_rows: Kernel::new(next()?),
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
    scan_topk_bf16: ScanTopk,
    scan_topk_i8: ScanTopk,
    scan_topk_u8: ScanTopk,
    list_topk_f32: ListTopk,
    list_topk_f16: ListTopk,
    scan_all_f32: ScanAll,
    scan_all_f16: ScanAll,
    scan_all_bf16: ScanAll,
    scan_all_i8: ScanAll,
    scan_all_u8: ScanAll,
    tile_topk: TileTopk,
    sample_tau: SampleTau,
    finalize_f32: Finalize,
    finalize_f16: Finalize,
    finalize_bf16: Finalize,
    finalize_i8: Finalize,
    finalize_u8: Finalize,
    few_topk_f32: FewTopk,
    few_topk_f16: FewTopk,
    few_topk_bf16: FewTopk,
    few_topk_i8: FewTopk,
    few_topk_u8: FewTopk,
    radix_hist: RadixHist,
    radix_pick: RadixPick,
    radix_collect: RadixCollect,
    rerank_list_f32: RerankList,
    rerank_list_f16: RerankList,
    rerank_list_bf16: RerankList,
    rerank_list_i8: RerankList,
    rerank_list_u8: RerankList,
    refine_lists_f32: RefineLists,
    refine_lists_f16: RefineLists,
    refine_lists_bf16: RefineLists,
    refine_lists_i8: RefineLists,
    refine_lists_u8: RefineLists,
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
    norms_bf16: Norms,
    norms_i8: Norms,
    norms_u8: Norms,
    gather: Gather,
    nearest_rows: NearestRows,
    strided_norms: StridedNorms,
    gemm_tn_f32: GemmTnParams,
    gemm_tn_f16: GemmTnParams,
    tiles_f32: Tiles,
    tiles_f16: Tiles,
    tiles_bf16: Tiles,
    tiles_i8: Tiles,
    tiles_u8: Tiles,
);

/// One kernel per stored element type, picked by a collection's precision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PerElement<K> {
    pub(crate) f32: K,
    pub(crate) f16: K,
    pub(crate) bf16: K,
    pub(crate) i8: K,
    pub(crate) u8: K,
}

impl<K: Copy> PerElement<K> {
    /// The kernel for rows stored as `precision`.
    pub(crate) fn get(&self, precision: crate::types::StoragePrecision) -> K {
        use crate::types::StoragePrecision as P;
        match precision {
            P::F32 => self.f32,
            P::F16 => self.f16,
            P::Bf16 => self.bf16,
            P::I8 => self.i8,
            P::U8 => self.u8,
        }
    }
}

impl<D: Driver> Kernels<D> {
    /// `hg_scan_topk` for each stored element type.
    pub(crate) fn scan_topk(&self) -> PerElement<Kernel<D::Function, ScanTopk>> {
        PerElement {
            f32: self.scan_topk_f32,
            f16: self.scan_topk_f16,
            bf16: self.scan_topk_bf16,
            i8: self.scan_topk_i8,
            u8: self.scan_topk_u8,
        }
    }

    /// `hg_scan_all` for each stored element type.
    pub(crate) fn scan_all(&self) -> PerElement<Kernel<D::Function, ScanAll>> {
        PerElement {
            f32: self.scan_all_f32,
            f16: self.scan_all_f16,
            bf16: self.scan_all_bf16,
            i8: self.scan_all_i8,
            u8: self.scan_all_u8,
        }
    }

    /// `hg_finalize` for each stored element type.
    pub(crate) fn finalize(&self) -> PerElement<Kernel<D::Function, Finalize>> {
        PerElement {
            f32: self.finalize_f32,
            f16: self.finalize_f16,
            bf16: self.finalize_bf16,
            i8: self.finalize_i8,
            u8: self.finalize_u8,
        }
    }

    /// `hg_few_topk` for each stored element type.
    pub(crate) fn few_topk(&self) -> PerElement<Kernel<D::Function, FewTopk>> {
        PerElement {
            f32: self.few_topk_f32,
            f16: self.few_topk_f16,
            bf16: self.few_topk_bf16,
            i8: self.few_topk_i8,
            u8: self.few_topk_u8,
        }
    }

    /// `hg_rerank_list` for each stored element type.
    pub(crate) fn rerank_list(&self) -> PerElement<Kernel<D::Function, RerankList>> {
        PerElement {
            f32: self.rerank_list_f32,
            f16: self.rerank_list_f16,
            bf16: self.rerank_list_bf16,
            i8: self.rerank_list_i8,
            u8: self.rerank_list_u8,
        }
    }

    /// `hg_refine_lists` for each stored element type.
    pub(crate) fn refine_lists(&self) -> PerElement<Kernel<D::Function, RefineLists>> {
        PerElement {
            f32: self.refine_lists_f32,
            f16: self.refine_lists_f16,
            bf16: self.refine_lists_bf16,
            i8: self.refine_lists_i8,
            u8: self.refine_lists_u8,
        }
    }

    /// `hg_norms` for each stored element type.
    pub(crate) fn norms(&self) -> PerElement<Kernel<D::Function, Norms>> {
        PerElement {
            f32: self.norms_f32,
            f16: self.norms_f16,
            bf16: self.norms_bf16,
            i8: self.norms_i8,
            u8: self.norms_u8,
        }
    }

    /// `hg_tiles` for each stored element type.
    pub(crate) fn tiles(&self) -> PerElement<Kernel<D::Function, Tiles>> {
        PerElement {
            f32: self.tiles_f32,
            f16: self.tiles_f16,
            bf16: self.tiles_bf16,
            i8: self.tiles_i8,
            u8: self.tiles_u8,
        }
    }
}
