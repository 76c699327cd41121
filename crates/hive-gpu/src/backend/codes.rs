//! The scan of scalar-quantized inverted lists ([`RowStore::scan_codes`]): what IVF-SQ8 and
//! the flat SQ8 index run after probing, before their exact re-rank.
//!
//! # The distance every backend computes
//!
//! A row of list `l` with codes `c` (one byte per component) stands for the vector
//! `x^ = centroid_l + base + step * c` (per component). For a query `q` the scan ranks rows by
//! the metric's distance to `x^`, lower is better:
//!
//! - Euclidean: `|q - x^|^2 = |u|^2 - 2 u.(base + step * c) + |base + step * c|^2` with
//!   `u = q - centroid_l`; the last term is the row's stored `norm`;
//! - dot product and cosine: `-(q . x^) = -(q . centroid_l) - q . base - (q * step) . c`
//!   (cosine codes encode unit vectors, and its queries come as unit vectors).
//!
//! Each is `offset(q, l) + weights(q, l) . c + extra(row)`: one product of a float query term
//! with the byte codes per row, which is what the host path here multiplies in GEMM tiles (the
//! codes widened to f32 a tile at a time, each tile read once per batch for every query that
//! probes its list), what the CPU backend's scan of a packed copy of the codes computes in
//! registers (`backend/cpu/rows/code_lists.rs`) and what a device kernel computes from codes in
//! shared memory.
//!
//! The distances are approximations that only nominate candidates; the index re-ranks them
//! exactly against the stored vectors ([`RowStore::refine`]).
//!
//! [`RowStore::scan_codes`]: super::RowStore::scan_codes
//! [`RowStore::refine`]: super::RowStore::refine

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rayon::prelude::*;

use crate::backend::Neighbor;
use crate::backend::candidates::ListAskers;
use crate::error::{HiveGpuError, Result};
use crate::exact::products::inner_products;
use crate::slots::SlotSet;
use crate::types::GpuDistanceMetric;

/// The codes of one inverted list: row `i` is the list's `i`-th slot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListCodes {
    /// `rows x dim` codes, row-major.
    pub codes: Vec<u8>,
    /// Each row's term that depends on the row alone: under SQ8 `|base + step * c|^2` (its
    /// decoded residual's squared norm), under PQ [`super::pq`]'s.
    pub norms: Vec<f32>,
}

impl ListCodes {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.norms.len()
    }

    /// Whether the list holds no row.
    pub fn is_empty(&self) -> bool {
        self.norms.is_empty()
    }
}

/// What a scan of scalar-quantized lists reads (see the module documentation for the distance).
#[derive(Debug, Clone, Copy)]
pub struct CodeScan<'a> {
    /// Components per vector.
    pub dim: usize,
    /// The distance ranked by.
    pub metric: GpuDistanceMetric,
    /// Row-major queries (unit vectors under cosine).
    pub queries: &'a [f32],
    /// `lists x dim` centroids, row-major: the part of each row its codes do not hold.
    pub centroids: &'a [f32],
    /// Per component, the value of code 0.
    pub base: &'a [f32],
    /// Per component, what one code step adds.
    pub step: &'a [f32],
    /// List `l`'s slots, in the order of its codes' rows.
    pub slots: &'a [Vec<u32>],
    /// List `l`'s codes.
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
    /// Names the run of states these lists went through by appending rows alone: it holds
    /// while vectors are only appended to the lists (each append renews `generation`), and
    /// whoever owns the lists gives a new value (from
    /// [`super::ListProbes::next_generation`]) whenever rows leave a list, move within it or
    /// get other codes (a build, a compaction, a clear). A backend whose copy of the codes was
    /// made at an earlier generation of the same lineage may keep each list's rows it holds
    /// and copy only the rows after them. 0 means none: a new generation is copied afresh.
    pub lineage: u64,
}

