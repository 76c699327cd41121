//! Per-query top-k selection over approximate f32 distances, with a proven error margin so
//! that an exact re-rank of the survivors returns exactly the true k nearest.
//!
//! Fast kernels (GEMM with norms, SIMD sums, bf16 or byte products) compute each distance with
//! an error of at most `E` ([`ErrorBound`]). Keeping every row whose approximate distance is
//! within `2E` of the current k-th best keeps every true top-k row: if `a_i` is approximate
//! and `t_i` true, a true top-k row has `a_i <= t_i + E <= t_k + E <= a_k + 2E` (the k rows
//! with the smallest `a` all have `t <= a + E`, so `t_k <= a_k + E`). The survivors are then
//! scored exactly in f64.

use std::cmp::Ordering;

pub(crate) use crate::exact::ErrorBound;

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

/// Candidates of one query: every offered row whose approximate distance may still be within
/// the error margin of the k-th best.
///
/// Rows that pass the gate are appended to one list, and the list is cut back to the gate
/// whenever it doubles: the k-th best of the list (found by selection, not kept in a heap) sets
/// the gate, and what lies above it goes. Each offered row thus costs one append and O(1)
/// selection work on average, where a heap of the k best cost a sift of log k levels for every
/// row that beat the k-th (on the 2-core VM a flat search of 1,000 rows at k = 100 spent 40% of
/// its time in those sifts: docs/PERFORMANCE.md, the collector).
///
/// The gate stays sound between cuts: every one of the k best rows offered so far passed it
/// when offered (it was never below the k-th best offered before them), so the list always
/// holds them, and the k-th of the list is the k-th of every row offered.
///
/// Ties cost no more than other data. Rows that tie with the k-th (duplicates: common in real
/// collections) all pass the margin, so the list grows with them. It is cut whenever it
/// doubles (amortised linear time), and its owner can [`Collector::shrink`] it by scoring it
/// exactly once it is [`Collector::crowded`], which bounds its memory too.
#[derive(Debug, Clone)]
pub struct Collector {
    k: usize,
    bound: ErrorBound,
    /// Every offered row that was at or under the gate when offered (some may be above the
    /// gate now: they go at the next cut).
    list: Vec<Entry>,
    /// `list` is cut back to the gate when it grows past this length, which then becomes twice
    /// what survived: every entry is looked at O(1) times on average, whatever the ties.
    cap: usize,
    /// Rows with an approximate distance above this cannot be among the k nearest: the least
    /// of the gate the list's k-th proved at its last cut, `exact_gate` and `limit`.
    gate: f32,
    /// The gate that k exactly scored rows prove (see [`Collector::shrink`]); +inf before.
    exact_gate: f32,
    /// The gate that k rows offered to this collector prove before it holds them (see
    /// [`Collector::limit_to`]), or that another collector of the same query reported (see
    /// [`Collector::adopt_gate`]); +inf before.
    limit: f32,
}

impl Collector {
    /// An empty collector for `k >= 1` results.
    pub fn new(k: usize, bound: ErrorBound) -> Self {
        Self {
            k,
            bound,
            list: Vec::new(),
            cap: Self::base_cap(k),
            gate: f32::INFINITY,
            exact_gate: f32::INFINITY,
            limit: f32::INFINITY,
        }
    }

    fn base_cap(k: usize) -> usize {
        2 * k + 16
    }

    /// The number of results this collector keeps.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Rows with an approximate distance above this value cannot be among the true k nearest.
    #[inline]
    pub fn gate(&self) -> f32 {
        self.gate
    }

    /// Offers a row; cheap to call only for distances at or under [`Collector::gate`].
    #[inline]
    pub fn push(&mut self, distance: f32, slot: u32) {
        // Removed rows arrive as +inf (or NaN, where `0 * inf` met a removed row's overflowing
        // values): never a candidate, even before the list holds k.
        if distance > self.gate || distance.is_nan() || distance == f32::INFINITY {
            return;
        }
        self.list.push(Entry { distance, slot });
        if self.list.len() > self.cap {
            self.cut();
        }
    }

    /// Lowers the gate to what the list's k-th best proves and drops every entry above it.
    fn cut(&mut self) {
        if self.list.len() >= self.k {
            let kth = self.list.select_nth_unstable(self.k - 1).1.distance;
            let approximate = self.gate_at(kth);
            self.gate = self.gate.min(approximate);
        }
        let gate = self.gate;
        self.list.retain(|e| e.distance <= gate);
        self.cap = Self::base_cap(self.k).max(2 * self.list.len());
    }

