//! Conformance suite: every available backend against an f64 brute force on fresh random
//! data (all metrics, k in {1, 10, 100, 1000}, dims {1, 3, 31, 63, 128, 300, 784, 1536}, n up to 100k,
//! every storage type), on near-duplicates that break norm-based L2, on exact ties, and on
//! real data with published ground truth.

mod common;

use std::collections::HashMap;

use common::{
    Rng, assert_exact, contexts_with_forced_paths, data_dir, describe, reference, storable, stored,
};
use hive_gpu::io;
use hive_gpu::{GpuContext, GpuDistanceMetric, GpuVector, GpuVectorStorage, StorageConfig, StoragePrecision};

use common::METRICS;

/// Queries in the small batches each case also checks.
const SMALL_BATCH: usize = 5;

struct Case {
    dim: usize,
    n: usize,
    nq: usize,
    ks: &'static [usize],
}

/// Fills a collection and returns the stored (id, values) pairs in insertion order.
fn fill(
    storage: &GpuVectorStorage,
    base: &[f32],
    dim: usize,
    precision: StoragePrecision,
) -> Vec<(String, Vec<f32>)> {
    let vectors: Vec<GpuVector> = base
        .chunks_exact(dim)
        .enumerate()
        .map(|(i, v)| GpuVector::new(format!("v{i}"), v.to_vec()))
        .collect();
    storage.add_vectors(&vectors).expect("valid vectors are accepted");
    vectors.into_iter().map(|v| (v.id, stored(precision, &v.data))).collect()
}

/// Random data of one case: Gaussian, or integers in 0..=255 (the byte kernels' domain,
/// full of exact ties).
#[derive(Clone, Copy, PartialEq)]
enum Values {
    Gaussian,
    Bytes,
}

fn case_data(rng: &mut Rng, case: &Case, values: Values) -> (Vec<f32>, Vec<f32>) {
    let Case { dim, n, nq, .. } = *case;
    let draw = |rng: &mut Rng, count: usize| -> Vec<f32> {
        match values {
            Values::Gaussian => rng.normals(count),
            Values::Bytes => (0..count).map(|_| rng.below(256) as f32).collect(),
        }
    };
    let base = draw(rng, n * dim);
    // Half the queries are perturbed base vectors, so close neighbours exist.
    let mut queries = Vec::with_capacity(nq * dim);
    for i in 0..nq {
        if i % 2 == 0 {
            queries.extend(draw(rng, dim));
        } else {
            let row = rng.below(n);
            for &x in &base[row * dim..(row + 1) * dim] {
                queries.push(match values {
                    Values::Gaussian => x + 0.01 * rng.normal(),
                    Values::Bytes => (x + rng.below(3) as f32 - 1.0).clamp(0.0, 255.0),
                });
            }
        }
    }
    (base, queries)
}

/// Checks batch search (the GEMM path) and single searches (the scan path) for every k.
fn check_case(
    context: &GpuContext,
    case: &Case,
    metric: GpuDistanceMetric,
    precision: StoragePrecision,
    seed: u64,
) {
    check_values(context, case, metric, precision, seed, Values::Gaussian);
}

fn check_values(
    context: &GpuContext,
    case: &Case,
    metric: GpuDistanceMetric,
    precision: StoragePrecision,
    seed: u64,
    values: Values,
) {
    let mut rng = Rng::new(seed);
    let Case { dim, n, nq, ks } = *case;
    let (base, queries) = case_data(&mut rng, case, values);
    // Integer storage takes integers: the same draw, scaled and rounded (queries alike, so
    // that the perturbed ones stay near their rows).
    let (base, queries) = (storable(precision, &base), storable(precision, &queries));
    let config = StorageConfig::new(dim, metric).with_precision(precision);
    let storage = context.create_storage_with(config).expect("storage");
    let vectors = fill(&storage, &base, dim, precision);
    let by_id: HashMap<&str, &[f32]> = vectors.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
    let max_k = *ks.iter().max().unwrap_or(&1);
    let references: Vec<_> =
        queries.chunks_exact(dim).map(|q| reference(metric, &vectors, q, max_k)).collect();
    for &k in ks {
        let what = format!("{} {metric} {precision} dim {dim} n {n} k {k}", describe(context));
        // A large batch, a small one and single queries take different kernels on some backends
        // (CPU: bf16 tiles, f32 GEMM tiles, SIMD scan); all must be exact.
        for size in [nq, SMALL_BATCH] {
            let batch = storage.search_batch(&queries[..size * dim], k).expect("batch search");
            assert_eq!(batch.len(), size, "{what}: one list per query");
            for (qi, (got, q)) in batch.iter().zip(queries.chunks_exact(dim)).enumerate() {
                let want = &references[qi][..k.min(n)];
                assert_exact(&format!("{what} batch of {size}, query {qi}"), metric, got, want, &by_id, q);
            }
        }
        for (qi, q) in queries.chunks_exact(dim).enumerate().take(2) {
            let got = storage.search(q, k).expect("single search");
            let want = &references[qi][..k.min(n)];
            assert_exact(&format!("{what} single query {qi}"), metric, &got, want, &by_id, q);
        }
    }
}

