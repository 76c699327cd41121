//! The write-ahead log's file format (`docs/FORMAT.md`, "The write-ahead log"): a 64-byte
//! header naming the snapshot the log continues, then one record per acknowledged write.
//!
//! [`scan`] reads a log image and trusts nothing in it, like the snapshot parser: a record is
//! taken only when its length fits in the bytes that are there and its CRC-32C matches. The
//! first record that fails either test is the torn tail of an append a crash interrupted; it
//! and everything after it are dropped, never decoded. A record whose checksum matches but
//! whose contents do not decode, or whose sequence number is not the next one, was not torn
//! (a tear cannot forge a checksum): that is a damaged or foreign file and an error naming
//! the record's offset.

use super::format::{self, Cursor, Parsed, decode_metadata, decode_payload, encode_id, fail};
use crate::payload::Payload;
use crate::types::Metadata;

/// The first 8 bytes of every log file.
pub(crate) const LOG_MAGIC: [u8; 8] = *b"HIVEGPUL";
/// The log format version this build writes and reads.
pub(crate) const LOG_VERSION: u32 = 1;
/// Bytes of the log header.
pub(crate) const LOG_HEADER_BYTES: usize = 64;
/// Bytes before each record's body: its length (u64) and checksum (u32).
pub(crate) const RECORD_HEADER_BYTES: usize = 12;

/// Which snapshot a log continues: the snapshot file's length and the checksum of its header
/// (which covers the section table, whose entries carry every section's checksum, so it
/// stands for the file's whole contents).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SnapshotId {
    pub(crate) file_bytes: u64,
    pub(crate) header_crc: u32,
}

impl SnapshotId {
    /// The identity of a snapshot image (its first 64 bytes must be a header).
    pub(crate) fn of_header(header: &[u8], file_bytes: u64) -> Self {
        let crc = u32::from_le_bytes([header[60], header[61], header[62], header[63]]);
        Self { file_bytes, header_crc: crc }
    }
}

/// Operation codes of a record.
const UPSERT: u8 = 1;
const REMOVE: u8 = 2;
const CLEAR: u8 = 3;

/// The header of a fresh log continuing `base`.
pub(crate) fn encode_header(base: SnapshotId) -> [u8; LOG_HEADER_BYTES] {
    let mut h = [0u8; LOG_HEADER_BYTES];
    h[0..8].copy_from_slice(&LOG_MAGIC);
    h[8..12].copy_from_slice(&LOG_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(LOG_HEADER_BYTES as u32).to_le_bytes());
    h[16..24].copy_from_slice(&base.file_bytes.to_le_bytes());
    h[24..28].copy_from_slice(&base.header_crc.to_le_bytes());
    let crc = crc32c::crc32c(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A record's body, before its sequence number is known (the log assigns it when the write
/// is appended, under the collection's lock): the operation and its arguments, and their
/// checksum so far.
#[derive(Debug)]
pub(crate) struct PendingRecord {
    body: Vec<u8>,
    /// CRC-32C of `body` alone, computed outside every lock; [`PendingRecord::write_to`]
    /// combines it with the log's salt in time logarithmic in the body's length (a short body
    /// is checksummed again instead: [`COMBINE_MIN_BYTES`]).
    body_crc: u32,
}

impl PendingRecord {
    fn new(body: Vec<u8>) -> Self {
        // A short body is checksummed whole under the lock instead (`COMBINE_MIN_BYTES`).
        let body_crc = if body.len() < COMBINE_MIN_BYTES { 0 } else { crc32c::crc32c(&body) };
        Self { body, body_crc }
    }
}

impl PendingRecord {
    /// An upsert of `count` vectors, each given by `vector(i)` as (id, values, metadata,
    /// payload).
    pub(crate) fn upsert<'a>(
        count: usize,
        dim: usize,
        vector: impl Fn(usize) -> (&'a str, &'a [f32], &'a Metadata, &'a Payload),
    ) -> Self {
        let mut body = Vec::with_capacity(5 + count * (8 + 4 * dim + 8));
        body.push(UPSERT);
        body.extend_from_slice(&(count as u32).to_le_bytes());
        for i in 0..count {
            let (id, values, metadata, payload) = vector(i);
            encode_id(&mut body, id);
            if cfg!(target_endian = "little") {
                body.extend_from_slice(bytemuck::cast_slice(values));
            } else {
                values.iter().for_each(|v| body.extend_from_slice(&v.to_le_bytes()));
            }
            format::encode_metadata(&mut body, metadata);
            format::encode_payload(&mut body, payload);
        }
        Self::new(body)
    }

    /// A removal of `ids`.
    pub(crate) fn remove<S: AsRef<str>>(ids: &[S]) -> Self {
        let mut body = vec![REMOVE];
        body.extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            encode_id(&mut body, id.as_ref());
        }
        Self::new(body)
    }

    /// Removal of every vector.
    pub(crate) fn clear() -> Self {
        Self::new(vec![CLEAR])
    }

    /// Appends the record, numbered `sequence`, to `out`, for the log whose header checksum
    /// is `salt`.
    pub(crate) fn write_to(&self, sequence: u64, salt: u32, out: &mut Vec<u8>) {
        let length = (self.body.len() + 8) as u64;
        let crc = if self.body.len() < COMBINE_MIN_BYTES {
            crc32c::crc32c_append(record_crc_seed(salt), &self.body)
        } else {
            crc32c::crc32c_combine(record_crc_seed(salt), self.body_crc, self.body.len())
        };
        let crc = crc32c::crc32c_append(crc, &sequence.to_le_bytes());
        out.extend_from_slice(&length.to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&self.body);
        out.extend_from_slice(&sequence.to_le_bytes());
    }
}

