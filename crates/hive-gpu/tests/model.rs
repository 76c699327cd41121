//! Random sequences of upserts, removals, reads, searches (half of them filtered), clears and
//! compactions, checked step by step against a plain in-memory model of what the collection
//! must hold. The model decides which vectors pass a filter by evaluating it naively on each
//! vector's own payload; the library uses its payload indexes and slot sets.

mod common;

use std::collections::HashMap;

use common::{Rng, assert_exact, contexts, reference};
use hive_gpu::{
    Filter, GpuContext, GpuDistanceMetric, GpuVector, HiveGpuError, Metadata, PayloadValue, SearchOptions,
    StorageConfig, StoragePrecision,
};

/// The model: live ids in the order they were last written (an upsert writes the vector anew
/// at the end, and that order is the collection's tie order) with their stored values and
/// payloads.
#[derive(Default)]
struct Model {
    order: Vec<String>,
    vectors: HashMap<String, (Vec<f32>, Metadata)>,
    /// Each live id's integer field `bucket`, where it has one.
    buckets: HashMap<String, i64>,
}

impl Model {
    fn upsert(&mut self, v: &GpuVector, precision: StoragePrecision) {
        let data = common::stored(precision, &v.data);
        if self.vectors.insert(v.id.clone(), (data, v.metadata.clone())).is_some() {
            self.order.retain(|x| x != &v.id);
        }
        match v.payload.get("bucket") {
            Some(PayloadValue::Integer(b)) => self.buckets.insert(v.id.clone(), *b),
            _ => self.buckets.remove(&v.id),
        };
        self.order.push(v.id.clone());
    }

    fn remove(&mut self, id: &str) {
        self.vectors.remove(id);
        self.buckets.remove(id);
        self.order.retain(|x| x != id);
    }

    /// The live vectors that pass `filter` (all without one), in tie order.
    fn pairs(&self, filter: Option<&ModelFilter>) -> Vec<(String, Vec<f32>)> {
        self.order
            .iter()
            .filter(|id| filter.is_none_or(|f| f.passes(id, self.buckets.get(*id).copied())))
            .map(|id| (id.clone(), self.vectors[id].0.clone()))
            .collect()
    }
}

/// A filter as the model evaluates it: one vector at a time, from its id and `bucket`.
#[derive(Debug, Clone)]
enum ModelFilter {
    Ids(Vec<String>),
    ExcludeIds(Vec<String>),
    Bucket(i64),
    BucketIn(i64, i64),
    Not(Box<ModelFilter>),
    And(Box<ModelFilter>, Box<ModelFilter>),
    Or(Box<ModelFilter>, Box<ModelFilter>),
}

impl ModelFilter {
    fn random(rng: &mut Rng, depth: usize) -> Self {
        let names =
            |rng: &mut Rng| (0..1 + rng.below(40)).map(|_| format!("id-{}", rng.below(420))).collect();
        match rng.below(if depth > 1 { 4 } else { 7 }) {
            0 => Self::Ids(names(rng)),
            1 => Self::ExcludeIds(names(rng)),
            2 => Self::Bucket(rng.below(7) as i64 - 1),
            3 => {
                let lo = rng.below(6) as i64;
                Self::BucketIn(lo, lo + rng.below(3) as i64)
            }
            4 => Self::Not(Box::new(Self::random(rng, depth + 1))),
            5 => Self::And(Box::new(Self::random(rng, depth + 1)), Box::new(Self::random(rng, depth + 1))),
            _ => Self::Or(Box::new(Self::random(rng, depth + 1)), Box::new(Self::random(rng, depth + 1))),
        }
    }

    fn passes(&self, id: &str, bucket: Option<i64>) -> bool {
        match self {
            Self::Ids(ids) => ids.iter().any(|x| x == id),
            Self::ExcludeIds(ids) => !ids.iter().any(|x| x == id),
            Self::Bucket(b) => bucket == Some(*b),
            Self::BucketIn(lo, hi) => bucket.is_some_and(|b| (*lo..=*hi).contains(&b)),
            Self::Not(f) => !f.passes(id, bucket),
            Self::And(a, b) => a.passes(id, bucket) && b.passes(id, bucket),
            Self::Or(a, b) => a.passes(id, bucket) || b.passes(id, bucket),
        }
    }

    fn to_filter(&self) -> Filter {
        match self {
            Self::Ids(ids) => Filter::ids(ids),
            Self::ExcludeIds(ids) => Filter::exclude_ids(ids),
            Self::Bucket(b) => Filter::eq("bucket", *b),
            Self::BucketIn(lo, hi) => Filter::range("bucket", *lo as f64..=*hi as f64),
            Self::Not(f) => f.to_filter().not(),
            Self::And(a, b) => a.to_filter().and(b.to_filter()),
            Self::Or(a, b) => a.to_filter().or(b.to_filter()),
        }
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
                        let values = common::storable(precision, &random_vector(&mut rng, dim));
                        let v = GpuVector::with_metadata(name(i), values, meta);
                        // One vector in eight has no `bucket`: predicates on it fail there.
                        if rng.below(8) == 0 { v } else { v.with_field("bucket", rng.below(6) as i64) }
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
                let filter = (rng.below(2) == 0).then(|| ModelFilter::random(&mut rng, 0));
                let result = match &filter {
                    Some(f) => storage.search_batch_with(
                        &queries,
                        k,
                        &SearchOptions::default().with_filter(f.to_filter()),
                    ),
                    None => storage.search_batch(&queries, k),
                };
                let what = format!("{what} filter {filter:?}");
                if model.order.is_empty() {
                    assert!(matches!(result, Err(HiveGpuError::EmptyCollection)), "{what}: {result:?}");
                    continue;
                }
                let lists = result.unwrap_or_else(|e| panic!("{what}: search: {e}"));
                let pairs = model.pairs(filter.as_ref());
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
        for (i, metric) in common::METRICS.into_iter().enumerate() {
            // f32 and f16 with every metric; each other type with one (seeds as before for f32
            // and f16).
            let extra = [StoragePrecision::Bf16, StoragePrecision::I8, StoragePrecision::U8][i % 3];
            for (j, precision) in [StoragePrecision::F32, StoragePrecision::F16].into_iter().enumerate() {
                run_sequence(&context, metric, precision, 40 + (i * 2 + j) as u64);
            }
            run_sequence(&context, metric, extra, 140 + i as u64);
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