fn run_cases(cases: &[Case], precision: StoragePrecision) {
    for context in contexts_with_forced_paths() {
        for (ci, case) in cases.iter().enumerate() {
            for (mi, &metric) in METRICS.iter().enumerate() {
                check_case(&context, case, metric, precision, 1000 + (ci * 10 + mi) as u64);
            }
        }
    }
}

const SMALL_DIMS: &[Case] = &[
    Case { dim: 1, n: 2000, nq: 20, ks: &[1, 10, 100, 1000] },
    Case { dim: 3, n: 3000, nq: 20, ks: &[1, 10, 100, 1000] },
    // Odd sizes around the kernels' 16- and 32-lane blocks (dim % 32 == 31 once broke packing).
    Case { dim: 31, n: 2000, nq: 20, ks: &[1, 10, 100] },
    Case { dim: 63, n: 2000, nq: 17, ks: &[1, 10, 100] },
    Case { dim: 128, n: 20_000, nq: 24, ks: &[1, 10, 100, 1000] },
];

const LARGE_DIMS: &[Case] = &[
    // 600,000 values: a single query over them takes the CUDA few-rows pass, whose rows of
    // 300 go in ten chunks of 32 components (the last one partial), more than the four it holds
    // in flight at once.
    Case { dim: 300, n: 2000, nq: 17, ks: &[1, 10, 100] },
    Case { dim: 784, n: 3000, nq: 20, ks: &[1, 10, 100, 1000] },
    Case { dim: 1536, n: 2000, nq: 17, ks: &[1, 10, 100, 1000] },
];

#[test]
fn small_dims_f32_match_f64_reference() {
    run_cases(SMALL_DIMS, StoragePrecision::F32);
}

#[test]
fn small_dims_f16_match_f64_reference() {
    run_cases(SMALL_DIMS, StoragePrecision::F16);
}

#[test]
fn small_dims_bf16_match_f64_reference() {
    run_cases(SMALL_DIMS, StoragePrecision::Bf16);
}

#[test]
fn small_dims_i8_match_f64_reference() {
    run_cases(SMALL_DIMS, StoragePrecision::I8);
}

#[test]
fn small_dims_u8_match_f64_reference() {
    run_cases(SMALL_DIMS, StoragePrecision::U8);
}

#[test]
fn large_dims_f32_match_f64_reference() {
    run_cases(LARGE_DIMS, StoragePrecision::F32);
}

#[test]
fn large_dims_f16_match_f64_reference() {
    run_cases(LARGE_DIMS, StoragePrecision::F16);
}

/// bf16 and byte rows at 784 and 1536 dimensions: long rows of a 2- or 1-byte type, whose
/// vector loads and tiles cross many words.
#[test]
fn large_dims_bf16_i8_u8_match_f64_reference() {
    for precision in [StoragePrecision::Bf16, StoragePrecision::I8, StoragePrecision::U8] {
        run_cases(LARGE_DIMS, precision);
    }
}

#[test]
fn hundred_thousand_vectors_match_f64_reference() {
    let case = Case { dim: 128, n: 100_000, nq: 16, ks: &[10, 100] };
    for context in contexts_with_forced_paths() {
        for precision in StoragePrecision::ALL {
            check_case(&context, &case, GpuDistanceMetric::Euclidean, precision, 77);
        }
        check_case(&context, &case, GpuDistanceMetric::Cosine, StoragePrecision::F32, 78);
    }
}

