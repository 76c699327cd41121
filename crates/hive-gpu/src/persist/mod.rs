//! Saving a collection to one file and opening it again
//! ([`crate::GpuVectorStorage::save`], [`crate::GpuContext::open_storage`]), and reading a
//! file's description ([`inspect`], [`inspect_file`]). The format is specified in
//! `docs/FORMAT.md`.
//!
//! A save never leaves a torn file where the collection's file was: it writes a new file next
//! to it, syncs it, renames it over the old one and syncs the directory, so a crash at any
//! moment leaves the previous file or the new one (`tests/persistence.rs` kills a saving
//! process at many points to prove it). An open reads the file, checks every byte of it
//! ([`format::parse`]) and loads the live vectors through the same validation as any add.

pub(crate) mod durable;
pub(crate) mod format;
pub(crate) mod image;
pub(crate) mod log;
pub(crate) mod manifest;
pub(crate) mod payload_index;
mod writer;

pub use durable::{Durability, DurableOptions, LogStats};
pub use format::FormatError;
pub(crate) use image::Image;
pub use image::MappedRows;
pub use manifest::{MAX_SHARDS, ManifestInfo, inspect_manifest, is_manifest};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::format::{ALIGN, Kind, Section};
use self::log::SnapshotId;
use crate::collection::{Batch, Collection};
use crate::error::{HiveGpuError, Result};
use crate::payload::Payload;
use crate::types::{Metadata, StorageConfig};

/// Rows read from the row store per step of a save: bounds its host copy (64 Ki rows of 128
/// f32 are 32 MiB) while keeping each device read large.
const SAVE_ROWS: usize = 1 << 16;

/// Bytes buffered before each write to the file.
const WRITE_BUFFER: usize = 8 << 20;

/// A piece of a section this large is checksummed in parallel with its write.
const PARALLEL_CHECKSUM_BYTES: usize = 1 << 20;

/// What a collection file is called in errors.
pub(crate) const FORMAT_NAME: &str = "hive-gpu collection";

pub(crate) fn io_error(path: &Path) -> impl Fn(std::io::Error) -> HiveGpuError + '_ {
    move |source| HiveGpuError::Io { path: path.to_path_buf(), source }
}

/// A write error inside a section, before [`Sections::section`] names the file (it reports
/// the failed write with the path itself).
fn sink(source: std::io::Error) -> HiveGpuError {
    HiveGpuError::Io { path: PathBuf::new(), source }
}

/// A file next to `path`, named after it and this process, that no other save uses.
pub(crate) fn temporary_path(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
    path.with_file_name(name)
}

/// How far a long save or open has come: called with the vectors done so far and their total.
pub type Progress<'a> = &'a mut (dyn FnMut(u64, u64) + Send);

