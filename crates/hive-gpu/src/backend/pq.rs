//! The scan of product-quantized inverted lists ([`RowStore::scan_pq`]): what IVF-PQ and the
//! flat PQ index run after probing, before their exact re-rank.
//!
//! # The codes
//!
//! A vector of `dim` components is cut into `m` sub-vectors of `sub = dim / m` components;
//! sub-quantizer `j` has `2^bits` centroids of `sub` components (its codebook, `j`'s block of
//! [`PqScan::codebooks`]), and a row of list `l` holds, per sub-vector, the number of the
//! codebook centroid nearest its residual to `centroid_l`. So the row stands for
//! `x^ = centroid_l + r^`, with `r^` the concatenation of the named codebook centroids. With
//! 8-bit codes a row's code `j` is byte `j`; with 4-bit codes two share a byte, code `j` in the
//! low nibble of byte `j / 2` when `j` is even and the high nibble when it is odd
//! ([`code_bytes`] per row).
//!
//! # The distance every backend computes
//!
//! For a query `q` a row ranks by the metric's distance to `x^`, lower is better:
//!
//! - Euclidean: `|q - x^|^2 = |q - centroid_l|^2 - 2 q . r^ + (|r^|^2 + 2 centroid_l . r^)`;
//!   the last term depends on the row alone and is its stored `norms` entry;
//! - dot product and cosine: `-(q . x^) = -(q . centroid_l) - q . r^` (cosine codes encode unit
//!   vectors, and its queries come as unit vectors).
//!
//! `q . r^` is a sum over the sub-vectors of `q_j . codebook_j[code_j]`, so each query needs
//! one lookup table of `m x 2^bits` products (FAISS's "precomputed tables" split, with the
//! list-dependent half folded into each row's stored term): the table serves every list the
//! query probes, and a row costs `m` lookups and adds. The distances only nominate candidates;
//! the index re-ranks them exactly against the stored vectors ([`RowStore::refine`]).
//!
//! [`RowStore::scan_pq`]: super::RowStore::scan_pq
//! [`RowStore::refine`]: super::RowStore::refine

use rayon::prelude::*;

use crate::backend::codes::{Best, check_probed};
use crate::backend::{ListCodes, Neighbor};
use crate::error::{HiveGpuError, Result};
use crate::exact::products::inner_products;
use crate::slots::SlotSet;
use crate::types::GpuDistanceMetric;

/// Bytes of one row's codes: `m` codes of `bits` (4 or 8) bits.
pub fn code_bytes(m: usize, bits: usize) -> usize {
    if bits == 4 { m.div_ceil(2) } else { m }
}

/// Code `j` of a row's `codes` of `bits` (4 or 8) bits per code.
#[inline]
pub fn code_at(codes: &[u8], j: usize, bits: usize) -> usize {
    if bits == 4 { usize::from(codes[j / 2] >> (4 * (j % 2)) & 0xF) } else { usize::from(codes[j]) }
}

/// What a scan of product-quantized lists reads (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct PqScan<'a> {
    /// Components per vector.
    pub dim: usize,
    /// The distance ranked by.
    pub metric: GpuDistanceMetric,
    /// Row-major queries (unit vectors under cosine).
    pub queries: &'a [f32],
    /// `lists x dim` centroids, row-major: the part of each row its codes do not hold.
    pub centroids: &'a [f32],
    /// Sub-quantizers; divides `dim`.
    pub m: usize,
    /// Bits per code: 4 or 8.
    pub bits: usize,
    /// `m` codebooks one after the other, each `2^bits` centroids of `dim / m` components,
    /// row-major.
    pub codebooks: &'a [f32],
    /// List `l`'s slots, in the order of its codes' rows.
    pub slots: &'a [Vec<u32>],
    /// List `l`'s codes: [`code_bytes`] per row, and each row's `|r^|^2 + 2 centroid_l . r^`
    /// as its norm.
    pub codes: &'a [ListCodes],
    /// Query `q` scans the lists `probes[q * nprobe..(q + 1) * nprobe]`, each once.
    pub probes: &'a [u32],
    /// Lists per query (at least 1).
    pub nprobe: usize,
    /// Slots never returned (removed ones).
    pub removed: &'a SlotSet,
    /// Where given, only its slots are returned (a filter).
    pub allowed: Option<&'a SlotSet>,
    /// Names this state of the lists, as [`super::ListProbes::generation`] does: a backend
    /// may keep its own copy of the codes while the value holds; 0 means none.
    pub generation: u64,
}

