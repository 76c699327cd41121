//! The selection half of the fused kernels: turns a block of raw products or sums into
//! distances and offers the few that pass the collector's gate.
//!
//! Almost every value fails the gate, so the loop first checks 16 values at once for any
//! that pass (vector code) and only then falls back to scalar pushes.

use super::simd::SimdLevel;
use super::topk::Collector;

const CHUNK: usize = 16;

thread_local! {
    /// One block's distances, to find their k-th before a fresh collector takes them in.
    static SEED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[inline(always)]
fn collect_generic(
    c: &mut Collector,
    raw: &[f32],
    scale: &[f32],
    offset: &[f32],
    slot_of: impl Fn(usize) -> u32,
) {
    let mut gate = c.gate();
    let whole = raw.len() / CHUNK * CHUNK;
    for start in (0..whole).step_by(CHUNK) {
        let r: &[f32; CHUNK] = raw[start..start + CHUNK].try_into().unwrap_or(&[0.0; CHUNK]);
        let s: &[f32; CHUNK] = scale[start..start + CHUNK].try_into().unwrap_or(&[0.0; CHUNK]);
        let o: &[f32; CHUNK] = offset[start..start + CHUNK].try_into().unwrap_or(&[f32::INFINITY; CHUNK]);
        let mut d = [0f32; CHUNK];
        let mut passes = false;
        for i in 0..CHUNK {
            d[i] = r[i] * s[i] + o[i];
            passes |= d[i] <= gate;
        }
        if passes {
            for (i, &dist) in d.iter().enumerate() {
                if dist <= gate {
                    c.push(dist, slot_of(start + i));
                    gate = c.gate();
                }
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
    collect_generic(c, raw, scale, offset, slot_of)
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
    collect_generic(c, raw, scale, offset, slot_of)
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
    let k = c.k();
    if c.gate() == f32::INFINITY && raw.len() > 2 * k {
        // A fresh collector would take in most of the block before it holds k: the block's own
        // k-th distance bounds it first (`Collector::limit_to`), as every row of the block is
        // offered right after. A row the collector never takes (a removed row is `+inf`, or
        // NaN where `0 * inf` met the huge values a mapped file may hold in a removed row)
        // counts as `+inf` here, so that it can never stand in for one of the k rows.
        SEED.with(|distances| {
            let mut distances = distances.borrow_mut();
            distances.clear();
            distances.extend(raw.iter().zip(scale).zip(offset).map(|((&r, &s), &o)| {
                let d = r * s + o;
                if d.is_nan() { f32::INFINITY } else { d }
            }));
            let (_, kth, _) = distances.select_nth_unstable_by(k - 1, f32::total_cmp);
            c.limit_to(*kth);
        });
    }
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `SimdLevel::Avx512` is only produced after avx512f, avx512vl and fma were detected.
        SimdLevel::Avx512 => unsafe { collect_avx512(c, raw, scale, offset, slot_of) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `SimdLevel::Avx2` is only produced after avx2 and fma were detected.
        SimdLevel::Avx2 => unsafe { collect_avx2(c, raw, scale, offset, slot_of) },
        _ => collect_generic(c, raw, scale, offset, slot_of),
    }
}
