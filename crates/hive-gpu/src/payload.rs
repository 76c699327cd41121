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

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use rayon::prelude::*;

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
pub(crate) struct FloatKey(pub(crate) f64);

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

/// The slots of every value of one field (each list ascending).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct FieldIndex {
    pub(crate) strings: HashMap<SmolStr, Vec<u32>, foldhash::fast::RandomState>,
    pub(crate) integers: BTreeMap<i64, Vec<u32>>,
    pub(crate) floats: BTreeMap<FloatKey, Vec<u32>>,
    /// The slots of `false`, then of `true`.
    pub(crate) bools: [Vec<u32>; 2],
}

/// The payload indexes of one collection: field name -> [`FieldIndex`].
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct PayloadIndex {
    fields: HashMap<SmolStr, FieldIndex, foldhash::fast::RandomState>,
}

/// Host bytes one indexed field value costs at most beyond its own text: its slot in a list
/// (4), and a share of a map node for a value seen once (a key and an empty list, about 48).
pub(crate) const INDEXED_VALUE_BYTES: usize = 56;

/// Slots one partial index covers when a whole index is built on every thread
/// ([`PayloadIndex::build`]).
const BUILD_CHUNK_SLOTS: usize = 1 << 16;

impl PayloadIndex {
    /// The index of `slots` slots, slot `s` carrying `fields(s)` (None for a removed slot), as
    /// [`PayloadIndex::insert`] in slot order would build it, on every thread: each range of
    /// slots is indexed on its own, then each field's partial indexes are joined in slot order,
    /// the fields side by side. An open indexed its payloads on one thread in slot order, the
    /// longest part of opening a collection with payloads (docs/PERFORMANCE.md, opening).
    pub(crate) fn build<'a>(
        slots: usize,
        fields: impl Fn(usize) -> Option<(&'a Metadata, &'a Payload)> + Sync,
    ) -> Self {
        Self::build_in_chunks(slots, BUILD_CHUNK_SLOTS, fields)
    }

    fn build_in_chunks<'a>(
        slots: usize,
        chunk: usize,
        fields: impl Fn(usize) -> Option<(&'a Metadata, &'a Payload)> + Sync,
    ) -> Self {
        // Each range's values, field by field: keywords and flags listed by value, numbers as
        // (value, slot) pairs (sorted once at the end instead of inserted into a map each).
        let mut parts: Vec<HashMap<SmolStr, FieldPart, foldhash::fast::RandomState>> = (0..slots
            .div_ceil(chunk))
            .into_par_iter()
            .map(|c| {
                let mut part: HashMap<SmolStr, FieldPart, foldhash::fast::RandomState> = HashMap::default();
                for slot in c * chunk..((c + 1) * chunk).min(slots) {
                    if let Some((metadata, payload)) = fields(slot) {
                        each_value(metadata, payload, |field, value| {
                            let part = match part.get_mut(field) {
                                Some(part) => part,
                                None => part.entry(SmolStr::new(field)).or_default(),
                            };
                            part.add(slot as u32, value);
                        });
                    }
                }
                part
            })
            .collect();
        let mut names: Vec<SmolStr> = parts.iter().flat_map(|p| p.keys().cloned()).collect();
        names.sort_unstable();
        names.dedup();
        // Each field's pieces in slot order (a range without the field has none).
        let pieces: Vec<(SmolStr, Vec<FieldPart>)> = names
            .into_iter()
            .map(|name| {
                let pieces = parts.iter_mut().filter_map(|p| p.remove(&name)).collect();
                (name, pieces)
            })
            .collect();
        let joined: Vec<(SmolStr, FieldIndex)> =
            pieces.into_par_iter().map(|(name, pieces)| (name, FieldIndex::join(pieces))).collect();
        PayloadIndex { fields: joined.into_iter().collect() }
    }

    /// Indexes the fields of the vector in `slot` (called in ascending slot order).
    pub(crate) fn insert(&mut self, slot: usize, metadata: &Metadata, payload: &Payload) {
        let slot = slot as u32;
        each_value(metadata, payload, |field, value| {
            let index = self.field(field);
            match value {
                Indexed::String(s) => index.strings.entry(SmolStr::new(s)).or_default().push(slot),
                Indexed::Integer(i) => index.integers.entry(i).or_default().push(slot),
                Indexed::Float(x) => index.floats.entry(x).or_default().push(slot),
                Indexed::Bool(b) => index.bools[usize::from(b)].push(slot),
            }
        });
    }

    fn field(&mut self, field: &str) -> &mut FieldIndex {
        self.fields.entry(SmolStr::new(field)).or_default()
    }

    /// Every field's index, in no particular order (a save sorts them).
    pub(crate) fn fields(&self) -> impl Iterator<Item = (&str, &FieldIndex)> {
        self.fields.iter().map(|(name, index)| (name.as_str(), index))
    }

    /// The index of these fields (a stored index, read back: `persist::payload_index`).
    pub(crate) fn from_fields(fields: impl IntoIterator<Item = (SmolStr, FieldIndex)>) -> Self {
        PayloadIndex { fields: fields.into_iter().collect() }
    }

    /// Renumbers every listed slot `s` to `new_of[s]`, on every thread. `new_of` must be
    /// increasing over the listed slots (an open dropping removed slots keeps the live ones in
    /// order), so every list stays ascending.
    pub(crate) fn renumber(&mut self, new_of: &[u32]) {
        let lists = self.fields.values_mut().flat_map(|f| {
            f.strings
                .values_mut()
                .chain(f.integers.values_mut())
                .chain(f.floats.values_mut())
                .chain(f.bools.iter_mut())
        });
        let lists: Vec<&mut Vec<u32>> = lists.collect();
        lists.into_par_iter().for_each(|list| list.iter_mut().for_each(|s| *s = new_of[*s as usize]));
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

/// The map value -> ascending slots of `(value, slot)` pairs: sorted by value and slot (on
/// every thread), then each value's run becomes one entry, and the map is built from its keys in
/// order in one pass.
fn sorted_map<K: Ord + Copy + Send>(mut pairs: Vec<(K, u32)>) -> BTreeMap<K, Vec<u32>> {
    pairs.par_sort_unstable();
    pairs.chunk_by(|a, b| a.0 == b.0).map(|run| (run[0].0, run.iter().map(|p| p.1).collect())).collect()
}

/// One indexed value of a vector: metadata values are keywords; a float is keyed by its value,
/// with -0.0 stored as 0.0.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Indexed<'a> {
    String(&'a str),
    Integer(i64),
    Float(FloatKey),
    Bool(bool),
}

/// Calls `f` with every field of a vector and its indexed value.
pub(crate) fn each_value(metadata: &Metadata, payload: &Payload, mut f: impl FnMut(&str, Indexed<'_>)) {
    for (field, value) in metadata {
        f(field, Indexed::String(value));
    }
    for (field, value) in payload {
        let value = match value {
            PayloadValue::String(s) => Indexed::String(s),
            PayloadValue::Integer(i) => Indexed::Integer(*i),
            PayloadValue::Float(x) => Indexed::Float(FloatKey(*x + 0.0)),
            PayloadValue::Bool(b) => Indexed::Bool(*b),
        };
        f(field, value);
    }
}

/// One range of slots' values of one field, as [`PayloadIndex::build`] collects them.
#[derive(Default)]
struct FieldPart {
    strings: HashMap<SmolStr, Vec<u32>, foldhash::fast::RandomState>,
    integers: Vec<(i64, u32)>,
    floats: Vec<(FloatKey, u32)>,
    bools: [Vec<u32>; 2],
}

impl FieldPart {
    fn add(&mut self, slot: u32, value: Indexed<'_>) {
        match value {
            Indexed::String(s) => match self.strings.get_mut(s) {
                Some(slots) => slots.push(slot),
                None => {
                    self.strings.insert(SmolStr::new(s), vec![slot]);
                }
            },
            Indexed::Integer(i) => self.integers.push((i, slot)),
            Indexed::Float(x) => self.floats.push((x, slot)),
            Indexed::Bool(b) => self.bools[usize::from(b)].push(slot),
        }
    }
}

fn add(set: &mut SlotSet, slots: &[u32]) {
    for &slot in slots {
        set.set(slot as usize, true);
    }
}

impl FieldIndex {
    /// The index of consecutive slot ranges, from the values of each (in slot order): every
    /// value's slots are its pieces' slots one after another, so they stay ascending.
    fn join(pieces: Vec<FieldPart>) -> FieldIndex {
        let mut strings: HashMap<SmolStr, Vec<u32>, _> =
            HashMap::with_hasher(foldhash::fast::RandomState::default());
        // At least as many values as the largest piece has: most of the growth, reserved once.
        strings.reserve(pieces.iter().map(|p| p.strings.len()).max().unwrap_or(0));
        let mut integers = Vec::with_capacity(pieces.iter().map(|p| p.integers.len()).sum());
        let mut floats = Vec::with_capacity(pieces.iter().map(|p| p.floats.len()).sum());
        let mut bools: [Vec<u32>; 2] = Default::default();
        for piece in pieces {
            for (value, slots) in piece.strings {
                match strings.entry(value) {
                    MapEntry::Occupied(mut listed) => listed.get_mut().extend(slots),
                    MapEntry::Vacant(new) => {
                        new.insert(slots);
                    }
                }
            }
            integers.extend(piece.integers);
            floats.extend(piece.floats);
            for (all, some) in bools.iter_mut().zip(piece.bools) {
                all.extend(some);
            }
        }
        FieldIndex { strings, integers: sorted_map(integers), floats: sorted_map(floats), bools }
    }

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
    fn an_index_built_in_ranges_on_every_thread_equals_one_built_slot_by_slot() {
        // Ranges of 7 slots: values that recur across ranges (their slot lists are joined),
        // values seen once, fields some ranges lack, removed slots, ints and floats of one value.
        let slots = 100;
        let vectors: Vec<Option<(Metadata, Payload)>> = (0..slots)
            .map(|s: usize| {
                if s % 11 == 5 {
                    return None;
                }
                let mut metadata = Metadata::new();
                if s.is_multiple_of(3) {
                    metadata.insert("tag".into(), format!("t{}", s % 4));
                }
                let mut payload = Payload::new();
                payload.insert("n".into(), PayloadValue::Integer((s % 9) as i64));
                payload.insert("unique".into(), PayloadValue::Float(s as f64 * 0.5));
                if s > 40 {
                    payload.insert("late".into(), PayloadValue::Bool(s.is_multiple_of(2)));
                }
                if s.is_multiple_of(5) {
                    payload.insert("mixed".into(), PayloadValue::Float((s % 3) as f64));
                } else {
                    payload.insert("mixed".into(), PayloadValue::Integer((s % 3) as i64));
                }
                if s % 7 == 1 {
                    payload.insert("word".into(), PayloadValue::String(format!("w{}", s % 2)));
                }
                Some((metadata, payload))
            })
            .collect();
        let mut one_by_one = PayloadIndex::default();
        for (slot, v) in vectors.iter().enumerate() {
            if let Some((m, p)) = v {
                one_by_one.insert(slot, m, p);
            }
        }
        let fields = |s: usize| vectors[s].as_ref().map(|(m, p)| (m, p));
        for chunk in [1, 7, 64, 100, 1000] {
            assert_eq!(PayloadIndex::build_in_chunks(slots, chunk, fields), one_by_one, "ranges of {chunk}");
        }
        assert_eq!(PayloadIndex::build(slots, fields), one_by_one);
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
