//! The payload index section (kind 9, format version 4; `docs/FORMAT.md`): the inverted and
//! sorted indexes that turn filters into slot sets ([`PayloadIndex`]), saved so that an open
//! takes them as written instead of building them again.
//!
//! A stored index is a second copy of what the payload and metadata records say, so a reader
//! trusts it no more than any other part of the file: [`decode`] checks that it lists exactly
//! the records' (field, value, slot) triples of the live slots, each once, in three steps:
//! 1. every listed slot is in range, live and ascending within its value's list, and no field
//!    lists a slot twice (under two values): a per-field map slot -> listing value;
//! 2. the records are read once, in slot order, and each (field, value) of a live slot must be
//!    what that map gives for the slot: every record pair is listed, with its value and type
//!    (a record may not name a field both in its metadata and its payload, so it has one value
//!    per field);
//! 3. the entries number exactly those pairs, so by steps 1 and 2 nothing else is listed.
//!
//! Step 2 reads the records in slot order, as [`PayloadIndex::build`] does; checking each entry
//! against its record in the index's order instead missed the cache once per entry and took
//! longer than building the index (docs/PERFORMANCE.md, opening with payloads).

use rayon::prelude::*;
use smol_str::SmolStr;

use super::format::{Cursor, Parsed, Section, fail};
use crate::payload::{FieldIndex, FloatKey, Indexed, Payload, PayloadIndex, each_value};
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

/// The order a field's values are stored in and the equality the check uses, over the values
/// as the index keys them ([`Indexed`]: a record's -0.0 already as 0.0).
impl Indexed<'_> {
    /// Whether this value comes strictly before `other` of the same type (strings by bytes,
    /// numbers by value).
    fn below(self, other: Indexed<'_>) -> bool {
        match (self, other) {
            (Indexed::String(a), Indexed::String(b)) => a < b,
            (Indexed::Integer(a), Indexed::Integer(b)) => a < b,
            (Indexed::Float(a), Indexed::Float(b)) => a.0 < b.0,
            _ => false,
        }
    }

    /// The same value of the same type (floats bit for bit: a NaN record matches nothing,
    /// since no index value is one).
    fn same(self, other: Indexed<'_>) -> bool {
        match (self, other) {
            (Indexed::String(a), Indexed::String(b)) => a == b,
            (Indexed::Integer(a), Indexed::Integer(b)) => a == b,
            (Indexed::Float(a), Indexed::Float(b)) => a.0.to_bits() == b.0.to_bits(),
            (Indexed::Bool(a), Indexed::Bool(b)) => a == b,
            _ => false,
        }
    }
}

/// Which run lists each slot, for one field: an array over every slot where the field lists at
/// least one slot in 8 (at most 32 bytes per listed entry, so the section's size bounds it),
/// else its (slot, run) pairs sorted by slot.
enum Owners {
    Dense(Vec<u32>),
    Sparse(Vec<(u32, u32)>),
}

impl Owners {
    /// The owners of field `name`, whose runs are `span` (slots checked in range); a slot
    /// listed twice (under two values) is an error.
    fn of(
        name: &str,
        span: std::ops::Range<usize>,
        runs: &[Run<'_>],
        lists: &[Vec<u32>],
        slots: usize,
    ) -> Parsed<Self> {
        let entries: usize = lists[span.clone()].iter().map(Vec::len).sum();
        let twice = |slot: u32, run: usize| {
            fail(PART, runs[run].offset, format!("field {name:?} lists slot {slot} under two values"))
        };
        if entries.saturating_mul(8) >= slots {
            let mut owner = vec![u32::MAX; slots];
            for r in span {
                for &slot in &lists[r] {
                    if owner[slot as usize] != u32::MAX {
                        return twice(slot, r);
                    }
                    owner[slot as usize] = r as u32;
                }
            }
            Ok(Owners::Dense(owner))
        } else {
            let mut pairs: Vec<(u32, u32)> =
                span.flat_map(|r| lists[r].iter().map(move |&slot| (slot, r as u32))).collect();
            pairs.sort_unstable();
            if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
                return twice(w[1].0, w[1].1 as usize);
            }
            Ok(Owners::Sparse(pairs))
        }
    }

    /// The run listing `slot`, if any.
    fn run(&self, slot: u32) -> Option<usize> {
        match self {
            Owners::Dense(owner) => owner.get(slot as usize).filter(|&&r| r != u32::MAX).map(|&r| r as usize),
            Owners::Sparse(pairs) => {
                pairs.binary_search_by_key(&slot, |p| p.0).ok().map(|i| pairs[i].1 as usize)
            }
        }
    }
}

