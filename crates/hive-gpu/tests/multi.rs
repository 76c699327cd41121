//! Sharded and replicated storages against one collection holding the same writes: the same
//! neighbours in the same order, ties included, through upserts, removals, compactions,
//! filters, indexes, saves and opens; writes all or nothing across members; ids routed by
//! weight. Every backend runs them on three logical shards of its first device; a backend with
//! several devices also runs them with one member per device (`HIVE_GPU_REQUIRE_DEVICES=2`
//! makes a machine without two devices of one backend a failure, for the multi-GPU run).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::faulty::{FaultyBackend, Plan};
use common::{Rng, contexts};
use hive_gpu::{
    Filter, GpuBackendType, GpuContext, GpuDistanceMetric, GpuSearchResult, GpuVector, GpuVectorStorage,
    HiveGpuError, IndexSpec, ReplicatedStorage, SearchOptions, ShardedStorage, StorageConfig,
    StoragePrecision, Tuning, list_devices,
};

/// Groups of contexts to spread storages over, with a name for messages.
fn groups() -> Vec<(String, Vec<GpuContext>)> {
    let mut out = Vec::new();
    let mut most_devices = 0;
    for context in contexts() {
        let backend = context.backend_type();
        out.push((
            format!("{backend}, 3 logical shards"),
            vec![context.clone(), context.clone(), context.clone()],
        ));
        // Batches cut into many small pieces (about 3 queries, 3 workers per member): the
        // replicas' workers take pieces from one queue, and a piece's results must land in its
        // own rows whichever replica answered it.
        let mut small = context.tuning().clone();
        small.piece_queries = 3;
        small.piece_workers = 3;
        // Every batch merged on the device where the shards reach one (CUDA).
        small.device_merge_min_queries = 1;
        let small = context.clone().with_tuning(small);
        out.push((format!("{backend}, 2 logical shards, pieces of 3 queries"), vec![small.clone(), small]));
        let devices = list_devices(backend).map_or(0, |d| d.len());
        if devices >= 2 {
            let all = GpuContext::on_devices(&format!("{}:all", backend.name())).expect("every device opens");
            out.push((format!("{backend}, {devices} devices"), all));
            most_devices = most_devices.max(devices);
        }
    }
    if let Some(required) =
        std::env::var("HIVE_GPU_REQUIRE_DEVICES").ok().and_then(|v| v.parse::<usize>().ok())
    {
        assert!(
            most_devices >= required,
            "HIVE_GPU_REQUIRE_DEVICES={required}, but no backend here has more than {most_devices} devices"
        );
    }
    out
}

/// One write applied to every storage under test.
#[derive(Clone)]
enum Write {
    Add(Vec<GpuVector>),
    Remove(Vec<String>),
    Compact,
}

/// What every kind of storage under test answers.
trait Storage {
    fn apply(&self, write: &Write) -> hive_gpu::Result<()>;
    fn batch(
        &self,
        queries: &[f32],
        k: usize,
        options: &SearchOptions,
    ) -> hive_gpu::Result<Vec<Vec<GpuSearchResult>>>;
    fn one(&self, query: &[f32], k: usize) -> hive_gpu::Result<Vec<GpuSearchResult>>;
    fn prepare(&self, filter: &Filter) -> hive_gpu::Result<Filter>;
    fn count(&self) -> usize;
    fn build(&self, spec: IndexSpec) -> hive_gpu::Result<()>;
}

macro_rules! storage_impl {
    ($t:ty) => {
        impl Storage for $t {
            fn apply(&self, write: &Write) -> hive_gpu::Result<()> {
                match write {
                    Write::Add(vectors) => self.add_vectors(vectors),
                    Write::Remove(ids) => self.remove_vectors(ids),
                    Write::Compact => self.compact(),
                }
            }
            fn batch(
                &self,
                queries: &[f32],
                k: usize,
                options: &SearchOptions,
            ) -> hive_gpu::Result<Vec<Vec<GpuSearchResult>>> {
                self.search_batch_with(queries, k, options)
            }
            fn one(&self, query: &[f32], k: usize) -> hive_gpu::Result<Vec<GpuSearchResult>> {
                self.search(query, k)
            }
            fn prepare(&self, filter: &Filter) -> hive_gpu::Result<Filter> {
                Ok(Filter::Prepared(self.prepare_filter(filter)?))
            }
            fn count(&self) -> usize {
                self.vector_count()
            }
            fn build(&self, spec: IndexSpec) -> hive_gpu::Result<()> {
                self.build_index(spec)
            }
        }
    };
}
storage_impl!(GpuVectorStorage);
storage_impl!(ShardedStorage);
storage_impl!(ReplicatedStorage);

const DIM: usize = 12;

/// A vector of small integers: exact in f16 too, and distances tie exactly where vectors repeat.
fn vector(rng: &mut Rng) -> Vec<f32> {
    (0..DIM).map(|_| (rng.below(9) as f32 - 4.0) * 0.5).collect()
}

/// A history of writes with exact duplicates, upserts of stored ids, removals and a compaction.
fn history(seed: u64) -> (Vec<Write>, Vec<Vec<f32>>) {
    let mut rng = Rng::new(seed);
    let mut writes = Vec::new();
    let mut pool: Vec<Vec<f32>> = Vec::new();
    let mut next = 0usize;
    let mut fresh = |rng: &mut Rng, pool: &mut Vec<Vec<f32>>, count: usize| -> Vec<GpuVector> {
        (0..count)
            .map(|_| {
                // One in five repeats an earlier vector exactly: ties across shards.
                let data = if !pool.is_empty() && rng.below(5) == 0 {
                    pool[rng.below(pool.len())].clone()
                } else {
                    vector(rng)
                };
                pool.push(data.clone());
                next += 1;
                GpuVector::new(format!("v{next}"), data)
                    .with_field("group", (next % 5) as i64)
                    .with_field("tag", if next.is_multiple_of(3) { "red" } else { "blue" })
            })
            .collect()
    };
    for _ in 0..3 {
        writes.push(Write::Add(fresh(&mut rng, &mut pool, 120)));
    }
    // Upserts of stored ids (new values, some repeating others), and a batch that mixes them
    // with new ids.
    let upserts: Vec<GpuVector> = (0..40)
        .map(|i| {
            let id = format!("v{}", 1 + (i * 7) % 360);
            let data = if i % 4 == 0 { pool[i].clone() } else { vector(&mut rng) };
            GpuVector::new(id, data).with_field("group", 9i64)
        })
        .collect();
    writes.push(Write::Add(upserts));
    writes.push(Write::Remove((0..90).map(|i| format!("v{}", 2 + i * 3)).collect()));
    writes.push(Write::Add(fresh(&mut rng, &mut pool, 60)));
    writes.push(Write::Compact);
    writes.push(Write::Remove((0..10).map(|i| format!("v{}", 361 + i)).collect()));
    writes.push(Write::Add(fresh(&mut rng, &mut pool, 30)));
    // Queries: fresh ones, and copies of stored vectors (each ties with its duplicates).
    let mut queries: Vec<Vec<f32>> = (0..12).map(|_| vector(&mut rng)).collect();
    queries.extend((0..8).map(|i| pool[i * 17].clone()));
    (writes, queries)
}

