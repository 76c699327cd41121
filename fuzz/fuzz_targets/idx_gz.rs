//! Fuzzes the gzipped IDX decoder (`.gz`). The first byte picks how the rest is used:
//! - even: the rest is the compressed file itself (mutations reach the gzip and deflate
//!   parsing, and bombs of every shape);
//! - odd: the rest is IDX content that this target gzips (bit 1: followed by bytes that are no
//!   gzip member; bits 2-4: split into two gzip members at that many eighths; bits 5-7: the
//!   compression level), so mutations reach the IDX decoding behind the inflater. Decoding the gzip of
//!   well-formed content must give exactly what decoding the content itself gives.
#![no_main]

#[path = "common.rs"]
mod common;

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use hive_gpu::io::{VectorFormat, decode_vectors};
use libfuzzer_sys::fuzz_target;

fn gzip(bytes: &[u8], level: u32) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::new(level));
    encoder.write_all(bytes).expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let name = common::name("fuzz-idx3-ubyte.gz");
    let decode = |bytes: &[u8], len| decode_vectors(VectorFormat::Idx, name, bytes, len);
    if mode % 2 == 0 {
        if let Ok(m) = common::decode_three_ways(rest, true, decode) {
            common::check_shape(m.rows, m.dim, m.data.len());
        }
        return;
    }
    let garbage = mode & 0b10 != 0;
    let split = usize::from((mode >> 2) & 0b111) * rest.len() / 8;
    let level = u32::from(mode >> 5);
    let mut compressed = gzip(&rest[..split], level);
    compressed.extend(gzip(&rest[split..], level));
    if garbage {
        compressed.extend_from_slice(b"\x00not a gzip member");
    }
    let inflated = common::decode_three_ways(&compressed, true, decode);
    if garbage {
        assert!(inflated.is_err(), "bytes after the last gzip member were accepted");
    } else if !rest.starts_with(&[0x1f, 0x8b]) {
        let plain =
            decode_vectors(VectorFormat::Idx, common::name("fuzz-idx3-ubyte"), rest, rest.len() as u64);
        match (&plain, &inflated) {
            (Ok(a), Ok(b)) => assert!(
                (a.rows, a.dim) == (b.rows, b.dim)
                    && a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits()),
                "gzip changed what was decoded"
            ),
            (Err(_), Err(_)) => {}
            _ => panic!("plain {plain:?} but gzipped {inflated:?}"),
        }
    }
});
