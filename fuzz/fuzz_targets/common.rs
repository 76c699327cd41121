//! What every fuzz target checks besides "no panic": each decoder run three ways over the same
//! bytes must agree with itself, so the length bound (`Read::take`) and the truncation paths
//! are fuzzed along with the formats.

use std::fmt::Debug;
use std::path::Path;

use hive_gpu::Result;

/// Decodes `data` with `decode(reader, len)` as a whole, as a file that grew after it was
/// opened (the length says one byte less than the stream holds) and as one that shrank (the
/// length says one byte more), and checks what each must give. Returns the whole decode.
pub fn decode_three_ways<T: Debug>(
    data: &[u8],
    inflates: bool,
    decode: impl Fn(&[u8], u64) -> Result<T>,
) -> Result<T> {
    let len = data.len() as u64;
    let whole = decode(data, len);
    if let Some(last) = len.checked_sub(1) {
        // Reading stops at the length: the same as decoding the bytes up to it, message and all.
        let grown = decode(data, last);
        let prefix = decode(&data[..data.len() - 1], last);
        assert_eq!(format!("{grown:?}"), format!("{prefix:?}"), "a stream longer than its length");
    }
    let shrunk = decode(data, len + 1);
    if !inflates {
        // An uncompressed format must read every byte its length promises before it succeeds.
        // (For gzip the length only bounds what the stream may inflate to.)
        assert!(shrunk.is_err(), "a stream shorter than its length decoded: {shrunk:?}");
    }
    whole
}

/// `rows * dim == data.len()`, both nonzero.
pub fn check_shape(rows: usize, dim: usize, values: usize) {
    assert!(rows > 0 && dim > 0, "an empty matrix: {rows} x {dim}");
    assert_eq!(rows.checked_mul(dim), Some(values), "{rows} x {dim} with {values} values");
}

/// A name for the decoders' error messages.
pub fn name(name: &str) -> &Path {
    Path::new(name)
}
