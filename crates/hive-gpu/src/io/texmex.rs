//! TEXMEX files (corpus-texmex.irisa.fr): fvecs, ivecs and bvecs. Each record is a
//! little-endian `int32 d` followed by `d` float32, int32 or uint8 values; every record of a
//! file has the same `d`.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use super::source::{MemoryBudget, Source, allocate, open_regular};
use super::{IdMatrix, Matrix, invalid, io_error};
use crate::error::{HiveGpuError, Result};

/// The largest `d` a record may declare; anything above is a corrupt header, not a vector.
const MAX_DIM: usize = 1 << 24;

/// Bytes of the `int32 d` that starts every record.
const HEADER_LEN: u64 = 4;

/// Reads a `.fvecs` file: float32 vectors.
///
/// # Errors
/// [`HiveGpuError::Io`] when the file cannot be read or is not a regular file;
/// [`HiveGpuError::InvalidFormat`] when it is empty, truncated, declares a dimension outside
/// `1..=2^24`, or mixes dimensions; [`HiveGpuError::OutOfMemory`] when its vectors do not fit
/// in the memory this process may still take.
pub fn read_fvecs(path: &Path) -> Result<Matrix> {
    let (file, len) = open_regular(path)?;
    decode_fvecs(path, file, len, MemoryBudget::Process)
}

/// Parses the bytes of an `.fvecs` file already in memory; `path` names it in errors.
///
/// # Errors
/// As [`read_fvecs`], without the I/O failures.
pub fn parse_fvecs(path: &Path, bytes: &[u8]) -> Result<Matrix> {
    decode_fvecs(path, bytes, bytes.len() as u64, MemoryBudget::Process)
}

/// Reads a `.bvecs` file: uint8 vectors, each component widened to f32.
///
/// # Errors
/// As [`read_fvecs`].
pub fn read_bvecs(path: &Path) -> Result<Matrix> {
    let (file, len) = open_regular(path)?;
    decode_bvecs(path, file, len, MemoryBudget::Process)
}

/// Reads a `.ivecs` file: int32 rows, typically ground-truth neighbour ids.
///
/// # Errors
/// As [`read_fvecs`].
pub fn read_ivecs(path: &Path) -> Result<IdMatrix> {
    let (file, len) = open_regular(path)?;
    decode_ivecs_with(path, file, len, MemoryBudget::Process)
}

/// Parses the bytes of an `.ivecs` file already in memory; `path` names it in errors.
///
/// # Errors
/// As [`read_ivecs`], without the I/O failures.
pub fn parse_ivecs(path: &Path, bytes: &[u8]) -> Result<IdMatrix> {
    decode_ivecs_with(path, bytes, bytes.len() as u64, MemoryBudget::Process)
}

/// Decodes `len` bytes of fvecs from `reader`.
pub(super) fn decode_fvecs(path: &Path, reader: impl Read, len: u64, budget: MemoryBudget) -> Result<Matrix> {
    let (rows, dim, data) = decode_records(path, "fvecs", reader, len, f32::from_le_bytes, budget)?;
    Ok(Matrix { rows, dim, data })
}

/// Decodes `len` bytes of bvecs from `reader`.
pub(super) fn decode_bvecs(path: &Path, reader: impl Read, len: u64, budget: MemoryBudget) -> Result<Matrix> {
    let (rows, dim, data) = decode_records(path, "bvecs", reader, len, |[b]: [u8; 1]| f32::from(b), budget)?;
    Ok(Matrix { rows, dim, data })
}

/// Decodes `len` bytes of ivecs from `reader`.
pub(super) fn decode_ivecs_with(
    path: &Path,
    reader: impl Read,
    len: u64,
    budget: MemoryBudget,
) -> Result<IdMatrix> {
    let (rows, dim, data) = decode_records(path, "ivecs", reader, len, i32::from_le_bytes, budget)?;
    Ok(IdMatrix { rows, dim, data })
}

/// Writes `m` as a `.fvecs` file, replacing any file at `path`.
///
/// # Errors
/// [`HiveGpuError::InvalidArgument`] when `m.data.len() != m.rows * m.dim` or, for a
/// non-empty matrix, `m.dim` is outside `1..=2^24` (the range the readers accept);
/// [`HiveGpuError::Io`] when the file cannot be written.
pub fn write_fvecs(path: &Path, m: &Matrix) -> Result<()> {
    check_shape(m.rows, m.dim, m.data.len())?;
    write_records(path, m.dim, &m.data, |x| x.to_le_bytes())
}

