//! Filtered search on every backend and every forced engine path: the results equal an f64
//! brute force over exactly the vectors that pass, where "pass" is decided by a naive
//! evaluation of the filter against each vector's own payload (not by the payload indexes the
//! library uses), after upserts, removals and compaction.

mod common;

use std::collections::HashMap;
use std::ops::Bound;

use common::{Rng, assert_exact, contexts, contexts_with_forced_paths, describe, reference};
use hive_gpu::{
    Filter, GpuBackendType, GpuContext, GpuDistanceMetric, GpuVector, GpuVectorStorage, HiveGpuError,
    MAX_FILTER_DEPTH, PayloadValue, SearchOptions, StorageConfig, StoragePrecision,
};

const COLORS: [&str; 5] = ["red", "green", "blue", "cyan", "black"];

/// A vector with random typed fields (some missing) and a string metadata field.
fn random_vector(rng: &mut Rng, id: String, dim: usize) -> GpuVector {
    let mut v = GpuVector::new(id, rng.normals(dim));
    if rng.below(10) > 0 {
        v = v.with_field("color", COLORS[rng.below(COLORS.len())]);
    }
    if rng.below(10) > 0 {
        v = v.with_field("price", rng.below(100) as i64);
    }
    if rng.below(10) > 0 {
        v = v.with_field("score", (rng.uniform() * 10.0).floor() / 2.0);
    }
    v = v.with_field("flag", rng.below(2) == 0);
    v.metadata.insert("shard".into(), format!("s{}", rng.below(3)));
    v
}

fn random_value(rng: &mut Rng, field: &str) -> PayloadValue {
    match field {
        "color" => PayloadValue::from(COLORS[rng.below(COLORS.len())]),
        "price" if rng.below(2) == 0 => PayloadValue::Integer(rng.below(100) as i64),
        // A float equal to an integer matches it: both numeric types are exercised.
        "price" => PayloadValue::Float(rng.below(100) as f64),
        "score" => PayloadValue::Float((rng.uniform() * 10.0).floor() / 2.0),
        "flag" => PayloadValue::Bool(rng.below(2) == 0),
        _ => PayloadValue::from(format!("s{}", rng.below(3)).as_str()),
    }
}

fn random_bound(rng: &mut Rng) -> Bound<f64> {
    let x = (rng.uniform() * 110.0 - 5.0).floor() / 2.0;
    match rng.below(3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(x),
        _ => Bound::Excluded(x),
    }
}

/// A random filter tree of at most `depth` levels, over ids of `0..ids`.
fn random_filter(rng: &mut Rng, depth: usize, ids: usize) -> Filter {
    let fields = ["color", "price", "score", "flag", "shard", "missing"];
    let leaf = rng.below(if depth == 0 { 6 } else { 9 });
    let field = fields[rng.below(fields.len())];
    match leaf {
        0 => Filter::eq(field, random_value(rng, field)),
        1 => Filter::any_of(field, (0..rng.below(4)).map(|_| random_value(rng, field)).collect::<Vec<_>>()),
        2 => Filter::Range(["price", "score"][rng.below(2)].into(), random_bound(rng), random_bound(rng)),
        3 => Filter::ids(&(0..rng.below(40)).map(|_| format!("v{}", rng.below(ids))).collect::<Vec<_>>()),
        4 => Filter::has(field),
        5 => Filter::exclude_ids(
            &(0..rng.below(40)).map(|_| format!("v{}", rng.below(ids))).collect::<Vec<_>>(),
        ),
        6 => Filter::And((0..rng.below(3) + 1).map(|_| random_filter(rng, depth - 1, ids)).collect()),
        7 => Filter::Or((0..rng.below(3) + 1).map(|_| random_filter(rng, depth - 1, ids)).collect()),
        _ => random_filter(rng, depth - 1, ids).not(),
    }
}

