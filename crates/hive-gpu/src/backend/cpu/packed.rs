//! Inner products of queries with rows kept in the packed layout: blocks of [`BLOCK`] rows,
//! component-major within a block (`blocks[b * dim * BLOCK + d * BLOCK + i]` is component `d`
//! of row `b * BLOCK + i`). The CPU backend keeps an IVF index's inverted lists this way
//! (`rows::packed_lists`), as FAISS keeps its GPU lists interleaved.
//!
//! In this layout one vector load holds one component of [`BLOCK`] rows, so each step is a
//! load and one multiply-add per query with the query's component broadcast: every product
//! of a block ends in its own lane and no horizontal sum is needed. Rows read where they lie
//! (`few::products`) need one per product, and scattered rows miss the cache; on SIFT10K's
//! IVF-Flat those products were a third of a batch (docs/PERFORMANCE.md, "Packed lists").
//!
//! The sums run in component order with fused multiply-adds on x86 (plain multiplies and adds
//! elsewhere): another order and rounding than the GEMM's, which the f32 error bound allows
//! for a sum of `dim` products in any order ([`crate::exact::ErrorBound::gamma`]).
//!
//! The same layout holds byte codes (an SQ8 index's, `rows::code_lists`): [`code_products`]
//! widens each 16-byte load to 16 f32 lanes in registers and goes on as the f32 kernel does,
//! so the codes are read as bytes, never copied out as f32 tiles.

use super::simd::SimdLevel;

/// Rows per block: one AVX-512 vector of f32 (two AVX2 vectors).
pub(crate) const BLOCK: usize = 16;

/// f32 values of `rows` rows packed: whole blocks, the last one padded with zeros.
pub(crate) fn packed_len(rows: usize, dim: usize) -> usize {
    rows.div_ceil(BLOCK) * BLOCK * dim
}

/// Appends `rows` (each `dim` long) after the `packed` rows already in `blocks`, filling the
/// last block's padding first; padding lanes stay zero (`T::default()`).
pub(crate) fn append<'a, T: Copy + Default + 'a>(
    blocks: &mut Vec<T>,
    packed: usize,
    rows: impl ExactSizeIterator<Item = &'a [T]>,
    dim: usize,
) {
    let total = packed + rows.len();
    blocks.resize(packed_len(total, dim), T::default());
    for (r, row) in (packed..).zip(rows) {
        let block = &mut blocks[(r / BLOCK) * BLOCK * dim..][..BLOCK * dim];
        let lane = r % BLOCK;
        for (d, &x) in row[..dim].iter().enumerate() {
            block[d * BLOCK + lane] = x;
        }
    }
}

/// `out[i * stride + j] = queries[i] . row(j)` for the `queries.len() / dim` queries and
/// every row of the whole blocks in `blocks` (padding rows give 0). `stride` is at least the
/// blocks' rows.
pub(crate) fn products(
    level: SimdLevel,
    queries: &[f32],
    dim: usize,
    blocks: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let nq = queries.len().checked_div(dim).unwrap_or(0);
    let rows = blocks.len().checked_div(dim).unwrap_or(0);
    assert!(
        rows.is_multiple_of(BLOCK) && stride >= rows && out.len() >= nq.saturating_sub(1) * stride + rows,
        "packed::products: {} values of {dim} for {nq} queries at stride {stride}, {} outputs",
        blocks.len(),
        out.len()
    );
    if nq == 0 || rows == 0 {
        return;
    }
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => {
            // SAFETY: `SimdLevel::Avx512` is only produced after avx512f, avx512vl and fma were
            // detected.
            unsafe { x86::products_avx512(queries, &[], dim, blocks, out, stride) }
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => {
            // SAFETY: `SimdLevel::Avx2` is only produced after avx2 and fma were detected.
            unsafe { x86::products_avx2(queries, &[], dim, blocks, out, stride) }
        }
        _ => portable(queries, dim, blocks, out, stride),
    }
}

