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

/// Queries scored together against each tile of a list's codes: the tile is read from memory
/// once for all of them and stays in L1 while they are scored.
const QUERY_BLOCK: usize = 8;

/// Code words per tile (2,048 words, 16 KiB: half of a core's L1 data cache).
const TILE_WORDS: usize = 2048;

/// Rows a task scores at least (fewer tasks than this much work each cost more to hand out
/// than they save).
const TASK_ROWS: usize = 4096;

/// How the host counts bits: the POPCNT instruction where the processor has it (every x86-64
/// with AVX2, all of AArch64), else the portable bit-trick sequence `count_ones` compiles to on
/// the baseline x86-64 target (which has no POPCNT; FAISS's binary kernels are built for it, and
/// the portable sequence made hive-gpu's scan 0.76-0.88x theirs: docs/PERFORMANCE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Popcount {
    /// `popcnt` and AVX2 (the compiler vectorises the scoring of a block's queries).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// `vpopcntq` on 512-bit vectors (AVX-512 VPOPCNTDQ).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// Whatever `count_ones` is on the build's target.
    Portable,
}

/// The kernel this machine runs, detected once. `HIVE_GPU_CPU_SIMD=scalar` (the CPU backend's
/// test knob, which CI sets to prove the lower kernel levels) forces the portable one, and
/// `avx2` caps it there.
fn popcount() -> Popcount {
    static LEVEL: std::sync::OnceLock<Popcount> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let forced = std::env::var("HIVE_GPU_CPU_SIMD").unwrap_or_default();
        if forced == "scalar" {
            return Popcount::Portable;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if forced != "avx2"
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vpopcntdq")
                && is_x86_feature_detected!("popcnt")
            {
                return Popcount::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("popcnt") {
                return Popcount::Avx2;
            }
        }
        Popcount::Portable
    })
}

/// One query's best rows while a scan runs: every row at or under the current threshold, the
/// smallest distance that at least `k` kept rows reach (a count per distance finds it). Rows
/// above it can never be among the `k` best, so most rows are dropped without being stored.
struct Best {
    k: usize,
    threshold: u32,
    kept: Vec<(u32, u32)>,
    counts: Vec<u32>,
}

impl Best {
    /// For codes of `words` words: no distance exceeds `64 * words` (padding bits are 0 in the
    /// index's codes, but a caller's codes may set them).
    fn new(k: usize, words: usize) -> Self {
        let most = 64 * words;
        Self { k, threshold: most as u32, kept: Vec::new(), counts: vec![0; most + 1] }
    }

    #[inline(always)]
    fn offer(&mut self, distance: u32, slot: u32) {
        if distance <= self.threshold {
            self.kept.push((distance, slot));
            self.counts[distance as usize] += 1;
            if self.kept.len() >= 4 * self.k.max(256) {
                self.tighten();
            }
        }
    }

    /// Lowers the threshold to the k-th kept distance and drops the rows above it.
    fn tighten(&mut self) {
        let mut seen = 0usize;
        let Some(kth) = self.counts.iter().position(|&c| {
            seen += c as usize;
            seen >= self.k
        }) else {
            return;
        };
        self.threshold = kth as u32;
        self.kept.retain(|&(d, _)| d <= kth as u32);
        self.counts[kth + 1..].iter_mut().for_each(|c| *c = 0);
    }

    /// Merges another scan's rows of the same query.
    fn absorb(&mut self, other: Best) {
        for (d, slot) in other.kept {
            self.offer(d, slot);
        }
    }

    /// The `k` best, ascending, ties by slot.
    fn finish(mut self) -> Vec<Neighbor> {
        self.tighten();
        let mut kept = self.kept;
        kept.sort_unstable();
        kept.truncate(self.k);
        kept.into_iter().map(|(d, slot)| Neighbor { slot: slot as usize, distance: f64::from(d) }).collect()
    }
}

/// Scores the rows `rows` of one list's codes (`words` words each) for the queries of a block
/// (`packed[i]`, the query's code against that list), offering each live (allowed) row to the
/// query's [`Best`]. The body every kernel level compiles: the only difference is which
/// instructions `count_ones` becomes.
#[inline(always)]
fn score_rows(
    scan: &BitScan<'_>,
    list: usize,
    rows: std::ops::Range<usize>,
    words: usize,
    packed: &[(usize, &[u64])],
    best: &mut [Best],
) {
    let (slots, codes) = (&scan.slots[list], &scan.codes[list]);
    let check = scan.removed.count() > 0 || scan.allowed.is_some();
    let tile_rows = (TILE_WORDS / words).max(1);
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + tile_rows).min(rows.end);
        let tile = &codes[start * words..end * words];
        for &(member, query) in packed {
            let best = &mut best[member];
            for (r, code) in tile.chunks_exact(words).enumerate() {
                let distance: u32 = code.iter().zip(query).map(|(a, b)| (a ^ b).count_ones()).sum();
                if distance > best.threshold {
                    continue;
                }
                let slot = slots[start + r];
                if check {
                    let s = slot as usize;
                    if scan.removed.contains(s) || scan.allowed.is_some_and(|a| !a.contains(s)) {
                        continue;
                    }
                }
                best.offer(distance, slot);
            }
        }
        start = end;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt,avx2")]