/// Asserts two result lists are the same neighbours in the same order with the same scores
/// and payloads.
fn assert_same(what: &str, got: &[Vec<GpuSearchResult>], want: &[Vec<GpuSearchResult>]) {
    assert_eq!(got.len(), want.len(), "{what}: query count");
    for (q, (g, w)) in got.iter().zip(want).enumerate() {
        let ids = |l: &[GpuSearchResult]| l.iter().map(|r| r.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(g), ids(w), "{what}: query {q}'s neighbours");
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a.score - b.score).abs() <= 1e-5 * (1.0 + b.score.abs()),
                "{what}: query {q}, {}: score {} against {}",
                a.id,
                a.score,
                b.score
            );
            assert_eq!(a.payload, b.payload, "{what}: query {q}, {}: payload", a.id);
        }
    }
}

/// Searches `storage` and `reference` alike and asserts they agree, for several k and filters.
fn assert_answers_alike(what: &str, storage: &dyn Storage, reference: &dyn Storage, queries: &[f32]) {
    assert_eq!(storage.count(), reference.count(), "{what}: vector count");
    let filters = [
        None,
        Some(Filter::eq("group", 2i64)),
        Some(Filter::eq("tag", "red").and(Filter::range("group", 1.0..=3.0))),
        Some(Filter::ids(&["v5", "v6", "v7", "v50", "v300", "v301", "nope"])),
        Some(Filter::exclude_ids(&["v1", "v3", "v4"])),
    ];
    for filter in &filters {
        for k in [1, 7, 2000] {
            let mut options = SearchOptions::default().with_metadata(true);
            if let Some(f) = filter {
                options = options.with_filter(f.clone());
            }
            let want = reference.batch(queries, k, &options).expect("the reference searches");
            let got = storage.batch(queries, k, &options).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_same(&format!("{what}, k {k}, filter {filter:?}"), &got, &want);
        }
    }
    // A prepared filter, and single queries.
    let filter = Filter::eq("group", 3i64);
    let prepared = storage.prepare(&filter).expect("prepared");
    let want = reference.batch(queries, 5, &SearchOptions::default().with_filter(filter)).expect("reference");
    let got =
        storage.batch(queries, 5, &SearchOptions::default().with_filter(prepared)).expect("prepared search");
    assert_same(&format!("{what}, prepared filter"), &got, &want);
    for q in [0, 13] {
        let query = &queries[q * DIM..(q + 1) * DIM];
        let want = reference.one(query, 9).expect("reference");
        assert_same(&format!("{what}, one query {q}"), &[storage.one(query, 9).expect("one query")], &[want]);
    }
}

fn config(metric: GpuDistanceMetric, precision: StoragePrecision) -> StorageConfig {
    StorageConfig::new(DIM, metric).with_precision(precision)
}

#[test]
fn sharded_and_replicated_searches_equal_one_collection_ties_included() {
    let cases = [
        (GpuDistanceMetric::Euclidean, StoragePrecision::F32),
        (GpuDistanceMetric::Cosine, StoragePrecision::F32),
        (GpuDistanceMetric::DotProduct, StoragePrecision::F16),
        (GpuDistanceMetric::Manhattan, StoragePrecision::F32),
        (GpuDistanceMetric::Chebyshev, StoragePrecision::F16),
    ];
    for (name, group) in groups() {
        for (case, &(metric, precision)) in cases.iter().enumerate() {
            let (writes, queries) = history(11 + case as u64);
            let queries: Vec<f32> = queries.concat();
            let config = config(metric, precision);
            let reference = group[0].create_storage_with(config).expect("one collection");
            let sharded = ShardedStorage::create(&group, config).expect("sharded");
            let replicated = ReplicatedStorage::create(&group, config).expect("replicated");
            for (step, write) in writes.iter().enumerate() {
                reference.apply(write).expect("the reference takes every write");
                sharded.apply(write).unwrap_or_else(|e| panic!("{name}: sharded write {step}: {e}"));
                replicated.apply(write).unwrap_or_else(|e| panic!("{name}: replicated write {step}: {e}"));
            }
            let what = format!("{name}, {metric:?} {precision:?}");
            assert!(
                sharded.shard_sizes().iter().all(|&n| n > 0),
                "{what}: a shard got no vector: {:?}",
                sharded.shard_sizes()
            );
            assert_answers_alike(&format!("{what}, sharded"), &sharded, &reference, &queries);
            assert_answers_alike(&format!("{what}, replicated"), &replicated, &reference, &queries);
            // Reads by id go to the owner.
            for id in ["v1", "v2", "v8", "v400", "missing"] {
                let want = reference.get_vector(id).expect("get");
                assert_eq!(
                    sharded.get_vector(id).expect("get").map(|v| v.data),
                    want.clone().map(|v| v.data),
                    "{what}: {id}"
                );
                assert_eq!(
                    replicated.get_vector(id).expect("get").map(|v| v.data),
                    want.map(|v| v.data),
                    "{what}: {id}"
                );
                assert_eq!(sharded.contains(id), reference.contains(id), "{what}: contains {id}");
            }
        }
    }
}

#[test]
fn every_index_shards_and_replicates_and_with_every_list_equals_exact_search() {
    for (name, group) in groups() {
        let software = group[0].device_info().software;
        let (writes, queries) = history(5);
        let queries: Vec<f32> = queries.concat();
        let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
        let reference = group[0].create_storage_with(config).expect("one collection");
        let sharded = ShardedStorage::create(&group, config).expect("sharded");
        let replicated = ReplicatedStorage::create(&group, config).expect("replicated");
        for write in &writes {
            for storage in [&reference as &dyn Storage, &sharded, &replicated] {
                storage.apply(write).expect("a write");
            }
        }
        // A software adapter pays ~0.1 s per device call: IVF-Flat only there (the same index
        // code runs every kind on the CPU and on hardware adapters).
        let specs: &[&str] =
            if software { &["ivf-flat:nlist=4"] } else { &["ivf-flat:nlist=4", "ivf-sq8:nlist=4", "binary"] };
        for spec in specs {
            let spec: IndexSpec = spec.parse().expect("a spec");
            sharded.build(spec).unwrap_or_else(|e| panic!("{name}: sharded {spec:?}: {e}"));
            replicated.build(spec).unwrap_or_else(|e| panic!("{name}: replicated {spec:?}: {e}"));
            assert_eq!(sharded.index_spec(), spec);
            assert!(sharded.index_stats().iter().all(Option::is_some), "{name}: a shard without its index");
            // Every list, every candidate re-ranked: exact.
            let options = SearchOptions::default().with_nprobe(4).with_refine_factor(4096);
            for k in [1, 10] {
                let want = reference.batch(&queries, k, &SearchOptions::default()).expect("exact");
                let what = format!("{name}, {spec:?}, k {k}");
                assert_same(
                    &format!("{what}, sharded"),
                    &sharded.batch(&queries, k, &options).expect("sharded"),
                    &want,
                );
                assert_same(
                    &format!("{what}, replicated"),
                    &replicated.batch(&queries, k, &options).expect("replicated"),
                    &want,
                );
            }
            // One list probed per shard with k past what it holds: each query gets what its
            // lists hold, so lists differ in length between queries (the first one's length
            // must not size the others').
            let one_list = SearchOptions::default().with_nprobe(1);
            for storage in [&sharded as &dyn Storage, &replicated] {
                let got = storage.batch(&queries, 400, &one_list).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(got.len(), queries.len() / DIM, "{name}, {spec:?}");
                for list in &got {
                    let ids: std::collections::HashSet<&str> = list.iter().map(|r| r.id.as_str()).collect();
                    assert!(list.len() <= 400 && ids.len() == list.len(), "{name}, {spec:?}: a bad list");
                }
            }
            // Writes after training reach every member's index.
            let more: Vec<GpuVector> =
                (0..30).map(|i| GpuVector::new(format!("late{i}"), vec![i as f32 * 0.1; DIM])).collect();
            for storage in [&reference as &dyn Storage, &sharded, &replicated] {
                storage.apply(&Write::Add(more.clone())).expect("an add after training");
            }
            let want = reference.batch(&queries, 10, &SearchOptions::default()).expect("exact");
            assert_same(
                &format!("{name}, {spec:?} after adds"),
                &sharded.batch(&queries, 10, &options).expect("sharded"),
                &want,
            );
            assert_same(
                &format!("{name}, {spec:?} after adds, replicated"),
                &replicated.batch(&queries, 10, &options).expect("replicated"),
                &want,
            );
            let late: Vec<String> = (0..30).map(|i| format!("late{i}")).collect();
            for storage in [&reference as &dyn Storage, &sharded, &replicated] {
                storage.apply(&Write::Remove(late.clone())).expect("a removal after training");
            }
        }
    }
}

