//! Bad input on every backend: a clear error naming what was wrong, no panic, and the
//! collection exactly as it was.

mod common;

use common::contexts;
use hive_gpu::{
    GpuBackendType, GpuContext, GpuDistanceMetric, GpuVector, GpuVectorStorage, HiveGpuError,
    SearchPrecision, StoragePrecision, detect_available_backends,
};

/// A 3-d collection holding "a" and "b", and a snapshot function to prove nothing changed.
fn seeded(context: &GpuContext, metric: GpuDistanceMetric) -> GpuVectorStorage {
    let storage = context.create_storage(3, metric).expect("storage");
    storage
        .add_vectors(&[GpuVector::new("a", vec![1.0, 2.0, 3.0]), GpuVector::new("b", vec![-1.0, 0.5, 2.0])])
        .expect("add");
    storage
}

fn snapshot(storage: &GpuVectorStorage) -> Vec<Option<GpuVector>> {
    assert_eq!(storage.vector_count(), 2, "vector count unchanged");
    ["a", "b", "c"].iter().map(|id| storage.get_vector(id).expect("get")).collect()
}

#[test]
fn wrong_dimension_is_rejected_and_changes_nothing() {
    for context in contexts() {
        let storage = seeded(&context, GpuDistanceMetric::Euclidean);
        let before = snapshot(&storage);
        let err = storage
            .add_vectors(&[GpuVector::new("c", vec![1.0, 1.0, 1.0]), GpuVector::new("d", vec![1.0, 2.0])])
            .unwrap_err();
        match &err {
            HiveGpuError::DimensionMismatch { expected: 3, actual: 2, id: Some(id) } => assert_eq!(id, "d"),
            other => panic!("wrong error: {other:?}"),
        }
        assert!(err.to_string().contains("expected 3, got 2"), "{err}");
        assert_eq!(snapshot(&storage), before, "a failed batch must not add its valid vectors");
        let err = storage.search(&[1.0, 2.0], 1).unwrap_err();
        assert!(
            matches!(err, HiveGpuError::DimensionMismatch { expected: 3, actual: 2, id: None }),
            "{err:?}"
        );
        let err = storage.search_batch(&[1.0; 7], 1).unwrap_err();
        assert!(matches!(err, HiveGpuError::InvalidArgument(_)), "{err:?}");
        assert!(err.to_string().contains("7 values"), "{err}");
    }
}

#[test]
fn non_finite_values_are_rejected() {
    for context in contexts() {
        let storage = seeded(&context, GpuDistanceMetric::Euclidean);
        let before = snapshot(&storage);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let err = storage
                .add_vectors(&[
                    GpuVector::new("a", vec![9.0, 9.0, 9.0]),
                    GpuVector::new("c", vec![0.0, bad, 1.0]),
                ])
                .unwrap_err();
            assert!(matches!(&err, HiveGpuError::InvalidVector { id: Some(id), .. } if id == "c"), "{err:?}");
            assert!(err.to_string().contains("component 1"), "{err}");
            assert_eq!(snapshot(&storage), before, "upsert of 'a' in a failed batch must not apply");
            let err = storage.search_batch(&[0.0, 0.0, 0.0, 1.0, bad, 0.0], 1).unwrap_err();
            assert!(err.to_string().contains("query 1"), "{err}");
        }
        let err = storage.add_vectors(&[GpuVector::new("c", vec![1e30, 1e30, 0.0])]).unwrap_err();
        assert!(matches!(err, HiveGpuError::InvalidVector { .. }), "overflowing norm: {err:?}");
        assert_eq!(snapshot(&storage), before);
    }
}

/// Trap: a big batch's values are checked in parallel, and whichever thread finds an invalid
/// query first must not decide the error: the batch is refused by its first invalid query.
#[test]
fn a_big_batch_is_refused_by_its_first_invalid_query() {
    for context in contexts() {
        let storage = seeded(&context, GpuDistanceMetric::Euclidean);
        let before = snapshot(&storage);
        // 40,000 queries of 3 values: past the parallel check's threshold (65,536 values).
        let mut queries = vec![0.5f32; 40_000 * 3];
        for (query, bad) in [(39_000, f32::NAN), (25_001, f32::INFINITY), (31_000, 1e30)] {
            queries[query * 3 + 2] = bad;
        }
        let err = storage.search_batch(&queries, 1).unwrap_err();
        assert!(err.to_string().contains("query 25001:"), "{}: {err}", context.backend_type());
        assert_eq!(snapshot(&storage), before);
    }
}

