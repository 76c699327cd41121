//! A collection file's bytes as the loader reads them: a read-only memory mapping (memmap2),
//! so an open reads each byte once, where it lies in the page cache, with no copy of the file
//! in the heap, and the CPU backend can search a file's rows where they lie
//! ([`crate::GpuContext::open_storage_mapped`]).
//!
//! A mapping sees the file as it is on disk, so the file must not change while it is mapped.
//! hive-gpu never writes a collection file in place (a save writes a new file and renames it
//! over the old one, which leaves an existing mapping on the old file's data), so this holds
//! unless another program writes or truncates the file itself: then a mapped read sees changed
//! bytes (the checksums of an open catch them) or, past a truncation, the process gets SIGBUS.
//! That is why a transient mapping (an open that copies the rows out) is safe to offer in a safe
//! function and a lasting one is `unsafe` with this contract.

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;

/// The bytes of a file: mapped where the system can map it, read into memory otherwise.
#[derive(Debug)]
pub(crate) enum Image {
    /// The file mapped read-only.
    Mapped(memmap2::Mmap),
    /// The file read into memory (an empty file, or a system that refused the mapping).
    Read(Vec<u8>),
}

impl Image {
    /// Maps the file at `path`; `populate` asks the kernel to fault every page in up front (an
    /// open that reads all of it at once: one call instead of a fault per few pages).
    pub(crate) fn open(path: &Path, populate: bool) -> Result<Self> {
        let io = super::io_error(path);
        let file = std::fs::File::open(path).map_err(&io)?;
        let bytes = file.metadata().map_err(&io)?.len();
        if bytes > 0 {
            let mut options = memmap2::MmapOptions::new();
            if populate {
                options.populate();
            }
            // SAFETY: the mapping is read-only and private to this `Image`; the file must not
            // be written or truncated while it is mapped, which hive-gpu itself never does (see
            // the module documentation for what another program doing so means).
            if let Ok(map) = unsafe { options.map(&file) } {
                return Ok(Self::Mapped(map));
            }
        }
        crate::memory::check(|| format!("reading {}", path.display()), bytes)?;
        std::fs::read(path).map(Self::Read).map_err(io)
    }

    /// The file's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::Mapped(map) => map,
            Self::Read(bytes) => bytes,
        }
    }
}

/// Rows that stay in a mapped collection file: the shared mapping and the byte range of the
/// rows in it, what [`crate::backend::RowStore::adopt_mapped`] takes (the CPU backend
/// searches them in place).
#[derive(Debug, Clone)]
pub struct MappedRows {
    image: Arc<Image>,
    range: std::ops::Range<usize>,
}

impl MappedRows {
    /// The bytes `range` of `image` (a range inside it).
    pub(crate) fn new(image: Arc<Image>, range: std::ops::Range<usize>) -> Option<Self> {
        (range.end <= image.bytes().len() && range.start <= range.end).then_some(Self { image, range })
    }

    /// The rows' bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.image.bytes()[self.range.clone()]
    }

    /// The first `len` bytes only (the rows a truncation keeps).
    pub(crate) fn truncated(&self, len: usize) -> Self {
        let end = self.range.start + len.min(self.range.len());
        Self { image: self.image.clone(), range: self.range.start..end }
    }
}