#[test]
fn an_index_that_fails_to_train_on_one_shard_is_built_on_none() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
    // Shard 0 gets about 40 of 44 vectors, shard 1 about 4: too few for 8 lists.
    let sharded =
        ShardedStorage::create_weighted(&[cpu.clone(), cpu.clone()], config, &[10.0, 1.0]).expect("sharded");
    let mut rng = Rng::new(3);
    let vectors: Vec<GpuVector> =
        (0..44).map(|i| GpuVector::new(format!("x{i}"), vector(&mut rng))).collect();
    sharded.add_vectors(&vectors).expect("adds");
    let sizes = sharded.shard_sizes();
    assert!(sizes[0] >= 8 && sizes[1] < 8, "the weights did not split as planned: {sizes:?}");
    let e = sharded
        .build_index("ivf-flat:nlist=8".parse().expect("spec"))
        .expect_err("shard 1 cannot train 8 lists");
    assert!(matches!(e, HiveGpuError::InvalidArgument(_)), "{e}");
    assert_eq!(sharded.index_spec(), IndexSpec::Flat);
    assert!(
        sharded.index_stats().iter().all(Option::is_none),
        "shard 0 kept an index: {:?}",
        sharded.index_stats()
    );
}

#[test]
fn ids_go_to_shards_in_proportion_to_their_weights_and_every_write_reaches_the_owner() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
    let sharded =
        ShardedStorage::create_weighted(&[cpu.clone(), cpu.clone(), cpu.clone()], config, &[3.0, 1.0, 4.0])
            .expect("sharded");
    let ids: Vec<String> = (0..8000).map(|i| format!("doc-{i}")).collect();
    sharded.add_vectors_flat(&ids, &vec![0.5; 8000 * DIM]).expect("adds");
    let sizes = sharded.shard_sizes();
    for (s, (&size, want)) in sizes.iter().zip([3000.0, 1000.0, 4000.0]).enumerate() {
        assert!(
            (size as f64 - want).abs() < 200.0,
            "shard {s} holds {size}, about {want} expected: {sizes:?}"
        );
    }
    // An upsert replaces in place on the owner; a removal empties exactly the owners' slots.
    sharded.add_vectors_flat(&ids[..500], &vec![1.0; 500 * DIM]).expect("upserts");
    assert_eq!(sharded.vector_count(), 8000, "an upsert added instead of replacing");
    assert_eq!(sharded.get_vector("doc-7").expect("get").expect("stored").data, vec![1.0; DIM]);
    sharded.remove_vectors(&ids[1000..3000]).expect("removals");
    assert_eq!(sharded.vector_count(), 6000);
    assert!(!sharded.contains("doc-1500") && sharded.contains("doc-3500"));
    // A removal naming a missing id, or an id twice, removes nothing anywhere.
    let e = sharded.remove_vectors(&["doc-4000", "doc-1500"]).expect_err("doc-1500 is gone");
    assert!(matches!(e, HiveGpuError::VectorNotFound { .. }), "{e}");
    let e = sharded.remove_vectors(&["doc-4000", "doc-5000", "doc-4000"]).expect_err("a repeated id");
    assert!(matches!(e, HiveGpuError::DuplicateId { first: 0, second: 2, .. }), "{e}");
    assert!(sharded.contains("doc-4000") && sharded.contains("doc-5000"));
    assert_eq!(sharded.vector_count(), 6000);
    // Bad arguments.
    assert!(ShardedStorage::create(&[], config).is_err());
    assert!(ShardedStorage::create_weighted(std::slice::from_ref(&cpu), config, &[0.0]).is_err());
    assert!(ShardedStorage::create_weighted(std::slice::from_ref(&cpu), config, &[f64::NAN]).is_err());
    assert!(ShardedStorage::create_weighted(&[cpu.clone(), cpu], config, &[1.0]).is_err());
}

#[test]
fn a_bad_batch_or_query_is_refused_by_the_storage_with_the_callers_positions() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let config = config(GpuDistanceMetric::Cosine, StoragePrecision::F32);
    let group = [cpu.clone(), cpu.clone(), cpu];
    let sharded = ShardedStorage::create(&group, config).expect("sharded");
    let replicated = ReplicatedStorage::create(&group, config).expect("replicated");
    for storage in [&sharded as &dyn Storage, &replicated] {
        assert!(matches!(storage.one(&[1.0; DIM], 3), Err(HiveGpuError::EmptyCollection)));
        let mut vectors: Vec<GpuVector> =
            (0..50).map(|i| GpuVector::new(format!("id{i}"), vec![1.0 + i as f32; DIM])).collect();
        vectors[37].id = "id3".into();
        let e = storage.apply(&Write::Add(vectors.clone())).expect_err("id3 twice");
        assert!(matches!(e, HiveGpuError::DuplicateId { first: 3, second: 37, .. }), "{e}");
        vectors[37].id = "id37".into();
        vectors[41].data = vec![0.0; DIM];
        let e = storage.apply(&Write::Add(vectors.clone())).expect_err("a zero vector under cosine");
        assert!(e.to_string().contains("id41"), "{e}");
        assert_eq!(storage.count(), 0, "a refused batch left vectors");
        vectors[41].data = vec![1.0; DIM];
        storage.apply(&Write::Add(vectors)).expect("the mended batch");
        assert!(matches!(storage.one(&[1.0; DIM + 1], 3), Err(HiveGpuError::DimensionMismatch { .. })));
        assert!(storage.batch(&[1.0; DIM + 1], 3, &SearchOptions::default()).is_err());
        assert!(storage.batch(&[1.0; DIM], 0, &SearchOptions::default()).is_err());
        assert!(storage.batch(&[f32::NAN; DIM], 3, &SearchOptions::default()).is_err());
        assert!(storage.batch(&[], 3, &SearchOptions::default()).expect("no query").is_empty());
    }
}

