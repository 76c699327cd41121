//! Memory read bandwidth probe, used as the roofline for CPU scan benchmarks
//! (`scripts/bench-cpu-peers`).
//!
//! Allocates ~1 GiB of `u64`, then runs a parallel read-only reduction over it on
//! rayon's global pool (so `RAYON_NUM_THREADS` sets the thread count). Each task
//! sums one contiguous chunk with 8 independent accumulators (wrapping add / xor),
//! which keeps the loop memory-bound rather than ALU-bound. After one warm-up pass
//! it times 5 passes and prints the best as one JSON line:
//!
//! ```text
//! {"read_gbps": 12.3, "threads": 2, "bytes": 1073741824}
//! ```
//!
//! Run: `cargo run --release -p hive-gpu --example membw`

use rayon::prelude::*;
use std::hint::black_box;
use std::time::Instant;

const BYTES: usize = 1 << 30;
const PASSES: usize = 5;
/// Elements per rayon task (8 MiB), large enough that scheduling is negligible.
const CHUNK: usize = 1 << 20;

fn sum_chunk(chunk: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut blocks = chunk.chunks_exact(8);
    for b in &mut blocks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(b[i]) ^ (b[i] >> 7);
        }
    }
    let mut total = blocks.remainder().iter().fold(0u64, |a, &x| a.wrapping_add(x));
    for a in acc {
        total = total.wrapping_add(a);
    }
    total
}

fn main() {
    let n = BYTES / std::mem::size_of::<u64>();
    // Fill in parallel so every page is touched (and placed) before timing.
    let mut data = vec![0u64; n];
    data.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        for (i, x) in chunk.iter_mut().enumerate() {
            *x = ((c * CHUNK + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        }
    });

    let pass = |data: &[u64]| -> f64 {
        let t = Instant::now();
        let s: u64 = data.par_chunks(CHUNK).map(sum_chunk).reduce(|| 0, u64::wrapping_add);
        black_box(s);
        t.elapsed().as_secs_f64()
    };

    pass(&data); // warm-up
    let best = (0..PASSES).map(|_| pass(&data)).fold(f64::INFINITY, f64::min);
    let bytes = n * std::mem::size_of::<u64>();
    println!(
        "{{\"read_gbps\": {:.2}, \"threads\": {}, \"bytes\": {}}}",
        bytes as f64 / best / 1e9,
        rayon::current_num_threads(),
        bytes
    );
}
