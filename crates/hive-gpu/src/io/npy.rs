//! NumPy `.npy` files (format versions 1.0, 2.0 and 3.0): the magic `\x93NUMPY`, a version,
//! a little-endian header length, a Python dict literal with `descr`, `fortran_order` and
//! `shape`, then the raw array data.

use std::io::Read;
use std::path::Path;

use half::f16;

use super::source::{MemoryBudget, Source, allocate, open_regular};
use super::{Matrix, invalid};
use crate::error::Result;

const FORMAT: &str = "npy";
const MAGIC: &[u8] = b"\x93NUMPY";

/// The longest header read. NumPy's own reader refuses longer ones by default
/// (`max_header_size`, 10000 since NumPy 1.24); a header of the dtypes read here is about 128
/// bytes, so a longer one is corrupt and must not make us allocate what it claims.
const MAX_HEADER_LEN: u64 = 10_000;

/// The keys of an npy header: NumPy refuses a header whose keys are not exactly these.
const KEYS: [&str; 3] = ["descr", "fortran_order", "shape"];

/// Reads a `.npy` file holding a 2-D array (or a 1-D array, read as one row) in C order, of
/// dtype `<f4`, `>f4`, `<f2`, `>f2` (half floats widened to f32) or `|u1` / `<u1` (widened
/// to f32).
///
/// # Errors
/// [`HiveGpuError::Io`](crate::error::HiveGpuError::Io) when the file cannot be read or is
/// not a regular file;
/// [`HiveGpuError::InvalidFormat`](crate::error::HiveGpuError::InvalidFormat) for a bad
/// magic or version, an unparsable header (longer than 10000 bytes, a key repeated, a key
/// other than `descr`, `fortran_order` and `shape`), another dtype, `fortran_order: True`,
/// more than two dimensions, an empty array, or data that does not match the shape;
/// [`HiveGpuError::OutOfMemory`](crate::error::HiveGpuError::OutOfMemory) when the array does
/// not fit in the memory this process may still take.
pub fn read_npy(path: &Path) -> Result<Matrix> {
    let (file, len) = open_regular(path)?;
    decode_npy(path, file, len, MemoryBudget::Process)
}

/// Decodes `len` bytes of npy from `reader`: the shape must account for every byte after the
/// header before the output is allocated.
pub(super) fn decode_npy(path: &Path, reader: impl Read, len: u64, budget: MemoryBudget) -> Result<Matrix> {
    let mut src = Source::new(path, FORMAT, reader, len);
    let header = read_header(&mut src)?;
    let header = parse_header(path, &header)?;
    if header.fortran_order {
        return Err(invalid(
            path,
            FORMAT,
            "fortran_order is True (column-major); only C-order arrays are supported \
             (save np.ascontiguousarray(a) instead)",
        ));
    }
    let dtype = Dtype::from_descr(&header.descr).ok_or_else(|| {
        invalid(
            path,
            FORMAT,
            format!("unsupported dtype {:?} (supported: '<f4', '>f4', '<f2', '>f2', '|u1')", header.descr),
        )
    })?;
    let (rows, dim) = matrix_shape(path, &header.shape)?;
    check_data_len(path, &header.shape, rows, dim, dtype, len - src.pos())?;
    let mut data = allocate(path, FORMAT, rows, dim, budget)?;
    dtype.decode(&mut src, rows * dim, &mut data).map_err(|e| src.error(e, "the array data"))?;
    // The data length was checked, and its allocation succeeded: both fit in usize.
    Ok(Matrix { rows: rows as usize, dim: dim as usize, data })
}

