//! How every reader takes its bytes: a regular file, opened so that opening cannot block, read
//! no further than the size it had when opened, through one fixed-size buffer, into an output
//! allocated once, after its size was checked against the file and the memory budget.

use std::fmt::Display;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Take};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use super::{invalid, io_error};
use crate::error::{HiveGpuError, Result};
use crate::memory;

/// The buffer every reader reads through: large enough that system calls cost nothing next to
/// decoding, small enough that it is no second copy of the file.
pub(super) const CHUNK: usize = 1 << 20;

/// Which memory budget a decoder's output must fit: this process's ([`memory::check`]) in every
/// public entry point, a fixed one in tests, so that refusals are tested without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MemoryBudget {
    /// What this process may still allocate, cgroup and rlimits included.
    Process,
    /// A fixed number of bytes.
    #[cfg(test)]
    Fixed(u64),
}

impl MemoryBudget {
    fn check(self, what: impl FnOnce() -> String, bytes: u64) -> Result<()> {
        match self {
            Self::Process => memory::check(what, bytes),
            #[cfg(test)]
            Self::Fixed(limit) => {
                let budget = memory::Budget { bytes: limit, limited_by: "budget fixed by a test".into() };
                memory::check_within(what, bytes, Some(budget))
            }
        }
    }
}

/// The most deflate can expand: 258 bytes (its longest match) from 2 bits (the shortest codes a
/// dynamic Huffman block can give a length and a distance), 1032 bytes per input byte; zlib's
/// documentation gives the same bound, and the gzip header and trailer only lower the real
/// ratio. A gzip stream of `n` bytes therefore inflates to at most `1032 * n` bytes, whatever
/// its header, its `ISIZE` trailer or the sizes inside claim: this bound and the memory budget
/// are the only caps trusted while inflating.
pub(super) const MAX_DEFLATE_RATIO: u64 = 1032;

/// `O_NONBLOCK`, so that opening a FIFO that has no writer returns at once instead of waiting
/// for one (it is refused right after, by the metadata of the opened handle). On a regular
/// file the flag changes nothing: reads of regular files never block. Written out instead of
/// taken from the libc crate, which this one constant does not justify; the values are the
/// kernels' ABI (Linux's asm-generic value on most architectures, its own on MIPS and SPARC).
#[cfg(all(
    any(target_os = "linux", target_os = "android"),
    not(any(
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "mips32r6",
        target_arch = "mips64r6",
        target_arch = "sparc",
        target_arch = "sparc64"
    ))
))]
const O_NONBLOCK: i32 = 0o4000;
#[cfg(all(
    any(target_os = "linux", target_os = "android"),
    any(target_arch = "mips", target_arch = "mips64", target_arch = "mips32r6", target_arch = "mips64r6")
))]
const O_NONBLOCK: i32 = 0x80;
#[cfg(all(
    any(target_os = "linux", target_os = "android"),
    any(target_arch = "sparc", target_arch = "sparc64")
))]
const O_NONBLOCK: i32 = 0x4000;
#[cfg(any(
    target_os = "macos",
    target_os = "ios",
    target_os = "freebsd",
    target_os = "netbsd",
    target_os = "openbsd",
    target_os = "dragonfly"
))]
const O_NONBLOCK: i32 = 0x0004;

/// Opens `path` for reading if it is a regular file, and returns it with its length.
///
/// The path is checked before it is opened, so a device whose `open` has side effects (a tape
/// that rewinds, a terminal that becomes the controlling one) is not even opened; the handle is
/// checked again after, because the path may have been replaced in between, and the length
/// that bounds every read is the opened handle's.
///
/// # Errors
/// [`HiveGpuError::Io`] when the file cannot be opened or is not a regular file (a directory,
/// a FIFO, a character or block device such as `/dev/zero`, a socket).
pub(super) fn open_regular(path: &Path) -> Result<(File, u64)> {
    let metadata = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    refuse_unless_regular(path, &metadata)?;
    let file = open_nonblocking(path).map_err(|e| io_error(path, e))?;
    let metadata = file.metadata().map_err(|e| io_error(path, e))?;
    refuse_unless_regular(path, &metadata)?;
    Ok((file, metadata.len()))
}

