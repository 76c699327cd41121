//! The host's share of a search before anything runs on the device: each query's f64 norm,
//! unit queries for cosine, scaled f16 copies, and the error gates of the paths the search may
//! take. Big batches spread it over threads (one pass per query, see `prepare_queries`): on
//! one thread it cost more than the device's filter for 10,000 f16 queries.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::exact::gates::{self as bounds, Approximation};
use crate::exact::squared_norm_f64;
use crate::types::GpuDistanceMetric;

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

fn norm(v: &[f32]) -> f64 {
    squared_norm_f64(v).sqrt()
}

/// Prepares `queries` (row-major, `dim` values each) for a search on `path`; `gate_path` is
/// the path whose gate the kernels apply (the scan's where lists do not fit on chip). Batches
/// of at least `parallel_from` queries ([`crate::Tuning::prepare_parallel_queries`]) share the
/// work out on the library's pool (`crate::exec`); smaller ones, and the pieces of a batch whose
/// workers prepare their own (`crate::exec::prepares_here`), stay on the calling thread.
pub(super) fn prepare(
    queries: &[f32],
    dim: usize,
    metric: GpuDistanceMetric,
    path: Approximation,
    gate_path: Approximation,
    max_sq_norm: f64,
    parallel_from: usize,
) -> crate::error::Result<Prepared> {
    let parallel = queries.len() / dim >= parallel_from && !crate::exec::prepares_here();
    let prepare = || prepare_queries(queries, dim, metric, path, gate_path, max_sq_norm, parallel);
    if parallel { crate::exec::run(prepare) } else { Ok(prepare()) }
}

/// `nq` rows of `dim` of `v`, or `nq` empty rows where `v` is empty (an output the search
/// does not need).
fn rows_of<T>(v: &mut [T], nq: usize, dim: usize) -> Vec<&mut [T]> {
    if v.is_empty() { (0..nq).map(|_| &mut [][..]).collect() } else { v.chunks_exact_mut(dim).collect() }
}

/// One query's values besides its rows.
#[derive(Clone, Copy, Default)]
struct Scalars {
    norm: f64,
    scale: f64,
    gate: (f32, f32),
    scan: (f32, f32),
}

/// Queries one task of a parallel preparation takes at least.
const QUERIES_PER_TASK: usize = 16;