impl CodeScan<'_> {
    /// Number of queries, once the shapes are checked: whole queries, `nprobe` existing lists
    /// each, centroids and quantizer of the dimension, and lists whose codes match their slots.
    pub(crate) fn check(&self, k: usize) -> Result<usize> {
        let nq = check_probed(
            "scan_codes",
            self.dim,
            k,
            self.queries,
            self.probes,
            self.nprobe,
            self.slots.len(),
            self.codes.len(),
            self.centroids.len(),
        )?;
        let (dim, bad) =
            (self.dim, |what: String| Err(HiveGpuError::InvalidArgument(format!("scan_codes: {what}"))));
        if self.metric.is_difference_norm() {
            return bad(format!(
                "the {} metric has no scalar-quantized distance (l2, cosine or dot)",
                self.metric
            ));
        }
        if self.base.len() != dim || self.step.len() != dim {
            return bad(format!(
                "the quantizer needs {dim} bases and steps, got {} and {}",
                self.base.len(),
                self.step.len()
            ));
        }
        for (l, (slots, codes)) in self.slots.iter().zip(self.codes).enumerate() {
            if codes.norms.len() != slots.len() || codes.codes.len() != slots.len() * dim {
                return bad(format!(
                    "list {l} has {} slots but {} norms and {} code bytes",
                    slots.len(),
                    codes.norms.len(),
                    codes.codes.len()
                ));
            }
        }
        Ok(nq)
    }

    /// Query `q`'s terms against list `l`: `weights` (dim values) and the returned offset, so
    /// that a row's distance is `offset + weights . c + extra(row)`.
    pub(crate) fn terms(&self, q: usize, l: usize, weights: &mut [f32]) -> f32 {
        let dim = self.dim;
        let query = &self.queries[q * dim..(q + 1) * dim];
        let centroid = &self.centroids[l * dim..(l + 1) * dim];
        // The offset sums in f64 over LANES lanes, which the compiler keeps in vector
        // registers: a serial f64 sum per (query, list) was an eighth of a packed SIFT10K scan
        // (docs/PERFORMANCE.md, "Packed SQ8 codes").
        const LANES: usize = 8;
        let mut lanes = [0.0f64; LANES];
        let euclidean = match self.metric {
            GpuDistanceMetric::Euclidean => true,
            GpuDistanceMetric::DotProduct | GpuDistanceMetric::Cosine => false,
            // Refused by `check`: no scalar quantizer's affine terms give them.
            GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => return 0.0,
        };
        // Component `d` adds to lane `d % LANES`: whole chunks of LANES as arrays (no bounds
        // check, so the loop vectorises), then the tail.
        let term = |lane: &mut f64, x: f32, c: f32, base: f32, step: f32| -> f32 {
            let (x, c, base, step) = (f64::from(x), f64::from(c), f64::from(base), f64::from(step));
            if euclidean {
                let u = x - c;
                *lane += u * u - 2.0 * u * base;
                (-2.0 * u * step) as f32
            } else {
                *lane -= x * (c + base);
                (-x * step) as f32
            }
        };
        let whole = dim / LANES * LANES;
        for at in (0..whole).step_by(LANES) {
            let x: &[f32; LANES] = query[at..at + LANES].try_into().expect("a whole chunk");
            let c: &[f32; LANES] = centroid[at..at + LANES].try_into().expect("a whole chunk");
            let b: &[f32; LANES] = self.base[at..at + LANES].try_into().expect("a whole chunk");
            let s: &[f32; LANES] = self.step[at..at + LANES].try_into().expect("a whole chunk");
            let w: &mut [f32; LANES] = (&mut weights[at..at + LANES]).try_into().expect("a whole chunk");
            for i in 0..LANES {
                w[i] = term(&mut lanes[i], x[i], c[i], b[i], s[i]);
            }
        }
        for d in whole..dim {
            weights[d] = term(&mut lanes[d - whole], query[d], centroid[d], self.base[d], self.step[d]);
        }
        lanes.iter().sum::<f64>() as f32
    }

    /// A row's term that depends on the row alone.
    pub(crate) fn extra(&self, norm: f32) -> f32 {
        if self.metric == GpuDistanceMetric::Euclidean { norm } else { 0.0 }
    }
}

/// The checks every code scan (`scan`: its name in errors) starts with: dim, k and nprobe of at
/// least 1, whole queries, `nprobe` probes each, as many code lists and `lists x dim` centroid
/// values as there are lists, and only lists that exist probed. Returns the number of queries.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_probed(
    scan: &str,
    dim: usize,
    k: usize,
    queries: &[f32],
    probes: &[u32],
    nprobe: usize,
    lists: usize,
    code_lists: usize,
    centroid_values: usize,
) -> Result<usize> {
    let bad = |what: String| Err(HiveGpuError::InvalidArgument(format!("{scan}: {what}")));
    if dim == 0 || k == 0 || nprobe == 0 {
        return bad(format!("dim, k and nprobe must be at least 1 (dim {dim}, k {k}, nprobe {nprobe})"));
    }
    if !queries.len().is_multiple_of(dim) {
        return bad(format!("{} values are not whole {dim}-dimensional queries", queries.len()));
    }
    let nq = queries.len() / dim;
    if probes.len() != nq * nprobe {
        return bad(format!(
            "{nq} queries of {nprobe} probes need {} list numbers, got {}",
            nq * nprobe,
            probes.len()
        ));
    }
    if code_lists != lists || centroid_values != lists * dim {
        return bad(format!(
            "{lists} lists need {lists} code lists and {} centroid values, got {code_lists} and {centroid_values}",
            lists * dim
        ));
    }
    if let Some(&list) = probes.iter().find(|&&l| l as usize >= lists) {
        return bad(format!("probe of list {list}, but there are {lists} lists"));
    }
    Ok(nq)
}