/// Writes `collection` to `path`, replacing any file there only once the new one is complete
/// and on disk. Returns the new file's identity (what a write-ahead log names as its base).
/// `progress` hears of the vectors as they are written.
pub(crate) fn save(collection: &Collection, path: &Path, progress: Progress<'_>) -> Result<SnapshotId> {
    if path.file_name().is_none() {
        return Err(HiveGpuError::InvalidArgument(format!("{} names no file to save to", path.display())));
    }
    let temporary = temporary_path(path);
    // On the library's pool: the checksums run in parallel under the collection's lock.
    let written =
        crate::exec::run(|| write_file(collection, &temporary, progress)).and_then(|id| id).and_then(|id| {
            std::fs::rename(&temporary, path).map_err(io_error(path))?;
            sync_directory_of(path)?;
            Ok(id)
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Makes a rename into `path`'s directory durable: on Unix the directory itself is fsynced
/// (until then a crash may forget the rename). Windows cannot open a directory as a file, and
/// NTFS journals its metadata, so there the rename stands as it is.
pub(crate) fn sync_directory_of(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_error(dir))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// Starts the disk's writeback of bytes `offset..offset + len` of `file` without waiting for
/// it (Linux `sync_file_range`), so that the disk writes a save's first pieces while the next
/// ones are prepared, and the fsync that ends the save waits for the last ones only. A hint:
/// its failure changes nothing (that fsync still reports any write error).
fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
        // SAFETY: sync_file_range reads and writes no memory of this process; the descriptor
        // is borrowed from `file`, open for the whole call.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Appends sections to a file, each at a 64-byte boundary, with its checksum.
struct Sections {
    started: std::time::Instant,
    file: writer::SaveFile,
    at: u64,
    sections: Vec<Section>,
}

impl Sections {
    fn raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)?;
        self.at += bytes.len() as u64;
        Ok(())
    }

    /// Writes one section whose body `fill` produces through `write`.
    fn section(
        &mut self,
        kind: Kind,
        count: usize,
        fill: impl FnOnce(&mut dyn FnMut(&[u8]) -> std::io::Result<()>) -> Result<()>,
        path: &Path,
    ) -> Result<()> {
        let pad = (self.at as usize).next_multiple_of(ALIGN) - self.at as usize;
        self.raw(&[0u8; ALIGN][..pad]).map_err(io_error(path))?;
        let offset = self.at;
        let mut crc = 0u32;
        let mut failed = None;
        let file = &mut self.file;
        let mut write = |bytes: &[u8]| -> std::io::Result<()> {
            // A large piece is checksummed on the other cores while this one writes it.
            let (piece, result) = if bytes.len() >= PARALLEL_CHECKSUM_BYTES {
                rayon::join(|| format::checksum(bytes), || file.write_all(bytes))
            } else {
                (crc32c::crc32c(bytes), file.write_all(bytes))
            };
            crc = crc32c::crc32c_combine(crc, piece, bytes.len());
            if let Some(cached) =
                file.cached().filter(|_| result.is_ok() && bytes.len() >= PARALLEL_CHECKSUM_BYTES)
            {
                start_writeback(cached, self.at, bytes.len() as u64);
            }
            self.at += bytes.len() as u64;
            if let Err(e) = &result {
                failed = Some(e.kind());
            }
            result
        };
        let filled = fill(&mut write);
        if let Some(kind) = failed {
            return Err(io_error(path)(std::io::Error::from(kind)));
        }
        filled?;
        if crate::backend::profiling() {
            eprintln!(
                "hive-gpu profile (save): {} section written at {:.3} s",
                kind.name(),
                self.started.elapsed().as_secs_f64()
            );
        }
        self.sections.push(Section {
            kind,
            version: 1,
            offset,
            length: self.at - offset,
            count: count as u64,
            crc,
        });
        Ok(())
    }
}

fn write_file(collection: &Collection, path: &Path, progress: Progress<'_>) -> Result<SnapshotId> {
    let io = io_error(path);
    let file = writer::SaveFile::create(path, WRITE_BUFFER, true).map_err(&io)?;
    let direct = file.is_direct();
    let config = *collection.config();
    let slots = collection.slots();
    let mut out = Sections { started: std::time::Instant::now(), file, at: 0, sections: Vec::new() };
    // Zeros hold the room of the header and table: both depend on the sections' offsets and
    // checksums, so they are written over these bytes once every section is out.
    let index = collection.index();
    let order = collection.orders();
    let fields = payload_index::encode(collection.payload_index(), collection.removed());
    let optional =
        usize::from(index.is_some()) + usize::from(order.is_some()) + usize::from(fields.is_some());
    out.raw(&vec![0u8; format::bodies_start(Kind::REQUIRED + optional)]).map_err(&io)?;
    out.section(Kind::Config, 1, |w| w(&format::encode_config(&config, slots)).map_err(sink), path)?;
    out.section(Kind::Vectors, slots, |w| write_vectors(collection, w, progress), path)?;
    out.section(
        Kind::Removed,
        slots,
        |w| {
            let words = collection.removed().words();
            // No bit past the last slot (the reader refuses one): the set's words may be longer.
            let word = |i: usize| {
                let w = words.get(i).copied().unwrap_or(0);
                let valid = slots.saturating_sub(i * 32).min(32);
                if valid == 32 { w } else { w & ((1u32 << valid) - 1) }
            };
            let bytes: Vec<u8> =
                (0..crate::slots::SlotSet::words_for(slots)).flat_map(|i| word(i).to_le_bytes()).collect();
            w(&bytes).map_err(sink)
        },
        path,
    )?;
    out.section(
        Kind::Ids,
        slots,
        |w| records(slots, w, |slot, buf| format::encode_id(buf, entry_id(collection, slot))),
        path,
    )?;
    out.section(
        Kind::Metadata,
        slots,
        |w| {
            records(slots, w, |slot, buf| match collection.entry(slot) {
                Some((_, metadata, _)) => format::encode_metadata(buf, metadata),
                None => format::encode_metadata(buf, &Metadata::new()),
            })
        },
        path,
    )?;
    out.section(
        Kind::Payload,
        slots,
        |w| {
            records(slots, w, |slot, buf| match collection.entry(slot) {
                Some((_, _, payload)) => format::encode_payload(buf, payload),
                None => format::encode_payload(buf, &Payload::new()),
            })
        },
        path,
    )?;
    if let Some((body, count)) = &fields {
        out.section(Kind::PayloadIndex, *count, |w| w(body).map_err(sink), path)?;
    }
    if let Some(index) = index {
        let body = format::encode_index(
            index.spec(),
            index.centroids(),
            index.lists(),
            index.trained.training_vectors,
            index.trained.iterations,
            index.stored_quantizer().as_ref(),
            collection.removed(),
        );
        out.section(Kind::Index, index.nlist(), |w| w(&body).map_err(sink), path)?;
    }
    if let Some(order) = order {
        out.section(Kind::Order, slots, |w| w(&format::encode_order(order)).map_err(sink), path)?;
    }
    let (total, out_started) = (out.at, out.started);
    let header = format::encode_header(&out.sections, total);
    let file = out.file.finish(total, &header).map_err(&io)?;
    file.sync_all().map_err(&io)?;
    if crate::backend::profiling() {
        let how = if direct { "direct writes" } else { "through the page cache" };
        eprintln!("hive-gpu profile (save): synced at {:.3} s ({how})", out_started.elapsed().as_secs_f64());
    }
    Ok(SnapshotId::of_header(&header, total))
}

fn entry_id(collection: &Collection, slot: usize) -> &str {
    collection.entry(slot).map_or("", |(id, _, _)| id.as_str())
}

/// Writes one record per slot, encoded by `encode` into a buffer flushed every megabyte.
fn records(
    slots: usize,
    write: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    mut encode: impl FnMut(usize, &mut Vec<u8>),
) -> Result<()> {
    let mut buffer = Vec::with_capacity(1 << 20);
    for slot in 0..slots {
        encode(slot, &mut buffer);
        if buffer.len() >= 1 << 20 {
            write(&buffer).map_err(sink)?;
            buffer.clear();
        }
    }
    write(&buffer).map_err(sink)
}

/// Every slot's stored values as the file stores them, read from the row store in large steps
/// ([`crate::backend::RowStore::read_stored`]: a CPU store's own memory, a GPU's downloads).
fn write_vectors(
    collection: &Collection,
    write: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    progress: Progress<'_>,
) -> Result<()> {
    let slots = collection.slots();
    let precision = collection.config().precision;
    for start in (0..slots).step_by(SAVE_ROWS) {
        let count = SAVE_ROWS.min(slots - start);
        collection.rows().read_stored(start, count, precision, &mut |bytes| write(bytes).map_err(sink))?;
        progress((start + count) as u64, slots as u64);
    }
    Ok(())
}

/// Vectors with their ids and payloads, as one batch for [`Collection::upsert`]: a parsed
/// file's live vectors, or a logged upsert.
#[derive(Debug, Default)]
pub(crate) struct Vectors {
    ids: Vec<String>,
    values: Vec<f32>,
    metadata: Vec<Metadata>,
    payloads: Vec<Payload>,
}

impl Vectors {
    /// Room for `count` vectors of `dim` components (the caller has checked that its input
    /// holds that many).
    pub(crate) fn with_capacity(count: usize, dim: usize) -> Self {
        Self {
            ids: Vec::with_capacity(count),
            values: Vec::with_capacity(count * dim),
            metadata: Vec::with_capacity(count),
            payloads: Vec::with_capacity(count),
        }
    }

    /// Appends a vector whose values are little-endian f32 bytes.
    pub(crate) fn push(&mut self, id: &str, values: &[u8], metadata: Metadata, payload: Payload) {
        self.ids.push(id.to_string());
        self.values.extend(values.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        self.metadata.push(metadata);
        self.payloads.push(payload);
    }

    /// Appends every vector of `other`.
    pub(crate) fn append(&mut self, other: Vectors) {
        self.ids.extend(other.ids);
        self.values.extend(other.values);
        self.metadata.extend(other.metadata);
        self.payloads.extend(other.payloads);
    }

    /// The ids, in order.
    pub(crate) fn ids(&self) -> &[String] {
        &self.ids
    }
}

impl Batch for Vectors {
    fn len(&self) -> usize {
        self.ids.len()
    }
    fn id(&self, i: usize) -> &str {
        &self.ids[i]
    }
    fn values(&self, i: usize, dim: usize) -> &[f32] {
        &self.values[i * dim..(i + 1) * dim]
    }
    fn metadata(&self, i: usize) -> &Metadata {
        &self.metadata[i]
    }
    fn payload(&self, i: usize) -> &Payload {
        &self.payloads[i]
    }
    fn payload_bytes(&self) -> usize {
        self.metadata.iter().zip(&self.payloads).map(|(m, p)| crate::collection::payload_bytes(m, p)).sum()
    }
    fn flat_values(&self) -> Option<&[f32]> {
        Some(&self.values)
    }
}

/// A collection file mapped and checked from end to end: what an open restores a collection
/// from.
pub(crate) struct Checked<'a> {
    snapshot: format::Snapshot<'a>,
    image: &'a Arc<Image>,
    /// The file's identity (what a write-ahead log names as its base).
    pub(crate) id: SnapshotId,
}

impl Checked<'_> {
    /// The collection's configuration.
    pub(crate) fn config(&self) -> StorageConfig {
        self.snapshot.config
    }

    /// The file's contents for [`Collection::restore`]; with `keep_mapped`, its rows also as
    /// a mapping that may outlive the open (for a row store that searches them in place).
    pub(crate) fn stored(&mut self, keep_mapped: bool) -> crate::collection::Stored<'_> {
        let snapshot = &mut self.snapshot;
        let mapped = keep_mapped
            .then(|| snapshot.sections.iter().find(|s| s.kind == Kind::Vectors))
            .flatten()
            .and_then(|s| {
                MappedRows::new(self.image.clone(), s.offset as usize..(s.offset + s.length) as usize)
            });
        crate::collection::Stored {
            ids: &snapshot.ids,
            metadata: &mut snapshot.metadata,
            payloads: &mut snapshot.payloads,
            removed: &snapshot.removed,
            order: snapshot.order.as_deref(),
            payload_index: snapshot.payload_index.take(),
            rows: snapshot.vectors,
            mapped,
        }
    }

    /// The file's index, if it has one.
    pub(crate) fn index(&self) -> Option<&format::StoredIndex> {
        self.snapshot.index.as_ref()
    }

    /// Slots in the file, removed ones included.
    pub(crate) fn slots(&self) -> usize {
        self.snapshot.slots
    }

    /// The file's removed slots.
    pub(crate) fn removed(&self) -> &crate::slots::SlotSet {
        &self.snapshot.removed
    }
}