/// Writes `m` as a `.ivecs` file, replacing any file at `path`.
///
/// # Errors
/// As [`write_fvecs`].
pub fn write_ivecs(path: &Path, m: &IdMatrix) -> Result<()> {
    check_shape(m.rows, m.dim, m.data.len())?;
    write_records(path, m.dim, &m.data, |x| x.to_le_bytes())
}

/// Decodes records of `N`-byte values and returns `(rows, dim, values)`.
///
/// The first record's `d` and the length give the shape (`len / record length` rows), so the
/// output is allocated once, before decoding, and never beyond what the length can hold; every
/// later record's `d` is checked as it streams past. A length that is not whole records is
/// wrong whatever the records say: then nothing is allocated, and the records are still walked
/// so the error names the first bad one in file order, as a reader of the whole file would.
fn decode_records<T, const N: usize>(
    path: &Path,
    format: &'static str,
    reader: impl Read,
    len: u64,
    convert: impl Fn([u8; N]) -> T,
    budget: MemoryBudget,
) -> Result<(usize, usize, Vec<T>)> {
    if len == 0 {
        return Err(invalid(path, format, "no vectors: the file is empty"));
    }
    let mut src = Source::new(path, format, reader, len);
    let first = record_dim(&mut src, 0, 0)?;
    let dim = usize::try_from(first).ok().filter(|d| (1..=MAX_DIM).contains(d)).ok_or_else(|| {
        invalid(path, format, format!("record 0 declares dimension {first}; it must be in 1..={MAX_DIM}"))
    })?;
    // Cannot overflow: dim <= 2^24 and N <= 4.
    let values = dim as u64;
    let record_len = HEADER_LEN + values * N as u64;
    let rows = len / record_len;
    let mut out = if len.is_multiple_of(record_len) {
        Some(allocate(path, format, rows, values, budget)?)
    } else {
        None
    };

    let mut index = 0u64;
    while index * record_len < len {
        let offset = index * record_len;
        if index > 0 {
            let d = record_dim(&mut src, index, offset)?;
            if usize::try_from(d) != Ok(dim) {
                return Err(invalid(
                    path,
                    format,
                    format!(
                        "record {index} (byte offset {offset}) has dimension {d}, \
                         but record 0 has dimension {dim}"
                    ),
                ));
            }
        }
        let left = len - offset;
        if left < record_len {
            return Err(invalid(
                path,
                format,
                format!(
                    "truncated: record {index} starts at byte offset {offset} and needs \
                     {record_len} bytes, but only {left} remain"
                ),
            ));
        }
        let read = match &mut out {
            Some(out) => src.read_into(values, out, &convert),
            None => src.skip(values * N as u64),
        };
        read.map_err(|e| src.error(e, format_args!("record {index}")))?;
        index += 1;
    }
    // Whole records always reach here with the output; a partial one has returned above.
    let data =
        out.ok_or_else(|| HiveGpuError::Internal(format!("{format}: a partial record was not reported")))?;
    // The output's allocation succeeded, so its row count fits a usize.
    Ok((rows as usize, dim, data))
}

/// Reads the `d` of the record at `offset`, which the stream has reached.
fn record_dim<R: Read>(src: &mut Source<'_, R>, index: u64, offset: u64) -> Result<i32> {
    if src.len() - offset < HEADER_LEN {
        return Err(src.invalid(format!(
            "truncated: record {index} starts at byte offset {offset}, but the file ends inside \
             its 4-byte dimension header (at byte {})",
            src.len()
        )));
    }
    let mut header = [0u8; HEADER_LEN as usize];
    src.read_exact(&mut header).map_err(|e| src.error(e, format_args!("the header of record {index}")))?;
    Ok(i32::from_le_bytes(header))
}

fn check_shape(rows: usize, dim: usize, len: usize) -> Result<()> {
    if rows.checked_mul(dim) != Some(len) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "matrix holds {len} values, but rows * dim = {rows} * {dim}"
        )));
    }
    if rows > 0 && !(1..=MAX_DIM).contains(&dim) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "cannot write vectors of dimension {dim}: it must be in 1..={MAX_DIM}"
        )));
    }
    Ok(())
}

