//! The scan of binary codes ([`RowStore::scan_bits`]): what the binary index runs before its
//! exact re-rank.
//!
//! # The distance every backend computes
//!
//! A row of list `l` holds one bit per component: whether the vector (a unit vector under
//! cosine) exceeds its list's centroid there, packed little-endian into 64-bit words (bit `d % 64`
//! of word `d / 64`; the padding bits past the dimension are 0). A query is packed the same way
//! against each list's centroid, and rows rank by the Hamming distance (the number of differing
//! bits, `popcount(row ^ query)`), ties by slot: which side of the centroid each component lies
//! on, a coarse stand-in for the angle around it, only good enough to nominate candidates for
//! the exact re-rank ([`RowStore::refine`]).
//!
//! [`RowStore::scan_bits`]: super::RowStore::scan_bits
//! [`RowStore::refine`]: super::RowStore::refine

use rayon::prelude::*;

use crate::backend::Neighbor;
use crate::backend::codes::check_probed;
use crate::error::{HiveGpuError, Result};
use crate::slots::SlotSet;

/// 64-bit words per code of `dim` components.
pub fn words(dim: usize) -> usize {
    dim.div_ceil(64)
}

/// Appends the code of `v` against `centroid` (one bit per component, set where `v` exceeds
/// it) to `out` as [`words`]`(v.len())` words.
pub fn pack(v: &[f32], centroid: &[f32], out: &mut Vec<u64>) {
    for (chunk, middle) in v.chunks(64).zip(centroid.chunks(64)) {
        let mut word = 0u64;
        for (bit, (&x, &c)) in chunk.iter().zip(middle).enumerate() {
            word |= u64::from(x > c) << bit;
        }
        out.push(word);
    }
}

/// What a scan of binary codes reads (see the module documentation for the distance).
#[derive(Debug, Clone, Copy)]
pub struct BitScan<'a> {
    /// Components per vector.
    pub dim: usize,
    /// Row-major queries (unit vectors under cosine).
    pub queries: &'a [f32],
    /// `lists x dim` centroids, row-major: the bits say on which side of them a row lies.
    pub centroids: &'a [f32],
    /// List `l`'s slots, in the order of its codes.
    pub slots: &'a [Vec<u32>],
    /// List `l`'s codes: [`words`]`(dim)` words per slot.
    pub codes: &'a [Vec<u64>],
    /// Query `q` scans the lists `probes[q * nprobe..(q + 1) * nprobe]`, each once.
    pub probes: &'a [u32],
    /// Lists per query (at least 1).
    pub nprobe: usize,
    /// Slots never returned (removed ones).
    pub removed: &'a SlotSet,
    /// Where given, only its slots are returned (a filter).
    pub allowed: Option<&'a SlotSet>,
    /// Names this state of the lists, as [`super::ListProbes::generation`] does; 0 means none.
    pub generation: u64,
}

impl BitScan<'_> {
    /// Number of queries, once the shapes are checked.
    pub(crate) fn check(&self, k: usize) -> Result<usize> {
        let nq = check_probed(
            "scan_bits",
            self.dim,
            k,
            self.queries,
            self.probes,
            self.nprobe,
            self.slots.len(),
            self.codes.len(),
            self.centroids.len(),
        )?;
        let words = words(self.dim);
        for (l, (slots, codes)) in self.slots.iter().zip(self.codes).enumerate() {
            if codes.len() != slots.len() * words {
                return Err(HiveGpuError::InvalidArgument(format!(
                    "scan_bits: list {l} has {} slots but {} code words",
                    slots.len(),
                    codes.len()
                )));
            }
        }
        Ok(nq)
    }
}

/// [`RowStore::scan_bits`](super::RowStore::scan_bits) on the host's threads (call it on the
/// library's pool): the `k` smallest Hamming distances of each query among the live (allowed)
/// rows of its lists, ascending, ties by slot; fewer where the lists hold fewer.
pub(crate) fn scan_on_host(scan: &BitScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
    let nq = scan.check(k)?;
    let (dim, words) = (scan.dim, words(scan.dim));
    Ok((0..nq)
        .into_par_iter()
        .map(|q| {
            let query = &scan.queries[q * dim..(q + 1) * dim];
            let mut packed = Vec::with_capacity(words);
            // Every live row's (distance, slot); the k best of them by a count of each distance.
            let mut scored: Vec<(u32, u32)> = Vec::new();
            for &l in &scan.probes[q * scan.nprobe..(q + 1) * scan.nprobe] {
                let l = l as usize;
                packed.clear();
                pack(query, &scan.centroids[l * dim..(l + 1) * dim], &mut packed);
                for (&slot, code) in scan.slots[l].iter().zip(scan.codes[l].chunks_exact(words)) {
                    let s = slot as usize;
                    if scan.removed.contains(s) || scan.allowed.is_some_and(|a| !a.contains(s)) {
                        continue;
                    }
                    let distance: u32 = code.iter().zip(&packed).map(|(a, b)| (a ^ b).count_ones()).sum();
                    scored.push((distance, slot));
                }
            }
            best_k(scored, k, dim)
        })
        .collect())
}

/// The `k` smallest (distance, slot) pairs, ascending: a count of each distance (at most `dim`)
/// finds the k-th, so only the pairs at or under it are sorted.
fn best_k(mut scored: Vec<(u32, u32)>, k: usize, dim: usize) -> Vec<Neighbor> {
    if scored.len() > k {
        let mut counts = vec![0usize; dim + 1];
        scored.iter().for_each(|&(d, _)| counts[d as usize] += 1);
        let mut seen = 0;
        let kth = counts.iter().position(|&c| {
            seen += c;
            seen >= k
        });
        let kth = kth.unwrap_or(dim) as u32;
        scored.retain(|&(d, _)| d <= kth);
    }
    scored.sort_unstable();
    scored.truncate(k);
    scored.into_iter().map(|(d, slot)| Neighbor { slot: slot as usize, distance: f64::from(d) }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_set_where_the_vector_exceeds_the_centroid_and_padding_stays_zero() {
        let v: Vec<f32> = (0..70).map(|i| if i % 3 == 0 { 1.0 } else { -1.0 }).collect();
        let mut out = Vec::new();
        pack(&v, &[0.0; 70], &mut out);
        assert_eq!(out.len(), 2);
        for d in 0..70 {
            assert_eq!(out[d / 64] >> (d % 64) & 1 == 1, d % 3 == 0, "component {d}");
        }
        assert_eq!(out[1] >> 6, 0, "padding bits");
    }

    #[test]
    fn the_best_k_keep_every_tie_in_slot_order() {
        let scored = vec![(3, 9), (1, 4), (3, 2), (0, 7), (3, 1), (5, 0)];
        let got: Vec<(usize, f64)> = best_k(scored, 4, 8).into_iter().map(|n| (n.slot, n.distance)).collect();
        assert_eq!(got, vec![(7, 0.0), (4, 1.0), (1, 3.0), (2, 3.0)]);
    }
}
