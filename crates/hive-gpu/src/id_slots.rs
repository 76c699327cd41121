//! A collection's map from ids to slots, kept in shards by a hash of the id, so that a million
//! ids go in on every core at once (an open's restore, a large add) rather than on one: on the
//! H100 machine one thread took 0.061 s to map the ids of a 1M-vector file, the longest part
//! of the open's restore (docs/PERFORMANCE.md, opening a saved collection).
//!
//! A lookup costs one more hash than a plain map's (the shard's). The shard is chosen with a
//! hasher of its own: the shards' maps use their own, so the keys of one shard do not share
//! the bits their maps probe with.

use std::collections::HashMap;
use std::collections::TryReserveError;
use std::hash::BuildHasher;

use rayon::prelude::*;
use smol_str::SmolStr;

type Shard = HashMap<SmolStr, usize, foldhash::fast::RandomState>;

/// Shards: enough for every core of a large machine to fill one at a time.
const SHARDS: usize = 32;

/// Ids inserted at once below which one thread inserts them (the parallel path's own passes
/// cost more than it saves).
const PARALLEL_IDS: usize = 1 << 15;

/// Ids to slots, in shards.
#[derive(Debug, Clone)]
pub(crate) struct IdSlots {
    selector: foldhash::fast::RandomState,
    shards: Vec<Shard>,
}

impl Default for IdSlots {
    fn default() -> Self {
        Self { selector: Default::default(), shards: (0..SHARDS).map(|_| Shard::default()).collect() }
    }
}

impl IdSlots {
    fn shard_of(&self, id: &str) -> usize {
        // The top bits of the selector's hash, spread over the shards.
        ((self.selector.hash_one(id) >> 32) as usize * SHARDS) >> 32
    }

    /// The slot of `id`.
    pub(crate) fn get(&self, id: &str) -> Option<&usize> {
        self.shards[self.shard_of(id)].get(id)
    }

    /// The slot of `id`, to change.
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut usize> {
        let shard = self.shard_of(id);
        self.shards[shard].get_mut(id)
    }

    /// Whether `id` has a slot.
    pub(crate) fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// Maps `id` to `slot`, returning the slot it had.
    pub(crate) fn insert(&mut self, id: SmolStr, slot: usize) -> Option<usize> {
        let shard = self.shard_of(&id);
        self.shards[shard].insert(id, slot)
    }

    /// Forgets `id`, returning its slot.
    pub(crate) fn remove(&mut self, id: &str) -> Option<usize> {
        let shard = self.shard_of(id);
        self.shards[shard].remove(id)
    }

    /// Room for `additional` more ids in every shard's expected share, with slack for the
    /// spread of a hash: an eighth, at least 16 (a shard of a share `s` fills beyond
    /// `s + sqrt(s)` rarely, and beyond the slack practically never; a shard that does grows
    /// as any map does).
    pub(crate) fn try_reserve(&mut self, additional: usize) -> Result<(), TryReserveError> {
        if additional == 0 {
            return Ok(());
        }
        let share = additional.div_ceil(SHARDS);
        let slack = (share / 8).max(16);
        self.shards.iter_mut().try_for_each(|shard| shard.try_reserve(share + slack))
    }

    /// Maps the `(id, slot)` that `items(i)` gives for each `i` below `count` (None: no id
    /// there), in the order of `i` within each shard, on every core when there are many. Stops
    /// at the first id already present (or given twice), the one of the smallest `i`:
    /// `Err((i, earlier slot))`, as inserting them one after another would (the map then holds
    /// some of the items).
    pub(crate) fn insert_all<'a>(
        &mut self,
        items: &(impl Fn(usize) -> Option<(&'a SmolStr, usize)> + Sync),
        count: usize,
    ) -> Result<(), (usize, usize)> {
        if count < PARALLEL_IDS {
            for i in 0..count {
                if let Some((id, slot)) = items(i)
                    && let Some(earlier) = self.insert(id.clone(), slot)
                {
                    return Err((i, earlier));
                }
            }
            return Ok(());
        }
        // Each item's shard (NONE for no item), then each shard's items in order, then the
        // shards filled side by side (each by one thread: its items stay in order).
        const NONE: u8 = u8::MAX;
        let shard_of: Vec<u8> = (0..count)
            .into_par_iter()
            .with_min_len(4096)
            .map(|i| items(i).map_or(NONE, |(id, _)| self.shard_of(id) as u8))
            .collect();
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); SHARDS];
        members.par_iter_mut().enumerate().for_each(|(shard, list)| {
            list.extend((0..count).filter(|&i| shard_of[i] as usize == shard));
        });
        let first_repeat = self
            .shards
            .par_iter_mut()
            .zip(members)
            .filter_map(|(shard, list)| {
                list.into_iter().find_map(|i| {
                    let (id, slot) = items(i)?;
                    shard.insert(id.clone(), slot).map(|earlier| (i, earlier))
                })
            })
            .min();
        first_repeat.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserting_all_at_once_finds_the_first_repeat_as_inserting_one_by_one_does() {
        // Both sides of the parallel threshold, with repeats far apart, near, and none.
        for count in [100, PARALLEL_IDS + 1000] {
            let ids: Vec<SmolStr> = (0..count).map(|i| SmolStr::new(format!("id-{i}"))).collect();
            let mut map = IdSlots::default();
            assert_eq!(map.insert_all(&|i| Some((&ids[i], i * 2)), count), Ok(()));
            assert!((0..count).all(|i| map.get(&ids[i]) == Some(&(i * 2))));
            for (first, second) in [(3, count - 5), (count - 9, count - 8), (0, count - 1)] {
                let mut repeated = ids.clone();
                repeated[second] = repeated[first].clone();
                // A later repeat too: the first must be the one reported.
                repeated[count - 2] = repeated[1].clone();
                let expected = if second < count - 2 { (second, first) } else { (count - 2, 1) };
                let mut map = IdSlots::default();
                assert_eq!(
                    map.insert_all(&|i| Some((&repeated[i], i)), count),
                    Err(expected),
                    "{count} {first} {second}"
                );
            }
        }
    }

    #[test]
    fn lookups_removals_and_changes_reach_the_shard_that_holds_the_id() {
        let mut map = IdSlots::default();
        map.try_reserve(1000).expect("room");
        for i in 0..1000 {
            assert_eq!(map.insert(SmolStr::new(format!("{i}")), i), None);
        }
        assert_eq!(map.insert(SmolStr::new("7"), 70), Some(7));
        *map.get_mut("8").expect("present") = 80;
        assert_eq!(map.remove("9"), Some(9));
        assert!(!map.contains_key("9") && map.contains_key("10"));
        assert_eq!((map.get("7"), map.get("8"), map.get("1000")), (Some(&70), Some(&80), None));
        // The ids spread over the shards.
        assert!(map.shards.iter().all(|s| !s.is_empty()));
    }
}