/// Rows of a list widened to f32 per tile.
const ROW_TILE: usize = 512;
/// Queries multiplied with one tile at a time: a `QUERY_BLOCK x ROW_TILE` f32 product stays in
/// a core's L2 with the tile.
const QUERY_BLOCK: usize = 128;

/// [`RowStore::scan_codes`](super::RowStore::scan_codes) on the host's threads (call it on
/// the library's pool): the `k` smallest approximate distances of each query among the live
/// (allowed) rows of its lists, ascending, ties by slot; fewer where the lists hold fewer.
pub(crate) fn scan_on_host(scan: &CodeScan<'_>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
    let nq = scan.check(k)?;
    let askers = ListAskers::new(scan.probes, scan.nprobe, scan.slots.len());
    let order = askers.by_work(|l| scan.codes[l].len());
    let scanned: Vec<Vec<Best>> = order.par_iter().map(|&l| scan_list(scan, l, askers.of(l), k)).collect();
    let mut per_query: Vec<Vec<Best>> = (0..nq).map(|_| Vec::new()).collect();
    for (&l, found) in order.iter().zip(scanned) {
        for (&q, best) in askers.of(l).iter().zip(found) {
            per_query[q as usize].push(best);
        }
    }
    Ok(per_query
        .into_par_iter()
        .map(|parts| {
            let mut merged = Best::new(k);
            for part in parts {
                for entry in part.heap.into_vec() {
                    merged.push(entry.distance, entry.slot);
                }
            }
            merged.into_neighbors()
        })
        .collect())
}

/// One list's best rows for each query in `asking`: its codes widened a tile at a time, each
/// tile multiplied with the weights of every asking query.
fn scan_list(scan: &CodeScan<'_>, l: usize, asking: &[u32], k: usize) -> Vec<Best> {
    let dim = scan.dim;
    let codes = &scan.codes[l];
    let slots = &scan.slots[l];
    let mut best: Vec<Best> = asking.iter().map(|_| Best::new(k)).collect();
    let mut weights = vec![0.0f32; asking.len() * dim];
    let offsets: Vec<f32> = asking
        .iter()
        .zip(weights.chunks_exact_mut(dim))
        .map(|(&q, w)| scan.terms(q as usize, l, w))
        .collect();
    let tile = slots.len().min(ROW_TILE);
    let block = asking.len().min(QUERY_BLOCK);
    let mut rows = vec![0.0f32; tile * dim];
    let mut products = vec![0.0f32; block * tile];
    let mut live = vec![false; tile];
    let mut extra = vec![0.0f32; tile];
    for first in (0..slots.len()).step_by(tile) {
        let count = tile.min(slots.len() - first);
        for (r, &c) in rows.iter_mut().zip(&codes.codes[first * dim..(first + count) * dim]) {
            *r = f32::from(c);
        }
        for j in 0..count {
            let slot = slots[first + j] as usize;
            live[j] = !scan.removed.contains(slot) && scan.allowed.is_none_or(|a| a.contains(slot));
            extra[j] = scan.extra(codes.norms[first + j]);
        }
        if !live[..count].contains(&true) {
            continue;
        }
        for (b, group) in asking.chunks(block).enumerate() {
            let at = b * block;
            let products = &mut products[..group.len() * count];
            inner_products(
                &weights[at * dim..(at + group.len()) * dim],
                &rows[..count * dim],
                dim,
                group.len(),
                count,
                products,
            );
            for (i, p) in products.chunks_exact(count).enumerate() {
                let found = &mut best[at + i];
                let offset = offsets[at + i];
                for j in 0..count {
                    let distance = offset + p[j] + extra[j];
                    if live[j] && distance <= found.gate() {
                        found.push(distance, slots[first + j]);
                    }
                }
            }
        }
    }
    best
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    distance: f32,
    slot: u32,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.distance.total_cmp(&other.distance).then(self.slot.cmp(&other.slot))
    }
}

/// The `k` best (distance, slot) pairs offered, ties by slot.
pub(crate) struct Best {
    k: usize,
    heap: BinaryHeap<Entry>,
}

impl Best {
    pub(crate) fn new(k: usize) -> Self {
        Self { k, heap: BinaryHeap::with_capacity(k + 1) }
    }

    /// Offers above this distance cannot enter.
    pub(crate) fn gate(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::INFINITY
        } else {
            self.heap.peek().map_or(f32::INFINITY, |e| e.distance)
        }
    }

    pub(crate) fn push(&mut self, distance: f32, slot: u32) {
        let entry = Entry { distance, slot };
        if self.heap.len() < self.k {
            self.heap.push(entry);
        } else if self.heap.peek().is_some_and(|top| entry < *top) {
            self.heap.pop();
            self.heap.push(entry);
        }
    }

    pub(crate) fn into_neighbors(self) -> Vec<Neighbor> {
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|e| Neighbor { slot: e.slot as usize, distance: f64::from(e.distance) })
            .collect()
    }
}
