//! Shared test support: which backends to test, seeded data, the f64 reference and the
//! exactness check every backend must pass.
#![allow(dead_code)]

pub mod faulty;
pub mod stored;

use std::collections::HashMap;
use std::path::PathBuf;

use hive_gpu::{
    GpuBackendType, GpuContext, GpuDistanceMetric, GpuSearchResult, StoragePrecision, Tuning,
    detect_available_backends,
};

/// Every metric, in the order the suites derive their seeds from.
pub const METRICS: [GpuDistanceMetric; 5] = [
    GpuDistanceMetric::Euclidean,
    GpuDistanceMetric::Cosine,
    GpuDistanceMetric::DotProduct,
    GpuDistanceMetric::Manhattan,
    GpuDistanceMetric::Chebyshev,
];

/// The values a collection of `precision` really stores (the float types round to nearest;
/// the integer types store the integers they were given).
pub fn stored(precision: StoragePrecision, values: &[f32]) -> Vec<f32> {
    match precision {
        StoragePrecision::F16 => values.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
        StoragePrecision::Bf16 => values.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect(),
        _ => values.to_vec(),
    }
}

/// `values` made storable as `precision`: the float types take them as they are; the integer
/// types, which refuse anything but their integers, get them scaled by 40 and rounded (so
/// standard normal data keeps its shape, with many exact ties), clamped to their range, never
/// 0 (see below). Data
/// that is bytes already (integers in 0..=255) stays bytes for u8 and shifts by -128 for i8.
pub fn storable(precision: StoragePrecision, values: &[f32]) -> Vec<f32> {
    let bytes = values.iter().all(|&x| x.fract() == 0.0 && (0.0..=255.0).contains(&x));
    match precision {
        StoragePrecision::I8 if bytes => values.iter().map(|&x| x - 128.0).collect(),
        StoragePrecision::U8 if bytes => values.to_vec(),
        // No zero component (a one-dimensional row of 0 has no cosine): what rounds to 0
        // keeps its sign as 1 or -1, and u8 starts at 1.
        StoragePrecision::I8 => values
            .iter()
            .map(|&x| match (x * 40.0).round().clamp(-128.0, 127.0) {
                0.0 => 1f32.copysign(x),
                v => v,
            })
            .collect(),
        StoragePrecision::U8 => {
            values.iter().map(|&x| (x * 40.0 + 128.0).round().clamp(1.0, 255.0)).collect()
        }
        _ => values.to_vec(),
    }
}

/// A context on every available backend. `HIVE_GPU_REQUIRE=cuda,vulkan` turns an absent
/// backend into a failure, so a GPU run can never pass by skipping.
pub fn contexts() -> Vec<GpuContext> {
    let statuses = detect_available_backends();
    let required = std::env::var("HIVE_GPU_REQUIRE").unwrap_or_default();
    for name in required.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let backend: GpuBackendType = name.parse().unwrap_or_else(|e| panic!("HIVE_GPU_REQUIRE: {e}"));
        let status = statuses.iter().find(|s| s.backend == backend).expect("every backend is probed");
        assert!(
            status.available,
            "HIVE_GPU_REQUIRE names {backend}, which is unavailable: {}",
            status.reason
        );
    }
    // HIVE_GPU_TEST_BACKENDS=cpu,... limits a run to those backends (CI reruns the suites for
    // the forced CPU kernel levels only).
    let only: Vec<GpuBackendType> = std::env::var("HIVE_GPU_TEST_BACKENDS")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or_else(|e| panic!("HIVE_GPU_TEST_BACKENDS: {e}")))
        .collect();
    let contexts: Vec<GpuContext> = statuses
        .iter()
        .filter(|s| s.available && (only.is_empty() || only.contains(&s.backend)))
        .map(|s| GpuContext::with_backend(s.backend, 0).expect("an available backend opens"))
        .collect();
    assert!(!contexts.is_empty(), "the CPU backend is always available");
    contexts
}

