//! Fuzzes the `.ivecs` decoder; a decoded matrix must re-encode to the input.
#![no_main]

#[path = "common.rs"]
mod common;

use hive_gpu::io::decode_ivecs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decode = |bytes: &[u8], len| decode_ivecs(common::name("fuzz.ivecs"), bytes, len);
    if let Ok(m) = common::decode_three_ways(data, false, decode) {
        common::check_shape(m.rows, m.dim, m.data.len());
        let mut encoded = Vec::with_capacity(data.len());
        for row in m.data.chunks(m.dim) {
            encoded.extend_from_slice(&(m.dim as i32).to_le_bytes());
            row.iter().for_each(|x| encoded.extend_from_slice(&x.to_le_bytes()));
        }
        assert!(encoded == data, "the decoded matrix does not re-encode to the input");
        let parsed = hive_gpu::io::parse_ivecs(common::name("fuzz.ivecs"), data).expect("parse_ivecs");
        assert_eq!(parsed, m);
    }
});