fn score_rows_avx2(
    scan: &BitScan<'_>,
    list: usize,
    rows: std::ops::Range<usize>,
    words: usize,
    packed: &[(usize, &[u64])],
    best: &mut [Best],
) {
    score_rows(scan, list, rows, words, packed, best)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt,avx2,avx512f,avx512vpopcntdq")]
fn score_rows_avx512(
    scan: &BitScan<'_>,
    list: usize,
    rows: std::ops::Range<usize>,
    words: usize,
    packed: &[(usize, &[u64])],
    best: &mut [Best],
) {
    score_rows(scan, list, rows, words, packed, best)
}

/// [`score_rows`] with the kernel `level` names.
fn score_rows_with(
    level: Popcount,
    scan: &BitScan<'_>,
    list: usize,
    rows: std::ops::Range<usize>,
    words: usize,
    packed: &[(usize, &[u64])],
    best: &mut [Best],
) {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Popcount::Avx2` is only produced after popcnt and avx2 were detected.
        Popcount::Avx2 => unsafe { score_rows_avx2(scan, list, rows, words, packed, best) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Popcount::Avx512` is only produced after popcnt, avx512f and avx512vpopcntdq
        // were detected (and every such processor has AVX2).
        Popcount::Avx512 => unsafe { score_rows_avx512(scan, list, rows, words, packed, best) },
        Popcount::Portable => score_rows(scan, list, rows, words, packed, best),
    }
}

