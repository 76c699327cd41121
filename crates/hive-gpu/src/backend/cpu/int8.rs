//! Exact inner products of byte-valued vectors with AVX512-VNNI (`vpdpbusd`): four times the
//! rate of f32 FMA, for data whose every component is an integer in 0..=255 (SIFT, BIGANN,
//! image pixels). The i32 sums are exact; only their conversion to f32 rounds.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, so queries enter as `q - 128` and the
//! missing `128 * sum(x)` is added back per row: `x.q = x.(q - 128) + 128 sum(x)`.

/// Rows per register block (two vectors of 16 lanes).
pub const ROW_GROUP: usize = 32;
/// Queries per register block.
pub const QUERY_GROUP: usize = 8;
/// Largest dimension whose sums cannot overflow i32 (`dim * 255 * 255 < 2^31`).
pub const MAX_DIM: usize = 32_768;

/// Whether this CPU runs the byte kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            std::env::var("HIVE_GPU_CPU_SIMD").is_err()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `x` is an integer in 0..=255. In that range the cast truncates toward zero, so it
/// gives `x` back exactly when `x` has no fraction; `f32::fract` is a call into libm's
/// `truncf` without SSE4.1, which took 8% of a 100-query search over 100 rows (the IVF probe
/// of SIFT10K; docs/PERFORMANCE.md, small searches).
pub fn is_byte(x: f32) -> bool {
    (0.0..=255.0).contains(&x) && f32::from(x as u8) == x
}

/// Whether every value is an integer in 0..=255 ([`is_byte`]). Each run of 32 values is tested
/// without an early exit, which the compiler vectorizes (a test that stops at the first miss
/// cannot be); the runs stop at the first one with a miss.
pub fn all_bytes(values: &[f32]) -> bool {
    values.chunks(32).all(|run| run.iter().fold(true, |all, &x| all & is_byte(x)))
}

/// Four-component groups per vector (the last padded with zeros).
pub fn quads(dim: usize) -> usize {
    dim.div_ceil(4)
}

/// Packs byte-valued queries as signed `q - 128` quads, `quads(dim)` per query, padded with
/// queries to a multiple of [`QUERY_GROUP`]. Padding components are 128, i.e. 0 once shifted.
pub fn pack_queries(queries: &[f32], dim: usize, out: &mut Vec<u32>) {
    let nq = queries.len() / dim;
    let nquads = quads(dim);
    out.clear();
    out.resize(nq.div_ceil(QUERY_GROUP) * QUERY_GROUP * nquads, 0);
    for (q, packed) in queries.chunks_exact(dim).zip(out.chunks_exact_mut(nquads)) {
        for (j, slot) in packed.iter_mut().enumerate() {
            let byte = |i: usize| q.get(4 * j + i).map_or(0u8, |&x| (x as i32 - 128) as i8 as u8);
            *slot = u32::from_le_bytes([byte(0), byte(1), byte(2), byte(3)]);
        }
    }
}

/// Packs byte-valued rows as unsigned quads interleaved across 16 lanes (as
/// [`super::bf16::pack_rows`] does for pairs), padded with zero rows to a multiple of
/// [`ROW_GROUP`]; `sums` receives each row's component sum.
pub fn pack_rows(rows: &[f32], dim: usize, out: &mut Vec<u32>, sums: &mut Vec<i32>) {
    let count = rows.len() / dim;
    let nquads = quads(dim);
    let padded = count.div_ceil(ROW_GROUP) * ROW_GROUP;
    out.clear();
    out.resize(padded * nquads, 0);
    sums.clear();
    sums.resize(padded, 0);
    let mut bytes = vec![0u8; nquads * 4];
    for (r, row) in rows.chunks_exact(dim).enumerate() {
        sums[r] = row_to_bytes(row, &mut bytes[..dim]);
        let (group, lane) = (r / 16, r % 16);
        let packed = &mut out[group * 16 * nquads..(group + 1) * 16 * nquads];
        for (j, quad) in bytes.as_chunks::<4>().0.iter().enumerate() {
            packed[j * 16 + lane] = u32::from_le_bytes(*quad);
        }
    }
}