/// Opens `path` read-only with `O_NONBLOCK` where the platform has it.
pub(super) fn open_nonblocking(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "macos",
        target_os = "ios",
        target_os = "freebsd",
        target_os = "netbsd",
        target_os = "openbsd",
        target_os = "dragonfly"
    ))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(O_NONBLOCK);
    }
    options.open(path)
}

fn refuse_unless_regular(path: &Path, metadata: &Metadata) -> Result<()> {
    if metadata.is_file() {
        return Ok(());
    }
    let (kind, what) = describe(metadata);
    let message = format!("not a regular file but {what}; vectors are read only from regular files");
    Err(io_error(path, io::Error::new(kind, message)))
}

/// The error kind and a name for what a non-regular file is.
fn describe(metadata: &Metadata) -> (io::ErrorKind, &'static str) {
    let file_type = metadata.file_type();
    if file_type.is_dir() {
        return (io::ErrorKind::IsADirectory, "a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let name = if file_type.is_fifo() {
            Some("a FIFO (named pipe)")
        } else if file_type.is_char_device() {
            Some("a character device")
        } else if file_type.is_block_device() {
            Some("a block device")
        } else if file_type.is_socket() {
            Some("a socket")
        } else {
            None
        };
        if let Some(name) = name {
            return (io::ErrorKind::InvalidInput, name);
        }
    }
    (io::ErrorKind::InvalidInput, "a special file")
}

/// A vector of `rows * dim` values allocated once, after `memory` agreed to its size. The
/// callers have already checked that the file's length can hold that many values.
///
/// # Errors
/// [`HiveGpuError::OutOfMemory`], naming the file and the shape, when the budget is smaller
/// or the allocator refuses.
pub(super) fn allocate<T>(
    path: &Path,
    format: &'static str,
    rows: u64,
    dim: u64,
    budget: MemoryBudget,
) -> Result<Vec<T>> {
    let what = || {
        format!("decoding {} ({format}: {rows} x {dim} values of {} bytes)", path.display(), size_of::<T>())
    };
    let count = rows.saturating_mul(dim);
    let bytes = count.saturating_mul(size_of::<T>() as u64);
    budget.check(what, bytes)?;
    let refused = || HiveGpuError::OutOfMemory {
        what: what(),
        requested: bytes,
        available: memory::available_bytes().unwrap_or(0),
        limited_by: "allocator, which refused the request".into(),
    };
    let count = usize::try_from(count).map_err(|_| refused())?;
    let mut data = Vec::new();
    data.try_reserve_exact(count).map_err(|_| refused())?;
    Ok(data)
}

/// At most `len` bytes of a stream, read through one buffer, with the position of every
/// byte known for the error messages.
pub(super) struct Source<'a, R> {
    path: &'a Path,
    format: &'static str,
    inner: BufReader<Take<R>>,
    /// The bytes the stream may hold: the file's size when it was opened, or for gzip what
    /// the compressed size can inflate to at most.
    len: u64,
    /// The bytes consumed so far.
    pos: u64,
    /// The compressed size when `inner` inflates, for the error messages.
    compressed: Option<u64>,
}

impl<'a, R: Read> Source<'a, R> {
    /// The first `len` bytes of `reader`: a file that grows while it is read is read only as
    /// far as it reached when it was opened.
    pub(super) fn new(path: &'a Path, format: &'static str, reader: R, len: u64) -> Self {
        // A small file needs no megabyte of buffer (the fuzz targets decode tiny inputs).
        let capacity = usize::try_from(len).map_or(CHUNK, |len| len.min(CHUNK));
        let inner = BufReader::with_capacity(capacity, reader.take(len));
        Self { path, format, inner, len, pos: 0, compressed: None }
    }
}

impl<'a, R: Read> Source<'a, MultiGzDecoder<R>> {
    /// What the gzip stream `reader`, `compressed` bytes long, inflates to. The inflated length
    /// is not capped here: what `compressed` bytes can inflate to is bounded by deflate itself
    /// ([`MAX_DEFLATE_RATIO`]), and the decoder checks its sizes against that bound before it
    /// allocates. Reading is not stopped at the bound either, so the gzip trailer is always
    /// read and its checksum verified.
    pub(super) fn gunzip(path: &'a Path, format: &'static str, reader: R, compressed: u64) -> Self {
        let inflated = compressed.saturating_mul(MAX_DEFLATE_RATIO);
        let capacity = usize::try_from(inflated).map_or(CHUNK, |len| len.min(CHUNK));
        let inner = BufReader::with_capacity(capacity, MultiGzDecoder::new(reader).take(u64::MAX));
        Self { path, format, inner, len: inflated, pos: 0, compressed: Some(compressed) }
    }
}

