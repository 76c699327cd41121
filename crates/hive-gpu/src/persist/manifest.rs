//! The manifest of a sharded collection (`docs/FORMAT.md`, "Sharded collections"): which shard
//! files make up the collection, how ids are routed to them, and the next write's order key.
//!
//! A sharded save writes every shard as a collection file of its own (format version 3, with
//! an order section) under a name derived from the manifest's path and a fresh generation
//! number, then replaces the manifest in one rename. The manifest names each shard file's
//! length and header checksum, so an open that finds a shard file of another save (a crash
//! between two saves, a file copied over) refuses it instead of mixing generations. The file
//! names are derived, never read from the manifest: a hostile manifest cannot point an open at
//! another path.
//!
//! [`parse`] trusts nothing: the file's length is fixed by its shard count before anything is
//! allocated, so the largest allocation a manifest can cause is a small multiple of its size.

use std::path::{Path, PathBuf};

use super::format::{FormatError, Parsed, checksum_matches, fail};
use super::log::SnapshotId;

/// The first 8 bytes of every manifest.
pub(crate) const MAGIC: [u8; 8] = *b"HIVEGPUS";
/// The manifest version this build writes and reads.
pub(crate) const VERSION: u32 = 1;
/// Bytes of the manifest's header.
const HEADER_BYTES: usize = 64;
/// Bytes of one shard's entry.
const ENTRY_BYTES: usize = 32;
/// The most shards a manifest may list: far beyond any machine's devices times a few logical
/// shards each, and small enough that a manifest is a few hundred KiB at most.
pub const MAX_SHARDS: usize = 4096;

/// One shard of a manifest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ShardEntry {
    /// Its routing weight (finite, positive): the share of ids it receives.
    pub(crate) weight: f64,
    /// The identity of its collection file (length and header checksum).
    pub(crate) file: SnapshotId,
    /// Live vectors it held when saved (for `hive-gpu info`; an open counts them again).
    pub(crate) vectors: u64,
}

/// A sharded collection's manifest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Manifest {
    /// Names this save's shard files (see [`shard_path`]).
    pub(crate) generation: u64,
    /// The order key the next write starts from: above every key a shard holds.
    pub(crate) next_order: u64,
    /// The routing hash's seed.
    pub(crate) seed: u64,
    /// The shards, in routing order.
    pub(crate) shards: Vec<ShardEntry>,
}

/// The file of shard `shard` of generation `generation` of the manifest at `manifest`:
/// `<manifest name>.shard-<generation, 16 hex digits>-<shard>`, in the manifest's directory.
pub(crate) fn shard_path(manifest: &Path, generation: u64, shard: usize) -> PathBuf {
    let mut name = manifest.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".shard-{generation:016x}-{shard}"));
    manifest.with_file_name(name)
}

/// The generation a file name of [`shard_path`]'s form has, for a manifest named `manifest`.
pub(crate) fn generation_of(manifest: &Path, file_name: &str) -> Option<u64> {
    let base = manifest.file_name()?.to_str()?;
    let rest = file_name.strip_prefix(base)?.strip_prefix(".shard-")?;
    let (generation, shard) = rest.split_once('-')?;
    if generation.len() != 16 || shard.is_empty() || !shard.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    u64::from_str_radix(generation, 16).ok()
}

