//! Collections larger than the device (issue 22, item 5): a CUDA or ROCm collection whose rows
//! outgrow the device moves them to page-locked host memory and streams them through the
//! device, a window at a time, for every search. Exactness must not change: every search of a
//! streamed collection equals the f64 brute force, for every metric and storage type, with
//! removals and filters, batched and one at a time, after a save and open, a compaction, and
//! through an IVF index (whose re-rank gathers candidates into a window).
//!
//! The tests lower the device's room with `Tuning::device_rows_bytes` (256 KiB) and the window
//! with `Tuning::stream_window_bytes` (64 KiB), so a few thousand rows take the streamed path
//! through dozens of windows on any GPU. Each asserts that its collection really streams. On a
//! machine without CUDA or ROCm there is nothing to stream through, and the tests say so; the
//! GPU suite runs them with `HIVE_GPU_REQUIRE=cuda`, where a missing device is a failure.

mod common;

use std::collections::HashMap;

use common::{Rng, assert_exact, contexts, describe, reference, storable};
use hive_gpu::{
    Filter, GpuBackendType, GpuContext, GpuDistanceMetric, GpuSearchResult, GpuVector, GpuVectorStorage,
    IndexSpec, SearchOptions, StorageConfig, StoragePrecision, Tuning,
};

const DIM: usize = 37;
/// Enough rows to pass the 256 KiB cap in every storage type (u8 rows are 37 bytes).
const ROWS: usize = 9000;

/// The CUDA/ROCm contexts with the device's room for rows lowered, once on the default paths
/// and once with the fused filter forced onto every window's batch.
fn streaming_contexts() -> Vec<GpuContext> {
    let lowered = |fused: bool| {
        let mut tuning = Tuning::default();
        tuning.device_rows_bytes = Some(256 << 10);
        tuning.stream_window_bytes = 64 << 10;
        // The grid's aim (`fused_blocks_per_sm`) stays at its default here, so these windows'
        // blocks stream one row tile each; the other suites' fused variants keep three.
        if fused {
            tuning.fused_min_rows = 1;
            tuning.fused_tiles = 3;
        }
        tuning
    };
    let engines: Vec<GpuContext> = contexts()
        .into_iter()
        .filter(|c| matches!(c.backend_type(), GpuBackendType::Cuda | GpuBackendType::Rocm))
        .flat_map(|c| [c.clone().with_tuning(lowered(false)), c.with_tuning(lowered(true))])
        .collect();
    if engines.is_empty() {
        eprintln!("no CUDA or ROCm device here: nothing streams (the GPU suite runs these tests)");
    }
    engines
}

/// `ROWS` vectors storable in `precision`, ids `v0..`.
fn vectors(precision: StoragePrecision, seed: u64) -> Vec<(String, Vec<f32>)> {
    let mut rng = Rng::new(seed);
    let values = storable(precision, &rng.normals(ROWS * DIM));
    values.chunks(DIM).enumerate().map(|(i, v)| (format!("v{i}"), v.to_vec())).collect()
}

fn add(storage: &GpuVectorStorage, vectors: &[(String, Vec<f32>)]) {
    let batch: Vec<GpuVector> = vectors.iter().map(|(id, v)| GpuVector::new(id.clone(), v.clone())).collect();
    storage.add_vectors(&batch).expect("valid vectors are accepted");
}

/// What the collection holds now, as its own reads give it back.
fn model(storage: &GpuVectorStorage, ids: impl Iterator<Item = String>) -> Vec<(String, Vec<f32>)> {
    ids.filter_map(|id| storage.get_vector(&id).expect("get").map(|v| (id, v.data))).collect()
}

fn check(
    what: &str,
    metric: GpuDistanceMetric,
    model: &[(String, Vec<f32>)],
    queries: &[Vec<f32>],
    got: &[Vec<GpuSearchResult>],
    k: usize,
) {
    let by_id: HashMap<&str, &[f32]> = model.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
    assert_eq!(got.len(), queries.len(), "{what}: one list per query");
    for (i, (q, list)) in queries.iter().zip(got).enumerate() {
        let want = reference(metric, model, q, k.min(model.len()));
        assert_exact(&format!("{what}: query {i}"), metric, list, &want, &by_id, q);
    }
}

