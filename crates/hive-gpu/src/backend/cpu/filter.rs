//! The selection half of the fused kernels: turns a block of raw products or sums into
//! distances and offers the few that pass the collector's gate.
//!
//! Almost every value fails the gate, so the loop first checks 16 values at once for any
//! that pass (vector code) and only then falls back to scalar pushes.

use super::simd::SimdLevel;
use super::topk::Collector;

const CHUNK: usize = 16;

#[inline(always)]
fn collect_generic(c: &mut Collector, raw: &[f32], scale: &[f32], offset: &[f32], base_slot: usize) {
    let mut gate = c.gate();
    let mut at = 0;
    for ((r, s), o) in raw.chunks(CHUNK).zip(scale.chunks(CHUNK)).zip(offset.chunks(CHUNK)) {
        let mut d = [f32::INFINITY; CHUNK];
        for i in 0..r.len() {
            d[i] = r[i] * s[i] + o[i];
        }
        let min = d.iter().fold(f32::INFINITY, |m, &x| m.min(x));
        if min <= gate {
            for (i, &dist) in d[..r.len()].iter().enumerate() {
                if dist <= gate {
                    c.push(dist, (base_slot + at + i) as u32);
                    gate = c.gate();
                }
            }
        }
        at += r.len();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,fma")]
fn collect_avx512(c: &mut Collector, raw: &[f32], scale: &[f32], offset: &[f32], base_slot: usize) {
    collect_generic(c, raw, scale, offset, base_slot)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn collect_avx2(c: &mut Collector, raw: &[f32], scale: &[f32], offset: &[f32], base_slot: usize) {
    collect_generic(c, raw, scale, offset, base_slot)
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
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `SimdLevel::Avx512` is only produced after avx512f and fma were detected.
        SimdLevel::Avx512 => unsafe { collect_avx512(c, raw, scale, offset, base_slot) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `SimdLevel::Avx2` is only produced after avx2 and fma were detected.
        SimdLevel::Avx2 => unsafe { collect_avx2(c, raw, scale, offset, base_slot) },
        _ => collect_generic(c, raw, scale, offset, base_slot),
    }
}
