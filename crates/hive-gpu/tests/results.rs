//! Columnar results (`search_batch_results`) carry exactly what the per-query lists carry, on
//! every backend: one row per query, in order, across the pieces a large batch is cut into,
//! with filters that leave rows short or empty, with and without payloads.

mod common;

use common::{Rng, contexts, describe};
use hive_gpu::{Filter, GpuDistanceMetric, GpuVector, SearchOptions};

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
