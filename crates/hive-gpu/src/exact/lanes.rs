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
    #[cfg(target_arch = "x86_64")]
    if !metric.is_difference_norm() && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected just above.
        let [sums] = unsafe { x86::distances_avx512::<1>(metric, q, q_norm, &[rows]) };
        return sums;
    }
    #[cfg(target_arch = "x86_64")]
    if !metric.is_difference_norm() && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above.
        return unsafe { x86::distances_avx2(metric, q, q_norm, &rows) };
    }
    portable(metric, q, q_norm, &rows)
}

/// [`distances_f64`] of 1 to `2 * LANES` rows (lanes past the last row are not to be read).
/// With AVX-512 the two groups of [`LANES`] are summed side by side: each group's sum is a chain
/// of dependent adds, one a component, so a lone group waits on the add's latency at every
/// component, and a second group's chain fills those cycles. A re-rank's 10 to 20 candidates
/// (k = 10, or an IVF-SQ8 query's 20 nominees) are one call instead of two or three.
pub(crate) fn distances_f64_wide(
    metric: GpuDistanceMetric,
    q: &[f32],
    q_norm: f64,
    rows: &[&[f32]],
) -> [f64; 2 * LANES] {
    assert!(!rows.is_empty() && rows.len() <= 2 * LANES, "1 to {} rows, not {}", 2 * LANES, rows.len());
    let mut out = [0f64; 2 * LANES];
    let (low, high) = rows.split_at(rows.len().min(LANES));
    #[cfg(target_arch = "x86_64")]
    if !high.is_empty() && !metric.is_difference_norm() && std::arch::is_x86_feature_detected!("avx512f") {
        let n = q.len();
        let low: [&[f32]; LANES] = std::array::from_fn(|l| &low.get(l).unwrap_or(&low[0])[..n]);
        let high: [&[f32]; LANES] = std::array::from_fn(|l| &high.get(l).unwrap_or(&high[0])[..n]);
        // SAFETY: AVX-512F was detected just above.
        let [a, b] = unsafe { x86::distances_avx512::<2>(metric, q, q_norm, &[low, high]) };
        out[..LANES].copy_from_slice(&a);
        out[LANES..].copy_from_slice(&b);
        return out;
    }
    out[..LANES].copy_from_slice(&distances_f64(metric, q, q_norm, low));
    if !high.is_empty() {
        out[LANES..].copy_from_slice(&distances_f64(metric, q, q_norm, high));
    }
    out
}