#[test]
fn a_write_that_fails_on_one_member_leaves_every_member_as_it_was() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let plan = Arc::new(Mutex::new(Plan::default()));
    let faulty =
        GpuContext::from_backend(Arc::new(FaultyBackend { inner: cpu.shared_backend(), plan: plan.clone() }));
    let group = [cpu.clone(), faulty, cpu.clone()];
    let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
    let sharded = ShardedStorage::create_weighted(&group, config, &[1.0, 1.0, 1.0]).expect("sharded");
    let replicated = ReplicatedStorage::create(&group, config).expect("replicated");
    let reference = cpu.create_storage_with(config).expect("one collection");
    let (writes, queries) = history(21);
    let queries: Vec<f32> = queries.concat();
    for write in &writes[..3] {
        for storage in [&reference as &dyn Storage, &sharded, &replicated] {
            storage.apply(write).expect("a write before the fault");
        }
    }
    // A batch of upserts and new ids, some on every shard; the faulty member's append fails.
    let batch: Vec<GpuVector> = (0..200)
        .map(|i| GpuVector::new(format!("v{}", 1 + i * 3), vec![0.25 * (i % 7) as f32; DIM]))
        .collect();
    for (name, storage) in [("sharded", &sharded as &dyn Storage), ("replicated", &replicated)] {
        // The faulty member's append fails after writing half its rows (a torn write).
        *plan.lock().expect("plan") = Plan { append_after: Some(0), torn: true, ..Plan::default() };
        let e = storage.apply(&Write::Add(batch.clone())).expect_err("the injected fault");
        assert!(e.to_string().contains("fault injected"), "{name}: {e}");
        assert!(
            plan.lock().expect("plan").append_after.is_none(),
            "{name}: the faulty member was never asked to append"
        );
        assert_answers_alike(&format!("{name} after a failed write"), storage, &reference, &queries);
        // And the storage goes on: the same write succeeds once the device is well.
        storage.apply(&Write::Add(batch.clone())).expect("the write again");
    }
    reference.apply(&Write::Add(batch)).expect("the reference write");
    assert_answers_alike("sharded after the write went through", &sharded, &reference, &queries);
    assert_answers_alike("replicated after the write went through", &replicated, &reference, &queries);
}

/// Trap: replicas hold the same vectors, but not always in the same slots: a compaction that
/// fails on one replica (its device short of memory) leaves that replica's slots as they were
/// while the others move theirs. A filter turned into one replica's slots and handed to
/// another's pieces would let through vectors the filter excludes and drop ones it keeps.
#[test]
fn a_filtered_batch_over_replicas_whose_slots_differ_equals_one_collection() {
    let mut small = Tuning::default();
    small.piece_queries = 3;
    small.piece_workers = 2;
    let cpu =
        GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend").with_tuning(small.clone());
    let plan = Arc::new(Mutex::new(Plan::default()));
    let faulty =
        GpuContext::from_backend(Arc::new(FaultyBackend { inner: cpu.shared_backend(), plan: plan.clone() }))
            .with_tuning(small);
    let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
    let replicated = ReplicatedStorage::create(&[cpu.clone(), faulty], config).expect("replicated");
    let reference = cpu.create_storage_with(config).expect("one collection");
    let (writes, queries) = history(33);
    let queries: Vec<f32> = queries.concat();
    for write in writes.iter().filter(|w| !matches!(w, Write::Compact)) {
        reference.apply(write).expect("a reference write");
        replicated.apply(write).expect("a replicated write");
    }
    // The second replica's compaction fails; the first one's goes through.
    *plan.lock().expect("plan") = Plan { compact: true, ..Plan::default() };
    let e = replicated.compact().expect_err("the injected compaction fault");
    assert!(e.to_string().contains("fault injected"), "{e}");
    assert!(!plan.lock().expect("plan").compact, "the faulty replica was never asked to compact");
    assert_answers_alike("replicas with slots apart", &replicated, &reference, &queries);
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hive-gpu-multi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

#[test]
fn a_sharded_save_opens_on_any_number_of_devices_with_the_same_answers_and_keeps_its_write_order() {
    let dir = scratch("save");
    for (name, group) in groups() {
        let path = dir.join("sharded.hgs");
        let (writes, queries) = history(31);
        let queries: Vec<f32> = queries.concat();
        let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F16);
        let reference = group[0].create_storage_with(config).expect("one collection");
        let sharded = ShardedStorage::create(&group, config).expect("sharded");
        for write in &writes[..6] {
            reference.apply(write).expect("a write");
            sharded.apply(write).expect("a write");
        }
        sharded.build_index("ivf-flat:nlist=3".parse().expect("spec")).expect("an index");
        sharded.save(&path).expect("the save");
        // Opened on one context, and on as many as it was saved from.
        for contexts in [&group[..1], &group[..]] {
            let opened =
                ShardedStorage::open(&path, contexts).unwrap_or_else(|e| panic!("{name}: open: {e}"));
            assert_eq!(opened.shard_count(), group.len());
            assert_eq!(opened.shard_weights(), sharded.shard_weights());
            assert_eq!(opened.index_spec(), sharded.index_spec());
            let exact = SearchOptions::default().with_exact(true);
            assert_same(
                &format!("{name}: opened on {} contexts", contexts.len()),
                &opened.batch(&queries, 9, &exact).expect("search"),
                &reference.batch(&queries, 9, &SearchOptions::default()).expect("reference"),
            );
            // Later writes continue the write order: ties still fall as one collection's.
            for write in &writes[6..] {
                opened.apply(write).expect("a write after the open");
            }
        }
        for write in &writes[6..] {
            reference.apply(write).expect("a write");
        }
        let opened = ShardedStorage::open(&path, &group).expect("open");
        for write in &writes[6..] {
            opened.apply(write).expect("a write after the open");
        }
        assert_answers_alike(
            &format!("{name}: opened and written"),
            &ExactSharded(&opened),
            &reference,
            &queries,
        );
        // A second save replaces the first's shard files.
        opened.save(&path).expect("a second save");
        let files: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("sharded.hgs.shard-"))
            .collect();
        assert_eq!(files.len(), group.len(), "{name}: old shard files left: {files:?}");
        let _ = std::fs::remove_file(&path);
        for f in files {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sharded storage searched exactly whatever its index (the reference has none).
struct ExactSharded<'a>(&'a ShardedStorage);

impl Storage for ExactSharded<'_> {
    fn apply(&self, write: &Write) -> hive_gpu::Result<()> {
        self.0.apply(write)
    }
    fn batch(
        &self,
        queries: &[f32],
        k: usize,
        options: &SearchOptions,
    ) -> hive_gpu::Result<Vec<Vec<GpuSearchResult>>> {
        self.0.batch(queries, k, &options.clone().with_exact(true))
    }
    fn one(&self, query: &[f32], k: usize) -> hive_gpu::Result<Vec<GpuSearchResult>> {
        Ok(self.batch(query, k, &SearchOptions::default())?.remove(0))
    }
    fn prepare(&self, filter: &Filter) -> hive_gpu::Result<Filter> {
        self.0.prepare(filter)
    }
    fn count(&self) -> usize {
        self.0.count()
    }
    fn build(&self, spec: IndexSpec) -> hive_gpu::Result<()> {
        self.0.build(spec)
    }
}