/// [`RowStore::scan_bits`](super::RowStore::scan_bits) on the host's threads (call it on the
/// library's pool): the `k` smallest Hamming distances of each query among the live (allowed)
/// rows of its lists, ascending, ties by slot; fewer where the lists hold fewer.
///
/// Work is cut into tasks of a block of queries by a share of every list's rows: a block's
/// queries that probe the same list score each tile of its codes together, and a batch too
/// small to fill the threads with blocks (one query) still splits its rows over them.
pub(crate) fn scan_on_host(scan: &BitScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
    let nq = scan.check(k)?;
    let (dim, words) = (scan.dim, words(scan.dim));
    let level = popcount();
    let blocks = nq.div_ceil(QUERY_BLOCK);
    // Rows each query scans, for the split of a small batch.
    let scanned: usize = (0..nq)
        .map(|q| {
            scan.probes[q * scan.nprobe..(q + 1) * scan.nprobe]
                .iter()
                .map(|&l| scan.slots[l as usize].len())
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0);
    let threads = rayon::current_num_threads().max(1);
    let splits =
        if blocks >= threads { 1 } else { (threads * 2 / blocks).clamp(1, (scanned / TASK_ROWS).max(1)) };
    let tasks: Vec<(usize, usize)> = (0..blocks).flat_map(|b| (0..splits).map(move |s| (b, s))).collect();
    let found: Vec<Vec<Best>> = tasks
        .into_par_iter()
        .map(|(b, split)| {
            let queries = b * QUERY_BLOCK..((b + 1) * QUERY_BLOCK).min(nq);
            // Each (query, list) pair of the block with the query's code against that list,
            // grouped by list.
            let mut pairs: Vec<(u32, usize, Vec<u64>)> = Vec::new();
            for q in queries.clone() {
                let query = &scan.queries[q * dim..(q + 1) * dim];
                for &l in &scan.probes[q * scan.nprobe..(q + 1) * scan.nprobe] {
                    let mut packed = Vec::with_capacity(words);
                    pack(query, &scan.centroids[l as usize * dim..(l as usize + 1) * dim], &mut packed);
                    pairs.push((l, q - queries.start, packed));
                }
            }
            pairs.sort_by_key(|&(l, member, _)| (l, member));
            let mut best: Vec<Best> = queries.clone().map(|_| Best::new(k, words)).collect();
            for group in pairs.chunk_by(|a, b| a.0 == b.0) {
                let list = group[0].0 as usize;
                let len = scan.slots[list].len();
                let rows = len * split / splits..len * (split + 1) / splits;
                let packed: Vec<(usize, &[u64])> = group.iter().map(|(_, m, p)| (*m, p.as_slice())).collect();
                score_rows_with(level, scan, list, rows, words, &packed, &mut best);
            }
            best
        })
        .collect();
    // The splits of each block, merged per query.
    let mut out = Vec::with_capacity(nq);
    let mut found = found.into_iter();
    for _ in 0..blocks {
        let mut merged = found.next().unwrap_or_default();
        for _ in 1..splits {
            if let Some(part) = found.next() {
                merged.iter_mut().zip(part).for_each(|(a, b)| a.absorb(b));
            }
        }
        out.extend(merged.into_iter().map(Best::finish));
    }
    Ok(out)
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
    fn the_best_k_keep_every_tie_in_slot_order_however_often_the_threshold_tightens() {
        // Offered in an order that makes the threshold fall in steps, with ties at every step.
        let mut best = Best::new(4, 1);
        for (d, slot) in [(3, 9), (1, 4), (3, 2), (0, 7), (3, 1), (5, 0), (64, 3), (1, 8)] {
            best.offer(d, slot);
            best.tighten();
        }
        let got: Vec<(usize, f64)> = best.finish().into_iter().map(|n| (n.slot, n.distance)).collect();
        assert_eq!(got, vec![(7, 0.0), (4, 1.0), (8, 1.0), (1, 3.0)]);
    }

    /// The scan against a brute force over every shape its tasks cut: codes of one word or
    /// many (padding bits in the last), one query or several blocks of them, rows split over
    /// threads (one query over 20,000 rows), several lists probed, removed and filtered rows,
    /// and k beyond what the lists hold; ties (many equal distances) everywhere.
    #[test]
    fn the_scan_equals_a_brute_force_for_every_cut_of_its_work() {
        let mut x = 99u64;
        let mut next = move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 33
        };
        for dim in [5, 64, 70, 784] {
            let words = words(dim);
            let lists = 3;
            let rows = 20_000;
            let centroids: Vec<f32> = (0..lists * dim).map(|_| (next() % 3) as f32 - 1.0).collect();
            let mut slots = vec![Vec::new(); lists];
            let mut codes = vec![Vec::new(); lists];
            for slot in 0..rows as u32 {
                let l = (next() % lists as u64) as usize;
                let v: Vec<f32> = (0..dim).map(|_| (next() % 5) as f32 - 2.0).collect();
                slots[l].push(slot);
                pack(&v, &centroids[l * dim..(l + 1) * dim], &mut codes[l]);
            }
            let mut removed = SlotSet::default();
            let mut allowed = SlotSet::default();
            for s in 0..rows {
                removed.set(s, s % 7 == 3);
                allowed.set(s, s % 3 != 1);
            }
            for (nq, nprobe) in [(1, 1), (1, 3), (9, 2), (20, 1)] {
                let queries: Vec<f32> = (0..nq * dim).map(|_| (next() % 5) as f32 - 2.0).collect();
                let probes: Vec<u32> =
                    (0..nq).flat_map(|q| (0..nprobe).map(move |p| ((q + p) % lists) as u32)).collect();
                for filter in [None, Some(&allowed)] {
                    for k in [1, 10, 300, 30_000] {
                        let scan = BitScan {
                            dim,
                            queries: &queries,
                            centroids: &centroids,
                            slots: &slots,
                            codes: &codes,
                            probes: &probes,
                            nprobe,
                            removed: &removed,
                            allowed: filter,
                            generation: 0,
                        };
                        let got = scan_on_host(&scan, k).expect("a scan");
                        for q in 0..nq {
                            let mut want: Vec<(u32, u32)> = Vec::new();
                            for &l in &probes[q * nprobe..(q + 1) * nprobe] {
                                let l = l as usize;
                                let mut packed = Vec::new();
                                pack(
                                    &queries[q * dim..(q + 1) * dim],
                                    &centroids[l * dim..(l + 1) * dim],
                                    &mut packed,
                                );
                                for (&slot, code) in slots[l].iter().zip(codes[l].chunks_exact(words)) {
                                    let s = slot as usize;
                                    if removed.contains(s) || filter.is_some_and(|a| !a.contains(s)) {
                                        continue;
                                    }
                                    let d = code.iter().zip(&packed).map(|(a, b)| (a ^ b).count_ones()).sum();
                                    want.push((d, slot));
                                }
                            }
                            want.sort_unstable();
                            want.truncate(k);
                            let got: Vec<(u32, u32)> =
                                got[q].iter().map(|n| (n.distance as u32, n.slot as u32)).collect();
                            assert_eq!(
                                got,
                                want,
                                "dim {dim} nq {nq} nprobe {nprobe} k {k} query {q} filtered {}",
                                filter.is_some()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn many_rows_tighten_to_the_same_k_best_as_a_sort() {
        let mut best = Best::new(10, 2);
        let mut all = Vec::new();
        let mut x = 12345u64;
        for slot in 0..20_000u32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let d = (x >> 33) as u32 % 129;
            best.offer(d, slot);
            all.push((d, slot));
        }
        all.sort_unstable();
        let want: Vec<(usize, f64)> = all[..10].iter().map(|&(d, s)| (s as usize, f64::from(d))).collect();
        let got: Vec<(usize, f64)> = best.finish().into_iter().map(|n| (n.slot, n.distance)).collect();
        assert_eq!(got, want);
    }
}