/// Reads the magic, the version and the header, and returns the header's text.
fn read_header<R: Read>(src: &mut Source<'_, R>) -> Result<Vec<u8>> {
    let mut magic = [0u8; MAGIC.len()];
    let got = src.read_upto(&mut magic).map_err(|e| src.error(e, "the magic"))?;
    if magic[..got] != *MAGIC {
        return Err(src.invalid("bad magic: the file does not start with \\x93NUMPY"));
    }
    let truncated = |src: &Source<'_, R>| src.invalid("truncated: the file ends inside the preamble");
    let mut version = [0u8; 2];
    if src.read_upto(&mut version).map_err(|e| src.error(e, "the preamble"))? < 2 {
        return Err(truncated(src));
    }
    // Version 1.0 stores the header length in 2 bytes; 2.0 and 3.0 (UTF-8 header) in 4.
    let len_size = match version {
        [1, 0] => 2,
        [2, 0] | [3, 0] => 4,
        [major, minor] => {
            return Err(
                src.invalid(format!("unsupported format version {major}.{minor} (supported: 1.0, 2.0, 3.0)"))
            );
        }
    };
    let mut len_bytes = [0u8; 4];
    if src.read_upto(&mut len_bytes[..len_size]).map_err(|e| src.error(e, "the preamble"))? < len_size {
        return Err(truncated(src));
    }
    let header_len = u64::from(u32::from_le_bytes(len_bytes));
    let left = src.len() - src.pos();
    if header_len > left {
        return Err(src.invalid(format!(
            "truncated: the header is {header_len} bytes long, but only {left} bytes follow the \
             preamble"
        )));
    }
    if header_len > MAX_HEADER_LEN {
        return Err(src.invalid(format!(
            "the header is {header_len} bytes long; headers longer than {MAX_HEADER_LEN} bytes \
             are refused, as NumPy refuses them by default (max_header_size)"
        )));
    }
    // At most MAX_HEADER_LEN bytes, and within the file.
    let mut header = vec![0u8; header_len as usize];
    src.read_exact(&mut header).map_err(|e| src.error(e, "the header"))?;
    Ok(header)
}

/// The three keys of an npy header.
#[derive(Debug, PartialEq)]
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

fn parse_header(path: &Path, header: &[u8]) -> Result<Header> {
    let bad = |reason: String| invalid(path, FORMAT, reason);
    let mut parser = Parser { text: header, pos: 0 };
    let entries =
        parser.dict().map_err(|e| bad(format!("cannot parse the header at byte {}: {e}", parser.pos)))?;
    for (i, (key, _)) in entries.iter().enumerate() {
        if !KEYS.contains(&key.as_str()) {
            return Err(bad(format!(
                "unexpected key {key:?} in the header: an npy header holds exactly 'descr', \
                 'fortran_order' and 'shape' (NumPy refuses any other)"
            )));
        }
        if entries[..i].iter().any(|(k, _)| k == key) {
            // Python's dict literal keeps the last value and a first-match reader the first:
            // the two would read different arrays from the same file.
            return Err(bad(format!("the header repeats the key {key:?}; each key must appear once")));
        }
    }
    let find = |key: &str| {
        entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| bad(format!("the header has no '{key}' key")))
    };
    let Value::Str(descr) = find("descr")? else {
        return Err(bad("'descr' is not a string (structured dtypes are not supported)".into()));
    };
    let &Value::Bool(fortran_order) = find("fortran_order")? else {
        return Err(bad("'fortran_order' is not True or False".into()));
    };
    let Value::Tuple(items) = find("shape")? else {
        return Err(bad("'shape' is not a tuple".into()));
    };
    let shape = items
        .iter()
        .map(|item| match item {
            Value::Int(n) => Ok(*n),
            _ => Err(bad("'shape' holds something other than integers".into())),
        })
        .collect::<Result<Vec<u64>>>()?;
    Ok(Header { descr: descr.clone(), fortran_order, shape })
}

/// `(rows, dim)` of a 1-D or 2-D shape with at least one element.
fn matrix_shape(path: &Path, shape: &[u64]) -> Result<(u64, u64)> {
    let (rows, dim) = match *shape {
        [n] => (1, n),
        [rows, dim] => (rows, dim),
        _ => {
            return Err(invalid(
                path,
                FORMAT,
                format!(
                    "the array is {}-dimensional (shape {}); only 1-D and 2-D arrays are \
                     supported",
                    shape.len(),
                    show_shape(shape)
                ),
            ));
        }
    };
    if rows == 0 || dim == 0 {
        return Err(invalid(
            path,
            FORMAT,
            format!("no vectors: the array's shape {} holds no elements", show_shape(shape)),
        ));
    }
    Ok((rows, dim))
}

/// Checks that the `len` bytes after the header are exactly the data of the shape, before
/// anything is allocated for it.
fn check_data_len(path: &Path, shape: &[u64], rows: u64, dim: u64, dtype: Dtype, len: u64) -> Result<()> {
    let needed = rows.checked_mul(dim).and_then(|n| n.checked_mul(dtype.size()));
    let reason = match needed {
        None => format!("shape {} overflows a 64-bit byte count", show_shape(shape)),
        Some(needed) if needed > len => format!(
            "truncated: shape {} needs {needed} bytes of data, but only {len} follow the header",
            show_shape(shape)
        ),
        Some(needed) if needed < len => format!(
            "{} unexpected bytes after the {needed} bytes of data of shape {}",
            len - needed,
            show_shape(shape)
        ),
        Some(_) => return Ok(()),
    };
    Err(invalid(path, FORMAT, reason))
}

