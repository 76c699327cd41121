//! The collection file format, version 1 (`docs/FORMAT.md` is its specification): a header,
//! a table of sections, then the sections' bodies, each at a 64-byte boundary, all
//! little-endian, every part checksummed with CRC-32C.
//!
//! [`parse`] reads a whole file image and trusts nothing in it: every offset, length and
//! count is checked against the bytes that are really there before anything is allocated, so
//! the largest allocation a file can cause is a small multiple of its own size. Errors name
//! the section and the byte offset where the file went wrong.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::payload::{Payload, PayloadValue};
use crate::slots::SlotSet;
use crate::types::{GpuDistanceMetric, Metadata, SearchPrecision, StorageConfig, StoragePrecision};

/// The first 8 bytes of every collection file.
pub(crate) const MAGIC: [u8; 8] = *b"HIVEGPUC";
/// The newest format version this build reads. It writes version 4 only for a file with a
/// payload index section (a collection with payload or metadata fields), version 3 for one
/// with an order section (a shard of a multi-device storage), version 2 for one with an index
/// section, version 1 otherwise, so that files stay readable by the oldest build that knows
/// every section they hold.
pub(crate) const FORMAT_VERSION: u32 = 4;
/// Bytes of the file header.
pub(crate) const HEADER_BYTES: usize = 64;
/// Bytes of one section table entry.
pub(crate) const ENTRY_BYTES: usize = 40;
/// Section bodies start at multiples of this (so a mapped vector section is aligned for any
/// element type a device copies from).
pub(crate) const ALIGN: usize = 64;

/// What a section holds. Every kind appears at most once; every file has the first six, and a
/// version 2 file may have an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Dimension, slot count, metric, storage and search precision.
    Config = 1,
    /// One id per slot (empty for a removed slot).
    Ids = 2,
    /// Every slot's stored values, row-major (f32 or f16 bits).
    Vectors = 3,
    /// The removed slots, as a bitmap.
    Removed = 4,
    /// Each slot's string metadata.
    Metadata = 5,
    /// Each slot's typed payload fields.
    Payload = 6,
    /// The collection's index (format version 2): IVF-Flat centroids and lists.
    Index = 7,
    /// Each slot's order key (format version 3): a shard's place in its storage's write order.
    Order = 8,
    /// The payload fields' indexes (format version 4): value -> slots, per field
    /// (`persist::payload_index`).
    PayloadIndex = 9,
}

impl Kind {
    pub(crate) const ALL: [Kind; 9] = [
        Kind::Config,
        Kind::Ids,
        Kind::Vectors,
        Kind::Removed,
        Kind::Metadata,
        Kind::Payload,
        Kind::Index,
        Kind::Order,
        Kind::PayloadIndex,
    ];
    /// The kinds every file has.
    pub(crate) const REQUIRED: usize = 6;

    fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u32 == code)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Config => "config",
            Kind::Ids => "ids",
            Kind::Vectors => "vectors",
            Kind::Removed => "removed",
            Kind::Metadata => "metadata",
            Kind::Payload => "payload",
            Kind::Index => "index",
            Kind::Order => "order",
            Kind::PayloadIndex => "payload index",
        }
    }
}

/// One entry of the section table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Section {
    pub(crate) kind: Kind,
    /// The section's own layout version (1 for every kind in format version 1).
    pub(crate) version: u32,
    /// Byte offset of the body from the start of the file.
    pub(crate) offset: u64,
    /// Bytes of the body.
    pub(crate) length: u64,
    /// Items in the body (slots, or 1 for the config).
    pub(crate) count: u64,
    /// CRC-32C of the body.
    pub(crate) crc: u32,
}

impl Section {
    pub(crate) fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut out = [0u8; ENTRY_BYTES];
        out[0..4].copy_from_slice(&(self.kind as u32).to_le_bytes());
        out[4..8].copy_from_slice(&self.version.to_le_bytes());
        out[8..16].copy_from_slice(&self.offset.to_le_bytes());
        out[16..24].copy_from_slice(&self.length.to_le_bytes());
        out[24..32].copy_from_slice(&self.count.to_le_bytes());
        out[32..36].copy_from_slice(&self.crc.to_le_bytes());
        out
    }
}

/// The file header for `sections` (already written), `file_bytes` long in all.
pub(crate) fn encode_header(sections: &[Section], file_bytes: u64) -> Vec<u8> {
    let table: Vec<u8> = sections.iter().flat_map(|s| s.encode()).collect();
    let mut header = vec![0u8; HEADER_BYTES];
    header[0..8].copy_from_slice(&MAGIC);
    let version: u32 = if sections.iter().any(|s| s.kind == Kind::PayloadIndex) {
        4
    } else if sections.iter().any(|s| s.kind == Kind::Order) {
        3
    } else if sections.iter().any(|s| s.kind == Kind::Index) {
        2
    } else {
        1
    };
    header[8..12].copy_from_slice(&version.to_le_bytes());
    header[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    header[16..20].copy_from_slice(&(sections.len() as u32).to_le_bytes());
    header[24..32].copy_from_slice(&file_bytes.to_le_bytes());
    header[56..60].copy_from_slice(&crc32c::crc32c(&table).to_le_bytes());
    let crc = crc32c::crc32c(&header[..60]);
    header[60..64].copy_from_slice(&crc.to_le_bytes());
    header.extend_from_slice(&table);
    header
}

/// Where the first section body may start for a file of `sections` sections.
pub(crate) fn bodies_start(sections: usize) -> usize {
    (HEADER_BYTES + sections * ENTRY_BYTES).next_multiple_of(ALIGN)
}

/// The config body.
pub(crate) fn encode_config(config: &StorageConfig, slots: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&(config.dimension as u64).to_le_bytes());
    out.extend_from_slice(&(slots as u64).to_le_bytes());
    let metric = match config.metric {
        GpuDistanceMetric::Euclidean => 0u32,
        GpuDistanceMetric::DotProduct => 1,
        GpuDistanceMetric::Cosine => 2,
        GpuDistanceMetric::Manhattan => 3,
        GpuDistanceMetric::Chebyshev => 4,
    };
    let precision = precision_code(config.precision);
    let search = match config.search {
        SearchPrecision::Exact => 0u32,
        SearchPrecision::Fast => 1,
    };
    for word in [metric, precision, search, 0] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out
}

