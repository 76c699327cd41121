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
//! aligned blocks from aligned buffers, written by a thread of its own while the caller fills
//! the next buffer (a write waits for the disk; written in line, the copies and the disk took
//! turns and the H100 machine's save fell from 95% to 68% of `dd`); the last block is padded
//! with zeros and the file cut back to its length. The header (written last, over the zeros that held its room) goes
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
    /// Bytes gathered in an aligned buffer, handed full to the writing thread.
    Direct(Direct),
    /// The page cache's writer, where direct writes are refused.
    Buffered(std::io::BufWriter<File>),
}

/// Buffers in flight between the caller and the writing thread: one filling, one writing, one
/// waiting, so neither side waits for the other while the disk keeps up.
const DIRECT_BUFFERS: usize = 3;

/// The direct body: the buffer being filled, and the writing thread with the buffers it holds.
struct Direct {
    buffer: AlignedBuffer,
    filled: usize,
    /// Bytes handed to the thread so far: the offset of the buffer being filled.
    flushed: u64,
    /// Full buffers to write, with their offsets; closed to end the thread.
    to_write: Option<std::sync::mpsc::SyncSender<(AlignedBuffer, usize, u64)>>,
    /// Buffers back from the thread once written, or the error that stopped it.
    written: std::sync::mpsc::Receiver<std::io::Result<AlignedBuffer>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Direct {
    fn start(file: File, buffer_bytes: usize) -> std::io::Result<Self> {
        let (to_write, queue) = std::sync::mpsc::sync_channel::<(AlignedBuffer, usize, u64)>(DIRECT_BUFFERS);
        let (back, written) = std::sync::mpsc::channel();
        for _ in 1..DIRECT_BUFFERS {
            let _ = back.send(Ok(AlignedBuffer::new(buffer_bytes)));
        }
        let thread = std::thread::Builder::new().name("hive-gpu-save".into()).spawn(move || {
            for (mut buffer, len, offset) in queue {
                let result = write_direct(&file, &buffer.as_mut()[..len], offset);
                let failed = result.is_err();
                if back.send(result.map(|()| buffer)).is_err() || failed {
                    return;
                }
            }
        })?;
        Ok(Self {
            buffer: AlignedBuffer::new(buffer_bytes),
            filled: 0,
            flushed: 0,
            to_write: Some(to_write),
            written,
            thread: Some(thread),
        })
    }

    /// Hands the filled buffer (`len` bytes of it, whole blocks) to the thread and takes an
    /// empty one back; the error of an earlier write if one failed.
    fn hand_over(&mut self, len: usize) -> std::io::Result<()> {
        let empty = match self.written.recv() {
            Ok(result) => result?,
            Err(_) => return Err(self.failure()),
        };
        let full = std::mem::replace(&mut self.buffer, empty);
        let sent = self.to_write.as_ref().is_some_and(|queue| queue.send((full, len, self.flushed)).is_ok());
        if !sent {
            return Err(self.failure());
        }
        self.flushed += len as u64;
        self.filled = 0;
        Ok(())
    }

    /// Why the thread stopped taking buffers: the write error it reported.
    fn failure(&mut self) -> std::io::Error {
        self.drain().err().unwrap_or_else(|| std::io::Error::other("the save's writing thread stopped"))
    }

    /// Waits for every write handed over; the first error if one failed.
    fn drain(&mut self) -> std::io::Result<()> {
        self.to_write = None;
        let mut outcome = Ok(());
        for result in self.written.iter() {
            if let (Err(e), Ok(())) = (result, &outcome) {
                outcome = Err(e);
            }
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            return Err(std::io::Error::other("the save's writing thread panicked"));
        }
        outcome
    }
}

impl Drop for Direct {
    /// A save that stops early still waits for its thread, so no write outlives it.
    fn drop(&mut self) {
        let _ = self.drain();
    }
}

impl SaveFile {
    /// Creates `path` (which must not exist) for a save that buffers `buffer_bytes` (a
    /// multiple of the block; rounded up to one) between writes.
    pub(crate) fn create(path: &Path, buffer_bytes: usize, direct: bool) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
        let block_bytes = buffer_bytes.next_multiple_of(BLOCK).max(BLOCK);
        // A system may accept the O_DIRECT open and refuse the writes (alignment above 4 KiB,
        // some FUSE or 9p mounts): one zero block written first proves them (the body's first
        // block and then the header go over it), and a refusal or a thread that cannot start
        // leaves the save on the page cache.
        let direct = direct
            .then(|| open_direct(path))
            .flatten()
            .filter(|fd| write_direct(fd, AlignedBuffer::new(BLOCK).as_mut(), 0).is_ok())
            .and_then(|fd| Direct::start(fd, block_bytes).ok());
        let body = match direct {
            Some(direct) => Body::Direct(direct),
            None => Body::Buffered(std::io::BufWriter::with_capacity(buffer_bytes, file.try_clone()?)),
        };
        Ok(Self { file, body })
    }

    /// Whether the body goes to the disk by direct writes.
    pub(crate) fn is_direct(&self) -> bool {
        matches!(self.body, Body::Direct(_))
    }

    /// Appends `bytes`.
    pub(crate) fn write_all(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        match &mut self.body {
            Body::Buffered(writer) => writer.write_all(bytes),
            Body::Direct(direct) => {
                while !bytes.is_empty() {
                    let filled = direct.filled;
                    let take = (direct.buffer.len() - filled).min(bytes.len());
                    direct.buffer.as_mut()[filled..filled + take].copy_from_slice(&bytes[..take]);
                    direct.filled += take;
                    bytes = &bytes[take..];
                    if direct.filled == direct.buffer.len() {
                        direct.hand_over(direct.filled)?;
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
            Body::Direct(_) => None,
        }
    }

    /// Writes what is still buffered, cuts the file to the `length` bytes written, writes
    /// `header` over its first bytes, and hands back the ordinary descriptor for the sync.
    pub(crate) fn finish(mut self, length: u64, header: &[u8]) -> std::io::Result<File> {
        match self.body {
            Body::Buffered(writer) => {
                writer.into_inner().map_err(|e| e.into_error())?;
            }
            Body::Direct(mut direct) => {
                let filled = direct.filled;
                if filled > 0 {
                    // The last block padded with zeros, which the cut below takes off again.
                    let padded = filled.next_multiple_of(BLOCK);
                    direct.buffer.as_mut()[filled..padded].fill(0);
                    direct.hand_over(padded)?;
                }
                direct.drain()?;
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
