//! Fuzzes the `.bvecs` decoder; a decoded matrix must re-encode to the input.
#![no_main]

#[path = "common.rs"]
mod common;

use hive_gpu::io::{VectorFormat, decode_vectors};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decode =
        |bytes: &[u8], len| decode_vectors(VectorFormat::Bvecs, common::name("fuzz.bvecs"), bytes, len);
    if let Ok(m) = common::decode_three_ways(data, false, decode) {
        common::check_shape(m.rows, m.dim, m.data.len());
        let mut encoded = Vec::with_capacity(data.len());
        for row in m.data.chunks(m.dim) {
            encoded.extend_from_slice(&(m.dim as i32).to_le_bytes());
            for &x in row {
                assert!(x.fract() == 0.0 && (0.0..=255.0).contains(&x), "{x} is no byte");
                encoded.push(x as u8);
            }
        }
        assert!(encoded == data, "the decoded matrix does not re-encode to the input");
    }
});