    /// The gate that k rows of approximate distance at most `d` prove: 2E at `d`. A relative
    /// E is measured against the true value, which may exceed `d` by E itself; the extra
    /// factor and the few ulps of |d| also cover the rounding of this very sum.
    fn gate_at(&self, d: f32) -> f32 {
        let e = (self.bound.absolute + self.bound.relative * d.abs()) * (1.0 + 2.0 * self.bound.relative);
        d + 2.0 * e + d.abs() * (4.0 * f32::EPSILON)
    }

    /// Lowers the gate to what `kth` proves: the caller has k rows whose approximate distance
    /// is at most `kth` and offers every one of them to this collector next. Those k rows pass
    /// the lowered gate, so they (or better ones) end up here, and a row whose approximate
    /// distance exceeds `gate_at(kth)` loses to all of them. Offering the rows of a block only
    /// after this saves pushing (and heap work for) the many a fresh collector would take in
    /// before it holds k.
    pub fn limit_to(&mut self, kth: f32) {
        if kth.is_finite() {
            self.limit = self.limit.min(self.gate_at(kth));
            self.gate = self.gate.min(self.limit);
        }
    }

    /// Lowers the gate to `gate`, the [`Collector::gate`] of another collector of the same
    /// query, with the same k and the same [`ErrorBound`], over rows of the same search (the
    /// other lists an IVF query probes). Every gate a collector reports rests on k rows of that
    /// search under that bound, so any row above it loses to k real rows and cannot be among
    /// the query's k nearest (a collector with a larger bound could not take it: a row within
    /// its own margin might lie above a gate proved with a smaller one). This collector may
    /// then end up holding fewer than k rows; the merge of the query's collectors still holds
    /// every one of its k nearest.
    pub fn adopt_gate(&mut self, gate: f32) {
        if gate < self.limit {
            self.limit = gate;
            self.gate = self.gate.min(gate);
        }
    }

    /// Whether the list has grown enough (many rows tie with the k-th) that its owner should
    /// [`Collector::shrink`] it.
    pub fn crowded(&self) -> bool {
        self.list.len() > self.k + (8 * self.k).max(4096)
    }

    /// Scores every candidate exactly with `exact` (which appends the canonical f64 distance of
    /// each slot it is given, in order) and
    /// keeps only the k best by (exact distance, slot): every other candidate is beaten by k
    /// real rows, so it cannot be in the result.
    ///
    /// Those k rows also bound later ones. If `t_k` is the largest of their exact distances, a
    /// row whose approximate distance `a` exceeds `t_k + E(t_k)` has a true distance
    /// `t >= a - E(t) > t_k` (`t + E(t)` grows with `t`, as `relative < 1`), so it loses to all
    /// k: that is the exact gate. Duplicates thus cost one exact score each, and the list stays
    /// short however many rows tie.
    pub fn shrink(&mut self, mut exact: impl FnMut(&[u32], &mut Vec<f64>)) {
        let gate = self.gate;
        self.list.retain(|e| e.distance <= gate);
        let slots: Vec<u32> = self.list.iter().map(|e| e.slot).collect();
        let mut distances = Vec::with_capacity(slots.len());
        exact(&slots, &mut distances);
        let mut scored: Vec<(f64, Entry)> = distances.into_iter().zip(self.list.drain(..)).collect();
        let by_exact = |a: &(f64, Entry), b: &(f64, Entry)| a.0.total_cmp(&b.0).then(a.1.slot.cmp(&b.1.slot));
        if scored.len() > self.k {
            scored.select_nth_unstable_by(self.k - 1, by_exact);
            scored.truncate(self.k);
        }
        if scored.len() == self.k
            && let Some(t_k) = scored.iter().map(|s| s.0).max_by(f64::total_cmp)
        {
            self.exact_gate = self.exact_gate.min(self.gate_above(t_k));
            self.gate = self.gate.min(self.exact_gate);
        }
        self.list.extend(scored.into_iter().map(|(_, e)| e));
        self.cut();
    }

    /// `t + E(t)` with its rounding covered, as an f32 no smaller than the f64 value.
    fn gate_above(&self, t: f64) -> f32 {
        let (absolute, relative) = (f64::from(self.bound.absolute), f64::from(self.bound.relative));
        let e = (absolute + relative * t.abs()) * (1.0 + 2.0 * relative);
        let gate = t + e + t.abs() * (4.0 * f64::from(f32::EPSILON));
        let rounded = gate as f32;
        if f64::from(rounded) < gate { rounded.next_up() } else { rounded }
    }