/// Integers in 0..=255 (SIFT-like, pixel-like) take exact byte kernels on some backends and
/// produce many exactly tied distances.
#[test]
fn byte_valued_data_match_f64_reference() {
    let cases = [
        Case { dim: 3, n: 3000, nq: 20, ks: &[1, 10, 100, 1000] },
        Case { dim: 128, n: 5000, nq: 20, ks: &[1, 10, 100, 1000] },
        Case { dim: 785, n: 2000, nq: 17, ks: &[1, 10, 100] },
    ];
    for context in contexts_with_forced_paths() {
        for (ci, case) in cases.iter().enumerate() {
            for (mi, &metric) in METRICS.iter().enumerate() {
                for precision in StoragePrecision::ALL {
                    check_values(
                        &context,
                        case,
                        metric,
                        precision,
                        500 + (ci * 10 + mi) as u64,
                        Values::Bytes,
                    );
                }
            }
        }
    }
}

/// Cases built to sit just inside the reduced-precision kernels' error (found in review):
/// the approximate order of two rows is wrong by less than the error bound, so only a
/// correct margin and the exact re-rank order them. Each runs as one query (scan), a batch of
/// 6 (f32 tiles) and a batch of 16 (bf16 or byte tiles).
#[test]
fn adversarial_rounding_cases() {
    let p = |e: i32| 2f32.powi(e);
    let e = p(-23);
    let cases: Vec<(GpuDistanceMetric, Vec<Vec<f32>>, Vec<f32>)> = vec![
        (
            GpuDistanceMetric::DotProduct,
            vec![
                vec![1.0 + p(-8) - e, 1.0 + p(-8) - e],
                vec![1.0 + 3.0 * p(-8) + e, 1.0 - p(-8) - p(-9) + e],
            ],
            vec![1.0, 1.0],
        ),
        (
            GpuDistanceMetric::Euclidean,
            vec![
                vec![1.0 + p(-8) - e, 1.0 + p(-8) - e, p(-7) * 1.4375],
                vec![1.0 + 3.0 * p(-8) + e, 1.0 - p(-8) - p(-9) + e, 0.0],
            ],
            vec![1.0, 1.0, 0.0],
        ),
        // L1: summed in component order (every kernel's order at dimension 3), 1 + 2^-24 + 2^-24
        // rounds to 1, so r0 (1 + 2^-23) and r1 (1 + 2^-25) tie in f32 and only the exact
        // re-rank puts r1, stored second, first.
        (
            GpuDistanceMetric::Manhattan,
            vec![vec![1.0, p(-24), p(-24)], vec![1.0, p(-25), 0.0]],
            vec![0.0, 0.0, 0.0],
        ),
        // L1 inverted by rounding: summed in order, r0 (1 + 3 * 2^-24) rounds to 1 and r1
        // (1 + 2^-24 + 2^-30) to 1 + 2^-23, so the f32 sums put r0 first though r1 is nearer:
        // only a band wide enough for the sum's error keeps r1.
        (
            GpuDistanceMetric::Manhattan,
            vec![vec![1.0, p(-24), p(-24), p(-24)], vec![1.0, p(-24) + p(-30), 0.0, 0.0]],
            vec![0.0, 0.0, 0.0, 0.0],
        ),
        // L-infinity: 1 - (-2^-24) and 1 - (-2^-25) both round to 1 in f32; r1 is nearer.
        // (One rounding per term and an exact maximum: f32 can tie rows, never invert them.)
        (GpuDistanceMetric::Chebyshev, vec![vec![-p(-24), 0.5], vec![-p(-25), 0.5]], vec![1.0, 0.0]),
        // Subnormal query components, which bf16 hardware reads as zero.
        (GpuDistanceMetric::DotProduct, vec![vec![p(60), 0.0], vec![0.0, p(50)]], vec![p(-127), p(-125)]),
        (GpuDistanceMetric::Cosine, vec![vec![1.0, p(-130)], vec![1.0, -p(-130)]], vec![1.0, p(-127)]),
    ];
    for context in contexts_with_forced_paths() {
        for (ci, (metric, rows, query)) in cases.iter().enumerate() {
            let dim = query.len();
            let storage = context.create_storage(dim, *metric).expect("storage");
            let vectors: Vec<(String, Vec<f32>)> =
                rows.iter().enumerate().map(|(i, v)| (format!("r{i}"), v.clone())).collect();
            let batch: Vec<GpuVector> =
                vectors.iter().map(|(id, v)| GpuVector::new(id.clone(), v.clone())).collect();
            storage.add_vectors(&batch).expect("add");
            let by_id: HashMap<&str, &[f32]> =
                vectors.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
            for k in [1, 2] {
                let want = reference(*metric, &vectors, query, k);
                let single = storage.search(query, k).expect("search");
                assert_exact(&format!("case {ci} k {k} single"), *metric, &single, &want, &by_id, query);
                for size in [6, 16] {
                    let queries: Vec<f32> = query.iter().cycle().take(dim * size).copied().collect();
                    let lists = storage.search_batch(&queries, k).expect("batch");
                    for list in &lists {
                        assert_exact(
                            &format!("case {ci} k {k} batch {size}"),
                            *metric,
                            list,
                            &want,
                            &by_id,
                            query,
                        );
                    }
                }
            }
        }
    }
}