/// The manifest's bytes.
pub(crate) fn encode(manifest: &Manifest) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_BYTES];
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&(manifest.shards.len() as u32).to_le_bytes());
    out[16..24].copy_from_slice(&manifest.generation.to_le_bytes());
    out[24..32].copy_from_slice(&manifest.next_order.to_le_bytes());
    out[32..40].copy_from_slice(&manifest.seed.to_le_bytes());
    let crc = crc32c::crc32c(&out[..60]);
    out[60..64].copy_from_slice(&crc.to_le_bytes());
    let table_start = out.len();
    for shard in &manifest.shards {
        out.extend_from_slice(&shard.weight.to_le_bytes());
        out.extend_from_slice(&shard.file.file_bytes.to_le_bytes());
        out.extend_from_slice(&shard.file.header_crc.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&shard.vectors.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out[table_start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn double(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Parses and checks a whole manifest.
pub(crate) fn parse(bytes: &[u8]) -> Parsed<Manifest> {
    if bytes.len() < HEADER_BYTES {
        return fail(
            "header",
            0,
            format!("{} bytes are too short for a sharded collection's manifest", bytes.len()),
        );
    }
    if bytes[0..8] != MAGIC {
        return fail(
            "header",
            0,
            format!("magic {:02x?} is not a sharded hive-gpu collection's ({MAGIC:02x?})", &bytes[0..8]),
        );
    }
    let version = word(bytes, 8);
    if version != VERSION {
        return fail(
            "header",
            8,
            format!(
                "manifest version {version}: this build reads version {VERSION} (a newer hive-gpu wrote it?)"
            ),
        );
    }
    if !checksum_matches(&bytes[..60], word(bytes, 60)) {
        return fail("header", 60, "header checksum mismatch");
    }
    if let Some(at) = bytes[40..60].iter().position(|&b| b != 0) {
        return fail("header", 40 + at as u64, "a reserved header byte is not zero");
    }
    let shards = word(bytes, 12) as usize;
    if shards == 0 || shards > MAX_SHARDS {
        return fail("header", 12, format!("{shards} shards: a manifest lists 1 to {MAX_SHARDS}"));
    }
    let expected = HEADER_BYTES + shards * ENTRY_BYTES + 4;
    if bytes.len() != expected {
        return fail(
            "header",
            12,
            format!(
                "{shards} shards need a manifest of {expected} bytes, the file has {} (truncated or extended)",
                bytes.len()
            ),
        );
    }
    let table = &bytes[HEADER_BYTES..expected - 4];
    if !checksum_matches(table, word(bytes, expected - 4)) {
        return fail("shard table", HEADER_BYTES as u64, "shard table checksum mismatch");
    }
    let mut entries = Vec::with_capacity(shards);
    for (i, entry) in table.chunks_exact(ENTRY_BYTES).enumerate() {
        let at = (HEADER_BYTES + i * ENTRY_BYTES) as u64;
        let weight = f64::from_bits(double(entry, 0));
        if !(weight.is_finite() && weight > 0.0) {
            return fail("shard table", at, format!("shard {i}'s weight {weight} is not a positive number"));
        }
        if word(entry, 20) != 0 {
            return fail("shard table", at + 20, format!("shard {i}'s reserved word is not zero"));
        }
        entries.push(ShardEntry {
            weight,
            file: SnapshotId { file_bytes: double(entry, 8), header_crc: word(entry, 16) },
            vectors: double(entry, 24),
        });
    }
    Ok(Manifest {
        generation: double(bytes, 16),
        next_order: double(bytes, 24),
        seed: double(bytes, 32),
        shards: entries,
    })
}

/// A sharded collection's manifest as [`inspect_manifest`] describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestInfo {
    /// The manifest version it was written in.
    pub version: u32,
    /// The save that wrote it: its shard files are named after it.
    pub generation: u64,
    /// The order key the collection's next write starts from.
    pub next_order: u64,
    /// Each shard's routing weight, in shard order.
    pub weights: Vec<f64>,
    /// Each shard's live vectors when it was saved.
    pub vectors: Vec<u64>,
    /// Each shard's collection file size in bytes.
    pub file_bytes: Vec<u64>,
}

/// Parses and checks a sharded collection's manifest (not its shard files) and describes it:
/// what `hive-gpu info` prints and the fuzz target exercises.
pub fn inspect_manifest(bytes: &[u8]) -> std::result::Result<ManifestInfo, FormatError> {
    let manifest = parse(bytes)?;
    Ok(ManifestInfo {
        version: VERSION,
        generation: manifest.generation,
        next_order: manifest.next_order,
        weights: manifest.shards.iter().map(|s| s.weight).collect(),
        vectors: manifest.shards.iter().map(|s| s.vectors).collect(),
        file_bytes: manifest.shards.iter().map(|s| s.file.file_bytes).collect(),
    })
}

/// Whether `bytes` start like a sharded collection's manifest (for tools that open either
/// kind of file).
pub fn is_manifest(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(shards: usize) -> Manifest {
        Manifest {
            generation: 0x0123_4567_89ab_cdef,
            next_order: 42,
            seed: 7,
            shards: (0..shards)
                .map(|i| ShardEntry {
                    weight: 1.0 + i as f64,
                    file: SnapshotId { file_bytes: 1000 + i as u64, header_crc: 0xdead_0000 + i as u32 },
                    vectors: 10 * i as u64,
                })
                .collect(),
        }
    }

    #[test]
    fn a_manifest_reads_back_as_written() {
        for shards in [1, 2, 7] {
            let manifest = sample(shards);
            assert_eq!(parse(&encode(&manifest)).expect("parses"), manifest);
        }
    }

    #[test]
    fn every_damaged_manifest_is_refused_by_part_and_offset() {
        let good = encode(&sample(3));
        let refused = |bytes: &[u8], part: &str, why: &str| {
            let e = parse(bytes).expect_err(why);
            assert_eq!(e.part, part, "{why}: {e}");
        };
        refused(&good[..10], "header", "too short");
        refused(&good[..good.len() - 1], "header", "truncated");
        let mut longer = good.clone();
        longer.push(0);
        refused(&longer, "header", "extended");
        for at in [0, 9, 13, 20, 45, 61] {
            let mut bad = good.clone();
            bad[at] ^= 1;
            refused(&bad, "header", &format!("header byte {at} flipped"));
        }
        for at in [64, 80, 100, good.len() - 2] {
            let mut bad = good.clone();
            bad[at] ^= 1;
            refused(&bad, "shard table", &format!("table byte {at} flipped"));
        }
        // Counts that would allocate: zero shards, more than the limit, a count the bytes
        // cannot hold.
        for count in [0u32, MAX_SHARDS as u32 + 1, u32::MAX, 4] {
            let mut bad = good.clone();
            bad[12..16].copy_from_slice(&count.to_le_bytes());
            let crc = crc32c::crc32c(&bad[..60]);
            bad[60..64].copy_from_slice(&crc.to_le_bytes());
            refused(&bad, "header", &format!("{count} shards"));
        }
        // Weights that route nothing or cannot be compared.
        for weight in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut manifest = sample(2);
            manifest.shards[1].weight = weight;
            refused(&encode(&manifest), "shard table", &format!("weight {weight}"));
        }
    }

    #[test]
    fn shard_file_names_are_derived_and_only_their_own_form_is_recognised() {
        let manifest = Path::new("/data/my.coll");
        let path = shard_path(manifest, 0xabc, 3);
        assert_eq!(path, Path::new("/data/my.coll.shard-0000000000000abc-3"));
        let name = path.file_name().and_then(|n| n.to_str()).expect("a name");
        assert_eq!(generation_of(manifest, name), Some(0xabc));
        for other in [
            "my.coll",
            "my.coll.shard-abc-3",
            "my.coll.shard-0000000000000abc-",
            "my.coll.shard-0000000000000abc-x",
            "other.shard-0000000000000abc-3",
            "my.coll.shard-0000000000000abc-3.tmp-1-0",
        ] {
            assert_eq!(generation_of(manifest, other), None, "{other}");
        }
    }
}