/// Writes the byte value of each component of `row` into `out` and returns their sum.
fn row_to_bytes(row: &[f32], out: &mut [u8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: `available()` confirmed avx512f at run time.
        return unsafe { kernel::row_to_bytes(row, out) };
    }
    let mut sum = 0;
    for (b, &x) in out.iter_mut().zip(row) {
        *b = x as u8;
        sum += i32::from(*b);
    }
    sum
}

/// `out[q * stride + r] = query_q . row_r` (exact, then rounded to f32) for every packed
/// query and row. Returns false, computing nothing, where the CPU lacks the instructions.
pub fn products(
    queries: &[u32],
    rows: &[u32],
    nquads: usize,
    stride: usize,
    sums: &[i32],
    out: &mut [f32],
) -> bool {
    let nq = queries.len() / nquads;
    let nrows = rows.len() / nquads;
    if !available()
        || !nq.is_multiple_of(QUERY_GROUP)
        || !nrows.is_multiple_of(ROW_GROUP)
        || sums.len() < nrows
        || stride < nrows
        || out.len() < nq * stride
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available()` confirmed avx512f and avx512vnni at run time; the shapes were
    // checked above, and the kernel indexes only through bounds-checked slices.
    unsafe {
        kernel::products(queries, rows, nquads, stride, sums, out)
    };
    cfg!(target_arch = "x86_64")
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use std::arch::x86_64::*;

    use super::{QUERY_GROUP, ROW_GROUP};

    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) fn products(
        queries: &[u32],
        rows: &[u32],
        nquads: usize,
        stride: usize,
        sums: &[i32],
        out: &mut [f32],
    ) {
        let nq = queries.len() / nquads;
        let groups = rows.len() / (nquads * ROW_GROUP);
        for qg in 0..nq / QUERY_GROUP {
            let qs = &queries[qg * QUERY_GROUP * nquads..(qg + 1) * QUERY_GROUP * nquads];
            for g in 0..groups {
                let block = &rows[g * ROW_GROUP * nquads..(g + 1) * ROW_GROUP * nquads];
                let row_sums = &sums[g * ROW_GROUP..(g + 1) * ROW_GROUP];
                let acc = block_products(qs, block, nquads, row_sums);
                for (q, lanes) in acc.iter().enumerate() {
                    let at = (qg * QUERY_GROUP + q) * stride + g * ROW_GROUP;
                    let dst = &mut out[at..at + ROW_GROUP];
                    dst[..16].copy_from_slice(&lanes[0]);
                    dst[16..].copy_from_slice(&lanes[1]);
                }
            }
        }
    }

    /// 8 queries x 32 rows: 16 i32 accumulators in registers, one pass over the quads.
    #[target_feature(enable = "avx512f,avx512vnni")]
    #[inline]
    fn block_products(
        qs: &[u32],
        block: &[u32],
        nquads: usize,
        row_sums: &[i32],
    ) -> [[[f32; 16]; 2]; QUERY_GROUP] {
        let (low, high) = block.split_at(nquads * 16);
        let mut acc = [[_mm512_setzero_si512(); 2]; QUERY_GROUP];
        for j in 0..nquads {
            let b0 = load(&low[j * 16..j * 16 + 16]);
            let b1 = load(&high[j * 16..j * 16 + 16]);
            for (q, lanes) in acc.iter_mut().enumerate() {
                let a = _mm512_set1_epi32(qs[q * nquads + j] as i32);
                lanes[0] = _mm512_dpbusd_epi32(lanes[0], b0, a);
                lanes[1] = _mm512_dpbusd_epi32(lanes[1], b1, a);
            }
        }
        // x.q = x.(q - 128) + 128 sum(x)
        let shift0 = _mm512_slli_epi32::<7>(load_i32(&row_sums[..16]));
        let shift1 = _mm512_slli_epi32::<7>(load_i32(&row_sums[16..]));
        let mut out = [[_mm512_setzero_ps(); 2]; QUERY_GROUP];
        for (o, lanes) in out.iter_mut().zip(acc) {
            o[0] = _mm512_cvtepi32_ps(_mm512_add_epi32(lanes[0], shift0));
            o[1] = _mm512_cvtepi32_ps(_mm512_add_epi32(lanes[1], shift1));
        }
        // SAFETY: [[__m512; 2]; 8] and [[[f32; 16]; 2]; 8] have the same size and every bit
        // pattern is a valid f32.
        unsafe { std::mem::transmute::<[[__m512; 2]; QUERY_GROUP], [[[f32; 16]; 2]; QUERY_GROUP]>(out) }
    }

    /// Converts byte-valued f32 to bytes 16 at a time (`vcvttps2dq` + `vpmovdb`).
    #[target_feature(enable = "avx512f")]
    pub(super) fn row_to_bytes(row: &[f32], out: &mut [u8]) -> i32 {
        let (chunks, tail) = row.as_chunks::<16>();
        let (out_chunks, out_tail) = out.as_chunks_mut::<16>();
        let mut sums = _mm512_setzero_si512();
        for (c, o) in chunks.iter().zip(out_chunks) {
            // SAFETY: `c` is 16 readable f32; the load has no alignment requirement.
            let ints = _mm512_cvttps_epi32(unsafe { _mm512_loadu_ps(c.as_ptr()) });
            sums = _mm512_add_epi32(sums, ints);
            // SAFETY: __m128i and [u8; 16] have the same size; every bit pattern is valid.
            *o = unsafe { std::mem::transmute::<__m128i, [u8; 16]>(_mm512_cvtepi32_epi8(ints)) };
        }
        let mut sum = _mm512_reduce_add_epi32(sums);
        for (b, &x) in out_tail.iter_mut().zip(tail) {
            *b = x as u8;
            sum += i32::from(*b);
        }
        sum
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    fn load(lanes: &[u32]) -> __m512i {
        let lanes: &[u32; 16] = lanes.try_into().unwrap_or(&[0; 16]);
        // SAFETY: `lanes` is 64 readable bytes; the load has no alignment requirement.
        unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    fn load_i32(lanes: &[i32]) -> __m512i {
        let lanes: &[i32; 16] = lanes.try_into().unwrap_or(&[0; 16]);
        // SAFETY: `lanes` is 64 readable bytes; the load has no alignment requirement.
        unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_detection() {
        assert!(is_byte(0.0) && is_byte(255.0) && is_byte(17.0));
        assert!(!is_byte(-1.0) && !is_byte(256.0) && !is_byte(0.5) && !is_byte(f32::NAN));
        assert!(all_bytes(&[7.0; 70]) && all_bytes(&[]));
        for miss in [0, 31, 32, 69] {
            let mut values = [3.0f32; 70];
            values[miss] = 0.5;
            assert!(!all_bytes(&values), "a fraction at {miss}");
        }
        assert!(is_byte(-0.0) && !is_byte(254.99998) && !is_byte(f32::INFINITY) && !is_byte(1e-45));
    }

    #[test]
    fn products_are_exact_for_bytes() {
        if !available() {
            return; // nothing to check on CPUs without AVX512-VNNI; the other paths serve them
        }
        for dim in [1usize, 3, 4, 5, 128, 784, 785] {
            let (nq, nrows) = (11, 45);
            let value = |i: usize| ((i * 7919 + 13) % 256) as f32;
            let queries: Vec<f32> = (0..nq * dim).map(value).collect();
            let rows: Vec<f32> = (0..nrows * dim).map(|i| value(i * 31 + 7)).collect();
            let (mut qp, mut rp, mut sums) = (Vec::new(), Vec::new(), Vec::new());
            pack_queries(&queries, dim, &mut qp);
            pack_rows(&rows, dim, &mut rp, &mut sums);
            let nquads = quads(dim);
            let stride = rp.len() / nquads;
            let mut out = vec![f32::NAN; (qp.len() / nquads) * stride];
            assert!(products(&qp, &rp, nquads, stride, &sums, &mut out));
            for q in 0..nq {
                for r in 0..nrows {
                    let want: i64 =
                        (0..dim).map(|i| queries[q * dim + i] as i64 * rows[r * dim + i] as i64).sum();
                    assert_eq!(out[q * stride + r], want as f32, "dim {dim} q {q} r {r}");
                }
            }
        }
    }
}