/// Vectors far from the origin and very close to each other: `|q|^2 + |x|^2 - 2 q.x` in f32
/// loses every digit of the distance, so only a re-rank in exact arithmetic orders them.
#[test]
fn near_duplicates_far_from_origin_are_ranked_exactly() {
    let (dim, n, nq) = (64, 3000, 24);
    for context in contexts_with_forced_paths() {
        let mut rng = Rng::new(5);
        let centre: Vec<f32> = (0..dim).map(|_| 1000.0 + rng.normal()).collect();
        let near = |rng: &mut Rng| -> Vec<f32> { centre.iter().map(|&c| c + 1e-3 * rng.normal()).collect() };
        let base: Vec<f32> = (0..n).flat_map(|_| near(&mut rng)).collect();
        let queries: Vec<f32> = (0..nq).flat_map(|_| near(&mut rng)).collect();
        let metric = GpuDistanceMetric::Euclidean;
        let storage = context.create_storage(dim, metric).expect("storage");
        let vectors = fill(&storage, &base, dim, StoragePrecision::F32);
        let by_id: HashMap<&str, &[f32]> =
            vectors.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
        let batch = storage.search_batch(&queries, 10).expect("batch search");
        let small = storage.search_batch(&queries[..SMALL_BATCH * dim], 10).expect("small batch search");
        for (qi, q) in queries.chunks_exact(dim).enumerate() {
            let want = reference(metric, &vectors, q, 10);
            assert_exact(&format!("near-duplicates batch {qi}"), metric, &batch[qi], &want, &by_id, q);
            if qi < SMALL_BATCH {
                assert_exact(
                    &format!("near-duplicates small batch {qi}"),
                    metric,
                    &small[qi],
                    &want,
                    &by_id,
                    q,
                );
            }
            let single = storage.search(q, 10).expect("single search");
            assert_exact(&format!("near-duplicates single {qi}"), metric, &single, &want, &by_id, q);
            // Exactly the same ids as the reference, in order: no ties here.
            let got: Vec<&str> = batch[qi].iter().map(|r| r.id.as_str()).collect();
            let expected: Vec<&str> = want.iter().map(|(id, _)| id.as_str()).collect();
            assert_eq!(got, expected, "near-duplicates query {qi}");
        }
    }
}

/// Rows and queries of tiny magnitude (components near 2^-64): the f16 scales that bring them
/// into range are so large that a filter folding both into its f32 distance factor would
/// underflow to zero and rank rows by their norms alone. Such batches must still be exact.
#[test]
fn tiny_vectors_are_ranked_exactly() {
    let (dim, n, nq) = (16, 3000, 24);
    let unit = 2f32.powi(-64);
    for context in contexts_with_forced_paths() {
        for metric in [
            GpuDistanceMetric::Euclidean,
            GpuDistanceMetric::DotProduct,
            GpuDistanceMetric::Manhattan,
            GpuDistanceMetric::Chebyshev,
        ] {
            let mut rng = Rng::new(17);
            let base: Vec<f32> = (0..n * dim).map(|_| unit * rng.normal()).collect();
            let queries: Vec<f32> = (0..nq * dim).map(|_| unit * rng.normal()).collect();
            let storage = context.create_storage(dim, metric).expect("storage");
            let vectors = fill(&storage, &base, dim, StoragePrecision::F32);
            let by_id: HashMap<&str, &[f32]> =
                vectors.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
            let batch = storage.search_batch(&queries, 10).expect("batch search");
            for (qi, q) in queries.chunks_exact(dim).enumerate() {
                let want = reference(metric, &vectors, q, 10);
                let what = format!("{} {metric} tiny vectors, query {qi}", describe(&context));
                assert_exact(&what, metric, &batch[qi], &want, &by_id, q);
            }
        }
    }
}