/// [`contexts`], and on each GPU backend the same context once more for every engine path a
/// [`Tuning`] can force, so the suites prove every path in one process (no process-global
/// variables): on CUDA/ROCm the engine's own GEMM kernel (with the nearest-row kernel for a 1-NN
/// of any number of points, in pieces of a few dozen), the fused filter on every batch
/// (f16 rows rounded into a copy, TF32, rounded inside the filter), the radix path's linear
/// selection on every list (with every 1-NN assignment through the exact k-NN instead of the
/// nearest-row kernel), the gather of a filter's passing rows on every filtered search
/// (with every batch cut as a batch over few rows is), and
/// rows streamed from host memory past a lowered device room; on a hardware Vulkan adapter the cooperative-matrix filter on every
/// batch; on the CPU the bf16 kernel over collections of any size. The software adapter has no
/// such paths, so CI runs each suite there once.
pub fn contexts_with_forced_paths() -> Vec<GpuContext> {
    let mut out = Vec::new();
    for context in contexts() {
        let fused = |t: &mut Tuning| {
            t.fused_min_rows = 1;
            t.fused_tiles = 3;
            t.fused_blocks_per_sm = 0;
            // The suites' batches are small: they would all round inside the filter.
            t.rounded_copy_min_queries = 0;
        };
        let variants: Vec<Tuning> = match context.backend_type() {
            GpuBackendType::Cuda | GpuBackendType::Rocm => vec![
                // The engine's own GEMM; and the nearest-row kernel for a call of any size, in
                // launches of a few dozen points.
                tuned(|t| {
                    t.own_gemm = true;
                    t.nearest_min_points = 1;
                    t.nearest_piece_bytes = 4096;
                }),
                tuned(fused),
                tuned(|t| {
                    fused(t);
                    t.f16_filter = false;
                }),
                tuned(|t| {
                    fused(t);
                    t.rounded_copy_bytes = 0;
                }),
                // The selection kernels for any number of candidates, every query through the
                // re-rank alone, the host's code scan and nearest rows; and single queries over
                // small collections through the scan rather than the few-rows pass.
                tuned(|t| {
                    t.few_values = 0;
                    t.select_min_candidates = 1;
                    t.refine_batch_candidates = 0;
                    t.code_scan = false;
                    t.nearest_kernel = false;
                }),
                // Every filtered search gathers; and every batch of 8 queries or more, over any
                // number of rows, is cut into pieces of 4 whose 3 workers prepare their own
                // queries (the cut for few rows).
                tuned(|t| {
                    t.gather_fraction = 1;
                    t.small_search_rows = usize::MAX;
                    t.small_search_max_k = usize::MAX;
                    t.small_piece_queries = 4;
                    t.small_piece_workers = 3;
                }),
                // Never gathered: every filtered search scans every row with the rest masked
                // (batches gather whatever share passes by default).
                tuned(|t| {
                    t.gather_fraction = 0;
                    t.batch_gather_fraction = 0;
                }),
                // Room for 256 KiB of rows: a larger collection streams them from host memory
                // through 64 KiB windows (`backend/gpu/streamed.rs`), a smaller one stays.
                tuned(|t| {
                    t.device_rows_bytes = Some(256 << 10);
                    t.stream_window_bytes = 64 << 10;
                }),
            ],
            GpuBackendType::Vulkan if !context.device_info().software => {
                vec![tuned(|t| t.fused_min_rows = 1)]
            }
            // Batches over small collections multiply in f32 by default, and small searches
            // run on the caller's thread; this takes them through the bf16 kernel (where the
            // CPU has AVX512-BF16) and the pool's paths, which the suites' small data would
            // otherwise never reach; IVF list scans read the rows in place instead of the
            // packed lists.
            GpuBackendType::Cpu => vec![tuned(|t| {
                t.cpu_bf16_min_rows = 0;
                t.cpu_here_products = 0;
                t.cpu_packed_lists = false;
            })],
            _ => Vec::new(),
        };
        let forced: Vec<GpuContext> = variants.into_iter().map(|t| context.clone().with_tuning(t)).collect();
        out.push(context);
        out.extend(forced);
    }
    out
}

/// The default tuning with `change` applied.
fn tuned(change: impl FnOnce(&mut Tuning)) -> Tuning {
    let mut tuning = Tuning::default();
    change(&mut tuning);
    tuning
}

/// A context's backend and, where it differs from the default, its tuning, for messages.
pub fn describe(context: &GpuContext) -> String {
    let tuning = context.tuning();
    if *tuning == Tuning::default() {
        context.backend_type().to_string()
    } else {
        format!("{} ({tuning:?})", context.backend_type())
    }
}

/// SplitMix64: small, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u = self.uniform().max(1e-300);
        let v = self.uniform();
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.uniform() * n as f64) as usize % n.max(1)
    }

    pub fn normals(&mut self, count: usize) -> Vec<f32> {
        (0..count).map(|_| self.normal()).collect()
    }
}

