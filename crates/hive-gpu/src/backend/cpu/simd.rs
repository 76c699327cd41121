//! Distance kernels for the scan path, compiled once per SIMD level and picked at run time.
//!
//! On x86-64 the kernels use explicit AVX-512 / AVX2 intrinsics (LLVM's auto-vectoriser does
//! not reliably reach full width here); elsewhere a lane-parallel portable version serves
//! (NEON is the aarch64 baseline, so LLVM vectorises it there). Each call into a
//! `#[target_feature]` function is `unsafe` and happens only after the feature was detected.

use std::sync::OnceLock;

/// The widest instruction set the CPU backend uses on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// x86-64 with AVX-512F, AVX-512VL and FMA.
    Avx512,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// 64-bit Arm with NEON.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Neon,
    /// No vector extension we use.
    Scalar,
}

impl SimdLevel {
    /// The level this machine supports, detected once.
    pub fn detect() -> SimdLevel {
        static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
        *LEVEL.get_or_init(detect_uncached)
    }

    /// Lower-case name ("avx512", "avx2", "neon", "scalar").
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Neon => "neon",
            SimdLevel::Scalar => "scalar",
        }
    }
}

fn detect_uncached() -> SimdLevel {
    if let Ok(forced) = std::env::var("HIVE_GPU_CPU_SIMD") {
        // Lets the conformance suite run every kernel on one machine; only downgrades.
        let native = detect_native();
        let wanted = match forced.as_str() {
            "avx2" => SimdLevel::Avx2,
            "scalar" => SimdLevel::Scalar,
            _ => native,
        };
        return if rank(wanted) <= rank(native) { wanted } else { native };
    }
    detect_native()
}

fn rank(level: SimdLevel) -> u8 {
    match level {
        SimdLevel::Scalar => 0,
        SimdLevel::Neon | SimdLevel::Avx2 => 1,
        SimdLevel::Avx512 => 2,
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_native() -> SimdLevel {
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("fma")
    {
        SimdLevel::Avx512
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        SimdLevel::Avx2
    } else {
        SimdLevel::Scalar
    }
}

#[cfg(target_arch = "aarch64")]
fn detect_native() -> SimdLevel {
    SimdLevel::Neon
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_native() -> SimdLevel {
    SimdLevel::Scalar
}

const LANES: usize = 32;

/// Which quantity a scan computes per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Squared Euclidean distance, by differences (no cancellation on near-duplicates).
    L2,
    /// Inner product.
    Dot,
    /// Sum of absolute differences (L1).
    L1,
    /// Largest absolute difference (L-infinity).
    Linf,
}

impl Kernel {
    /// The kernel whose raw value a scan of `metric` turns into its distance.
    pub fn for_metric(metric: crate::types::GpuDistanceMetric) -> Kernel {
        use crate::types::GpuDistanceMetric as M;
        match metric {
            M::Euclidean => Kernel::L2,
            M::DotProduct | M::Cosine => Kernel::Dot,
            M::Manhattan => Kernel::L1,
            M::Chebyshev => Kernel::Linf,
        }
    }

    /// One component's term, as the kernels compute it in f32.
    #[inline(always)]
    fn term(self, a: f32, b: f32) -> f32 {
        match self {
            Kernel::L2 => (a - b) * (a - b),
            Kernel::Dot => a * b,
            Kernel::L1 | Kernel::Linf => (a - b).abs(),
        }
    }
}

/// One row's sum in portable code, lane-parallel over fixed-size chunks.
#[inline(always)]
fn reduce_one<const L2: bool, const FMA: bool>(q: &[f32], row: &[f32]) -> f32 {
    let (q_chunks, q_tail) = q.as_chunks::<LANES>();
    let (r_chunks, r_tail) = row.as_chunks::<LANES>();
    let mut acc = [0f32; LANES];
    for (a, b) in q_chunks.iter().zip(r_chunks) {
        for i in 0..LANES {
            let (x, y) = if L2 { (a[i] - b[i], a[i] - b[i]) } else { (a[i], b[i]) };
            acc[i] = if FMA { x.mul_add(y, acc[i]) } else { acc[i] + x * y };
        }
    }
    let mut tail = 0f32;
    for (a, b) in q_tail.iter().zip(r_tail) {
        tail += if L2 { (a - b) * (a - b) } else { a * b };
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0] + tail
}

/// One row's L1 (sum) or L-infinity (maximum) of absolute differences in portable code,
/// lane-parallel like [`reduce_one`].
#[inline(always)]
fn reduce_differences<const MAX: bool>(q: &[f32], row: &[f32]) -> f32 {
    let (q_chunks, q_tail) = q.as_chunks::<LANES>();
    let (r_chunks, r_tail) = row.as_chunks::<LANES>();
    let mut acc = [0f32; LANES];
    for (a, b) in q_chunks.iter().zip(r_chunks) {
        for i in 0..LANES {
            let d = (a[i] - b[i]).abs();
            acc[i] = if MAX { acc[i].max(d) } else { acc[i] + d };
        }
    }
    let mut tail = 0f32;
    for (a, b) in q_tail.iter().zip(r_tail) {
        let d = (a - b).abs();
        tail = if MAX { tail.max(d) } else { tail + d };
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] = if MAX { acc[i].max(acc[i + width]) } else { acc[i] + acc[i + width] };
        }
    }
    if MAX { acc[0].max(tail) } else { acc[0] + tail }
}

