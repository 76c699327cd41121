//! What every backend shares, so that no backend imports another: the error bound of an f32
//! distance and the candidate gates built on it, the sample plan of the filtered batch paths,
//! the metric codes the kernels take, the stored element types (`elements`), the f64
//! squared norm the re-ranks and gates use, and the check that values are finite.
//!
//! Still outside: wgpu keeps an exact host copy of its rows for the f64 re-rank and for
//! answering on the host while its device copy is stale; that copy is the CPU backend's row
//! store (`backend::cpu::rows::CpuRows`), the one dependency of a backend on another left.

pub(crate) mod elements;
pub(crate) mod error;
pub(crate) mod gates;
pub(crate) mod lanes;
pub(crate) mod plan;
pub(crate) mod products;

pub(crate) use error::ErrorBound;

use crate::types::GpuDistanceMetric;

/// The code a kernel (CUDA, HIP or WGSL) takes for a metric.
pub(crate) fn metric_code(metric: GpuDistanceMetric) -> i32 {
    match metric {
        GpuDistanceMetric::Euclidean => 0,
        GpuDistanceMetric::DotProduct => 1,
        GpuDistanceMetric::Cosine => 2,
        GpuDistanceMetric::Manhattan => 3,
        GpuDistanceMetric::Chebyshev => 4,
    }
}

/// Whether every value is finite, in one pass without a branch per value (it vectorizes): how
/// a collection checks the vectors it is given and every backend the queries it searches.
pub(crate) fn all_finite(values: &[f32]) -> bool {
    const EXPONENT: u32 = 0x7f80_0000;
    values.iter().fold(0u32, |bad, x| bad | u32::from(x.to_bits() & EXPONENT == EXPONENT)) == 0
}

/// `|v|^2` in f64, exact enough to bound the f32 arithmetic of every backend.
pub(crate) fn squared_norm_f64(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum()
}