/// [`distances_f64`] without vector instructions: the lanes side by side in plain code (SSE2's
/// two f64 lanes at most, on x86-64).
fn portable(metric: GpuDistanceMetric, q: &[f32], q_norm: f64, rows: &[&[f32]; LANES]) -> [f64; LANES] {
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
            lane_dots(q, rows, &mut sum);
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
            std::array::from_fn(|l| cosine(sum[l], norms[l], q_norm))
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

/// The cosine distance from a dot product, the row's squared norm and the query's norm.
fn cosine(dot: f64, squared_norm: f64, q_norm: f64) -> f64 {
    let norm = squared_norm.sqrt();
    if norm == 0.0 || q_norm == 0.0 { 0.0 } else { -dot / (norm * q_norm) }
}

fn lane_dots(q: &[f32], rows: &[&[f32]; LANES], sum: &mut [f64; LANES]) {
    for (d, &a) in q.iter().enumerate() {
        let a = f64::from(a);
        for l in 0..LANES {
            sum[l] += a * f64::from(rows[l][d]);
        }
    }
}

/// The lanes on AVX2: each run of 8 components of the 8 rows is loaded a row at a time
/// (contiguous loads) and transposed in registers, so that one vector holds one component of
/// every row; each lane then takes the very operations of [`portable`], in component order (no
/// fused multiply-add: the product rounds before the sum, as there). The rows' scattered
/// scalar loads were most of the portable version's time (60 ns a 128-component row on the
/// 2-core VM; docs/PERFORMANCE.md, small searches).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{LANES, cosine};
    use crate::types::GpuDistanceMetric;

    /// Components per transposed block.
    const BLOCK: usize = 8;

    /// `rows[l][at..at + 8]`, one vector.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn load8(row: &[f32], at: usize) -> __m256 {
        let v: &[f32; BLOCK] = row[at..at + BLOCK].try_into().expect("8 components");
        // SAFETY: `v` is 8 readable f32 and the load needs no alignment.
        unsafe { _mm256_loadu_ps(v.as_ptr()) }
    }

    /// The 8 x 8 block of `rows` at components `at..at + 8`, transposed: entry `j` holds
    /// component `at + j` of rows 0 to 7, lane `l` row `l`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn transposed(rows: &[&[f32]; LANES], at: usize) -> [__m256; BLOCK] {
        let r: [__m256; LANES] = std::array::from_fn(|l| load8(rows[l], at));
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        // Per 128-bit half: rows 0-3 (and 4-7) of components 0 and 4, 1 and 5, 2 and 6, 3 and 7.
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }

    /// Component `d` of rows 0-3 and 4-7, widened.
    #[target_feature(enable = "avx2")]
    fn column(rows: &[&[f32]; LANES], d: usize) -> (__m256d, __m256d) {
        let x = |l: usize| f64::from(rows[l][d]);
        (_mm256_setr_pd(x(0), x(1), x(2), x(3)), _mm256_setr_pd(x(4), x(5), x(6), x(7)))
    }

    /// One component's step for every lane: `a` the query's component, `x` the rows' (rows
    /// 0-3 or 4-7), into the sums (and, for cosine, the squared norms).
    #[target_feature(enable = "avx2")]
    fn step(metric: GpuDistanceMetric, a: __m256d, x: __m256d, sum: &mut __m256d, norm: &mut __m256d) {
        match metric {
            GpuDistanceMetric::Euclidean => {
                let diff = _mm256_sub_pd(a, x);
                *sum = _mm256_add_pd(*sum, _mm256_mul_pd(diff, diff));
            }
            GpuDistanceMetric::Cosine => {
                *sum = _mm256_add_pd(*sum, _mm256_mul_pd(a, x));
                *norm = _mm256_add_pd(*norm, _mm256_mul_pd(x, x));
            }
            // The dot product (L1 and L-infinity never come here: `distances_f64`).
            _ => *sum = _mm256_add_pd(*sum, _mm256_mul_pd(a, x)),
        }
    }

    /// [`super::distances_f64`] for L2, the dot product and cosine (`rows` already `q.len()`
    /// long, missing lanes repeating row 0).
    #[target_feature(enable = "avx2")]
    pub(super) fn distances_avx2(
        metric: GpuDistanceMetric,
        q: &[f32],
        q_norm: f64,
        rows: &[&[f32]; LANES],
    ) -> [f64; LANES] {
        debug_assert!(!metric.is_difference_norm(), "the AVX2 lanes have no {metric:?}");
        let n = q.len();
        let whole = n / BLOCK * BLOCK;
        // Lanes 0-3 and 4-7; `Iterator::sum` of f64 starts from -0.0, and so do they.
        let mut sum = [_mm256_set1_pd(-0.0); 2];
        let mut norm = [_mm256_set1_pd(-0.0); 2];
        for at in (0..whole).step_by(BLOCK) {
            let block = transposed(rows, at);
            for (j, x) in block.into_iter().enumerate() {
                let a = _mm256_set1_pd(f64::from(q[at + j]));
                let low = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
                let high = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x));
                let [s0, s1] = &mut sum;
                let [n0, n1] = &mut norm;
                step(metric, a, low, s0, n0);
                step(metric, a, high, s1, n1);
            }
        }
        for (d, &component) in q.iter().enumerate().skip(whole) {
            let a = _mm256_set1_pd(f64::from(component));
            let (low, high) = column(rows, d);
            let [s0, s1] = &mut sum;
            let [n0, n1] = &mut norm;
            step(metric, a, low, s0, n0);
            step(metric, a, high, s1, n1);
        }
        let mut sums = [0f64; LANES];
        let mut norms = [0f64; LANES];
        let (sums_low, sums_high) = sums.split_at_mut(4);
        let (norms_low, norms_high) = norms.split_at_mut(4);
        for (out, v) in [(sums_low, sum[0]), (sums_high, sum[1]), (norms_low, norm[0]), (norms_high, norm[1])]
        {
            let out: &mut [f64; 4] = out.try_into().expect("4 lanes");
            // SAFETY: `out` is 4 writable f64 and the store needs no alignment.
            unsafe { _mm256_storeu_pd(out.as_mut_ptr(), v) };
        }
        match metric {
            GpuDistanceMetric::Euclidean => sums,
            GpuDistanceMetric::Cosine => std::array::from_fn(|l| cosine(sums[l], norms[l], q_norm)),
            _ => sums.map(|dot| -dot),
        }
    }

    /// [`step`] with the 8 lanes in one AVX-512 register.
    #[target_feature(enable = "avx512f")]
    fn step512(metric: GpuDistanceMetric, a: __m512d, x: __m512d, sum: &mut __m512d, norm: &mut __m512d) {
        match metric {
            GpuDistanceMetric::Euclidean => {
                let diff = _mm512_sub_pd(a, x);
                *sum = _mm512_add_pd(*sum, _mm512_mul_pd(diff, diff));
            }
            GpuDistanceMetric::Cosine => {
                *sum = _mm512_add_pd(*sum, _mm512_mul_pd(a, x));
                *norm = _mm512_add_pd(*norm, _mm512_mul_pd(x, x));
            }
            _ => *sum = _mm512_add_pd(*sum, _mm512_mul_pd(a, x)),
        }
    }

    /// [`distances_avx2`] with every lane's f64 in one AVX-512 register, for `W` groups of
    /// [`LANES`] rows side by side (each group's chain of adds fills the other's latency): the
    /// same operations in the same order per lane (so the same bits), half the instructions,
    /// and room in 32 registers for the transposed blocks and the sums, which AVX2's 16
    /// spilled to the stack.
    #[target_feature(enable = "avx512f")]
    pub(super) fn distances_avx512<const W: usize>(
        metric: GpuDistanceMetric,
        q: &[f32],
        q_norm: f64,
        groups: &[[&[f32]; LANES]; W],
    ) -> [[f64; LANES]; W] {
        debug_assert!(!metric.is_difference_norm(), "the AVX-512 lanes have no {metric:?}");
        let n = q.len();
        let whole = n / BLOCK * BLOCK;
        let mut sum = [_mm512_set1_pd(-0.0); W];
        let mut norm = [_mm512_set1_pd(-0.0); W];
        for at in (0..whole).step_by(BLOCK) {
            let blocks: [[__m256; BLOCK]; W] = std::array::from_fn(|w| transposed(&groups[w], at));
            for j in 0..BLOCK {
                let a = _mm512_set1_pd(f64::from(q[at + j]));
                for w in 0..W {
                    step512(metric, a, _mm512_cvtps_pd(blocks[w][j]), &mut sum[w], &mut norm[w]);
                }
            }
        }
        for (d, &component) in q.iter().enumerate().skip(whole) {
            let a = _mm512_set1_pd(f64::from(component));
            for w in 0..W {
                let rows = &groups[w];
                let x = _mm512_set_pd(
                    f64::from(rows[7][d]),
                    f64::from(rows[6][d]),
                    f64::from(rows[5][d]),
                    f64::from(rows[4][d]),
                    f64::from(rows[3][d]),
                    f64::from(rows[2][d]),
                    f64::from(rows[1][d]),
                    f64::from(rows[0][d]),
                );
                step512(metric, a, x, &mut sum[w], &mut norm[w]);
            }
        }
        std::array::from_fn(|w| {
            let mut sums = [0f64; LANES];
            let mut norms = [0f64; LANES];
            // SAFETY: each is 8 writable f64 and the store needs no alignment.
            unsafe {
                _mm512_storeu_pd(sums.as_mut_ptr(), sum[w]);
                _mm512_storeu_pd(norms.as_mut_ptr(), norm[w]);
            }
            match metric {
                GpuDistanceMetric::Euclidean => sums,
                GpuDistanceMetric::Cosine => std::array::from_fn(|l| cosine(sums[l], norms[l], q_norm)),
                _ => sums.map(|dot| -dot),
            }
        })
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
        for dim in [1, 3, 7, 8, 9, 16, 25, 128, 131] {
            let q: Vec<f32> = (0..dim).map(|_| next()).collect();
            let q_norm = crate::exact::squared_norm_f64(&q).sqrt();
            let rows: Vec<Vec<f32>> = (0..LANES + 3)
                .map(|r| if r == 2 { vec![0.0; dim] } else { (0..dim).map(|_| next()).collect() })
                .collect();
            for metric in GpuDistanceMetric::ALL {
                for count in 1..=LANES {
                    let picked: Vec<&[f32]> = rows[3..3 + count].iter().map(Vec::as_slice).collect();
                    let got = distances_f64(metric, &q, q_norm, &picked);
                    let full: [&[f32]; LANES] = std::array::from_fn(|l| *picked.get(l).unwrap_or(&picked[0]));
                    let plain = portable(metric, &q, q_norm, &full);
                    // Each vector version the machine has, whichever the dispatch picks.
                    let mut versions = vec![("dispatched", got), ("portable", plain)];
                    #[cfg(target_arch = "x86_64")]
                    if !metric.is_difference_norm() {
                        if std::arch::is_x86_feature_detected!("avx2") {
                            // SAFETY: AVX2 was detected just above.
                            versions
                                .push(("avx2", unsafe { x86::distances_avx2(metric, &q, q_norm, &full) }));
                        }
                        if std::arch::is_x86_feature_detected!("avx512f") {
                            // SAFETY: AVX-512F was detected just above.
                            versions.push(("avx512", unsafe {
                                x86::distances_avx512::<1>(metric, &q, q_norm, &[full])[0]
                            }));
                        }
                    }
                    for (l, row) in picked.iter().enumerate() {
                        let want = reference(metric, &q, q_norm, row);
                        for (version, got) in versions.iter().map(|(v, got)| (v, got[l])) {
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{metric:?} dim {dim} lane {l} of {count}, {version}"
                            );
                        }
                    }
                }
                // Two groups side by side: 1 to 16 rows, each lane the one-row sum.
                let many: Vec<Vec<f32>> = (0..2 * LANES)
                    .map(|r| rows[(r * 5 + 1) % rows.len()].iter().map(|x| x * (r as f32 + 0.5)).collect())
                    .collect();
                for count in 1..=2 * LANES {
                    let picked: Vec<&[f32]> = many[..count].iter().map(Vec::as_slice).collect();
                    let got = distances_f64_wide(metric, &q, q_norm, &picked);
                    for (l, row) in picked.iter().enumerate() {
                        let want = reference(metric, &q, q_norm, row);
                        assert_eq!(
                            got[l].to_bits(),
                            want.to_bits(),
                            "{metric:?} dim {dim} wide lane {l} of {count}"
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
