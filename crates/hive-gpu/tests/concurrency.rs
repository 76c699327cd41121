//! Thread safety: 8 threads search while another upserts and removes; every result must be
//! well formed and scored exactly against the vector its id held.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Rng, contexts, distance, score};
use hive_gpu::{GpuContext, GpuDistanceMetric, GpuVector, GpuVectorStorage};

const DIM: usize = 24;

/// Every id always maps to the same values, so a searcher can verify any score it sees.
fn vector_for(id: &str) -> Vec<f32> {
    let seed = id.bytes().fold(1469598103934665603u64, |h, b| (h ^ u64::from(b)).wrapping_mul(1099511628211));
    let mut rng = Rng::new(seed);
    rng.normals(DIM)
}

#[test]
fn contexts_and_collections_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GpuContext>();
    assert_send_sync::<GpuVectorStorage>();
    assert_send_sync::<hive_gpu::HiveGpuError>();
}

#[test]
fn eight_searchers_and_one_writer() {
    for context in contexts() {
        let metric = GpuDistanceMetric::Euclidean;
        let storage = Arc::new(context.create_storage(DIM, metric).expect("storage"));
        let permanent: Vec<GpuVector> = (0..2000)
            .map(|i| format!("p{i}"))
            .map(|id| GpuVector::new(id.clone(), vector_for(&id)))
            .collect();
        storage.add_vectors(&permanent).expect("add");
        let done = Arc::new(AtomicBool::new(false));

        let writer = {
            let (storage, done) = (storage.clone(), done.clone());
            std::thread::spawn(move || {
                for round in 0..200 {
                    let ids: Vec<String> = (0..50).map(|i| format!("w{round}-{i}")).collect();
                    let batch: Vec<GpuVector> =
                        ids.iter().map(|id| GpuVector::new(id.clone(), vector_for(id))).collect();
                    storage.add_vectors(&batch).expect("writer add");
                    // Re-adding identical data exercises the update path without changing answers.
                    storage.add_vectors(&batch[..10]).expect("writer upsert");
                    if round % 2 == 1 {
                        storage.remove_vectors(&ids[..40]).expect("writer remove");
                    }
                }
                done.store(true, Ordering::SeqCst);
            })
        };

        let searchers: Vec<_> = (0..8)
            .map(|t| {
                let (storage, done) = (storage.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(900 + t);
                    let mut searches = 0;
                    while !done.load(Ordering::SeqCst) || searches < 50 {
                        let nq = if searches % 2 == 0 { 1 } else { 6 };
                        let queries = rng.normals(nq * DIM);
                        let k = 1 + rng.below(30);
                        let lists = storage.search_batch(&queries, k).expect("search during writes");
                        for (list, q) in lists.iter().zip(queries.chunks_exact(DIM)) {
                            assert_eq!(list.len(), k, "at least 2000 permanent vectors exist");
                            for pair in list.windows(2) {
                                assert!(pair[0].score <= pair[1].score, "results best first");
                            }
                            for r in list {
                                let exact = score(metric, distance(metric, q, &vector_for(&r.id)));
                                assert!(
                                    (f64::from(r.score) - exact).abs() <= 1e-4 * exact + 1e-6,
                                    "{}: {} vs {exact}",
                                    r.id,
                                    r.score
                                );
                            }
                        }
                        searches += 1;
                    }
                    searches
                })
            })
            .collect();

        writer.join().expect("writer thread");
        let total: usize = searchers.into_iter().map(|s| s.join().expect("searcher thread")).sum();
        assert!(total >= 400);
        assert_eq!(storage.vector_count(), 2000 + 100 * 50 + 100 * 10);
    }
}
