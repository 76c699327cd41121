//! The payload index section (kind 9, format version 4; `docs/FORMAT.md`): the inverted and
//! sorted indexes that turn filters into slot sets ([`PayloadIndex`]), saved so that an open
//! takes them as written instead of building them again.
//!
//! A stored index is a second copy of what the payload and metadata records say, so a reader
//! trusts it no more than any other part of the file: [`decode`] checks that it lists exactly
//! the records' (field, value, slot) triples of the live slots, each once. The proof is in two
//! parts, both linear in the entries with no sort and no map built:
//! 1. every listed slot is in range, live, ascending within its list (so no slot twice under
//!    one value), and its record has this field with this value and type; a record has one
//!    value per field, so no slot is listed under two values of one field either: the listed
//!    entries are distinct (slot, field) pairs of the records;
//! 2. their number equals the records' (slot, field) pairs of the live slots, so none is
//!    missing.

use rayon::prelude::*;
use smol_str::SmolStr;

use super::format::{Cursor, Parsed, Section, fail};
use crate::payload::{FieldIndex, FloatKey, Payload, PayloadIndex, PayloadValue};
use crate::slots::SlotSet;
use crate::types::Metadata;

/// The part name errors give.
const PART: &str = "payload index";

/// The section body of `index` over a collection of `removed` slots, with its field count (the
/// table's count), or None when no live slot has a field (then the file has no such section and
/// keeps the older format version). Removed slots are left out (the in-memory index keeps them
/// until a compaction); fields, and within a field the strings, go in byte order and the
/// numbers in value order, so identical collections give identical bytes.
///
/// Per field: u32 name length and bytes; u32 string values, each a u32 length, its bytes, a
/// u32 slot count (at least 1) and the slots (u32, ascending); u32 integer values, each an i64,
/// the count and slots; u32 float values, each the f64 bits (finite, never -0.0), the count and
/// slots; then the count and slots of `false` and of `true` (either may be 0).
pub(crate) fn encode(index: &PayloadIndex, removed: &SlotSet) -> Option<(Vec<u8>, usize)> {
    let live = |list: &[u32]| -> Vec<u32> {
        list.iter().copied().filter(|&s| !removed.contains(s as usize)).collect()
    };
    let mut fields: Vec<(&str, &FieldIndex)> = index.fields().collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut out = Vec::new();
    let mut count = 0;
    for (name, field) in fields {
        let mut strings: Vec<(&str, Vec<u32>)> =
            field.strings.iter().map(|(v, l)| (v.as_str(), live(l))).filter(|(_, l)| !l.is_empty()).collect();
        strings.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let integers: Vec<(i64, Vec<u32>)> =
            field.integers.iter().map(|(v, l)| (*v, live(l))).filter(|(_, l)| !l.is_empty()).collect();
        let floats: Vec<(f64, Vec<u32>)> =
            field.floats.iter().map(|(v, l)| (v.0, live(l))).filter(|(_, l)| !l.is_empty()).collect();
        let bools = [live(&field.bools[0]), live(&field.bools[1])];
        if strings.is_empty() && integers.is_empty() && floats.is_empty() && bools.iter().all(Vec::is_empty) {
            continue;
        }
        count += 1;
        put_text(&mut out, name);
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        for (value, slots) in &strings {
            put_text(&mut out, value);
            put_slots(&mut out, slots);
        }
        out.extend_from_slice(&(integers.len() as u32).to_le_bytes());
        for (value, slots) in &integers {
            out.extend_from_slice(&value.to_le_bytes());
            put_slots(&mut out, slots);
        }
        out.extend_from_slice(&(floats.len() as u32).to_le_bytes());
        for (value, slots) in &floats {
            out.extend_from_slice(&value.to_bits().to_le_bytes());
            put_slots(&mut out, slots);
        }
        for slots in &bools {
            put_slots(&mut out, slots);
        }
    }
    (count > 0).then_some((out, count))
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn put_slots(out: &mut Vec<u8>, slots: &[u32]) {
    out.extend_from_slice(&(slots.len() as u32).to_le_bytes());
    for slot in slots {
        out.extend_from_slice(&slot.to_le_bytes());
    }
}

/// One listed value of one field, as the section holds it.
#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    String(&'a str),
    Integer(i64),
    Float(f64),
    Bool(bool),
}