/// `out[i * stride + j] = starts[i] + weights[i] . codes(j)` for the `weights.len() / dim`
/// weight vectors and every row of the whole blocks of byte codes in `blocks` (padding rows
/// give `starts[i]`), each code taken as the f32 of its value. `stride` is at least the
/// blocks' rows and `starts` holds one value per weight vector. The sums run in component
/// order, as [`products`]' do.
pub(crate) fn code_products(
    level: SimdLevel,
    weights: &[f32],
    starts: &[f32],
    dim: usize,
    blocks: &[u8],
    out: &mut [f32],
    stride: usize,
) {
    let nq = weights.len().checked_div(dim).unwrap_or(0);
    let rows = blocks.len().checked_div(dim).unwrap_or(0);
    assert!(
        rows.is_multiple_of(BLOCK)
            && starts.len() == nq
            && stride >= rows
            && out.len() >= nq.saturating_sub(1) * stride + rows,
        "packed::code_products: {} codes of {dim} for {nq} weight vectors ({} starts) at stride {stride}, {} outputs",
        blocks.len(),
        starts.len(),
        out.len()
    );
    if nq == 0 || rows == 0 {
        return;
    }
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => {
            // SAFETY: `SimdLevel::Avx512` is only produced after avx512f, avx512vl and fma were
            // detected.
            unsafe { x86::code_products_avx512(weights, starts, dim, blocks, out, stride) }
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => {
            // SAFETY: `SimdLevel::Avx2` is only produced after avx2 and fma were detected.
            unsafe { x86::code_products_avx2(weights, starts, dim, blocks, out, stride) }
        }
        _ => {
            for (b, block) in blocks.chunks_exact(BLOCK * dim).enumerate() {
                for (i, (w, &start)) in weights.chunks_exact(dim).zip(starts).enumerate() {
                    let mut acc = [start; BLOCK];
                    for (lanes, &x) in block.chunks_exact(BLOCK).zip(w) {
                        for (s, &c) in acc.iter_mut().zip(lanes) {
                            *s += x * f32::from(c);
                        }
                    }
                    out[i * stride + b * BLOCK..][..BLOCK].copy_from_slice(&acc);
                }
            }
        }
    }
}

/// Queries per register group of the portable kernel.
const PORTABLE_QUERIES: usize = 4;

