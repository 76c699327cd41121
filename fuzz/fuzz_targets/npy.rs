//! Fuzzes the `.npy` decoder: a decoded array is the data right after the header, and
//! `'<f4'` data is the input's own bits.
#![no_main]

#[path = "common.rs"]
mod common;

use hive_gpu::io::{VectorFormat, decode_vectors};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decode = |bytes: &[u8], len| decode_vectors(VectorFormat::Npy, common::name("fuzz.npy"), bytes, len);
    if let Ok(m) = common::decode_three_ways(data, false, decode) {
        common::check_shape(m.rows, m.dim, m.data.len());
        assert!(data.starts_with(b"\x93NUMPY"));
        // The preamble: magic, version, and a 2-byte (1.0) or 4-byte (2.0, 3.0) header length.
        let (start, header_len) = match data[6] {
            1 => (10, usize::from(u16::from_le_bytes([data[8], data[9]]))),
            _ => (12, u32::from_le_bytes([data[8], data[9], data[10], data[11]]) as usize),
        };
        let header = &data[start..start + header_len];
        let payload = &data[start + header_len..];
        let size = payload.len() / m.data.len();
        assert!(
            [1, 2, 4].contains(&size) && size * m.data.len() == payload.len(),
            "{} values in {} bytes",
            m.data.len(),
            payload.len()
        );
        let quoted = |descr: &str| {
            [format!("'{descr}'"), format!("\"{descr}\"")]
                .iter()
                .any(|q| header.windows(q.len()).any(|w| w == q.as_bytes()))
        };
        if quoted("<f4") && !quoted(">f4") && !quoted("<f2") && !quoted(">f2") {
            let bits = payload.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            assert!(bits.eq(m.data.iter().map(|x| x.to_bits())), "'<f4' data differs from the input");
        }
    }
});
