//! Readers (and a few writers) for the vector files of ANN benchmarks: TEXMEX fvecs, ivecs and
//! bvecs, NumPy `.npy`, and IDX (MNIST, Fashion-MNIST), gzipped or not.
//!
//! Every reader opens only regular files (a FIFO, a device such as `/dev/zero` or a directory is
//! refused at once, and opening cannot block), reads no further than the size the file had
//! when it was opened, and decodes through a fixed buffer straight into its output. The output
//! is allocated once, after its size was checked against what the file's length can hold and
//! against the memory this process may still take ([`HiveGpuError::OutOfMemory`]); a header
//! alone never decides an allocation. A malformed file is reported as
//! [`HiveGpuError::InvalidFormat`] with the record or byte offset where it went wrong.

use std::io::Read;
use std::path::Path;

use crate::error::{HiveGpuError, Result};
use source::MemoryBudget;

mod idx;
mod npy;
mod source;
mod texmex;

pub use idx::read_idx;
pub use npy::read_npy;
pub use texmex::{parse_fvecs, parse_ivecs, read_bvecs, read_fvecs, read_ivecs, write_fvecs, write_ivecs};

/// Row-major matrix of f32 read from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    /// Number of vectors.
    pub rows: usize,
    /// Components per vector.
    pub dim: usize,
    /// The components, row after row; `data.len() == rows * dim`.
    pub data: Vec<f32>,
}

impl Matrix {
    /// The components of vector `i`.
    ///
    /// # Panics
    /// If `i >= rows` (like slice indexing).
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
}

/// Row-major matrix of i32 (ground truth ids).
#[derive(Debug, Clone, PartialEq)]
pub struct IdMatrix {
    /// Number of rows (one per query).
    pub rows: usize,
    /// Ids per row.
    pub dim: usize,
    /// The ids, row after row; `data.len() == rows * dim`.
    pub data: Vec<i32>,
}

impl IdMatrix {
    /// The ids of row `i`.
    ///
    /// # Panics
    /// If `i >= rows` (like slice indexing).
    pub fn row(&self, i: usize) -> &[i32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
}

/// The formats of vector files: what [`read_vectors`] tells from a file name, and what
/// [`decode_vectors`] is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VectorFormat {
    /// TEXMEX `.fvecs`: records of float32.
    Fvecs,
    /// TEXMEX `.bvecs`: records of uint8, widened to f32.
    Bvecs,
    /// NumPy `.npy` (see [`read_npy`]).
    Npy,
    /// IDX (see [`read_idx`]), inflated first when the name ends in `.gz` or the content
    /// starts with the gzip magic.
    Idx,
}

/// Names the formats [`read_vectors`] accepts, for its error message.
const ACCEPTED_FORMATS: &str = ".fvecs, .bvecs, .npy, or IDX (a name containing \"idx\" or \
                                ending in \"-ubyte\", optionally followed by .gz)";

/// Reads a matrix of vectors, picking the reader from the file name: `.fvecs`, `.bvecs`,
/// `.npy`, and IDX for names containing `idx` or ending in `-ubyte` (either optionally
/// followed by `.gz`). The match ignores case.
///
/// # Errors
/// [`HiveGpuError::InvalidArgument`] when the name matches none of these formats, otherwise
/// whatever the chosen reader reports.
pub fn read_vectors(path: &Path) -> Result<Matrix> {
    match format_of(path) {
        Some(VectorFormat::Fvecs) => read_fvecs(path),
        Some(VectorFormat::Bvecs) => read_bvecs(path),
        Some(VectorFormat::Npy) => read_npy(path),
        Some(VectorFormat::Idx) => read_idx(path),
        None => Err(HiveGpuError::InvalidArgument(format!(
            "cannot tell the vector format of {} from its name; accepted: {ACCEPTED_FORMATS}",
            path.display()
        ))),
    }
}

/// Decodes a vector file of `format` from a stream of `len` bytes, as the `read_*` functions
/// decode a file `len` bytes long: nothing past `len` bytes is read, the output is allocated
/// once and never beyond what `len` bytes can hold (and, for gzip, inflate to) or the memory
/// budget allows, and a stream that ends before `len` bytes is a truncated file. `name` names
/// the data in errors and, for IDX, a name ending in `.gz` means gzip.
///
/// # Errors
/// As the reader of `format` ([`read_fvecs`], [`read_bvecs`], [`read_npy`], [`read_idx`]);
/// [`HiveGpuError::Io`] when `reader` fails.
pub fn decode_vectors(format: VectorFormat, name: &Path, reader: impl Read, len: u64) -> Result<Matrix> {
    match format {
        VectorFormat::Fvecs => texmex::decode_fvecs(name, reader, len, MemoryBudget::Process),
        VectorFormat::Bvecs => texmex::decode_bvecs(name, reader, len, MemoryBudget::Process),
        VectorFormat::Npy => npy::decode_npy(name, reader, len, MemoryBudget::Process),
        VectorFormat::Idx => idx::decode_idx(name, reader, len, MemoryBudget::Process),
    }
}

