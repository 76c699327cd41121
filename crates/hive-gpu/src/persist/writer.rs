//! The file a save writes: its body through direct I/O where the system allows it, else
//! through the page cache.
//!
//! Direct writes (Linux `O_DIRECT`) go from this process's memory to the disk without taking
//! a page of the page cache. A save writes a whole new file beside the old one, so through the
//! page cache it needs as many fresh pages as the file has bytes, and a machine whose fresh
//! pages are slow to come (a virtual machine whose host backs freed memory lazily) pays for
//! each: on the 2-core development VM, `dd` of 512 MiB into a new file took 2.2 s through the
//! page cache and 0.28-0.30 s with `oflag=direct` (docs/PERFORMANCE.md, persistence).
//!
//! The body goes through a second descriptor of the same file opened with `O_DIRECT`, in
//! aligned blocks from an aligned buffer; the last block is padded with zeros and the file cut
//! back to its length. The header (written last, over the zeros that held its room) goes
//! through the first, ordinary descriptor, whose `sync_all` then makes all of it durable (a
//! file's fsync flushes the device's cache for every write to it, direct ones included). A
//! system or file system that refuses `O_DIRECT` (tmpfs, other platforms) gets the buffered
//! writer of before; a save's result is the same bytes either way.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

/// Alignment of every direct write: its memory, its offset in the file and its length. 4 KiB
/// covers the logical block size of every disk Linux drives (512 or 4,096 bytes).
const BLOCK: usize = 4096;

/// A file being written from its start, in order, by a save.
pub(crate) struct SaveFile {
    /// The ordinary descriptor: the header, the final length, the sync.
    file: File,
    body: Body,
}

enum Body {
    /// Bytes gathered in an aligned buffer and written a full buffer at a time.
    Direct { file: File, buffer: AlignedBuffer, filled: usize, flushed: u64 },
    /// The page cache's writer, where direct writes are refused.
    Buffered(std::io::BufWriter<File>),
}

impl SaveFile {
    /// Creates `path` (which must not exist) for a save that buffers `buffer_bytes` (a
    /// multiple of the block; rounded up to one) between writes.
    pub(crate) fn create(path: &Path, buffer_bytes: usize, direct: bool) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
        let body = match direct.then(|| open_direct(path)).flatten() {
            Some(direct) => Body::Direct {
                file: direct,
                buffer: AlignedBuffer::new(buffer_bytes.next_multiple_of(BLOCK).max(BLOCK)),
                filled: 0,
                flushed: 0,
            },
            None => Body::Buffered(std::io::BufWriter::with_capacity(buffer_bytes, file.try_clone()?)),
        };
        Ok(Self { file, body })
    }

    /// Whether the body goes to the disk by direct writes.
    pub(crate) fn is_direct(&self) -> bool {
        matches!(self.body, Body::Direct { .. })
    }

    /// Appends `bytes`.
    pub(crate) fn write_all(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        match &mut self.body {
            Body::Buffered(writer) => writer.write_all(bytes),
            Body::Direct { file, buffer, filled, flushed } => {
                while !bytes.is_empty() {
                    let room = buffer.len() - *filled;
                    let take = room.min(bytes.len());
                    buffer.as_mut()[*filled..*filled + take].copy_from_slice(&bytes[..take]);
                    *filled += take;
                    bytes = &bytes[take..];
                    if *filled == buffer.len() {
                        write_direct(file, &buffer.as_mut()[..*filled], *flushed)?;
                        *flushed += *filled as u64;
                        *filled = 0;
                    }
                }
                Ok(())
            }
        }
    }

    /// The ordinary descriptor, to hint the kernel about pages written through the page cache
    /// (none are, for a direct body).
    pub(crate) fn cached(&self) -> Option<&File> {
        match &self.body {
            Body::Buffered(writer) => Some(writer.get_ref()),
            Body::Direct { .. } => None,
        }
    }

    /// Writes what is still buffered, cuts the file to the `length` bytes written, writes
    /// `header` over its first bytes, and hands back the ordinary descriptor for the sync.
    pub(crate) fn finish(mut self, length: u64, header: &[u8]) -> std::io::Result<File> {
        match self.body {
            Body::Buffered(writer) => {
                writer.into_inner().map_err(|e| e.into_error())?;
            }
            Body::Direct { file, mut buffer, filled, flushed } => {
                if filled > 0 {
                    // The last block padded with zeros, which the cut below takes off again.
                    let padded = filled.next_multiple_of(BLOCK);
                    buffer.as_mut()[filled..padded].fill(0);
                    write_direct(&file, &buffer.as_mut()[..padded], flushed)?;
                }
            }
        }
        self.file.set_len(length)?;
        self.file.seek(SeekFrom::Start(0))?;
        self.file.write_all(header)?;
        Ok(self.file)
    }
}

/// A second descriptor of `path` for direct writes; None where the system refuses them.
fn open_direct(path: &Path) -> Option<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        None
    }
}

/// One direct write of whole blocks at a block-aligned offset.
fn write_direct(file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    debug_assert!(bytes.len().is_multiple_of(BLOCK) && offset.is_multiple_of(BLOCK as u64));
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        // A short write would leave the rest unaligned; write_all_at goes on from where it
        // stopped, and a direct write the disk cannot take is an error the save reports.
        file.write_all_at(bytes, offset)
    }
    #[cfg(not(unix))]
    {
        let _ = (file, bytes, offset);
        Err(std::io::Error::other("direct writes are made on Linux only"))
    }
}

/// Heap bytes whose start is aligned to [`BLOCK`]: a vector a block longer than asked, used
/// from its first aligned byte (no allocator call of our own).
struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuffer {
    fn new(len: usize) -> Self {
        let storage = vec![0u8; len + BLOCK];
        let start = storage.as_ptr().align_offset(BLOCK);
        Self { storage, start, len }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_and_buffered_bodies_write_the_same_bytes_for_any_piece_sizes() {
        let dir = std::env::temp_dir().join(format!("hive-gpu-savefile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<u8> = (0..200_003u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for direct in [true, false] {
            // Pieces smaller than, equal to and larger than the buffer, and an odd tail.
            for pieces in [&[1usize, 4095, 4096, 8192, 70_000][..], &[200_003], &[3; 1]] {
                let path = dir.join(format!("f-{direct}-{}", pieces.len()));
                let _ = std::fs::remove_file(&path);
                let mut out = SaveFile::create(&path, 8192, direct).unwrap();
                let mut at = 0;
                for &size in pieces.iter().cycle() {
                    if at >= data.len() {
                        break;
                    }
                    let end = (at + size).min(data.len());
                    out.write_all(&data[at..end]).unwrap();
                    at = end;
                }
                let header = b"HEADER";
                let file = out.finish(data.len() as u64, header).unwrap();
                file.sync_all().unwrap();
                let mut want = data.clone();
                want[..header.len()].copy_from_slice(header);
                assert_eq!(std::fs::read(&path).unwrap(), want, "direct {direct}, pieces {pieces:?}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
