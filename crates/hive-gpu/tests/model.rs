//! Random sequences of upserts, removals, reads, searches, clears and compactions, checked
//! step by step against a plain in-memory model of what the collection must hold.

mod common;

use std::collections::HashMap;

use common::{Rng, assert_exact, contexts, reference};
use hive_gpu::{
    GpuContext, GpuDistanceMetric, GpuVector, HiveGpuError, Metadata, StorageConfig, StoragePrecision,
};

/// The model: live ids in the order they were last written (an upsert writes the vector anew
/// at the end, and that order is the collection's tie order) with their stored values and
/// payloads.
#[derive(Default)]
struct Model {
    order: Vec<String>,
    vectors: HashMap<String, (Vec<f32>, Metadata)>,
}

impl Model {
    fn upsert(&mut self, v: &GpuVector, precision: StoragePrecision) {
        let data = match precision {
            StoragePrecision::F32 => v.data.clone(),
            StoragePrecision::F16 => v.data.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
        };
        if self.vectors.insert(v.id.clone(), (data, v.metadata.clone())).is_some() {
            self.order.retain(|x| x != &v.id);
        }
        self.order.push(v.id.clone());
    }

    fn remove(&mut self, id: &str) {
        self.vectors.remove(id);
        self.order.retain(|x| x != id);
    }

    fn pairs(&self) -> Vec<(String, Vec<f32>)> {
        self.order.iter().map(|id| (id.clone(), self.vectors[id].0.clone())).collect()
    }
}

fn random_vector(rng: &mut Rng, dim: usize) -> Vec<f32> {
    // Small integers make exact ties common, which exercises tie order too.
    (0..dim)
        .map(|_| (rng.below(7) as f32 - 3.0) + if rng.below(2) == 0 { 0.0 } else { rng.normal() })
        .collect()
}

fn run_sequence(context: &GpuContext, metric: GpuDistanceMetric, precision: StoragePrecision, seed: u64) {
    let dim = 16;
    let mut rng = Rng::new(seed);
    let storage = context
        .create_storage_with(StorageConfig::new(dim, metric).with_precision(precision))
        .expect("storage");
    let mut model = Model::default();
    let name = |i: usize| format!("id-{i}");
    for step in 0..1500 {
        let what = format!("{} {metric} {precision} step {step}", context.backend_type());
        match rng.below(100) {
            0..=39 => {
                let count = 1 + rng.below(40);
                let mut ids: Vec<usize> = (0..count).map(|_| rng.below(400)).collect();
                ids.sort_unstable();
                ids.dedup();
                let batch: Vec<GpuVector> = ids
                    .iter()
                    .map(|&i| {
                        let meta: Metadata = [("step".to_string(), step.to_string())].into();
                        GpuVector::with_metadata(name(i), random_vector(&mut rng, dim), meta)
                    })
                    .filter(|v| metric != GpuDistanceMetric::Cosine || v.data.iter().any(|&x| x != 0.0))
                    .collect();
                storage.add_vectors(&batch).unwrap_or_else(|e| panic!("{what}: add: {e}"));
                for v in &batch {
                    model.upsert(v, precision);
                }
            }
            40..=59 if !model.order.is_empty() => {
                let count = 1 + rng.below(15.min(model.order.len()));
                let mut ids: Vec<String> =
                    (0..count).map(|_| model.order[rng.below(model.order.len())].clone()).collect();
                ids.sort();
                ids.dedup();
                if rng.below(5) == 0 {
                    // One unknown id spoils the whole removal.
                    ids.push("never-added".into());
                    let err = storage.remove_vectors(&ids).unwrap_err();
                    assert!(matches!(err, HiveGpuError::VectorNotFound { .. }), "{what}: {err:?}");
                } else {
                    storage.remove_vectors(&ids).unwrap_or_else(|e| panic!("{what}: remove: {e}"));
                    for id in &ids {
                        model.remove(id);
                    }
                }
            }
            60..=69 => {
                let id = name(rng.below(400));
                let got = storage.get_vector(&id).expect("get");
                match (got, model.vectors.get(&id)) {
                    (None, None) => {}
                    (Some(v), Some((data, meta))) => {
                        assert_eq!(&v.data, data, "{what}: data of {id}");
                        assert_eq!(&v.metadata, meta, "{what}: payload of {id}");
                    }
                    (got, want) => panic!("{what}: get {id}: got {got:?}, model has {want:?}"),
                }
            }
            70..=97 => {
                let nq = [1, 4 + rng.below(8), 16 + rng.below(16)][rng.below(3)];
                let queries: Vec<f32> = (0..nq)
                    .flat_map(|_| {
                        let mut q = random_vector(&mut rng, dim);
                        q[0] += 0.5; // never a zero vector (cosine)
                        q
                    })
                    .collect();
                let k = 1 + rng.below(60);
                let result = storage.search_batch(&queries, k);
                if model.order.is_empty() {
                    assert!(matches!(result, Err(HiveGpuError::EmptyCollection)), "{what}: {result:?}");
                    continue;
                }
                let lists = result.unwrap_or_else(|e| panic!("{what}: search: {e}"));
                let pairs = model.pairs();
                let by_id = pairs.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
                for (qi, q) in queries.chunks_exact(dim).enumerate() {
                    let want = reference(metric, &pairs, q, k);
                    assert_exact(&format!("{what} query {qi}"), metric, &lists[qi], &want, &by_id, q);
                    let got_ids: Vec<&str> = lists[qi].iter().map(|r| r.id.as_str()).collect();
                    let want_ids: Vec<&str> = want.iter().map(|(id, _)| id.as_str()).collect();
                    assert_eq!(got_ids, want_ids, "{what} query {qi}: ids and tie order");
                }
            }
            98 => {
                storage.clear().expect("clear");
                model = Model::default();
            }
            _ => storage.compact().expect("compact"),
        }
        assert_eq!(storage.vector_count(), model.order.len(), "{what}: count");
        let (slots, live) = (storage.slot_count(), storage.vector_count());
        assert!(
            slots == live || (slots - live) * 4 < slots,
            "{what}: {slots} slots for {live} vectors: not reclaimed"
        );
    }
}