fn rows_portable<const FMA: bool>(kernel: Kernel, q: &[f32], rows: &[f32], out: &mut [f32]) {
    for (row, o) in rows.chunks_exact(q.len()).zip(out.iter_mut()) {
        *o = match kernel {
            Kernel::L2 => reduce_one::<true, FMA>(q, row),
            Kernel::Dot => reduce_one::<false, FMA>(q, row),
            Kernel::L1 => reduce_differences::<false>(q, row),
            Kernel::Linf => reduce_differences::<true>(q, row),
        };
    }
}

/// Explicit x86 kernels, one row at a time: rows stream from memory in order, which keeps the
/// hardware prefetchers at full speed (interleaving several rows measured half as fast).
#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::Kernel;

    fn tail(kernel: Kernel, q: &[f32], row: &[f32]) -> f32 {
        let terms = q.iter().zip(row).map(|(&a, &b)| kernel.term(a, b));
        if kernel == Kernel::Linf { terms.fold(0.0, f32::max) } else { terms.sum() }
    }

    macro_rules! four_rows_kernel {
        ($name:ident, $features:literal, $lanes:literal, $vec:ty, $zero:ident, $load:ident, $sub:ident,
         $fma:ident, $sum:ident, $add:ident, $abs:ident, $max:ident, $hmax:ident) => {
            #[target_feature(enable = $features)]
            pub(super) fn $name(kernel: Kernel, q: &[f32], rows: &[f32], out: &mut [f32]) {
                #[target_feature(enable = $features)]
                #[inline]
                fn load(v: &[f32; $lanes]) -> $vec {
                    // SAFETY: `v` is $lanes readable f32 and the load needs no alignment.
                    unsafe { $load(v.as_ptr()) }
                }
                #[target_feature(enable = $features)]
                #[inline]
                fn step(kernel: Kernel, q: $vec, x: $vec, acc: $vec) -> $vec {
                    match kernel {
                        Kernel::L2 => {
                            let d = $sub(q, x);
                            $fma(d, d, acc)
                        }
                        Kernel::Dot => $fma(q, x, acc),
                        Kernel::L1 => $add($abs($sub(q, x)), acc),
                        Kernel::Linf => $max($abs($sub(q, x)), acc),
                    }
                }
                let dim = q.len();
                let (q_pairs, q_rest) = q.as_chunks::<{ 2 * $lanes }>();
                let (q_single, q_tail) = q_rest.as_chunks::<$lanes>();
                let whole = dim - q_tail.len();
                for (row, o) in rows.chunks_exact(dim).zip(out.iter_mut()) {
                    let (r_pairs, r_rest) = row.as_chunks::<{ 2 * $lanes }>();
                    let r_single = r_rest.as_chunks::<$lanes>().0;
                    // Two accumulators halve the dependency chain of one row.
                    let (mut even, mut odd) = ($zero(), $zero());
                    for (qv, xv) in q_pairs.iter().zip(r_pairs) {
                        let (q, x) = (qv.as_chunks::<$lanes>().0, xv.as_chunks::<$lanes>().0);
                        even = step(kernel, load(&q[0]), load(&x[0]), even);
                        odd = step(kernel, load(&q[1]), load(&x[1]), odd);
                    }
                    for (qv, xv) in q_single.iter().zip(r_single) {
                        even = step(kernel, load(qv), load(xv), even);
                    }
                    let rest = tail(kernel, q_tail, &row[whole..]);
                    *o = if kernel == Kernel::Linf {
                        $hmax($max(even, odd)).max(rest)
                    } else {
                        $sum(even) + $sum(odd) + rest
                    };
                }
            }
        };
    }

    /// The sum of the eight lanes of `v` (also the few-query kernels' reduction, `few.rs`).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in crate::backend::cpu) fn sum256(v: __m256) -> f32 {
        let halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
        _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)))
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn max256(v: __m256) -> f32 {
        let halves = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let pairs = _mm_max_ps(halves, _mm_movehl_ps(halves, halves));
        _mm_cvtss_f32(_mm_max_ss(pairs, _mm_movehdup_ps(pairs)))
    }

    /// `|v|`: the sign bits cleared.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn abs256(v: __m256) -> __m256 {
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
    }

    four_rows_kernel!(
        rows_avx512,
        "avx512f",
        16,
        __m512,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_sub_ps,
        _mm512_fmadd_ps,
        _mm512_reduce_add_ps,
        _mm512_add_ps,
        _mm512_abs_ps,
        _mm512_max_ps,
        _mm512_reduce_max_ps
    );
    four_rows_kernel!(
        rows_avx2,
        "avx2,fma",
        8,
        __m256,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_sub_ps,
        _mm256_fmadd_ps,
        sum256,
        _mm256_add_ps,
        abs256,
        _mm256_max_ps,
        max256
    );
}