/// A field's value as the filter sees it: typed payload first, then string metadata.
fn field_of(v: &GpuVector, field: &str) -> Option<PayloadValue> {
    v.payload.get(field).cloned().or_else(|| v.metadata.get(field).map(|s| PayloadValue::from(s.as_str())))
}

fn number(value: &PayloadValue) -> Option<f64> {
    match value {
        PayloadValue::Integer(i) => Some(*i as f64),
        PayloadValue::Float(x) => Some(*x),
        _ => None,
    }
}

fn equal(a: &PayloadValue, b: &PayloadValue) -> bool {
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The filter's meaning, evaluated on one vector (the specification the indexes must meet).
fn passes(filter: &Filter, v: &GpuVector) -> bool {
    match filter {
        Filter::All => true,
        Filter::Ids(ids) => ids.contains(&v.id),
        Filter::Equals(field, value) => field_of(v, field).is_some_and(|x| equal(&x, value)),
        Filter::AnyOf(field, values) => {
            field_of(v, field).is_some_and(|x| values.iter().any(|w| equal(&x, w)))
        }
        Filter::Range(field, low, high) => field_of(v, field).and_then(|x| number(&x)).is_some_and(|x| {
            let above = match low {
                Bound::Included(b) => x >= *b,
                Bound::Excluded(b) => x > *b,
                Bound::Unbounded => true,
            };
            let below = match high {
                Bound::Included(b) => x <= *b,
                Bound::Excluded(b) => x < *b,
                Bound::Unbounded => true,
            };
            above && below
        }),
        Filter::Has(field) => field_of(v, field).is_some(),
        Filter::And(all) => all.iter().all(|f| passes(f, v)),
        Filter::Or(any) => any.iter().any(|f| passes(f, v)),
        Filter::Not(inner) => !passes(inner, v),
        other => panic!("the test does not know filter {other:?}"),
    }
}

/// Stored (id, values) pairs of the passing vectors, in slot order (the reference's tie order).
fn passing(live: &[GpuVector], filter: &Filter, precision: StoragePrecision) -> Vec<(String, Vec<f32>)> {
    live.iter()
        .filter(|v| passes(filter, v))
        .map(|v| (v.id.clone(), common::stored(precision, &v.data)))
        .collect()
}

/// Checks filtered searches of `storage` (holding `live` in slot order) against the brute force.
#[allow(clippy::too_many_arguments)]
fn check_filters(
    what: &str,
    rng: &mut Rng,
    storage: &GpuVectorStorage,
    live: &[GpuVector],
    ids: usize,
    metric: GpuDistanceMetric,
    precision: StoragePrecision,
    filters: usize,
) {
    let dim = storage.dimension();
    for f in 0..filters {
        let filter = random_filter(rng, 3, ids);
        let allowed = passing(live, &filter, precision);
        let by_id: HashMap<&str, &[f32]> =
            allowed.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
        let nq = [1, 3, 24][f % 3];
        let k = [1, 10, 100][rng.below(3)];
        let queries = rng.normals(nq * dim);
        let options = SearchOptions::default().with_filter(filter.clone()).with_metadata(true);
        let got = storage
            .search_batch_with(&queries, k, &options)
            .unwrap_or_else(|e| panic!("{what}: filter {filter:?} (k {k}, nq {nq}) failed: {e}"));
        assert_eq!(got.len(), nq, "{what}: one list per query");
        for (q, found) in queries.chunks_exact(dim).zip(&got) {
            let want = reference(metric, &allowed, q, k);
            let label = format!("{what}: filter {filter:?}, {} pass, k {k}, nq {nq}", allowed.len());
            assert_exact(&label, metric, found, &want, &by_id, q);
            for r in found {
                let v = live.iter().find(|v| v.id == r.id).expect("a live id");
                assert!(passes(&filter, v), "{label}: {} does not pass", r.id);
                assert_eq!(r.payload.as_deref(), Some(&v.payload), "{label}: the payload comes back");
            }
        }
    }
}

#[test]
fn filtered_searches_equal_a_brute_force_over_the_passing_vectors_on_every_backend_and_path() {
    let metrics = common::METRICS;
    for (c, context) in contexts_with_forced_paths().into_iter().enumerate() {
        for (m, metric) in metrics.into_iter().enumerate() {
            // Each metric with another storage type: f32, f16, bf16, i8, u8.
            let precision = StoragePrecision::ALL[m];
            let dim = [3, 32, 100, 31, 64][m];
            run_filtered_case(&context, metric, precision, dim, 1000 + (c * 8 + m) as u64);
        }
    }
}

/// bf16 and byte rows under the metrics with products, at dimensions the tensor-core paths
/// take (a multiple of 8): their f16 copies (rounded for bf16, exact for bytes) behind a skip
/// mask and over gathered rows, as the forced contexts run every batch through the fused filter.
#[test]
fn filtered_searches_over_bf16_and_byte_rows_on_their_tensor_core_copies_equal_a_brute_force() {
    let cases = [
        (StoragePrecision::Bf16, GpuDistanceMetric::Euclidean, 64),
        (StoragePrecision::Bf16, GpuDistanceMetric::DotProduct, 32),
        (StoragePrecision::I8, GpuDistanceMetric::DotProduct, 32),
        (StoragePrecision::I8, GpuDistanceMetric::Cosine, 40),
        (StoragePrecision::U8, GpuDistanceMetric::Euclidean, 128),
    ];
    for (c, context) in contexts_with_forced_paths().into_iter().enumerate() {
        for (i, (precision, metric, dim)) in cases.into_iter().enumerate() {
            run_filtered_case(&context, metric, precision, dim, 3000 + (c * 8 + i) as u64);
        }
    }
}

/// Filtered searches of a fresh collection of `precision` against the brute force, then again
/// after a tenth of its vectors are removed and a tenth replaced.
fn run_filtered_case(
    context: &GpuContext,
    metric: GpuDistanceMetric,
    precision: StoragePrecision,
    dim: usize,
    seed: u64,
) {
    let n = if context.device_info().software { 1500 } else { 6000 };
    let what = format!("{} {metric:?} {precision:?} d{dim}", describe(context));
    let mut rng = Rng::new(seed);
    let storage = context
        .create_storage_with(StorageConfig::new(dim, metric).with_precision(precision))
        .expect("storage");
    let storable = |mut v: GpuVector| {
        v.data = common::storable(precision, &v.data);
        v
    };
    let mut vectors: Vec<GpuVector> =
        (0..n).map(|i| storable(random_vector(&mut rng, format!("v{i}"), dim))).collect();
    storage.add_vectors(&vectors).expect("add");
    check_filters(&what, &mut rng, &storage, &vectors, n, metric, precision, 12);

    // Remove a tenth and replace a tenth (new values and fields): removed and replaced rows
    // must never pass, replacements must.
    let removed: Vec<String> = (0..n).filter(|i| i % 10 == 3).map(|i| format!("v{i}")).collect();
    storage.remove_vectors(&removed).expect("remove");
    let replacements: Vec<GpuVector> = (0..n)
        .filter(|i| i % 10 == 7)
        .map(|i| storable(random_vector(&mut rng, format!("v{i}"), dim)))
        .collect();
    storage.add_vectors(&replacements).expect("replace");
    vectors.retain(|v| !removed.contains(&v.id) && !replacements.iter().any(|r| r.id == v.id));
    vectors.extend(replacements);
    check_filters(&format!("{what} after writes"), &mut rng, &storage, &vectors, n, metric, precision, 9);
}

#[test]
fn a_filter_passing_fewer_than_k_vectors_returns_them_all_and_one_passing_none_returns_empty_lists() {
    for context in contexts() {
        let storage = context.create_storage(4, GpuDistanceMetric::Euclidean).expect("storage");
        let mut rng = Rng::new(7);
        let vectors: Vec<GpuVector> =
            (0..3000).map(|i| random_vector(&mut rng, format!("v{i}"), 4)).collect();
        storage.add_vectors(&vectors).expect("add");
        let what = describe(&context);
        let three = Filter::ids(&["v5", "v2999", "v1234", "not-an-id"]);
        let hits = storage.search_filtered(&[0.0; 4], 10, &three).expect("search");
        let mut ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["v1234", "v2999", "v5"], "{what}");
        let none = Filter::eq("color", "purple");
        assert!(storage.search_filtered(&[0.0; 4], 10, &none).expect("search").is_empty(), "{what}");
        let batch = storage
            .search_batch_with(&[0.0; 12], 5, &SearchOptions::default().with_filter(none))
            .expect("batch");
        assert_eq!(batch, vec![Vec::new(); 3], "{what}: one empty list per query");
        // Everything removed that passed: nothing passes any more.
        storage.remove_vectors(&["v5", "v2999", "v1234"]).expect("remove");
        assert!(storage.search_filtered(&[0.0; 4], 10, &three).expect("search").is_empty(), "{what}");
    }
}