#[test]
fn cosine_zero_vectors_are_errors_not_nan() {
    for context in contexts() {
        let storage = seeded(&context, GpuDistanceMetric::Cosine);
        let before = snapshot(&storage);
        let err = storage.add_vectors(&[GpuVector::new("c", vec![0.0, 0.0, 0.0])]).unwrap_err();
        assert!(err.to_string().contains("zero vector"), "{err}");
        assert_eq!(snapshot(&storage), before);
        let err = storage.search(&[0.0, 0.0, 0.0], 1).unwrap_err();
        assert!(err.to_string().contains("zero vector"), "{err}");
        // Zero vectors are fine for the other metrics.
        let l2 = seeded(&context, GpuDistanceMetric::Euclidean);
        l2.add_vectors(&[GpuVector::new("z", vec![0.0; 3])]).expect("zero vector under L2");
        assert_eq!(l2.search(&[0.0; 3], 1).expect("search")[0].id, "z");
    }
}

#[test]
fn k_zero_is_an_error_and_k_above_count_returns_everything() {
    for context in contexts() {
        let storage = seeded(&context, GpuDistanceMetric::Euclidean);
        let err = storage.search(&[0.0, 0.0, 0.0], 0).unwrap_err();
        assert!(matches!(err, HiveGpuError::InvalidArgument(_)) && err.to_string().contains('k'), "{err}");
        let all = storage.search(&[0.0, 0.0, 0.0], 1000).expect("k > count");
        assert_eq!(all.len(), 2);
        let batch = storage.search_batch(&[0.0; 15], 1000).expect("k > count, batch");
        assert!(batch.iter().all(|l| l.len() == 2));
        assert!(storage.search_batch(&[], 5).expect("empty batch").is_empty());
    }
}

#[test]
fn empty_collection_search_is_a_clear_error() {
    for context in contexts() {
        let storage = context.create_storage(3, GpuDistanceMetric::Euclidean).expect("storage");
        let err = storage.search(&[1.0, 2.0, 3.0], 1).unwrap_err();
        assert!(matches!(err, HiveGpuError::EmptyCollection), "{err:?}");
        let storage = seeded(&context, GpuDistanceMetric::Euclidean);
        storage.remove_vectors(&["a", "b"]).expect("remove");
        assert!(matches!(storage.search(&[1.0, 2.0, 3.0], 1).unwrap_err(), HiveGpuError::EmptyCollection));
    }
}

#[test]
fn duplicate_and_unknown_ids_change_nothing() {
    for context in contexts() {
        let storage = seeded(&context, GpuDistanceMetric::Euclidean);
        let before = snapshot(&storage);
        let err = storage
            .add_vectors(&[
                GpuVector::new("c", vec![0.0, 0.0, 1.0]),
                GpuVector::new("d", vec![0.0, 1.0, 0.0]),
                GpuVector::new("c", vec![1.0, 0.0, 0.0]),
            ])
            .unwrap_err();
        assert!(
            matches!(&err, HiveGpuError::DuplicateId { id, first: 0, second: 2 } if id == "c"),
            "{err:?}"
        );
        assert_eq!(snapshot(&storage), before);

        let err = storage.remove_vectors(&["a", "nope"]).unwrap_err();
        assert!(matches!(&err, HiveGpuError::VectorNotFound { id } if id == "nope"), "{err:?}");
        assert!(err.to_string().contains("nope"));
        assert_eq!(snapshot(&storage), before, "'a' must survive a failed removal");

        let err = storage.remove_vectors(&["b", "b"]).unwrap_err();
        assert!(matches!(err, HiveGpuError::DuplicateId { .. }), "{err:?}");
        assert_eq!(snapshot(&storage), before);

        let err = storage.add_vectors(&[GpuVector::new("", vec![0.0; 3])]).unwrap_err();
        assert!(err.to_string().contains("empty id"), "{err}");
        assert_eq!(storage.get_vector("unknown").expect("get"), None);
    }
}