/// A shape written as Python writes it: `(3,)`, `(10, 128)`.
fn show_shape(shape: &[u64]) -> String {
    match shape {
        [n] => format!("({n},)"),
        _ => {
            let items: Vec<String> = shape.iter().map(u64::to_string).collect();
            format!("({})", items.join(", "))
        }
    }
}

/// The element types this reader decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dtype {
    F4Le,
    F4Be,
    F2Le,
    F2Be,
    U1,
}

impl Dtype {
    fn from_descr(descr: &str) -> Option<Self> {
        match descr {
            "<f4" => Some(Self::F4Le),
            ">f4" => Some(Self::F4Be),
            "<f2" => Some(Self::F2Le),
            ">f2" => Some(Self::F2Be),
            // A single byte has no byte order; NumPy writes '|u1', others write '<u1'.
            "|u1" | "<u1" | ">u1" | "=u1" => Some(Self::U1),
            _ => None,
        }
    }

    fn size(self) -> u64 {
        match self {
            Self::F4Le | Self::F4Be => 4,
            Self::F2Le | Self::F2Be => 2,
            Self::U1 => 1,
        }
    }

    /// Decodes `count` elements from `src` into `out`, widened to f32.
    fn decode<R: Read>(self, src: &mut Source<'_, R>, count: u64, out: &mut Vec<f32>) -> std::io::Result<()> {
        match self {
            Self::F4Le => src.read_into(count, out, f32::from_le_bytes),
            Self::F4Be => src.read_into(count, out, f32::from_be_bytes),
            Self::F2Le => src.read_into(count, out, |b| f16::from_le_bytes(b).to_f32()),
            Self::F2Be => src.read_into(count, out, |b| f16::from_be_bytes(b).to_f32()),
            Self::U1 => src.read_into(count, out, |[b]: [u8; 1]| f32::from(b)),
        }
    }
}

/// A value of the header's Python literal, as far as npy headers use them.
#[derive(Debug, PartialEq)]
enum Value {
    Str(String),
    Bool(bool),
    Int(u64),
    Tuple(Vec<Value>),
}

/// Tuples deeper than this are not an npy header; the limit keeps recursion bounded.
const MAX_DEPTH: usize = 8;

