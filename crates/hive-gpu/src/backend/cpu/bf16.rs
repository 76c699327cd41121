//! Inner products in bfloat16 with AVX512-BF16 (`vdpbf16ps`): twice the rate of f32 FMA.
//!
//! Only a first pass: the products carry the bf16 rounding of their inputs, which the caller
//! bounds from the actual rounding residuals (zero for small integers such as SIFT or pixel
//! values) and then removes with the exact re-rank of [`super::topk`].

/// Rows per register block (two vectors of 16 lanes).
pub const ROW_GROUP: usize = 32;
/// Queries per register block.
pub const QUERY_GROUP: usize = 8;

/// Whether this CPU runs the bf16 kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            std::env::var("HIVE_GPU_CPU_SIMD").is_err()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The bf16 nearest to `x` (ties to even), as the kernel sees it.
pub fn round(x: f32) -> f32 {
    f32::from_bits(bits(x) << 16)
}

/// The bits of the bf16 nearest to the finite `x`, ties to even, with denormals flushed to
/// a signed zero: exactly what `vcvtne2ps2bf16` produces and what `vdpbf16ps` reads (it
/// treats denormal inputs as zero), so the residuals that bound the kernel's error are
/// computed on the values the kernel really uses.
#[inline(always)]
fn bits(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x7F80_0000 == 0 {
        return (b >> 16) & 0x8000;
    }
    b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16
}

/// `|v - bf16(v)|` in f64.
pub fn residual(v: &[f32]) -> f64 {
    v.iter().map(|&x| (f64::from(x) - f64::from(round(x))).powi(2)).sum::<f64>().sqrt()
}

/// Component pairs per vector (odd dimensions get a zero pad).
pub fn pairs(dim: usize) -> usize {
    dim.div_ceil(2)
}

/// Packs queries as bf16 pairs, `pairs(dim)` per query, padded with zero queries to a
/// multiple of [`QUERY_GROUP`].
pub fn pack_queries(queries: &[f32], dim: usize, out: &mut Vec<u32>) {
    let nq = queries.len() / dim;
    let np = pairs(dim);
    out.clear();
    out.resize(nq.div_ceil(QUERY_GROUP) * QUERY_GROUP * np, 0);
    for (q, packed) in queries.chunks_exact(dim).zip(out.chunks_exact_mut(np)) {
        for (j, slot) in packed.iter_mut().enumerate() {
            *slot = pair_bits(q[2 * j], q.get(2 * j + 1).copied().unwrap_or(0.0));
        }
    }
}

/// Packs `count` rows as bf16 pairs interleaved across 16 lanes: for each group of 16 rows,
/// for each pair index j, 16 u32 (one per row). Padded with zero rows to a multiple of
/// [`ROW_GROUP`].
pub fn pack_rows(rows: &[f32], dim: usize, out: &mut Vec<u32>) {
    let count = rows.len() / dim;
    let np = pairs(dim);
    out.clear();
    out.resize(count.div_ceil(ROW_GROUP) * ROW_GROUP * np, 0);
    let mut words = vec![0u32; np];
    for (r, row) in rows.chunks_exact(dim).enumerate() {
        row_to_pairs(row, &mut words);
        let (group, lane) = (r / 16, r % 16);
        let packed = &mut out[group * 16 * np..(group + 1) * 16 * np];
        for (j, &word) in words.iter().enumerate() {
            packed[j * 16 + lane] = word;
        }
    }
}

/// One row as bf16 pairs (the last padded with zero when the dimension is odd).
fn row_to_pairs(row: &[f32], out: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: `available()` confirmed avx512f and avx512bf16 at run time.
        unsafe { kernel::row_to_pairs(row, out) };
        return;
    }
    let (even, odd) = row.as_chunks::<2>();
    for (w, p) in out.iter_mut().zip(even) {
        *w = pair_bits(p[0], p[1]);
    }
    if let Some(&last) = odd.first() {
        out[even.len()] = pair_bits(last, 0.0);
    }
}

