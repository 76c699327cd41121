//! Inner products of a few queries with rows read where they lie: the small products of an
//! inverted list's scan, where a GEMM call costs more in packing its operands and gathering the
//! list's scattered rows into a tile than in multiplying (on the 2-core VM a list of about 100
//! rows asked by about 8 queries spent a quarter of its time in the `gemm` crate's packing and
//! the gather: docs/PERFORMANCE.md, "IVF-Flat on small collections").
//!
//! The kernel walks a register block of [`ROWS`] rows by [`QUERIES`] queries: each 16-lane (or
//! 8-lane) step loads every row and query slice once and feeds all their products, so a row is
//! read once per block of queries. The sums run in another order than the GEMM's, which the
//! f32 error bound allows: it holds for a sum of `dim` products in any order
//! ([`crate::exact::ErrorBound::gamma`]).

use super::simd::SimdLevel;

/// Rows per register block.
const ROWS: usize = 4;
/// Queries per register block: with [`ROWS`], 16 accumulators, 4 row vectors and a query
/// vector fit the 32 AVX-512 registers (AVX2 has 16 and spills a few; it is still faster than
/// packing).
const QUERIES: usize = 4;

/// `out[i * count + j] = queries[i] . row(j)` for the `queries.len() / dim` queries and the
/// `count` rows `row(0..count)` (each `dim` long), where this machine has a kernel for it.
/// Returns false, leaving `out` untouched, where it has none (the caller then gathers the rows
/// and multiplies them by GEMM).
pub(crate) fn products<'a>(
    level: SimdLevel,
    queries: &[f32],
    dim: usize,
    count: usize,
    row: impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) -> bool {
    let nq = queries.len().checked_div(dim).unwrap_or(0);
    assert!(out.len() >= nq * count, "few::products: {} outputs for {nq} x {count}", out.len());
    if nq == 0 || count == 0 {
        return true;
    }
    debug_assert!((0..count).all(|j| row(j).len() == dim), "few::products: a row is not {dim} long");
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => {
            // SAFETY: `SimdLevel::Avx512` is only produced after avx512f, avx512vl and fma were
            // detected.
            unsafe { x86::products_avx512(queries, dim, count, &row, out) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => {
            // SAFETY: `SimdLevel::Avx2` is only produced after avx2 and fma were detected.
            unsafe { x86::products_avx2(queries, dim, count, &row, out) };
            true
        }
        _ => false,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::simd::x86::sum256;
    use super::{QUERIES, ROWS};

    macro_rules! block_kernel {
        ($name:ident, $block:ident, $features:literal, $lanes:literal, $vec:ty, $zero:ident, $load:ident,
         $fma:ident, $sum:ident) => {
            /// One register block: `R` rows by `Q` queries, every product summed over the whole
            /// dimension (the tail past the last full vector in scalar code).
            #[target_feature(enable = $features)]
            #[inline]
            fn $block<const R: usize, const Q: usize>(
                queries: [&[f32]; Q],
                rows: [&[f32]; R],
                whole: usize,
            ) -> [[f32; R]; Q] {
                #[target_feature(enable = $features)]
                #[inline]
                fn load(v: &[f32]) -> $vec {
                    let v: &[f32; $lanes] = v.try_into().expect("a whole vector");
                    // SAFETY: `v` is $lanes readable f32 and the load needs no alignment.
                    unsafe { $load(v.as_ptr()) }
                }
                let mut acc = [[$zero(); R]; Q];
                let mut at = 0;
                while at < whole {
                    let r: [$vec; R] = std::array::from_fn(|j| load(&rows[j][at..at + $lanes]));
                    for (acc_q, query) in acc.iter_mut().zip(queries) {
                        let q = load(&query[at..at + $lanes]);
                        for (a, &x) in acc_q.iter_mut().zip(&r) {
                            *a = $fma(q, x, *a);
                        }
                    }
                    at += $lanes;
                }
                let mut out = [[0f32; R]; Q];
                for i in 0..Q {
                    for j in 0..R {
                        let tail: f32 =
                            queries[i][whole..].iter().zip(&rows[j][whole..]).map(|(a, b)| a * b).sum();
                        out[i][j] = $sum(acc[i][j]) + tail;
                    }
                }
                out
            }

            #[target_feature(enable = $features)]
            pub(super) fn $name<'a>(
                queries: &[f32],
                dim: usize,
                count: usize,
                row: &impl Fn(usize) -> &'a [f32],
                out: &mut [f32],
            ) {
                let nq = queries.len() / dim;
                let whole = dim / $lanes * $lanes;
                let query = |i: usize| &queries[i * dim..(i + 1) * dim];
                let mut j = 0;
                while j < count {
                    // The next block's rows are scattered (an inverted list's slots): asked for
                    // now, they arrive while this block is multiplied.
                    for b in j + ROWS..(j + 2 * ROWS).min(count) {
                        prefetch(row(b));
                    }
                    let r = (count - j).min(ROWS);
                    let mut i = 0;
                    while i < nq {
                        let q = (nq - i).min(QUERIES);
                        // Whole blocks of rows take the unrolled kernel for every count of
                        // queries up to a block (a list asked by one to three queries, the
                        // common case at small nprobe, still reads each row once for all of
                        // them); the last few rows take one row and one query at a time.
                        if r == ROWS {
                            let rows: [&[f32]; ROWS] = std::array::from_fn(|b| row(j + b));
                            let mut put = |a: usize, sums: &[f32; ROWS]| {
                                out[(i + a) * count + j..][..ROWS].copy_from_slice(sums);
                            };
                            match q {
                                1 => $block::<ROWS, 1>([query(i)], rows, whole)
                                    .iter()
                                    .enumerate()
                                    .for_each(|(a, s)| put(a, s)),
                                2 => $block::<ROWS, 2>(std::array::from_fn(|a| query(i + a)), rows, whole)
                                    .iter()
                                    .enumerate()
                                    .for_each(|(a, s)| put(a, s)),
                                3 => $block::<ROWS, 3>(std::array::from_fn(|a| query(i + a)), rows, whole)
                                    .iter()
                                    .enumerate()
                                    .for_each(|(a, s)| put(a, s)),
                                _ => $block::<ROWS, QUERIES>(
                                    std::array::from_fn(|a| query(i + a)),
                                    rows,
                                    whole,
                                )
                                .iter()
                                .enumerate()
                                .for_each(|(a, s)| put(a, s)),
                            }
                        } else {
                            for a in 0..q {
                                for b in 0..r {
                                    out[(i + a) * count + j + b] =
                                        $block::<1, 1>([query(i + a)], [row(j + b)], whole)[0][0];
                                }
                            }
                        }
                        i += q;
                    }
                    j += r;
                }
            }
        };
    }

    /// Asks for every cache line of `values` without waiting for it.
    #[inline(always)]
    fn prefetch(values: &[f32]) {
        let bytes = std::mem::size_of_val(values);
        let start = values.as_ptr().cast::<i8>();
        for offset in (0..bytes).step_by(64) {
            // SAFETY: a prefetch reads nothing into the program's state and cannot fault; the
            // address is inside the slice besides.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(offset)) };
        }
    }

    block_kernel!(
        products_avx512,
        block_avx512,
        "avx512f,avx512vl,fma",
        16,
        __m512,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_fmadd_ps,
        _mm512_reduce_add_ps
    );
    block_kernel!(
        products_avx2,
        block_avx2,
        "avx2,fma",
        8,
        __m256,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_fmadd_ps,
        sum256
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_shape_and_dimension_tail_matches_f64_within_the_f32_bound() {
        let mut levels = vec![SimdLevel::detect()];
        if SimdLevel::detect() == SimdLevel::Avx512 {
            levels.push(SimdLevel::Avx2);
        }
        let mut seed = 11u64;
        let mut next = || super::super::simd::test_value(&mut seed);
        // Edges in both directions: fewer rows and queries than a block, and a partial last
        // block, over dimensions with and without a tail past the last vector.
        for dim in [1usize, 7, 16, 25, 128, 131] {
            for (nq, count) in [(1usize, 1usize), (3, 5), (4, 4), (5, 9), (9, 13)] {
                let queries: Vec<f32> = (0..nq * dim).map(|_| next()).collect();
                let rows: Vec<Vec<f32>> = (0..count).map(|_| (0..dim).map(|_| next()).collect()).collect();
                for &level in &levels {
                    let mut out = vec![f32::NAN; nq * count];
                    if !products(level, &queries, dim, count, |j| &rows[j], &mut out) {
                        continue;
                    }
                    let gamma = f64::from(crate::exact::ErrorBound::gamma(dim));
                    for i in 0..nq {
                        for j in 0..count {
                            let q = &queries[i * dim..(i + 1) * dim];
                            let want: f64 =
                                q.iter().zip(&rows[j]).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                            let scale: f64 =
                                q.iter().zip(&rows[j]).map(|(&a, &b)| f64::from(a * b).abs()).sum();
                            let got = f64::from(out[i * count + j]);
                            assert!(
                                (got - want).abs() <= gamma * scale + 1e-30,
                                "{level:?} dim {dim} {nq}x{count} [{i}][{j}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
