//! The candidate gate of each GPU search path: rows whose approximate distance `a` exceeds
//! `a_k * mul + add` (with `a_k` the k-th best approximate distance) cannot be among the
//! true k nearest, by the same argument as the CPU backend's collector (`backend/cpu/topk.rs`): with every
//! approximate distance within `E` of the true one, true top-k rows satisfy `a <= a_k + 2E`.
//! Where `E` is relative to the distance itself (sums of non-negative terms: L2 by differences,
//! L1; the maximum of rounded differences: L-infinity), `|a - d| <= g d` gives
//! `d_k <= a_k / (1 - g)` and `a <= (1 + g) d`, so true top-k rows satisfy
//! `a <= a_k (1 + g) / (1 - g)`: the gate's `mul`.

use crate::exact::ErrorBound;
use crate::types::GpuDistanceMetric;

/// How the approximate distances of a path are computed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Approximation {
    /// The scan kernel: f32 sums (L2 as a sum of squared differences).
    Scan,
    /// GEMM dot products in f32 without tensor-core shortcuts.
    GemmF32,
    /// GEMM on TF32 tensor cores.
    GemmTf32,
    /// GEMM on f16 tensor cores with the query scaled by `scale` (a power of two).
    GemmF16 { scale: f64 },
    /// f16 tensor cores over f32 rows: the query scaled by `scale` and rounded to nearest f16
    /// on the host, the rows scaled by `row_scale` (powers of two) and rounded to nearest f16
    /// on the device (CUDA's `cvt.rn`, subnormals kept); `least_row_norm` is at most every
    /// stored row's norm (0 where unknown): cosine divides the rows' rounding floor by it.
    RoundedF16 { scale: f64, row_scale: f64, least_row_norm: f64 },
    /// wgpu cooperative matrices: f16 operands, the query scaled by `scale` (a power of two);
    /// with `rows_rounded`, f32 rows are rounded to f16 too. Any f16 subnormal may be flushed.
    // Only the wgpu backend plans it.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    CoopF16 { scale: f64, rows_rounded: bool },
}

/// `(mul, add)` of the gate for one query, given the query's norm (of the vector the kernels
/// see: unit for cosine), the largest stored squared norm and the dimension.
pub(crate) fn gate(
    metric: GpuDistanceMetric,
    path: Approximation,
    q_norm: f64,
    max_sq_norm: f64,
    dim: usize,
) -> (f32, f32) {
    let u = f64::from(f32::EPSILON) / 2.0;
    let gamma = f64::from(ErrorBound::gamma(dim));
    let d = dim as f64;
    let r = max_sq_norm.sqrt();
    // Subnormal inputs or products flushed to zero lose at most 2^-126 times the other
    // operand's size each; cosine then scales by 1/|x| <= 1e18 (stored cosine rows have
    // |x| >= 1e-18).
    let tiny =
        d * 1.2e-38 * (1.0 + q_norm + r) + if metric == GpuDistanceMetric::Cosine { d * 2e-20 } else { 0.0 };
    // Relative error of one dot product's inputs and accumulation, per path.
    let product = match path {
        Approximation::Scan | Approximation::GemmF32 => gamma,
        // Operands truncated to 10 mantissa bits, accumulation possibly truncating.
        Approximation::GemmTf32 => 2.0 * 2f64.powi(-10) + 2f64.powi(-20) + 2.0 * gamma,
        Approximation::GemmF16 { .. } | Approximation::CoopF16 { rows_rounded: false, .. } => {
            2f64.powi(-11) * (1.0 + 2f64.powi(-11)) + 2.0 * gamma
        }
        // Both operands rounded to nearest: (1 + 2^-11)^2 - 1.
        Approximation::RoundedF16 { .. } => 2f64.powi(-10) + 2f64.powi(-22) + 2.0 * gamma,
        // The query rounded to nearest on the host (2^-11); rows converted on the device, where
        // WGSL and Vulkan allow either neighbouring f16 (2^-10): (1 + 2^-11)(1 + 2^-10) - 1.
        Approximation::CoopF16 { rows_rounded: true, .. } => {
            2f64.powi(-10) + 2f64.powi(-11) + 2f64.powi(-21) + 2.0 * gamma
        }
    };
    // f16 query rounding below the subnormal step: 2^-25 per component of the scaled query,
    // or 2^-14 where subnormals may be flushed.
    let f16_floor = |norm_x: f64| match path {
        Approximation::GemmF16 { scale } | Approximation::RoundedF16 { scale, .. } => {
            2f64.powi(-25) * d.sqrt() * norm_x / scale
        }
        Approximation::CoopF16 { scale, .. } => 2f64.powi(-14) * d.sqrt() * norm_x / scale,
        _ => 0.0,
    };
    if metric.is_difference_norm() || (path == Approximation::Scan && metric == GpuDistanceMetric::Euclidean)
    {
        // A sum (L2 by differences, L1) or a maximum (L-infinity) of non-negative terms, each
        // one rounded difference and at most one rounded product: the error is relative to the
        // distance itself. L1 and L-infinity take no other path (no product form), so every
        // kernel computes them this way, f16 rows widened exactly.
        let mul = (1.0 + gamma) / (1.0 - gamma) * (1.0 + 1e-6);
        return (mul as f32, (4.0 * tiny * 1.01) as f32);
    }
    // Rows rounded to f16 on the device: the same floor for each row component, 2^-25 of the
    // scaled row, against the query. Cosine then divides by the kernel's root of the row's f32
    // norm, at least `least_row_norm` and at least 1e-18 (stored cosine rows), less a rounding
    // the 1% covers.
    let (row_floor, cosine_divisor) = match path {
        Approximation::RoundedF16 { row_scale, least_row_norm, .. } => {
            (2f64.powi(-25) * d.sqrt() * q_norm / row_scale, (1.01 / least_row_norm).min(1e18))
        }
        _ => (0.0, 0.0),
    };
    let error = match metric {
        GpuDistanceMetric::Euclidean => {
            2.0 * (product * q_norm * r + f16_floor(r) + row_floor) + gamma * max_sq_norm
        }
        GpuDistanceMetric::DotProduct => product * q_norm * r + f16_floor(r) + row_floor,
        GpuDistanceMetric::Cosine => product * q_norm + f16_floor(1.0) + 4.0 * u + row_floor * cosine_divisor,
        // Returned above.
        GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => 0.0,
    };
    let add = 2.0 * (error + tiny) * 1.01;
    (1.0, (add * (1.0 + 1e-6)) as f32)
}

