//! Fuzzes the IDX decoder on uncompressed input (content starting with the gzip magic is
//! still inflated, as `read_idx` does): a decoded matrix must match a direct reading of the
//! input's data bytes.
#![no_main]

#[path = "common.rs"]
mod common;

use hive_gpu::io::{VectorFormat, decode_vectors};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let gzip = data.starts_with(&[0x1f, 0x8b]);
    let decode =
        |bytes: &[u8], len| decode_vectors(VectorFormat::Idx, common::name("fuzz-idx3-ubyte"), bytes, len);
    if let Ok(m) = common::decode_three_ways(data, gzip, decode) {
        common::check_shape(m.rows, m.dim, m.data.len());
        if !gzip {
            let header = 4 + 4 * usize::from(data[3]);
            let expected: Vec<u32> = match data[2] {
                0x08 => data[header..].iter().map(|&b| f32::from(b).to_bits()).collect(),
                0x0D => data[header..]
                    .chunks_exact(4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                code => panic!("decoded an unsupported element type 0x{code:02X}"),
            };
            assert!(
                expected.into_iter().eq(m.data.iter().map(|x| x.to_bits())),
                "values differ from the input's"
            );
        }
    }
});
