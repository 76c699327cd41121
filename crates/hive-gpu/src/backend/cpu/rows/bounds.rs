//! The error bound `E` of each kernel's approximate distances: what makes the fast paths exact.
//! See [`super::super::topk`] for why keeping rows within `2E` of the k-th best and
//! re-ranking them in f64 returns exactly the true k nearest.

use super::CpuRows;
use crate::backend::cpu::bf16;
use crate::backend::cpu::topk::ErrorBound;
use crate::types::GpuDistanceMetric;

impl CpuRows {
    /// The error bound of the approximate distances one query sees on `path`.
    pub(super) fn bound(&self, metric: GpuDistanceMetric, q_norm: f32, gemm_path: bool) -> ErrorBound {
        let gamma = ErrorBound::gamma(self.dim);
        let max_norm = self.max_sq_norm.sqrt();
        let tiny = f32::MIN_POSITIVE * self.dim as f32;
        match metric {
            GpuDistanceMetric::Euclidean if gemm_path => ErrorBound {
                absolute: gamma * (2.0 * q_norm * max_norm + self.max_sq_norm) + tiny,
                relative: 0.0,
            },
            // Sums (L1) or maxima (L-infinity) of non-negative terms, each one rounding of a
            // difference: an error relative to the distance itself.
            GpuDistanceMetric::Euclidean | GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => {
                ErrorBound { absolute: tiny, relative: gamma }
            }
            GpuDistanceMetric::DotProduct => {
                ErrorBound { absolute: gamma * q_norm * max_norm + tiny, relative: 0.0 }
            }
            // Products that underflow lose up to 2^-150 each, then get scaled by 1/|x| <= 1e18
            // (stored cosine rows have |x| >= 1e-18).
            GpuDistanceMetric::Cosine => {
                ErrorBound { absolute: gamma * q_norm + self.dim as f32 * 1e-26, relative: 0.0 }
            }
        }
    }

    /// The error bound of the bf16 kernel's distances for query `q`, from the rounding
    /// residuals of `q` and of the stored rows: `|q.x - bf(q).bf(x)| <= |q| |x - bf(x)| +
    /// |q - bf(q)| |bf(x)| + gamma |bf(q)| |bf(x)|`.
    pub(super) fn bf16_bound(&self, metric: GpuDistanceMetric, q: &[f32], q_norm: f64) -> ErrorBound {
        let gamma = f64::from(ErrorBound::gamma(self.dim));
        let q_residual = bf16::residual(q);
        let q_rounded = q_norm + q_residual;
        let widen = 1.0 + 2f64.powi(-8);
        let max_norm = f64::from(self.max_sq_norm).sqrt();
        // vdpbf16ps flushes products below 2^-126 to zero: up to 1.2e-38 each, which cosine then
        // scales by 1/|x| <= 1e18 (stored cosine rows have |x| >= 1e-18).
        let tiny = self.dim as f64 * if metric == GpuDistanceMetric::Cosine { 2e-20 } else { 1e-30 };
        let absolute = match metric {
            GpuDistanceMetric::Cosine => {
                q_norm * f64::from(self.max_relative_residual)
                    + (q_residual + gamma * q_rounded) * widen
                    + gamma * q_norm
            }
            _ => {
                let product = q_norm * f64::from(self.max_residual)
                    + (q_residual + gamma * q_rounded) * max_norm * widen;
                if metric == GpuDistanceMetric::Euclidean {
                    2.0 * product + gamma * f64::from(self.max_sq_norm)
                } else {
                    product
                }
            }
        };
        ErrorBound { absolute: ((absolute + tiny) * 1.01) as f32, relative: 0.0 }
    }

    /// The f32 (GEMM-path) bound of every query of a batch.
    pub(super) fn f32_bounds(&self, queries: &[f32], metric: GpuDistanceMetric) -> Vec<ErrorBound> {
        queries
            .chunks_exact(self.dim)
            .map(|q| self.bound(metric, crate::exact::norm_for_bound(q) as f32, true))
            .collect()
    }
}
