//! IDX files (MNIST, Fashion-MNIST): two zero bytes, a type code, the number of dimensions
//! `n`, `n` big-endian u32 sizes, then the big-endian data. Gzipped files are inflated as
//! they are decoded.

use std::io::Read;
use std::path::Path;

use super::Matrix;
use super::source::{MAX_DEFLATE_RATIO, MemoryBudget, Source, allocate, open_regular};
use crate::error::Result;

const FORMAT: &str = "idx";
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads an IDX file: the first dimension counts the vectors and the others, multiplied,
/// give their dimension (an `n x rows x cols` image file such as MNIST's magic `0x00000803`
/// gives vectors of `rows * cols`; a 1-D label file, `0x00000801`, gives vectors of one
/// component). Elements may be unsigned bytes (type `0x08`) or big-endian f32 (type `0x0D`),
/// both returned as f32. A name ending in `.gz`, or content starting with the gzip magic, is
/// inflated as it is read; several gzip members one after the other are read as one stream,
/// as `gzip -d` reads them.
///
/// # Errors
/// [`HiveGpuError::Io`](crate::error::HiveGpuError::Io) when the file cannot be read or is
/// not a regular file;
/// [`HiveGpuError::InvalidFormat`](crate::error::HiveGpuError::InvalidFormat) when it cannot
/// be gunzipped, has a bad magic or another element type, is empty, its data does not match
/// its sizes, or (gzipped) its sizes need more than the compressed size can inflate to;
/// [`HiveGpuError::OutOfMemory`](crate::error::HiveGpuError::OutOfMemory) when the vectors
/// do not fit in the memory this process may still take.
pub fn read_idx(path: &Path) -> Result<Matrix> {
    let (file, len) = open_regular(path)?;
    decode_idx(path, file, len, MemoryBudget::Process)
}