#[test]
fn a_damaged_or_mismatched_sharded_save_is_refused_by_file_name() {
    let dir = scratch("damaged");
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let group = [cpu.clone(), cpu.clone()];
    let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
    let make = |seed: u64| {
        let sharded = ShardedStorage::create(&group, config).expect("sharded");
        let mut rng = Rng::new(seed);
        let vectors: Vec<GpuVector> =
            (0..100).map(|i| GpuVector::new(format!("k{i}"), vector(&mut rng))).collect();
        sharded.add_vectors(&vectors).expect("adds");
        sharded
    };
    let path = dir.join("s.hgs");
    let shard_files = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("s.hgs.shard-")))
            .collect();
        files.sort();
        files
    };
    let refused = |why: &str, needle: &str| {
        let e = ShardedStorage::open(&path, &group).expect_err(why);
        assert!(matches!(e, HiveGpuError::InvalidFormat { .. } | HiveGpuError::Io { .. }), "{why}: {e}");
        assert!(e.to_string().contains(needle), "{why}: {e:?} does not mention {needle:?}");
    };
    make(1).save(&path).expect("a save");
    let first = shard_files(&dir);
    let saved: Vec<Vec<u8>> = first.iter().map(|f| std::fs::read(f).expect("a shard file")).collect();
    let manifest = std::fs::read(&path).expect("the manifest");

    // The manifest truncated, extended, flipped; not a manifest at all.
    std::fs::write(&path, &manifest[..manifest.len() - 3]).expect("write");
    refused("a truncated manifest", "truncated");
    std::fs::write(&path, [&manifest[..], &[0]].concat()).expect("write");
    refused("an extended manifest", "truncated or extended");
    let mut flipped = manifest.clone();
    flipped[70] ^= 0x10;
    std::fs::write(&path, &flipped).expect("write");
    refused("a flipped weight", "checksum");
    std::fs::write(&path, &saved[0]).expect("write");
    refused("a collection file where the manifest goes", "manifest");
    std::fs::write(&path, &manifest).expect("write");
    ShardedStorage::open(&path, &group).expect("the restored manifest opens");

    // A shard file of another save in place of this save's: refused by its identity.
    let other_dir = scratch("damaged-other");
    make(2).save(other_dir.join("s.hgs")).expect("another save");
    let other = shard_files(&other_dir);
    std::fs::copy(&other[0], &first[0]).expect("copy");
    refused("a shard file of another save", "another save");
    std::fs::write(&first[0], &saved[0]).expect("restore");
    // A missing shard file.
    std::fs::remove_file(&first[1]).expect("remove");
    refused("a missing shard file", "shard-");
    std::fs::write(&first[1], &saved[1]).expect("restore");
    // Shard files swapped, with a manifest that names them as swapped: every id is on the wrong
    // shard, which routing would never do.
    let mut swapped = manifest.clone();
    let (a, b) = (64..96, 96..128);
    let entry_a = swapped[a.clone()].to_vec();
    let entry_b = swapped[b.clone()].to_vec();
    swapped[a].copy_from_slice(&entry_b);
    swapped[b].copy_from_slice(&entry_a);
    let table_end = swapped.len() - 4;
    let crc = crc32c::crc32c(&swapped[64..table_end]);
    swapped[table_end..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &swapped).expect("write");
    std::fs::write(&first[0], &saved[1]).expect("swap");
    std::fs::write(&first[1], &saved[0]).expect("swap");
    refused("ids on the wrong shard", "owns");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other_dir);
}

const KILL_ENV: &str = "HIVE_GPU_SHARDED_SAVE_LOOP";

/// The two sharded collections the killed child saves in turn.
fn kill_pair(cpu: &GpuContext) -> [ShardedStorage; 2] {
    let group = [cpu.clone(), cpu.clone(), cpu.clone()];
    let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
    [300usize, 20_000].map(|count| {
        let sharded = ShardedStorage::create(&group, config).expect("sharded");
        let ids: Vec<String> = (0..count).map(|i| format!("p{i}")).collect();
        let values: Vec<f32> = (0..count * DIM).map(|i| (i % 97) as f32).collect();
        sharded.add_vectors_flat(&ids, &values).expect("adds");
        sharded
    })
}

/// The child of the kill test: saves the two collections in turn until killed. Returns at once
/// in a normal test run.
#[test]
fn sharded_save_loop_child() {
    let Ok(path) = std::env::var(KILL_ENV) else { return };
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let pair = kill_pair(&cpu);
    for i in 0.. {
        pair[i % 2].save(&path).expect("save");
    }
}

#[test]
fn a_sharded_save_killed_at_any_moment_leaves_the_old_or_the_new_collection() {
    let dir = scratch("kill");
    let path = dir.join("killed.hgs");
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    kill_pair(&cpu)[0].save(&path).expect("the first save");
    let exe = std::env::current_exe().expect("the test binary");
    let mut rng = Rng::new(7);
    let mut seen = [0usize; 2];
    for round in 0..20 {
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "sharded_save_loop_child", "--nocapture", "--test-threads", "1"])
            .env(KILL_ENV, &path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the child");
        std::thread::sleep(Duration::from_millis(60 + rng.below(400) as u64));
        child.kill().expect("SIGKILL");
        child.wait().expect("the child ends");
        let opened = ShardedStorage::open(&path, std::slice::from_ref(&cpu))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let which = match opened.vector_count() {
            300 => 0,
            20_000 => 1,
            other => panic!("round {round}: {other} vectors, neither save's"),
        };
        // Row 0 of either collection is 0, 1, ... 11.
        let row0: Vec<f32> = (0..DIM).map(|i| i as f32).collect();
        let hits = opened.search(&row0, 1).expect("a search");
        assert_eq!(hits[0].score, 0.0, "round {round}: the opened collection lost its rows");
        seen[which] += 1;
    }
    assert!(seen[1] > 0, "the child never finished a save of the larger collection: {seen:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_lists_name_backends_ordinals_and_repeats() {
    let two = GpuContext::on_devices("cpu:0, cpu:0").expect("two CPU contexts");
    assert_eq!(two.len(), 2);
    assert!(two.iter().all(|c| c.backend_type() == GpuBackendType::Cpu));
    assert_eq!(GpuContext::on_devices("cpu:all").expect("all").len(), 1);
    let e = GpuContext::on_devices("cpu:1").expect_err("the CPU backend has one device");
    assert!(matches!(e, HiveGpuError::DeviceNotFound { .. }), "{e}");
    assert!(GpuContext::on_devices("cpu:zero").is_err());
    assert!(GpuContext::on_devices("").is_err());
    let cpu = list_devices(GpuBackendType::Cpu).expect("the CPU lists itself");
    assert_eq!(cpu.len(), 1);
    // Every device a GPU backend lists opens by its PCI bus id, as the same ordinal.
    for context in contexts() {
        let backend = context.backend_type();
        for (ordinal, device) in list_devices(backend).expect("listed").iter().enumerate() {
            if let Some(pci) = &device.pci_bus_id {
                let selector = hive_gpu::DeviceSelector::pci(pci).expect("a PCI bus id");
                let opened = GpuContext::with_device(backend, &selector).expect("opens by PCI bus id");
                assert_eq!(opened.device_info().device_id, ordinal, "{backend} {pci}");
            }
        }
    }
}

