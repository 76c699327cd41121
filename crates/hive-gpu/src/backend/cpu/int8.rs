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
    append_queries(queries, dim, out);
    out.resize(nq.div_ceil(QUERY_GROUP) * QUERY_GROUP * nquads, 0);
}

/// The packed quads of byte-valued queries ([`pack_queries`]' layout, `quads(dim)` per query,
/// no padding queries), appended to `out`. `x - 128` of a byte is the byte with its top bit
/// flipped; the conversion is [`row_to_bytes`]'s, 16 values at a time: a value at a time it was
/// a tenth of a batch over small lists (docs/PERFORMANCE.md, "Byte-valued lists").
pub fn append_queries(queries: &[f32], dim: usize, out: &mut Vec<u32>) {
    let nquads = quads(dim);
    let mut bytes = vec![0u8; nquads * 4];
    out.reserve(queries.len() / dim.max(1) * nquads);
    for q in queries.chunks_exact(dim) {
        row_to_bytes(q, &mut bytes[..dim]);
        for b in &mut bytes[..dim] {
            *b ^= 0x80;
        }
        out.extend(bytes.as_chunks::<4>().0.iter().map(|quad| u32::from_le_bytes(*quad)));
    }
}

/// Packs byte-valued rows as unsigned quads interleaved across 16 lanes (as
/// [`super::bf16::pack_rows`] does for pairs), padded with zero rows to a multiple of
/// [`ROW_GROUP`]; `sums` receives each row's component sum.
pub fn pack_rows(rows: &[f32], dim: usize, out: &mut Vec<u32>, sums: &mut Vec<i32>) {
    out.clear();
    sums.clear();
    append_rows(out, sums, 0, rows.chunks_exact(dim), dim);
}

