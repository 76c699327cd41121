//! Typed payload fields and the indexes that turn a predicate over them into slots.
//!
//! A vector carries string metadata (`GpuVector::metadata`, today's string map) and typed
//! fields (`GpuVector::payload`). Both are indexed as they are stored, so a filter never reads
//! every vector's payload:
//! - strings and booleans: an inverted index, value -> slots;
//! - integers and floats: sorted maps, value -> slots, so a range is one ordered walk.
//!
//! Slots go in ascending (they are appended in order), so every slot list is sorted. A removed
//! slot stays listed until the collection compacts (then the index is rebuilt): filters are
//! intersected with the live rows anyway.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use smol_str::SmolStr;

use crate::error::{HiveGpuError, Result};
use crate::slots::SlotSet;
use crate::types::Metadata;

/// One typed payload value.
#[derive(Debug, Clone, PartialEq)]
pub enum PayloadValue {
    /// A keyword: matched by equality and set membership.
    String(String),
    /// A whole number: equality, membership and ranges (compared exactly with floats).
    Integer(i64),
    /// A finite number (NaN and infinities are refused when stored): equality, membership and
    /// ranges.
    Float(f64),
    /// A flag: equality.
    Bool(bool),
}

impl From<&str> for PayloadValue {
    fn from(value: &str) -> Self {
        Self::String(value.to_string())
    }
}
impl From<String> for PayloadValue {
    fn from(value: String) -> Self {
        Self::String(value)
    }
}
impl From<i64> for PayloadValue {
    fn from(value: i64) -> Self {
        Self::Integer(value)
    }
}
impl From<i32> for PayloadValue {
    fn from(value: i32) -> Self {
        Self::Integer(value.into())
    }
}
impl From<f64> for PayloadValue {
    fn from(value: f64) -> Self {
        Self::Float(value)
    }
}
impl From<bool> for PayloadValue {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

/// Typed fields stored with a vector (beside its string [`Metadata`]).
pub type Payload = HashMap<String, PayloadValue>;

/// Checks a vector's payload before anything is stored: finite floats, and no field named both
/// in its metadata and in its typed payload (a filter on it would be ambiguous).
pub(crate) fn check_payload(id: &str, metadata: &Metadata, payload: &Payload) -> Result<()> {
    for (field, value) in payload {
        if let PayloadValue::Float(x) = value
            && !x.is_finite()
        {
            return Err(HiveGpuError::InvalidArgument(format!(
                "vector {id:?}: payload field {field:?} is {x}; float fields must be finite"
            )));
        }
        if metadata.contains_key(field) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "vector {id:?}: field {field:?} is in both its metadata and its payload; name it once"
            )));
        }
    }
    Ok(())
}

/// An f64 ordered by value (finite values only are stored; -0.0 is stored as 0.0).
#[derive(Debug, Clone, Copy)]
struct FloatKey(f64);

impl PartialEq for FloatKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for FloatKey {}
impl PartialOrd for FloatKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for FloatKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The slots of every value of one field.
#[derive(Debug, Default, Clone)]
struct FieldIndex {
    strings: HashMap<SmolStr, Vec<u32>, foldhash::fast::RandomState>,
    integers: BTreeMap<i64, Vec<u32>>,
    floats: BTreeMap<FloatKey, Vec<u32>>,
    bools: [Vec<u32>; 2],
}

/// The payload indexes of one collection: field name -> [`FieldIndex`].
#[derive(Debug, Default, Clone)]
pub(crate) struct PayloadIndex {
    fields: HashMap<SmolStr, FieldIndex, foldhash::fast::RandomState>,
}

/// Host bytes one indexed field value costs at most beyond its own text: its slot in a list
/// (4), and a share of a map node for a value seen once (a key and an empty list, about 48).
pub(crate) const INDEXED_VALUE_BYTES: usize = 56;

impl PayloadIndex {
    /// Indexes the fields of the vector in `slot` (called in ascending slot order).
    pub(crate) fn insert(&mut self, slot: usize, metadata: &Metadata, payload: &Payload) {
        let slot = slot as u32;
        for (field, value) in metadata {
            let index = self.field(field);
            index.strings.entry(SmolStr::new(value)).or_default().push(slot);
        }
        for (field, value) in payload {
            let index = self.field(field);
            match value {
                PayloadValue::String(s) => index.strings.entry(SmolStr::new(s)).or_default().push(slot),
                PayloadValue::Integer(i) => index.integers.entry(*i).or_default().push(slot),
                PayloadValue::Float(x) => index.floats.entry(FloatKey(*x + 0.0)).or_default().push(slot),
                PayloadValue::Bool(b) => index.bools[usize::from(*b)].push(slot),
            }
        }
    }

