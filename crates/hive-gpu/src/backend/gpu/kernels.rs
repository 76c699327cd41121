//! The kernel sources (`kernels/*.cu`, one set for CUDA and HIP) and their loaded functions.

use super::driver::Driver;
use crate::error::Result;

/// Threads per block of every kernel.
pub(crate) const BLOCK: u32 = 256;

const COMMON: &str = include_str!("kernels/common.cuh");
const SEARCH: &str = include_str!("kernels/search.cu");
const ROWS: &str = include_str!("kernels/rows.cu");
const GEMM: &str = include_str!("kernels/gemm.cu");

/// The full program for a device with `warp` threads per warp: defines, the vendor prelude
/// (its shuffle intrinsic), then the shared sources.
pub(crate) fn source(prelude: &str, warp: u32) -> String {
    format!(
        "#define HG_WARP {warp}\n#define HG_BLOCK {BLOCK}\n{prelude}\n{COMMON}\n{SEARCH}\n{ROWS}\n{GEMM}\n"
    )
}

macro_rules! kernel_table {
    ($($field:ident),* $(,)?) => {
        /// Every kernel of the engine, loaded for one device.
        #[derive(Debug)]
        pub(crate) struct Kernels<D: Driver> {
            $(pub(crate) $field: D::Function,)*
        }

        impl<D: Driver> Kernels<D> {
            /// Kernel names, in the order of the table.
            pub(crate) const NAMES: &'static [&'static str] = &[$(concat!("hg_", stringify!($field)),)*];

            /// Compiles the sources for `driver`'s device and loads every kernel.
            pub(crate) fn compile(driver: &D, prelude: &str) -> Result<Self> {
                let functions = driver.compile(&source(prelude, driver.warp_size()), Self::NAMES)?;
                let mut it = functions.into_iter();
                let mut next = || it.next().ok_or_else(|| crate::error::HiveGpuError::Internal("kernel table".into()));
                Ok(Self { $($field: next()?,)* })
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
    bitonic_step,
    write_results,
    norms_f32,
    norms_f16,
    gather,
    gemm_tn_f32,
    gemm_tn_f16,
);
