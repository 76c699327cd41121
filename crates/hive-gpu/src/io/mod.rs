//! Readers (and a few writers) for the vector files of ANN benchmarks: TEXMEX fvecs, ivecs and
//! bvecs, NumPy `.npy`, and IDX (MNIST, Fashion-MNIST), gzipped or not.
//!
//! Every reader loads the whole file, checks it against its own header before it allocates
//! anything the header asks for, and reports a malformed file as
//! [`HiveGpuError::InvalidFormat`] with the record or byte offset where it went wrong.

use std::path::Path;

use crate::error::{HiveGpuError, Result};

mod idx;
mod npy;
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

/// The formats [`read_vectors`] can tell from a file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Fvecs,
    Bvecs,
    Npy,
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
        Some(Format::Fvecs) => read_fvecs(path),
        Some(Format::Bvecs) => read_bvecs(path),
        Some(Format::Npy) => read_npy(path),
        Some(Format::Idx) => read_idx(path),
        None => Err(HiveGpuError::InvalidArgument(format!(
            "cannot tell the vector format of {} from its name; accepted: {ACCEPTED_FORMATS}",
            path.display()
        ))),
    }
}

fn format_of(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_string_lossy().to_lowercase();
    if name.ends_with(".fvecs") {
        Some(Format::Fvecs)
    } else if name.ends_with(".bvecs") {
        Some(Format::Bvecs)
    } else if name.ends_with(".npy") {
        Some(Format::Npy)
    } else {
        let stem = name.strip_suffix(".gz").unwrap_or(&name);
        (stem.contains("idx") || stem.ends_with("-ubyte")).then_some(Format::Idx)
    }
}

/// Reads a whole file, reporting OS failures with the path.
fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| io_error(path, source))
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

    use super::test_support::{TempDir, assert_names_path, fvecs_bytes};
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
            ("base.fvecs", Some(Format::Fvecs)),
            ("dir.npy/BASE.FVECS", Some(Format::Fvecs)),
            ("bigann_base.bvecs", Some(Format::Bvecs)),
            ("embeddings.npy", Some(Format::Npy)),
            ("train-images-idx3-ubyte", Some(Format::Idx)),
            ("train-images-idx3-ubyte.gz", Some(Format::Idx)),
            ("t10k-labels-idx1-ubyte.gz", Some(Format::Idx)),
            ("images-ubyte", Some(Format::Idx)),
            ("digits.idx", Some(Format::Idx)),
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
