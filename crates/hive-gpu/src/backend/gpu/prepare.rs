//! The host's share of a search before anything runs on the device: each query's f64 norm,
//! unit queries for cosine, scaled f16 copies, and the error gates of the paths the search may
//! take. Big batches spread it over threads: on one thread it cost more than the device's
//! filter for 10,000 f16 queries.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::exact::gates::{self as bounds, Approximation};
use crate::exact::squared_norm_f64;
use crate::types::GpuDistanceMetric;

/// Batches of at least this many queries are prepared on several threads.
const PARALLEL_QUERIES: usize = 64;

/// Per-query values the kernels take, computed on the host.
pub(super) struct Prepared {
    /// |q| in f64 (before cosine's normalisation).
    pub q_norms: Vec<f64>,
    /// The unit queries under cosine, row-major; empty otherwise (the kernels read the queries).
    pub unit: Vec<f32>,
    /// f16 copies of the queries the kernels see, each scaled by its `scales` entry; empty
    /// unless the path multiplies in f16.
    pub halves: Vec<f16>,
    /// Each query's f16 scale (1 where no f16 copy is made).
    pub scales: Vec<f64>,
    /// The chosen path's gate, per query (multiplier, addend).
    pub gate_mul: Vec<f32>,
    /// See `gate_mul`.
    pub gate_add: Vec<f32>,
    /// The exact scan's gate, for queries that fall back to it.
    pub scan_mul: Vec<f32>,
    /// See `scan_mul`.
    pub scan_add: Vec<f32>,
}

/// One value per query, computed on several threads for big batches.
fn per_query<T: Send>(nq: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    if nq >= PARALLEL_QUERIES { (0..nq).into_par_iter().map(f).collect() } else { (0..nq).map(f).collect() }
}

/// One row of `dim` values per query, filled in place.
fn per_row<T: Send + Copy + Default>(
    nq: usize,
    dim: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) -> Vec<T> {
    let mut out = vec![T::default(); nq * dim];
    if nq >= PARALLEL_QUERIES {
        out.par_chunks_exact_mut(dim).enumerate().for_each(|(q, row)| f(q, row));
    } else {
        out.chunks_exact_mut(dim).enumerate().for_each(|(q, row)| f(q, row));
    }
    out
}

fn norm(v: &[f32]) -> f64 {
    squared_norm_f64(v).sqrt()
}

/// Prepares `queries` (row-major, `dim` values each) for a search on `path`; `gate_path` is
/// the path whose gate the kernels apply (the scan's where lists do not fit on chip).
pub(super) fn prepare(
    queries: &[f32],
    dim: usize,
    metric: GpuDistanceMetric,
    path: Approximation,
    gate_path: Approximation,
    max_sq_norm: f64,
) -> crate::error::Result<Prepared> {
    let prepare = || prepare_on_this_thread(queries, dim, metric, path, gate_path, max_sq_norm);
    // Batches big enough for the per-query work to run in parallel (`per_query`, `per_row`) run
    // it on the library's pool (`crate::exec`); smaller ones stay on the caller's thread.
    if queries.len() / dim >= PARALLEL_QUERIES { crate::exec::run(prepare) } else { Ok(prepare()) }
}

