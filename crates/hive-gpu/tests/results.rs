//! Columnar results (`search_batch_results`) carry exactly what the per-query lists carry, on
//! every backend: one row per query, in order, across the pieces a large batch is cut into,
//! with filters that leave rows short or empty, with and without payloads.

mod common;

use common::{Rng, contexts, describe};
use hive_gpu::{Filter, GpuDistanceMetric, GpuVector, IndexSpec, SearchOptions};

#[test]
fn columnar_results_equal_the_per_query_lists_across_pieces_filters_and_payloads() {
    for context in contexts() {
        let what = describe(&context);
        let dim = 16;
        let storage = context.create_storage(dim, GpuDistanceMetric::DotProduct).expect("storage");
        let mut rng = Rng::new(5);
        let vectors: Vec<GpuVector> = (0..3000)
            .map(|i| {
                // Ids beyond 23 bytes are shared allocations, short ones inline: both kinds.
                let id =
                    if i % 3 == 0 { format!("a-rather-long-identifier-number-{i}") } else { format!("v{i}") };
                GpuVector::new(id, rng.normals(dim)).with_field("group", (i % 7) as i64)
            })
            .collect();
        storage.add_vectors(&vectors).expect("add");
        // 4,100 queries are cut into pieces searched side by side.
        for nq in [1, 7, 4100] {
            let queries = rng.normals(nq * dim);
            for (k, filter) in [
                (1, None),
                (10, None),
                (10, Some(Filter::eq("group", 3))),
                (5, Some(Filter::ids(&["v1", "v2"]))),
                (5, Some(Filter::eq("group", 99))),
            ] {
                for with_payload in [false, true] {
                    let mut options = SearchOptions::default().with_metadata(with_payload);
                    if let Some(f) = &filter {
                        options = options.with_filter(f.clone());
                    }
                    let label = format!("{what}: nq {nq} k {k} filter {filter:?} payload {with_payload}");
                    let lists = storage.search_batch_with(&queries, k, &options).expect("lists");
                    let columns = storage.search_batch_results(&queries, k, &options).expect("columns");
                    assert_eq!(columns.len(), nq, "{label}: one row per query");
                    assert_eq!(columns.lens().len(), nq, "{label}");
                    let k_rows = columns.k();
                    assert!(k_rows <= k, "{label}: rows hold at most k entries");
                    assert_eq!(columns.ids().len(), nq * k_rows, "{label}: nq x k flat arrays");
                    // Padding after each row's neighbours: empty id, NaN score, slot usize::MAX.
                    for q in 0..nq {
                        for j in columns.lens()[q]..k_rows {
                            let at = q * k_rows + j;
                            assert!(columns.ids()[at].is_empty(), "{label}: padding id");
                            assert!(columns.scores()[at].is_nan(), "{label}: padding score");
                            assert_eq!(columns.slots()[at], usize::MAX, "{label}: padding slot");
                        }
                    }
                    assert_eq!(columns.to_lists(), lists, "{label}: the lists are a view of the columns");
                    for (q, row) in columns.rows().enumerate() {
                        assert_eq!(row.len(), lists[q].len(), "{label}: row {q}");
                        assert_eq!(row.metadata.is_some(), with_payload, "{label}");
                    }
                }
            }
        }
    }
}

/// Results searched into the same arrays batch after batch (`search_batch_results_into`) hold
/// exactly what fresh ones do, whatever the arrays held before: rows an IVF probe leaves
/// shorter than k (its few lists hold fewer rows) get their padding back, not the last batch's
/// neighbours; payloads come and go; filters shorten every row; fewer and more rows than the
/// arrays had room for.
#[test]
fn results_searched_into_reused_arrays_equal_fresh_ones_with_no_stale_entry_left() {
    for context in contexts() {
        let what = describe(&context);
        let dim = 8;
        let storage = context.create_storage(dim, GpuDistanceMetric::Euclidean).expect("storage");
        let mut rng = Rng::new(11);
        let vectors: Vec<GpuVector> = (0..2000)
            .map(|i| GpuVector::new(format!("v{i}"), rng.normals(dim)).with_field("group", (i % 5) as i64))
            .collect();
        storage.add_vectors(&vectors).expect("add");
        // About 10 rows a list: one probed list leaves most rows short of k = 40.
        let nlist = 200;
        storage.build_index(IndexSpec::IvfFlat { nlist }).expect("index");
        let mut out = hive_gpu::SearchResults::default();
        let (all, one) = (Some(nlist), Some(1));
        let cases = [
            (3000, 40, all, None, false),
            (3000, 40, one, None, false),
            (3000, 40, all, None, true),
            (3000, 40, one, None, true),
            (3000, 40, one, None, false),
            (3000, 10, all, Some(Filter::ids(&["v1", "v2", "v3"])), false),
            (3000, 10, all, Some(Filter::eq("group", 99)), false),
            (17, 4, one, None, false),
            (5000, 40, one, Some(Filter::eq("group", 2)), false),
        ];
        let mut short = 0;
        for (nq, k, nprobe, filter, with_payload) in cases {
            let queries = rng.normals(nq * dim);
            let mut options = SearchOptions::default().with_metadata(with_payload);
            if let Some(nprobe) = nprobe {
                options = options.with_nprobe(nprobe);
            }
            if let Some(f) = &filter {
                options = options.with_filter(f.clone());
            }
            let label =
                format!("{what}: nq {nq} k {k} nprobe {nprobe:?} filter {filter:?} payload {with_payload}");
            storage.search_batch_results_into(&queries, k, &options, &mut out).expect("into");
            let fresh = storage.search_batch_results(&queries, k, &options).expect("fresh");
            assert_eq!((out.len(), out.k()), (fresh.len(), fresh.k()), "{label}: shape");
            assert_eq!(out.lens(), fresh.lens(), "{label}: lens");
            assert_eq!(out.slots(), fresh.slots(), "{label}: slots, padding included");
            assert_eq!(out.ids(), fresh.ids(), "{label}: ids, padding included");
            let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(out.scores()), bits(fresh.scores()), "{label}: scores, NaN padding included");
            assert_eq!(out.to_lists(), fresh.to_lists(), "{label}: rows with their payloads");
            short += out.lens().iter().filter(|&&len| len < out.k()).count();
        }
        assert!(short > 1000, "{what}: only {short} rows were short of k: the padding went untested");
    }
}
