//! [`SlotSet`]: one bit per slot with a count. Removed rows and user filters are both slot sets,
//! and a search reads one of them: a backend's kernels skip every slot whose bit is set in the
//! search's exclusion words (`!(live AND allowed)`, see [`SearchMask`]), so a removed row and a
//! filtered-out row are one mechanism on every backend. The words are u32 so that a GPU backend
//! uploads them as they are (bit `s % 32` of word `s / 32` is slot `s`).

/// A set of slots: one bit per slot (set = member) and how many are set.
///
/// A collection's removed rows are one; a search's filter becomes one (`crate::Filter`); a
/// [`crate::backend::RowStore`] searches the live members of the one it is given.
#[derive(Debug, Default)]
pub struct SlotSet {
    words: Vec<u32>,
    count: usize,
    /// Names these contents ([`SlotSet::stamp`]): 0 until asked, then a stamp no other
    /// contents had; every change sets it back to 0 (a store, not a new stamp per bit).
    stamp: std::sync::atomic::AtomicU64,
}

impl Clone for SlotSet {
    /// The same members under the same stamp.
    fn clone(&self) -> Self {
        Self {
            words: self.words.clone(),
            count: self.count,
            stamp: std::sync::atomic::AtomicU64::new(self.stamp.load(std::sync::atomic::Ordering::Relaxed)),
        }
    }
}

impl PartialEq for SlotSet {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && self.words == other.words
    }
}

impl Eq for SlotSet {}