/// The sharded collection kept in `tests/data/formats/sharded/` (manifest version 1, shard files
/// of collection format version 3): every later build must open it.
fn format_sharded(cpu: &GpuContext) -> ShardedStorage {
    let config = config(GpuDistanceMetric::Cosine, StoragePrecision::F16);
    let sharded =
        ShardedStorage::create_weighted(&[cpu.clone(), cpu.clone()], config, &[2.0, 1.0]).expect("sharded");
    let (writes, _) = history(41);
    for write in &writes {
        sharded.apply(write).expect("a write");
    }
    sharded
}

#[test]
fn the_released_sharded_format_still_opens_with_the_same_answers() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let dir = std::path::Path::new("tests/data/formats/sharded");
    let path = dir.join("sharded.hgs");
    let expected = format_sharded(&cpu);
    // Written once, when missing; never over the kept files, whose CRC-32C is fixed below (a
    // writer that changes adds files of a new version, it does not replace these).
    if std::env::var("HIVE_GPU_WRITE_FORMAT_FILES").as_deref() == Ok("1") && !path.exists() {
        std::fs::create_dir_all(dir).expect("the format folder");
        expected.save(&path).expect("write the format files");
    }
    for (file, crc) in [
        ("sharded.hgs", 0x8f8852e4),
        ("sharded.hgs.shard-0000000000000001-0", 0x27aeb55e),
        ("sharded.hgs.shard-0000000000000001-1", 0x31e7a2ac),
    ] {
        let bytes = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(crc32c::crc32c(&bytes), crc, "{file} changed: kept files are never rewritten");
    }
    let (_, queries) = history(41);
    let queries: Vec<f32> = queries.concat();
    for context in contexts() {
        let opened =
            ShardedStorage::open(&path, std::slice::from_ref(&context)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opened.shard_weights(), [2.0, 1.0]);
        assert_eq!(opened.shard_sizes(), expected.shard_sizes());
        assert_answers_alike(
            &format!("the released sharded format on {}", context.backend_type()),
            &opened,
            &expected,
            &queries,
        );
        // Each shard file is a collection file of its own (version 3, with an order section).
        let info = hive_gpu::persist::inspect_file(dir.join("sharded.hgs.shard-0000000000000001-0"))
            .expect("a shard file");
        assert_eq!(info.format_version, 3);
        assert!(info.sections.iter().any(|s| s.name == "order"));
    }
}