    fn field(&mut self, field: &str) -> &mut FieldIndex {
        self.fields.entry(SmolStr::new(field)).or_default()
    }

    /// The slots whose `field` equals `value` (integers and floats compare by value), out of
    /// `len` slots.
    pub(crate) fn equal(&self, len: usize, field: &str, value: &PayloadValue) -> SlotSet {
        let mut set = SlotSet::empty(len);
        if let Some(index) = self.fields.get(field) {
            index.equal(value, &mut |slots| add(&mut set, slots));
        }
        set
    }

    /// The slots whose numeric `field` lies within the bounds, out of `len` slots.
    pub(crate) fn range(&self, len: usize, field: &str, low: Bound<f64>, high: Bound<f64>) -> SlotSet {
        let mut set = SlotSet::empty(len);
        if let Some(index) = self.fields.get(field) {
            index.range(low, high, &mut |slots| add(&mut set, slots));
        }
        set
    }

    /// The slots that have `field` at all, out of `len` slots.
    pub(crate) fn has(&self, len: usize, field: &str) -> SlotSet {
        let mut set = SlotSet::empty(len);
        if let Some(index) = self.fields.get(field) {
            index.strings.values().for_each(|s| add(&mut set, s));
            index.integers.values().for_each(|s| add(&mut set, s));
            index.floats.values().for_each(|s| add(&mut set, s));
            index.bools.iter().for_each(|s| add(&mut set, s));
        }
        set
    }
}

fn add(set: &mut SlotSet, slots: &[u32]) {
    for &slot in slots {
        set.set(slot as usize, true);
    }
}

impl FieldIndex {
    /// Integers and floats are equal when their values are: 3 matches 3.0, and an integer
    /// that no f64 represents exactly (beyond 2^53) matches no float.
    fn equal(&self, value: &PayloadValue, out: &mut dyn FnMut(&[u32])) {
        let mut emit = |slots: Option<&Vec<u32>>| {
            if let Some(slots) = slots {
                out(slots);
            }
        };
        match value {
            PayloadValue::String(s) => emit(self.strings.get(s.as_str())),
            PayloadValue::Bool(b) => emit(Some(&self.bools[usize::from(*b)])),
            PayloadValue::Integer(i) => {
                emit(self.integers.get(i));
                let x = *i as f64;
                if x < TWO_63 && x as i64 == *i {
                    emit(self.floats.get(&FloatKey(x + 0.0)));
                }
            }
            PayloadValue::Float(x) => {
                emit(self.floats.get(&FloatKey(*x + 0.0)));
                if x.fract() == 0.0 && (-TWO_63..TWO_63).contains(x) {
                    emit(self.integers.get(&(*x as i64)));
                }
            }
        }
    }

    /// Every slot whose number lies within the bounds (integers compared exactly: a bound that
    /// is not a whole number is rounded inward, never through f64 arithmetic on the value).
    fn range(&self, low: Bound<f64>, high: Bound<f64>, out: &mut dyn FnMut(&[u32])) {
        let nan = |b: &Bound<f64>| matches!(b, Bound::Included(x) | Bound::Excluded(x) if x.is_nan());
        if nan(&low) || nan(&high) {
            return;
        }
        let float_bound = |b: Bound<f64>| match b {
            Bound::Included(x) => Bound::Included(FloatKey(x + 0.0)),
            Bound::Excluded(x) => Bound::Excluded(FloatKey(x + 0.0)),
            Bound::Unbounded => Bound::Unbounded,
        };
        if bounds_ordered(low, high) {
            for slots in self.floats.range((float_bound(low), float_bound(high))).map(|(_, s)| s) {
                out(slots);
            }
        }
        if let (Some(lo), Some(hi)) = (integer_low(low), integer_high(high))
            && lo <= hi
        {
            for slots in self.integers.range(lo..=hi).map(|(_, s)| s) {
                out(slots);
            }
        }
    }
}