/// Writes one record per `dim` values of a matrix that passed [`check_shape`].
fn write_records<T>(path: &Path, dim: usize, data: &[T], to_bytes: impl Fn(&T) -> [u8; 4]) -> Result<()> {
    let write = || -> std::io::Result<()> {
        let mut out = BufWriter::new(File::create(path)?);
        // An empty matrix may have dim 0, which `chunks` refuses; it writes no record anyway.
        for row in data.chunks(dim.max(1)) {
            // check_shape keeps dim <= MAX_DIM, so the length fits the i32 header.
            out.write_all(&(row.len() as i32).to_le_bytes())?;
            for x in row {
                out.write_all(&to_bytes(x))?;
            }
        }
        out.flush()
    };
    write().map_err(|source| io_error(path, source))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{TempDir, fvecs_bytes, invalid_reason};
    use super::*;

    fn record(d: i32, values: &[u8]) -> Vec<u8> {
        let mut bytes = d.to_le_bytes().to_vec();
        bytes.extend_from_slice(values);
        bytes
    }

    #[test]
    fn fvecs_round_trip() {
        let dir = TempDir::new("fvecs_round_trip");
        let path = dir.path("m.fvecs");
        let m = Matrix { rows: 3, dim: 2, data: vec![0.5, -1.0, f32::MAX, 1e-30, 0.0, 7.25] };
        write_fvecs(&path, &m).expect("write");
        assert_eq!(std::fs::metadata(&path).expect("metadata").len(), 3 * (4 + 2 * 4));
        assert_eq!(read_fvecs(&path).expect("read"), m);
    }

    #[test]
    fn fvecs_reads_hand_built_file() {
        let dir = TempDir::new("fvecs_reads_hand_built_file");
        let path = dir.write("m.fvecs", &fvecs_bytes(&[&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]]));
        let m = read_fvecs(&path).expect("read");
        assert_eq!((m.rows, m.dim), (2, 3));
        assert_eq!(m.row(1), &[4.0, 5.0, 6.0]);
    }

    #[test]
    fn ivecs_round_trip() {
        let dir = TempDir::new("ivecs_round_trip");
        let path = dir.path("gt.ivecs");
        let m = IdMatrix { rows: 2, dim: 3, data: vec![0, 9_999, -1, i32::MAX, i32::MIN, 42] };
        write_ivecs(&path, &m).expect("write");
        assert_eq!(read_ivecs(&path).expect("read"), m);
    }

    #[test]
    fn ivecs_reads_hand_built_file() {
        let dir = TempDir::new("ivecs_reads_hand_built_file");
        let mut bytes = Vec::new();
        for row in [[7i32, 3], [1, 0]] {
            bytes.extend_from_slice(&2i32.to_le_bytes());
            for id in row {
                bytes.extend_from_slice(&id.to_le_bytes());
            }
        }
        let path = dir.write("gt.ivecs", &bytes);
        let m = read_ivecs(&path).expect("read");
        assert_eq!(m, IdMatrix { rows: 2, dim: 2, data: vec![7, 3, 1, 0] });
    }

    #[test]
    fn bvecs_widens_bytes_to_f32() {
        let dir = TempDir::new("bvecs_widens_bytes_to_f32");
        let mut bytes = record(3, &[0, 128, 255]);
        bytes.extend(record(3, &[1, 2, 3]));
        let path = dir.write("m.bvecs", &bytes);
        let m = read_bvecs(&path).expect("read");
        assert_eq!(m, Matrix { rows: 2, dim: 3, data: vec![0.0, 128.0, 255.0, 1.0, 2.0, 3.0] });
    }

    #[test]
    fn write_of_empty_matrix_gives_empty_file() {
        let dir = TempDir::new("write_of_empty_matrix_gives_empty_file");
        let path = dir.path("empty.fvecs");
        write_fvecs(&path, &Matrix { rows: 0, dim: 4, data: Vec::new() }).expect("write");
        assert_eq!(std::fs::metadata(&path).expect("metadata").len(), 0);
    }

    #[test]
    fn write_rejects_inconsistent_matrix() {
        let dir = TempDir::new("write_rejects_inconsistent_matrix");
        let path = dir.path("bad.fvecs");
        let short = Matrix { rows: 2, dim: 3, data: vec![0.0; 5] };
        let zero_dim = Matrix { rows: 2, dim: 0, data: Vec::new() };
        let huge_dim = IdMatrix { rows: 1, dim: MAX_DIM + 1, data: vec![0; MAX_DIM + 1] };
        assert!(matches!(write_fvecs(&path, &short), Err(HiveGpuError::InvalidArgument(_))));
        assert!(matches!(write_fvecs(&path, &zero_dim), Err(HiveGpuError::InvalidArgument(_))));
        assert!(matches!(write_ivecs(&path, &huge_dim), Err(HiveGpuError::InvalidArgument(_))));
        assert!(!path.exists(), "a rejected matrix must not create the file");
    }

    #[test]
    fn write_into_missing_directory_is_io_error() {
        let dir = TempDir::new("write_into_missing_directory_is_io_error");
        let path = dir.path("no/such/dir/m.fvecs");
        let m = Matrix { rows: 1, dim: 1, data: vec![1.0] };
        assert!(matches!(write_fvecs(&path, &m), Err(HiveGpuError::Io { .. })));
    }

    #[test]
    fn empty_file_is_rejected() {
        let dir = TempDir::new("empty_file_is_rejected");
        let path = dir.write("empty.fvecs", &[]);
        let reason = invalid_reason(read_fvecs(&path), "fvecs");
        assert!(reason.contains("no vectors"), "{reason}");
        let path = dir.write("empty.ivecs", &[]);
        assert!(invalid_reason(read_ivecs(&path), "ivecs").contains("no vectors"));
        let path = dir.write("empty.bvecs", &[]);
        assert!(invalid_reason(read_bvecs(&path), "bvecs").contains("no vectors"));
    }

    #[test]
    fn missing_file_is_io_error() {
        let dir = TempDir::new("texmex_missing_file_is_io_error");
        let path = dir.path("absent.ivecs");
        match read_ivecs(&path) {
            Err(HiveGpuError::Io { path: p, source }) => {
                assert_eq!(p, path);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected an Io error, got {other:?}"),
        }
    }

    #[test]
    fn truncated_values_name_record_and_offset() {
        let dir = TempDir::new("truncated_values_name_record_and_offset");
        let mut bytes = fvecs_bytes(&[&[1.0, 2.0], &[3.0, 4.0]]);
        bytes.truncate(bytes.len() - 3);
        let path = dir.write("cut.fvecs", &bytes);
        let reason = invalid_reason(read_fvecs(&path), "fvecs");
        assert!(reason.contains("truncated"), "{reason}");
        assert!(reason.contains("record 1"), "{reason}");
        assert!(reason.contains("byte offset 12"), "{reason}");
    }

    #[test]
    fn truncated_header_names_record_and_offset() {
        let dir = TempDir::new("truncated_header_names_record_and_offset");
        let mut bytes = record(2, &[1, 2]);
        bytes.extend_from_slice(&[2, 0]);
        let path = dir.write("cut.bvecs", &bytes);
        let reason = invalid_reason(read_bvecs(&path), "bvecs");
        assert!(reason.contains("truncated"), "{reason}");
        assert!(reason.contains("record 1"), "{reason}");
        assert!(reason.contains("byte offset 6"), "{reason}");
    }

    #[test]
    fn file_shorter_than_one_header_is_truncated() {
        let dir = TempDir::new("file_shorter_than_one_header_is_truncated");
        let path = dir.write("tiny.fvecs", &[1, 0]);
        let reason = invalid_reason(read_fvecs(&path), "fvecs");
        assert!(reason.contains("truncated") && reason.contains("record 0"), "{reason}");
    }

    #[test]
    fn inconsistent_dim_names_record_and_both_dims() {
        let dir = TempDir::new("inconsistent_dim_names_record_and_both_dims");
        let path = dir.write("mixed.fvecs", &fvecs_bytes(&[&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0], &[7.0, 8.0]]));
        let reason = invalid_reason(read_fvecs(&path), "fvecs");
        assert!(reason.contains("record 2"), "{reason}");
        assert!(reason.contains("dimension 2"), "{reason}");
        assert!(reason.contains("dimension 3"), "{reason}");
    }

    #[test]
    fn zero_dim_is_rejected() {
        let dir = TempDir::new("zero_dim_is_rejected");
        let path = dir.write("zero.ivecs", &record(0, &[]));
        let reason = invalid_reason(read_ivecs(&path), "ivecs");
        assert!(reason.contains("dimension 0"), "{reason}");
    }

    #[test]
    fn negative_dim_is_rejected() {
        let dir = TempDir::new("negative_dim_is_rejected");
        let path = dir.write("neg.fvecs", &record(-5, &[0; 16]));
        let reason = invalid_reason(read_fvecs(&path), "fvecs");
        assert!(reason.contains("dimension -5"), "{reason}");
    }

    #[test]
    fn absurd_dim_is_rejected_without_allocating() {
        let dir = TempDir::new("absurd_dim_is_rejected_without_allocating");
        let path = dir.write("huge.fvecs", &record((1 << 24) + 1, &[0; 8]));
        let reason = invalid_reason(read_fvecs(&path), "fvecs");
        assert!(reason.contains("16777217"), "{reason}");
        let path = dir.write("max.bvecs", &record(i32::MAX, &[0; 8]));
        invalid_reason(read_bvecs(&path), "bvecs");
    }

    #[test]
    fn largest_accepted_dim_still_needs_whole_records() {
        let dir = TempDir::new("largest_accepted_dim_still_needs_whole_records");
        let path = dir.write("big.fvecs", &record(1 << 24, &[0; 8]));
        let reason = invalid_reason(read_fvecs(&path), "fvecs");
        assert!(reason.contains("truncated"), "{reason}");
    }

    /// The fields of an `OutOfMemory` error; fails the test on anything else.
    fn out_of_memory<T: std::fmt::Debug>(result: Result<T>) -> (String, u64, u64) {
        match result {
            Err(HiveGpuError::OutOfMemory { what, requested, available, .. }) => (what, requested, available),
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
    }

    #[test]
    fn output_beyond_the_memory_budget_is_refused_before_decoding() {
        let path = Path::new("budget.fvecs");
        let bytes = fvecs_bytes(&[&[1.0, 2.0], &[3.0, 4.0]]);
        let len = bytes.len() as u64;
        let (what, requested, available) =
            out_of_memory(decode_fvecs(path, &bytes[..], len, MemoryBudget::Fixed(15)));
        assert_eq!((requested, available), (16, 15));
        assert!(what.contains("budget.fvecs") && what.contains("2 x 2"), "{what}");
        assert!(decode_fvecs(path, &bytes[..], len, MemoryBudget::Fixed(16)).is_ok());
        out_of_memory(decode_ivecs_with(path, &bytes[..], len, MemoryBudget::Fixed(15)));
        // bvecs widen each byte to a 4-byte f32: the budget counts the output, not the file.
        let bvecs = [record(2, &[1, 2]), record(2, &[3, 4])].concat();
        let (_, requested, _) =
            out_of_memory(decode_bvecs(path, &bvecs[..], bvecs.len() as u64, MemoryBudget::Fixed(15)));
        assert_eq!(requested, 16);
        let message =
            decode_fvecs(path, &bytes[..], len, MemoryBudget::Fixed(15)).expect_err("oom").to_string();
        assert!(message.contains("16 bytes needed") && message.contains("15 bytes available"), "{message}");
    }

    #[test]
    fn a_length_that_is_not_whole_records_allocates_nothing() {
        // With no budget at all, any allocation would be refused as OutOfMemory: these files
        // are refused as truncated instead, so nothing was allocated for them.
        let path = Path::new("partial.fvecs");
        let mut bytes = fvecs_bytes(&[&[1.0, 2.0], &[3.0, 4.0]]);
        bytes.pop();
        let reason = invalid_reason(
            decode_fvecs(path, &bytes[..], bytes.len() as u64, MemoryBudget::Fixed(0)),
            "fvecs",
        );
        assert!(reason.contains("truncated") && reason.contains("record 1"), "{reason}");
        // A huge first dimension in a small file: the shape comes from the length, not the header.
        let huge = record(1 << 24, &[0; 64]);
        let reason =
            invalid_reason(decode_bvecs(path, &huge[..], huge.len() as u64, MemoryBudget::Fixed(0)), "bvecs");
        assert!(reason.contains("truncated"), "{reason}");
    }

    #[test]
    fn a_mismatched_record_after_whole_records_is_still_found() {
        // The length is whole records of record 0's dimension, but a later record lies.
        let mut bytes = fvecs_bytes(&[&[1.0, 2.0], &[3.0, 4.0], &[5.0, 6.0]]);
        bytes[12..16].copy_from_slice(&1i32.to_le_bytes());
        let reason = invalid_reason(parse_fvecs(Path::new("lie.fvecs"), &bytes), "fvecs");
        assert!(reason.contains("record 1") && reason.contains("dimension 1"), "{reason}");
    }

    #[test]
    fn garbage_never_panics() {
        // Every prefix of a valid file, and pseudo-random bytes, must give Ok or an error.
        let dir = TempDir::new("texmex_garbage_never_panics");
        let valid = fvecs_bytes(&[&[1.0, 2.0], &[3.0, 4.0], &[5.0, 6.0]]);
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for len in 0..valid.len() {
            let path = dir.write("prefix.fvecs", &valid[..len]);
            let _ = read_fvecs(&path);
            let _ = read_ivecs(&path);
            let _ = read_bvecs(&path);
        }
        for round in 0..64 {
            let bytes: Vec<u8> = (0..round * 3)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let path = dir.write("noise.fvecs", &bytes);
            let _ = read_fvecs(&path);
            let _ = read_ivecs(&path);
            let _ = read_bvecs(&path);
        }
    }
}