/// Appends one slot's id record.
pub(crate) fn encode_id(out: &mut Vec<u8>, id: &str) {
    out.extend_from_slice(&(id.len() as u32).to_le_bytes());
    out.extend_from_slice(id.as_bytes());
}

/// Appends one slot's metadata record (pairs in key order, so a file is a function of its
/// collection).
pub(crate) fn encode_metadata(out: &mut Vec<u8>, metadata: &Metadata) {
    let mut pairs: Vec<(&String, &String)> = metadata.iter().collect();
    pairs.sort();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (key, value) in pairs {
        encode_id(out, key);
        encode_id(out, value);
    }
}

/// Appends one slot's payload record (fields in name order).
pub(crate) fn encode_payload(out: &mut Vec<u8>, payload: &Payload) {
    let mut fields: Vec<(&String, &PayloadValue)> = payload.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    out.extend_from_slice(&(fields.len() as u32).to_le_bytes());
    for (name, value) in fields {
        encode_id(out, name);
        match value {
            PayloadValue::String(s) => {
                out.push(0);
                encode_id(out, s);
            }
            PayloadValue::Integer(i) => {
                out.push(1);
                out.extend_from_slice(&i.to_le_bytes());
            }
            PayloadValue::Float(f) => {
                out.push(2);
                out.extend_from_slice(&f.to_le_bytes());
            }
            PayloadValue::Bool(b) => {
                out.push(3);
                out.push(u8::from(*b));
            }
        }
    }
}

/// A parsed collection file, borrowing its vectors from the image.
#[derive(Debug)]
pub(crate) struct Snapshot<'a> {
    pub(crate) config: StorageConfig,
    pub(crate) slots: usize,
    /// One per slot; empty for a removed slot.
    pub(crate) ids: Vec<&'a str>,
    /// `slots x dimension` values, f32 or f16 bits as `config.precision` says, little-endian.
    pub(crate) vectors: &'a [u8],
    pub(crate) removed: SlotSet,
    pub(crate) metadata: Vec<Metadata>,
    pub(crate) payloads: Vec<Payload>,
    pub(crate) sections: Vec<Section>,
    /// The format version the file was written in.
    pub(crate) version: u32,
    /// Its index, if it has one.
    pub(crate) index: Option<StoredIndex>,
    /// Every slot's order key, for a shard's file.
    pub(crate) order: Option<Vec<u64>>,
    /// Its payload index section, not yet read (`persist::payload_index::decode` checks it
    /// against the records: an open does so beside its other checks).
    pub(crate) payload_index: Option<(Section, &'a [u8])>,
}

/// An index section's contents, checked against the file's slots.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredIndex {
    /// `nlist x dimension` finite centroids.
    pub(crate) centroids: Vec<f32>,
    /// Each list's slots: every live slot of the file exactly once, no removed slot.
    pub(crate) lists: Vec<Vec<u32>>,
    /// Vectors the centroids trained on.
    pub(crate) training_vectors: u64,
    /// Lloyd iterations the training ran.
    pub(crate) iterations: u64,
    /// The index kind, with its list count.
    pub(crate) spec: crate::IndexSpec,
    /// A quantized index's quantizer (checked as [`decode_index`] says).
    pub(crate) quantizer: Option<StoredQuantizer>,
}

/// What an index section keeps of a quantizer (binary codes need none).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StoredQuantizer {
    /// An SQ8 grid: `dimension` finite bases and steps of at least 0.
    Scalar {
        /// Per component, the value of code 0.
        base: Vec<f32>,
        /// Per component, one code step.
        step: Vec<f32>,
    },
    /// PQ codebooks: `m` dividing the dimension, 4 or 8 bits, `2^bits x dimension` finite
    /// values (codebook after codebook).
    Product {
        /// Sub-quantizers.
        m: usize,
        /// Bits per code.
        bits: usize,
        /// The codebooks.
        codebooks: Vec<f32>,
    },
}

/// The code of IVF-Flat in an index section.
const IVF_FLAT: u32 = 1;
/// The code of IVF-SQ8 in an index section.
const IVF_SQ8: u32 = 2;
/// The code of the flat SQ8 index (IVF-SQ8 over one list) in an index section.
const SQ8: u32 = 3;
/// The code of the binary index (one list, a bit per component) in an index section.
const BINARY: u32 = 4;
/// The code of IVF-PQ in an index section.
const IVF_PQ: u32 = 5;
/// The code of the flat PQ index (IVF-PQ over one list) in an index section.
const PQ: u32 = 6;

