//! The kernel sources (`kernels/*.cu`, one set for CUDA and HIP) and their loaded functions.

use super::driver::Driver;
use crate::error::Result;

/// Threads per block of every kernel.
pub(crate) const BLOCK: u32 = 256;

const COMMON: &str = include_str!("kernels/common.cuh");
const SEARCH: &str = include_str!("kernels/search.cu");
const ROWS: &str = include_str!("kernels/rows.cu");
const GEMM: &str = include_str!("kernels/gemm.cu");
const FUSED: &str = include_str!("kernels/fused.cu");

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

/// Rows (and queries) one `hg_mma_filter` block covers.
pub(crate) const MMA_TILE: usize = 128;

/// The full program for a device with `warp` threads per warp: defines, the vendor prelude
/// (its shuffle intrinsic), then the shared sources, and the tensor-core kernels if `tensor`.
pub(crate) fn source(prelude: &str, warp: u32, tensor: bool) -> String {
    let fused = if tensor { FUSED } else { "" };
    format!(
        "#define HG_WARP {warp}\n#define HG_BLOCK {BLOCK}\n{prelude}\n{COMMON}\n{SEARCH}\n{ROWS}\n{GEMM}\n{fused}\n"
    )
}

/// The tensor-core kernels of `kernels/fused.cu`.
#[derive(Debug)]
pub(crate) struct TensorKernels<F> {
    /// Filter over f32 rows on TF32 tensor cores.
    pub(crate) tf32: F,
    /// Filter over f16 rows on f16 tensor cores.
    pub(crate) f16: F,
    /// Filter over f32 rows rounded to f16 on the device, on f16 tensor cores.
    pub(crate) f32h: F,
    /// f32 rows scaled and rounded to an f16 copy, for the f16 filter.
    pub(crate) round_rows: F,
}

macro_rules! kernel_table {
    ($($field:ident),* $(,)?) => {
        /// Every kernel of the engine, loaded for one device.
        #[derive(Debug)]
        pub(crate) struct Kernels<D: Driver> {
            $(pub(crate) $field: D::Function,)*
            /// Present on devices with [`Driver::tensor_cores`].
            pub(crate) tensor: Option<TensorKernels<D::Function>>,
        }

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
                $(let $field = next()?;)*
                let tensor = if tensor { Some(TensorKernels { tf32: next()?, f16: next()?, f32h: next()?, round_rows: next()? }) } else { None };
                Ok(Self { $($field,)* tensor })
            }
        }
    };
}

kernel_table!(
    scan_topk_f32,
    scan_topk_f16,
    scan_all_f32,
    scan_all_f16,
    tile_topk,
    finalize_f32,
    finalize_f16,
    radix_hist,
    radix_pick,
    radix_collect,
    rerank_list_f32,
    rerank_list_f16,
    select_hist,
    select_pick,
    select_collect,
    bitonic_step,
    write_results,
    norms_f32,
    norms_f16,
    gather,
    strided_norms,
    gemm_tn_f32,
    gemm_tn_f16,
);