#[test]
fn f16_storage_rejects_values_it_cannot_hold() {
    for context in contexts() {
        let config = hive_gpu::StorageConfig::new(2, GpuDistanceMetric::DotProduct)
            .with_precision(StoragePrecision::F16);
        let storage = context.create_storage_with(config).expect("storage");
        let err = storage.add_vectors(&[GpuVector::new("big", vec![1e5, 0.0])]).unwrap_err();
        assert!(err.to_string().contains("f16"), "{err}");
        assert_eq!(storage.vector_count(), 0);
        let cosine =
            hive_gpu::StorageConfig::new(2, GpuDistanceMetric::Cosine).with_precision(StoragePrecision::F16);
        let storage = context.create_storage_with(cosine).expect("storage");
        let err = storage.add_vectors(&[GpuVector::new("tiny", vec![1e-8, 1e-8])]).unwrap_err();
        assert!(err.to_string().contains("zero vector"), "{err}");
    }
}

/// Under cosine, a stored vector must have |x| >= 1e-18: smaller norms underflow f32 in the
/// kernels (found by the fuzzer). Cosine ignores scale, so the error says to scale it up.
#[test]
fn cosine_rejects_vectors_too_small_for_f32() {
    for context in contexts() {
        let storage = context.create_storage(2, GpuDistanceMetric::Cosine).expect("storage");
        let err = storage.add_vectors(&[GpuVector::new("tiny", vec![1e-37, 0.0])]).unwrap_err();
        assert!(matches!(&err, HiveGpuError::InvalidVector { id: Some(id), .. } if id == "tiny"), "{err:?}");
        assert!(err.to_string().contains("too small for cosine"), "{err}");
        assert_eq!(storage.vector_count(), 0);
        // A tiny *query* is fine: cosine ignores its scale.
        storage
            .add_vectors(&[GpuVector::new("a", vec![1.0, 0.0]), GpuVector::new("b", vec![1.0, 1.0])])
            .expect("add");
        assert_eq!(storage.search(&[1e-40, 0.0], 1).expect("tiny query")[0].id, "a");
    }
}

/// The op set is public: misuse of a row store is an error, not a panic.
#[test]
fn row_store_rejects_bad_arguments() {
    for context in contexts() {
        let mut rows = context
            .backend()
            .new_rows(2, StoragePrecision::F32, SearchPrecision::Exact, context.tuning())
            .expect("rows");
        rows.append(&[1.0, 2.0, 3.0, 4.0]).expect("append");
        assert!(rows.knn(&[1.0, 2.0], 0, GpuDistanceMetric::Euclidean, None).is_err(), "k = 0");
        assert!(rows.knn(&[1.0, 2.0], 3, GpuDistanceMetric::Euclidean, None).is_err(), "k > live rows");
        assert!(rows.knn(&[1.0, 2.0, 3.0], 1, GpuDistanceMetric::Euclidean, None).is_err(), "partial query");
        assert!(rows.read_row(5).is_err(), "slot out of range");
        assert!(rows.compact(&[1, 0]).is_err(), "descending slots");
        assert!(rows.compact(&[7]).is_err(), "slot out of range");
        assert!(rows.append(&[1.0]).is_err(), "partial row");
        rows.truncate(7);
        assert_eq!(rows.len(), 2, "nothing changed");
        assert_eq!(rows.read_row(1).expect("row"), vec![3.0, 4.0]);
    }
}

#[test]
fn zero_dimension_is_rejected() {
    for context in contexts() {
        let err = context.create_storage(0, GpuDistanceMetric::Euclidean).unwrap_err();
        assert!(err.to_string().contains("dimension"), "{err}");
    }
}

