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

/// `|v|^2` in f64, exact enough to bound the f32 arithmetic of every backend: the canonical
/// sum in component order, which cosine's exact distance divides by.
pub(crate) fn squared_norm_f64(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum()
}

/// `|v|` for an error bound: f64 squares summed in 8 independent lanes. It differs from the
/// canonical [`squared_norm_f64`] only in the last bits of an f64 (each square of an f32 is
/// exact in f64), far inside any f32 bound, and it has no chain of dependent adds: the
/// canonical sum waits about 4 cycles per component, which over a small search's queries was
/// a tenth of its time (docs/PERFORMANCE.md, "Small searches without serial chains").
pub(crate) fn norm_for_bound(v: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = v.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += f64::from(x) * f64::from(x);
        }
    }
    let tail: f64 = rest.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    (lanes.iter().sum::<f64>() + tail).sqrt()
}

/// `|q|` as the exact distances of `metric` and its error bounds use it: the canonical norm
/// under cosine (its exact distance divides by it), [`norm_for_bound`] under every other
/// metric (their exact distances never read it).
pub(crate) fn query_norm(metric: GpuDistanceMetric, q: &[f32]) -> f64 {
    if metric == GpuDistanceMetric::Cosine { squared_norm_f64(q).sqrt() } else { norm_for_bound(q) }
}