/// The index section's body: its kind (1 IVF-Flat, 2 IVF-SQ8, 3 SQ8, 4 binary, 5 IVF-PQ,
/// 6 PQ), list count, training figures, centroids (f32), list lengths (u64) and the lists'
/// slots (u32), every live slot once; then, for the SQ8 kinds, the grid's bases and steps
/// (f32, `dim` each), for the PQ kinds `m` and `bits` (u32 each) and the codebooks (f32,
/// `2^bits x dim`). Codes are not saved: an open encodes the stored vectors again.
pub(crate) fn encode_index(
    spec: crate::IndexSpec,
    centroids: &[f32],
    lists: &[Vec<u32>],
    training_vectors: usize,
    iterations: usize,
    quantizer: Option<&StoredQuantizer>,
    removed: &SlotSet,
) -> Vec<u8> {
    let live = |slot: &&u32| !removed.contains(**slot as usize);
    let entries: usize = lists.iter().map(|l| l.iter().filter(live).count()).sum();
    let mut out = Vec::with_capacity(32 + centroids.len() * 4 + lists.len() * 8 + entries * 4);
    let kind = match spec {
        crate::IndexSpec::IvfSq8 { .. } => IVF_SQ8,
        crate::IndexSpec::Sq8 => SQ8,
        crate::IndexSpec::Binary => BINARY,
        crate::IndexSpec::IvfPq { .. } => IVF_PQ,
        crate::IndexSpec::Pq { .. } => PQ,
        _ => IVF_FLAT,
    };
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for word in [lists.len() as u64, training_vectors as u64, iterations as u64] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    centroids.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    for list in lists {
        out.extend_from_slice(&(list.iter().filter(live).count() as u64).to_le_bytes());
    }
    for list in lists {
        list.iter().filter(live).for_each(|slot| out.extend_from_slice(&slot.to_le_bytes()));
    }
    match quantizer {
        Some(StoredQuantizer::Scalar { base, step }) => {
            base.iter().chain(step).for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
        }
        Some(StoredQuantizer::Product { m, bits, codebooks }) => {
            out.extend_from_slice(&(*m as u32).to_le_bytes());
            out.extend_from_slice(&(*bits as u32).to_le_bytes());
            codebooks.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        None => {}
    }
    out
}

/// Reads and checks an index section ([`encode_index`]'s layout) of a file of `slots` slots of
/// dimension `dim` with `removed` removed: every allocation is bounded by the bytes the
/// section really has.
fn decode_index(
    section: Section,
    c: &mut Cursor<'_>,
    config: &StorageConfig,
    slots: usize,
    removed: &SlotSet,
) -> Parsed<StoredIndex> {
    let dim = config.dimension;
    let at = c.offset();
    let kind = c.u32("the index kind")?;
    if !matches!(kind, IVF_FLAT | IVF_SQ8 | SQ8 | BINARY | IVF_PQ | PQ) {
        return fail(
            "index",
            at,
            format!("unknown index kind {kind} (1 is IVF-Flat, 2 IVF-SQ8, 3 SQ8, 4 binary, 5 IVF-PQ, 6 PQ)"),
        );
    }
    c.u32("reserved")?;
    let at = c.offset();
    let nlist = c.u64("the list count")?;
    let training_vectors = c.u64("the training vector count")?;
    let iterations = c.u64("the iteration count")?;
    if nlist == 0 || nlist != section.count {
        return fail("index", at, format!("{nlist} lists where the section table counts {}", section.count));
    }
    if matches!(kind, SQ8 | BINARY | PQ) && nlist != 1 {
        let name = match kind {
            SQ8 => "a flat SQ8",
            PQ => "a flat PQ",
            _ => "a binary",
        };
        return fail("index", at, format!("{name} index has one list, this one {nlist}"));
    }
    let centroid_bytes = (nlist as usize).checked_mul(dim).and_then(|v| v.checked_mul(4));
    let Some(centroid_bytes) = centroid_bytes.filter(|&b| b <= c.remaining()) else {
        return fail("index", at, format!("{nlist} centroids of dimension {dim} do not fit in the section"));
    };
    let at = c.offset();
    let raw = c.take(centroid_bytes, "the centroids")?;
    let centroids: Vec<f32> =
        raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    if let Some(bad) = centroids.iter().position(|x| !x.is_finite()) {
        return fail("index", at + 4 * bad as u64, format!("centroid {} has a non-finite value", bad / dim));
    }
    // Centroids are probed as the collection's vectors are searched: the same bounds (and a
    // direction under cosine).
    let probed = StorageConfig::new(dim, config.metric);
    for (i, centroid) in centroids.chunks_exact(dim).enumerate() {
        let name = format!("centroid {i}");
        if let Err(e) =
            crate::collection::check_values(centroid, &probed, crate::collection::Subject::Vector(&name))
        {
            return fail("index", at + (4 * i * dim) as u64, format!("{name}: {e}"));
        }
    }
    let nlist = nlist as usize;
    let at = c.offset();
    let raw_lengths = c.take(nlist * 8, "the list lengths")?;
    let live = slots - removed.count();
    let mut lengths = Vec::with_capacity(nlist);
    let mut total = 0usize;
    for b in raw_lengths.chunks_exact(8) {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        let length = u64::from_le_bytes(a);
        total = match usize::try_from(length).ok().and_then(|l| total.checked_add(l)) {
            Some(t) if t <= live => t,
            _ => return fail("index", at, format!("the lists hold more than the file's {live} live slots")),
        };
        lengths.push(length as usize);
    }
    if total != live {
        return fail("index", at, format!("the lists hold {total} slots, the file {live} live ones"));
    }
    let at = c.offset();
    let raw_slots = c.take(total * 4, "the lists' slots")?;
    let quantizer = match kind {
        IVF_SQ8 | SQ8 => {
            let grid_at = c.offset();
            let raw = c.take(dim * 8, "the quantizer's grid")?;
            let values: Vec<f32> =
                raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            let (base, step) = values.split_at(dim);
            if let Err(e) = crate::index::sq::ScalarQuantizer::from_parts(base.to_vec(), step.to_vec()) {
                return fail("index", grid_at, e.to_string());
            }
            Some(StoredQuantizer::Scalar { base: base.to_vec(), step: step.to_vec() })
        }
        IVF_PQ | PQ => {
            let shape_at = c.offset();
            let m = c.u32("the sub-quantizer count")? as usize;
            let bits = c.u32("the bits per code")? as usize;
            if let Err(e) = crate::index::pq::ProductQuantizer::check_shape(dim, m, bits) {
                return fail("index", shape_at, e.to_string());
            }
            // 4 or 8 bits: at most 256 centroids of the dimension, checked against the section.
            let books_at = c.offset();
            let raw = c.take((1usize << bits) * dim * 4, "the codebooks")?;
            let codebooks: Vec<f32> =
                raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            if let Some(bad) = codebooks.iter().position(|x| !x.is_finite()) {
                return fail(
                    "index",
                    books_at + 4 * bad as u64,
                    String::from("a codebook has a non-finite value"),
                );
            }
            Some(StoredQuantizer::Product { m, bits, codebooks })
        }
        _ => None,
    };
    c.finish()?;
    let mut seen = SlotSet::empty(slots);
    let mut values = raw_slots.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let mut lists = Vec::with_capacity(nlist);
    for (l, &length) in lengths.iter().enumerate() {
        let mut list = Vec::with_capacity(length);
        for slot in values.by_ref().take(length) {
            let s = slot as usize;
            if s >= slots || removed.contains(s) || seen.contains(s) {
                let why = if s >= slots {
                    format!("is past the {slots} slots")
                } else if removed.contains(s) {
                    "is removed".to_string()
                } else {
                    "is listed twice".to_string()
                };
                return fail("index", at, format!("list {l}: slot {s} {why}"));
            }
            seen.set(s, true);
            list.push(slot);
        }
        lists.push(list);
    }
    let spec = match kind {
        IVF_SQ8 => crate::IndexSpec::IvfSq8 { nlist },
        SQ8 => crate::IndexSpec::Sq8,
        BINARY => crate::IndexSpec::Binary,
        IVF_PQ | PQ => {
            let Some(StoredQuantizer::Product { m, bits, .. }) = quantizer else {
                return fail("index", at, String::from("a PQ index without its codebooks"));
            };
            if kind == PQ {
                crate::IndexSpec::Pq { m, bits }
            } else {
                crate::IndexSpec::IvfPq { nlist, m, bits }
            }
        }
        _ => crate::IndexSpec::IvfFlat { nlist },
    };
    Ok(StoredIndex { centroids, lists, training_vectors, iterations, spec, quantizer })
}

impl Snapshot<'_> {
    /// Slot `slot`'s stored values as f32.
    pub(crate) fn row(&self, slot: usize, out: &mut Vec<f32>) {
        let row_bytes = self.config.dimension * element_bytes(self.config.precision);
        widen(&self.vectors[slot * row_bytes..(slot + 1) * row_bytes], self.config.precision, out);
    }
}