/// Bodies shorter than this are checksummed again under the lock rather than combined: the
/// combination costs microseconds whatever the length (matrix squarings, one per bit of it),
/// the checksum itself about as much per 64 KiB. Combining every single-vector upsert's
/// 0.5 KiB body was 29% of a durable writer's time and halved 8 writers' rate on the
/// development VM (`perf`, docs/PERFORMANCE.md, durable writes).
const COMBINE_MIN_BYTES: usize = 64 << 10;

/// The checksum a record's body continues: that of its log header's own checksum. A record
/// is thereby bound to its log file: after a checkpoint, a block of an older log that a
/// file system exposes where the new log's tail was (possible after a power cut) fails the
/// check and reads as a torn tail, never as a write of the new log.
fn record_crc_seed(salt: u32) -> u32 {
    crc32c::crc32c(&salt.to_le_bytes())
}

/// The checksum of a log header (its bytes 60..64), what its records are salted with.
pub(crate) fn header_salt(header: &[u8; LOG_HEADER_BYTES]) -> u32 {
    u32::from_le_bytes([header[60], header[61], header[62], header[63]])
}

/// One decoded record.
#[derive(Debug)]
pub(crate) enum Change {
    /// Vectors to upsert, in order.
    Upsert(super::Vectors),
    /// Ids to remove.
    Remove(Vec<String>),
    /// Everything removed.
    Clear,
}

/// What [`scan`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scanned {
    /// The snapshot the log continues.
    pub(crate) base: SnapshotId,
    /// Whole records read.
    pub(crate) records: u64,
    /// Bytes of the header and the whole records: where the next append goes.
    pub(crate) valid_bytes: u64,
}

