use hive_gpu::*;
use std::time::Instant;
fn main() {
    let ctx = GpuContext::with_backend(GpuBackendType::Cpu, 0).unwrap();
    let d = 128;
    let rows = 100;
    let s = ctx.create_storage(d, GpuDistanceMetric::Euclidean).unwrap();
    let vecs: Vec<GpuVector> = (0..rows)
        .map(|i| {
            GpuVector::new(format!("v{i}"), (0..d).map(|j| ((i * 31 + j * 7) % 97) as f32 / 97.0).collect())
        })
        .collect();
    s.add_vectors(&vecs).unwrap();
    for nq in [1000usize, 10000] {
        let q: Vec<f32> = (0..nq * d).map(|i| ((i * 13) % 101) as f32 / 101.0).collect();
        let mut t = Vec::new();
        for _ in 0..30 {
            let b = Instant::now();
            let r = s.search_batch_results(&q, 10, &SearchOptions::default()).unwrap();
            t.push(b.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(r);
        }
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("nq {nq}: median {:.3} ms, min {:.3}", t[t.len() / 2], t[0]);
    }
}