fn prepare_on_this_thread(
    queries: &[f32],
    dim: usize,
    metric: GpuDistanceMetric,
    path: Approximation,
    gate_path: Approximation,
    max_sq_norm: f64,
) -> Prepared {
    let nq = queries.len() / dim;
    let row = |q: usize| &queries[q * dim..(q + 1) * dim];
    let q_norms = per_query(nq, |q| norm(row(q)));
    let cosine = metric == GpuDistanceMetric::Cosine;
    let unit = if cosine {
        per_row(nq, dim, |q, out: &mut [f32]| {
            for (o, &x) in out.iter_mut().zip(row(q)) {
                *o = (f64::from(x) / q_norms[q]) as f32;
            }
        })
    } else {
        Vec::new()
    };
    let seen = |q: usize| if cosine { &unit[q * dim..(q + 1) * dim] } else { row(q) };
    // Norms of the vectors the kernels see: the unit queries' are not exactly 1.
    let kernel_norms = if cosine { per_query(nq, |q| norm(seen(q))) } else { q_norms.clone() };
    let half = matches!(path, Approximation::GemmF16 { .. } | Approximation::RoundedF16 { .. });
    let (scales, halves) = if half {
        let scales = per_query(nq, |q| bounds::f16_scale(seen(q)));
        let halves = per_row(nq, dim, |q, out: &mut [f16]| {
            // The scale is a power of two within f32's normal range, so the f32 product is
            // exact unless it falls below 2^-126, where f16 rounds it to zero either way: the
            // halves are the correctly rounded products, converted many at a time (F16C).
            let scale = scales[q] as f32;
            let mut scaled = [0f32; 64];
            for (from, to) in seen(q).chunks(64).zip(out.chunks_mut(64)) {
                for (s, &x) in scaled.iter_mut().zip(from) {
                    *s = x * scale;
                }
                to.convert_from_f32_slice(&scaled[..from.len()]);
            }
        });
        (scales, halves)
    } else {
        (vec![1.0; nq], Vec::new())
    };
    let gates = |path: Approximation| -> (Vec<f32>, Vec<f32>) {
        per_query(nq, |q| {
            let p = match path {
                Approximation::GemmF16 { .. } => Approximation::GemmF16 { scale: scales[q] },
                Approximation::RoundedF16 { row_scale, .. } => {
                    Approximation::RoundedF16 { scale: scales[q], row_scale }
                }
                other => other,
            };
            bounds::gate(metric, p, kernel_norms[q], max_sq_norm, dim)
        })
        .into_iter()
        .unzip()
    };
    let (gate_mul, gate_add) = gates(gate_path);
    let (scan_mul, scan_add) = gates(Approximation::Scan);
    Prepared { q_norms, unit, halves, scales, gate_mul, gate_add, scan_mul, scan_add }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f16 nearest to `v` (ties to an even last bit), by search over the finite f16s,
    /// which f64 holds exactly; independent of `half`'s conversions.
    fn nearest_f16(v: f64) -> u16 {
        let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
        let a = v.abs();
        let value = |bits: u16| f16::from_bits(bits).to_f64();
        // Finite non-negative f16s grow with their bits, 0 to 0x7bff (65504); the scaled
        // queries stay below 32768, so overflow never comes up.
        let (mut lo, mut hi) = (0u16, 0x7bffu16);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if value(mid) <= a { lo = mid } else { hi = mid - 1 }
        }
        if lo == 0x7bff {
            return sign | lo;
        }
        let (below, above) = (a - value(lo), value(lo + 1) - a);
        let pick = if below < above || (below == above && lo % 2 == 0) { lo } else { lo + 1 };
        sign | pick
    }

    #[test]
    fn f16_copies_are_the_correctly_rounded_scaled_queries() {
        let dim = 8;
        let mut queries: Vec<f32> = vec![
            // Exact ties between two f16s once scaled by 2^14 (the largest component is 1.5),
            // near-ties, a signed zero.
            1.5,
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            f32::from_bits(0x3F80_1001),
            f32::from_bits(0x3F80_0FFF),
            -(1.0 + 2f32.powi(-11)),
            -0.0,
            2f32.powi(-24) * 1.5 * 2f32.powi(-14),
            // Products below f32's normal range, and f16 subnormals.
            1e3,
            1e-38,
            -1e-38,
            3e-8,
            -6e-5,
            1e-40,
            0.0,
            -0.0,
            // A scale of 2^-85: the small components' f32 products fall below 2^-126.
            1e30,
            1e-30,
            -1e-36,
            3e-38,
            1e-20,
            -1e-25,
            5e-39,
            -0.0,
        ];
        // Magnitudes across f32's range, from a fixed generator.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for base in [1e-30f32, 3e-8, 1e-5, 0.1, 1.0, 7.5, 1e3, 6e4, 1e20, 1.5e38] {
            for _ in 0..dim * 64 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
                queries.push(base * (2.0 * unit - 1.0));
            }
        }
        let half = Approximation::GemmF16 { scale: 1.0 };
        let prepared =
            prepare(&queries, dim, GpuDistanceMetric::DotProduct, half, half, 1e30).expect("prepare");
        for (q, row) in queries.chunks_exact(dim).enumerate() {
            let scale = bounds::f16_scale(row);
            for (c, &x) in row.iter().enumerate() {
                let want = nearest_f16(f64::from(x) * scale);
                let got = prepared.halves[q * dim + c].to_bits();
                assert_eq!(got, want, "query {q} component {c}: {x:e} x {scale:e}");
            }
        }
    }
}