/// Cosine rows far shorter than the longest one: a filter that rounds every row to f16 under
/// one scale (set by the longest) leaves a short row's components among f16's subnormals, a
/// few units of 2^-24 each, and cosine divides that absolute error by the row's norm. Each
/// query's true 10 nearest here are such rows, about 1e-4 apart in cosine, in two settings
/// (`search.rs`, `cosine_rounds`): 1e-10 as long as the longest row, where rounding would
/// misorder them and the batch must stay on TF32; and 1e-6 as long, inside the range
/// where it rounds, with the rows' floor divided by the least norm in the band.
#[test]
fn cosine_rows_far_shorter_than_the_longest_are_ranked_exactly() {
    let (dim, n, nq, planted) = (64, 3000, 24, 12);
    let metric = GpuDistanceMetric::Cosine;
    let planted_row = |qi: usize, j: usize| 1 + qi * planted + j;
    for context in contexts_with_forced_paths() {
        for short in [1e-7f32, 1e-3] {
            let mut rng = Rng::new(29);
            let queries: Vec<f32> = (0..nq * dim).map(|_| rng.normal()).collect();
            let mut base: Vec<f32> = (0..n * dim).map(|_| rng.normal()).collect();
            // The longest row (norm about 1e4, so rows scale by 2 into f16), and per query
            // rows of norm about 8 * short along it.
            base[..dim].iter_mut().for_each(|x| *x *= 1250.0);
            for (qi, q) in queries.chunks_exact(dim).enumerate() {
                for j in 0..planted {
                    let row = planted_row(qi, j);
                    for (x, &v) in base[row * dim..(row + 1) * dim].iter_mut().zip(q) {
                        *x = short * (v + 0.05 * rng.normal());
                    }
                }
            }
            let storage = context.create_storage(dim, metric).expect("storage");
            let vectors = fill(&storage, &base, dim, StoragePrecision::F32);
            let by_id: HashMap<&str, &[f32]> =
                vectors.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
            let batch = storage.search_batch(&queries, 10).expect("batch search");
            for (qi, q) in queries.chunks_exact(dim).enumerate() {
                let want = reference(metric, &vectors, q, 10);
                let short_ids: Vec<&String> = (0..planted).map(|j| &vectors[planted_row(qi, j)].0).collect();
                assert!(
                    want.iter().all(|(id, _)| short_ids.contains(&id)),
                    "query {qi}: the short rows are the nearest"
                );
                let what = format!("{} short cosine rows ({short:e}), query {qi}", describe(&context));
                assert_exact(&what, metric, &batch[qi], &want, &by_id, q);
            }
        }
    }
}

/// Equal scores come back in storage order, on both search paths, before and after
/// compaction.
#[test]
fn ties_are_ordered_by_storage_order() {
    for context in contexts_with_forced_paths() {
        for metric in METRICS {
            let storage = context.create_storage(4, metric).expect("storage");
            let same = vec![1.0, 2.0, 3.0, 4.0];
            let ids = ["e", "a", "d", "b", "c"];
            let vectors: Vec<GpuVector> = ids.iter().map(|id| GpuVector::new(*id, same.clone())).collect();
            storage.add_vectors(&vectors).expect("add");
            storage.add_vectors(&[GpuVector::new("far", vec![-9.0, 0.5, 7.0, -1.0])]).expect("add");
            let single: Vec<String> =
                storage.search(&same, 5).expect("search").into_iter().map(|r| r.id.to_string()).collect();
            assert_eq!(single, ids, "{metric}: single search ties");
            let queries: Vec<f32> = same.iter().cycle().take(4 * 6).copied().collect();
            for list in storage.search_batch(&queries, 5).expect("batch") {
                let got: Vec<String> = list.into_iter().map(|r| r.id.to_string()).collect();
                assert_eq!(got, ids, "{metric}: batch search ties");
            }
            storage.remove_vectors(&["a", "far"]).expect("remove");
            storage.compact().expect("compact");
            let got: Vec<String> =
                storage.search(&same, 4).expect("search").into_iter().map(|r| r.id.to_string()).collect();
            assert_eq!(got, ["e", "d", "b", "c"], "{metric}: ties after compaction");
        }
    }
}