/// A storage precision's code in the config section (`docs/FORMAT.md`).
fn precision_code(precision: StoragePrecision) -> u32 {
    match precision {
        StoragePrecision::F32 => 0,
        StoragePrecision::F16 => 1,
        StoragePrecision::Bf16 => 2,
        StoragePrecision::I8 => 3,
        StoragePrecision::U8 => 4,
    }
}

use crate::exact::elements::{element_bytes, widen};

/// What is wrong with a collection file, and where: the part (a section's name, "header",
/// "section table" or "padding"), the byte offset in the file, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    /// The part of the file.
    pub part: &'static str,
    /// The byte offset in the file.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

impl std::error::Error for FormatError {}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}: {}", self.part, self.offset, self.reason)
    }
}

pub(crate) type Parsed<T> = std::result::Result<T, FormatError>;

/// Whether `crc` is the CRC-32C of `bytes`. Fuzz builds (`--cfg fuzzing`, `scripts/fuzz.sh`)
/// accept any checksum, so that the fuzzer reaches the records behind them instead of spending
/// its time on checksums it cannot forge; every other build checks them all.
pub(crate) fn checksum_matches(bytes: &[u8], crc: u32) -> bool {
    cfg!(fuzzing) || checksum(bytes) == crc
}

/// Bytes per piece of a checksum computed in parallel: large enough that combining the
/// pieces' checksums (a few hundred nanoseconds each) is noise, small enough to spread a
/// section of tens of megabytes over every core.
const CHECKSUM_PIECE: usize = 4 << 20;

/// The CRC-32C of `bytes`, computed in pieces on every core of the pool it runs on and
/// combined (`crc32c_combine`): one core checks about 10 GB/s at best, which alone would be
/// most of an open's time.
pub(crate) fn checksum(bytes: &[u8]) -> u32 {
    use rayon::prelude::*;
    if bytes.len() <= 2 * CHECKSUM_PIECE {
        return crc32c::crc32c(bytes);
    }
    let pieces: Vec<(u32, usize)> =
        bytes.par_chunks(CHECKSUM_PIECE).map(|piece| (crc32c::crc32c(piece), piece.len())).collect();
    pieces.into_iter().fold(0, |crc, (piece, len)| crc32c::crc32c_combine(crc, piece, len))
}

pub(crate) fn fail<T>(part: &'static str, offset: u64, reason: impl Into<String>) -> Parsed<T> {
    Err(FormatError { part, offset, reason: reason.into() })
}