/// One value's run of slots: its field (an index into the names), value, raw slots and where
/// the run starts in the file.
struct Run<'a> {
    field: usize,
    value: Indexed<'a>,
    slots: &'a [u8],
    offset: u64,
}

/// Reads a payload index section (`section`, the table's entry; `c`, its body) of a file of
/// `slots` slots, checking it against the file's records as the module documentation says.
/// Errors name the field, and the offset of the value's entry where one is at fault.
///
/// `records(s)` gives the metadata and payload of file slot `s`; it is asked only for slots
/// that `removed` does not hold, and None there is an error too.
pub(crate) fn decode<'r>(
    section: Section,
    body: &[u8],
    slots: usize,
    removed: &SlotSet,
    records: impl Fn(usize) -> Option<(&'r Metadata, &'r Payload)> + Sync,
) -> Parsed<PayloadIndex> {
    let c = &mut Cursor::new(PART, body, section.offset);
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
        let mut run = |value, slots, offset| runs.push(Run { field, value, slots, offset });
        values(c, name, "string", 12, &mut run, |c| c.text("a string value").map(Indexed::String))?;
        values(c, name, "integer", 16, &mut run, |c| {
            Ok(Indexed::Integer(c.u64("an integer value")? as i64))
        })?;
        values(c, name, "float", 16, &mut run, |c| {
            let at = c.offset();
            let value = f64::from_bits(c.u64("a float value")?);
            if !value.is_finite() || value.to_bits() == (-0.0f64).to_bits() {
                return fail(
                    PART,
                    at,
                    format!("field {name:?}: float {value} is not a finite value as indexed"),
                );
            }
            Ok(Indexed::Float(FloatKey(value)))
        })?;
        for flag in [false, true] {
            let at = c.offset();
            let slots = listed(c, true)?;
            if !slots.is_empty() {
                runs.push(Run { field, value: Indexed::Bool(flag), slots, offset: at });
            }
        }
        if runs.len() == first_run {
            return fail(PART, at, format!("field {name:?} lists no slot"));
        }
    }
    c.finish()?;

    // Step 1. Each run's slots: in range, live, ascending (run by run on every thread; the
    // first failing run in the section's order is the one reported).
    let checked: Vec<Parsed<Vec<u32>>> = runs
        .par_iter()
        .map(|run| {
            let name = names[run.field];
            let mut out = Vec::with_capacity(run.slots.len() / 4);
            for b in run.slots.chunks_exact(4) {
                let slot = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                if out.last().is_some_and(|&last| last >= slot) {
                    return fail(PART, run.offset, format!("field {name:?}: slot {slot} is not ascending"));
                }
                if slot as usize >= slots || removed.contains(slot as usize) {
                    return fail(
                        PART,
                        run.offset,
                        format!("field {name:?} lists slot {slot}, which holds no live vector"),
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
    // Who lists each slot, per field (no slot twice within a field).
    let mut field_runs = vec![0..0; names.len()];
    for (r, run) in runs.iter().enumerate() {
        let span = &mut field_runs[run.field];
        if span.end == 0 {
            *span = r..r;
        }
        span.end = r + 1;
    }
    let owners: Vec<Parsed<Owners>> = field_runs
        .par_iter()
        .enumerate()
        .map(|(f, span)| Owners::of(names[f], span.clone(), &runs, &lists, slots))
        .collect();
    let mut owner = Vec::with_capacity(owners.len());
    for o in owners {
        owner.push(o?);
    }
    let field_of: std::collections::HashMap<&str, usize, foldhash::fast::RandomState> =
        names.iter().enumerate().map(|(f, name)| (*name, f)).collect();
    // Step 2, in slot order on every thread.
    let check_slot = |s: usize| -> Parsed<usize> {
        let mut pairs = 0;
        let Some((metadata, payload)) = records(s) else {
            return fail(PART, section.offset, format!("slot {s} has no record"));
        };
        // A name in both would count two pairs against one entry (step 3's count relies on
        // one value per field and record; an add refuses such a vector too).
        if let Some(name) = metadata.keys().find(|name| payload.contains_key(*name)) {
            return fail(
                PART,
                section.offset,
                format!("slot {s}: field {name:?} is both metadata and payload"),
            );
        }
        // Each value as the index keys it (the same walk `PayloadIndex::build` makes).
        let mut wrong = None;
        each_value(metadata, payload, |name, value| {
            let listed = field_of.get(name).and_then(|&f| owner[f].run(s as u32)).map(|r| runs[r].value);
            if listed.is_some_and(|listed| listed.same(value)) {
                pairs += 1;
            } else if wrong.is_none() {
                wrong = Some(format!(
                    "field {name:?}: slot {s} holds {value:?}, which the index lists as {listed:?}"
                ));
            }
        });
        match wrong {
            Some(reason) => fail(PART, section.offset, reason),
            None => Ok(pairs),
        }
    };
    let chunk = 1 << 14;
    let held: Vec<Parsed<usize>> = (0..slots.div_ceil(chunk))
        .into_par_iter()
        .map(|c| {
            let mut pairs = 0;
            for s in c * chunk..((c + 1) * chunk).min(slots) {
                if !removed.contains(s) {
                    pairs += check_slot(s)?;
                }
            }
            Ok(pairs)
        })
        .collect();
    let mut held_pairs = 0;
    for pairs in held {
        held_pairs += pairs?;
    }
    // Step 3.
    let listed: usize = lists.iter().map(Vec::len).sum();
    if listed != held_pairs {
        return fail(
            PART,
            section.offset,
            format!("the index lists {listed} field values where the live records hold {held_pairs}"),
        );
    }

    // Each field's maps built from its runs in order (numbers ascending: built in bulk), the
    // fields side by side.
    let mut lists: Vec<Option<Vec<u32>>> = lists.into_iter().map(Some).collect();
    let mut taken: Vec<Vec<(Indexed<'_>, Vec<u32>)>> = field_runs
        .iter()
        .map(|span| span.clone().map(|r| (runs[r].value, lists[r].take().unwrap_or_default())).collect())
        .collect();
    let indexes: Vec<FieldIndex> = taken
        .par_iter_mut()
        .map(|runs| {
            let mut index = FieldIndex::default();
            let mut integers = Vec::new();
            let mut floats = Vec::new();
            for (value, list) in runs.drain(..) {
                match value {
                    Indexed::String(v) => {
                        index.strings.insert(SmolStr::new(v), list);
                    }
                    Indexed::Integer(v) => integers.push((v, list)),
                    Indexed::Float(v) => floats.push((v, list)),
                    Indexed::Bool(v) => index.bools[usize::from(v)] = list,
                }
            }
            index.integers = integers.into_iter().collect();
            index.floats = floats.into_iter().collect();
            index
        })
        .collect();
    Ok(PayloadIndex::from_fields(names.into_iter().map(SmolStr::new).zip(indexes)))
}

/// Reads one field's values of one type (a u32 count, then per value the value as `read` reads
/// it and its slot list), each strictly above the one before, handing each to `run` with its
/// raw slots and offset. `min_bytes`: the least a value and its list take.
fn values<'a>(
    c: &mut Cursor<'a>,
    name: &str,
    kind: &str,
    min_bytes: usize,
    run: &mut impl FnMut(Indexed<'a>, &'a [u8], u64),
    read: impl Fn(&mut Cursor<'a>) -> Parsed<Indexed<'a>>,
) -> Parsed<()> {
    let count = c.count(&format!("a field's {kind} values"), min_bytes)?;
    let mut last: Option<Indexed<'a>> = None;
    for _ in 0..count {
        let at = c.offset();
        let value = read(c)?;
        if last.is_some_and(|last| !last.below(value)) {
            return fail(
                PART,
                at,
                format!("field {name:?}: {kind} {value:?} is out of order or listed twice"),
            );
        }
        last = Some(value);
        run(value, listed(c, false)?, at);
    }
    Ok(())
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
    use crate::payload::PayloadValue;
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
        decode(section(count, bytes), bytes, m.len(), removed, |s| Some((&m[s], &p[s])))
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
        // One pair too few (slot 7 lost "n", which the index still lists) made up by a name in
        // both the metadata and the payload of slot 3 (counted twice against one entry): the
        // counts balance, so only the refusal of such a record catches it.
        let (mut m2, mut p2) = (m.clone(), p.clone());
        p2[7].remove("n");
        m2[3].insert("word".into(), "w0".into());
        assert_eq!(p2[3].get("word"), Some(&PayloadValue::String("w0".into())));
        let error = read(&good, count, &removed, &m2, &p2).expect_err("a name in both").to_string();
        assert!(error.contains("both metadata and payload"), "{error}");
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