/// A stamp nothing has had before in this process (sets, and the GPU engine's rows).
pub(crate) fn new_stamp() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl SlotSet {
    /// Names these contents: equal stamps mean equal members. A backend keys what it derives
    /// from a set (a search's skip words on a device, the rows a filter passes) by the stamp,
    /// and builds it again only when the stamp differs. A clone keeps the stamp; a change of
    /// the members gives the set a new one when it is next asked.
    pub fn stamp(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let stamp = self.stamp.load(Relaxed);
        if stamp != 0 {
            return stamp;
        }
        let fresh = new_stamp();
        match self.stamp.compare_exchange(0, fresh, Relaxed, Relaxed) {
            Ok(_) => fresh,
            Err(set_meanwhile) => set_meanwhile,
        }
    }

    /// Records a change of the members: the stamp is asked anew.
    fn changed(&mut self) {
        *self.stamp.get_mut() = 0;
    }

    /// Words for `slots` slots.
    pub(crate) fn words_for(slots: usize) -> usize {
        slots.div_ceil(32)
    }

    /// The set of `slots` (any order, duplicates allowed), covering `len` slots; slots at or
    /// past `len` are left out.
    pub fn from_slots(len: usize, slots: impl IntoIterator<Item = usize>) -> Self {
        let mut set = Self::empty(len);
        for slot in slots {
            if slot < len {
                set.set(slot, true);
            }
        }
        set
    }

    /// The set whose words are `words` (bit `s % 32` of word `s / 32` is slot `s`), covering
    /// `len` slots; `Err(slot)` names a set bit at or past `len`.
    pub(crate) fn checked_from_words(words: Vec<u32>, len: usize) -> std::result::Result<Self, usize> {
        for (w, &word) in words.iter().enumerate() {
            let first = w * 32;
            let valid_bits = len.saturating_sub(first).min(32);
            let stray = if valid_bits == 32 { 0 } else { word >> valid_bits };
            if stray != 0 {
                return Err(first + valid_bits + stray.trailing_zeros() as usize);
            }
        }
        Ok(Self::from_words(words))
    }

    /// No member, covering `len` slots.
    pub fn empty(len: usize) -> Self {
        Self { words: vec![0; Self::words_for(len)], count: 0, stamp: Default::default() }
    }

    /// Every slot of `0..len`.
    pub fn full(len: usize) -> Self {
        let mut words = vec![u32::MAX; Self::words_for(len)];
        if let Some(last) = words.last_mut()
            && !len.is_multiple_of(32)
        {
            *last = (1u32 << (len % 32)) - 1;
        }
        Self { words, count: len, stamp: Default::default() }
    }

    /// Whether `slot` is a member (slots past the words are not).
    pub fn contains(&self, slot: usize) -> bool {
        self.count > 0 && self.words.get(slot / 32).is_some_and(|w| (w >> (slot % 32)) & 1 != 0)
    }

    /// Adds or takes out `slot`; returns whether that changed anything. The words grow to
    /// cover `slot`.
    pub(crate) fn set(&mut self, slot: usize, member: bool) -> bool {
        if slot / 32 >= self.words.len() {
            if !member {
                return false;
            }
            self.words.resize(slot / 32 + 1, 0);
        }
        let bit = 1u32 << (slot % 32);
        let word = &mut self.words[slot / 32];
        if (*word & bit != 0) == member {
            return false;
        }
        *word ^= bit;
        self.changed();
        if member {
            self.count += 1;
        } else {
            self.count -= 1;
        }
        true
    }

    /// Covers at least `slots` slots (new ones not members).
    pub(crate) fn cover(&mut self, slots: usize) {
        let words = Self::words_for(slots);
        if self.words.len() < words {
            self.words.resize(words, 0);
            self.changed();
        }
    }

    /// Reserves room to cover `slots` slots without reallocating.
    pub(crate) fn try_reserve(
        &mut self,
        slots: usize,
    ) -> std::result::Result<(), std::collections::TryReserveError> {
        self.words.try_reserve(Self::words_for(slots).saturating_sub(self.words.len()))
    }

    /// Takes out every slot from `slot` on (a rollback's truncation).
    pub(crate) fn clear_from(&mut self, slot: usize) {
        let first_word = slot / 32;
        if first_word >= self.words.len() {
            return;
        }
        let keep = (1u32 << (slot % 32)).wrapping_sub(1);
        let mut dropped = (self.words[first_word] & !keep).count_ones() as usize;
        self.words[first_word] &= keep;
        self.changed();
        for word in &mut self.words[first_word + 1..] {
            dropped += word.count_ones() as usize;
            *word = 0;
        }
        self.count -= dropped;
    }

    /// No member, covering `slots` slots.
    pub(crate) fn reset(&mut self, slots: usize) {
        *self = Self::empty(slots);
    }

    /// Members.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The words (bit `s % 32` of word `s / 32` is slot `s`); words past the end hold no
    /// member.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Heap bytes held.
    pub(crate) fn capacity_bytes(&self) -> usize {
        self.words.capacity() * 4
    }

    /// The members, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let bit = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    w * 32 + bit
                })
            })
        })
    }

    /// The members of `start..start + len`, renumbered from 0: the set a search of those slots
    /// alone reads (a window of a streamed collection).
    pub(crate) fn window(&self, start: usize, len: usize) -> SlotSet {
        let (first, shift) = (start / 32, start % 32);
        let word = |i: usize| self.words.get(i).copied().unwrap_or(0);
        let mut words: Vec<u32> = (0..Self::words_for(len))
            .map(|i| {
                let low = word(first + i) >> shift;
                // A shift by 32 is no shift in Rust's checked arithmetic: the high part is
                // only taken when the window is not word-aligned.
                if shift == 0 { low } else { low | (word(first + i + 1) << (32 - shift)) }
            })
            .collect();
        if let Some(last) = words.last_mut()
            && !len.is_multiple_of(32)
        {
            *last &= (1u32 << (len % 32)) - 1;
        }
        Self::from_words(words)
    }

    /// Members of both.
    pub fn and(&self, other: &SlotSet) -> SlotSet {
        let words: Vec<u32> = self.words.iter().zip(&other.words).map(|(a, b)| a & b).collect();
        Self::from_words(words)
    }

    /// Members of this set that are not members of `other`, in one pass.
    pub(crate) fn and_not(&self, other: &SlotSet) -> SlotSet {
        let words: Vec<u32> = self
            .words
            .iter()
            .enumerate()
            .map(|(i, &w)| w & !other.words.get(i).copied().unwrap_or(0))
            .collect();
        Self::from_words(words)
    }

    /// Members of either.
    pub fn or(&self, other: &SlotSet) -> SlotSet {
        let (long, short) = if self.words.len() >= other.words.len() { (self, other) } else { (other, self) };
        let mut words = long.words.clone();
        for (w, s) in words.iter_mut().zip(&short.words) {
            *w |= s;
        }
        Self::from_words(words)
    }

    /// The slots of `0..len` that are not members.
    pub fn complement(&self, len: usize) -> SlotSet {
        let full = Self::full(len);
        let words: Vec<u32> = full
            .words
            .iter()
            .enumerate()
            .map(|(i, &all)| all & !self.words.get(i).copied().unwrap_or(0))
            .collect();
        Self::from_words(words)
    }

    fn from_words(words: Vec<u32>) -> SlotSet {
        let count = words.iter().map(|w| w.count_ones() as usize).sum();
        SlotSet { words, count, stamp: Default::default() }
    }
}