    /// Moves every candidate of `other` (same k and bound) into `self`.
    pub fn merge(&mut self, other: Collector) {
        // The other's gates rest on rows of the same collection that it holds (or better ones)
        // and hands over: they bound this one too.
        self.exact_gate = self.exact_gate.min(other.exact_gate);
        self.limit = self.limit.min(other.limit);
        self.gate = self.gate.min(other.gate).min(self.exact_gate).min(self.limit);
        for e in other.list {
            self.push(e.distance, e.slot);
        }
    }

    /// The surviving candidates as `(approximate distance, slot)`, unordered: the list cut to
    /// the gate its k-th proves. Under a zero bound these are every offered row at or below
    /// the k-th distance (with a few ulps), so the k best by (distance, slot) are among them.
    pub fn into_entries(mut self) -> Vec<(f32, u32)> {
        self.cut();
        self.list.into_iter().map(|e| (e.distance, e.slot)).collect()
    }

    /// The surviving candidate slots, unordered: the list cut to the gate its k-th proves.
    pub fn into_slots(mut self) -> Vec<usize> {
        self.cut();
        self.list.into_iter().map(|e| e.slot as usize).collect()
    }
}

/// The k best of exactly scored candidates `(slot, distance)`, best first, ties by slot.
pub fn best_k(mut scored: Vec<(usize, f64)>, k: usize) -> Vec<(usize, f64)> {
    let by_distance = |a: &(usize, f64), b: &(usize, f64)| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0));
    if scored.len() > k {
        scored.select_nth_unstable_by(k - 1, by_distance);
        scored.truncate(k);
    }
    scored.sort_unstable_by(by_distance);
    scored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_k_best_and_everything_within_the_margin() {
        let bound = ErrorBound { absolute: 0.5, relative: 0.0 };
        let mut c = Collector::new(2, bound);
        for (slot, d) in [(0u32, 5.0f32), (1, 1.0), (2, 9.0), (3, 2.0), (4, 2.4), (5, 2.6), (6, 3.0)] {
            c.push(d, slot);
        }
        let mut slots = c.into_slots();
        slots.sort();
        // k-th best is 2.0 and E = 0.5, so everything up to 2.0 + 2E = 3.0 survives.
        assert_eq!(slots, vec![1, 3, 4, 5, 6]);
    }

    #[test]
    fn a_collector_limited_by_the_kth_of_the_rows_it_is_offered_keeps_what_an_unlimited_one_keeps() {
        let bound = ErrorBound { absolute: 0.5, relative: 0.01 };
        let rows: Vec<(u32, f32)> = (0..200u32).map(|i| (i, ((i * 37) % 101) as f32 * 0.25 - 3.0)).collect();
        for k in [1, 2, 10, 50] {
            let mut plain = Collector::new(k, bound);
            let mut limited = Collector::new(k, bound);
            let mut sorted: Vec<f32> = rows.iter().map(|r| r.1).collect();
            sorted.sort_by(f32::total_cmp);
            limited.limit_to(sorted[k - 1]);
            assert!(limited.gate() < f32::INFINITY);
            for &(slot, d) in &rows {
                plain.push(d, slot);
                limited.push(d, slot);
            }
            let (mut a, mut b) = (plain.into_slots(), limited.into_slots());
            a.sort();
            b.sort();
            assert_eq!(a, b, "k = {k}");
        }
    }

    #[test]
    fn collectors_of_one_query_sharing_their_gates_merge_to_what_one_collector_keeps() {
        // An IVF query's lists, scanned by separate collectors in any order, each taking the
        // gate the ones before it reported: lists far from the query first (a loose gate
        // passed on), near ones first (a tight gate that empties later lists), with ties.
        let bound = ErrorBound { absolute: 0.5, relative: 0.01 };
        let rows: Vec<(u32, f32)> =
            (0..400u32).map(|i| (i, ((i * 53) % 97) as f32 * 0.25 + (i / 100) as f32)).collect();
        for k in [1, 4, 10, 40] {
            for order in [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]] {
                let mut one = Collector::new(k, bound);
                for &(slot, d) in &rows {
                    one.push(d, slot);
                }
                let mut shared = f32::INFINITY;
                let mut parts = Vec::new();
                let (mut kept_shared, mut kept_alone) = (0, 0);
                for list in order {
                    let mut c = Collector::new(k, bound);
                    let mut alone = Collector::new(k, bound);
                    c.adopt_gate(shared);
                    for &(slot, d) in &rows[list * 100..(list + 1) * 100] {
                        c.push(d, slot);
                        alone.push(d, slot);
                    }
                    shared = shared.min(c.gate());
                    kept_shared += c.clone().into_slots().len();
                    kept_alone += alone.into_slots().len();
                    parts.push(c);
                }
                // The shared gate did its work: the nearest list first (its rows lie 1 to 3
                // below the others'), the later lists kept fewer rows than on their own gates.
                if order[0] == 0 && k < 40 {
                    assert!(kept_shared < kept_alone, "k = {k}: {kept_shared} kept, {kept_alone} alone");
                }
                let mut parts = parts.into_iter();
                let mut merged = parts.next().expect("four lists");
                merged.adopt_gate(shared);
                for part in parts {
                    merged.merge(part);
                }
                // Survivors may differ by rows within the margin; the k best must not.
                let best = |slots: Vec<usize>| {
                    let mut scored: Vec<(usize, f32)> = slots.into_iter().map(|s| (s, rows[s].1)).collect();
                    scored.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                    scored.truncate(k);
                    scored
                };
                assert_eq!(best(merged.into_slots()), best(one.into_slots()), "k = {k}, order {order:?}");
            }
        }
    }

    #[test]
    fn the_list_cut_many_times_keeps_exactly_the_rows_within_the_margin_of_the_kth_of_all() {
        // Many cuts (thousands of rows against a list of 2k + 16), values offered in an order
        // that improves slowly and with many ties: a gate taken from a stale k-th, or a k-th
        // row dropped at a cut, would change the survivors.
        let bound = ErrorBound { absolute: 0.25, relative: 0.001 };
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for k in [1, 3, 10, 64] {
            for round in 0..4 {
                let rows: Vec<f32> = (0..5000u32)
                    .map(|i| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let drift = if round % 2 == 0 { 5000.0 - i as f32 } else { 0.0 };
                        ((state % 64) as f32) * 0.125 + drift * 0.01
                    })
                    .collect();
                let mut c = Collector::new(k, bound);
                for (slot, &d) in rows.iter().enumerate() {
                    c.push(d, slot as u32);
                }
                let mut sorted = rows.clone();
                sorted.sort_by(f32::total_cmp);
                let gate = c.gate_at(sorted[k - 1]);
                let want: Vec<usize> = (0..rows.len()).filter(|&s| rows[s] <= gate).collect();
                let mut got = c.into_slots();
                got.sort();
                assert_eq!(got, want, "k = {k}, round {round}");
            }
        }
    }

    #[test]
    fn zero_margin_keeps_exact_ties() {
        let mut c = Collector::new(1, ErrorBound { absolute: 0.0, relative: 0.0 });
        for slot in 0..4u32 {
            c.push(1.0, slot);
        }
        let mut slots = c.into_slots();
        slots.sort();
        assert_eq!(slots, vec![0, 1, 2, 3]);
    }

    #[test]
    fn merged_collectors_equal_one_collector() {
        let bound = ErrorBound { absolute: 0.1, relative: 0.01 };
        let values: Vec<f32> = (0..200).map(|i| ((i * 7919) % 211) as f32 / 3.0).collect();
        let mut whole = Collector::new(5, bound);
        let (mut left, mut right) = (Collector::new(5, bound), Collector::new(5, bound));
        for (i, &v) in values.iter().enumerate() {
            whole.push(v, i as u32);
            if i < 100 { left.push(v, i as u32) } else { right.push(v, i as u32) }
        }
        left.merge(right);
        let (mut a, mut b) = (whole.into_slots(), left.into_slots());
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }

    #[test]
    fn infinite_distances_are_never_candidates() {
        let mut c = Collector::new(3, ErrorBound { absolute: 0.0, relative: 0.0 });
        c.push(f32::INFINITY, 0);
        c.push(f32::NAN, 2);
        c.push(-f32::NAN, 3);
        c.push(1.0, 1);
        assert_eq!(c.into_slots(), vec![1]);
    }

    #[test]
    fn best_k_orders_ties_by_slot() {
        let got = best_k(vec![(9, 1.0), (3, 0.5), (4, 1.0), (1, 2.0), (2, 1.0)], 3);
        assert_eq!(got, vec![(3, 0.5), (2, 1.0), (4, 1.0)]);
    }
}