/// Reads only the header of a log image: the snapshot it continues.
pub(crate) fn scan_header(image: &[u8]) -> Parsed<SnapshotId> {
    let mut c = Cursor::new("log header", image, 0);
    let magic = c.take(8, "the magic number").or_else(|_| {
        fail("log header", 0, format!("{} bytes are too short for a log header", image.len()))
    })?;
    if magic != LOG_MAGIC {
        return fail(
            "log header",
            0,
            format!("magic {magic:02x?} is not a hive-gpu log's ({LOG_MAGIC:02x?})"),
        );
    }
    let version = c.u32("the log version")?;
    if version != LOG_VERSION {
        return fail(
            "log header",
            8,
            format!(
                "log version {version}: this build reads version {LOG_VERSION} (a newer hive-gpu wrote it?)"
            ),
        );
    }
    let header = c.take(LOG_HEADER_BYTES - 12, "the log header")?;
    let full = &image[..LOG_HEADER_BYTES];
    let crc = u32::from_le_bytes([header[48], header[49], header[50], header[51]]);
    if !format::checksum_matches(&full[..60], crc) {
        return fail("log header", 60, "log header checksum mismatch");
    }
    let bytes = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if bytes as usize != LOG_HEADER_BYTES || full[28..60].iter().any(|&b| b != 0) {
        return fail(
            "log header",
            12,
            format!("header size {bytes} or reserved bytes unknown to log version 1"),
        );
    }
    let mut file_bytes = [0u8; 8];
    file_bytes.copy_from_slice(&full[16..24]);
    Ok(SnapshotId {
        file_bytes: u64::from_le_bytes(file_bytes),
        header_crc: u32::from_le_bytes([full[24], full[25], full[26], full[27]]),
    })
}

/// Reads a log image whose collection has `dim`-component vectors, handing each whole record
/// to `apply` (with its byte offset) in order. A torn tail ends the scan; see the module
/// documentation for what is an error instead.
pub(crate) fn scan<E>(
    image: &[u8],
    dim: usize,
    mut apply: impl FnMut(u64, Change) -> Result<(), E>,
) -> Result<Parsed<Scanned>, E> {
    let base = match scan_header(image) {
        Ok(base) => base,
        Err(e) => return Ok(Err(e)),
    };
    let salt = u32::from_le_bytes([image[60], image[61], image[62], image[63]]);
    let mut at = LOG_HEADER_BYTES;
    let mut records = 0u64;
    loop {
        let rest = &image[at..];
        if rest.len() < RECORD_HEADER_BYTES {
            break;
        }
        let mut length = [0u8; 8];
        length.copy_from_slice(&rest[..8]);
        let length = u64::from_le_bytes(length);
        let crc = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]);
        let body_room = (rest.len() - RECORD_HEADER_BYTES) as u64;
        if length < 9 || length > body_room {
            break;
        }
        let body = &rest[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + length as usize];
        if !(cfg!(fuzzing) || crc32c::crc32c_append(record_crc_seed(salt), body) == crc) {
            break;
        }
        let offset = at as u64;
        let change = match decode(body, dim, offset + RECORD_HEADER_BYTES as u64, records + 1) {
            Ok(change) => change,
            Err(e) => return Ok(Err(e)),
        };
        apply(offset, change)?;
        records += 1;
        at += RECORD_HEADER_BYTES + length as usize;
    }
    Ok(Ok(Scanned { base, records, valid_bytes: at as u64 }))
}

