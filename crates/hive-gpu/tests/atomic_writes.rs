//! A batch is all or nothing on every backend. A row store that fails part way through a batch
//! (a device error, memory running out: injected here by wrapping the real backend) must leave
//! the collection exactly as it was: the same ids, values, payloads and search answers, and no
//! slot of the failed batch left behind. Writes once went row store first, ids after, chunk by
//! chunk, so a failure in the third chunk kept the first two.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::faulty::{FaultyBackend, Plan};
use common::{assert_exact, contexts, reference};
use hive_gpu::{GpuContext, GpuDistanceMetric, GpuVector, GpuVectorStorage, Metadata};

const DIM: usize = 6;

fn values(id: &str, generation: u32) -> Vec<f32> {
    let h = id.bytes().fold(generation as u64 + 17, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    (0..DIM).map(|i| ((h >> (i * 7)) % 97) as f32 / 8.0 - 6.0).collect()
}

/// Everything a caller can observe, to compare before and after a failed batch.
#[derive(Debug, PartialEq)]
struct Observed {
    count: usize,
    slots: usize,
    vectors: Vec<Option<GpuVector>>,
    answers: Vec<Vec<(String, f32)>>,
}

fn observe(storage: &GpuVectorStorage, ids: &[String], queries: &[f32]) -> Observed {
    Observed {
        count: storage.vector_count(),
        slots: storage.slot_count(),
        vectors: ids.iter().map(|id| storage.get_vector(id).expect("get")).collect(),
        answers: storage
            .search_batch(queries, 7)
            .expect("search")
            .into_iter()
            .map(|list| list.into_iter().map(|r| (r.id.to_string(), r.score)).collect())
            .collect(),
    }
}

#[test]
fn a_batch_that_fails_part_way_changes_nothing() {
    for context in contexts() {
        let plan = Arc::new(Mutex::new(Plan::default()));
        let faulty = GpuContext::from_backend(Arc::new(FaultyBackend {
            inner: context.shared_backend(),
            plan: plan.clone(),
        }));
        let backend = context.backend_type();
        let storage = faulty.create_storage(DIM, GpuDistanceMetric::Euclidean).expect("storage");
        let old: Vec<GpuVector> = (0..300)
            .map(|i| {
                let id = format!("old{i}");
                let meta: Metadata = [("n".to_string(), i.to_string())].into();
                GpuVector::with_metadata(id.clone(), values(&id, 0), meta)
            })
            .collect();
        storage.add_vectors(&old).expect("first batch");
        storage.remove_vectors(&["old7", "old8"]).expect("a removal, so tombstones exist too");

        // 200 replacements and 19,800 new ids: three appends of at most 8,192 rows.
        let batch: Vec<GpuVector> = (0..200)
            .map(|i| format!("old{i}"))
            .chain((0..19_800).map(|i| format!("new{i}")))
            .map(|id| GpuVector::new(id.clone(), values(&id, 1)))
            .collect();
        let watched: Vec<String> =
            ["old0", "old7", "old199", "old200", "old299", "new0", "new9000", "new19799"]
                .map(String::from)
                .to_vec();
        let queries: Vec<f32> = [values("old3", 1), values("new5", 1), values("old250", 0)].concat();
        let before = observe(&storage, &watched, &queries);

        let mut faults: Vec<(String, Plan)> = Vec::new();
        for after in 0..3 {
            for torn in [false, true] {
                faults.push((
                    format!("append {} of 3 fails (torn: {torn})", after + 1),
                    Plan { append_after: Some(after), torn, ..Plan::default() },
                ));
            }
        }
        faults.push(("the reservation fails".into(), Plan { reserve: true, ..Plan::default() }));
        for (what, fault) in faults {
            for flat in [false, true] {
                *plan.lock().expect("plan") = fault;
                let outcome = if flat {
                    let ids: Vec<&str> = batch.iter().map(|v| v.id.as_str()).collect();
                    let values: Vec<f32> = batch.iter().flat_map(|v| v.data.iter().copied()).collect();
                    storage.add_vectors_flat(&ids, &values)
                } else {
                    storage.add_vectors(&batch)
                };
                let err = outcome.expect_err("the injected fault surfaces");
                assert!(err.to_string().contains("fault injected"), "{backend} {what}: {err}");
                assert_eq!(observe(&storage, &watched, &queries), before, "{backend} {what} (flat: {flat})");
                *plan.lock().expect("plan") = Plan::default();
            }
        }

        // A compaction that fails leaves ids and slots as they were.
        *plan.lock().expect("plan") = Plan { compact: true, ..Plan::default() };
        assert!(storage.compact().is_err(), "{backend}: the injected compaction fault");
        assert_eq!(observe(&storage, &watched, &queries), before, "{backend}: failed compaction");
        *plan.lock().expect("plan") = Plan::default();

        // Unarmed, the same batch goes through whole, and searches are exact over it.
        storage.add_vectors(&batch).expect("the batch without faults");
        assert_eq!(storage.vector_count(), 300 + 19_800, "old7 and old8 come back with the batch");
        assert_eq!(storage.get_vector("old0").expect("get").expect("present").data, values("old0", 1));
        let mut stored: HashMap<String, Vec<f32>> = HashMap::new();
        for v in old.iter().filter(|v| v.id != "old7" && v.id != "old8") {
            stored.insert(v.id.clone(), v.data.clone());
        }
        for v in &batch {
            stored.insert(v.id.clone(), v.data.clone());
        }
        let pairs: Vec<(String, Vec<f32>)> = stored.into_iter().collect();
        let by_id: HashMap<&str, &[f32]> = pairs.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
        for q in queries.chunks_exact(DIM) {
            let got = storage.search(q, 7).expect("search");
            // Ties between equal vectors are not expected here, so the order of `pairs` does not
            // matter for the reference.
            let want = reference(GpuDistanceMetric::Euclidean, &pairs, q, 7);
            assert_exact(
                &format!("{backend} after the batch"),
                GpuDistanceMetric::Euclidean,
                &got,
                &want,
                &by_id,
                q,
            );
        }
    }
}