/// A recursive-descent parser for the dict literal NumPy writes with `repr`.
struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    /// `{key: value, ...}` followed by nothing but padding.
    fn dict(&mut self) -> std::result::Result<Vec<(String, Value)>, String> {
        self.expect(b'{')?;
        let mut entries = Vec::new();
        while !self.eat(b'}') {
            let Value::Str(key) = self.value(0)? else {
                return Err("a dict key is not a string".into());
            };
            self.expect(b':')?;
            let value = self.value(0)?;
            entries.push((key, value));
            if !self.eat(b',') {
                self.expect(b'}')?;
                break;
            }
        }
        self.skip_space();
        match self.peek() {
            None => Ok(entries),
            Some(_) => Err("unexpected text after the dict".into()),
        }
    }

    fn value(&mut self, depth: usize) -> std::result::Result<Value, String> {
        self.skip_space();
        match self.peek() {
            Some(quote @ (b'\'' | b'"')) => self.string(quote).map(Value::Str),
            Some(b'(') if depth < MAX_DEPTH => self.tuple(depth + 1).map(Value::Tuple),
            Some(b'0'..=b'9') => self.int().map(Value::Int),
            Some(b'T' | b'F') => self.bool().map(Value::Bool),
            Some(b'[') => Err("lists (structured dtypes) are not supported".into()),
            Some(c) => Err(format!("unexpected character {:?}", char::from(c))),
            None => Err("the header ends where a value was expected".into()),
        }
    }

    fn string(&mut self, quote: u8) -> std::result::Result<String, String> {
        self.pos += 1;
        let rest = self.text.get(self.pos..).unwrap_or_default();
        let len = rest.iter().position(|&c| c == quote).ok_or("unterminated string")?;
        let raw = &rest[..len];
        if raw.contains(&b'\\') {
            return Err("escape sequences in strings are not supported".into());
        }
        self.pos += len + 1;
        String::from_utf8(raw.to_vec()).map_err(|_| "a string is not UTF-8".into())
    }

    fn tuple(&mut self, depth: usize) -> std::result::Result<Vec<Value>, String> {
        self.pos += 1;
        let mut items = Vec::new();
        while !self.eat(b')') {
            items.push(self.value(depth)?);
            if !self.eat(b',') {
                self.expect(b')')?;
                break;
            }
        }
        Ok(items)
    }

    fn int(&mut self) -> std::result::Result<u64, String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits = std::str::from_utf8(&self.text[start..self.pos]).unwrap_or_default();
        let n = digits.parse().map_err(|_| format!("integer {digits} is too large"))?;
        // Python 2 wrote longs as `10L`.
        self.eat(b'L');
        Ok(n)
    }

    fn bool(&mut self) -> std::result::Result<bool, String> {
        for (word, value) in [(&b"True"[..], true), (&b"False"[..], false)] {
            if self.text.get(self.pos..).is_some_and(|rest| rest.starts_with(word)) {
                self.pos += word.len();
                return Ok(value);
            }
        }
        Err("expected True or False".into())
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    /// Consumes `c` (after any space) if it comes next.
    fn eat(&mut self, c: u8) -> bool {
        self.skip_space();
        let found = self.peek() == Some(c);
        if found {
            self.pos += 1;
        }
        found
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.eat(c) { Ok(()) } else { Err(format!("expected {:?}", char::from(c))) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{TempDir, invalid_reason};
    use super::*;
    use crate::error::HiveGpuError;

    /// An npy file as NumPy writes it: the header padded with spaces and a newline so the
    /// data starts on a 64-byte boundary.
    fn npy(major: u8, header: &str, data: &[u8]) -> Vec<u8> {
        let len_size = if major == 1 { 2 } else { 4 };
        let unpadded = MAGIC.len() + 2 + len_size + header.len() + 1;
        let mut text = header.to_string();
        text.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
        text.push('\n');
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[major, 0]);
        let len = text.len() as u32;
        bytes.extend_from_slice(&len.to_le_bytes()[..len_size]);
        bytes.extend_from_slice(text.as_bytes());
        bytes.extend_from_slice(data);
        bytes
    }

    fn dict(descr: &str, shape: &str) -> String {
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}")
    }

    fn f32_le(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn read(test: &str, bytes: &[u8]) -> Result<Matrix> {
        let dir = TempDir::new(test);
        read_npy(&dir.write("a.npy", bytes))
    }

    #[test]
    fn reads_v1_f4() {
        let values = [1.0, -2.5, 3.0, 4.0, 5.0, 6.5];
        let bytes = npy(1, &dict("<f4", "(2, 3)"), &f32_le(&values));
        assert_eq!(bytes.len() % 64, 24, "data starts on a 64-byte boundary");
        let m = read("reads_v1_f4", &bytes).expect("read");
        assert_eq!(m, Matrix { rows: 2, dim: 3, data: values.to_vec() });
    }

    #[test]
    fn reads_v2_and_v3_headers() {
        let data = f32_le(&[1.0, 2.0]);
        for major in [2, 3] {
            let m =
                read("reads_v2_and_v3_headers", &npy(major, &dict("<f4", "(1, 2)"), &data)).expect("read");
            assert_eq!(m.data, [1.0, 2.0], "version {major}.0");
        }
    }

    #[test]
    fn reads_big_endian_f4() {
        let data: Vec<u8> = [1.5f32, -8.0].iter().flat_map(|x| x.to_be_bytes()).collect();
        let m = read("reads_big_endian_f4", &npy(1, &dict(">f4", "(2, 1)"), &data)).expect("read");
        assert_eq!(m, Matrix { rows: 2, dim: 1, data: vec![1.5, -8.0] });
    }

    #[test]
    fn reads_f2_widened_to_f32() {
        let halves = [0.5f32, -1.0, 65504.0, 0.099975586];
        let data: Vec<u8> = halves.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect();
        let m = read("reads_f2_widened_to_f32", &npy(1, &dict("<f2", "(2, 2)"), &data)).expect("read");
        assert_eq!(m, Matrix { rows: 2, dim: 2, data: halves.to_vec() });
    }

    #[test]
    fn reads_u1_widened_to_f32() {
        for descr in ["|u1", "<u1"] {
            let m =
                read("reads_u1_widened_to_f32", &npy(1, &dict(descr, "(3, 2)"), &[0, 1, 2, 127, 128, 255]))
                    .expect("read");
            assert_eq!(m.data, [0.0, 1.0, 2.0, 127.0, 128.0, 255.0], "{descr}");
            assert_eq!((m.rows, m.dim), (3, 2));
        }
    }

    #[test]
    fn one_d_array_is_one_row() {
        let m = read("one_d_array_is_one_row", &npy(1, &dict("<f4", "(3,)"), &f32_le(&[1.0, 2.0, 3.0])))
            .expect("read");
        assert_eq!((m.rows, m.dim), (1, 3));
    }

    #[test]
    fn accepts_header_variants() {
        // Key order, double quotes, Python 2 longs and missing trailing commas all occur.
        let header = "{\"shape\": (2L, 1L), \"fortran_order\": False, \"descr\": \"<f4\"}";
        let m = read("accepts_header_variants", &npy(1, header, &f32_le(&[1.0, 2.0]))).expect("read");
        assert_eq!((m.rows, m.dim), (2, 1));
    }

    #[test]
    fn rejects_fortran_order() {
        let header = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }";
        let bytes = npy(1, header, &f32_le(&[1.0, 2.0, 3.0, 4.0]));
        let reason = invalid_reason(read("rejects_fortran_order", &bytes), "npy");
        assert!(reason.contains("fortran_order"), "{reason}");
    }

    #[test]
    fn rejects_bad_magic() {
        let mut bytes = npy(1, &dict("<f4", "(1, 1)"), &f32_le(&[1.0]));
        bytes[1] = b'n';
        let reason = invalid_reason(read("rejects_bad_magic", &bytes), "npy");
        assert!(reason.contains("magic"), "{reason}");
    }

    #[test]
    fn rejects_unsupported_version() {
        let mut bytes = npy(1, &dict("<f4", "(1, 1)"), &f32_le(&[1.0]));
        bytes[6] = 4;
        let reason = invalid_reason(read("rejects_unsupported_version", &bytes), "npy");
        assert!(reason.contains("version 4.0"), "{reason}");
    }

    #[test]
    fn rejects_unsupported_dtype() {
        let bytes = npy(1, &dict("<f8", "(1, 1)"), &[0; 8]);
        let reason = invalid_reason(read("rejects_unsupported_dtype", &bytes), "npy");
        assert!(reason.contains("<f8"), "{reason}");
    }

    #[test]
    fn rejects_structured_dtype() {
        let header = "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }";
        let bytes = npy(1, header, &[0; 4]);
        invalid_reason(read("rejects_structured_dtype", &bytes), "npy");
    }

    #[test]
    fn rejects_truncated_data() {
        let bytes = npy(1, &dict("<f4", "(2, 3)"), &f32_le(&[1.0; 5]));
        let reason = invalid_reason(read("rejects_truncated_data", &bytes), "npy");
        assert!(reason.contains("truncated") && reason.contains("(2, 3)"), "{reason}");
    }

    #[test]
    fn rejects_trailing_data() {
        let bytes = npy(1, &dict("<f4", "(1, 1)"), &f32_le(&[1.0, 2.0]));
        let reason = invalid_reason(read("rejects_trailing_data", &bytes), "npy");
        assert!(reason.contains("4 unexpected bytes"), "{reason}");
    }

    #[test]
    fn rejects_shapes_beyond_the_file() {
        let dir = TempDir::new("rejects_shapes_beyond_the_file");
        for shape in ["(4294967296, 4294967296)", "(18446744073709551615, 2)", "(1000000000000,)"] {
            let path = dir.write("big.npy", &npy(1, &dict("<f4", shape), &[0; 16]));
            invalid_reason(read_npy(&path), "npy");
        }
        let path = dir.write("huge.npy", &npy(1, &dict("<f4", "(99999999999999999999, 1)"), &[]));
        let reason = invalid_reason(read_npy(&path), "npy");
        assert!(reason.contains("too large"), "{reason}");
    }

    #[test]
    fn rejects_header_length_past_the_end() {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[2, 0]);
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(b"{'descr': '<f4'");
        let reason = invalid_reason(read("rejects_header_length_past_the_end", &bytes), "npy");
        assert!(reason.contains("truncated"), "{reason}");
    }

    #[test]
    fn rejects_other_dimensionalities_and_empty_arrays() {
        let dir = TempDir::new("rejects_other_dimensionalities_and_empty_arrays");
        for (shape, expected) in [
            ("(2, 2, 2)", "3-dimensional"),
            ("()", "0-dimensional"),
            ("(0, 128)", "no vectors"),
            ("(5, 0)", "no vectors"),
            ("(0,)", "no vectors"),
        ] {
            let path = dir.write("a.npy", &npy(1, &dict("<f4", shape), &[0; 32]));
            let reason = invalid_reason(read_npy(&path), "npy");
            assert!(reason.contains(expected), "{shape}: {reason}");
        }
    }

    #[test]
    fn rejects_malformed_headers() {
        let dir = TempDir::new("rejects_malformed_headers");
        let deep = format!("{{'shape': {}1{}}}", "(".repeat(10_000), ")".repeat(10_000));
        for header in [
            "",
            "not a dict",
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ('a',)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,) extra",
            "{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}",
            "{'descr': '<\\x66', 'fortran_order': False, 'shape': (1,)}",
            "{1: 2}",
            &deep,
        ] {
            let path = dir.write("a.npy", &npy(1, header, &[0; 4]));
            invalid_reason(read_npy(&path), "npy");
        }
    }

    #[test]
    fn a_header_repeating_a_key_is_refused() {
        // NumPy (a dict literal) would read the last 'shape', (2, 2); a first-match reader the
        // first, (1, 2), and the data fits either way when the second is a prefix of it.
        for header in [
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), 'shape': (2, 2), }",
            "{'descr': '<f4', 'descr': '<f2', 'fortran_order': False, 'shape': (1, 2), }",
            "{'descr': '<f4', 'fortran_order': False, 'fortran_order': True, 'shape': (1, 2), }",
        ] {
            let bytes = npy(1, header, &f32_le(&[1.0, 2.0]));
            let reason = invalid_reason(read("a_header_repeating_a_key_is_refused", &bytes), "npy");
            assert!(reason.contains("repeats the key"), "{header}: {reason}");
        }
    }

    #[test]
    fn a_header_with_a_key_numpy_does_not_know_is_refused() {
        for (header, key) in [
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), 'extra': 1, }", "extra"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), 'Shape': (9, 9), }", "Shape"),
        ] {
            let bytes = npy(1, header, &f32_le(&[1.0, 2.0]));
            let reason = invalid_reason(read("a_header_with_an_unknown_key", &bytes), "npy");
            assert!(reason.contains("unexpected key") && reason.contains(key), "{reason}");
        }
    }

    #[test]
    fn a_header_longer_than_numpy_reads_is_refused_before_it_is_read() {
        let long = format!("{}{}", dict("<f4", "(1, 2)"), " ".repeat(20_000));
        let bytes = npy(2, &long, &f32_le(&[1.0, 2.0]));
        let reason = invalid_reason(read("a_header_longer_than_numpy_reads", &bytes), "npy");
        assert!(reason.contains("10000"), "{reason}");
    }

    #[test]
    fn an_array_beyond_the_memory_budget_is_refused_before_decoding() {
        let bytes = npy(1, &dict("|u1", "(3, 2)"), &[0, 1, 2, 3, 4, 5]);
        let path = Path::new("budget.npy");
        // Six bytes in the file are six f32, 24 bytes, in memory.
        match decode_npy(path, &bytes[..], bytes.len() as u64, MemoryBudget::Fixed(23)) {
            Err(HiveGpuError::OutOfMemory { what, requested: 24, available: 23, .. }) => {
                assert!(what.contains("budget.npy") && what.contains("3 x 2"), "{what}");
            }
            other => panic!("expected OutOfMemory for 24 of 23 bytes, got {other:?}"),
        }
        assert!(decode_npy(path, &bytes[..], bytes.len() as u64, MemoryBudget::Fixed(24)).is_ok());
    }

    #[test]
    fn missing_file_is_io_error() {
        let dir = TempDir::new("npy_missing_file_is_io_error");
        let result = read_npy(&dir.path("absent.npy"));
        assert!(matches!(result, Err(HiveGpuError::Io { .. })), "{result:?}");
    }

    #[test]
    fn every_prefix_is_rejected_without_panic() {
        let bytes = npy(1, &dict("<f4", "(2, 2)"), &f32_le(&[1.0, 2.0, 3.0, 4.0]));
        let path = Path::new("prefix.npy");
        let parse = |bytes: &[u8]| decode_npy(path, bytes, bytes.len() as u64, MemoryBudget::Process);
        for len in 0..bytes.len() {
            invalid_reason(parse(&bytes[..len]), "npy");
        }
        assert!(parse(&bytes).is_ok());
    }
}