/// Maps the collection file at `path`, checks all of it ([`format::parse`], in parallel on the
/// library's pool) and hands it to `restore`. `keep_mapped` says that the mapping may outlive
/// this call (rows searched in place): then its pages are not all faulted in up front, so a
/// file larger than memory maps.
pub(crate) fn with_checked<R>(
    path: &Path,
    keep_mapped: bool,
    restore: impl FnOnce(&mut Checked<'_>) -> Result<R>,
) -> Result<R> {
    let started = std::time::Instant::now();
    let phase = |what: &str| {
        if crate::backend::profiling() {
            eprintln!("hive-gpu profile (open): {what} at {:.3} s", started.elapsed().as_secs_f64());
        }
    };
    let image = Arc::new(Image::open(path, !keep_mapped)?);
    phase("mapped");
    let bytes = image.bytes();
    let snapshot = crate::exec::run(|| format::parse(bytes))?.map_err(|e| HiveGpuError::InvalidFormat {
        path: path.to_path_buf(),
        format: FORMAT_NAME,
        reason: e.to_string(),
    })?;
    phase("checked");
    let id = SnapshotId::of_header(bytes, bytes.len() as u64);
    let restored = restore(&mut Checked { snapshot, image: &image, id });
    phase("restored");
    restored
}

/// A collection file's live vectors, in slot order (the order ties go by), with their ids.
#[derive(Debug, Clone)]
pub struct StoredVectors {
    /// The collection's configuration.
    pub config: StorageConfig,
    /// Each vector's id, in the rows' order.
    pub ids: Vec<String>,
    /// The vectors as f32 (f16 storage widened exactly), row after row.
    pub vectors: crate::io::Matrix,
}

/// Reads the live vectors of the collection file at `path`, checked end to end as
/// [`crate::GpuContext::open_storage`] checks it, without putting them in a collection: to
/// export a collection, or to measure a search of it against a brute force over its rows.
pub fn read_vectors(path: impl AsRef<Path>) -> Result<StoredVectors> {
    with_checked(path.as_ref(), false, |file| {
        let snapshot = &file.snapshot;
        let dim = snapshot.config.dimension;
        let live: Vec<usize> = (0..snapshot.slots).filter(|&s| !snapshot.removed.contains(s)).collect();
        crate::memory::check(
            || format!("reading {} vectors of {}", live.len(), path.as_ref().display()),
            (live.len() * dim * 4) as u64,
        )?;
        let mut data = Vec::with_capacity(live.len() * dim);
        let mut row = Vec::with_capacity(dim);
        for &slot in &live {
            snapshot.row(slot, &mut row);
            data.extend_from_slice(&row);
        }
        Ok(StoredVectors {
            config: snapshot.config,
            ids: live.iter().map(|&s| snapshot.ids[s].to_string()).collect(),
            vectors: crate::io::Matrix { rows: live.len(), dim, data },
        })
    })
}

/// One section of a collection file, as [`inspect`] describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionInfo {
    /// What it holds ("config", "ids", "vectors", "removed", "metadata", "payload").
    pub name: &'static str,
    /// Its layout version.
    pub version: u32,
    /// Byte offset of its body in the file.
    pub offset: u64,
    /// Bytes of its body.
    pub length: u64,
    /// Items in it (slots, or 1 for the config).
    pub count: u64,
    /// CRC-32C of its body.
    pub crc: u32,
}