impl<'a, R: Read> Source<'a, R> {
    /// The bytes the stream may hold.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// The bytes consumed so far.
    pub(super) fn pos(&self) -> u64 {
        self.pos
    }

    /// The file's name.
    pub(super) fn path(&self) -> &'a Path {
        self.path
    }

    /// The compressed size when the stream inflates gzip.
    pub(super) fn compressed(&self) -> Option<u64> {
        self.compressed
    }

    /// A malformed-file error for this stream's file and format.
    pub(super) fn invalid(&self, reason: impl Into<String>) -> HiveGpuError {
        invalid(self.path, self.format, reason)
    }

    /// The buffered bytes, reading more when none are; empty at the end of the stream.
    fn fill(&mut self) -> io::Result<&[u8]> {
        // A signal may interrupt the read before it returns anything: ask again.
        while let Err(e) = self.inner.fill_buf() {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        self.inner.fill_buf()
    }

    fn consume(&mut self, n: usize) {
        self.inner.consume(n);
        self.pos += n as u64;
    }

    /// Fills `buf` as far as the stream goes; returns how many bytes it got.
    pub(super) fn read_upto(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            let available = self.fill()?;
            if available.is_empty() {
                break;
            }
            let n = available.len().min(buf.len() - filled);
            buf[filled..filled + n].copy_from_slice(&available[..n]);
            self.consume(n);
            filled += n;
        }
        Ok(filled)
    }

    /// Fills `buf`, or fails with [`io::ErrorKind::UnexpectedEof`].
    pub(super) fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if self.read_upto(buf)? < buf.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    /// Decodes `count` values of `N` bytes each straight from the buffer into `out`.
    pub(super) fn read_into<T, const N: usize>(
        &mut self,
        count: u64,
        out: &mut Vec<T>,
        convert: impl Fn([u8; N]) -> T,
    ) -> io::Result<()> {
        let mut left = count;
        while left > 0 {
            let available = self.fill()?;
            let whole = (available.len() / N).min(usize::try_from(left).unwrap_or(usize::MAX));
            if whole == 0 {
                // A value straddles the end of the buffer (or the stream ends inside it).
                let mut one = [0u8; N];
                self.read_exact(&mut one)?;
                out.push(convert(one));
                left -= 1;
            } else {
                out.extend(available[..whole * N].as_chunks::<N>().0.iter().map(|b| convert(*b)));
                self.consume(whole * N);
                left -= whole as u64;
            }
        }
        Ok(())
    }

    /// Reads past `n` bytes without keeping them.
    pub(super) fn skip(&mut self, n: u64) -> io::Result<()> {
        let mut left = n;
        while left > 0 {
            let available = self.fill()?;
            if available.is_empty() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let step = available.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            self.consume(step);
            left -= step as u64;
        }
        Ok(())
    }

    /// Whether the stream has no byte left. For a gzip stream this reads its trailer, so the
    /// checksum and length in it are verified.
    pub(super) fn at_end(&mut self) -> io::Result<bool> {
        Ok(self.fill()?.is_empty())
    }

    /// The error for a read that failed `inside` some part of the file ("record 3", "the
    /// header"): an early end is a truncated file, a corrupt gzip stream is a malformed file,
    /// anything else is the operating system's failure.
    pub(super) fn error(&self, e: io::Error, inside: impl Display) -> HiveGpuError {
        let pos = self.pos;
        match (e.kind(), self.compressed) {
            (io::ErrorKind::UnexpectedEof, None) => invalid(
                self.path,
                self.format,
                format!(
                    "truncated: the data ends at byte {pos}, inside {inside}, short of the {} bytes \
                     the file had when it was opened (did it shrink while being read?)",
                    self.len
                ),
            ),
            (io::ErrorKind::UnexpectedEof, Some(compressed)) => invalid(
                self.path,
                self.format,
                format!(
                    "truncated: the gzip stream ({compressed} bytes) inflates to only {pos} bytes, \
                     ending inside {inside}"
                ),
            ),
            (_, Some(_)) => invalid(self.path, self.format, format!("cannot gunzip: {e}")),
            (_, None) => io_error(self.path, e),
        }
    }
}
