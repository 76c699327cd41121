//! The selection half of the fused kernels: turns a block of raw products or sums into
//! distances and offers the few that pass the collector's gate.
//!
//! Almost every value fails the gate, so the loop first checks 16 values at once for any
//! that pass (vector code) and only then falls back to scalar pushes.

use super::simd::SimdLevel;
use super::topk::Collector;

const CHUNK: usize = 16;

/// Up to this k a block's k-th smallest distance is found by insertion into a sorted array
/// of k ([`kth_smallest_small`]) rather than by a selection over a copy of the block: for an
/// IVF probe (k = nprobe over 100 centroids) the selection was a sixth of the search
/// (docs/PERFORMANCE.md, "Packed lists").
const SMALL_K: usize = 32;

/// The distances `raw[j] * scale[j] + offset[j]` of the chunk of 16 at `start` (which must
/// lie inside all three), and the bit mask of those strictly below `limit` (never a NaN): one
/// vector compare for the chunk.
#[inline(always)]
fn chunk_below(raw: &[f32], scale: &[f32], offset: &[f32], start: usize, limit: f32) -> ([f32; CHUNK], u32) {
    let r: &[f32; CHUNK] = raw[start..start + CHUNK].try_into().unwrap_or(&[0.0; CHUNK]);
    let s: &[f32; CHUNK] = scale[start..start + CHUNK].try_into().unwrap_or(&[0.0; CHUNK]);
    let o: &[f32; CHUNK] = offset[start..start + CHUNK].try_into().unwrap_or(&[f32::INFINITY; CHUNK]);
    let mut d = [0f32; CHUNK];
    let mut below = 0u32;
    for i in 0..CHUNK {
        d[i] = r[i] * s[i] + o[i];
        below |= u32::from(d[i] < limit) << i;
    }
    (d, below)
}

/// The `k`-th smallest distance `raw[j] * scale[j] + offset[j]` of a block (`k <= SMALL_K`
/// and at most the block's length; `+inf` where fewer than `k` are finite and not NaN: a
/// removed row's `+inf`, or NaN where `0 * inf` met a mapped file's huge values, can never
/// stand in for one of the k rows). The `k` smallest so far are kept sorted, and a value enters
/// only when it beats their k-th. A chunk of 16 is compared with that k-th at once and only
/// the lanes that beat it are visited: after the first chunks that is rare. The walk over
/// every value, a branch each, was a third of a 100 x 100 search (docs/PERFORMANCE.md,
/// "Small searches without serial chains").
#[inline(always)]
fn kth_smallest_small(raw: &[f32], scale: &[f32], offset: &[f32], k: usize) -> f32 {
    let mut best = [f32::INFINITY; SMALL_K];
    let best = &mut best[..k];
    // NaN and +inf never beat the k-th (`<` is false for them), so they never enter.
    let insert = |best: &mut [f32], d: f32| {
        if d < best[k - 1] {
            // Shifted in place (a library move per insertion cost more than the search).
            let mut at = k - 1;
            while at > 0 && best[at - 1] > d {
                best[at] = best[at - 1];
                at -= 1;
            }
            best[at] = d;
        }
    };
    let n = raw.len().min(scale.len()).min(offset.len());
    let whole = n / CHUNK * CHUNK;
    let mut kth = f32::INFINITY;
    for start in (0..whole).step_by(CHUNK) {
        let (d, mut beating) = chunk_below(raw, scale, offset, start, kth);
        while beating != 0 {
            let i = beating.trailing_zeros() as usize;
            beating &= beating - 1;
            insert(best, d[i]);
        }
        kth = best[k - 1];
    }
    for i in whole..n {
        insert(best, raw[i] * scale[i] + offset[i]);
    }
    best[k - 1]
}

