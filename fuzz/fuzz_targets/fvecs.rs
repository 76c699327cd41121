//! Fuzzes the `.fvecs` decoder; a decoded matrix must re-encode to the input, bit for bit.
#![no_main]

#[path = "common.rs"]
mod common;

use hive_gpu::io::{VectorFormat, decode_vectors};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decode =
        |bytes: &[u8], len| decode_vectors(VectorFormat::Fvecs, common::name("fuzz.fvecs"), bytes, len);
    if let Ok(m) = common::decode_three_ways(data, false, decode) {
        common::check_shape(m.rows, m.dim, m.data.len());
        let mut encoded = Vec::with_capacity(data.len());
        for row in m.data.chunks(m.dim) {
            encoded.extend_from_slice(&(m.dim as i32).to_le_bytes());
            row.iter().for_each(|x| encoded.extend_from_slice(&x.to_le_bytes()));
        }
        assert!(encoded == data, "the decoded matrix does not re-encode to the input");
        // The in-memory entry point is the same decoder.
        let parsed = hive_gpu::io::parse_fvecs(common::name("fuzz.fvecs"), data).expect("parse_fvecs");
        assert!(parsed.data.iter().zip(&m.data).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
});