impl Value<'_> {
    /// Whether the record of a slot gives `field` this value, of this type.
    fn in_record(self, field: &str, metadata: &Metadata, payload: &Payload) -> bool {
        match (self, payload.get(field)) {
            (Value::String(v), None) => metadata.get(field).is_some_and(|m| m == v),
            (Value::String(v), Some(PayloadValue::String(p))) => p == v,
            (Value::Integer(v), Some(PayloadValue::Integer(p))) => *p == v,
            // The index keys -0.0 as 0.0 (`FloatKey`), so the record's value is normalised the
            // same way; compared bit for bit (a NaN record matches nothing).
            (Value::Float(v), Some(PayloadValue::Float(p))) => (p + 0.0).to_bits() == v.to_bits(),
            (Value::Bool(v), Some(PayloadValue::Bool(p))) => *p == v,
            _ => false,
        }
    }
}

/// One value's run of slots: its field (an index into the names), value, raw slots and where
/// the run starts in the file.
struct Run<'a> {
    field: usize,
    value: Value<'a>,
    slots: &'a [u8],
    offset: u64,
}

/// Reads a payload index section (`section`, the table's entry; `c`, its body) of a file of
/// `slots` slots, checking it against the file's records as the module documentation says;
/// the first error in the section's order is the one returned.
pub(crate) fn decode(
    section: Section,
    c: &mut Cursor<'_>,
    slots: usize,
    removed: &SlotSet,
    metadata: &[Metadata],
    payloads: &[Payload],
) -> Parsed<PayloadIndex> {
    // Walk the section (no allocation beyond what its bytes can hold: every run takes at least
    // 12 bytes, every field name 4).
    let mut names: Vec<&str> = Vec::new();
    let mut runs: Vec<Run<'_>> = Vec::new();
    let fields = usize::try_from(section.count).unwrap_or(usize::MAX);
    if fields.saturating_mul(4 * 5) > c.remaining() {
        return fail(PART, section.offset, format!("{fields} fields cannot fit in {} bytes", c.remaining()));
    }
    for _ in 0..fields {
        let at = c.offset();
        let name = c.text("a field name")?;
        if names.last().is_some_and(|last| *last >= name) {
            return fail(PART, at, format!("field {name:?} is out of order or listed twice"));
        }
        let field = names.len();
        names.push(name);
        let first_run = runs.len();
        let count = c.count("a field's string values", 12)?;
        let mut last: Option<&str> = None;
        for _ in 0..count {
            let at = c.offset();
            let value = c.text("a string value")?;
            if last.is_some_and(|l| l >= value) {
                return fail(
                    PART,
                    at,
                    format!("field {name:?}: string {value:?} is out of order or listed twice"),
                );
            }
            last = Some(value);
            runs.push(Run { field, value: Value::String(value), slots: listed(c, false)?, offset: at });
        }
        let count = c.count("a field's integer values", 16)?;
        let mut last: Option<i64> = None;
        for _ in 0..count {
            let at = c.offset();
            let value = c.u64("an integer value")? as i64;
            if last.is_some_and(|l| l >= value) {
                return fail(
                    PART,
                    at,
                    format!("field {name:?}: integer {value} is out of order or listed twice"),
                );
            }
            last = Some(value);
            runs.push(Run { field, value: Value::Integer(value), slots: listed(c, false)?, offset: at });
        }
        let count = c.count("a field's float values", 16)?;
        let mut last: Option<f64> = None;
        for _ in 0..count {
            let at = c.offset();
            let value = f64::from_bits(c.u64("a float value")?);
            if !value.is_finite() || value.to_bits() == (-0.0f64).to_bits() {
                return fail(
                    PART,
                    at,
                    format!("field {name:?}: float {value} is not a finite value as indexed"),
                );
            }
            if last.is_some_and(|l| l >= value) {
                return fail(
                    PART,
                    at,
                    format!("field {name:?}: float {value} is out of order or listed twice"),
                );
            }
            last = Some(value);
            runs.push(Run { field, value: Value::Float(value), slots: listed(c, false)?, offset: at });
        }
        for flag in [false, true] {
            let at = c.offset();
            let slots = listed(c, true)?;
            if !slots.is_empty() {
                runs.push(Run { field, value: Value::Bool(flag), slots, offset: at });
            }
        }
        if runs.len() == first_run {
            return fail(PART, at, format!("field {name:?} lists no slot"));
        }
    }
    c.finish()?;

    // Part 1 of the proof, run by run on every thread; the first failing run in order wins.
    let checked: Vec<Parsed<Vec<u32>>> = runs
        .par_iter()
        .map(|run| {
            let name = names[run.field];
            let mut out = Vec::with_capacity(run.slots.len() / 4);
            for (i, b) in run.slots.chunks_exact(4).enumerate() {
                let slot = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let at = run.offset;
                let s = slot as usize;
                if out.last().is_some_and(|&last| last >= slot) {
                    return fail(
                        PART,
                        at,
                        format!("field {name:?}: slot {slot} (entry {i}) is not ascending"),
                    );
                }
                if s >= slots || removed.contains(s) {
                    return fail(
                        PART,
                        at,
                        format!("field {name:?} lists slot {slot}, which holds no live vector"),
                    );
                }
                if !run.value.in_record(name, &metadata[s], &payloads[s]) {
                    return fail(
                        PART,
                        at,
                        format!(
                            "field {name:?} lists slot {slot} under {:?}, which its record does not hold",
                            run.value
                        ),
                    );
                }
                out.push(slot);
            }
            Ok(out)
        })
        .collect();
    let mut lists = Vec::with_capacity(checked.len());
    for list in checked {
        lists.push(list?);
    }
    // Part 2: as many entries as the live records have (field, value) pairs.
    let listed: usize = lists.iter().map(Vec::len).sum();
    let held: usize = (0..slots)
        .into_par_iter()
        .with_min_len(4096)
        .filter(|&s| !removed.contains(s))
        .map(|s| metadata[s].len() + payloads[s].len())
        .sum();
    if listed != held {
        return fail(
            PART,
            section.offset,
            format!("the index lists {listed} field values where the live records hold {held}"),
        );
    }

    let mut indexes: Vec<FieldIndex> = vec![FieldIndex::default(); names.len()];
    for (run, list) in runs.iter().zip(lists) {
        let index = &mut indexes[run.field];
        match run.value {
            Value::String(v) => {
                index.strings.insert(SmolStr::new(v), list);
            }
            Value::Integer(v) => {
                index.integers.insert(v, list);
            }
            Value::Float(v) => {
                index.floats.insert(FloatKey(v), list);
            }
            Value::Bool(v) => index.bools[usize::from(v)] = list,
        }
    }
    Ok(PayloadIndex::from_fields(names.into_iter().map(SmolStr::new).zip(indexes)))
}