/// A bounds-checked little-endian reader over one part of the file.
#[derive(Clone)]
pub(crate) struct Cursor<'a> {
    pub(crate) part: &'static str,
    bytes: &'a [u8],
    /// Offset of `bytes[0]` in the file.
    base: u64,
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(part: &'static str, bytes: &'a [u8], base: u64) -> Self {
        Self { part, bytes, base, at: 0 }
    }

    pub(crate) fn offset(&self) -> u64 {
        self.base + self.at as u64
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// A cursor over bytes `start..end` of this one's (offsets in the file kept).
    fn piece(&self, start: usize, end: usize) -> Cursor<'a> {
        Cursor { part: self.part, bytes: &self.bytes[start..end], base: self.base + start as u64, at: 0 }
    }

    /// Steps over a length-prefixed text without reading it (its UTF-8 is checked where it is
    /// read).
    fn skip_text(&mut self, what: &str) -> Parsed<()> {
        let len = self.u32(what)? as usize;
        self.take(len, what).map(|_| ())
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Parsed<&'a [u8]> {
        if n > self.remaining() {
            return fail(
                self.part,
                self.offset(),
                format!("{what} needs {n} bytes, only {} remain in the section", self.remaining()),
            );
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Parsed<u8> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &str) -> Parsed<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Parsed<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub(crate) fn text(&mut self, what: &str) -> Parsed<&'a str> {
        let at = self.offset();
        let len = self.u32(what)? as usize;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).or_else(|_| fail(self.part, at, format!("{what} is not UTF-8")))
    }

    /// A count of records that need at least `min_bytes` each: refused when the section
    /// cannot hold that many, before anything is allocated for them.
    pub(crate) fn count(&mut self, what: &str, min_bytes: usize) -> Parsed<usize> {
        let at = self.offset();
        let count = self.u32(what)? as usize;
        if count.saturating_mul(min_bytes) > self.remaining() {
            return fail(
                self.part,
                at,
                format!("{what} of {count} cannot fit in the {} bytes left", self.remaining()),
            );
        }
        Ok(count)
    }

    pub(crate) fn finish(&self) -> Parsed<()> {
        if self.remaining() != 0 {
            return fail(
                self.part,
                self.offset(),
                format!("{} bytes past the section's last record", self.remaining()),
            );
        }
        Ok(())
    }
}

