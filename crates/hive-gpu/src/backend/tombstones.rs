//! The removed-row bitmap every backend keeps: one bit per slot with a count, in u32 words so a
//! GPU backend uploads the words as they are.

/// One bit per slot (set = removed) and how many are set.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tombstones {
    words: Vec<u32>,
    count: usize,
}

impl Tombstones {
    /// Words for `slots` slots.
    pub(crate) fn words_for(slots: usize) -> usize {
        slots.div_ceil(32)
    }

    /// Whether `slot` is removed (slots past the bitmap are live).
    pub(crate) fn is_set(&self, slot: usize) -> bool {
        self.count > 0 && self.words.get(slot / 32).is_some_and(|w| (w >> (slot % 32)) & 1 != 0)
    }

    /// Marks `slot` removed or live; returns whether that changed anything. The bitmap grows to
    /// cover `slot`.
    pub(crate) fn set(&mut self, slot: usize, removed: bool) -> bool {
        if slot / 32 >= self.words.len() {
            if !removed {
                return false;
            }
            self.words.resize(slot / 32 + 1, 0);
        }
        let bit = 1u32 << (slot % 32);
        let word = &mut self.words[slot / 32];
        if (*word & bit != 0) == removed {
            return false;
        }
        *word ^= bit;
        if removed {
            self.count += 1;
        } else {
            self.count -= 1;
        }
        true
    }

    /// Covers at least `slots` slots (new ones live).
    pub(crate) fn cover(&mut self, slots: usize) {
        let words = Self::words_for(slots);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
    }

    /// Reserves room to cover `slots` slots without reallocating.
    pub(crate) fn try_reserve(
        &mut self,
        slots: usize,
    ) -> std::result::Result<(), std::collections::TryReserveError> {
        self.words.try_reserve(Self::words_for(slots).saturating_sub(self.words.len()))
    }

    /// Marks every slot from `slot` on live (a rollback's truncation).
    pub(crate) fn clear_from(&mut self, slot: usize) {
        let end = self.words.len() * 32;
        for s in slot..end {
            self.set(s, false);
        }
    }

    /// Everything live, covering `slots` slots.
    pub(crate) fn reset(&mut self, slots: usize) {
        self.words = vec![0; Self::words_for(slots)];
        self.count = 0;
    }

    /// Removed slots.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// The words (bit `s % 32` of word `s / 32` is slot `s`).
    // Only the wgpu backend calls this (directly, or through CpuRows).
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    pub(crate) fn words(&self) -> &[u32] {
        &self.words
    }

    /// Heap bytes held.
    pub(crate) fn capacity_bytes(&self) -> usize {
        self.words.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_counts_and_growth() {
        let mut t = Tombstones::default();
        assert!(!t.is_set(5));
        assert!(!t.set(5, false), "clearing an uncovered slot changes nothing");
        assert!(t.set(40, true));
        assert!(!t.set(40, true));
        assert!(t.is_set(40) && !t.is_set(41));
        assert_eq!((t.count(), t.words().len()), (1, 2));
        assert_eq!(t.words()[1], 1 << 8);
        t.cover(100);
        assert_eq!(t.words().len(), 4);
        t.set(99, true);
        t.clear_from(41);
        assert_eq!(t.count(), 1);
        assert!(t.is_set(40) && !t.is_set(99));
        t.reset(10);
        assert_eq!((t.count(), t.words().len()), (0, 1));
    }
}