/// The power of two that brings the query's largest component near 2^15, so its f16 copy
/// neither overflows (65504) nor loses more than it must to subnormals.
pub(crate) fn f16_scale(query: &[f32]) -> f64 {
    f16_scale_below(f64::from(query.iter().fold(0f32, |m, &x| m.max(x.abs()))))
}

/// The power of two that brings values of magnitude up to `max` to at most 2^15 (and above
/// 2^14 where the clamp allows): rows use it with their largest norm.
pub(crate) fn f16_scale_below(max: f64) -> f64 {
    if max == 0.0 {
        return 1.0;
    }
    let exponent = (32768.0 / max).log2().floor() as i32;
    2f64.powi(exponent.clamp(-120, 120))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_scale_keeps_queries_in_range() {
        for max in [1e-30f32, 1e-5, 0.3, 1.0, 1000.0, 65504.0, 1e30] {
            let s = f16_scale(&[max, -max / 3.0]);
            let scaled = f64::from(max) * s;
            assert!((16384.0..=32768.0).contains(&scaled), "max {max}: scaled {scaled}");
        }
        assert_eq!(f16_scale(&[0.0, 0.0]), 1.0);
    }

    #[test]
    fn row_scales_bring_rows_into_range_or_show_they_cannot() {
        // f32 rows' largest norms run up to about 1.8e19; smaller ones down to subnormals.
        for max in [1e-30, 1e-5, 0.5, 1.0, 11.3, 65504.0, 1e19] {
            let scaled = max * f16_scale_below(max);
            assert!((16384.0..=32768.0).contains(&scaled), "max {max:e}: scaled {scaled}");
        }
        assert_eq!(f16_scale_below(0.0), 1.0);
        // A norm that overflowed f32: no scale helps, which the caller sees in the product.
        assert!(f64::INFINITY * f16_scale_below(f64::INFINITY) > 32768.0);
    }

    #[test]
    fn gates_grow_with_precision_loss() {
        let g = |p| gate(GpuDistanceMetric::DotProduct, p, 10.0, 100.0, 128).1;
        assert!(g(Approximation::GemmF32) < g(Approximation::GemmF16 { scale: 1.0 }));
        assert!(g(Approximation::GemmF16 { scale: 1.0 }) < g(Approximation::GemmTf32));
        let coop = |rows_rounded| g(Approximation::CoopF16 { scale: 1024.0, rows_rounded });
        assert!(g(Approximation::GemmF16 { scale: 1024.0 }) <= coop(false));
        assert!(coop(false) < coop(true) && coop(true) < g(Approximation::GemmTf32));
        let rounded = g(Approximation::RoundedF16 { scale: 1024.0, row_scale: 1024.0, least_row_norm: 0.0 });
        assert!(g(Approximation::GemmF16 { scale: 1024.0 }) < rounded && rounded < coop(true));
        let (mul, add) = gate(GpuDistanceMetric::Euclidean, Approximation::Scan, 1.0, 1.0, 128);
        assert!(mul > 1.0 && add >= 0.0);
    }

    #[test]
    fn cosine_on_rounded_rows_beats_tf32_only_where_the_least_row_norm_is_known_and_not_tiny() {
        // The rows' f16 rounding floor is absolute (subnormals), and cosine divides it by each
        // row's norm: a row far smaller than the largest can move by more than TF32's band,
        // so the gate takes the least stored norm, and 0 (unknown) as the 1e-18 cosine floor.
        let g = |p| gate(GpuDistanceMetric::Cosine, p, 1.0, 1e4, 128).1;
        let row_scale = f16_scale_below(100.0);
        let rounded =
            |least| g(Approximation::RoundedF16 { scale: 16384.0, row_scale, least_row_norm: least });
        assert!(rounded(1.0) < g(Approximation::GemmTf32));
        assert!(rounded(1e-12) > g(Approximation::GemmTf32));
        assert!(rounded(0.0).is_finite() && rounded(0.0) >= rounded(1e-12));
    }
}