impl PqScan<'_> {
    /// Centroids per codebook.
    pub fn codebook_size(&self) -> usize {
        1 << self.bits
    }

    /// Number of queries, once the shapes are checked: [`check_probed`]'s, `m` dividing `dim`,
    /// 4 or 8 bits, `m` whole codebooks, and lists whose codes and norms match their slots.
    pub(crate) fn check(&self, k: usize) -> Result<usize> {
        let nq = check_probed(
            "scan_pq",
            self.dim,
            k,
            self.queries,
            self.probes,
            self.nprobe,
            self.slots.len(),
            self.codes.len(),
            self.centroids.len(),
        )?;
        let bad = |what: String| Err(HiveGpuError::InvalidArgument(format!("scan_pq: {what}")));
        if self.metric.is_difference_norm() {
            return bad(format!(
                "the {} metric has no product-quantized distance (l2, cosine or dot)",
                self.metric
            ));
        }
        if self.m == 0 || !self.dim.is_multiple_of(self.m) || !matches!(self.bits, 4 | 8) {
            return bad(format!(
                "{} sub-quantizers of {} bits do not cut {} components (m must divide the dimension, bits be 4 or 8)",
                self.m, self.bits, self.dim
            ));
        }
        if self.codebooks.len() != self.codebook_size() * self.dim {
            return bad(format!(
                "{} codebooks of {} centroids need {} values, got {}",
                self.m,
                self.codebook_size(),
                self.codebook_size() * self.dim,
                self.codebooks.len()
            ));
        }
        let bytes = code_bytes(self.m, self.bits);
        for (l, (slots, codes)) in self.slots.iter().zip(self.codes).enumerate() {
            if codes.norms.len() != slots.len() || codes.codes.len() != slots.len() * bytes {
                return bad(format!(
                    "list {l} has {} slots but {} norms and {} code bytes ({bytes} per row)",
                    slots.len(),
                    codes.norms.len(),
                    codes.codes.len()
                ));
            }
        }
        Ok(nq)
    }

    /// The lookup tables of the queries `first..first + count`, `m x 2^bits` each (query
    /// after query): entry `j * 2^bits + c` of query `q` is `-w q_j . codebook_j[c]`, with `w`
    /// 2 under Euclidean and 1 otherwise. One GEMM per sub-quantizer over the block.
    pub(crate) fn tables(&self, first: usize, count: usize, tables: &mut Vec<f32>) {
        let (dim, m, ksub) = (self.dim, self.m, self.codebook_size());
        let sub = dim / m;
        let weight = if self.metric == GpuDistanceMetric::Euclidean { -2.0 } else { -1.0 };
        let queries = &self.queries[first * dim..(first + count) * dim];
        tables.clear();
        tables.resize(count * m * ksub, 0.0);
        let mut part = Vec::with_capacity(count * sub);
        let mut products = vec![0.0f32; count * ksub];
        for j in 0..m {
            part.clear();
            part.extend(queries.chunks_exact(dim).flat_map(|q| q[j * sub..(j + 1) * sub].iter().copied()));
            let book = &self.codebooks[j * ksub * sub..(j + 1) * ksub * sub];
            inner_products(&part, book, sub, count, ksub, &mut products);
            for (q, row) in products.chunks_exact(ksub).enumerate() {
                let table = &mut tables[(q * m + j) * ksub..(q * m + j + 1) * ksub];
                table.iter_mut().zip(row).for_each(|(t, &p)| *t = weight * p);
            }
        }
    }

    /// Query `q`'s term for list `l`: `|q - centroid_l|^2` under Euclidean, else
    /// `-(q . centroid_l)`.
    pub(crate) fn offset(&self, q: usize, l: usize) -> f32 {
        let dim = self.dim;
        let query = &self.queries[q * dim..(q + 1) * dim];
        let centroid = &self.centroids[l * dim..(l + 1) * dim];
        let pairs = query.iter().zip(centroid).map(|(&a, &b)| (f64::from(a), f64::from(b)));
        let offset: f64 = match self.metric {
            GpuDistanceMetric::Euclidean => pairs.map(|(a, b)| (a - b) * (a - b)).sum(),
            GpuDistanceMetric::DotProduct | GpuDistanceMetric::Cosine => {
                -pairs.map(|(a, b)| a * b).sum::<f64>()
            }
            // Refused by `check`: product codes have no L1 or L-infinity tables.
            GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => 0.0,
        };
        offset as f32
    }
}