/// Every value of every query in one pass per query: one parallel pass for a big batch.
///
/// The values used to be computed one kind at a time, each kind a pass of its own over the
/// batch on the pool (norms, unit queries, scales, f16 copies, two gates): six hand-overs, which
/// cost more than the arithmetic. On the H100 machine, 100,000 x 128 (docs/PERFORMANCE.md,
/// the shape sweep), that preparation took 0.10 ms of a 0.40 ms batch of 100 queries and 0.31 ms
/// of a 1.74 ms batch of 1,000 (`HIVE_GPU_PROFILE`).
fn prepare_queries(
    queries: &[f32],
    dim: usize,
    metric: GpuDistanceMetric,
    path: Approximation,
    gate_path: Approximation,
    max_sq_norm: f64,
    parallel: bool,
) -> Prepared {
    let nq = queries.len() / dim;
    let cosine = metric == GpuDistanceMetric::Cosine;
    let half = matches!(path, Approximation::GemmF16 { .. } | Approximation::RoundedF16 { .. });
    let gate = |path: Approximation, scale: f64, kernel_norm: f64| {
        let p = match path {
            Approximation::GemmF16 { .. } => Approximation::GemmF16 { scale },
            Approximation::RoundedF16 { row_scale, least_row_norm, .. } => {
                Approximation::RoundedF16 { scale, row_scale, least_row_norm }
            }
            other => other,
        };
        bounds::gate(metric, p, kernel_norm, max_sq_norm, dim)
    };
    // Query `q`'s values; its unit query (under cosine) and its f16 copy (on an f16 path) go
    // into `unit` and `halves`, each `dim` long, or are skipped where those are empty.
    let one = |q: usize, unit: &mut [f32], halves: &mut [f16]| -> Scalars {
        let row = &queries[q * dim..(q + 1) * dim];
        let q_norm = norm(row);
        let seen: &[f32] = if cosine {
            for (o, &x) in unit.iter_mut().zip(row) {
                *o = (f64::from(x) / q_norm) as f32;
            }
            unit
        } else {
            row
        };
        // Norms of the vectors the kernels see: the unit queries' are not exactly 1.
        let kernel_norm = if cosine { norm(seen) } else { q_norm };
        let scale = if half {
            let scale = bounds::f16_scale(seen);
            // The scale is a power of two within f32's normal range, so the f32 product is
            // exact unless it falls below 2^-126, where f16 rounds it to zero either way: the
            // halves are the correctly rounded products, converted many at a time (F16C).
            let factor = scale as f32;
            let mut scaled = [0f32; 64];
            for (from, to) in seen.chunks(64).zip(halves.chunks_mut(64)) {
                for (s, &x) in scaled.iter_mut().zip(from) {
                    *s = x * factor;
                }
                to.convert_from_f32_slice(&scaled[..from.len()]);
            }
            scale
        } else {
            1.0
        };
        Scalars {
            norm: q_norm,
            scale,
            gate: gate(gate_path, scale, kernel_norm),
            scan: gate(Approximation::Scan, scale, kernel_norm),
        }
    };
    let mut unit = if cosine { vec![0f32; nq * dim] } else { Vec::new() };
    let mut halves = if half { vec![f16::ZERO; nq * dim] } else { Vec::new() };
    let unit_rows = rows_of(&mut unit, nq, dim);
    let half_rows = rows_of(&mut halves, nq, dim);
    let scalars: Vec<Scalars> = if parallel {
        unit_rows
            .into_par_iter()
            .zip(half_rows)
            .with_min_len(QUERIES_PER_TASK)
            .enumerate()
            .map(|(q, (u, h))| one(q, u, h))
            .collect()
    } else {
        unit_rows.into_iter().zip(half_rows).enumerate().map(|(q, (u, h))| one(q, u, h)).collect()
    };
    Prepared {
        q_norms: scalars.iter().map(|s| s.norm).collect(),
        unit,
        halves,
        scales: scalars.iter().map(|s| s.scale).collect(),
        gate_mul: scalars.iter().map(|s| s.gate.0).collect(),
        gate_add: scalars.iter().map(|s| s.gate.1).collect(),
        scan_mul: scalars.iter().map(|s| s.scan.0).collect(),
        scan_add: scalars.iter().map(|s| s.scan.1).collect(),
    }
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
    fn a_batch_prepared_on_many_threads_equals_each_query_prepared_alone() {
        // The batch's one pass per query is shared out in tasks of several queries: each
        // query's values must be its own, not a neighbour's, on every path and metric.
        let dim = 24;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let queries: Vec<f32> = (0..300 * dim)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.3) * (1 + i % 7) as f32
            })
            .collect();
        let paths = [
            Approximation::Scan,
            Approximation::GemmF32,
            Approximation::GemmF16 { scale: 1.0 },
            Approximation::RoundedF16 { scale: 1.0, row_scale: 8.0, least_row_norm: 0.5 },
        ];
        for metric in [GpuDistanceMetric::Euclidean, GpuDistanceMetric::Cosine, GpuDistanceMetric::DotProduct]
        {
            for path in paths {
                let all = prepare(&queries, dim, metric, path, path, 50.0, 64).expect("the batch");
                for (q, row) in queries.chunks_exact(dim).enumerate() {
                    let one = prepare(row, dim, metric, path, path, 50.0, 64).expect("one query");
                    let what = format!("{metric:?} {path:?} query {q}");
                    assert_eq!(all.q_norms[q].to_bits(), one.q_norms[0].to_bits(), "{what}");
                    assert_eq!(all.scales[q].to_bits(), one.scales[0].to_bits(), "{what}");
                    assert_eq!(
                        (all.gate_mul[q], all.gate_add[q]),
                        (one.gate_mul[0], one.gate_add[0]),
                        "{what}"
                    );
                    assert_eq!(
                        (all.scan_mul[q], all.scan_add[q]),
                        (one.scan_mul[0], one.scan_add[0]),
                        "{what}"
                    );
                    let rows = |v: &[f32]| v.get(q * dim..(q + 1) * dim).map(<[f32]>::to_vec);
                    assert_eq!(rows(&all.unit), one.unit.get(..dim).map(<[f32]>::to_vec), "{what}");
                    let halves = |v: &[f16], at: usize| v.get(at * dim..(at + 1) * dim).map(<[f16]>::to_vec);
                    assert_eq!(halves(&all.halves, q), halves(&one.halves, 0), "{what}");
                }
            }
        }
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
            prepare(&queries, dim, GpuDistanceMetric::DotProduct, half, half, 1e30, 64).expect("prepare");
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