/// Decodes `len` bytes of IDX, gzipped or not, from `reader`.
pub(super) fn decode_idx(path: &Path, reader: impl Read, len: u64, budget: MemoryBudget) -> Result<Matrix> {
    let mut reader = reader.take(len);
    // The first two bytes say whether the content is gzip; they are put back in front.
    let mut prefix = [0u8; 2];
    let mut got = 0;
    while got < prefix.len() {
        match reader.read(&mut prefix[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(super::io_error(path, e)),
        }
    }
    let gzipped =
        path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz")) || prefix[..got] == GZIP_MAGIC;
    let reader = std::io::Cursor::new(prefix).take(got as u64).chain(reader);
    if gzipped {
        // MultiGzDecoder reads members one after the other, as `gzip -d` does: a file made by
        // `cat a.gz b.gz` holds what `cat a b` would.
        decode_stream(Source::gunzip(path, FORMAT, reader, len), budget)
    } else {
        decode_stream(Source::new(path, FORMAT, reader, len), budget)
    }
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

    /// Decodes `count` elements from `src` into `out`, as f32.
    fn decode<R: Read>(self, src: &mut Source<'_, R>, count: u64, out: &mut Vec<f32>) -> std::io::Result<()> {
        match self {
            Self::U8 => src.read_into(count, out, |[b]: [u8; 1]| f32::from(b)),
            Self::F32 => src.read_into(count, out, f32::from_be_bytes),
        }
    }
}

/// Decodes the IDX content of `src` (the file itself, or what its gzip stream inflates to).
///
/// The header is read first; the data it declares must fit the stream's length (for a plain
/// file: be exactly what follows the header; for gzip: fit in what the compressed size can
/// inflate to) and the memory budget before the output is allocated, and then exactly that
/// much data is decoded into it.
fn decode_stream<R: Read>(mut src: Source<'_, R>, budget: MemoryBudget) -> Result<Matrix> {
    let mut magic = [0u8; 4];
    let got = src.read_upto(&mut magic).map_err(|e| src.error(e, "the magic"))?;
    if got == 0 {
        return Err(src.invalid("no vectors: the file is empty"));
    }
    if got < magic.len() {
        return Err(src.invalid(format!("truncated: the 4-byte magic is cut off after {got} bytes")));
    }
    let [zero0, zero1, code, ndim] = magic;
    if (zero0, zero1) != (0, 0) {
        return Err(src.invalid(format!(
            "bad magic 0x{:08X}: an IDX file starts with two zero bytes",
            u32::from_be_bytes(magic)
        )));
    }
    let elem = Elem::from_code(code).ok_or_else(|| {
        src.invalid(format!(
            "unsupported element type 0x{code:02X} (supported: 0x08 unsigned byte, 0x0D float32)"
        ))
    })?;
    // At most 255 sizes of 4 bytes: the header's own allocation is bounded by the format.
    let sizes_len = 4 * usize::from(ndim);
    let mut sizes = vec![0u8; sizes_len];
    let got = src.read_upto(&mut sizes).map_err(|e| src.error(e, "the dimension sizes"))?;
    if got < sizes_len {
        return Err(src.invalid(format!(
            "truncated: the {ndim} dimension sizes need {sizes_len} bytes after the magic, but only \
             {got} follow"
        )));
    }
    let sizes: Vec<u64> = sizes.as_chunks().0.iter().map(|b| u64::from(u32::from_be_bytes(*b))).collect();
    let shape = sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(" x ");

    let Some((&rows, vector_sizes)) = sizes.split_first() else {
        return Err(src.invalid("the magic declares 0 dimensions"));
    };
    let dim = vector_sizes.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let needed = dim.and_then(|d| d.checked_mul(rows)?.checked_mul(elem.size()));
    let (Some(dim), Some(needed)) = (dim, needed) else {
        return Err(src.invalid(format!("sizes {shape} overflow a 64-bit byte count")));
    };
    if rows == 0 || dim == 0 {
        return Err(src.invalid(format!("no vectors: sizes {shape} hold no elements")));
    }
    let header_len = src.pos();
    match src.compressed() {
        None => {
            let len = src.len() - header_len;
            if needed > len {
                return Err(src.invalid(format!(
                    "truncated: sizes {shape} need {needed} bytes of data, but only {len} follow the \
                     header"
                )));
            }
            if needed < len {
                return Err(src.invalid(format!(
                    "{} unexpected bytes after the {needed} bytes of data of sizes {shape}",
                    len - needed
                )));
            }
        }
        Some(compressed) => {
            // Nothing in the stream is trusted to size the output: what the compressed size can
            // inflate to is the cap (the memory budget is checked next).
            let cap = src.len().saturating_sub(header_len);
            if needed > cap {
                return Err(src.invalid(format!(
                    "sizes {shape} need {needed} bytes of data, but a gzip stream of {compressed} \
                     bytes inflates to at most {} bytes (deflate expands at most \
                     {MAX_DEFLATE_RATIO}:1): a corrupt header or a gzip bomb",
                    src.len()
                )));
            }
        }
    }
    let mut data = allocate(src.path(), FORMAT, rows, dim, budget)?;
    elem.decode(&mut src, rows * dim, &mut data)
        .map_err(|e| src.error(e, format_args!("the {needed} bytes of data of sizes {shape}")))?;
    if src.compressed().is_some() {
        // Reading on to the end also verifies the gzip trailer's checksum and length.
        let at_end = src.at_end().map_err(|e| src.error(e, "the gzip trailer"))?;
        if !at_end {
            return Err(src.invalid(format!(
                "unexpected data after the {needed} bytes of data of sizes {shape}: the gzip \
                 stream inflates to more than the IDX header declares"
            )));
        }
    }
    // The data fit in the allocation, so both fit in usize.
    Ok(Matrix { rows: rows as usize, dim: dim as usize, data })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::super::test_support::{Counting, TempDir, invalid_reason};
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

    /// Decodes `bytes` as a gzipped IDX file, and returns the result with how many of the
    /// compressed bytes were read.
    fn decode_gz(name: &str, bytes: &[u8], budget: MemoryBudget) -> (Result<Matrix>, u64) {
        let count = std::rc::Rc::new(std::cell::Cell::new(0));
        let reader = Counting { inner: bytes, count: count.clone() };
        let result = decode_idx(Path::new(name), reader, bytes.len() as u64, budget);
        (result, count.get())
    }

    /// A gzipped IDX file: the header of `sizes` (u8 elements), then `mib` MiB of zeros, built
    /// as one gzip member per MiB (a multi-member stream) so a large bomb is cheap to make.
    fn gzip_bomb(sizes: &[u32], mib: usize) -> Vec<u8> {
        let zeros = gzip(&vec![0; 1 << 20]);
        let mut bytes = gzip(&idx(0x08, sizes, &[]));
        for _ in 0..mib {
            bytes.extend_from_slice(&zeros);
        }
        bytes
    }

    #[test]
    fn a_gzip_bomb_whose_header_declares_more_than_the_stream_can_inflate_is_refused_at_once() {
        // 4 GiB declared; 256 MiB of zeros follow, compressed to some 256 KiB, which can
        // inflate to some 256 MiB at most: refused from the header, before any data is
        // inflated, having read only the start of the stream.
        let bomb = gzip_bomb(&[u32::MAX, 1], 256);
        assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
        let started = std::time::Instant::now();
        let (result, read) = decode_gz("bomb-idx2-ubyte.gz", &bomb, MemoryBudget::Process);
        let reason = invalid_reason(result, "idx");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        let cap = bomb.len() as u64 * MAX_DEFLATE_RATIO;
        for size in
            ["4294967295 bytes of data", &format!("{} bytes", bomb.len()), &format!("at most {cap} bytes")]
        {
            assert!(reason.contains(size), "{reason} does not mention {size}");
        }
        assert!(read <= 64 << 10, "read {read} of {} compressed bytes", bomb.len());
    }

    #[test]
    fn a_gzip_stream_with_a_small_lying_header_is_refused_at_the_first_extra_byte() {
        // 8 bytes declared, 256 MiB follow: the first byte past the 8 is the error; the rest
        // is neither inflated nor kept.
        let bomb = gzip_bomb(&[2, 2, 2], 256);
        let started = std::time::Instant::now();
        let (result, read) = decode_gz("liar-idx3-ubyte.gz", &bomb, MemoryBudget::Process);
        let reason = invalid_reason(result, "idx");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        assert!(
            reason.contains("unexpected data after the 8 bytes") && reason.contains("2 x 2 x 2"),
            "{reason}"
        );
        assert!(read <= 64 << 10, "read {read} of {} compressed bytes", bomb.len());
    }

    #[test]
    fn gzipped_data_beyond_the_memory_budget_is_refused_before_it_is_inflated() {
        // 1 MiB of u8 pixels is 4 MiB of f32: within what the stream can inflate to, beyond
        // the budget.
        let bytes = gzip_bomb(&[1024, 32, 32], 1);
        let (result, _) = decode_gz("budget-idx3-ubyte.gz", &bytes, MemoryBudget::Fixed((4 << 20) - 1));
        match result {
            Err(HiveGpuError::OutOfMemory { what, requested, available, .. }) => {
                assert_eq!((requested, available), (4 << 20, (4 << 20) - 1));
                assert!(what.contains("budget-idx3-ubyte.gz") && what.contains("1024 x 1024"), "{what}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        let (result, _) = decode_gz("budget-idx3-ubyte.gz", &bytes, MemoryBudget::Fixed(4 << 20));
        assert_eq!(result.expect("within the budget").rows, 1024);
    }

    #[test]
    fn gzip_members_one_after_another_read_as_one_stream() {
        // As `gzip -d` reads `cat a.gz b.gz`: the header and half the data in one member, the
        // rest in a second.
        let raw = images();
        let (head, tail) = raw.split_at(raw.len() - 5);
        let bytes = [gzip(head), gzip(tail)].concat();
        let (result, _) = decode_gz("two-members-ubyte.gz", &bytes, MemoryBudget::Process);
        assert_eq!(result.expect("two members"), expected_images());
    }

    #[test]
    fn gzipped_data_shorter_than_its_sizes_is_truncated_with_the_sizes() {
        let mut raw = images();
        raw.pop();
        let (result, _) = decode_gz("short-ubyte.gz", &gzip(&raw), MemoryBudget::Process);
        let reason = invalid_reason(result, "idx");
        assert!(reason.contains("truncated") && reason.contains("2 x 2 x 3"), "{reason}");
    }

    #[test]
    fn a_gzip_trailer_that_does_not_match_the_data_is_refused() {
        // The CRC32 is the 8th to 5th last byte: the data decodes, its checksum does not match.
        let mut bytes = gzip(&images());
        let crc = bytes.len() - 8;
        bytes[crc] ^= 0xFF;
        let (result, _) = decode_gz("crc-ubyte.gz", &bytes, MemoryBudget::Process);
        let reason = invalid_reason(result, "idx");
        assert!(reason.contains("gunzip"), "{reason}");
    }

    #[test]
    fn trailing_garbage_after_the_gzip_stream_is_refused() {
        let mut bytes = gzip(&images());
        bytes.extend_from_slice(b"garbage");
        let (result, _) = decode_gz("garbage-ubyte.gz", &bytes, MemoryBudget::Process);
        invalid_reason(result, "idx");
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
        let parse = |bytes: &[u8]| decode_idx(path, bytes, bytes.len() as u64, MemoryBudget::Process);
        for len in 0..bytes.len() {
            invalid_reason(parse(&bytes[..len]), "idx");
        }
        assert!(parse(&bytes).is_ok());
        let gz = gzip(&bytes);
        for len in 0..gz.len() {
            let (result, _) = decode_gz("prefix-ubyte.gz", &gz[..len], MemoryBudget::Process);
            invalid_reason(result, "idx");
        }
    }
}