/// The canonical "lower is better" distance in f64.
pub fn distance(metric: GpuDistanceMetric, q: &[f32], x: &[f32]) -> f64 {
    let dot: f64 = q.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
    match metric {
        GpuDistanceMetric::Euclidean => {
            q.iter().zip(x).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum()
        }
        GpuDistanceMetric::DotProduct => -dot,
        GpuDistanceMetric::Cosine => {
            let nq: f64 = q.iter().map(|&a| f64::from(a).powi(2)).sum::<f64>().sqrt();
            let nx: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum::<f64>().sqrt();
            -dot / (nq * nx)
        }
        GpuDistanceMetric::Manhattan => {
            q.iter().zip(x).map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs()).sum()
        }
        GpuDistanceMetric::Chebyshev => {
            q.iter().zip(x).map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs()).fold(0.0, f64::max)
        }
    }
}

/// The public score of a canonical distance, as documented on `GpuSearchResult`.
pub fn score(metric: GpuDistanceMetric, distance: f64) -> f64 {
    match metric {
        GpuDistanceMetric::Euclidean => distance.max(0.0).sqrt(),
        GpuDistanceMetric::DotProduct | GpuDistanceMetric::Cosine => -distance,
        GpuDistanceMetric::Manhattan | GpuDistanceMetric::Chebyshev => distance,
    }
}

/// Exact top-k of `query` over `(id, vector)` pairs by f64 brute force: (id, score), best
/// first, ties in the order of `vectors`.
pub fn reference(
    metric: GpuDistanceMetric,
    vectors: &[(String, Vec<f32>)],
    query: &[f32],
    k: usize,
) -> Vec<(String, f64)> {
    let mut scored: Vec<(usize, f64)> =
        vectors.iter().enumerate().map(|(i, (_, v))| (i, distance(metric, query, v))).collect();
    scored.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    scored.truncate(k);
    scored.into_iter().map(|(i, d)| (vectors[i].0.clone(), score(metric, d))).collect()
}

/// Asserts `got` is an exact top-k: the right length, ids unique and present, every score
/// equal to the f64 score of that id's vector, and the i-th score equal to the reference's
/// i-th (so the set is the true top-k up to exact ties).
pub fn assert_exact(
    what: &str,
    metric: GpuDistanceMetric,
    got: &[GpuSearchResult],
    want: &[(String, f64)],
    vectors_by_id: &HashMap<&str, &[f32]>,
    query: &[f32],
) {
    assert_eq!(got.len(), want.len(), "{what}: result count");
    let scale = want.iter().map(|(_, s)| s.abs()).fold(1e-6, f64::max);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b.abs() + 1e-6 * scale;
    let mut seen = std::collections::HashSet::new();
    for (i, (r, (want_id, want_score))) in got.iter().zip(want).enumerate() {
        assert!(seen.insert(r.id.clone()), "{what}: id {} returned twice", r.id);
        let vector = vectors_by_id
            .get(r.id.as_str())
            .unwrap_or_else(|| panic!("{what}: returned id {} is not in the collection", r.id));
        let true_score = score(metric, distance(metric, query, vector));
        assert!(
            close(f64::from(r.score), true_score),
            "{what}: rank {i} id {} has score {} but its exact score is {true_score}",
            r.id,
            r.score
        );
        assert!(
            close(f64::from(r.score), *want_score),
            "{what}: rank {i} returned {} (score {}), reference has {want_id} (score {want_score})",
            r.id,
            r.score
        );
        // Scores agree to 1e-4; ids must agree exactly unless the two are a genuine f64 tie,
        // so a near miss cannot hide behind the score tolerance.
        assert!(
            r.id == *want_id || (true_score - want_score).abs() <= 1e-12 * scale,
            "{what}: rank {i} returned {} (exact score {true_score}) instead of {want_id} (exact score {want_score})",
            r.id
        );
    }
}

/// The repository's `data/` folder (found from the working directory, which cargo and
/// `.gpu/run-tests` set to the package folder), or `HIVE_GPU_DATA_DIR`.
pub fn data_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("HIVE_GPU_DATA_DIR") {
        return PathBuf::from(dir);
    }
    let mut dir = std::env::current_dir().expect("a working directory");
    loop {
        let candidate = dir.join("data").join("siftsmall");
        if candidate.is_dir() {
            return dir.join("data");
        }
        assert!(dir.pop(), "no data/siftsmall above the working directory; set HIVE_GPU_DATA_DIR");
    }
}