/// Packs `rows` (byte-valued, `dim` components each) as rows `from, from + 1, ...` of a copy
/// that [`pack_rows`] laid out and that holds `from` rows: what is packed stays, the padding
/// rows the new ones land on are written, and `out` and `sums` grow (zeroed) to the next
/// multiple of [`ROW_GROUP`] rows. The caller reserves the room first where an allocation
/// must not abort.
pub fn append_rows<'a>(
    out: &mut Vec<u32>,
    sums: &mut Vec<i32>,
    from: usize,
    rows: impl ExactSizeIterator<Item = &'a [f32]>,
    dim: usize,
) {
    let nquads = quads(dim);
    let padded = (from + rows.len()).div_ceil(ROW_GROUP) * ROW_GROUP;
    out.resize(padded * nquads, 0);
    sums.resize(padded, 0);
    let mut bytes = vec![0u8; nquads * 4];
    for (r, row) in (from..).zip(rows) {
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
/// query and row, the queries padded to whole groups of [`QUERY_GROUP`] ([`pack_queries`]).
/// Returns false, computing nothing, where the CPU lacks the instructions or the shapes do not
/// fit ([`products_any`]).
pub fn products(
    queries: &[u32],
    rows: &[u32],
    nquads: usize,
    stride: usize,
    sums: &[i32],
    out: &mut [f32],
) -> bool {
    nquads > 0
        && (queries.len() / nquads).is_multiple_of(QUERY_GROUP)
        && products_any(queries, rows, nquads, stride, sums, out)
}

/// [`products`] for any number of packed queries: runs of 8 share each load of the rows, and
/// the 1 to 7 left take register blocks of 4, 2 and 1 (an IVF list is asked by a few queries
/// of a batch, often fewer than 8: padding them to 8 would multiply up to 8 times the rows).
/// Returns false, computing nothing, where the CPU lacks the instructions or the shapes do not
/// fit: rows a multiple of [`ROW_GROUP`], `stride` at least the rows, `out` room for every
/// query's row of products.
pub fn products_any(
    queries: &[u32],
    rows: &[u32],
    nquads: usize,
    stride: usize,
    sums: &[i32],
    out: &mut [f32],
) -> bool {
    if nquads == 0 {
        return false;
    }
    let nq = queries.len() / nquads;
    let nrows = rows.len() / nquads;
    if !available()
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
        kernel::products_any(queries, rows, nquads, stride, sums, out)
    };
    cfg!(target_arch = "x86_64")
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use std::arch::x86_64::*;

    use super::ROW_GROUP;

    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) fn products_any(
        queries: &[u32],
        rows: &[u32],
        nquads: usize,
        stride: usize,
        sums: &[i32],
        out: &mut [f32],
    ) {
        let nq = queries.len() / nquads;
        let mut q0 = 0;
        while q0 < nq {
            let left = nq - q0;
            match left {
                8.. => run::<8>(queries, rows, nquads, stride, sums, out, q0),
                4..=7 => run::<4>(queries, rows, nquads, stride, sums, out, q0),
                2..=3 => run::<2>(queries, rows, nquads, stride, sums, out, q0),
                _ => run::<1>(queries, rows, nquads, stride, sums, out, q0),
            }
            q0 += match left {
                8.. => 8,
                4..=7 => 4,
                2..=3 => 2,
                _ => 1,
            };
        }
    }

    /// Queries `q0..q0 + G` over every row group.
    #[target_feature(enable = "avx512f,avx512vnni")]
    #[inline]
    fn run<const G: usize>(
        queries: &[u32],
        rows: &[u32],
        nquads: usize,
        stride: usize,
        sums: &[i32],
        out: &mut [f32],
        q0: usize,
    ) {
        let qs = &queries[q0 * nquads..(q0 + G) * nquads];
        for g in 0..rows.len() / (nquads * ROW_GROUP) {
            let block = &rows[g * ROW_GROUP * nquads..(g + 1) * ROW_GROUP * nquads];
            let acc = block_products::<G>(qs, block, nquads, &sums[g * ROW_GROUP..(g + 1) * ROW_GROUP]);
            for (q, lanes) in acc.iter().enumerate() {
                let at = (q0 + q) * stride + g * ROW_GROUP;
                let dst = &mut out[at..at + ROW_GROUP];
                dst[..16].copy_from_slice(&lanes[0]);
                dst[16..].copy_from_slice(&lanes[1]);
            }
        }
    }

    /// G queries x 32 rows: 2G i32 accumulators in registers, one pass over the quads.
    #[target_feature(enable = "avx512f,avx512vnni")]
    #[inline]
    fn block_products<const G: usize>(
        qs: &[u32],
        block: &[u32],
        nquads: usize,
        row_sums: &[i32],
    ) -> [[[f32; 16]; 2]; G] {
        let (low, high) = block.split_at(nquads * 16);
        let mut acc = [[_mm512_setzero_si512(); 2]; G];
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
        let mut out = [[[0f32; 16]; 2]; G];
        for (o, lanes) in out.iter_mut().zip(acc) {
            // SAFETY: each `o[h]` is 16 writable f32; the stores need no alignment.
            unsafe {
                _mm512_storeu_ps(o[0].as_mut_ptr(), _mm512_cvtepi32_ps(_mm512_add_epi32(lanes[0], shift0)));
                _mm512_storeu_ps(o[1].as_mut_ptr(), _mm512_cvtepi32_ps(_mm512_add_epi32(lanes[1], shift1)));
            }
        }
        out
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
    fn products_of_any_count_of_queries_over_rows_packed_in_two_appends_are_exact() {
        // 1 to 19 queries (every register block: runs of 8, then 4, 2 and 1), rows packed as
        // 37 and then 30 more (the second append lands in the first one's padding), a stride
        // past the rows, and the extreme values 0 and 255 on both sides.
        if !available() {
            return; // nothing to check on CPUs without AVX512-VNNI; the other paths serve them
        }
        for dim in [1usize, 6, 128, 131] {
            let value = |i: usize| match i % 11 {
                0 => 0.0,
                1 => 255.0,
                _ => ((i * 7919 + 13) % 256) as f32,
            };
            let rows: Vec<f32> = (0..67 * dim).map(|i| value(i * 31 + 7)).collect();
            let (mut packed, mut sums) = (Vec::new(), Vec::new());
            append_rows(&mut packed, &mut sums, 0, rows[..37 * dim].chunks_exact(dim), dim);
            append_rows(&mut packed, &mut sums, 37, rows[37 * dim..].chunks_exact(dim), dim);
            let (mut whole, mut whole_sums) = (Vec::new(), Vec::new());
            pack_rows(&rows, dim, &mut whole, &mut whole_sums);
            assert_eq!((&packed, &sums), (&whole, &whole_sums), "dim {dim}: two appends pack as one");
            let nquads = quads(dim);
            let stride = packed.len() / nquads + 32;
            for nq in 1..=19 {
                let queries: Vec<f32> = (0..nq * dim).map(value).collect();
                let mut quads_of = Vec::new();
                append_queries(&queries, dim, &mut quads_of);
                let mut out = vec![f32::NAN; nq * stride];
                assert!(products_any(&quads_of, &packed, nquads, stride, &sums, &mut out));
                for q in 0..nq {
                    for r in 0..67 {
                        let want: i64 =
                            (0..dim).map(|i| queries[q * dim + i] as i64 * rows[r * dim + i] as i64).sum();
                        assert_eq!(out[q * stride + r], want as f32, "dim {dim}, {nq} queries: q {q} r {r}");
                    }
                }
            }
        }
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
