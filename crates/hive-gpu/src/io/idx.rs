//! IDX files (MNIST, Fashion-MNIST): two zero bytes, a type code, the number of dimensions
//! `n`, `n` big-endian u32 sizes, then the big-endian data. Gzipped files are unpacked first.

use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use super::{Matrix, invalid, read_file};
use crate::error::Result;

const FORMAT: &str = "idx";
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads an IDX file: the first dimension counts the vectors and the others, multiplied,
/// give their dimension (an `n x rows x cols` image file such as MNIST's magic `0x00000803`
/// gives vectors of `rows * cols`; a 1-D label file, `0x00000801`, gives vectors of one
/// component). Elements may be unsigned bytes (type `0x08`) or big-endian f32 (type `0x0D`),
/// both returned as f32. A name ending in `.gz`, or gzip content, is gunzipped first.
///
/// # Errors
/// [`HiveGpuError::Io`](crate::error::HiveGpuError::Io) when the file cannot be read;
/// [`HiveGpuError::InvalidFormat`](crate::error::HiveGpuError::InvalidFormat) when it cannot
/// be gunzipped, has a bad magic or another element type, is empty, or its data does not
/// match its sizes.
pub fn read_idx(path: &Path) -> Result<Matrix> {
    let raw = read_file(path)?;
    let gzipped =
        path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz")) || raw.starts_with(&GZIP_MAGIC);
    if gzipped { parse_idx(path, &gunzip(path, &raw)?) } else { parse_idx(path, &raw) }
}

/// Gunzips at most what the IDX header inside declares (plus one byte, so trailing data is
/// still detected): a small file that inflates without end cannot exhaust memory.
fn gunzip(path: &Path, raw: &[u8]) -> Result<Vec<u8>> {
    let cannot = |e: std::io::Error| invalid(path, FORMAT, format!("cannot gunzip: {e}"));
    let mut decoder = GzDecoder::new(raw);
    let mut bytes = vec![0u8; 4];
    if let Err(e) = decoder.read_exact(&mut bytes) {
        if e.kind() != std::io::ErrorKind::UnexpectedEof {
            return Err(cannot(e));
        }
        // Too short for a header: let the parser describe what is there.
        bytes.clear();
        GzDecoder::new(raw).read_to_end(&mut bytes).map_err(cannot)?;
        return Ok(bytes);
    }
    let ndims = usize::from(bytes[3]);
    let mut sizes = vec![0u8; 4 * ndims];
    decoder.read_exact(&mut sizes).map_err(cannot)?;
    bytes.extend_from_slice(&sizes);
    let elem = Elem::from_code(bytes[2]).map_or(1, Elem::size);
    let data = sizes
        .as_chunks::<4>()
        .0
        .iter()
        .try_fold(elem, |acc, d| acc.checked_mul(u64::from(u32::from_be_bytes(*d))))
        .ok_or_else(|| invalid(path, FORMAT, "the declared sizes overflow"))?;
    decoder.take(data.saturating_add(1)).read_to_end(&mut bytes).map_err(cannot)?;
    Ok(bytes)
}

/// The element types this reader decodes.
#[derive(Debug, Clone, Copy)]
enum Elem {
    U8,
    F32,
}

impl Elem {
    fn from_code(code: u8) -> Option<Self> {
        match code {
            0x08 => Some(Self::U8),
            0x0D => Some(Self::F32),
            _ => None,
        }
    }

    fn size(self) -> u64 {
        match self {
            Self::U8 => 1,
            Self::F32 => 4,
        }
    }

    fn decode(self, data: &[u8]) -> Vec<f32> {
        match self {
            Self::U8 => data.iter().map(|&b| f32::from(b)).collect(),
            Self::F32 => data.as_chunks().0.iter().map(|b| f32::from_be_bytes(*b)).collect(),
        }
    }
}