/// Whether a `BTreeMap::range` over these bounds is valid (it panics when start > end, or
/// when both are equal and excluded).
fn bounds_ordered(low: Bound<f64>, high: Bound<f64>) -> bool {
    match (low, high) {
        (Bound::Unbounded, _) | (_, Bound::Unbounded) => true,
        (Bound::Included(a), Bound::Included(b)) => a <= b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => a < b,
    }
}

/// 2^63 as an f64: the first value past i64::MAX.
const TWO_63: f64 = 9_223_372_036_854_775_808.0;

/// The smallest integer within a lower bound (None: no integer is).
fn integer_low(bound: Bound<f64>) -> Option<i64> {
    let (x, excluded) = match bound {
        Bound::Unbounded => return Some(i64::MIN),
        Bound::Included(x) => (x, false),
        Bound::Excluded(x) => (x, true),
    };
    if x < -TWO_63 {
        return Some(i64::MIN);
    }
    if x >= TWO_63 {
        return None;
    }
    // x is in [-2^63, 2^63): its ceiling is an i64 (exact: floats this large are integers).
    let c = x.ceil() as i64;
    if excluded && c as f64 == x { c.checked_add(1) } else { Some(c) }
}

/// The largest integer within an upper bound (None: no integer is).
fn integer_high(bound: Bound<f64>) -> Option<i64> {
    let (x, excluded) = match bound {
        Bound::Unbounded => return Some(i64::MAX),
        Bound::Included(x) => (x, false),
        Bound::Excluded(x) => (x, true),
    };
    if x >= TWO_63 {
        return Some(i64::MAX);
    }
    if x < -TWO_63 {
        return None;
    }
    let f = x.floor() as i64;
    if excluded && f as f64 == x { f.checked_sub(1) } else { Some(f) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_bounds_round_inward_and_never_overflow() {
        assert_eq!(integer_low(Bound::Included(2.5)), Some(3));
        assert_eq!(integer_low(Bound::Excluded(3.0)), Some(4));
        assert_eq!(integer_low(Bound::Included(-2.5)), Some(-2));
        assert_eq!(integer_high(Bound::Included(2.5)), Some(2));
        assert_eq!(integer_high(Bound::Excluded(3.0)), Some(2));
        assert_eq!(integer_low(Bound::Included(1e300)), None);
        assert_eq!(integer_high(Bound::Included(-1e300)), None);
        assert_eq!(integer_low(Bound::Included(-1e300)), Some(i64::MIN));
        assert_eq!(integer_high(Bound::Included(1e300)), Some(i64::MAX));
        assert_eq!(integer_high(Bound::Excluded(-TWO_63)), None);
    }

    #[test]
    fn ranges_that_are_empty_or_reversed_match_nothing_instead_of_panicking() {
        let mut index = PayloadIndex::default();
        let payload: Payload = [("x".to_string(), PayloadValue::Float(1.0))].into();
        index.insert(0, &Metadata::new(), &payload);
        assert_eq!(index.range(1, "x", Bound::Excluded(1.0), Bound::Excluded(1.0)).count(), 0);
        assert_eq!(index.range(1, "x", Bound::Included(2.0), Bound::Included(0.0)).count(), 0);
        assert_eq!(index.range(1, "x", Bound::Included(f64::NAN), Bound::Unbounded).count(), 0);
        assert_eq!(index.range(1, "x", Bound::Included(1.0), Bound::Included(1.0)).count(), 1);
    }

    #[test]
    fn large_integers_match_exactly_not_through_their_nearest_float() {
        let mut index = PayloadIndex::default();
        let big = (1i64 << 53) + 1;
        for (slot, v) in [big, big - 1, i64::MAX, i64::MIN].into_iter().enumerate() {
            index.insert(slot, &Metadata::new(), &[("n".to_string(), PayloadValue::Integer(v))].into());
        }
        let eq = |v: i64| index.equal(4, "n", &PayloadValue::Integer(v)).iter().collect::<Vec<_>>();
        assert_eq!(eq(big), vec![0]);
        assert_eq!(eq(big - 1), vec![1]);
        assert_eq!(eq(i64::MAX), vec![2]);
        assert_eq!(eq(i64::MIN), vec![3]);
    }
}