/// Parses a whole collection file image.
pub(crate) fn parse(file: &[u8]) -> Parsed<Snapshot<'_>> {
    let started = std::time::Instant::now();
    let mark = |what: &str| {
        if crate::backend::profiling() {
            eprintln!("hive-gpu profile (parse): {what} at {:.3} s", started.elapsed().as_secs_f64());
        }
    };
    let mut header = Cursor::new("header", file, 0);
    let magic = header.take(8, "the magic number").or_else(|_| {
        fail("header", 0, format!("{} bytes are too short for a collection file", file.len()))
    })?;
    if magic != MAGIC {
        return fail(
            "header",
            0,
            format!("magic {magic:02x?} is not a hive-gpu collection's ({MAGIC:02x?})"),
        );
    }
    let version = header.u32("the format version")?;
    if version == 0 || version > FORMAT_VERSION {
        return fail(
            "header",
            8,
            format!(
                "format version {version}: this build reads versions 1 to {FORMAT_VERSION} (a newer hive-gpu wrote it?)"
            ),
        );
    }
    let head = header.take(HEADER_BYTES - 12, "the header")?;
    let word = |at: usize| u32::from_le_bytes([head[at - 12], head[at - 11], head[at - 10], head[at - 9]]);
    if !checksum_matches(&file[..60], word(60)) {
        return fail("header", 60, "header checksum mismatch");
    }
    let header_bytes = word(12) as usize;
    let count = word(16) as usize;
    let flags = word(20);
    let mut total = [0u8; 8];
    total.copy_from_slice(&file[24..32]);
    let file_bytes = u64::from_le_bytes(total);
    if header_bytes != HEADER_BYTES || flags != 0 {
        return fail(
            "header",
            12,
            format!("header size {header_bytes} / flags {flags:#x} unknown to format 1"),
        );
    }
    if file_bytes != file.len() as u64 {
        return fail(
            "header",
            24,
            format!(
                "the header says {file_bytes} bytes but the file has {} (truncated or extended)",
                file.len()
            ),
        );
    }
    if count > Kind::ALL.len() || count < Kind::REQUIRED {
        return fail("header", 16, format!("{count} sections, at most {} known", Kind::ALL.len()));
    }
    let mut table = Cursor::new("section table", file, 0);
    table.at = HEADER_BYTES;
    let table_bytes = table.take(count * ENTRY_BYTES, "the section table")?;
    if !checksum_matches(table_bytes, word(56)) {
        return fail("section table", HEADER_BYTES as u64, "section table checksum mismatch");
    }
    let mut sections: Vec<Section> = Vec::with_capacity(count);
    let mut entries = Cursor::new("section table", table_bytes, HEADER_BYTES as u64);
    for _ in 0..count {
        let at = entries.offset();
        let code = entries.u32("a section kind")?;
        let kind = Kind::from_code(code)
            .map_or_else(|| fail("section table", at, format!("unknown section kind {code}")), Ok)?;
        let section = Section {
            kind,
            version: entries.u32("a section version")?,
            offset: entries.u64("a section offset")?,
            length: entries.u64("a section length")?,
            count: entries.u64("a section count")?,
            crc: entries.u32("a section checksum")?,
        };
        entries.u32("reserved")?;
        if section.version != 1 {
            return fail(
                "section table",
                at,
                format!("{} section version {} is unknown", kind.name(), section.version),
            );
        }
        if sections.iter().any(|s| s.kind == kind) {
            return fail("section table", at, format!("a second {} section", kind.name()));
        }
        if kind == Kind::Index && version < 2 {
            return fail("section table", at, "an index section in a format version 1 file");
        }
        if kind == Kind::Order && version < 3 {
            return fail("section table", at, format!("an order section in a format version {version} file"));
        }
        if kind == Kind::PayloadIndex && version < 4 {
            return fail(
                "section table",
                at,
                format!("a payload index section in a format version {version} file"),
            );
        }
        if !section.offset.is_multiple_of(ALIGN as u64) {
            return fail(
                "section table",
                at,
                format!("{} section at {} is not 64-byte aligned", kind.name(), section.offset),
            );
        }
        let end = section.offset.checked_add(section.length);
        if section.offset < bodies_start(count) as u64 || end.is_none_or(|e| e > file.len() as u64) {
            return fail(
                "section table",
                at,
                format!(
                    "{} section at {} of {} bytes lies outside the file's {} bytes of bodies",
                    kind.name(),
                    section.offset,
                    section.length,
                    file.len()
                ),
            );
        }
        let body = &file[section.offset as usize..(section.offset + section.length) as usize];
        if !checksum_matches(body, section.crc) {
            return fail(kind.name(), section.offset, format!("{} section checksum mismatch", kind.name()));
        }
        sections.push(section);
    }
    mark("sections checksummed");
    // Bodies may not overlap, and every byte outside them (the padding) must be zero: no
    // byte of a file escapes a check.
    let mut spans: Vec<(u64, u64)> = sections.iter().map(|s| (s.offset, s.offset + s.length)).collect();
    spans.sort_unstable();
    let mut covered = (HEADER_BYTES + count * ENTRY_BYTES) as u64;
    for &(start, end) in spans.iter().chain([(file.len() as u64, file.len() as u64)].iter()) {
        if start < covered {
            return fail("section table", HEADER_BYTES as u64, format!("sections overlap at byte {start}"));
        }
        if let Some(at) = file[covered as usize..start as usize].iter().position(|&b| b != 0) {
            return fail("padding", covered + at as u64, "a padding byte is not zero");
        }
        covered = end;
    }
    let body = |kind: Kind| -> Parsed<(Section, Cursor<'_>)> {
        let section = sections.iter().find(|s| s.kind == kind).copied();
        let section = section.map_or_else(
            || fail("section table", HEADER_BYTES as u64, format!("no {} section", kind.name())),
            Ok,
        )?;
        let bytes = &file[section.offset as usize..(section.offset + section.length) as usize];
        Ok((section, Cursor::new(kind.name(), bytes, section.offset)))
    };

    let (_, mut c) = body(Kind::Config)?;
    let dimension = c.u64("the dimension")?;
    let slots = c.u64("the slot count")?;
    let metric = match c.u32("the metric")? {
        0 => GpuDistanceMetric::Euclidean,
        1 => GpuDistanceMetric::DotProduct,
        2 => GpuDistanceMetric::Cosine,
        3 => GpuDistanceMetric::Manhattan,
        4 => GpuDistanceMetric::Chebyshev,
        other => return fail("config", c.offset() - 4, format!("unknown metric code {other}")),
    };
    let code = c.u32("the storage precision")?;
    let Some(precision) = StoragePrecision::ALL.into_iter().find(|&p| precision_code(p) == code) else {
        return fail("config", c.offset() - 4, format!("unknown storage precision code {code}"));
    };
    let search = match c.u32("the search precision")? {
        0 => SearchPrecision::Exact,
        1 => SearchPrecision::Fast,
        other => return fail("config", c.offset() - 4, format!("unknown search precision code {other}")),
    };
    c.u32("reserved")?;
    c.finish()?;
    if dimension == 0 || dimension > u32::MAX as u64 {
        return fail(
            "config",
            body(Kind::Config)?.0.offset,
            format!("dimension {dimension} is out of range"),
        );
    }
    let dim = dimension as usize;
    let config = StorageConfig { dimension: dim, metric, precision, search };

    // Every slot has a row of `dim` elements: the vector section's length bounds `slots`
    // before any per-slot allocation.
    let (vectors, _) = body(Kind::Vectors)?;
    let element = element_bytes(precision) as u64;
    let row_bytes = dim as u64 * element;
    if slots.checked_mul(row_bytes) != Some(vectors.length) {
        return fail(
            "vectors",
            vectors.offset,
            format!("{} bytes hold no {slots} rows of {dim} {element}-byte values", vectors.length),
        );
    }
    let slots = slots as usize;
    for kind in [Kind::Ids, Kind::Removed, Kind::Metadata, Kind::Payload, Kind::Vectors] {
        let section = body(kind)?.0;
        if section.count != slots as u64 {
            return fail(
                kind.name(),
                section.offset,
                format!("{} items where the config has {slots} slots", section.count),
            );
        }
    }
    let vector_bytes = &file[vectors.offset as usize..(vectors.offset + vectors.length) as usize];

    let (removed_section, mut c) = body(Kind::Removed)?;
    let words = SlotSet::words_for(slots);
    let raw = c.take(words * 4, "the removed bitmap")?;
    c.finish()?;
    let bits: Vec<u32> = raw.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let removed = SlotSet::checked_from_words(bits, slots).or_else(|slot| {
        fail("removed", removed_section.offset, format!("bit {slot} is set past the {slots} slots"))
    })?;

    // The three record sections are independent: parsed side by side (about 0.1 s of an open
    // of a million slots on one thread, docs/PERFORMANCE.md), their errors reported in the
    // order a reading on one thread would meet them (ids, then metadata, then payloads).
    let ids_section = body(Kind::Ids)?;
    let metadata_section = body(Kind::Metadata)?;
    let payload_section = body(Kind::Payload)?;
    let parse_ids =
        || records(ids_section.1, slots, |c| c.skip_text("an id"), |c, slot| decode_id(c, slot, &removed));
    let parse_metadata = || records(metadata_section.1, slots, skip_metadata, |c, _| decode_metadata(c));
    let parse_payloads = || records(payload_section.1, slots, skip_payload, |c, _| decode_payload(c));
    let (ids, (metadata, payloads)) = rayon::join(parse_ids, || rayon::join(parse_metadata, parse_payloads));
    let (ids, metadata, payloads) = (ids?, metadata?, payloads?);
    mark("records parsed");

    let order = match sections.iter().find(|s| s.kind == Kind::Order).copied() {
        Some(section) => {
            let (_, mut c) = body(Kind::Order)?;
            Some(decode_order(section, &mut c, slots)?)
        }
        None => None,
    };

    let index = match sections.iter().find(|s| s.kind == Kind::Index).copied() {
        Some(section) if config.metric.is_difference_norm() => {
            return fail(
                "index",
                section.offset,
                format!("an index over the {} metric, which no index supports", config.metric),
            );
        }
        Some(section) => {
            let (_, mut c) = body(Kind::Index)?;
            Some(decode_index(section, &mut c, &config, slots, &removed)?)
        }
        None => None,
    };

    let payload_index = sections.iter().find(|s| s.kind == Kind::PayloadIndex).map(|&section| {
        (section, &file[section.offset as usize..(section.offset + section.length) as usize])
    });

    Ok(Snapshot {
        config,
        slots,
        ids,
        vectors: vector_bytes,
        removed,
        metadata,
        payloads,
        sections,
        version,
        index,
        order,
        payload_index,
    })
}

