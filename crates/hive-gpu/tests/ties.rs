//! Duplicates cost no more than other data: a search over rows that all tie is linear in the
//! rows on every backend. The CPU collector once re-scanned its list of near rows on every
//! push when they all tied, so one k = 1 query over 400,000 identical rows took about 25 s
//! (300x random data). Speed is measured by benchmarks (`examples/ties.rs`); this test only
//! bounds the growth generously: 4x the rows may take at most 8x the time (linear is 4x,
//! quadratic 16x), and the answers stay exact, ties in storage order.

mod common;

use std::time::{Duration, Instant};

use common::contexts;
use hive_gpu::{GpuDistanceMetric, GpuVectorStorage};

const DIM: usize = 8;

fn duplicates(context: &hive_gpu::GpuContext, rows: usize) -> GpuVectorStorage {
    let storage = context.create_storage(DIM, GpuDistanceMetric::Euclidean).expect("storage");
    let ids: Vec<String> = (0..rows).map(|i| i.to_string()).collect();
    let row = [0.25f32, -1.0, 3.0, 0.5, 2.0, -0.75, 1.0, 4.0];
    let values: Vec<f32> = row.iter().copied().cycle().take(rows * DIM).collect();
    storage.add_vectors_flat(&ids, &values).expect("add duplicates");
    storage
}

/// Median wall time of three runs of `search`, which must return exactly ids 0..k in order.
fn timed(storage: &GpuVectorStorage, queries: &[f32], k: usize) -> Duration {
    let mut times: Vec<Duration> = (0..3)
        .map(|_| {
            let began = Instant::now();
            let lists = storage.search_batch(queries, k).expect("search");
            let spent = began.elapsed();
            for list in lists {
                let ids: Vec<String> = list.iter().map(|r| r.id.to_string()).collect();
                let want: Vec<String> = (0..k).map(|i| i.to_string()).collect();
                assert_eq!(ids, want, "all rows tie: the first k slots, in order");
            }
            spent
        })
        .collect();
    times.sort();
    times[1]
}

#[test]
fn searches_over_duplicated_rows_take_time_linear_in_the_rows() {
    let single = [1.0f32, 2.0, -3.0, 0.0, 0.5, 0.5, 1.5, -2.0];
    let batch: Vec<f32> = (0..16 * DIM).map(|i| (i % 13) as f32 * 0.5 - 3.0).collect();
    for context in contexts() {
        let backend = context.backend_type();
        let small = duplicates(&context, 100_000);
        let large = duplicates(&context, 400_000);
        // Warm-up: workspaces, pipelines, first touches.
        for storage in [&small, &large] {
            storage.search_batch(&batch, 100).expect("warm-up");
        }
        for k in [1, 10, 100] {
            for (what, queries) in [("one query", &single[..]), ("16 queries", &batch[..])] {
                let (t_small, t_large) = (timed(&small, queries, k), timed(&large, queries, k));
                assert!(
                    t_large <= t_small * 8 + Duration::from_millis(50),
                    "{backend} {what} k = {k}: 400k duplicated rows took {t_large:?}, 100k took {t_small:?} \
                     (more than 8x for 4x the rows)"
                );
            }
        }
    }
}