#[test]
fn a_collection_past_the_device_cap_streams_and_every_search_stays_exact_for_every_metric_and_type() {
    let metrics = GpuDistanceMetric::ALL;
    let mut rng = Rng::new(31);
    let queries: Vec<Vec<f32>> = (0..60).map(|_| rng.normals(DIM)).collect();
    let flat: Vec<f32> = queries.iter().flatten().copied().collect();
    for context in streaming_contexts() {
        for (m, metric) in metrics.into_iter().enumerate() {
            for (p, precision) in StoragePrecision::ALL.into_iter().enumerate() {
                let what = format!("{} {metric:?} {precision}", describe(&context));
                let all = vectors(precision, (m * 10 + p) as u64);
                let config = StorageConfig::new(DIM, metric).with_precision(precision);
                let storage = context.create_storage_with(config).expect("storage");
                // The first rows fit the device; the rest push the collection onto the host.
                add(&storage, &all[..300]);
                assert!(!storage.rows_streamed(), "{what}: 300 rows fit the device's lowered room");
                add(&storage, &all[300..5000]);
                add(&storage, &all[5000..]);
                assert!(storage.rows_streamed(), "{what}: {ROWS} rows must stream past a 256 KiB cap");
                // Removals spread over every window, the first and last slots included.
                let removed: Vec<String> =
                    (0..ROWS).filter(|i| i % 29 == 0 || *i == ROWS - 1).map(|i| format!("v{i}")).collect();
                storage.remove_vectors(&removed).expect("remove");
                let model = model(&storage, (0..ROWS).map(|i| format!("v{i}")));
                assert_eq!(model.len(), ROWS - removed.len(), "{what}");

                for k in [1, 10, 100] {
                    let batch = storage.search_batch(&flat, k).expect("batch");
                    check(&format!("{what} batch k={k}"), metric, &model, &queries, &batch, k);
                }
                // k past one window's rows: every window gives all its rows and the merge cuts.
                let wide = storage.search_batch(&flat[..2 * DIM], 1000).expect("batch");
                check(&format!("{what} batch k=1000"), metric, &model, &queries[..2], &wide, 1000);
                let singles: Vec<Vec<GpuSearchResult>> =
                    queries[..4].iter().map(|q| storage.search(q, 10).expect("search")).collect();
                check(&format!("{what} single"), metric, &model, &queries[..4], &singles, 10);

                // A filter of every third id, removed ones among them.
                let passing: Vec<String> = (0..ROWS).step_by(3).map(|i| format!("v{i}")).collect();
                let filter = Filter::ids(&passing);
                let allowed: Vec<(String, Vec<f32>)> =
                    model.iter().filter(|(id, _)| passing.contains(id)).cloned().collect();
                let options = SearchOptions::default().with_filter(filter.clone());
                let filtered = storage.search_batch_with(&flat[..20 * DIM], 10, &options).expect("filtered");
                check(&format!("{what} filtered batch"), metric, &allowed, &queries[..20], &filtered, 10);
                let one = storage.search_filtered(&queries[0], 10, &filter).expect("filtered single");
                check(&format!("{what} filtered single"), metric, &allowed, &queries[..1], &[one], 10);
                // A filter that only the last rows pass: every earlier window has nothing to
                // search and is skipped.
                let last: Vec<String> = (ROWS - 100..ROWS).map(|i| format!("v{i}")).collect();
                let in_last: Vec<(String, Vec<f32>)> =
                    model.iter().filter(|(id, _)| last.contains(id)).cloned().collect();
                let options = SearchOptions::default().with_filter(Filter::ids(&last));
                let got = storage.search_batch_with(&flat[..5 * DIM], 10, &options).expect("last rows");
                check(&format!("{what} last rows only"), metric, &in_last, &queries[..5], &got, 10);
            }
        }
    }
}