/// Records a piece of a record section holds when its pieces are parsed side by side.
const RECORD_PIECE: usize = 1 << 14;

/// One record per slot, each read by `decode` (given its slot), filling the section to its end.
/// The vector's room is bounded by the section's bytes (a record takes at least 4), never by
/// `slots` alone.
///
/// A section of many records is read in pieces on every thread: one pass steps over the records
/// with `skip` (which reads exactly the bytes `decode` reads from a record `decode` accepts) to
/// find where each piece starts, then the pieces are decoded side by side. The first error in
/// slot order is the one returned, as a reading on one thread would meet it, at the same
/// offset; a record `skip` cannot step over is left to that reading. A million payload records
/// took 0.7-1.1 s on one thread of the H200 machine (docs/PERFORMANCE.md, opening).
fn records<'a, T: Send>(
    c: Cursor<'a>,
    slots: usize,
    skip: impl Fn(&mut Cursor<'a>) -> Parsed<()>,
    decode: impl Fn(&mut Cursor<'a>, usize) -> Parsed<T> + Sync,
) -> Parsed<Vec<T>> {
    records_in_pieces(c, slots, RECORD_PIECE, skip, decode)
}

fn records_in_pieces<'a, T: Send>(
    c: Cursor<'a>,
    slots: usize,
    piece_records: usize,
    skip: impl Fn(&mut Cursor<'a>) -> Parsed<()>,
    decode: impl Fn(&mut Cursor<'a>, usize) -> Parsed<T> + Sync,
) -> Parsed<Vec<T>> {
    let one_thread = |mut c: Cursor<'a>| -> Parsed<Vec<T>> {
        let mut out = Vec::with_capacity(slots.min(c.remaining() / 4));
        for slot in 0..slots {
            out.push(decode(&mut c, slot)?);
        }
        c.finish()?;
        Ok(out)
    };
    if slots <= piece_records {
        return one_thread(c);
    }
    let mut walk = c.clone();
    let mut starts = Vec::with_capacity(slots.div_ceil(piece_records) + 1);
    for slot in 0..slots {
        if slot % piece_records == 0 {
            starts.push(walk.at);
        }
        if skip(&mut walk).is_err() {
            return one_thread(c);
        }
    }
    starts.push(walk.at);
    let pieces: Vec<Parsed<Vec<T>>> = starts
        .par_windows(2)
        .enumerate()
        .map(|(i, bounds)| {
            let mut piece = c.piece(bounds[0], bounds[1]);
            let first = i * piece_records;
            let count = piece_records.min(slots - first);
            let mut out = Vec::with_capacity(count);
            for slot in first..first + count {
                out.push(decode(&mut piece, slot)?);
            }
            piece.finish()?;
            Ok(out)
        })
        .collect();
    let mut out = Vec::with_capacity(slots);
    for piece in pieces {
        out.append(&mut piece?);
    }
    walk.finish()?;
    Ok(out)
}

/// Reads slot `slot`'s id: empty exactly for a removed slot.
fn decode_id<'a>(c: &mut Cursor<'a>, slot: usize, removed: &SlotSet) -> Parsed<&'a str> {
    let at = c.offset();
    let id = c.text("an id")?;
    if id.is_empty() != removed.contains(slot) {
        let why = if id.is_empty() { "a live slot has an empty id" } else { "a removed slot has an id" };
        return fail("ids", at, format!("slot {slot}: {why}"));
    }
    Ok(id)
}

/// Steps over one metadata record ([`decode_metadata`]'s bytes).
fn skip_metadata(c: &mut Cursor<'_>) -> Parsed<()> {
    let pairs = c.count("a metadata record", 8)?;
    for _ in 0..pairs {
        c.skip_text("a metadata key")?;
        c.skip_text("a metadata value")?;
    }
    Ok(())
}

/// Steps over one payload record ([`decode_payload`]'s bytes).
fn skip_payload(c: &mut Cursor<'_>) -> Parsed<()> {
    let fields = c.count("a payload record", 6)?;
    for _ in 0..fields {
        c.skip_text("a field name")?;
        match c.u8("a field type")? {
            0 => c.skip_text("a string value")?,
            1 | 2 => {
                c.take(8, "a number")?;
            }
            3 => {
                c.u8("a bool value")?;
            }
            other => return fail(c.part, c.offset() - 1, format!("unknown field type {other}")),
        }
    }
    Ok(())
}