#[test]
fn random_operation_sequences_match_the_model() {
    for context in contexts() {
        for (i, metric) in
            [GpuDistanceMetric::Euclidean, GpuDistanceMetric::Cosine, GpuDistanceMetric::DotProduct]
                .into_iter()
                .enumerate()
        {
            for (j, precision) in [StoragePrecision::F32, StoragePrecision::F16].into_iter().enumerate() {
                run_sequence(&context, metric, precision, 40 + (i * 2 + j) as u64);
            }
        }
    }
}

#[test]
fn removed_ids_can_be_added_again_and_upserts_replace() {
    for context in contexts() {
        let storage = context.create_storage(2, GpuDistanceMetric::Euclidean).expect("storage");
        storage
            .add_vectors(&[GpuVector::new("a", vec![1.0, 1.0]), GpuVector::new("b", vec![5.0, 5.0])])
            .expect("add");
        storage.add_vectors(&[GpuVector::new("a", vec![9.0, 9.0])]).expect("upsert");
        assert_eq!(storage.vector_count(), 2);
        assert_eq!(storage.get_vector("a").expect("get").expect("present").data, vec![9.0, 9.0]);
        assert_eq!(storage.search(&[9.0, 9.0], 1).expect("search")[0].id, "a");
        storage.remove_vectors(&["a"]).expect("remove");
        assert!(!storage.contains("a"));
        assert_eq!(storage.search(&[9.0, 9.0], 5).expect("search").len(), 1);
        storage.add_vectors(&[GpuVector::new("a", vec![0.0, 0.0])]).expect("re-add");
        assert_eq!(storage.vector_count(), 2);
        assert_eq!(storage.search(&[0.0, 0.0], 1).expect("search")[0].id, "a");
    }
}

/// Deleting most of a collection shrinks its slots: deletes never slow search for good.
#[test]
fn mass_removal_is_reclaimed() {
    for context in contexts() {
        let storage = context.create_storage(8, GpuDistanceMetric::Euclidean).expect("storage");
        let vectors: Vec<GpuVector> =
            (0..10_000).map(|i| GpuVector::new(format!("{i}"), vec![i as f32; 8])).collect();
        storage.add_vectors(&vectors).expect("add");
        let doomed: Vec<String> = (0..9_000).map(|i| format!("{i}")).collect();
        for chunk in doomed.chunks(100) {
            storage.remove_vectors(chunk).expect("remove");
        }
        assert_eq!(storage.vector_count(), 1000);
        assert!(storage.slot_count() < 1334, "{} slots remain for 1000 vectors", storage.slot_count());
        assert_eq!(storage.search(&[9500.0; 8], 1).expect("search")[0].id, "9500");
    }
}