#[test]
fn payload_indexes_agree_with_the_naive_meaning_through_upserts_removals_compaction_and_clear() {
    let context = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("cpu");
    let storage = context.create_storage(2, GpuDistanceMetric::Euclidean).expect("storage");
    let mut rng = Rng::new(99);
    let mut live: Vec<GpuVector> = Vec::new();
    let n = 400;
    for round in 0..30 {
        // Upsert a random batch (new and existing ids), then remove a few.
        let batch: Vec<GpuVector> = {
            let mut ids: Vec<usize> = (0..40).map(|_| rng.below(n)).collect();
            ids.sort_unstable();
            ids.dedup();
            ids.into_iter().map(|i| random_vector(&mut rng, format!("v{i}"), 2)).collect()
        };
        storage.add_vectors(&batch).expect("upsert");
        live.retain(|v| !batch.iter().any(|b| b.id == v.id));
        live.extend(batch);
        let gone: Vec<String> = live.iter().filter(|_| rng.below(8) == 0).map(|v| v.id.clone()).collect();
        storage.remove_vectors(&gone).expect("remove");
        live.retain(|v| !gone.contains(&v.id));
        if round == 20 {
            storage.compact().expect("compact");
        }
        if round == 25 {
            storage.clear().expect("clear");
            live.clear();
            continue;
        }
        for _ in 0..20 {
            let filter = random_filter(&mut rng, 4, n);
            let mut want: Vec<String> =
                live.iter().filter(|v| passes(&filter, v)).map(|v| v.id.clone()).collect();
            let mut got: Vec<String> = storage
                .search_filtered(&[0.0, 0.0], n, &filter)
                .expect("search")
                .into_iter()
                .map(|r| r.id.to_string())
                .collect();
            want.sort();
            got.sort();
            assert_eq!(got, want, "round {round}: filter {filter:?}");
        }
    }
}