#[test]
fn a_search_sees_a_write_on_every_member_or_on_none() {
    // Each write adds (or removes) a group of 24 ids, spread over every shard, all at distance 0
    // from the query: a search of k = 24 finds the whole group or none of it, never a part.
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let group = [cpu.clone(), cpu.clone(), cpu.clone()];
    let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
    let sharded = ShardedStorage::create(&group, config).expect("sharded");
    let replicated = ReplicatedStorage::create(&group, config).expect("replicated");
    let far: Vec<GpuVector> =
        (0..200).map(|i| GpuVector::new(format!("far{i}"), vec![10.0 + i as f32; DIM])).collect();
    let query = vec![0.0f32; DIM];
    for storage in [&sharded as &(dyn Storage + Sync), &replicated] {
        storage.apply(&Write::Add(far.clone())).expect("the far vectors");
        let group_ids = |round: usize| -> Vec<String> { (0..24).map(|i| format!("g{round}-{i}")).collect() };
        let done = std::sync::atomic::AtomicBool::new(false);
        let searches = std::sync::atomic::AtomicUsize::new(0);
        let (done, query, searches) = (&done, &query, &searches);
        std::thread::scope(|s| {
            let writer = s.spawn(move || {
                // Until the searchers have searched a few hundred times beside the writes.
                let mut round = 0;
                while round < 50
                    || (searches.load(std::sync::atomic::Ordering::Relaxed) < 300 && round < 20_000)
                {
                    round += 1;
                    let ids = group_ids(round);
                    let vectors: Vec<GpuVector> =
                        ids.iter().map(|id| GpuVector::new(id.clone(), vec![0.0; DIM])).collect();
                    storage.apply(&Write::Add(vectors)).expect("a group in");
                    storage.apply(&Write::Remove(ids)).expect("a group out");
                }
                done.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            for _ in 0..2 {
                s.spawn(move || {
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        let hits = storage.one(query, 24).expect("a search");
                        let at_zero = hits.iter().filter(|h| h.score == 0.0).count();
                        assert!(
                            at_zero == 0 || at_zero == 24,
                            "a search saw {at_zero} of a group's 24 vectors"
                        );
                        searches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
            writer.join().expect("the writer");
        });
        let searched = searches.load(std::sync::atomic::Ordering::Relaxed);
        assert!(searched >= 300, "only {searched} searches ran beside the writes");
    }
}

/// The section table entry of `kind` in a collection file image: (entry offset, body offset,
/// body length).
fn section(image: &[u8], kind: u32) -> (usize, usize, usize) {
    let count = u32::from_le_bytes(image[16..20].try_into().expect("4 bytes")) as usize;
    (0..count)
        .map(|i| 64 + i * 40)
        .find(|&at| u32::from_le_bytes(image[at..at + 4].try_into().expect("4 bytes")) == kind)
        .map(|at| {
            let word = |o: usize| {
                u64::from_le_bytes(image[at + o..at + o + 8].try_into().expect("8 bytes")) as usize
            };
            (at, word(8), word(16))
        })
        .expect("the section")
}

/// Rewrites every checksum after a change inside section `kind`'s body (its own, the table's,
/// the header's), so that only the change itself can be refused.
fn reseal(image: &mut [u8], kind: u32) {
    let (entry, body, length) = section(image, kind);
    let crc = crc32c::crc32c(&image[body..body + length]);
    image[entry + 32..entry + 36].copy_from_slice(&crc.to_le_bytes());
    let count = u32::from_le_bytes(image[16..20].try_into().expect("4 bytes")) as usize;
    let table = crc32c::crc32c(&image[64..64 + count * 40]);
    image[56..60].copy_from_slice(&table.to_le_bytes());
    let header = crc32c::crc32c(&image[..60]);
    image[60..64].copy_from_slice(&header.to_le_bytes());
}

#[test]
fn a_shard_file_whose_order_keys_do_not_increase_or_that_claims_an_older_version_is_refused_by_offset() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let dir = scratch("order");
    let good = std::fs::read("tests/data/formats/sharded/sharded.hgs.shard-0000000000000001-1")
        .expect("a shard file");
    let path = dir.join("shard.hgc");
    let refused = |image: &[u8], needle: &str| {
        std::fs::write(&path, image).expect("write");
        let e = cpu.open_storage(&path).expect_err(needle);
        assert!(matches!(e, HiveGpuError::InvalidFormat { .. }), "{e}");
        assert!(e.to_string().contains(needle), "{e} does not mention {needle:?}");
    };
    std::fs::write(&path, &good).expect("write");
    // A shard file opens as a collection of its own, and stays writable and savable: its keys
    // go on increasing after direct writes (an upsert of a stored id among them).
    let own = cpu.open_storage(&path).expect("the shard file opens as a collection of its own");
    let stored = own.search(&[1.0; DIM], 1).expect("a search")[0].id.to_string();
    let count = own.vector_count();
    own.add_vectors(&[GpuVector::new(stored, vec![1.0; DIM]), GpuVector::new("direct", vec![2.0; DIM])])
        .expect("direct writes");
    own.save(&path).expect("a save of the written shard file");
    let again = cpu.open_storage(&path).expect("the saved file opens again");
    assert_eq!(again.vector_count(), count + 1, "one upsert and one new id");
    std::fs::write(&path, &good).expect("write");
    let (_, body, length) = section(&good, 8);
    // Slot 1 repeating slot 0's key, then slot 2 going back to it (below slot 1's).
    let first = u64::from_le_bytes(good[body..body + 8].try_into().expect("8 bytes"));
    for slot in [1usize, 2] {
        let mut bad = good.clone();
        bad[body + slot * 8..body + slot * 8 + 8].copy_from_slice(&first.to_le_bytes());
        reseal(&mut bad, 8);
        refused(&bad, &format!("order at byte {}", body + slot * 8));
    }
    // A count that is not the slot count.
    let mut bad = good.clone();
    let (entry, _, _) = section(&bad, 8);
    bad[entry + 24..entry + 32].copy_from_slice(&((length / 8) as u64 + 1).to_le_bytes());
    reseal(&mut bad, 8);
    refused(&bad, "keys in");
    // An order section in a file that says it is format version 2.
    let mut bad = good.clone();
    bad[8..12].copy_from_slice(&2u32.to_le_bytes());
    reseal(&mut bad, 8);
    refused(&bad, "an order section in a format version 2 file");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn durable_sharded_and_replicated_storages_replay_their_log_and_fold_it_in_at_a_checkpoint() {
    for (name, group) in groups() {
        durable_replay_and_checkpoint(&name, &group);
    }
}

/// The durable storages over `group` against one collection on its first context.
fn durable_replay_and_checkpoint(name: &str, group: &[GpuContext]) {
    use hive_gpu::DurableOptions;
    let dir = scratch(&format!("durable-{}", name.replace([' ', ','], "-")));
    let first = &group[0];
    let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
    let (writes, queries) = history(51);
    let queries: Vec<f32> = queries.concat();
    let reference = first.create_storage_with(config).expect("one collection");
    for write in &writes {
        reference.apply(write).expect("a write");
    }
    let (sharded_path, replicated_path) = (dir.join("s.hgs"), dir.join("r.hgc"));
    let open_sharded =
        || ShardedStorage::open_durable(&sharded_path, group, config, DurableOptions::default());
    let open_replicated =
        || ReplicatedStorage::open_durable(&replicated_path, group, config, DurableOptions::default());
    {
        let sharded = open_sharded().unwrap_or_else(|e| panic!("{name}: a new durable sharded storage: {e}"));
        let replicated = open_replicated().expect("a new durable replicated storage");
        // One storage at a time holds a durable collection.
        assert!(
            open_sharded().is_err() && open_replicated().is_err(),
            "a second open while the first holds it"
        );
        for write in &writes {
            sharded.apply(write).expect("a sharded write");
            replicated.apply(write).expect("a replicated write");
        }
        assert!(sharded.log_stats().expect("a log").log_bytes > 64);
    }
    // Everything is in the logs: the opens replay them (every write of the history, compactions
    // aside, which are not logged).
    let logged = writes.iter().filter(|w| !matches!(w, Write::Compact)).count() as u64;
    {
        let sharded = open_sharded().expect("the sharded storage again");
        let replicated = open_replicated().expect("the replicated storage again");
        assert_eq!(sharded.log_stats().expect("a log").replayed, logged);
        assert_eq!(replicated.log_stats().expect("a log").replayed, logged);
        assert_answers_alike(&format!("{name}: durable sharded, replayed"), &sharded, &reference, &queries);
        assert_answers_alike(
            &format!("{name}: durable replicated, replayed"),
            &replicated,
            &reference,
            &queries,
        );
        sharded.checkpoint().expect("a checkpoint");
        replicated.save(&replicated_path).expect("a save to its own path checkpoints");
        // A write after the checkpoint is in the new log only.
        let late = [GpuVector::new("late", vec![0.5; DIM])];
        sharded.add_vectors(&late).expect("a late write");
        replicated.add_vectors(&late).expect("a late write");
    }
    reference.add_vectors(&[GpuVector::new("late", vec![0.5; DIM])]).expect("the late write");
    let sharded = open_sharded().expect("after the checkpoint");
    let replicated = open_replicated().expect("after the checkpoint");
    assert_eq!(sharded.log_stats().expect("a log").replayed, 1);
    assert_eq!(replicated.log_stats().expect("a log").replayed, 1);
    assert_answers_alike(&format!("{name}: durable sharded, checkpointed"), &sharded, &reference, &queries);
    assert_answers_alike(
        &format!("{name}: durable replicated, checkpointed"),
        &replicated,
        &reference,
        &queries,
    );
    // The snapshot is an ordinary sharded save: it opens without the log too (the late write
    // aside, which only the log holds).
    drop(sharded);
    let plain = ShardedStorage::open(&sharded_path, std::slice::from_ref(first)).expect("the snapshot alone");
    assert_eq!(plain.vector_count(), reference.vector_count() - 1);
    // A durable collection of another shape is refused by name.
    drop(replicated);
    let other = StorageConfig::new(DIM + 1, GpuDistanceMetric::Euclidean);
    let e = ReplicatedStorage::open_durable(&replicated_path, group, other, DurableOptions::default())
        .expect_err("another dimension");
    assert!(e.to_string().contains("dimension"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

const DURABLE_KILL_ENV: &str = "HIVE_GPU_SHARDED_WRITER";
/// The devices the kill test's child writes over, as `GpuContext::on_devices` reads them.
const DURABLE_KILL_DEVICES_ENV: &str = "HIVE_GPU_SHARDED_WRITER_DEVICES";

/// The devices the sharded kill test writes over: every device of the first backend here that
/// has several (two real GPUs where such a machine is lent), else three logical shards of the CPU.
fn kill_test_devices() -> String {
    contexts()
        .iter()
        .map(|c| c.backend_type())
        .find(|&b| list_devices(b).map_or(0, |d| d.len()) >= 2)
        .map_or_else(|| "cpu:0,cpu:0,cpu:0".to_string(), |b| format!("{}:all", b.name()))
}

/// The values writer `t` gives its `i`-th vector.
fn durable_value(t: usize, i: usize) -> Vec<f32> {
    (0..DIM).map(|d| ((t * 131 + i * 17 + d * 7) % 53) as f32 * 0.25).collect()
}

/// The child of the sharded kill test: four writers upsert one vector at a time into a durable
/// sharded storage, printing each acknowledgement, until killed. Returns at once in a normal run.
#[test]
fn durable_sharded_writer_child() {
    let Ok(spec) = std::env::var(DURABLE_KILL_ENV) else { return };
    let (round, path) = spec.split_once(':').expect("round:path");
    let devices = std::env::var(DURABLE_KILL_DEVICES_ENV).unwrap_or_else(|_| "cpu:0,cpu:0,cpu:0".into());
    let group = GpuContext::on_devices(&devices).expect("the writer's devices");
    let options = hive_gpu::DurableOptions::default().with_durability(hive_gpu::Durability::Process);
    let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
    let storage = ShardedStorage::open_durable(path, &group, config, options).expect("open");
    std::thread::scope(|s| {
        for t in 0..4 {
            let storage = &storage;
            s.spawn(move || {
                use std::io::Write;
                for i in 0.. {
                    let id = format!("r{round}t{t}-{i}");
                    storage.add_vectors(&[GpuVector::new(id.clone(), durable_value(t, i))]).expect("upsert");
                    writeln!(std::io::stdout().lock(), "ack {id}").expect("stdout");
                }
            });
        }
    });
}

#[test]
fn a_sharded_writer_killed_at_any_moment_loses_no_acknowledged_write() {
    // Over two real GPUs where lent (`kill_test_devices`), else three logical CPU shards; the
    // storage is opened again on the CPU (a sharded save opens on any devices).
    use std::io::BufRead;
    let dir = scratch("durable-kill");
    let path = dir.join("k.hgs");
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let exe = std::env::current_exe().expect("the test binary");
    let mut rng = Rng::new(5);
    let mut acknowledged: Vec<String> = Vec::new();
    let devices = kill_test_devices();
    for round in 0..6 {
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "durable_sharded_writer_child", "--nocapture", "--test-threads", "1"])
            .env(DURABLE_KILL_ENV, format!("{round}:{}", path.display()))
            .env(DURABLE_KILL_DEVICES_ENV, &devices)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the child");
        let stdout = child.stdout.take().expect("a pipe");
        let (writing, first_ack) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            let mut lines = std::io::BufReader::new(stdout);
            let mut line = String::new();
            // A line cut by the kill has no newline: not an acknowledgement.
            while lines.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                if let Some(id) = line.strip_prefix("ack ").and_then(|l| l.strip_suffix('\n')) {
                    if acks.is_empty() {
                        let _ = writing.send(());
                    }
                    acks.push(id.to_string());
                }
                line.clear();
            }
            acks
        });
        // The kill lands while the writers write, however long the devices took to open.
        let _ = first_ack.recv_timeout(Duration::from_secs(120));
        std::thread::sleep(Duration::from_millis(200 + rng.below(500) as u64));
        child.kill().expect("SIGKILL");
        child.wait().expect("the child ends");
        acknowledged.extend(reader.join().expect("the reader"));
        let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
        let opened =
            ShardedStorage::open_durable(&path, std::slice::from_ref(&cpu), config, Default::default())
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        for id in &acknowledged {
            let (t, i) =
                id.split_once('t').and_then(|(_, rest)| rest.split_once('-')).expect("an id of ours");
            let (t, i): (usize, usize) = (t.parse().expect("t"), i.parse().expect("i"));
            let stored = opened.get_vector(id).expect("a read");
            assert_eq!(stored.map(|v| v.data), Some(durable_value(t, i)), "round {round}: acknowledged {id}");
        }
    }
    assert!(acknowledged.len() > 200, "the children acknowledged only {} writes", acknowledged.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_device_merge_is_taken_where_shards_reach_one_device_and_equals_the_host_merge_ties_included() {
    // Many exact copies of few vectors, spread over every shard: nearly every pick ties another
    // shard's head, and the k-th often ties entries left out. Those queries the device flags for
    // the host; the rest it merges alone. Both must give the order one collection gives.
    let mut rng = Rng::new(77);
    let distinct: Vec<Vec<f32>> = (0..6).map(|_| vector(&mut rng)).collect();
    let vectors: Vec<GpuVector> = (0..600)
        .map(|i| {
            let data = if i % 3 == 0 { vector(&mut rng) } else { distinct[i % distinct.len()].clone() };
            GpuVector::new(format!("v{i}"), data).with_field("group", (i % 4) as i64)
        })
        .collect();
    // A batch big enough to go in pieces, fresh queries and copies of the repeated vectors.
    let queries: Vec<f32> =
        (0..4500).flat_map(|i| if i % 2 == 0 { vector(&mut rng) } else { distinct[i % 6].clone() }).collect();
    let require_peer = std::env::var("HIVE_GPU_REQUIRE_DEVICES").is_ok_and(|v| v.trim() != "1");
    for (name, group) in groups() {
        let backend = group[0].backend_type();
        let retuned = |change: &dyn Fn(&mut Tuning)| -> Vec<GpuContext> {
            let mut tuning = group[0].tuning().clone();
            change(&mut tuning);
            group.iter().map(|c| c.clone().with_tuning(tuning.clone())).collect()
        };
        let host_group = retuned(&|t| t.device_merge = false);
        // Batches of every size merged on the device, the 20-query ones included.
        let group = retuned(&|t| t.device_merge_min_queries = 1);
        for metric in [GpuDistanceMetric::Euclidean, GpuDistanceMetric::Cosine] {
            let config = config(metric, StoragePrecision::F32);
            let what = format!("{name}, {metric:?}");
            let reference = group[0].create_storage_with(config).expect("one collection");
            let device = ShardedStorage::create(&group, config).expect("sharded");
            let host = ShardedStorage::create(&host_group, config).expect("sharded, host merge");
            for storage in [&reference as &dyn Storage, &device, &host] {
                storage.apply(&Write::Add(vectors.clone())).expect("adds");
            }
            let same_device =
                group.iter().all(|c| c.device_info().device_id == group[0].device_info().device_id);
            let expected = backend == GpuBackendType::Cuda && (same_device || require_peer);
            if expected {
                assert!(device.merges_on_device(), "{what}: CUDA shards that reach one device merge there");
            }
            assert!(!host.merges_on_device(), "{what}: Tuning::device_merge off merges on the host");
            if backend != GpuBackendType::Cuda && backend != GpuBackendType::Rocm {
                assert!(!device.merges_on_device(), "{what}: {backend} has no device merge");
            }
            // k past what a shard holds (and past the whole storage) on a few queries.
            let few = &queries[..20 * DIM];
            for (k, filter, batch) in [
                (1, None, &queries[..]),
                (10, None, &queries[..]),
                (64, Some(Filter::eq("group", 1i64)), &queries[..]),
                (250, None, few),
                (700, None, few),
            ] {
                let mut options = SearchOptions::default().with_metadata(true);
                if let Some(f) = filter.clone() {
                    options = options.with_filter(f);
                }
                let want = reference.batch(batch, k, &options).expect("reference");
                let got = device.batch(batch, k, &options).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_same(&format!("{what}, k {k}, {filter:?}, device merge"), &got, &want);
                let got = host.batch(batch, k, &options).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_same(&format!("{what}, k {k}, {filter:?}, host merge"), &got, &want);
            }
        }
        // Shards with nothing to return: one vector over the group's shards (the others hold
        // none), and filters that pass it or nothing. Their lists are empty (width 0).
        let config = config(GpuDistanceMetric::Euclidean, StoragePrecision::F32);
        let reference = group[0].create_storage_with(config).expect("one collection");
        let device = ShardedStorage::create(&group, config).expect("sharded");
        for storage in [&reference as &dyn Storage, &device] {
            storage.apply(&Write::Add(vectors[..1].to_vec())).expect("an add");
        }
        assert!(device.shard_sizes().contains(&0), "{name}: {:?}", device.shard_sizes());
        let id = vectors[0].id.as_str();
        for options in [
            SearchOptions::default(),
            SearchOptions::default().with_filter(Filter::ids(&[id, "nope"])),
            SearchOptions::default().with_filter(Filter::ids(&["nope"])),
        ] {
            let batch = &queries[..200 * DIM];
            let want = reference.batch(batch, 5, &options).expect("reference");
            let got = device.batch(batch, 5, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_same(&format!("{name}, empty shards, {:?}", options.filter), &got, &want);
        }
    }
}