#[test]
fn a_streamed_collection_saves_opens_compacts_refines_and_clears_exactly() {
    let dir = common::stored::scratch_dir("streaming");
    let mut rng = Rng::new(77);
    let queries: Vec<Vec<f32>> = (0..40).map(|_| rng.normals(DIM)).collect();
    let flat: Vec<f32> = queries.iter().flatten().copied().collect();
    for (c, context) in streaming_contexts().into_iter().enumerate() {
        for metric in [GpuDistanceMetric::Euclidean, GpuDistanceMetric::Cosine] {
            for precision in [StoragePrecision::F32, StoragePrecision::U8] {
                let what = format!("{} {metric:?} {precision}", describe(&context));
                let all = vectors(precision, 5);
                let config = StorageConfig::new(DIM, metric).with_precision(precision);
                let storage = context.create_storage_with(config).expect("storage");
                add(&storage, &all);
                let removed: Vec<String> = (0..ROWS).step_by(7).map(|i| format!("v{i}")).collect();
                storage.remove_vectors(&removed).expect("remove");
                assert!(storage.rows_streamed(), "{what}");

                // A save and an open: the opened collection streams too, and searches alike.
                let path = dir.join(format!("c{c}-{metric:?}-{precision}.hgc"));
                storage.save(&path).expect("save");
                let opened = context.open_storage(&path).expect("open");
                assert!(opened.rows_streamed(), "{what}: the opened collection outgrows the device too");
                let model_now = model(&opened, (0..ROWS).map(|i| format!("v{i}")));
                assert_eq!(model_now, model(&storage, (0..ROWS).map(|i| format!("v{i}"))), "{what}");
                let got = opened.search_batch(&flat, 10).expect("batch");
                check(&format!("{what} opened"), metric, &model_now, &queries, &got, 10);

                // A compaction moves rows between pages: searches stay exact.
                opened.compact().expect("compact");
                assert_eq!(opened.slot_count(), ROWS - removed.len(), "{what}");
                let got = opened.search_batch(&flat, 25).expect("batch");
                check(&format!("{what} compacted"), metric, &model_now, &queries, &got, 25);

                // IVF ends in refine: candidates gathered into a window, more than one window's
                // worth per query when every list is probed, a few dozen with one list.
                let nlist = 64;
                opened.build_index(IndexSpec::IvfFlat { nlist }).unwrap_or_else(|e| panic!("{what}: {e}"));
                let every = SearchOptions::default().with_nprobe(nlist);
                let got = opened.search_batch_with(&flat, 10, &every).expect("ivf batch");
                check(&format!("{what} ivf, every list"), metric, &model_now, &queries, &got, 10);
                let one = SearchOptions::default().with_nprobe(1);
                let by_id: HashMap<&str, &[f32]> =
                    model_now.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
                for (q, list) in queries.iter().zip(opened.search_batch_with(&flat, 10, &one).expect("ivf")) {
                    for r in &list {
                        let exact = common::score(metric, common::distance(metric, q, by_id[r.id.as_str()]));
                        assert!(
                            (f64::from(r.score) - exact).abs() <= 1e-4 * exact.abs().max(1.0),
                            "{what}: ivf score {} of {} is not its exact {exact}",
                            r.score,
                            r.id
                        );
                    }
                }

                // Emptied, a collection starts on the device again.
                opened.clear().expect("clear");
                assert!(!opened.rows_streamed(), "{what}: a cleared collection is back on the device");
                add(&opened, &all[..100]);
                // The trained index stays through a clear: the exact search is asked for.
                let exact = SearchOptions::default().with_exact(true);
                let got = opened.search_batch_with(&flat, 5, &exact).expect("batch");
                check(&format!("{what} cleared"), metric, &all[..100], &queries, &got, 5);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