/// Decodes an `.ivecs` file from a stream of `len` bytes, as [`decode_vectors`] decodes the
/// other formats.
///
/// # Errors
/// As [`read_ivecs`]; [`HiveGpuError::Io`] when `reader` fails.
pub fn decode_ivecs(name: &Path, reader: impl Read, len: u64) -> Result<IdMatrix> {
    texmex::decode_ivecs_with(name, reader, len, MemoryBudget::Process)
}

fn format_of(path: &Path) -> Option<VectorFormat> {
    let name = path.file_name()?.to_string_lossy().to_lowercase();
    if name.ends_with(".fvecs") {
        Some(VectorFormat::Fvecs)
    } else if name.ends_with(".bvecs") {
        Some(VectorFormat::Bvecs)
    } else if name.ends_with(".npy") {
        Some(VectorFormat::Npy)
    } else {
        let stem = name.strip_suffix(".gz").unwrap_or(&name);
        (stem.contains("idx") || stem.ends_with("-ubyte")).then_some(VectorFormat::Idx)
    }
}

fn io_error(path: &Path, source: std::io::Error) -> HiveGpuError {
    HiveGpuError::Io { path: path.to_path_buf(), source }
}

fn invalid(path: &Path, format: &'static str, reason: impl Into<String>) -> HiveGpuError {
    HiveGpuError::InvalidFormat { path: path.to_path_buf(), format, reason: reason.into() }
}

/// Helpers shared by the tests of every format.
#[cfg(test)]
mod test_support {
    use std::fmt::Debug;
    use std::path::{Path, PathBuf};

    use crate::error::{HiveGpuError, Result};

    /// A directory of its own for one test, removed when dropped.
    pub(super) struct TempDir(PathBuf);

    impl TempDir {
        pub(super) fn new(test: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("hive-gpu-io-{}-{test}", std::process::id()));
            // A leftover from an earlier run with the same pid must not leak into this one.
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create the test's temp dir");
            Self(dir)
        }

