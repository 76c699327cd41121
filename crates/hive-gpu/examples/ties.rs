//! The duplicates benchmark: one query and a batch of 16 over rows that all tie, against the
//! same numbers of distinct random rows, at 100k, 200k and 400k rows and k in {1, 10, 100}.
//! Linear work means the 400k column is about 4x the 100k one on both kinds of data.
//!
//! `cargo run --release -p hive-gpu --example ties -- [cpu|cuda|rocm|vulkan] [dim]`
//!
//! Prints one line per (data, k, queries per call): median milliseconds per call of 5 calls
//! at each size, then the 400k / 100k ratio.

use std::time::Instant;

use hive_gpu::{GpuBackendType, GpuContext, GpuDistanceMetric, GpuVectorStorage};

const SIZES: [usize; 3] = [100_000, 200_000, 400_000];

fn build(
    context: &GpuContext,
    rows: usize,
    dim: usize,
    duplicates: bool,
) -> Result<GpuVectorStorage, hive_gpu::HiveGpuError> {
    let storage = context.create_storage(dim, GpuDistanceMetric::Euclidean)?;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let first: Vec<f32> = (0..dim).map(|_| next()).collect();
    let values: Vec<f32> = if duplicates {
        first.iter().copied().cycle().take(rows * dim).collect()
    } else {
        (0..rows * dim).map(|_| next()).collect()
    };
    let ids: Vec<String> = (0..rows).map(|i| i.to_string()).collect();
    storage.add_vectors_flat(&ids, &values)?;
    Ok(storage)
}

fn median_ms(storage: &GpuVectorStorage, queries: &[f32], k: usize) -> Result<f64, hive_gpu::HiveGpuError> {
    storage.search_batch(queries, k)?;
    let mut times = Vec::new();
    for _ in 0..5 {
        let began = Instant::now();
        storage.search_batch(queries, k)?;
        times.push(began.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[2])
}

fn main() -> Result<(), hive_gpu::HiveGpuError> {
    let args: Vec<String> = std::env::args().collect();
    let backend: GpuBackendType = args.get(1).map_or("cpu", String::as_str).parse()?;
    let dim: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(32);
    let context = GpuContext::with_backend(backend, 0)?;
    println!("# {} ({}), dim {dim}; median ms per call of 5", backend, context.device_info().name);
    println!(
        "{:<10} {:>4} {:>7} {:>10} {:>10} {:>10} {:>8}",
        "data", "k", "queries", "100k", "200k", "400k", "400/100"
    );
    for duplicates in [true, false] {
        let storages: Vec<GpuVectorStorage> =
            SIZES.iter().map(|&n| build(&context, n, dim, duplicates)).collect::<Result<_, _>>()?;
        for k in [1, 10, 100] {
            for nq in [1usize, 16] {
                let queries: Vec<f32> =
                    (0..nq * dim).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
                let ms: Vec<f64> =
                    storages.iter().map(|s| median_ms(s, &queries, k)).collect::<Result<_, _>>()?;
                println!(
                    "{:<10} {:>4} {:>7} {:>10.3} {:>10.3} {:>10.3} {:>8.2}",
                    if duplicates { "duplicates" } else { "random" },
                    k,
                    nq,
                    ms[0],
                    ms[1],
                    ms[2],
                    ms[2] / ms[0]
                );
            }
        }
    }
    Ok(())
}
