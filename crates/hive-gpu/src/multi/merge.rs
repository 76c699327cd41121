//! The exact merge of the shards' top-k lists.
//!
//! Each shard returns its `k` best, ascending by (distance, slot). A shard's slots are in the
//! order its rows were written, and so are its order keys (`Collection::order`), so each list
//! is also ascending by (distance, order key). The true top-k of the whole storage is the `k`
//! smallest entries of the union by (distance, order key): every one of them is among its own
//! shard's top-k (an entry beaten by `k` others of its shard is beaten by `k` others overall).
//! Ordering ties by the key is what makes a sharded search return what one collection holding
//! the same writes would: that collection orders ties by slot, which is write order too.

use crate::backend::Neighbor;

/// One merged neighbour: the shard it lives on, and the shard's neighbour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Placed {
    pub(crate) shard: u32,
    pub(crate) neighbour: Neighbor,
    /// Its order key.
    pub(crate) key: u64,
}

/// The `k` best of the shards' lists for one query. `lists[s]` is shard `s`'s list (ascending
/// by distance, then key), `key(s, slot)` a slot's order key.
pub(crate) fn merge(lists: &[&[Neighbor]], k: usize, key: impl Fn(usize, usize) -> u64) -> Vec<Placed> {
    let mut heads = vec![0usize; lists.len()];
    let mut out = Vec::with_capacity(k.min(lists.iter().map(|l| l.len()).sum()));
    while out.len() < k {
        let mut best: Option<Placed> = None;
        for (shard, list) in lists.iter().enumerate() {
            let Some(&neighbour) = list.get(heads[shard]) else { continue };
            let candidate = Placed { shard: shard as u32, neighbour, key: key(shard, neighbour.slot) };
            let better = best.is_none_or(|b| {
                candidate
                    .neighbour
                    .distance
                    .total_cmp(&b.neighbour.distance)
                    .then(candidate.key.cmp(&b.key))
                    .then(candidate.shard.cmp(&b.shard))
                    .is_lt()
            });
            if better {
                best = Some(candidate);
            }
        }
        let Some(best) = best else { break };
        heads[best.shard as usize] += 1;
        out.push(best);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(slot: usize, distance: f64) -> Neighbor {
        Neighbor { slot, distance }
    }

    #[test]
    fn ties_across_shards_go_by_order_key_not_by_shard() {
        // Shard 0 holds keys 10 and 30, shard 1 key 20: all at one distance.
        let zero = [n(0, 1.0), n(1, 1.0)];
        let one = [n(0, 1.0)];
        let keys = [[10u64, 30], [20, 0]];
        let merged = merge(&[&zero, &one], 3, |s, slot| keys[s][slot]);
        let got: Vec<u64> = merged.iter().map(|p| p.key).collect();
        assert_eq!(got, [10, 20, 30]);
    }

    #[test]
    fn the_merge_keeps_the_k_smallest_and_stops_at_what_the_shards_hold() {
        let a = [n(0, 0.5), n(3, 2.0), n(4, 9.0)];
        let b = [n(1, 1.0), n(2, 3.0)];
        let merged = merge(&[&a, &b], 4, |s, slot| (s * 100 + slot) as u64);
        let got: Vec<(u32, usize)> = merged.iter().map(|p| (p.shard, p.neighbour.slot)).collect();
        assert_eq!(got, [(0, 0), (1, 1), (0, 3), (1, 2)]);
        assert_eq!(merge(&[&a, &b], 10, |_, slot| slot as u64).len(), 5);
        assert!(merge(&[&[], &[]], 3, |_, slot| slot as u64).is_empty());
    }
}
