//! `E`, the bound on how far an f32 distance may be from the exact one: the CPU collector's
//! gate and every GPU path's candidate gate are built on it.

/// `E`: how far one approximate distance may be from the true one, `absolute + relative * |d|`.
/// [`Collector`] applies the factor of two of the selection argument itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorBound {
    /// Error independent of the distance (from norms, for GEMM-based distances).
    pub absolute: f32,
    /// Error proportional to the distance itself (for sums of non-negative terms).
    pub relative: f32,
}

impl ErrorBound {
    /// The relative error of summing `dim` products in f32 in any order: Higham's
    /// `gamma_n = n u / (1 - n u)` with `n = dim + 4` for the operations around the sum (norm
    /// rounding, scaling), doubled as a margin.
    pub fn gamma(dim: usize) -> f32 {
        let u = f64::from(f32::EPSILON) / 2.0;
        let n = dim as f64 + 4.0;
        (2.0 * n * u / (1.0 - n * u)) as f32
    }
}