/// A collection file's header and sections, checked from end to end.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    /// The format version it was written in.
    pub format_version: u32,
    /// Its length in bytes.
    pub file_bytes: u64,
    /// The collection's configuration.
    pub config: StorageConfig,
    /// Slots, removed ones included.
    pub slots: usize,
    /// Live vectors.
    pub live: usize,
    /// Its sections, in table order.
    pub sections: Vec<SectionInfo>,
    /// The index saved with it, if any.
    pub index: Option<crate::IndexSpec>,
}

/// Parses and checks a whole collection file image (every checksum and record, as an open
/// does) and describes it. This is what the fuzz target exercises.
pub fn inspect(image: &[u8]) -> std::result::Result<FileInfo, FormatError> {
    let snapshot = format::parse(image)?;
    if let Some((section, body)) = snapshot.payload_index {
        let records = |s: usize| Some((&snapshot.metadata[s], &snapshot.payloads[s]));
        payload_index::decode(section, body, snapshot.slots, &snapshot.removed, records)?;
    }
    // What an open refuses, a description refuses too: an id on two live slots. (An open finds
    // it while building its id map, so the parse itself does not hash every id twice.)
    let mut first_slot: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(snapshot.slots - snapshot.removed.count());
    for (slot, id) in snapshot.ids.iter().enumerate() {
        if snapshot.removed.contains(slot) {
            continue;
        }
        if let Some(first) = first_slot.insert(id, slot) {
            let at = snapshot.sections.iter().find(|s| s.kind == Kind::Ids).map_or(0, |s| s.offset);
            return format::fail(
                "ids",
                at,
                format!("id {id:?} is stored twice, in slots {first} and {slot}"),
            );
        }
    }
    Ok(FileInfo {
        format_version: snapshot.version,
        index: snapshot.index.as_ref().map(|i| i.spec),
        file_bytes: image.len() as u64,
        config: snapshot.config,
        slots: snapshot.slots,
        live: snapshot.slots - snapshot.removed.count(),
        sections: snapshot
            .sections
            .iter()
            .map(|s| SectionInfo {
                name: s.kind.name(),
                version: s.version,
                offset: s.offset,
                length: s.length,
                count: s.count,
                crc: s.crc,
            })
            .collect(),
    })
}