fn ground_truth_recall(name: &str) {
    let dir = data_dir().join(name);
    let base = io::read_fvecs(&dir.join(format!("{name}_base.fvecs"))).expect("base");
    let queries = io::read_fvecs(&dir.join(format!("{name}_query.fvecs"))).expect("queries");
    let truth = io::read_ivecs(&dir.join(format!("{name}_groundtruth.ivecs"))).expect("ground truth");
    for context in contexts_with_forced_paths() {
        let storage = context.create_storage(base.dim, GpuDistanceMetric::Euclidean).expect("storage");
        fill(&storage, &base.data, base.dim, StoragePrecision::F32);
        let batch = storage.search_batch(&queries.data, 10).expect("batch");
        let singles: Vec<_> =
            (0..queries.rows.min(20)).map(|i| storage.search(queries.row(i), 10).expect("search")).collect();
        for (i, list) in batch.iter().chain(&singles).enumerate() {
            let qi = if i < queries.rows { i } else { i - queries.rows };
            let want: Vec<String> = truth.row(qi)[..10].iter().map(|id| format!("v{id}")).collect();
            let got: Vec<String> = list.iter().map(|r| r.id.to_string()).collect();
            assert_eq!(got, want, "{} {name}: query {qi} (recall@10 must be 1.0)", describe(&context));
        }
    }
}

#[test]
fn siftsmall_recall_at_10_is_one() {
    ground_truth_recall("siftsmall");
}

#[test]
fn fmnistsmall_recall_at_10_is_one() {
    ground_truth_recall("fmnistsmall");
}

/// Metadata comes back with results when asked, and only then.
#[test]
fn payloads_are_returned_on_request() {
    for context in contexts_with_forced_paths() {
        let storage = context.create_storage(2, GpuDistanceMetric::DotProduct).expect("storage");
        let meta: hive_gpu::Metadata = [("title".to_string(), "first".to_string())].into();
        storage
            .add_vectors(&[
                GpuVector::with_metadata("x", vec![1.0, 0.0], meta.clone()),
                GpuVector::new("y", vec![0.0, 1.0]),
            ])
            .expect("add");
        let plain = storage.search(&[1.0, 0.0], 1).expect("search");
        assert_eq!(plain[0].metadata, None);
        let options = hive_gpu::SearchOptions::default().with_metadata(true);
        let rich = storage.search_with(&[1.0, 0.0], 2, &options).expect("search");
        assert_eq!(rich[0].metadata.as_deref(), Some(&meta));
        assert_eq!(rich[1].metadata.as_deref(), Some(&hive_gpu::Metadata::new()));
        assert_eq!(rich[0].score, 1.0, "dot product score is q.x");
    }
}

/// A batch of several thousand queries is searched in pieces that overlap host and device
/// work; every query must still get its own exact list, in the batch's order.
#[test]
fn large_batches_searched_in_pieces_keep_their_order() {
    // 4,100 queries: three pieces, the last one a query short.
    let (dim, n, nq, k) = (8, 300, 4100, 5);
    for context in contexts_with_forced_paths() {
        let mut rng = Rng::new(11);
        let base = rng.normals(n * dim);
        let queries = rng.normals(nq * dim);
        let metric = GpuDistanceMetric::Euclidean;
        let storage = context.create_storage(dim, metric).expect("storage");
        let vectors = fill(&storage, &base, dim, StoragePrecision::F32);
        let by_id: HashMap<&str, &[f32]> =
            vectors.iter().map(|(id, v)| (id.as_str(), v.as_slice())).collect();
        let batch = storage.search_batch(&queries, k).expect("batch search");
        assert_eq!(batch.len(), nq, "{}: one list per query", describe(&context));
        for (qi, q) in queries.chunks_exact(dim).enumerate() {
            let want = reference(metric, &vectors, q, k);
            let what = format!("{} large batch, query {qi}", describe(&context));
            assert_exact(&what, metric, &batch[qi], &want, &by_id, q);
        }
    }
}
