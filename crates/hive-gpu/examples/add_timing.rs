//! Times `add_vectors` of synthetic vectors on a backend (build-time diagnostics).
//!
//! `cargo run --release -p hive-gpu --example add_timing -- [cpu|cuda|vulkan] [n] [dim]`

use std::time::Instant;

use hive_gpu::{GpuBackendType, GpuContext, GpuDistanceMetric, GpuVector};

fn main() -> Result<(), hive_gpu::HiveGpuError> {
    let args: Vec<String> = std::env::args().collect();
    let backend: GpuBackendType = args.get(1).map_or("cpu", String::as_str).parse()?;
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let dim: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(128);
    let context = GpuContext::with_backend(backend, 0)?;
    let storage = context.create_storage(dim, GpuDistanceMetric::Euclidean)?;
    let mut state = 1u64;
    let vectors: Vec<GpuVector> = (0..n)
        .map(|i| {
            let data = (0..dim)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (state >> 40) as f32 / (1u64 << 24) as f32
                })
                .collect();
            GpuVector::new(i.to_string(), data)
        })
        .collect();
    let began = Instant::now();
    storage.reserve(n)?;
    for chunk in vectors.chunks(50_000) {
        storage.add_vectors(chunk)?;
    }
    println!("{backend}: add_vectors of {n} x {dim}: {:.3} s", began.elapsed().as_secs_f64());
    Ok(())
}