/// [`inspect`] of the file at `path`.
pub fn inspect_file(path: impl AsRef<Path>) -> Result<FileInfo> {
    let path = path.as_ref();
    let image = Image::open(path, true)?;
    crate::exec::run(|| inspect(image.bytes()))?.map_err(|e| HiveGpuError::InvalidFormat {
        path: path.to_path_buf(),
        format: FORMAT_NAME,
        reason: e.to_string(),
    })
}

/// The identity of the collection file at `path` (its length and header checksum: what a
/// write-ahead log names as its base), read from its first 64 bytes alone.
pub(crate) fn snapshot_id(path: &Path) -> Result<SnapshotId> {
    use std::io::Read;
    let io = io_error(path);
    let mut file = std::fs::File::open(path).map_err(&io)?;
    let bytes = file.metadata().map_err(&io)?.len();
    let mut header = [0u8; format::HEADER_BYTES];
    file.read_exact(&mut header).map_err(&io)?;
    Ok(SnapshotId::of_header(&header, bytes))
}

/// The whole file at `path`, within the process's memory budget.
pub(crate) fn read_image(path: &Path) -> Result<Vec<u8>> {
    let io = io_error(path);
    let bytes = std::fs::metadata(path).map_err(&io)?.len();
    crate::memory::check(|| format!("reading {}", path.display()), bytes)?;
    std::fs::read(path).map_err(&io)
}