/// Bounds a fresh collector by its block's own k-th distance before the block is offered
/// (`Collector::limit_to`): every row of the block is offered right after, and a fresh
/// collector would otherwise take in most of the block before it holds k.
#[inline(always)]
fn seed_generic<const AVX512: bool>(c: &mut Collector, raw: &[f32], scale: &[f32], offset: &[f32]) {
    let k = c.k();
    if c.gate() != f32::INFINITY || raw.len() <= 2 * k {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if AVX512 && k <= x86::VECTOR_K {
        debug_assert!(is_x86_feature_detected!("avx512f"), "the AVX-512 seed without AVX-512");
        // SAFETY: `AVX512` is true only inside `collect_avx512`, which runs only after
        // avx512f, avx512vl and fma were detected.
        c.limit_to(unsafe { x86::kth_smallest_avx512(raw, scale, offset, k) });
        return;
    }
    if k <= SMALL_K {
        c.limit_to(kth_smallest_small(raw, scale, offset, k));
    } else {
        SEED.with(|seed| {
            let mut seed = seed.borrow_mut();
            seed.clear();
            // A row the collector never takes (`+inf`, or NaN) counts as `+inf` here.
            seed.extend(raw.iter().zip(scale).zip(offset).map(|((&r, &s), &o)| {
                let d = r * s + o;
                if d.is_nan() { f32::INFINITY } else { d }
            }));
            let (_, kth, _) = seed.select_nth_unstable_by(k - 1, f32::total_cmp);
            c.limit_to(*kth);
        });
    }
}

thread_local! {
    /// One block's distances, to find their k-th before a fresh collector takes them in.
    static SEED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[inline(always)]
fn collect_generic<const AVX512: bool>(
    c: &mut Collector,
    raw: &[f32],
    scale: &[f32],
    offset: &[f32],
    slot_of: impl Fn(usize) -> u32,
) {
    seed_generic::<AVX512>(c, raw, scale, offset);
    let mut gate = c.gate();
    let whole = raw.len() / CHUNK * CHUNK;
    for start in (0..whole).step_by(CHUNK) {
        // `d <= gate` is `d < gate.next_up()` (no f32 lies between them); at a gate of +inf it
        // leaves out +inf distances, which the collector never takes anyway.
        #[cfg(target_arch = "x86_64")]
        let (d, mut passing) = if AVX512 {
            // SAFETY: `AVX512` is true only inside `collect_avx512`, which runs only after
            // avx512f, avx512vl and fma were detected.
            unsafe { x86::chunk_below_avx512(raw, scale, offset, start, gate.next_up()) }
        } else {
            chunk_below(raw, scale, offset, start, gate.next_up())
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (d, mut passing) = chunk_below(raw, scale, offset, start, gate.next_up());
        // Only the lanes that passed are visited (a bit mask from one vector compare): in an
        // IVF list scan about one value in a chunk passes, and walking all 16 lanes for it
        // was most of this function's time (docs/PERFORMANCE.md, "Packed lists").
        while passing != 0 {
            let i = passing.trailing_zeros() as usize;
            passing &= passing - 1;
            if d[i] <= gate {
                c.push(d[i], slot_of(start + i));
                gate = c.gate();
            }
        }
    }
    for i in whole..raw.len() {
        let dist = raw[i] * scale[i] + offset[i];
        if dist <= gate {
            c.push(dist, slot_of(i));
            gate = c.gate();
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,fma")]
fn collect_avx512(
    c: &mut Collector,
    raw: &[f32],
    scale: &[f32],
    offset: &[f32],
    slot_of: impl Fn(usize) -> u32,
) {
    collect_generic::<true>(c, raw, scale, offset, slot_of)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn collect_avx2(
    c: &mut Collector,
    raw: &[f32],
    scale: &[f32],
    offset: &[f32],
    slot_of: impl Fn(usize) -> u32,
) {
    collect_generic::<false>(c, raw, scale, offset, slot_of)
}

/// Offers `raw[j] * scale[j] + offset[j]` as the distance of slot `base_slot + j`.
pub fn collect(
    level: SimdLevel,
    c: &mut Collector,
    raw: &[f32],
    scale: &[f32],
    offset: &[f32],
    base_slot: usize,
) {
    collect_with(level, c, raw, scale, offset, |j| (base_slot + j) as u32)
}

/// Offers `raw[j] * scale[j] + offset[j]` as the distance of slot `slots[j]`: rows gathered
/// from scattered slots (an inverted list's).
pub fn collect_at(
    level: SimdLevel,
    c: &mut Collector,
    raw: &[f32],
    scale: &[f32],
    offset: &[f32],
    slots: &[u32],
) {
    let n = raw.len().min(slots.len());
    collect_with(level, c, &raw[..n], &scale[..n], &offset[..n], |j| slots[j])
}

fn collect_with(
    level: SimdLevel,
    c: &mut Collector,
    raw: &[f32],
    scale: &[f32],
    offset: &[f32],
    slot_of: impl Fn(usize) -> u32,
) {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `SimdLevel::Avx512` is only produced after avx512f, avx512vl and fma were detected.
        SimdLevel::Avx512 => unsafe { collect_avx512(c, raw, scale, offset, slot_of) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `SimdLevel::Avx2` is only produced after avx2 and fma were detected.
        SimdLevel::Avx2 => unsafe { collect_avx2(c, raw, scale, offset, slot_of) },
        _ => collect_generic::<false>(c, raw, scale, offset, slot_of),
    }
}

/// The k-th seed with the k smallest so far in one AVX-512 register (two past k = 16),
/// sorted: an insertion is a compare, a lane shift and two masked moves per register, with no
/// branch on where the value goes.
/// The shifts of the scalar insertion, a mispredicted branch at each end, were most of the
/// list scans' selection on SIFT10K (docs/PERFORMANCE.md, "Small searches without serial
/// chains").
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::CHUNK;

    /// The largest k the registers hold: one register to 16, two to 32.
    pub(super) const VECTOR_K: usize = 2 * LANES;
    /// f32 lanes of one register.
    const LANES: usize = 16;

    /// `value` put into the sorted `best` after the lanes not above it, the lanes above it
    /// moved up one (the last lane's value leaves). A NaN changes nothing.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn insert(best: __m512, value: f32, up_one: __m512i) -> __m512 {
        let v = _mm512_set1_ps(value);
        let above = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(best, v);
        // `best` is sorted, so the lanes above `value` are a suffix; its first lane takes it.
        let moved = _mm512_mask_mov_ps(best, above, _mm512_permutexvar_ps(up_one, best));
        _mm512_mask_mov_ps(moved, above & above.wrapping_neg(), v)
    }

    /// Lane `lane` of `v`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn lane(v: __m512, lane: __m512i) -> f32 {
        _mm_cvtss_f32(_mm512_castps512_ps128(_mm512_permutexvar_ps(lane, v)))
    }

    /// `value` put into the sorted 32 lanes `low` then `high`, as [`insert`] does in one
    /// register: the lanes above it move up one across both (lane 15 of `low` into lane 0 of
    /// `high`), and the first lane above it takes it. `value` below a lane of `low` is below
    /// every lane of `high` (sorted), so only one of the two first-above masks is kept.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn insert_two(low: &mut __m512, high: &mut __m512, value: f32, up_one: __m512i, across: __m512i) {
        let v = _mm512_set1_ps(value);
        let above_low = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(*low, v);
        let above_high = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(*high, v);
        let first_low = above_low & above_low.wrapping_neg();
        let first_high = if above_low == 0 { above_high & above_high.wrapping_neg() } else { 0 };
        let moved_high = _mm512_mask_mov_ps(*high, above_high, _mm512_permutex2var_ps(*low, across, *high));
        *high = _mm512_mask_mov_ps(moved_high, first_high, v);
        let moved_low = _mm512_mask_mov_ps(*low, above_low, _mm512_permutexvar_ps(up_one, *low));
        *low = _mm512_mask_mov_ps(moved_low, first_low, v);
    }

    /// [`super::kth_smallest_small`] for `1 <= k <= VECTOR_K`: the k smallest in one register
    /// to k = 16, in two to 32 (an IVF-SQ8 scan's 20 nominees a query). Lanes past `k - 1`
    /// hold values pushed out of the k smallest (or `+inf`); only lane `k - 1` is read, and a
    /// value that enters is below it, so it lands at or before it.
    ///
    /// # Safety
    ///
    /// The caller must have detected avx512f on this CPU.
    #[target_feature(enable = "avx512f")]
    pub(super) fn kth_smallest_avx512(raw: &[f32], scale: &[f32], offset: &[f32], k: usize) -> f32 {
        assert!((1..=VECTOR_K).contains(&k), "a k of 1 to {VECTOR_K}, not {k}");
        if k == 1 {
            return least(raw, scale, offset);
        }
        let up_one = _mm512_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14);
        if k <= LANES {
            let kth_lane = _mm512_set1_epi32(k as i32 - 1);
            let mut best = _mm512_set1_ps(f32::INFINITY);
            return walk(raw, scale, offset, |value| {
                best = insert(best, value, up_one);
                lane(best, kth_lane)
            });
        }
        // Lane 0 takes lane 15 of the first operand, lane i > 0 lane i - 1 of the second.
        let across = _mm512_setr_epi32(15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30);
        let kth_lane = _mm512_set1_epi32((k - LANES) as i32 - 1);
        let (mut low, mut high) = (_mm512_set1_ps(f32::INFINITY), _mm512_set1_ps(f32::INFINITY));
        walk(raw, scale, offset, |value| {
            insert_two(&mut low, &mut high, value, up_one, across);
            lane(high, kth_lane)
        })
    }

    /// [`super::chunk_below`] in one register: the compiler split the portable loop into
    /// 8-, 4-, 2- and 1-lane pieces, each with its own compare and mask merge, a third of
    /// the list scans' selection (`perf`, docs/PERFORMANCE.md "Byte-valued lists").
    /// The same multiply then add, each rounded, so the same distances.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) fn chunk_below_avx512(
        raw: &[f32],
        scale: &[f32],
        offset: &[f32],
        start: usize,
        limit: f32,
    ) -> ([f32; CHUNK], u32) {
        let r: &[f32; CHUNK] = raw[start..start + CHUNK].try_into().unwrap_or(&[0.0; CHUNK]);
        let s: &[f32; CHUNK] = scale[start..start + CHUNK].try_into().unwrap_or(&[0.0; CHUNK]);
        let o: &[f32; CHUNK] = offset[start..start + CHUNK].try_into().unwrap_or(&[f32::INFINITY; CHUNK]);
        let mut d = [0f32; CHUNK];
        // SAFETY: each of `r`, `s` and `o` is 16 readable f32 and `d` 16 writable ones; the
        // loads and the store need no alignment.
        let below = unsafe {
            let v = _mm512_add_ps(
                _mm512_mul_ps(_mm512_loadu_ps(r.as_ptr()), _mm512_loadu_ps(s.as_ptr())),
                _mm512_loadu_ps(o.as_ptr()),
            );
            _mm512_storeu_ps(d.as_mut_ptr(), v);
            // Ordered: a NaN is never below.
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, _mm512_set1_ps(limit))
        };
        (d, u32::from(below))
    }

    /// The least distance `raw[j] * scale[j] + offset[j]` (`+inf` where none is finite and not
    /// NaN): k = 1, an IVF probe at nprobe 1, as a running minimum 16 lanes wide instead of an
    /// insertion per value that beats it (the probe's selection was a seventh of such a
    /// batch: docs/PERFORMANCE.md, "Byte-valued lists").
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn least(raw: &[f32], scale: &[f32], offset: &[f32]) -> f32 {
        let n = raw.len().min(scale.len()).min(offset.len());
        let whole = n / CHUNK * CHUNK;
        let inf = _mm512_set1_ps(f32::INFINITY);
        let mut min = inf;
        for start in (0..whole).step_by(CHUNK) {
            // Lanes below +inf (ordered: a NaN never is) take part; the others stay +inf.
            let (d, below) = chunk_below_avx512(raw, scale, offset, start, f32::INFINITY);
            // SAFETY: `d` is 16 readable f32; the load needs no alignment.
            let v = unsafe { _mm512_loadu_ps(d.as_ptr()) };
            min = _mm512_min_ps(min, _mm512_mask_mov_ps(inf, below as __mmask16, v));
        }
        let mut least = _mm512_reduce_min_ps(min);
        for i in whole..n {
            let d = raw[i] * scale[i] + offset[i];
            if d < least {
                least = d;
            }
        }
        least
    }

    /// Offers every distance `raw[j] * scale[j] + offset[j]` below the k-th so far to `insert`
    /// (which keeps the k smallest and returns their k-th), 16 at a time compared with it;
    /// returns the last k-th (`+inf` while fewer than k were inserted).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn walk(raw: &[f32], scale: &[f32], offset: &[f32], mut insert: impl FnMut(f32) -> f32) -> f32 {
        let n = raw.len().min(scale.len()).min(offset.len());
        let whole = n / CHUNK * CHUNK;
        let mut kth = f32::INFINITY;
        for start in (0..whole).step_by(CHUNK) {
            let (d, mut beating) = chunk_below_avx512(raw, scale, offset, start, kth);
            while beating != 0 {
                let i = beating.trailing_zeros() as usize;
                beating &= beating - 1;
                kth = insert(d[i]);
            }
        }
        for i in whole..n {
            let d = raw[i] * scale[i] + offset[i];
            if d < kth {
                kth = insert(d);
            }
        }
        kth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_kth_equals_a_full_selection_with_ties_and_infinities() {
        // Ties (values from a small set), removed rows (scale 0, offset +inf: +inf, or NaN where
        // the raw value is infinite) and NaNs outnumbering the finite values, -inf, negative
        // values and zeros of both signs, scales and offsets, k from 1 to SMALL_K; both the
        // portable seed and (where the CPU has it) the AVX-512 one.
        let mut seed = 17u64;
        for n in [1usize, 2, 5, 31, 32, 33, 100, 257] {
            let (mut raw, mut scale, mut offset) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..n {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let small = ((seed >> 33) % 13) as f32 - 4.0;
                let (r, s, o) = match (seed >> 59) % 16 {
                    0 | 1 => (small, 0.0, f32::INFINITY),
                    2 => (f32::INFINITY, 0.0, f32::INFINITY),
                    3 => (f32::NAN, 1.0, 0.0),
                    4 => (f32::NEG_INFINITY, 1.0, 0.0),
                    5 | 6 => (if i % 2 == 0 { 0.0 } else { -0.0 }, 1.0, 0.0),
                    7 => (small, -2.0, 3.0),
                    _ => (small, 1.0, 0.0),
                };
                raw.push(r);
                scale.push(s);
                offset.push(o);
            }
            // What the collector takes: a NaN counts as +inf.
            let distances: Vec<f32> = (0..n)
                .map(|i| raw[i] * scale[i] + offset[i])
                .map(|d| if d.is_nan() { f32::INFINITY } else { d })
                .collect();
            for k in 1..=SMALL_K.min(n) {
                let mut sorted = distances.clone();
                let (_, want, _) = sorted.select_nth_unstable_by(k - 1, f32::total_cmp);
                let got = kth_smallest_small(&raw, &scale, &offset, k);
                assert!(got == *want, "n {n} k {k}: {got} vs {want}");
                #[cfg(target_arch = "x86_64")]
                if k <= x86::VECTOR_K && SimdLevel::detect() == SimdLevel::Avx512 {
                    // SAFETY: AVX-512 was detected just above.
                    let got = unsafe { x86::kth_smallest_avx512(&raw, &scale, &offset, k) };
                    assert!(got == *want, "AVX-512, n {n} k {k}: {got} vs {want}");
                }
            }
        }
        // NaNs alone, and a NaN in the last lane of the last whole chunk: k = 1's running
        // minimum must skip them as the selection does.
        for (raw, want) in [
            (vec![f32::NAN; 16], f32::INFINITY),
            ((0..32).map(|i| if i == 31 { f32::NAN } else { 5.0 + i as f32 }).collect(), 5.0),
        ] {
            let ones = vec![1.0; raw.len()];
            let zeros = vec![0.0; raw.len()];
            assert_eq!(kth_smallest_small(&raw, &ones, &zeros, 1), want);
            #[cfg(target_arch = "x86_64")]
            if SimdLevel::detect() == SimdLevel::Avx512 {
                // SAFETY: AVX-512 was detected just above.
                assert_eq!(unsafe { x86::kth_smallest_avx512(&raw, &ones, &zeros, 1) }, want);
            }
        }
    }
}