#[test]
fn a_prepared_filter_is_reused_while_the_collection_is_unchanged_and_never_stale_after_a_change() {
    for context in contexts() {
        let what = describe(&context);
        let storage = context.create_storage(2, GpuDistanceMetric::Euclidean).expect("storage");
        let vectors: Vec<GpuVector> = (0..2000)
            .map(|i| GpuVector::new(format!("v{i}"), vec![i as f32, 0.0]).with_field("even", i % 2 == 0))
            .collect();
        storage.add_vectors(&vectors).expect("add");
        let prepared = storage.prepare_filter(&Filter::eq("even", true)).expect("prepare");
        assert_eq!(prepared.count(), 1000, "{what}");
        // Prepared for this collection, it is evaluated afresh on any other.
        let other = context.create_storage(2, GpuDistanceMetric::Euclidean).expect("storage");
        other.add_vectors(&[GpuVector::new("o", vec![0.0, 0.0]).with_field("even", false)]).expect("add");
        let on_other =
            other.search_filtered(&[0.0, 0.0], 5, &Filter::Prepared(prepared.clone())).expect("search");
        assert!(on_other.is_empty(), "{what}: another collection's prepared slots were reused");
        let filter = Filter::Prepared(prepared);
        let ids = |k: usize| -> Vec<String> {
            storage
                .search_filtered(&[0.0, 0.0], k, &filter)
                .expect("search")
                .into_iter()
                .map(|r| r.id.to_string())
                .collect()
        };
        assert_eq!(ids(3), ["v0", "v2", "v4"], "{what}");
        // Every change must show: a removal, an upsert that changes the field, a new vector,
        // compaction (slots renumbered) and clear.
        storage.remove_vectors(&["v0"]).expect("remove");
        assert_eq!(ids(2), ["v2", "v4"], "{what}: a removed vector passed a prepared filter");
        storage
            .add_vectors(&[GpuVector::new("v2", vec![2.0, 0.0]).with_field("even", false)])
            .expect("upsert");
        assert_eq!(ids(2), ["v4", "v6"], "{what}: an upsert was missed");
        storage.add_vectors(&[GpuVector::new("new", vec![0.5, 0.0]).with_field("even", true)]).expect("add");
        assert_eq!(ids(2), ["new", "v4"], "{what}: a new vector was missed");
        storage.compact().expect("compact");
        assert_eq!(ids(2), ["new", "v4"], "{what}: compaction renumbered the slots");
        storage.clear().expect("clear");
        storage.add_vectors(&[GpuVector::new("x", vec![0.0, 0.0])]).expect("add");
        assert!(ids(2).is_empty(), "{what}: after clear, nothing passes");
    }
}

