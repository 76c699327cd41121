//! Saves a collection whose vectors carry typed payloads, then opens it several times: what
//! rebuilding the payload index costs an open (docs/PERFORMANCE.md, opening).
//!
//! `cargo run --release -p hive-gpu --example payload_open -- [cpu|cuda|vulkan] [n] [dim] [file] [opens]`
//!
//! Every vector has four typed fields (an integer of 100 values, a float distinct per vector,
//! a bool, a string of 3 values), and a third of them a string metadata field. Run with
//! `HIVE_GPU_PROFILE=1` for the open's phases.

use std::time::Instant;

use hive_gpu::{GpuBackendType, GpuContext, GpuDistanceMetric, GpuVector, Metadata};

fn main() -> Result<(), hive_gpu::HiveGpuError> {
    let args: Vec<String> = std::env::args().collect();
    let backend: GpuBackendType = args.get(1).map_or("cpu", String::as_str).parse()?;
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let dim: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(128);
    let default_file = std::env::temp_dir().join("hive-gpu-payload-open.hgc");
    let file = args.get(4).map_or(default_file, std::path::PathBuf::from);
    let opens: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(3);
    let context = GpuContext::with_backend(backend, 0)?;
    if !file.exists() {
        let storage = context.create_storage(dim, GpuDistanceMetric::Euclidean)?;
        storage.reserve(n)?;
        let mut state = 1u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            state >> 40
        };
        for first in (0..n).step_by(50_000) {
            let chunk: Vec<GpuVector> = (first..(first + 50_000).min(n))
                .map(|i| {
                    let data = (0..dim).map(|_| next() as f32 / (1u64 << 24) as f32).collect();
                    let mut metadata = Metadata::new();
                    if i % 3 == 0 {
                        metadata.insert("source".into(), format!("feed-{}", i % 7));
                    }
                    GpuVector::with_metadata(i.to_string(), data, metadata)
                        .with_field("category", (i % 100) as i64)
                        .with_field("price", i as f64 * 0.01)
                        .with_field("in_stock", i % 2 == 0)
                        .with_field("color", ["red", "green", "blue"][i % 3])
                })
                .collect();
            storage.add_vectors(&chunk)?;
        }
        let began = Instant::now();
        storage.save(&file)?;
        println!(
            "saved {n} x {dim} with payloads to {}: {:.3} s",
            file.display(),
            began.elapsed().as_secs_f64()
        );
    }
    for round in 0..opens {
        let began = Instant::now();
        let storage = context.open_storage(&file)?;
        let opened = began.elapsed().as_secs_f64();
        println!("{backend}: open {round}: {opened:.3} s ({} vectors)", storage.vector_count());
    }
    Ok(())
}
