//! The 8-bit scalar quantizer of IVF-SQ8 and the flat SQ8 index: each component of a vector's
//! residual (the vector less its list's centroid) becomes one byte, on a grid trained per
//! component over the training residuals' range (FAISS's `QT_8bit` with min-max ranges).
//!
//! A code `c` of component `d` decodes to `base[d] + step[d] * c`; encoding rounds to the
//! nearest code and clamps to 0..=255, so a component inside the trained range is off by at
//! most `step[d] / 2`. The byte distance is [`crate::backend::codes`]'s.

use crate::backend::ListCodes;
use crate::error::{HiveGpuError, Result};

/// Codes per component.
const LEVELS: f32 = 255.0;

/// An 8-bit grid per component.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScalarQuantizer {
    /// Per component, the value of code 0 (the trained minimum).
    pub(crate) base: Vec<f32>,
    /// Per component, the value of one code step (the trained range over 255; 0 for a
    /// component that never varied).
    pub(crate) step: Vec<f32>,
}

impl ScalarQuantizer {
    /// The grid spanning each component's range over `residuals` (row-major, `dim` per row,
    /// at least one row).
    pub(crate) fn train(residuals: &[f32], dim: usize) -> Result<Self> {
        if dim == 0 || residuals.is_empty() || !residuals.len().is_multiple_of(dim) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "a scalar quantizer trains on whole {dim}-dimensional vectors, got {} values",
                residuals.len()
            )));
        }
        let mut low = vec![f32::INFINITY; dim];
        let mut high = vec![f32::NEG_INFINITY; dim];
        for row in residuals.chunks_exact(dim) {
            for ((l, h), &x) in low.iter_mut().zip(high.iter_mut()).zip(row) {
                *l = l.min(x);
                *h = h.max(x);
            }
        }
        let step = low
            .iter()
            .zip(&high)
            .map(|(&l, &h)| ((f64::from(h) - f64::from(l)) / f64::from(LEVELS)) as f32)
            .collect();
        Self::from_parts(low, step)
    }

    /// A quantizer from its stored grid: finite bases, finite steps of at least zero.
    pub(crate) fn from_parts(base: Vec<f32>, step: Vec<f32>) -> Result<Self> {
        if base.len() != step.len() || base.is_empty() {
            return Err(HiveGpuError::InvalidArgument(format!(
                "a scalar quantizer needs as many bases as steps, at least one: {} and {}",
                base.len(),
                step.len()
            )));
        }
        if let Some(d) =
            (0..base.len()).find(|&d| !base[d].is_finite() || !step[d].is_finite() || step[d] < 0.0)
        {
            return Err(HiveGpuError::InvalidArgument(format!(
                "the scalar quantizer's component {d} has base {} and step {}: both must be finite, the step at least 0",
                base[d], step[d]
            )));
        }
        Ok(Self { base, step })
    }

    /// Components per vector.
    pub(crate) fn dim(&self) -> usize {
        self.base.len()
    }

    /// Appends the codes of `residual` and its decoded squared norm to `list`.
    pub(crate) fn encode_into(&self, residual: &[f32], list: &mut ListCodes) {
        let mut norm = 0.0f64;
        for ((&x, &base), &step) in residual.iter().zip(&self.base).zip(&self.step) {
            let code = if step > 0.0 { ((x - base) / step).round().clamp(0.0, LEVELS) } else { 0.0 };
            let decoded = f64::from(base) + f64::from(step) * f64::from(code);
            norm += decoded * decoded;
            list.codes.push(code as u8);
        }
        list.norms.push(norm as f32);
    }

    /// The vector `codes` stand for, less its centroid.
    #[cfg(test)]
    pub(crate) fn decode(&self, codes: &[u8]) -> Vec<f32> {
        codes.iter().zip(&self.base).zip(&self.step).map(|((&c, &b), &s)| b + s * f32::from(c)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trained_component_decodes_within_half_a_step_and_a_constant_one_exactly() {
        let dim = 3;
        let rows: Vec<f32> = (0..100).flat_map(|i| [i as f32 * 0.37 - 5.0, 7.5, (i * i) as f32]).collect();
        let sq = ScalarQuantizer::train(&rows, dim).unwrap();
        for row in rows.chunks_exact(dim) {
            let mut list = ListCodes::default();
            sq.encode_into(row, &mut list);
            let back = sq.decode(&list.codes);
            for d in 0..dim {
                assert!(
                    (back[d] - row[d]).abs() <= sq.step[d] * 0.5 + 1e-4 * row[d].abs().max(1.0),
                    "{d}: {} vs {}",
                    back[d],
                    row[d]
                );
            }
            assert_eq!(back[1], 7.5);
            let norm: f32 = back.iter().map(|x| x * x).sum();
            assert!((list.norms[0] - norm).abs() <= 1e-3 * norm.max(1.0));
        }
    }

    #[test]
    fn values_outside_the_trained_range_clamp_to_the_end_codes() {
        let sq = ScalarQuantizer::train(&[0.0, 10.0, 1.0, 20.0], 2).unwrap();
        let mut list = ListCodes::default();
        sq.encode_into(&[-3.0, 1e9], &mut list);
        assert_eq!(list.codes, vec![0, 255]);
    }

    #[test]
    fn a_stored_grid_with_a_negative_or_non_finite_step_is_refused() {
        assert!(ScalarQuantizer::from_parts(vec![0.0], vec![-1.0]).is_err());
        assert!(ScalarQuantizer::from_parts(vec![f32::NAN], vec![1.0]).is_err());
        assert!(ScalarQuantizer::from_parts(vec![0.0, 1.0], vec![1.0]).is_err());
        assert!(ScalarQuantizer::from_parts(vec![0.0], vec![0.0]).is_ok());
    }
}