/// Parses the (already gunzipped) content of an IDX file.
fn parse_idx(path: &Path, bytes: &[u8]) -> Result<Matrix> {
    let bad = |reason: String| invalid(path, FORMAT, reason);
    if bytes.is_empty() {
        return Err(bad("no vectors: the file is empty".into()));
    }
    let (&magic, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or_else(|| bad(format!("truncated: the 4-byte magic is cut off after {} bytes", bytes.len())))?;
    let [zero0, zero1, code, ndim] = magic;
    if (zero0, zero1) != (0, 0) {
        return Err(bad(format!(
            "bad magic 0x{:08X}: an IDX file starts with two zero bytes",
            u32::from_be_bytes(magic)
        )));
    }
    let elem = Elem::from_code(code).ok_or_else(|| {
        bad(format!(
            "unsupported element type 0x{code:02X} (supported: 0x08 unsigned byte, \
             0x0D float32)"
        ))
    })?;
    let sizes_len = 4 * usize::from(ndim);
    let (sizes, data) = rest.split_at_checked(sizes_len).ok_or_else(|| {
        bad(format!(
            "truncated: the {ndim} dimension sizes need {sizes_len} bytes after the magic, but \
             only {} follow",
            rest.len()
        ))
    })?;
    let sizes: Vec<u64> = sizes.as_chunks().0.iter().map(|b| u64::from(u32::from_be_bytes(*b))).collect();
    let shape = sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(" x ");

    let Some((&rows, vector_sizes)) = sizes.split_first() else {
        return Err(bad("the magic declares 0 dimensions".into()));
    };
    let dim = vector_sizes.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let needed = dim.and_then(|d| d.checked_mul(rows)?.checked_mul(elem.size()));
    let (Some(dim), Some(needed)) = (dim, needed) else {
        return Err(bad(format!("sizes {shape} overflow a 64-bit byte count")));
    };
    if rows == 0 || dim == 0 {
        return Err(bad(format!("no vectors: sizes {shape} hold no elements")));
    }
    let len = data.len() as u64;
    if needed > len {
        return Err(bad(format!(
            "truncated: sizes {shape} need {needed} bytes of data, but only {len} follow the \
             header"
        )));
    }
    if needed < len {
        return Err(bad(format!(
            "{} unexpected bytes after the {needed} bytes of data of sizes {shape}",
            len - needed
        )));
    }
    // Both fit in usize: their product is the length of a slice in memory.
    Ok(Matrix { rows: rows as usize, dim: dim as usize, data: elem.decode(data) })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::super::test_support::{TempDir, invalid_reason};
    use super::*;
    use crate::error::HiveGpuError;

    fn idx(code: u8, sizes: &[u32], data: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0, 0, code, sizes.len() as u8];
        for size in sizes {
            bytes.extend_from_slice(&size.to_be_bytes());
        }
        bytes.extend_from_slice(data);
        bytes
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(bytes).expect("gzip into memory");
        encoder.finish().expect("gzip into memory")
    }

    /// Two 2x3 "images".
    fn images() -> Vec<u8> {
        idx(0x08, &[2, 2, 3], &[0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255])
    }

    fn expected_images() -> Matrix {
        let data = [0u8, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255].map(f32::from).to_vec();
        Matrix { rows: 2, dim: 6, data }
    }

    #[test]
    fn reads_ubyte_images_as_flat_vectors() {
        let dir = TempDir::new("reads_ubyte_images_as_flat_vectors");
        let path = dir.write("train-images-idx3-ubyte", &images());
        assert_eq!(read_idx(&path).expect("read"), expected_images());
    }

    #[test]
    fn reads_labels_as_one_component_vectors() {
        let dir = TempDir::new("reads_labels_as_one_component_vectors");
        let path = dir.write("train-labels-idx1-ubyte", &idx(0x08, &[4], &[9, 0, 0, 3]));
        let m = read_idx(&path).expect("read");
        assert_eq!(m, Matrix { rows: 4, dim: 1, data: vec![9.0, 0.0, 0.0, 3.0] });
    }

    #[test]
    fn reads_big_endian_f32() {
        let dir = TempDir::new("reads_big_endian_f32");
        let data: Vec<u8> = [1.5f32, -2.0, 1e-3, 7.0].iter().flat_map(|x| x.to_be_bytes()).collect();
        let path = dir.write("floats.idx", &idx(0x0D, &[2, 2], &data));
        let m = read_idx(&path).expect("read");
        assert_eq!(m, Matrix { rows: 2, dim: 2, data: vec![1.5, -2.0, 1e-3, 7.0] });
    }

    #[test]
    fn reads_gzipped_files() {
        let dir = TempDir::new("reads_gzipped_files");
        let path = dir.write("t10k-images-idx3-ubyte.gz", &gzip(&images()));
        assert_eq!(read_idx(&path).expect("read"), expected_images());
        // Gzip content is recognised even without the extension.
        let path = dir.write("images.idx", &gzip(&images()));
        assert_eq!(read_idx(&path).expect("read"), expected_images());
    }

    #[test]
    fn gzip_inflates_no_further_than_the_header_declares() {
        let dir = TempDir::new("gzip_bomb");
        // A header for 2 images of 2x2 bytes, then a megabyte of zeros.
        let mut bytes = vec![0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2];
        bytes.resize(bytes.len() + (1 << 20), 0);
        let path = dir.write("bomb-ubyte.gz", &gzip(&bytes));
        let reason = invalid_reason(read_idx(&path), "idx");
        // Only one byte past the declared data was inflated, not the megabyte.
        assert!(reason.starts_with("1 unexpected bytes"), "{reason}");
    }

    #[test]
    fn rejects_corrupt_gzip() {
        let dir = TempDir::new("rejects_corrupt_gzip");
        let path = dir.write("a-ubyte.gz", &images());
        let reason = invalid_reason(read_idx(&path), "idx");
        assert!(reason.contains("gunzip"), "{reason}");
        let mut cut = gzip(&images());
        cut.truncate(cut.len() / 2);
        let path = dir.write("cut-ubyte.gz", &cut);
        invalid_reason(read_idx(&path), "idx");
    }

    #[test]
    fn rejects_bad_magic() {
        let dir = TempDir::new("idx_rejects_bad_magic");
        let mut bytes = images();
        bytes[0] = 0x12;
        let path = dir.write("a-ubyte", &bytes);
        let reason = invalid_reason(read_idx(&path), "idx");
        assert!(reason.contains("bad magic 0x12000803"), "{reason}");
    }

    #[test]
    fn rejects_unsupported_element_type() {
        let dir = TempDir::new("rejects_unsupported_element_type");
        let path = dir.write("a-ubyte", &idx(0x0E, &[1, 1], &[0; 8]));
        let reason = invalid_reason(read_idx(&path), "idx");
        assert!(reason.contains("0x0E"), "{reason}");
    }

    #[test]
    fn rejects_truncated_and_oversized_data() {
        let dir = TempDir::new("rejects_truncated_and_oversized_data");
        let mut bytes = images();
        bytes.pop();
        let path = dir.write("cut-ubyte", &bytes);
        let reason = invalid_reason(read_idx(&path), "idx");
        assert!(reason.contains("truncated") && reason.contains("2 x 2 x 3"), "{reason}");

        let mut bytes = images();
        bytes.push(0);
        let path = dir.write("long-ubyte", &bytes);
        let reason = invalid_reason(read_idx(&path), "idx");
        assert!(reason.contains("1 unexpected bytes"), "{reason}");
    }

    #[test]
    fn rejects_absurd_sizes_without_allocating() {
        let dir = TempDir::new("rejects_absurd_sizes_without_allocating");
        let huge = [u32::MAX; 3];
        let path = dir.write("huge-ubyte", &idx(0x08, &huge, &[0; 16]));
        invalid_reason(read_idx(&path), "idx");
        let overflow = [u32::MAX; 4];
        let path = dir.write("overflow-ubyte", &idx(0x0D, &overflow, &[0; 16]));
        let reason = invalid_reason(read_idx(&path), "idx");
        assert!(reason.contains("overflow"), "{reason}");
    }

    #[test]
    fn rejects_truncated_header_and_empty_files() {
        let dir = TempDir::new("rejects_truncated_header_and_empty_files");
        let path = dir.write("empty-ubyte", &[]);
        assert!(invalid_reason(read_idx(&path), "idx").contains("no vectors"));
        let path = dir.write("short-ubyte", &[0, 0, 8]);
        assert!(invalid_reason(read_idx(&path), "idx").contains("truncated"));
        let path = dir.write("sizes-ubyte", &[0, 0, 8, 3, 0, 0, 0, 2]);
        assert!(invalid_reason(read_idx(&path), "idx").contains("truncated"));
        let path = dir.write("zero-ubyte", &idx(0x08, &[0, 28, 28], &[]));
        assert!(invalid_reason(read_idx(&path), "idx").contains("no vectors"));
        let path = dir.write("nodims-ubyte", &[0, 0, 8, 0]);
        assert!(invalid_reason(read_idx(&path), "idx").contains("0 dimensions"));
        let path = dir.write("empty-ubyte.gz", &gzip(&[]));
        assert!(invalid_reason(read_idx(&path), "idx").contains("no vectors"));
    }

    #[test]
    fn missing_file_is_io_error() {
        let dir = TempDir::new("idx_missing_file_is_io_error");
        let result = read_idx(&dir.path("absent-ubyte.gz"));
        assert!(matches!(result, Err(HiveGpuError::Io { .. })), "{result:?}");
    }

    #[test]
    fn every_prefix_is_rejected_without_panic() {
        let bytes = images();
        let path = Path::new("prefix-ubyte");
        for len in 0..bytes.len() {
            invalid_reason(parse_idx(path, &bytes[..len]), "idx");
        }
        assert!(parse_idx(path, &bytes).is_ok());
    }
}