/// Two finite f32 rounded to the nearest bf16 (ties to even), packed low then high.
#[inline(always)]
fn pair_bits(lo: f32, hi: f32) -> u32 {
    bits(lo) | (bits(hi) << 16)
}

/// `products[q * stride + r] = query_q . row_r` for every packed query and row
/// (`stride` >= padded row count). Returns false, computing nothing, where the CPU lacks
/// the instructions.
pub fn products(queries: &[u32], rows: &[u32], np: usize, stride: usize, out: &mut [f32]) -> bool {
    let nq = queries.len() / np;
    let nrows = rows.len() / np;
    if !available()
        || !nq.is_multiple_of(QUERY_GROUP)
        || !nrows.is_multiple_of(ROW_GROUP)
        || stride < nrows
        || out.len() < nq * stride
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available()` confirmed avx512f and avx512bf16 at run time; the shapes were
    // checked above, and the kernel indexes only through bounds-checked slices.
    unsafe {
        kernel::products(queries, rows, np, stride, out)
    };
    cfg!(target_arch = "x86_64")
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use std::arch::x86_64::*;

    use super::{QUERY_GROUP, ROW_GROUP};

    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) fn products(queries: &[u32], rows: &[u32], np: usize, stride: usize, out: &mut [f32]) {
        let nq = queries.len() / np;
        let groups = rows.len() / (np * ROW_GROUP);
        for qg in 0..nq / QUERY_GROUP {
            let qs = &queries[qg * QUERY_GROUP * np..(qg + 1) * QUERY_GROUP * np];
            for g in 0..groups {
                let block = &rows[g * ROW_GROUP * np..(g + 1) * ROW_GROUP * np];
                let acc = block_products(qs, block, np);
                for (q, lanes) in acc.iter().enumerate() {
                    let at = (qg * QUERY_GROUP + q) * stride + g * ROW_GROUP;
                    let dst = &mut out[at..at + ROW_GROUP];
                    dst[..16].copy_from_slice(&lanes[0]);
                    dst[16..].copy_from_slice(&lanes[1]);
                }
            }
        }
    }

    /// 8 queries x 32 rows: 16 accumulators in registers, one pass over the pairs.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    fn block_products(qs: &[u32], block: &[u32], np: usize) -> [[[f32; 16]; 2]; QUERY_GROUP] {
        let (low, high) = block.split_at(np * 16);
        let mut acc = [[_mm512_setzero_ps(); 2]; QUERY_GROUP];
        for j in 0..np {
            let b0 = load(&low[j * 16..j * 16 + 16]);
            let b1 = load(&high[j * 16..j * 16 + 16]);
            for (q, lanes) in acc.iter_mut().enumerate() {
                let a = as_bf16(_mm512_set1_epi32(qs[q * np + j] as i32));
                lanes[0] = _mm512_dpbf16_ps(lanes[0], a, b0);
                lanes[1] = _mm512_dpbf16_ps(lanes[1], a, b1);
            }
        }
        // SAFETY: [[__m512; 2]; 8] and [[[f32; 16]; 2]; 8] have the same size and every bit
        // pattern is a valid f32.
        unsafe { std::mem::transmute::<[[__m512; 2]; QUERY_GROUP], [[[f32; 16]; 2]; QUERY_GROUP]>(acc) }
    }

    /// 32 components at a time through `vcvtne2ps2bf16` (round to nearest even, denormals
    /// flushed), the same rounding as [`super::bits`].
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) fn row_to_pairs(row: &[f32], out: &mut [u32]) {
        let (chunks, tail) = row.as_chunks::<32>();
        // Split the output where the whole chunks end, not at its own multiple of 16: with
        // dim % 32 == 31 the padded output has one more whole chunk than the row.
        let (out_head, out_tail) = out.split_at_mut(chunks.len() * 16);
        let out_chunks = out_head.as_chunks_mut::<16>().0;
        for (c, o) in chunks.iter().zip(out_chunks) {
            let (lo, hi) = c.split_at(16);
            // SAFETY: `lo` and `hi` are 16 readable f32 each; the loads need no alignment.
            let (lo, hi) = unsafe { (_mm512_loadu_ps(lo.as_ptr()), _mm512_loadu_ps(hi.as_ptr())) };
            // SAFETY: __m512bh and [u32; 16] have the same size; every bit pattern is valid.
            *o = unsafe { std::mem::transmute::<__m512bh, [u32; 16]>(_mm512_cvtne2ps_pbh(hi, lo)) };
        }
        let (pairs, odd) = tail.as_chunks::<2>();
        for (w, p) in out_tail.iter_mut().zip(pairs) {
            *w = super::pair_bits(p[0], p[1]);
        }
        if let Some(&last) = odd.first() {
            out_tail[pairs.len()] = super::pair_bits(last, 0.0);
        }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    fn load(lanes: &[u32]) -> __m512bh {
        let lanes: &[u32; 16] = lanes.try_into().unwrap_or(&[0; 16]);
        // SAFETY: `lanes` is 64 readable bytes; the load has no alignment requirement.
        as_bf16(unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) })
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    fn as_bf16(v: __m512i) -> __m512bh {
        // SAFETY: both are 64-byte vectors; every bit pattern is a valid pair of bf16 values.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_the_half_crate() {
        for x in [
            0.0f32,
            -0.0,
            1.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            2.5137,
            -2.7e-3,
            6.5e30,
            2e-38,
            255.0,
            257.0,
        ] {
            assert_eq!(round(x), half::bf16::from_f32(x).to_f32(), "{x}");
        }
        // Denormals become zero, as in the instructions.
        assert_eq!(round(1e-39), 0.0);
        assert_eq!(round(-1e-39).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn vector_and_scalar_packing_agree() {
        let row: Vec<f32> = (0..71)
            .map(|i| ((i * 7919 % 997) as f32 - 500.0) * 1.37e-3 + if i == 5 { 1e-39 } else { 0.0 })
            .collect();
        let mut fast = vec![0u32; pairs(row.len())];
        row_to_pairs(&row, &mut fast);
        for (j, &w) in fast.iter().enumerate() {
            let lo = row[2 * j];
            let hi = row.get(2 * j + 1).copied().unwrap_or(0.0);
            assert_eq!(w, pair_bits(lo, hi), "pair {j}");
        }
    }

    #[test]
    fn products_match_bf16_rounded_f64_dots() {
        if !available() {
            return; // nothing to check on CPUs without AVX512-BF16; the f32 path serves them
        }
        for dim in [1usize, 3, 16, 33, 128] {
            let nq = 11;
            let nrows = 45;
            let value = |i: usize| ((i * 7919 % 997) as f32 / 97.0) - 5.0;
            let queries: Vec<f32> = (0..nq * dim).map(value).collect();
            let rows: Vec<f32> = (0..nrows * dim).map(|i| value(i + 13)).collect();
            let (mut qp, mut rp) = (Vec::new(), Vec::new());
            pack_queries(&queries, dim, &mut qp);
            pack_rows(&rows, dim, &mut rp);
            let np = pairs(dim);
            let stride = rp.len() / np;
            let mut out = vec![f32::NAN; (qp.len() / np) * stride];
            assert!(products(&qp, &rp, np, stride, &mut out));
            for q in 0..nq {
                for r in 0..nrows {
                    let want: f64 = (0..dim)
                        .map(|i| f64::from(round(queries[q * dim + i])) * f64::from(round(rows[r * dim + i])))
                        .sum();
                    let got = f64::from(out[q * stride + r]);
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "dim {dim} q {q} r {r}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