/// What one search reads: the words of the slots it must skip (removed, or not allowed by the
/// search's filter) over `len` slots, and how many it may return.
///
/// Without a filter the skip words are the removed set itself and nothing is built. With one,
/// the words are `removed OR NOT allowed`, built once per search on the host (a word operation
/// per 32 slots) and sent to the device once.
#[derive(Debug)]
pub(crate) struct SearchMask<'a> {
    /// Bit set = the search skips the slot. May be shorter than `len` (missing words: kept).
    pub(crate) skip: std::borrow::Cow<'a, SlotSet>,
    /// Slots the search may return: `len` minus the skipped ones.
    pub(crate) live: usize,
    /// Whether a filter narrowed the search (the skip words are not the removed set).
    pub(crate) filtered: bool,
}

impl<'a> SearchMask<'a> {
    /// The mask of a search over `len` slots with `removed` rows, restricted to `allowed`.
    pub(crate) fn new(removed: &'a SlotSet, len: usize, allowed: Option<&SlotSet>) -> Self {
        match allowed {
            None => Self {
                skip: std::borrow::Cow::Borrowed(removed),
                live: len - removed.count(),
                filtered: false,
            },
            Some(allowed) => {
                // Word by word, `!(allowed AND NOT removed)`, in loops without a bound check
                // or branch per word (they vectorize: a million slots are 31,250 words); a
                // word past the end of `allowed` is not allowed, one past `removed` not removed,
                // and the last word's bits past `len` are skipped.
                let count = SlotSet::words_for(len);
                let mut words = vec![u32::MAX; count];
                let both = count.min(allowed.words.len()).min(removed.words.len());
                for ((skip, &a), &r) in
                    words[..both].iter_mut().zip(&allowed.words[..both]).zip(&removed.words[..both])
                {
                    *skip = !(a & !r);
                }
                let allowed_only = count.min(allowed.words.len()).max(both);
                for (skip, &a) in words[both..allowed_only].iter_mut().zip(&allowed.words[both..allowed_only])
                {
                    *skip = !a;
                }
                if let Some(last) = words.last_mut()
                    && !len.is_multiple_of(32)
                {
                    *last |= !((1u32 << (len % 32)) - 1);
                }
                let skip = SlotSet::from_words(words);
                let live = count * 32 - skip.count();
                Self { skip: std::borrow::Cow::Owned(skip), live, filtered: true }
            }
        }
    }
}