#[test]
fn payloads_a_filter_cannot_order_are_refused_and_leave_the_collection_intact() {
    let context = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("cpu");
    let storage = context.create_storage(2, GpuDistanceMetric::Euclidean).expect("storage");
    storage.add_vectors(&[GpuVector::new("a", vec![1.0, 0.0]).with_field("x", 1.5)]).expect("add");
    for bad in [f64::NAN, f64::INFINITY] {
        let err = storage
            .add_vectors(&[
                GpuVector::new("b", vec![0.0, 1.0]),
                GpuVector::new("c", vec![1.0, 1.0]).with_field("x", bad),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("\"x\"") && err.to_string().contains("\"c\""), "{err}");
    }
    let mut both = GpuVector::new("d", vec![0.0, 1.0]).with_field("tag", "a");
    both.metadata.insert("tag".into(), "b".into());
    let err = storage.add_vectors(&[both]).unwrap_err();
    assert!(err.to_string().contains("\"tag\""), "{err}");
    assert_eq!(storage.vector_count(), 1, "nothing of the refused batches was stored");
    let hits = storage.search_filtered(&[0.0, 0.0], 5, &Filter::range("x", 1.0..2.0)).expect("search");
    assert_eq!(hits.len(), 1);
}

#[test]
fn a_filter_nested_too_deep_is_refused_instead_of_overflowing_the_stack() {
    let context = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("cpu");
    let storage = context.create_storage(2, GpuDistanceMetric::Euclidean).expect("storage");
    storage.add_vectors(&[GpuVector::new("a", vec![1.0, 0.0])]).expect("add");
    let mut filter = Filter::All;
    for _ in 0..=MAX_FILTER_DEPTH {
        filter = filter.not();
    }
    match storage.search_filtered(&[0.0, 0.0], 1, &filter) {
        Err(HiveGpuError::InvalidArgument(message)) => assert!(message.contains("deeper"), "{message}"),
        other => panic!("expected a clear refusal, got {other:?}"),
    }
    // One level less is fine (an even number of negations of All: everything passes).
    let mut shallow = Filter::All;
    for _ in 0..MAX_FILTER_DEPTH {
        shallow = shallow.not();
    }
    assert_eq!(storage.search_filtered(&[0.0, 0.0], 1, &shallow).expect("search").len(), 1);
}