/// The order section's body: `slots` u64 keys, strictly increasing (a shard's slots are in the
/// order they were written).
pub(crate) fn decode_order(section: Section, c: &mut Cursor<'_>, slots: usize) -> Parsed<Vec<u64>> {
    if section.count != slots as u64 || section.length != slots as u64 * 8 {
        return fail(
            "order",
            section.offset,
            format!("{} keys in {} bytes where the config has {slots} slots", section.count, section.length),
        );
    }
    let mut keys = Vec::with_capacity(slots);
    for slot in 0..slots {
        let at = c.offset();
        let key = c.u64("an order key")?;
        if let Some(&previous) = keys.last()
            && key <= previous
        {
            return fail("order", at, format!("slot {slot}'s key {key} does not follow {previous}"));
        }
        keys.push(key);
    }
    c.finish()?;
    Ok(keys)
}

/// The order section's body for `keys`.
pub(crate) fn encode_order(keys: &[u64]) -> Vec<u8> {
    keys.iter().flat_map(|k| k.to_le_bytes()).collect()
}

/// Reads one metadata record ([`encode_metadata`]'s layout).
pub(crate) fn decode_metadata(c: &mut Cursor<'_>) -> Parsed<Metadata> {
    let pairs = c.count("a metadata record", 8)?;
    let mut map = Metadata::with_capacity(pairs);
    for _ in 0..pairs {
        let at = c.offset();
        let key = c.text("a metadata key")?;
        let value = c.text("a metadata value")?;
        if map.insert(key.to_string(), value.to_string()).is_some() {
            return fail(c.part, at, format!("key {key:?} appears twice in one record"));
        }
    }
    Ok(map)
}

/// Reads one payload record ([`encode_payload`]'s layout).
pub(crate) fn decode_payload(c: &mut Cursor<'_>) -> Parsed<Payload> {
    let fields = c.count("a payload record", 6)?;
    let mut map: Payload = HashMap::with_capacity(fields);
    for _ in 0..fields {
        let at = c.offset();
        let name = c.text("a field name")?;
        let value = match c.u8("a field type")? {
            0 => PayloadValue::String(c.text("a string value")?.to_string()),
            1 => PayloadValue::Integer(c.u64("an integer value")? as i64),
            2 => PayloadValue::Float(f64::from_bits(c.u64("a float value")?)),
            3 => match c.u8("a bool value")? {
                0 => PayloadValue::Bool(false),
                1 => PayloadValue::Bool(true),
                other => return fail(c.part, c.offset() - 1, format!("bool byte {other}")),
            },
            other => return fail(c.part, c.offset() - 1, format!("unknown field type {other}")),
        };
        if map.insert(name.to_string(), value).is_some() {
            return fail(c.part, at, format!("field {name:?} appears twice in one record"));
        }
    }
    Ok(map)
}

#[cfg(test)]
mod record_tests {
    use super::*;

    fn payload_section(records: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        for r in 0..records {
            let mut payload = Payload::new();
            payload.insert("n".into(), PayloadValue::Integer(r as i64));
            if r % 3 == 0 {
                payload.insert("s".into(), PayloadValue::String(format!("v{r}")));
            }
            if r % 4 == 1 {
                payload.insert("b".into(), PayloadValue::Bool(r % 8 == 1));
            }
            encode_payload(&mut bytes, &payload);
        }
        bytes
    }

    /// Where record `r` starts in `bytes`.
    fn record_start(bytes: &[u8], r: usize) -> usize {
        let mut c = Cursor::new("payload", bytes, 0);
        for _ in 0..r {
            skip_payload(&mut c).unwrap();
        }
        c.at
    }

    #[test]
    fn records_read_in_pieces_equal_records_read_on_one_thread_and_fail_at_the_same_first_error() {
        let records = 100;
        let good = payload_section(records);
        let mut cases: Vec<(String, Vec<u8>, usize)> = vec![("valid".into(), good.clone(), records)];
        // A field type no reader knows, in an early and a late record, and both at once: the
        // earlier one must be the error, wherever the pieces fall.
        for bad in [[40usize].as_slice(), &[95], &[12, 77]] {
            let mut bytes = good.clone();
            for &r in bad {
                // The first field's type: after the count, the name's length and its one byte.
                let at = record_start(&good, r) + 4 + 4 + 1;
                bytes[at] = 9;
            }
            cases.push((format!("bad type in {bad:?}"), bytes, records));
        }
        // A bool byte that is neither 0 nor 1 (skip steps over it, decode refuses it).
        let mut bytes = good.clone();
        let at = record_start(&bytes, 61) + 4;
        let mut c = Cursor::new("payload", &bytes[at..], at as u64);
        c.skip_text("").unwrap();
        let bool_at = at + c.at + 1;
        assert_eq!(bytes[bool_at - 1], 3, "record 61's first field is its bool");
        bytes[bool_at] = 7;
        cases.push(("bool byte 7".into(), bytes, records));
        // Bytes past the last record; a section cut short; fewer records than slots.
        let mut bytes = good.clone();
        bytes.extend_from_slice(&[0, 0]);
        cases.push(("trailing bytes".into(), bytes, records));
        cases.push(("truncated".into(), good[..good.len() - 3].to_vec(), records));
        cases.push(("more slots than records".into(), good.clone(), records + 1));
        for (name, bytes, slots) in &cases {
            let read = |piece| {
                let c = Cursor::new("payload", bytes, 4096);
                records_in_pieces(c, *slots, piece, skip_payload, |c, _| decode_payload(c))
            };
            let one = read(usize::MAX);
            for piece in [1, 7, 16, 99, 100] {
                assert_eq!(read(piece), one, "{name}, pieces of {piece}");
            }
            if name != "valid" {
                assert!(one.is_err(), "{name}");
            }
        }
    }
}