/// Decodes one record body found at `offset`, which must carry sequence number `expected`.
fn decode(body: &[u8], dim: usize, offset: u64, expected: u64) -> Parsed<Change> {
    let (ops, sequence) = body.split_at(body.len() - 8);
    let mut number = [0u8; 8];
    number.copy_from_slice(sequence);
    let sequence = u64::from_le_bytes(number);
    if sequence != expected {
        return fail(
            "log record",
            offset,
            format!("sequence number {sequence} where record {expected} was due"),
        );
    }
    let mut c = Cursor::new("log record", ops, offset);
    let change = match c.u8("an operation")? {
        UPSERT => {
            // A vector needs its id's length, its values and two empty payload records.
            let count = c.count("an upsert's vector count", 12 + 4 * dim)?;
            let mut vectors = super::Vectors::with_capacity(count, dim);
            for _ in 0..count {
                let id = c.text("an id")?;
                let values = c.take(4 * dim, "a vector's values")?;
                let metadata = decode_metadata(&mut c)?;
                let payload = decode_payload(&mut c)?;
                vectors.push(id, values, metadata, payload);
            }
            Change::Upsert(vectors)
        }
        REMOVE => {
            let count = c.count("a removal's id count", 4)?;
            let mut ids = Vec::with_capacity(count);
            for _ in 0..count {
                ids.push(c.text("an id")?.to_string());
            }
            Change::Remove(ids)
        }
        CLEAR => Change::Clear,
        other => return fail("log record", offset, format!("unknown operation {other}")),
    };
    c.finish()?;
    Ok(change)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_of(records: &[PendingRecord]) -> Vec<u8> {
        let header = encode_header(SnapshotId { file_bytes: 1234, header_crc: 99 });
        let mut image = header.to_vec();
        for (i, r) in records.iter().enumerate() {
            r.write_to(i as u64 + 1, header_salt(&header), &mut image);
        }
        image
    }

    fn count(image: &[u8]) -> Parsed<Scanned> {
        scan::<()>(image, 2, |_, _| Ok(())).expect("apply never fails here")
    }

    #[test]
    fn a_record_checksums_the_same_appended_or_combined_on_either_side_of_the_threshold() {
        let salt = 0x1234_5678;
        for len in [0, 1, 517, COMBINE_MIN_BYTES - 1, COMBINE_MIN_BYTES, COMBINE_MIN_BYTES + 13] {
            let body: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let record = PendingRecord::new(body.clone());
            let mut out = Vec::new();
            record.write_to(5, salt, &mut out);
            let expected = crc32c::crc32c_append(
                crc32c::crc32c_append(record_crc_seed(salt), &body),
                &5u64.to_le_bytes(),
            );
            assert_eq!(u32::from_le_bytes(out[8..12].try_into().unwrap()), expected, "body of {len} bytes");
        }
    }

    #[test]
    fn every_cut_of_the_last_record_is_a_torn_tail_never_a_record() {
        let empty = Metadata::new();
        let payload = Payload::new();
        let records = [
            PendingRecord::upsert(1, 2, |_| ("a", &[1.0, 2.0][..], &empty, &payload)),
            PendingRecord::remove(&["a"]),
            PendingRecord::clear(),
            PendingRecord::upsert(1, 2, |_| ("bb", &[3.0, 4.0][..], &empty, &payload)),
        ];
        let image = log_of(&records);
        let whole = count(&image).expect("a whole log");
        assert_eq!((whole.records, whole.valid_bytes), (4, image.len() as u64));
        let mut prefix = log_of(&records[..3]).len();
        for cut in prefix..image.len() {
            let torn = count(&image[..cut]).expect("a torn tail is no error");
            assert_eq!((torn.records, torn.valid_bytes), (3, prefix as u64), "cut at {cut}");
        }
        // A flipped byte in the last record is a tear too (its checksum fails).
        let mut flipped = image.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(count(&flipped).unwrap().records, 3);
        // So are records of another log (another base): a stale block is never a record.
        let mut other = encode_header(SnapshotId { file_bytes: 1234, header_crc: 100 }).to_vec();
        other.extend_from_slice(&image[LOG_HEADER_BYTES..]);
        assert_eq!(count(&other).unwrap().records, 0);
        prefix = LOG_HEADER_BYTES;
        assert_eq!(count(&image[..prefix]).unwrap().records, 0);
    }

    #[test]
    fn a_record_out_of_sequence_is_an_error_not_a_tear() {
        let header = encode_header(SnapshotId::default());
        let mut image = header.to_vec();
        PendingRecord::clear().write_to(1, header_salt(&header), &mut image);
        PendingRecord::clear().write_to(3, header_salt(&header), &mut image);
        let error = count(&image).expect_err("record 3 after record 1");
        assert!(error.reason.contains("sequence number 3"), "{error}");
    }
}