impl SearchMask<'_> {
    /// The slots of `0..len` the search reads, ascending.
    pub(crate) fn kept(&self, len: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.live);
        for w in 0..SlotSet::words_for(len) {
            let mut bits = !self.skip.words().get(w).copied().unwrap_or(0);
            while bits != 0 {
                let slot = w * 32 + bits.trailing_zeros() as usize;
                if slot >= len {
                    break;
                }
                out.push(slot);
                bits &= bits - 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_window_holds_exactly_the_members_of_its_range_renumbered_at_any_alignment() {
        let members = [0, 3, 31, 32, 33, 63, 64, 95, 100, 127, 128, 130];
        let set = SlotSet::from_slots(140, members);
        for start in [0, 1, 5, 31, 32, 33, 64, 100, 139, 140] {
            for len in [0, 1, 7, 31, 32, 33, 40, 64, 140 - start] {
                let window = set.window(start, len);
                let expected: Vec<usize> =
                    members.iter().filter(|&&s| s >= start && s < start + len).map(|s| s - start).collect();
                assert_eq!(window.iter().collect::<Vec<_>>(), expected, "start {start} len {len}");
                assert_eq!(window.count(), expected.len());
                assert_eq!(window.words().len(), len.div_ceil(32));
            }
        }
    }

    #[test]
    fn a_search_mask_skips_exactly_the_removed_the_not_allowed_and_the_slots_past_the_end() {
        // Sets shorter and longer than the search's slots, lengths on and off a word boundary.
        let mut seed = 0x9e37_79b9_u64;
        let mut draw = move |n: usize| -> usize {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for len in [0, 1, 31, 32, 33, 64, 100, 1000] {
            for (allowed_len, removed_len) in
                [(len, len), (len / 2, len), (len, len / 3), (len + 70, 0), (0, len)]
            {
                let allowed = SlotSet::from_slots(allowed_len, (0..allowed_len).filter(|_| draw(3) > 0));
                let removed = SlotSet::from_slots(removed_len, (0..removed_len).filter(|_| draw(4) == 0));
                let mask = SearchMask::new(&removed, len, Some(&allowed));
                let searched: Vec<usize> =
                    (0..len).filter(|&s| allowed.contains(s) && !removed.contains(s)).collect();
                let what = format!("len {len}, allowed over {allowed_len}, removed over {removed_len}");
                assert_eq!(mask.kept(len), searched, "{what}");
                assert_eq!(mask.live, searched.len(), "{what}");
                assert_eq!(mask.skip.words().len(), SlotSet::words_for(len), "{what}");
                for slot in 0..SlotSet::words_for(len) * 32 {
                    assert_eq!(mask.skip.contains(slot), !searched.contains(&slot), "{what}: slot {slot}");
                }
            }
        }
    }

    #[test]
    fn a_stamp_names_the_members_so_a_clone_keeps_it_and_every_change_gets_a_new_one() {
        let mut set = SlotSet::from_slots(100, [1, 5, 70]);
        let first = set.stamp();
        assert_ne!(first, 0);
        let copy = set.clone();
        assert_eq!(copy.stamp(), first, "a clone holds the same members");
        let mut stamps = vec![first];
        let changes: [&dyn Fn(&mut SlotSet); 5] = [
            &|s| {
                s.set(6, true);
            },
            &|s| {
                s.set(6, false);
            },
            &|s| s.clear_from(50),
            &|s| s.cover(400),
            &|s| s.reset(100),
        ];
        for change in changes {
            change(&mut set);
            assert!(!stamps.contains(&set.stamp()), "a change kept an earlier stamp");
            stamps.push(set.stamp());
        }
        let unchanged = set.stamp();
        assert!(!set.set(7, false), "not a member");
        assert_eq!(set.stamp(), unchanged, "no change, no new stamp");
        // Equality is of the members alone; equal sets built apart have their own stamps.
        let (a, b) = (SlotSet::from_slots(10, [2]), SlotSet::from_slots(10, [2]));
        assert_eq!(a, b);
        assert_ne!(a.stamp(), b.stamp());
        assert_ne!(SlotSet::default().stamp(), SlotSet::default().stamp());
    }

    #[test]
    fn words_read_from_a_file_may_not_name_a_slot_past_the_end() {
        let set = SlotSet::checked_from_words(vec![0b101, 1 << 3], 36).expect("slots 0, 2 and 35");
        assert_eq!((set.count(), set.iter().collect::<Vec<_>>()), (3, vec![0, 2, 35]));
        assert_eq!(SlotSet::checked_from_words(vec![0, 1 << 4], 36), Err(36));
        assert_eq!(SlotSet::checked_from_words(vec![0, 0, 1 << 7], 40), Err(71));
        assert_eq!(SlotSet::checked_from_words(vec![u32::MAX], 32).map(|s| s.count()), Ok(32));
    }

    use super::*;

    #[test]
    fn bits_counts_and_growth() {
        let mut t = SlotSet::default();
        assert!(!t.contains(5));
        assert!(!t.set(5, false), "clearing an uncovered slot changes nothing");
        assert!(t.set(40, true));
        assert!(!t.set(40, true));
        assert!(t.contains(40) && !t.contains(41));
        assert_eq!((t.count(), t.words().len()), (1, 2));
        assert_eq!(t.words()[1], 1 << 8);
        t.cover(100);
        assert_eq!(t.words().len(), 4);
        t.set(99, true);
        t.clear_from(41);
        assert_eq!(t.count(), 1);
        assert!(t.contains(40) && !t.contains(99));
        t.set(45, true);
        t.clear_from(40);
        assert_eq!(t.count(), 0);
        t.reset(10);
        assert_eq!((t.count(), t.words().len()), (0, 1));
    }

    #[test]
    fn set_algebra_matches_a_naive_model_at_every_length() {
        for len in [0usize, 1, 31, 32, 33, 64, 95, 200] {
            let a = SlotSet::from_slots(len, (0..len).filter(|s| s % 3 == 0));
            let b = SlotSet::from_slots(len, (0..len).filter(|s| s % 5 < 2));
            let naive = |set: &SlotSet| (0..len).filter(|&s| set.contains(s)).collect::<Vec<_>>();
            let and = a.and(&b);
            let or = a.or(&b);
            let not = a.complement(len);
            for s in 0..len {
                assert_eq!(and.contains(s), s % 3 == 0 && s % 5 < 2);
                assert_eq!(or.contains(s), s % 3 == 0 || s % 5 < 2);
                assert_eq!(not.contains(s), s % 3 != 0);
            }
            assert!(!not.contains(len), "the complement stays inside 0..len");
            let and_not = a.and_not(&b);
            for s in 0..len {
                assert_eq!(and_not.contains(s), s % 3 == 0 && s % 5 >= 2);
            }
            for set in [&a, &b, &and, &or, &not, &and_not] {
                assert_eq!(set.iter().collect::<Vec<_>>(), naive(set));
                assert_eq!(set.count(), naive(set).len());
            }
            assert_eq!(SlotSet::full(len).count(), len);
            assert_eq!(SlotSet::full(len).iter().count(), len);
        }
    }

    #[test]
    fn a_search_mask_skips_removed_and_filtered_out_slots_and_counts_the_rest() {
        let len = 70;
        let removed = SlotSet::from_slots(len, [1, 2, 40]);
        let plain = SearchMask::new(&removed, len, None);
        assert_eq!((plain.live, plain.filtered), (67, false));
        let allowed = SlotSet::from_slots(len, [0, 1, 5, 40, 69]);
        let mask = SearchMask::new(&removed, len, Some(&allowed));
        assert_eq!((mask.live, mask.filtered), (3, true));
        for s in 0..len {
            assert_eq!(!mask.skip.contains(s), [0, 5, 69].contains(&s), "slot {s}");
        }
        assert_eq!(mask.kept(len), vec![0, 5, 69]);
        assert_eq!(plain.kept(len).len(), 67);
        let none = SearchMask::new(&removed, len, Some(&SlotSet::default()));
        assert_eq!(none.live, 0);
        assert!(none.kept(len).is_empty());
    }
}