#[test]
fn too_little_memory_is_vram_limit_exceeded() {
    for context in contexts() {
        let mut rows = context
            .backend()
            .new_rows(4096, StoragePrecision::F32, SearchPrecision::Exact, context.tuning())
            .expect("rows");
        // 2^30 rows of 4096 f32: 16 TiB, far beyond any machine's free memory (and within every
        // backend's row-count limit, so the memory check is what refuses it).
        let err = rows.reserve(1 << 30).unwrap_err();
        match err {
            HiveGpuError::VramLimitExceeded { requested, available, .. } => {
                assert!(requested > available, "requested {requested} available {available}");
            }
            other => panic!("wrong error: {other:?}"),
        }
        assert_eq!(rows.len(), 0);
        rows.append(&[0.5; 4096]).expect("still usable after the failed reservation");
        assert_eq!(rows.len(), 1);
    }
}

#[test]
fn unavailable_backends_say_why() {
    for status in detect_available_backends() {
        if status.available {
            continue;
        }
        assert!(!status.reason.is_empty(), "{:?} gives no reason", status.backend);
        let err = GpuContext::with_backend(status.backend, 0).unwrap_err();
        assert!(matches!(err, HiveGpuError::BackendUnavailable { .. }), "{err:?}");
        assert!(err.to_string().contains(&status.reason), "{err}");
    }
    let err = GpuContext::with_backend(GpuBackendType::Cpu, 3).unwrap_err();
    assert!(matches!(err, HiveGpuError::DeviceNotFound { ordinal: 3, .. }), "{err:?}");
}

/// Any dimension works or is refused with a message naming it, on every backend, never a
/// panic: the wgpu backend once panicked in `reserve` past 2^17 components (a chunk could hold
/// fewer than its 256-row minimum, and `clamp(256, fewer)` panics).
#[test]
fn very_high_dimensions_work_or_are_refused_clearly() {
    for context in contexts() {
        let backend = context.backend_type();
        for dim in [4_097usize, 131_073, 300_000, 2_000_000] {
            let storage = match context.create_storage(dim, GpuDistanceMetric::Euclidean) {
                Ok(storage) => storage,
                Err(err) => {
                    assert!(err.to_string().contains(&dim.to_string()), "{backend} {dim}: {err}");
                    continue;
                }
            };
            let vectors: Vec<GpuVector> = (0..3)
                .map(|i| {
                    GpuVector::new(
                        format!("v{i}"),
                        (0..dim).map(|j| ((i * 7 + j) % 11) as f32 - 5.0).collect(),
                    )
                })
                .collect();
            if let Err(err) = storage.reserve(3).and_then(|()| storage.add_vectors(&vectors)) {
                assert!(
                    matches!(err, HiveGpuError::VramLimitExceeded { .. } | HiveGpuError::InvalidArgument(_)),
                    "{backend} {dim}: {err:?}"
                );
                assert_eq!(storage.vector_count(), 0, "{backend} {dim}: a refused batch changes nothing");
                continue;
            }
            let query: Vec<f32> = vectors[1].data.iter().map(|x| x + 0.25).collect();
            let hits = storage.search(&query, 2).expect("one query");
            assert_eq!(hits[0].id, "v1", "{backend} {dim}");
            let batch =
                storage.search_batch(&[query.clone(), vectors[2].data.clone()].concat(), 1).expect("a batch");
            assert_eq!((batch[0][0].id.as_str(), batch[1][0].id.as_str()), ("v1", "v2"), "{backend} {dim}");
        }
    }
}

/// A flat batch whose values are not exactly one vector per id is refused whole.
#[test]
fn flat_batches_need_one_vector_per_id() {
    for context in contexts() {
        let storage = context.create_storage(2, GpuDistanceMetric::Euclidean).expect("storage");
        for values in [&[1.0f32, 2.0, 3.0][..], &[1.0; 5][..], &[][..]] {
            let err = storage.add_vectors_flat(&["a", "b"], values).unwrap_err();
            assert!(matches!(err, HiveGpuError::InvalidArgument(_)), "{err:?}");
            assert!(err.to_string().contains("2 ids of dimension 2"), "{err}");
        }
        assert_eq!(storage.vector_count(), 0);
        storage.add_vectors_flat(&["a", "b"], &[1.0, 2.0, 3.0, 4.0]).expect("one vector per id");
        assert_eq!(storage.get_vector("b").expect("get").expect("b").data, vec![3.0, 4.0]);
    }
}