/// One slot list's raw slots (a u32 count, then the slots), at least one unless `may_be_empty`.
fn listed<'a>(c: &mut Cursor<'a>, may_be_empty: bool) -> Parsed<&'a [u8]> {
    let at = c.offset();
    let count = c.count("a slot list", 4)?;
    if count == 0 && !may_be_empty {
        return fail(PART, at, "a value lists no slot");
    }
    c.take(count * 4, "a slot list")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::format::{Kind, Section};

    fn section(count: usize, bytes: &[u8]) -> Section {
        Section {
            kind: Kind::PayloadIndex,
            version: 1,
            offset: 0,
            length: bytes.len() as u64,
            count: count as u64,
            crc: 0,
        }
    }

    /// Records of `slots` slots with strings, integers, floats (one of them -0.0), bools,
    /// metadata keywords, fields some slots lack, and `removed` slots whose records are empty.
    fn records(slots: usize, removed: &SlotSet) -> (Vec<Metadata>, Vec<Payload>) {
        (0..slots)
            .map(|s| {
                let mut metadata = Metadata::new();
                let mut payload = Payload::new();
                if removed.contains(s) {
                    return (metadata, payload);
                }
                if s % 3 == 0 {
                    metadata.insert("tag".into(), format!("t{}", s % 4));
                }
                payload.insert("n".into(), PayloadValue::Integer(s as i64 % 5 - 2));
                payload.insert(
                    "x".into(),
                    PayloadValue::Float(if s == 4 { -0.0 } else { (s % 7) as f64 * 0.5 }),
                );
                if s % 2 == 1 {
                    payload.insert("flag".into(), PayloadValue::Bool(s % 4 == 1));
                    payload.insert("word".into(), PayloadValue::String(format!("w{}", s % 3)));
                }
                (metadata, payload)
            })
            .unzip()
    }

    fn built(metadata: &[Metadata], payloads: &[Payload], removed: &SlotSet) -> PayloadIndex {
        PayloadIndex::build(metadata.len(), |s| (!removed.contains(s)).then(|| (&metadata[s], &payloads[s])))
    }

    fn read(
        bytes: &[u8],
        count: usize,
        removed: &SlotSet,
        m: &[Metadata],
        p: &[Payload],
    ) -> Parsed<PayloadIndex> {
        let mut c = Cursor::new(PART, bytes, 0);
        decode(section(count, bytes), &mut c, m.len(), removed, m, p)
    }

    #[test]
    fn a_stored_index_reads_back_as_the_index_its_records_build() {
        let slots = 40;
        let mut removed = SlotSet::empty(slots);
        for s in [2, 9, 17, 39] {
            removed.set(s, true);
        }
        let (m, p) = records(slots, &removed);
        let index = built(&m, &p, &removed);
        let (bytes, count) = encode(&index, &removed).expect("fields");
        assert_eq!(count, 5);
        assert_eq!(read(&bytes, count, &removed, &m, &p).unwrap(), index);
        // An index still listing removed slots (before a compaction) is stored without them.
        let stale = built(&m, &p, &SlotSet::empty(slots));
        assert_eq!(encode(&stale, &removed).expect("fields").0, bytes);
        // No fields: no section.
        let empty = vec![Metadata::new(); 3];
        let none = vec![Payload::new(); 3];
        assert!(encode(&built(&empty, &none, &SlotSet::empty(3)), &SlotSet::empty(3)).is_none());
    }

    #[test]
    fn an_index_that_disagrees_with_its_records_in_any_way_is_refused_naming_the_field() {
        let slots = 24;
        let removed = {
            let mut r = SlotSet::empty(slots);
            r.set(5, true);
            r
        };
        let (m, p) = records(slots, &removed);
        let (good, count) = encode(&built(&m, &p, &removed), &removed).unwrap();
        assert!(read(&good, count, &removed, &m, &p).is_ok());
        // A record changed under the index: a value the index lists elsewhere, a value it does
        // not list at all, a field the index lacks, a field it lists that the record dropped.
        type Change = fn(&mut Metadata, &mut Payload);
        let changes: [(&str, Change); 5] = [
            ("n", |_, p| {
                p.insert("n".into(), PayloadValue::Integer(1));
            }),
            ("x", |_, p| {
                p.insert("x".into(), PayloadValue::Float(1e9));
            }),
            ("tag", |m, _| {
                m.insert("tag".into(), "t0".into());
            }),
            ("n", |_, p| {
                p.remove("n");
            }),
            ("x", |_, p| {
                p.insert("x".into(), PayloadValue::Integer(0));
            }),
        ];
        for (field, change) in changes {
            let (mut m2, mut p2) = (m.clone(), p.clone());
            change(&mut m2[7], &mut p2[7]);
            let error = read(&good, count, &removed, &m2, &p2).expect_err(field).to_string();
            assert!(error.contains("payload index"), "{error}");
        }
        // A slot removed after the index was written; the index read against fewer slots.
        let mut more_removed = removed.clone();
        more_removed.set(8, true);
        assert!(read(&good, count, &more_removed, &m, &p).is_err());
        // Every cut of the section and every single-byte change fails with an error, never a
        // panic (checksums aside, which the file's reader checks first).
        for cut in 0..good.len() {
            assert!(read(&good[..cut], count, &removed, &m, &p).is_err(), "cut at {cut}");
        }
        for at in 0..good.len() {
            for flip in [1u8, 0x80] {
                let mut bad = good.clone();
                bad[at] ^= flip;
                if let Ok(index) = read(&bad, count, &removed, &m, &p) {
                    // Only a change the records agree with can pass: it reads as the same index.
                    assert_eq!(index, built(&m, &p, &removed), "byte {at} ^ {flip}");
                }
            }
        }
        // A field count other than the table's.
        assert!(read(&good, count - 1, &removed, &m, &p).is_err());
        assert!(read(&good, count + 1, &removed, &m, &p).is_err());
        assert!(read(&good, usize::MAX, &removed, &m, &p).is_err());
    }
}