/// Queries whose tables one task computes together (one GEMM per sub-quantizer): 64 tables
/// of 16 x 256 f32 are 1 MiB, within a core's L2 beside the codes it scans.
const QUERY_BLOCK: usize = 64;

/// [`RowStore::scan_pq`](super::RowStore::scan_pq) on the host's threads (call it on the
/// library's pool): the `k` smallest approximate distances of each query among the live
/// (allowed) rows of its lists, ascending, ties by slot; fewer where the lists hold fewer.
/// Blocks of queries run in parallel, each query's table in cache while it reads its lists.
pub(crate) fn scan_on_host(scan: &PqScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
    let nq = scan.check(k)?;
    let (m, ksub) = (scan.m, scan.codebook_size());
    let block = QUERY_BLOCK.min(nq.div_ceil(rayon::current_num_threads()).max(1));
    Ok((0..nq.div_ceil(block))
        .into_par_iter()
        .map_init(Vec::new, |tables, b| {
            let first = b * block;
            let count = block.min(nq - first);
            scan.tables(first, count, tables);
            (0..count)
                .map(|i| scan_query(scan, first + i, &tables[i * m * ksub..(i + 1) * m * ksub], k))
                .collect::<Vec<_>>()
        })
        .flatten_iter()
        .collect())
}

/// Query `q`'s best `k` rows of its lists, by its lookup `table`.
fn scan_query(scan: &PqScan<'_>, q: usize, table: &[f32], k: usize) -> Vec<Neighbor> {
    let (m, bits) = (scan.m, scan.bits);
    let bytes = code_bytes(m, bits);
    let euclidean = scan.metric == GpuDistanceMetric::Euclidean;
    // Fixed-size rows of the table: a code (a byte, or a nibble) indexes them without a check.
    let fixed = |size: usize| {
        if (bits == 8) == (size == 256) { table.chunks_exact(size) } else { [].chunks_exact(size) }
    };
    let wide: Vec<&[f32; 256]> = fixed(256).filter_map(|t| t.try_into().ok()).collect();
    let narrow: Vec<&[f32; 16]> = fixed(16).filter_map(|t| t.try_into().ok()).collect();
    let mut best = Best::new(k);
    for &l in &scan.probes[q * scan.nprobe..(q + 1) * scan.nprobe] {
        let l = l as usize;
        let offset = scan.offset(q, l);
        let list = &scan.codes[l];
        let rows = scan.slots[l].iter().zip(list.codes.chunks_exact(bytes)).zip(&list.norms);
        for ((&slot, row), &norm) in rows {
            let mut distance = offset + if euclidean { norm } else { 0.0 };
            if bits == 8 {
                distance += row.iter().zip(&wide).map(|(&c, t)| t[usize::from(c)]).sum::<f32>();
            } else {
                for (&byte, pair) in row.iter().zip(narrow.chunks(2)) {
                    distance += pair[0][usize::from(byte & 0xF)];
                    if let Some(high) = pair.get(1) {
                        distance += high[usize::from(byte >> 4)];
                    }
                }
            }
            if distance > best.gate() {
                continue;
            }
            let s = slot as usize;
            if scan.removed.contains(s) || scan.allowed.is_some_and(|a| !a.contains(s)) {
                continue;
            }
            best.push(distance, slot);
        }
    }
    best.into_neighbors()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_bit_codes_share_a_byte_low_nibble_first() {
        let row = [0x21u8, 0x43, 0x05];
        let got: Vec<usize> = (0..5).map(|j| code_at(&row, j, 4)).collect();
        assert_eq!(got, vec![1, 2, 3, 4, 5]);
        assert_eq!(code_bytes(5, 4), 3);
        assert_eq!(code_bytes(5, 8), 5);
        assert_eq!(code_at(&row, 1, 8), 0x43);
    }
}