/// The kernel in plain code (LLVM vectorises the 16 lanes: NEON on aarch64).
fn portable(queries: &[f32], dim: usize, blocks: &[f32], out: &mut [f32], stride: usize) {
    let nq = queries.len() / dim;
    for (b, block) in blocks.chunks_exact(BLOCK * dim).enumerate() {
        for first in (0..nq).step_by(PORTABLE_QUERIES) {
            let group = (nq - first).min(PORTABLE_QUERIES);
            let mut acc = [[0f32; BLOCK]; PORTABLE_QUERIES];
            for (d, lanes) in block.chunks_exact(BLOCK).enumerate() {
                for (a, acc) in acc[..group].iter_mut().enumerate() {
                    let x = queries[(first + a) * dim + d];
                    for (s, &r) in acc.iter_mut().zip(lanes) {
                        *s += x * r;
                    }
                }
            }
            for (a, acc) in acc[..group].iter().enumerate() {
                out[(first + a) * stride + b * BLOCK..][..BLOCK].copy_from_slice(acc);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::BLOCK;

    /// One block row (component `d` of the block's 16 rows) as 16 f32 lanes.
    #[target_feature(enable = "avx512f,avx512vl,fma")]
    #[inline]
    fn lanes_avx512(lanes: &[f32; BLOCK]) -> __m512 {
        // SAFETY: `lanes` is 16 readable f32; the load needs no alignment.
        unsafe { _mm512_loadu_ps(lanes.as_ptr()) }
    }

    /// One block row of byte codes widened to 16 f32 lanes (exact: a byte is an f32 integer).
    #[target_feature(enable = "avx512f,avx512vl,fma")]
    #[inline]
    fn code_lanes_avx512(lanes: &[u8; BLOCK]) -> __m512 {
        // SAFETY: `lanes` is 16 readable bytes; the load needs no alignment.
        let bytes = unsafe { _mm_loadu_si128(lanes.as_ptr().cast()) };
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes))
    }

    /// [`lanes_avx512`] on AVX2: the 16 lanes in two registers.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn lanes_avx2(lanes: &[f32; BLOCK]) -> [__m256; 2] {
        let (lo, hi) = lanes.split_at(8);
        // SAFETY: `lo` and `hi` are 8 readable f32 each; the loads need no alignment.
        unsafe { [_mm256_loadu_ps(lo.as_ptr()), _mm256_loadu_ps(hi.as_ptr())] }
    }

    /// [`code_lanes_avx512`] on AVX2: the 16 lanes in two registers.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn code_lanes_avx2(lanes: &[u8; BLOCK]) -> [__m256; 2] {
        let (lo, hi) = lanes.split_at(8);
        // SAFETY: `lo` and `hi` are 8 readable bytes each (`_mm_loadl_epi64` reads 8); the loads
        // need no alignment.
        let (lo, hi) = unsafe { (_mm_loadl_epi64(lo.as_ptr().cast()), _mm_loadl_epi64(hi.as_ptr().cast())) };
        [_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi))]
    }

    macro_rules! group_kernels {
        ($element:ty, $avx512:ident, $load512:ident, $avx2:ident, $load256:ident) => {
            /// `B` consecutive blocks (`dim` rows of 16 lanes each) against `Q` queries:
            /// `B x Q` accumulators of 16 lanes (one AVX-512 register each; with the `B` row
            /// vectors, 9 of the 32 registers at `Q` = 8, `B` = 1, and 12 at `Q` = 2, `B` = 4),
            /// started at `starts`. Block `b`'s sums of query `a` go to
            /// `out[a * stride + b * BLOCK..][..BLOCK]`. More blocks at once serve few queries: a
            /// single query's block is one chain of `dim` dependent multiply-adds, and `B` chains
            /// overlap their latency (docs/PERFORMANCE.md, "Packed SQ8 codes").
            #[target_feature(enable = "avx512f,avx512vl,fma")]
            #[inline]
            fn $avx512<const Q: usize, const B: usize>(
                queries: &[f32],
                starts: &[f32],
                blocks: &[$element],
                out: &mut [f32],
                stride: usize,
            ) {
                let mut acc = [[_mm512_setzero_ps(); Q]; B];
                for acc in acc.iter_mut() {
                    for (a, &s) in acc.iter_mut().zip(starts) {
                        *a = _mm512_set1_ps(s);
                    }
                }
                // Each query exactly `dim` long and `d` below `dim`: no bounds check in the loop.
                let dim = blocks.len() / (B * BLOCK);
                let queries: [&[f32]; Q] = std::array::from_fn(|a| &queries[a * dim..][..dim]);
                for q in &queries {
                    assert!(q.len() == dim);
                }
                let mut rows: [_; B] =
                    std::array::from_fn(|b| blocks[b * BLOCK * dim..][..BLOCK * dim].chunks_exact(BLOCK));
                for d in 0..dim {
                    for (acc, rows) in acc.iter_mut().zip(rows.iter_mut()) {
                        let lanes = rows.next().expect("a whole block row");
                        let r = $load512(lanes.try_into().expect("a whole block row"));
                        for (a, q) in acc.iter_mut().zip(&queries) {
                            *a = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), r, *a);
                        }
                    }
                }
                for (b, acc) in acc.iter().enumerate() {
                    for (i, a) in acc.iter().enumerate() {
                        let o: &mut [f32; BLOCK] =
                            (&mut out[i * stride + b * BLOCK..][..BLOCK]).try_into().expect("16 outputs");
                        // SAFETY: `o` is 16 writable f32; the store needs no alignment.
                        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
                    }
                }
            }

            /// The AVX-512 group on AVX2: the 16 lanes in two registers, so `2 B Q`
            /// accumulators (with the row halves, 10 of the 16 registers at `Q` = 4, `B` = 1,
            /// and 12 at `Q` = 2, `B` = 2).
            #[target_feature(enable = "avx2,fma")]
            #[inline]
            fn $avx2<const Q: usize, const B: usize>(
                queries: &[f32],
                starts: &[f32],
                blocks: &[$element],
                out: &mut [f32],
                stride: usize,
            ) {
                let mut acc = [[[_mm256_setzero_ps(); 2]; Q]; B];
                for acc in acc.iter_mut() {
                    for (a, &s) in acc.iter_mut().zip(starts) {
                        *a = [_mm256_set1_ps(s); 2];
                    }
                }
                // Each query exactly `dim` long and `d` below `dim`: no bounds check in the loop.
                let dim = blocks.len() / (B * BLOCK);
                let queries: [&[f32]; Q] = std::array::from_fn(|a| &queries[a * dim..][..dim]);
                for q in &queries {
                    assert!(q.len() == dim);
                }
                let mut rows: [_; B] =
                    std::array::from_fn(|b| blocks[b * BLOCK * dim..][..BLOCK * dim].chunks_exact(BLOCK));
                for d in 0..dim {
                    for (acc, rows) in acc.iter_mut().zip(rows.iter_mut()) {
                        let lanes = rows.next().expect("a whole block row");
                        let [lo, hi] = $load256(lanes.try_into().expect("a whole block row"));
                        for (a, q) in acc.iter_mut().zip(&queries) {
                            let x = _mm256_set1_ps(q[d]);
                            a[0] = _mm256_fmadd_ps(x, lo, a[0]);
                            a[1] = _mm256_fmadd_ps(x, hi, a[1]);
                        }
                    }
                }
                for (b, acc) in acc.iter().enumerate() {
                    for (i, a) in acc.iter().enumerate() {
                        let o: &mut [f32; BLOCK] =
                            (&mut out[i * stride + b * BLOCK..][..BLOCK]).try_into().expect("16 outputs");
                        let (lo, hi) = o.split_at_mut(8);
                        // SAFETY: `lo` and `hi` are 8 writable f32 each; the stores need no alignment.
                        unsafe {
                            _mm256_storeu_ps(lo.as_mut_ptr(), a[0]);
                            _mm256_storeu_ps(hi.as_mut_ptr(), a[1]);
                        }
                    }
                }
            }
        };
    }

    group_kernels!(f32, group_avx512, lanes_avx512, group_avx2, lanes_avx2);
    group_kernels!(u8, code_group_avx512, code_lanes_avx512, code_group_avx2, code_lanes_avx2);

    macro_rules! products_kernel {
        ($name:ident, $element:ty, $group:ident, $features:literal, $most:literal, [$($q:literal),+], $wide:literal) => {
            /// Every block against the queries (sums started at `starts`, zero where it is
            /// empty), in groups of up to `$most` that share each load of the block (see
            /// [`super::products`] and [`super::code_products`]); a group of one or two
            /// queries takes `$wide` blocks at a time.
            #[target_feature(enable = $features)]
            pub(super) fn $name(
                queries: &[f32],
                starts: &[f32],
                dim: usize,
                blocks: &[$element],
                out: &mut [f32],
                stride: usize,
            ) {
                let nq = queries.len() / dim;
                let zeros = [0.0f32; $most];
                let mut first = 0;
                while first < nq {
                    let group = (nq - first).min($most);
                    let group_queries = &queries[first * dim..(first + group) * dim];
                    let starts = if starts.is_empty() { &zeros[..group] } else { &starts[first..first + group] };
                    let mut done = 0;
                    if group <= 2 {
                        for wide in blocks.chunks_exact($wide * BLOCK * dim) {
                            let at = &mut out[first * stride + done * BLOCK..];
                            match group {
                                1 => $group::<1, $wide>(group_queries, starts, wide, at, stride),
                                _ => $group::<2, $wide>(group_queries, starts, wide, at, stride),
                            }
                            done += $wide;
                        }
                    }
                    for block in blocks[done * BLOCK * dim..].chunks_exact(BLOCK * dim) {
                        let at = &mut out[first * stride + done * BLOCK..];
                        match group {
                            $($q => $group::<$q, 1>(group_queries, starts, block, at, stride),)+
                            _ => unreachable!("a group holds 1 to {} queries", $most),
                        }
                        done += 1;
                    }
                    first += group;
                }
            }
        };
    }

    products_kernel!(
        products_avx512,
        f32,
        group_avx512,
        "avx512f,avx512vl,fma",
        8,
        [1, 2, 3, 4, 5, 6, 7, 8],
        4
    );
    products_kernel!(products_avx2, f32, group_avx2, "avx2,fma", 4, [1, 2, 3, 4], 2);
    products_kernel!(
        code_products_avx512,
        u8,
        code_group_avx512,
        "avx512f,avx512vl,fma",
        8,
        [1, 2, 3, 4, 5, 6, 7, 8],
        4
    );
    products_kernel!(code_products_avx2, u8, code_group_avx2, "avx2,fma", 4, [1, 2, 3, 4], 2);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_products_at_every_level_and_group_size_match_f64_and_padding_gives_the_start() {
        // Byte codes across the whole 0..=255 range (a sign-extending widen would turn the
        // upper half negative), weights of both signs, starts per query; query counts around
        // every group size, rows short of a block, whole blocks and a partial last one, and
        // one or two queries over blocks taken several at a time (4 on AVX-512, 2 on AVX2)
        // with single blocks after them.
        let mut levels = vec![SimdLevel::detect(), SimdLevel::Scalar];
        if SimdLevel::detect() == SimdLevel::Avx512 {
            levels.push(SimdLevel::Avx2);
        }
        let mut seed = 23u64;
        let mut next = || super::super::simd::test_value(&mut seed);
        for dim in [1usize, 5, 16, 128, 131] {
            for (nq, count) in [
                (1usize, 1usize),
                (3, 16),
                (4, 17),
                (8, 33),
                (9, 5),
                (13, 40),
                (1, 100),
                (2, 130),
                (2, 64),
                (9, 64),
                (10, 70),
            ] {
                let weights: Vec<f32> = (0..nq * dim).map(|_| next() * 8.0).collect();
                let starts: Vec<f32> = (0..nq).map(|_| next() * 100.0).collect();
                let rows: Vec<Vec<u8>> =
                    (0..count).map(|_| (0..dim).map(|_| ((next() + 0.5) * 256.0) as u8).collect()).collect();
                let mut blocks = Vec::new();
                append(&mut blocks, 0, rows.iter().map(|r| &r[..]), dim);
                let padded = blocks.len() / dim;
                let stride = padded + 2;
                for &level in &levels {
                    let mut out = vec![f32::NAN; nq * stride];
                    code_products(level, &weights, &starts, dim, &blocks, &mut out, stride);
                    let gamma = f64::from(crate::exact::ErrorBound::gamma(dim + 1));
                    for i in 0..nq {
                        let w = &weights[i * dim..(i + 1) * dim];
                        for j in 0..padded {
                            let got = f64::from(out[i * stride + j]);
                            let start = f64::from(starts[i]);
                            if j >= count {
                                assert_eq!(got, start, "{level:?} dim {dim} padding [{i}][{j}]");
                                continue;
                            }
                            let terms = w.iter().zip(&rows[j]).map(|(&a, &c)| f64::from(a) * f64::from(c));
                            let want = start + terms.clone().sum::<f64>();
                            let scale = start.abs() + terms.map(f64::abs).sum::<f64>();
                            assert!(
                                (got - want).abs() <= gamma * scale + 1e-30,
                                "{level:?} dim {dim} {nq}x{count} [{i}][{j}]: {got} vs {want}"
                            );
                        }
                        for j in padded..stride.min(out.len() - i * stride) {
                            assert!(out[i * stride + j].is_nan(), "{level:?} wrote past the rows");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_level_and_group_size_matches_f64_within_the_f32_bound_and_padding_gives_zero() {
        let mut levels = vec![SimdLevel::detect(), SimdLevel::Scalar];
        if SimdLevel::detect() == SimdLevel::Avx512 {
            levels.push(SimdLevel::Avx2);
        }
        let mut seed = 5u64;
        let mut next = || super::super::simd::test_value(&mut seed);
        for dim in [1usize, 3, 16, 25, 128, 131] {
            // Row counts short of a block, whole blocks and a partial last one; query counts
            // around every group size (AVX-512 groups of 8, AVX2 and portable of 4); one or two
            // queries over blocks taken several at a time, with single blocks after them.
            for (nq, count) in [
                (1usize, 1usize),
                (3, 16),
                (4, 17),
                (8, 33),
                (9, 5),
                (13, 40),
                (1, 100),
                (2, 130),
                (2, 64),
                (9, 64),
                (10, 70),
            ] {
                let queries: Vec<f32> = (0..nq * dim).map(|_| next()).collect();
                let rows: Vec<Vec<f32>> = (0..count).map(|_| (0..dim).map(|_| next()).collect()).collect();
                // Packed in two appends, the second filling the first's padding.
                let mut blocks = Vec::new();
                let half = count / 2;
                append(&mut blocks, 0, rows[..half].iter().map(|r| &r[..]), dim);
                append(&mut blocks, half, rows[half..].iter().map(|r| &r[..]), dim);
                assert_eq!(blocks.len(), packed_len(count, dim));
                let padded = blocks.len() / dim;
                let stride = padded + 3;
                for &level in &levels {
                    let mut out = vec![f32::NAN; nq * stride];
                    products(level, &queries, dim, &blocks, &mut out, stride);
                    let gamma = f64::from(crate::exact::ErrorBound::gamma(dim));
                    for i in 0..nq {
                        let q = &queries[i * dim..(i + 1) * dim];
                        for j in 0..padded {
                            let got = f64::from(out[i * stride + j]);
                            if j >= count {
                                assert_eq!(got, 0.0, "{level:?} dim {dim} padding [{i}][{j}]");
                                continue;
                            }
                            let want: f64 =
                                q.iter().zip(&rows[j]).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                            let scale: f64 =
                                q.iter().zip(&rows[j]).map(|(&a, &b)| f64::from(a * b).abs()).sum();
                            assert!(
                                (got - want).abs() <= gamma * scale + 1e-30,
                                "{level:?} dim {dim} {nq}x{count} [{i}][{j}]: {got} vs {want}"
                            );
                        }
                        // Past the blocks' rows the stride's gap is left alone.
                        for j in padded..stride.min(out.len() - i * stride) {
                            assert!(out[i * stride + j].is_nan(), "{level:?} wrote past the rows");
                        }
                    }
                }
            }
        }
    }
}