/// Computes `kernel(q, row)` for each row of the row-major block `rows` into `out`
/// (`out.len()` rows; `q.len()` is the dimension).
pub fn distances(level: SimdLevel, kernel: Kernel, q: &[f32], rows: &[f32], out: &mut [f32]) {
    debug_assert!(rows.len() >= out.len() * q.len());
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `SimdLevel::Avx512` is only produced after avx512f, avx512vl and fma were detected.
        SimdLevel::Avx512 => unsafe { x86::rows_avx512(kernel, q, rows, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `SimdLevel::Avx2` is only produced after avx2 and fma were detected.
        SimdLevel::Avx2 => unsafe { x86::rows_avx2(kernel, q, rows, out) },
        // NEON and FMA are part of the aarch64 baseline: the portable code vectorises there.
        SimdLevel::Neon => rows_portable::<true>(kernel, q, rows, out),
        _ => rows_portable::<false>(kernel, q, rows, out),
    }
}

/// Sum of squares in f64: exact enough to serve as the reference norm of a row.
pub(crate) use crate::exact::squared_norm_f64;

/// The kernel tests' values: a linear congruential step of `seed`, mapped to [-0.5, 0.5).
#[cfg(test)]
pub(super) fn test_value(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(kernel: Kernel, q: &[f32], r: &[f32]) -> f64 {
        let terms = q.iter().zip(r).map(|(&a, &b)| {
            let (a, b) = (f64::from(a), f64::from(b));
            match kernel {
                Kernel::L2 => (a - b) * (a - b),
                Kernel::Dot => a * b,
                Kernel::L1 | Kernel::Linf => (a - b).abs(),
            }
        });
        if kernel == Kernel::Linf { terms.fold(0.0, f64::max) } else { terms.sum() }
    }

    #[test]
    fn every_level_matches_f64_for_awkward_dimensions() {
        // Neon runs the portable kernel with FMA: on x86 that is software FMA, slow but the
        // same arithmetic, so the code path NEON uses is checked here too.
        let mut levels = vec![SimdLevel::Scalar, SimdLevel::Neon, SimdLevel::detect()];
        if SimdLevel::detect() == SimdLevel::Avx512 {
            levels.push(SimdLevel::Avx2);
        }
        let mut seed = 7u64;
        let mut next = || test_value(&mut seed);
        for dim in [1usize, 3, 31, 32, 33, 128, 785] {
            let q: Vec<f32> = (0..dim).map(|_| next()).collect();
            let rows: Vec<f32> = (0..dim * 5).map(|_| next()).collect();
            for kernel in [Kernel::L2, Kernel::Dot, Kernel::L1, Kernel::Linf] {
                for &level in &levels {
                    let mut out = [0f32; 5];
                    distances(level, kernel, &q, &rows, &mut out);
                    for (i, o) in out.iter().enumerate() {
                        let want = reference(kernel, &q, &rows[i * dim..(i + 1) * dim]);
                        assert!(
                            (f64::from(*o) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{level:?} {kernel:?} dim {dim}: {o} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