        pub(super) fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }

        pub(super) fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
            let path = self.path(name);
            std::fs::write(&path, bytes).expect("write a test file");
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The reason of an `InvalidFormat` error for `format`; fails the test on anything else.
    pub(super) fn invalid_reason<T: Debug>(result: Result<T>, format: &str) -> String {
        match result {
            Err(HiveGpuError::InvalidFormat { format: got, reason, .. }) if got == format => reason,
            other => panic!("expected an InvalidFormat error for {format}, got {other:?}"),
        }
    }

    /// A fvecs file of the given rows.
    pub(super) fn fvecs_bytes(rows: &[&[f32]]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for row in rows {
            bytes.extend_from_slice(&(row.len() as i32).to_le_bytes());
            for x in *row {
                bytes.extend_from_slice(&x.to_le_bytes());
            }
        }
        bytes
    }

    /// Runs `f` on a thread of its own and returns its result, or None when it has not
    /// answered within `seconds`: a reader that blocks fails its test instead of hanging it.
    pub(super) fn within<T: Send + 'static>(
        seconds: u64,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(seconds)).ok()
    }

    /// A reader that hands out at most `step` bytes per call and is interrupted by a signal
    /// before every other call, as pipes and slow disks do: values straddle every read.
    pub(super) struct Trickle<'a> {
        pub(super) data: &'a [u8],
        pub(super) step: usize,
        pub(super) interrupt: bool,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.interrupt = !self.interrupt;
            if self.interrupt {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            let n = buf.len().min(self.step).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// Counts the bytes a reader has handed out.
    pub(super) struct Counting<R> {
        pub(super) inner: R,
        pub(super) count: std::rc::Rc<std::cell::Cell<u64>>,
    }

    impl<R: std::io::Read> std::io::Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.count.set(self.count.get() + n as u64);
            Ok(n)
        }
    }

    /// Asserts `path` is mentioned by the error's message.
    pub(super) fn assert_names_path(err: &HiveGpuError, path: &Path) {
        let message = err.to_string();
        assert!(
            message.contains(&path.display().to_string()),
            "{message:?} does not name {}",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::test_support::{TempDir, Trickle, assert_names_path, fvecs_bytes, within};
    use super::*;

    #[test]
    fn matrix_row_slices_one_vector() {
        let m = Matrix { rows: 2, dim: 3, data: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0] };
        assert_eq!(m.row(0), &[1.0, 2.0, 3.0]);
        assert_eq!(m.row(1), &[4.0, 5.0, 6.0]);
    }

    #[test]
    fn id_matrix_row_slices_one_row() {
        let m = IdMatrix { rows: 3, dim: 2, data: vec![1, 2, 3, 4, 5, 6] };
        assert_eq!(m.row(2), &[5, 6]);
    }

    #[test]
    fn format_of_recognises_names() {
        let cases = [
            ("base.fvecs", Some(VectorFormat::Fvecs)),
            ("dir.npy/BASE.FVECS", Some(VectorFormat::Fvecs)),
            ("bigann_base.bvecs", Some(VectorFormat::Bvecs)),
            ("embeddings.npy", Some(VectorFormat::Npy)),
            ("train-images-idx3-ubyte", Some(VectorFormat::Idx)),
            ("train-images-idx3-ubyte.gz", Some(VectorFormat::Idx)),
            ("t10k-labels-idx1-ubyte.gz", Some(VectorFormat::Idx)),
            ("images-ubyte", Some(VectorFormat::Idx)),
            ("digits.idx", Some(VectorFormat::Idx)),
            ("groundtruth.ivecs", None),
            ("vectors.csv", None),
            ("base.fvecs.gz", None),
            ("noextension", None),
        ];
        for (name, expected) in cases {
            assert_eq!(format_of(Path::new(name)), expected, "{name}");
        }
    }

    #[test]
    fn read_vectors_dispatches_on_the_name() {
        let dir = TempDir::new("read_vectors_dispatches_on_the_name");
        let expected = Matrix { rows: 2, dim: 2, data: vec![1.0, 2.0, 3.0, 4.0] };

        let fvecs = dir.write("a.fvecs", &fvecs_bytes(&[&[1.0, 2.0], &[3.0, 4.0]]));
        assert_eq!(read_vectors(&fvecs).expect("fvecs"), expected);

        let mut bvecs = Vec::new();
        for row in [[1u8, 2], [3, 4]] {
            bvecs.extend_from_slice(&2i32.to_le_bytes());
            bvecs.extend_from_slice(&row);
        }
        let bvecs = dir.write("a.bvecs", &bvecs);
        assert_eq!(read_vectors(&bvecs).expect("bvecs"), expected);

        let header = "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }";
        let mut npy = b"\x93NUMPY\x01\x00".to_vec();
        npy.extend_from_slice(&(header.len() as u16).to_le_bytes());
        npy.extend_from_slice(header.as_bytes());
        npy.extend_from_slice(&[1, 2, 3, 4]);
        let npy = dir.write("a.npy", &npy);
        assert_eq!(read_vectors(&npy).expect("npy"), expected);

        let mut idx = vec![0, 0, 0x08, 3];
        for d in [2u32, 1, 2] {
            idx.extend_from_slice(&d.to_be_bytes());
        }
        idx.extend_from_slice(&[1, 2, 3, 4]);
        let idx = dir.write("train-images-idx3-ubyte", &idx);
        assert_eq!(read_vectors(&idx).expect("idx"), expected);
    }

    #[test]
    fn read_vectors_rejects_unknown_extension() {
        let dir = TempDir::new("read_vectors_rejects_unknown_extension");
        let path = dir.write("vectors.csv", b"1,2,3\n");
        let err = read_vectors(&path).expect_err("csv is not a vector format");
        assert!(matches!(err, HiveGpuError::InvalidArgument(_)), "{err:?}");
        assert_names_path(&err, &path);
        let message = err.to_string();
        for format in [".fvecs", ".bvecs", ".npy", "IDX"] {
            assert!(message.contains(format), "{message:?} does not list {format}");
        }
    }

    #[test]
    fn read_vectors_reports_missing_file_as_io() {
        let dir = TempDir::new("read_vectors_reports_missing_file_as_io");
        let path = dir.path("absent.fvecs");
        let err = read_vectors(&path).expect_err("the file does not exist");
        match &err {
            HiveGpuError::Io { path: p, source } => {
                assert_eq!(p, &path);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected an Io error, got {other:?}"),
        }
    }

    /// A file reader, returning the shape it read.
    type Reader = fn(&Path) -> Result<(usize, usize)>;

    /// Every file reader, by name.
    fn every_reader() -> Vec<(&'static str, Reader)> {
        vec![
            ("read_fvecs", |p| read_fvecs(p).map(|m| (m.rows, m.dim))),
            ("read_ivecs", |p| read_ivecs(p).map(|m| (m.rows, m.dim))),
            ("read_bvecs", |p| read_bvecs(p).map(|m| (m.rows, m.dim))),
            ("read_npy", |p| read_npy(p).map(|m| (m.rows, m.dim))),
            ("read_idx", |p| read_idx(p).map(|m| (m.rows, m.dim))),
            ("read_vectors", |p| read_vectors(p).map(|m| (m.rows, m.dim))),
        ]
    }

    /// Asserts that every reader refuses `path` as "not a regular file but {kind}", within a
    /// few seconds each (a reader that blocks or reads without end fails instead of hanging).
    fn assert_every_reader_refuses(path: &Path, kind: &str) {
        for (name, reader) in every_reader() {
            if name == "read_vectors" && format_of(path).is_none() {
                continue; // refused by its name before it is opened
            }
            let owned = path.to_path_buf();
            let Some(result) = within(5, move || reader(&owned)) else {
                panic!("{name}({}) did not answer within 5 s", path.display());
            };
            match result {
                Err(HiveGpuError::Io { path: p, source }) => {
                    assert_eq!(p, path, "{name}");
                    let message = source.to_string();
                    assert!(
                        message.contains("not a regular file") && message.contains(kind),
                        "{name}: {message}"
                    );
                }
                other => panic!("{name}({}): expected an Io error, got {other:?}", path.display()),
            }
        }
    }

    #[test]
    fn character_devices_such_as_dev_zero_are_refused_at_once_not_read_without_end() {
        for device in ["/dev/zero", "/dev/urandom"] {
            if !Path::new(device).exists() {
                eprintln!("{device} not found; skipping");
                continue;
            }
            assert_every_reader_refuses(Path::new(device), "character device");
        }
    }

    /// Creates a FIFO, or None (with a message) where mkfifo is missing.
    fn mkfifo(dir: &TempDir, name: &str) -> Option<PathBuf> {
        let path = dir.path(name);
        match std::process::Command::new("mkfifo").arg(&path).status() {
            Ok(status) if status.success() => Some(path),
            Ok(status) => panic!("mkfifo {} failed: {status}", path.display()),
            Err(e) => {
                eprintln!("mkfifo cannot run ({e}); skipping");
                None
            }
        }
    }

    #[test]
    fn a_fifo_without_a_writer_is_refused_at_once_instead_of_blocking_the_reader() {
        let dir = TempDir::new("a_fifo_is_refused");
        for name in
            ["pipe.fvecs", "pipe.ivecs", "pipe.bvecs", "pipe.npy", "pipe-idx3-ubyte", "pipe-idx3-ubyte.gz"]
        {
            let Some(fifo) = mkfifo(&dir, name) else { return };
            assert_every_reader_refuses(&fifo, "FIFO");
        }
    }

    #[test]
    fn opening_a_fifo_does_not_wait_for_a_writer() {
        // The layer under the check by path: a FIFO swapped in between the check and the open
        // must not block the open either (O_NONBLOCK); the handle's metadata then refuses it.
        let dir = TempDir::new("opening_a_fifo_does_not_wait_for_a_writer");
        let Some(fifo) = mkfifo(&dir, "swapped.fvecs") else { return };
        let opened = fifo.clone();
        let Some(file) = within(5, move || source::open_nonblocking(&opened)) else {
            // Release the blocked open so the thread ends, then fail.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
            panic!("opening a FIFO with no writer blocked");
        };
        let metadata = file.expect("open the FIFO").metadata().expect("fstat the FIFO");
        assert!(!metadata.is_file());
    }

    #[test]
    fn a_directory_is_refused_as_not_a_regular_file() {
        let dir = TempDir::new("a_directory_is_refused");
        for name in ["dir.fvecs", "dir.npy", "dir-idx3-ubyte.gz"] {
            let path = dir.path(name);
            std::fs::create_dir(&path).expect("create a directory");
            assert_every_reader_refuses(&path, "directory");
        }
    }

    #[test]
    fn a_stream_longer_than_its_length_is_read_only_to_its_length() {
        // A file that grows while it is read: only the bytes it had when opened count, and
        // nothing after them is even read (an endless tail would otherwise never end).
        let bytes = fvecs_bytes(&[&[1.0, 2.0], &[3.0, 4.0]]);
        let grown = bytes.as_slice().chain(std::io::repeat(7));
        let m = decode_vectors(VectorFormat::Fvecs, Path::new("grows.fvecs"), grown, bytes.len() as u64)
            .expect("the bytes up to the length");
        assert_eq!(m, Matrix { rows: 2, dim: 2, data: vec![1.0, 2.0, 3.0, 4.0] });
        let grown = bytes.as_slice().chain(std::io::repeat(7));
        let ids = decode_ivecs(Path::new("grows.ivecs"), grown, bytes.len() as u64).expect("ivecs");
        assert_eq!((ids.rows, ids.dim), (2, 2));
    }

    #[test]
    fn a_stream_shorter_than_its_length_is_a_truncation_error_for_every_format() {
        // A file that shrinks while it is read ends early: a clear error, never a hang.
        let fvecs = fvecs_bytes(&[&[1.0, 2.0], &[3.0, 4.0]]);
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
        let mut npy = b"\x93NUMPY\x01\x00".to_vec();
        npy.extend_from_slice(&(header.len() as u16).to_le_bytes());
        npy.extend_from_slice(header.as_bytes());
        npy.extend(&[1.0f32, 2.0, 3.0, 4.0].map(f32::to_le_bytes).concat());
        let idx = [0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3, 4];
        let bvecs = [2, 0, 0, 0, 1, 2, 2, 0, 0, 0, 3, 4];
        for (format, name, bytes) in [
            (VectorFormat::Fvecs, "shrunk.fvecs", &fvecs[..]),
            (VectorFormat::Bvecs, "shrunk.bvecs", &bvecs[..]),
            (VectorFormat::Npy, "shrunk.npy", &npy[..]),
            (VectorFormat::Idx, "shrunk-idx2-ubyte", &idx[..]),
        ] {
            let shrunk = &bytes[..bytes.len() - 3];
            let err = decode_vectors(format, Path::new(name), shrunk, bytes.len() as u64)
                .expect_err("a stream that ends early");
            let message = err.to_string();
            assert!(message.contains("truncated") && message.contains("shrink"), "{name}: {message}");
        }
        let err =
            decode_ivecs(Path::new("shrunk.ivecs"), &fvecs[..20], fvecs.len() as u64).expect_err("ivecs");
        assert!(err.to_string().contains("shrink"), "{err}");
    }

    #[test]
    fn values_split_across_short_and_interrupted_reads_decode_whole() {
        let fvecs = fvecs_bytes(&[&[1.5, -2.0, 3.25], &[4.0, 5.0, 6.0]]);
        for step in 1..8 {
            let reader = Trickle { data: &fvecs, step, interrupt: false };
            let m = decode_vectors(VectorFormat::Fvecs, Path::new("t.fvecs"), reader, fvecs.len() as u64)
                .expect("fvecs in pieces");
            assert_eq!(m.data, [1.5, -2.0, 3.25, 4.0, 5.0, 6.0], "step {step}");
            let reader = Trickle { data: &fvecs, step, interrupt: false };
            let ids = decode_ivecs(Path::new("t.ivecs"), reader, fvecs.len() as u64).expect("ivecs");
            assert_eq!(ids.row(1), [4.0f32, 5.0, 6.0].map(f32::to_bits).map(|b| b as i32), "step {step}");
        }
    }

    /// The crate's copy of siftsmall, found relative to the crate at run time.
    fn siftsmall(file: &str) -> Option<PathBuf> {
        let crate_dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
        let path = Path::new(&crate_dir).join("../../data/siftsmall").join(file);
        path.exists().then_some(path)
    }

    #[test]
    fn reads_real_siftsmall_files() {
        let Some(base) = siftsmall("siftsmall_base.fvecs") else {
            eprintln!("data/siftsmall not found; skipping");
            return;
        };
        let m = read_fvecs(&base).expect("siftsmall base");
        assert_eq!((m.rows, m.dim), (10_000, 128));
        assert_eq!(&m.row(0)[..8], &[0.0, 16.0, 35.0, 5.0, 32.0, 31.0, 14.0, 10.0]);
        assert_eq!(read_vectors(&base).expect("by name"), m);
        // Five megabytes: several buffers' worth, from a file and from memory alike.
        let bytes = std::fs::read(&base).expect("read the base");
        assert!(bytes.len() > 4 * source::CHUNK);
        assert_eq!(parse_fvecs(&base, &bytes).expect("from memory"), m);

        if let Some(query) = siftsmall("siftsmall_query.fvecs") {
            let q = read_fvecs(&query).expect("siftsmall query");
            assert_eq!((q.rows, q.dim), (100, 128));
        }
        if let Some(truth) = siftsmall("siftsmall_groundtruth.ivecs") {
            let t = read_ivecs(&truth).expect("siftsmall ground truth");
            assert_eq!((t.rows, t.dim), (100, 100));
            assert!(t.data.iter().all(|&id| (0..10_000).contains(&id)));
        }
    }
}
