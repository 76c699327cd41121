//! Exact f64 distances of one query to several rows at once, each row's sum in its own lane.
//!
//! An exact distance is an f64 sum in component order (the order every backend's re-rank
//! follows, so that distances equal to the last bit order the same way everywhere). One such
//! sum is a chain of dependent adds, each waiting about 4 cycles on the one before: scoring
//! a candidate over 128 components took about 0.2 us however wide the core. Here `LANES`
//! rows are summed side by side, every lane in component order with the very operations of
//! the one-row definition ([`distances_f64`] says it), so the chains overlap (and vectorize across
//! rows) and every lane's result is bit for bit the one-row result.

use crate::types::GpuDistanceMetric;

/// Rows scored together.
pub(crate) const LANES: usize = 8;

/// The exact distance under `metric` of `q` to each of `rows` (1 to [`LANES`] of them; lanes
/// past the last row repeat the first and are not to be read). Every row has `q`'s length;
/// `q_norm` is `|q|` (cosine uses it).
///
/// The definition, per row: every component widened to f64 first; L2 sums `(q - x)^2`, the dot
/// product is minus the sum of `q x`, cosine is minus that sum over `|x| |q|` (0 where either
/// norm is 0), L1 sums `|q - x|`, all in component order from -0.0 (as `Iterator::sum` starts),
/// and L-infinity is the largest `|q - x|` (the absolute difference of two f32 values in f64 is
/// exact unless their exponents lie more than 29 apart, so that maximum is exact then).
pub(crate) fn distances_f64(
    metric: GpuDistanceMetric,
    q: &[f32],
    q_norm: f64,
    rows: &[&[f32]],
) -> [f64; LANES] {
    assert!(!rows.is_empty() && rows.len() <= LANES, "1 to {LANES} rows, not {}", rows.len());
    let n = q.len();
    // Re-sliced to exactly `n` values, so that `row[d]` with `d < n` needs no check in the loop.
    let rows: [&[f32]; LANES] = std::array::from_fn(|l| &rows.get(l).unwrap_or(&rows[0])[..n]);
    // `Iterator::sum` of f64 starts from -0.0; the lanes start where it does.
    let mut sum = [-0.0f64; LANES];
    match metric {
        GpuDistanceMetric::Euclidean => {
            for (d, &a) in q.iter().enumerate() {
                let a = f64::from(a);
                for l in 0..LANES {
                    let diff = a - f64::from(rows[l][d]);
                    sum[l] += diff * diff;
                }
            }
            sum
        }
        GpuDistanceMetric::DotProduct => {
            lane_dots(q, &rows, &mut sum);
            sum.map(|dot| -dot)
        }
        GpuDistanceMetric::Cosine => {
            let mut norms = [-0.0f64; LANES];
            for (d, &a) in q.iter().enumerate() {
                let a = f64::from(a);
                for l in 0..LANES {
                    let b = f64::from(rows[l][d]);
                    sum[l] += a * b;
                    norms[l] += b * b;
                }
            }
            std::array::from_fn(|l| {
                let norm = norms[l].sqrt();
                if norm == 0.0 || q_norm == 0.0 { 0.0 } else { -sum[l] / (norm * q_norm) }
            })
        }
        GpuDistanceMetric::Manhattan => {
            for (d, &a) in q.iter().enumerate() {
                let a = f64::from(a);
                for l in 0..LANES {
                    sum[l] += (a - f64::from(rows[l][d])).abs();
                }
            }
            sum
        }
        GpuDistanceMetric::Chebyshev => {
            // `fold(0.0, f64::max)`: the largest absolute difference (all of them are >= 0).
            let mut max = [0.0f64; LANES];
            for (d, &a) in q.iter().enumerate() {
                let a = f64::from(a);
                for l in 0..LANES {
                    max[l] = max[l].max((a - f64::from(rows[l][d])).abs());
                }
            }
            max
        }
    }
}

fn lane_dots(q: &[f32], rows: &[&[f32]; LANES], sum: &mut [f64; LANES]) {
    for (d, &a) in q.iter().enumerate() {
        let a = f64::from(a);
        for l in 0..LANES {
            sum[l] += a * f64::from(rows[l][d]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-row definitions as the re-ranks wrote them before the lanes.
    fn reference(metric: GpuDistanceMetric, q: &[f32], q_norm: f64, row: &[f32]) -> f64 {
        let dot = |a: &[f32], b: &[f32]| -> f64 {
            a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum()
        };
        match metric {
            GpuDistanceMetric::Euclidean => {
                q.iter().zip(row).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum()
            }
            GpuDistanceMetric::DotProduct => -dot(q, row),
            GpuDistanceMetric::Cosine => {
                let norm = crate::exact::squared_norm_f64(row).sqrt();
                if norm == 0.0 || q_norm == 0.0 { 0.0 } else { -dot(q, row) / (norm * q_norm) }
            }
            GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => {
                let terms = q.iter().zip(row).map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs());
                if metric == GpuDistanceMetric::Chebyshev { terms.fold(0.0, f64::max) } else { terms.sum() }
            }
        }
    }

    #[test]
    fn every_lane_equals_the_one_row_sum_in_component_order_to_the_last_bit() {
        // Values of wildly different magnitudes, signed zeros and cancellations: sums whose
        // rounding depends on their order, so a lane that summed in another order would differ.
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let scale = [1e-30f32, 1e-3, 1.0, 3.0, 1e4, 1e30][(state % 6) as usize];
            let x = ((state >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * scale;
            if state.is_multiple_of(17) { -0.0 } else { x }
        };
        for dim in [1, 3, 8, 25, 128, 131] {
            let q: Vec<f32> = (0..dim).map(|_| next()).collect();
            let q_norm = crate::exact::squared_norm_f64(&q).sqrt();
            let rows: Vec<Vec<f32>> = (0..LANES + 3)
                .map(|r| if r == 2 { vec![0.0; dim] } else { (0..dim).map(|_| next()).collect() })
                .collect();
            for metric in GpuDistanceMetric::ALL {
                for count in 1..=LANES {
                    let picked: Vec<&[f32]> = rows[3..3 + count].iter().map(Vec::as_slice).collect();
                    let got = distances_f64(metric, &q, q_norm, &picked);
                    for (l, row) in picked.iter().enumerate() {
                        let want = reference(metric, &q, q_norm, row);
                        assert_eq!(
                            got[l].to_bits(),
                            want.to_bits(),
                            "{metric:?} dim {dim} lane {l} of {count}"
                        );
                    }
                }
                let zero = distances_f64(metric, &q, q_norm, &[&rows[2]])[0];
                assert_eq!(
                    zero.to_bits(),
                    reference(metric, &q, q_norm, &rows[2]).to_bits(),
                    "{metric:?} zero row"
                );
            }
        }
    }
}
