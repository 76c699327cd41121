//! The backend primitives on their own, below any planner or collection: `refine`,
//! `scan_lists`, `select_k`, `gather`, `nearest_rows`, `nearest_sets`, `knn` restricted to a slot set and the code scans
//! (`scan_codes`, `scan_bits`, `scan_pq`), on every backend and every forced engine path,
//! f32 and f16 storage, every metric, against an f64 brute force over the stored values.
//! The data has exact duplicates (ties must go to the lower slot), removed rows (never
//! returned by refine or knn) and candidate lists with repeats, removed slots, fewer than k
//! entries and none.

mod common;

use common::{Rng, contexts_with_forced_paths, describe, distance};
use hive_gpu::backend::{
    BitScan, Candidates, CodeScan, ListCodes, ListProbes, PqScan, QuantizedScan, bits, pq,
};
use hive_gpu::slots::SlotSet;
use hive_gpu::{GpuContext, GpuDistanceMetric, Neighbor, RowStore, SearchPrecision, StoragePrecision};

const DIM: usize = 37;
const ROWS: usize = 300;
const REMOVED: [usize; 4] = [3, 15, 16, 299];
use common::METRICS;

/// A store of `ROWS` rows where rows 10..20 repeat rows 0..10 exactly, with `REMOVED` removed.
fn store(context: &GpuContext, precision: StoragePrecision, rng: &mut Rng) -> Box<dyn RowStore> {
    let mut values = rng.normals(ROWS * DIM);
    values.copy_within(0..10 * DIM, 10 * DIM);
    // Integer types take integers (the same draw scaled and rounded; the twins stay twins).
    let values = common::storable(precision, &values);
    let mut rows = context
        .backend()
        .new_rows(DIM, precision, SearchPrecision::Exact, context.tuning())
        .expect("a row store opens");
    rows.append(&values).expect("rows append");
    rows.tombstone(&REMOVED);
    rows
}

/// The stored values, row by row (after the storage precision's rounding).
fn stored(rows: &dyn RowStore) -> Vec<Vec<f32>> {
    (0..rows.len()).map(|s| rows.read_row(s).expect("a stored row reads")).collect()
}

/// The exact k best of `slots` (each once) for `query`, ties by slot.
fn best(
    metric: GpuDistanceMetric,
    values: &[Vec<f32>],
    query: &[f32],
    slots: &[usize],
    k: usize,
) -> Vec<(usize, f64)> {
    let mut scored: Vec<(usize, f64)> =
        slots.iter().map(|&s| (s, distance(metric, query, &values[s]))).collect();
    scored.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    scored.dedup_by_key(|(s, _)| *s);
    scored.truncate(k);
    scored
}

/// `got` equals `want`: the same slots in the same order unless two are a genuine f64 tie,
/// and every distance equal to the exact one of its own slot.
fn assert_same(
    what: &str,
    metric: GpuDistanceMetric,
    values: &[Vec<f32>],
    query: &[f32],
    got: &[Neighbor],
    want: &[(usize, f64)],
) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} against {want:?}");
    let scale = want.iter().map(|(_, d)| d.abs()).fold(1.0, f64::max);
    for (i, (n, &(slot, d))) in got.iter().zip(want).enumerate() {
        let own = distance(metric, query, &values[n.slot]);
        assert!(
            (n.distance - own).abs() <= 1e-9 * scale,
            "{what}: rank {i} slot {} reports {} but is {own}",
            n.slot,
            n.distance
        );
        assert!(
            n.slot == slot || (own - d).abs() <= 1e-12 * scale,
            "{what}: rank {i} is slot {} ({own}), the reference has slot {slot} ({d})",
            n.slot
        );
    }
}

/// Every slot's live state: not in `REMOVED`.
fn live(slot: usize) -> bool {
    !REMOVED.contains(&slot)
}

#[test]
fn refine_equals_an_f64_brute_force_over_each_querys_live_candidates() {
    for context in contexts_with_forced_paths() {
        for precision in StoragePrecision::ALL {
            let mut rng = Rng::new(0x7e_f1e);
            let rows = store(&context, precision, &mut rng);
            let values = stored(&*rows);
            let nq = 7;
            let mut queries = rng.normals(nq * DIM);
            // Query 0 is row 5 itself: a zero distance at the top (its twin, slot 15, is
            // removed; the other twins tie with their originals).
            queries[..DIM].copy_from_slice(&values[5]);
            let every: Vec<usize> = (0..ROWS).collect();
            let random: Vec<usize> = (0..80).map(|_| rng.below(ROWS)).collect();
            let twice: Vec<usize> = every.iter().chain(&every).rev().copied().collect();
            let lists: Vec<Vec<usize>> =
                vec![every.clone(), random, vec![], vec![42, 7, 42], vec![3, 15], twice, (0..40).collect()];
            let candidates = Candidates::from_lists(&lists);
            for metric in METRICS {
                for k in [1, 10, 64] {
                    let what = format!("{} {precision:?} {metric:?} k={k}", describe(&context));
                    let got = rows
                        .refine(&queries, &candidates, k, metric)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(got.len(), nq, "{what}");
                    for (q, list) in lists.iter().enumerate() {
                        let query = &queries[q * DIM..(q + 1) * DIM];
                        let alive: Vec<usize> = list.iter().copied().filter(|&s| live(s)).collect();
                        let want = best(metric, &values, query, &alive, k);
                        assert_same(&format!("{what} query {q}"), metric, &values, query, &got[q], &want);
                    }
                }
            }
        }
    }
}

#[test]
fn scan_lists_equals_an_f64_brute_force_over_each_querys_live_allowed_list_members() {
    for context in contexts_with_forced_paths() {
        for precision in StoragePrecision::ALL {
            let mut rng = Rng::new(0x5ca7);
            let rows = store(&context, precision, &mut rng);
            let values = stored(&*rows);
            // Seven lists partition the slots unevenly (list 6 is empty; list 0 holds the
            // duplicates 0..20 and the removed slots 15 and 16).
            let mut lists: Vec<Vec<u32>> = vec![
                (0..20).collect(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
            ];
            for slot in 20..ROWS as u32 {
                lists[1 + rng.below(5)].push(slot);
            }
            let allowed = SlotSet::from_slots(ROWS, (0..ROWS).filter(|s| s % 3 != 1));
            // Batches below and above the CPU's grouped path; the last query probes the empty list.
            for nq in [1, 2, 9] {
                let nprobe = 2;
                let mut queries = rng.normals(nq * DIM);
                queries[..DIM].copy_from_slice(&values[5]);
                let mut probes: Vec<u32> = Vec::new();
                for q in 0..nq {
                    let first = if q == 0 { 0 } else { rng.below(7) as u32 };
                    let second = (first + 1 + rng.below(6) as u32) % 7;
                    probes.extend([first, second]);
                }
                if nq == 9 {
                    probes[16..18].copy_from_slice(&[6, 6 - 1]);
                }
                let scan = ListProbes { lists: &lists, probes: &probes, nprobe, generation: 0 };
                for metric in METRICS {
                    for k in [1, 10, 80] {
                        for filter in [None, Some(&allowed)] {
                            let what = format!(
                                "{} {precision:?} {metric:?} nq={nq} k={k} filtered={}",
                                describe(&context),
                                filter.is_some()
                            );
                            let got = rows
                                .scan_lists(&queries, &scan, k, metric, filter)
                                .unwrap_or_else(|e| panic!("{what}: {e}"));
                            assert_eq!(got.len(), nq, "{what}");
                            for q in 0..nq {
                                let query = &queries[q * DIM..(q + 1) * DIM];
                                let members: Vec<usize> = scan
                                    .of(q)
                                    .iter()
                                    .flat_map(|&l| lists[l as usize].iter().map(|&s| s as usize))
                                    .filter(|&s| live(s) && filter.is_none_or(|a| a.contains(s)))
                                    .collect();
                                let want = best(metric, &values, query, &members, k);
                                assert_same(
                                    &format!("{what} query {q}"),
                                    metric,
                                    &values,
                                    query,
                                    &got[q],
                                    &want,
                                );
                            }
                        }
                    }
                }
            }
            let query = rng.normals(DIM);
            let metric = GpuDistanceMetric::Euclidean;
            let bad_list = ListProbes { lists: &lists, probes: &[7], nprobe: 1, generation: 0 };
            let e = rows.scan_lists(&query, &bad_list, 3, metric, None).unwrap_err().to_string();
            assert!(e.contains("list 7"), "{}: {e}", describe(&context));
            let past = vec![vec![1, ROWS as u32]];
            let bad_slot = ListProbes { lists: &past, probes: &[0], nprobe: 1, generation: 0 };
            let e = rows.scan_lists(&query, &bad_slot, 3, metric, None).unwrap_err().to_string();
            assert!(e.contains(&format!("{ROWS}")), "{}: {e}", describe(&context));
            let short = ListProbes { lists: &lists, probes: &[0], nprobe: 2, generation: 0 };
            assert!(rows.scan_lists(&query, &short, 3, metric, None).is_err(), "{}", describe(&context));
        }
    }
}

#[test]
fn scan_lists_over_long_lists_split_between_blocks_and_many_queries_per_list_stays_exact() {
    // A GPU scans a long list for few queries in parts (one block each) and a list probed by
    // many queries in groups (one block reads each row for all of them); both end in the
    // same exact top-k as an f64 brute force. Dimension 64 takes the kernels' vector loads
    // (37, above, the scalar ones); 40 queries probing 2 of 3 lists put up to 40 on one list,
    // and 12 put 8 on each (on the CPU, rows multiplied in place in blocks of 4 x 4 across
    // several tiles of a list).
    const DIM: usize = 64;
    const ROWS: usize = 6000;
    for context in contexts_with_forced_paths() {
        for precision in StoragePrecision::ALL {
            let mut rng = Rng::new(0x5917);
            let mut rows = context
                .backend()
                .new_rows(DIM, precision, SearchPrecision::Exact, context.tuning())
                .expect("a row store opens");
            rows.append(&common::storable(precision, &rng.normals(ROWS * DIM))).expect("rows append");
            let removed: Vec<usize> = (0..ROWS).step_by(7).collect();
            rows.tombstone(&removed);
            let values = stored(&*rows);
            let lists: Vec<Vec<u32>> =
                (0..3u32).map(|l| (0..ROWS as u32).filter(|s| s % 3 == l).collect()).collect();
            for nq in [1, 3, 12, 40] {
                let queries = rng.normals(nq * DIM);
                let probes: Vec<u32> = (0..nq as u32).flat_map(|q| [q % 3, (q + 1) % 3]).collect();
                let scan = ListProbes { lists: &lists, probes: &probes, nprobe: 2, generation: 0 };
                for metric in METRICS {
                    for k in [1, 10, 100] {
                        let what = format!("{} {precision:?} {metric:?} nq={nq} k={k}", describe(&context));
                        let got = rows
                            .scan_lists(&queries, &scan, k, metric, None)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        for q in 0..nq {
                            let query = &queries[q * DIM..(q + 1) * DIM];
                            let members: Vec<usize> = scan
                                .of(q)
                                .iter()
                                .flat_map(|&l| lists[l as usize].iter().map(|&s| s as usize))
                                .filter(|s| s % 7 != 0)
                                .collect();
                            let want = best(metric, &values, query, &members, k);
                            assert_same(&format!("{what} query {q}"), metric, &values, query, &got[q], &want);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn scan_lists_follows_each_new_generation_of_the_lists_and_never_reuses_a_stale_copy() {
    // A GPU backend keeps the lists on the device under their generation: the same lists
    // under one generation must give the same answer twice, and changed lists under a new
    // generation (or under 0, never cached) must be read afresh, even at the same list count.
    for context in contexts_with_forced_paths() {
        let mut rng = Rng::new(0x6e6e);
        let rows = store(&context, StoragePrecision::F32, &mut rng);
        let values = stored(&*rows);
        let query = values[40].clone();
        let metric = GpuDistanceMetric::Euclidean;
        let first: Vec<Vec<u32>> = vec![(0..150).collect(), (150..ROWS as u32).collect()];
        // Slot 40 moves to the other list.
        let mut second = first.clone();
        second[0].retain(|&s| s != 40);
        second[1].push(40);
        let generation = ListProbes::next_generation();
        let scan = |lists: &[Vec<u32>], generation: u64| {
            let probes = ListProbes { lists, probes: &[1], nprobe: 1, generation };
            rows.scan_lists(&query, &probes, 5, metric, None).unwrap_or_else(|e| panic!("{e}"))
        };
        let slots = |found: Vec<Neighbor>| found.iter().map(|n| n.slot).collect::<Vec<_>>();
        let before = slots(scan(&first, generation).remove(0));
        assert!(!before.contains(&40), "{}: list 1 does not hold slot 40 yet", describe(&context));
        assert_eq!(slots(scan(&first, generation).remove(0)), before, "{}", describe(&context));
        for generation in [ListProbes::next_generation(), 0] {
            let after = slots(scan(&second, generation).remove(0));
            assert_eq!(
                after.first(),
                Some(&40),
                "{}: generation {generation} read stale lists",
                describe(&context)
            );
        }
    }
}

#[test]
fn refine_refuses_bad_arguments_by_name_and_changes_nothing() {
    for context in contexts_with_forced_paths() {
        let mut rng = Rng::new(5);
        let rows = store(&context, StoragePrecision::F32, &mut rng);
        let what = describe(&context);
        let query = rng.normals(DIM);
        let metric = GpuDistanceMetric::Euclidean;
        let past = rows.refine(&query, &Candidates::from_lists(&[vec![1, ROWS]]), 3, metric).unwrap_err();
        assert!(past.to_string().contains(&format!("slot {ROWS}")), "{what}: {past}");
        let zero = rows.refine(&query, &Candidates::from_lists(&[vec![1]]), 0, metric).unwrap_err();
        assert!(zero.to_string().contains("k of at least 1"), "{what}: {zero}");
        let count = rows.refine(&query, &Candidates::from_lists(&[vec![1], vec![2]]), 1, metric).unwrap_err();
        assert!(count.to_string().contains("2 candidate lists"), "{what}: {count}");
        let ragged = rows.refine(&query[1..], &Candidates::from_lists(&[vec![1]]), 1, metric).unwrap_err();
        assert!(ragged.to_string().contains("whole"), "{what}: {ragged}");
        for bad in [f32::NAN, f32::INFINITY] {
            let mut odd = query.clone();
            odd[DIM - 1] = bad;
            let refused = rows.refine(&odd, &Candidates::from_lists(&[vec![1, 2]]), 1, metric).unwrap_err();
            let component = format!("component {}", DIM - 1);
            assert!(refused.to_string().contains(&component), "{what}: {refused}");
        }
        // The store still answers, and exactly.
        let values = stored(&*rows);
        let got = rows.refine(&query, &Candidates::from_lists(&[vec![8, 9]]), 1, metric).expect("refine");
        assert_same(&what, metric, &values, &query, &got[0], &best(metric, &values, &query, &[8, 9], 1));
        assert_eq!(rows.len(), ROWS, "{what}");
    }
}

#[test]
fn select_k_returns_the_smallest_scores_ties_by_column() {
    for context in contexts_with_forced_paths() {
        let rows = context
            .backend()
            .new_rows(4, StoragePrecision::F32, SearchPrecision::Exact, context.tuning())
            .expect("a row store opens");
        let mut rng = Rng::new(11);
        for width in [1usize, 5, 300, 1000] {
            let count = 3;
            // Quarter steps make many exact ties; infinities sort at the ends.
            let mut scores: Vec<f32> =
                (0..count * width).map(|_| (rng.normal() * 4.0).round() / 4.0).collect();
            scores[0] = f32::INFINITY;
            if width > 2 {
                scores[width + 1] = f32::NEG_INFINITY;
                scores[2 * width + 1] = -0.0;
                scores[2 * width] = 0.0;
            }
            for k in [1, 7, width + 3] {
                let what = format!("{} width {width} k {k}", describe(&context));
                let got = rows.select_k(&scores, width, k).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(got.len(), count, "{what}");
                for (r, row) in scores.chunks_exact(width).enumerate() {
                    let mut want: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
                    want.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                    want.truncate(k);
                    let got: Vec<(usize, f32)> = got[r].iter().map(|n| (n.slot, n.distance as f32)).collect();
                    assert_eq!(got.len(), want.len(), "{what} row {r}");
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            g.0 == w.0 && g.1.to_bits() == w.1.to_bits(),
                            "{what} row {r}: {got:?} against {want:?}"
                        );
                    }
                }
            }
        }
        let nan = rows.select_k(&[1.0, f32::NAN, 2.0], 3, 1).unwrap_err();
        assert!(nan.to_string().contains("score 1 of row 0 is NaN"), "{}: {nan}", describe(&context));
        assert!(rows.select_k(&[1.0, 2.0, 3.0], 2, 1).is_err(), "{}", describe(&context));
    }
}

#[test]
fn gather_returns_the_stored_rows_in_the_order_asked() {
    for context in contexts_with_forced_paths() {
        for precision in StoragePrecision::ALL {
            let mut rng = Rng::new(21);
            let rows = store(&context, precision, &mut rng);
            let values = stored(&*rows);
            let what = format!("{} {precision:?}", describe(&context));
            // Repeats, removed rows (still stored until compaction) and the last row.
            let slots: Vec<usize> = (0..200).map(|_| rng.below(ROWS)).chain([3, 3, ROWS - 1, 0]).collect();
            let got = rows.gather(&slots).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got.len(), slots.len() * DIM, "{what}");
            for (i, &s) in slots.iter().enumerate() {
                let row = &got[i * DIM..(i + 1) * DIM];
                assert!(
                    row.iter().zip(&values[s]).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: slot {s}"
                );
            }
            assert!(rows.gather(&[]).expect("an empty gather").is_empty(), "{what}");
            let past = rows.gather(&[0, ROWS + 5]).unwrap_err();
            assert!(past.to_string().contains(&format!("slot {}", ROWS + 5)), "{what}: {past}");
        }
    }
}

/// The nearest of `rows` (live where `live`) to `point` by the f64 squared distance, the lower
/// slot on equal distances.
fn nearest(rows: &[Vec<f32>], point: &[f32], live: impl Fn(usize) -> bool) -> usize {
    let mut best = (usize::MAX, f64::INFINITY);
    for (s, row) in rows.iter().enumerate().filter(|(s, _)| live(*s)) {
        let d = distance(GpuDistanceMetric::Euclidean, point, row);
        if d < best.1 || best.0 == usize::MAX {
            best = (s, d);
        }
    }
    best.0
}

#[test]
fn nearest_sets_are_knns_sets_with_ties_at_the_nth_near_ties_and_removed_rows() {
    // The CPU override keeps a query's f32 candidates as its set when they are exactly n. The
    // traps: twins and rows on small integer grids (exact ties at the n-th: the lower slots
    // are the set, as knn's), rows one ulp apart (the f32 order may be wrong), removed rows
    // (never in a set), n from 1 to every live row, every metric, and batches searched on the
    // caller's thread and on the pool (the forced paths).
    for context in contexts_with_forced_paths() {
        let mut rng = Rng::new(43);
        for metric in METRICS {
            let check = |what: &str, rows: &dyn RowStore, removed: &[usize], queries: &[f32], n: usize| {
                let values = stored(rows);
                let dim = values[0].len();
                let live: Vec<usize> = (0..rows.len()).filter(|s| !removed.contains(s)).collect();
                let got = rows.nearest_sets(queries, n, metric).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(got.len(), queries.len() / dim * n, "{what} n {n}");
                let knn = rows.knn(queries, n, metric, None).unwrap_or_else(|e| panic!("{what}: {e}"));
                for (q, query) in queries.chunks_exact(dim).enumerate() {
                    let mut set: Vec<usize> = got[q * n..(q + 1) * n].iter().map(|&s| s as usize).collect();
                    set.sort_unstable();
                    let mut want: Vec<usize> =
                        best(metric, &values, query, &live, n).iter().map(|b| b.0).collect();
                    want.sort_unstable();
                    let mut of_knn: Vec<usize> = knn[q].iter().map(|nb| nb.slot).collect();
                    of_knn.sort_unstable();
                    assert_eq!(set, of_knn, "{what} {metric:?} n {n} query {q}: knn's set");
                    // The f64 reference may tie by a last-bit difference of its own sum order:
                    // compare with it only where its n-th and (n+1)-th differ.
                    let scored = best(metric, &values, query, &live, n + 1);
                    if scored.len() <= n || scored[n - 1].1 != scored[n].1 {
                        assert_eq!(set, want, "{what} {metric:?} n {n} query {q}: the exact set");
                    }
                }
            };
            // Random rows (with twins and removed rows: `store`), queries near rows and apart.
            let rows = store(&context, StoragePrecision::F32, &mut rng);
            let queries = rng.normals(20 * DIM);
            for n in [1, 3, 8, 40, ROWS - REMOVED.len()] {
                check(&format!("{} random", describe(&context)), &*rows, &REMOVED, &queries, n);
            }
            let twins: Vec<f32> = stored(&*rows)[..10].iter().flatten().copied().collect();
            check(&format!("{} on twins", describe(&context)), &*rows, &REMOVED, &twins, 2);
            // Small integers: many exact ties at every n-th.
            let dim = 9;
            let grid: Vec<f32> = (0..60 * dim).map(|_| (rng.below(3) as f32) - 1.0).collect();
            let mut rows = context
                .backend()
                .new_rows(dim, StoragePrecision::F32, SearchPrecision::Exact, context.tuning())
                .expect("a row store opens");
            rows.append(&grid).expect("rows append");
            rows.tombstone(&[0, 7, 21]);
            let points: Vec<f32> = (0..30 * dim).map(|_| (rng.below(5) as f32) / 2.0 - 1.0).collect();
            for n in [1, 4, 8, 13] {
                check(&format!("{} grid", describe(&context)), &*rows, &[0, 7, 21], &points, n);
            }
            // Rows one ulp apart in one component, queries near them.
            let dim = 24;
            let base = rng.normals(dim);
            let mut near: Vec<f32> = Vec::new();
            for r in 0..12 {
                let mut row = base.clone();
                row[r % dim] = f32::from_bits(row[r % dim].to_bits() + (r as u32 % 3));
                near.extend(row);
            }
            let points: Vec<f32> = (0..20)
                .flat_map(|_| base.iter().map(|&x| x + 1e-6 * rng.normal()).collect::<Vec<_>>())
                .collect();
            let mut rows = context
                .backend()
                .new_rows(dim, StoragePrecision::F32, SearchPrecision::Exact, context.tuning())
                .expect("a row store opens");
            rows.append(&near).expect("rows append");
            for n in [1, 5] {
                check(&format!("{} rows one ulp apart", describe(&context)), &*rows, &[], &points, n);
            }
        }
        // Errors as knn's: more than the live rows, a partial query, a value that is not finite.
        let rows = store(&context, StoragePrecision::F32, &mut rng);
        let metric = GpuDistanceMetric::Euclidean;
        assert!(
            rows.nearest_sets(&rng.normals(DIM), ROWS, metric).is_err(),
            "{}: n past the live rows",
            describe(&context)
        );
        assert!(
            rows.nearest_sets(&[1.0; DIM + 1], 1, metric).is_err(),
            "{}: a partial query",
            describe(&context)
        );
        let mut nan = rng.normals(DIM);
        nan[5] = f32::NAN;
        assert!(rows.nearest_sets(&nan, 1, metric).is_err(), "{}: NaN", describe(&context));
    }
}

#[test]
fn nearest_rows_is_the_exact_1nn_ties_to_the_lower_slot_near_ties_and_tiny_distances_included() {
    // The CUDA/ROCm override picks from f32 distances and keeps a pick only where the gap to the
    // runner-up proves it. The traps: twins and points halfway between two rows (exact ties,
    // the lower slot wins), rows one ulp apart (the f32 order may be wrong), distances below
    // f32's normal range (all round to zero or subnormals), removed rows (never picked), one
    // row, and shapes that fill no kernel tile (dimensions 1 to 130, 1 to 700 points).
    for context in contexts_with_forced_paths() {
        let open = |dim: usize, precision: StoragePrecision| {
            context
                .backend()
                .new_rows(dim, precision, SearchPrecision::Exact, context.tuning())
                .expect("a row store opens")
        };
        let mut rng = Rng::new(41);
        let check = |what: &str, rows: &dyn RowStore, points: &[f32], live: &dyn Fn(usize) -> bool| {
            let values = stored(rows);
            let dim = values[0].len();
            let got = rows.nearest_rows(points).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got.len(), points.len() / dim, "{what}");
            for (p, point) in points.chunks_exact(dim).enumerate() {
                let want = nearest(&values, point, live);
                assert_eq!(got[p], want, "{what}: point {p}");
            }
        };
        // Random rows and points over shapes on and off the kernel's tiles.
        for (dim, n, count) in [(1, 5, 65), (7, 64, 700), (16, 1, 3), (37, 300, 129), (130, 70, 64)] {
            for precision in [StoragePrecision::F32, StoragePrecision::F16] {
                let what = format!("{} {precision:?} dim {dim} rows {n} points {count}", describe(&context));
                let mut rows = open(dim, precision);
                rows.append(&common::storable(precision, &rng.normals(n * dim))).expect("rows append");
                check(&what, &*rows, &rng.normals(count * dim), &|_| true);
            }
        }
        // Small integers: twins (rows 10..20 repeat 0..10), points on rows and halfway between
        // two rows (exact in f32 and f64, so the distances tie exactly).
        let dim = 9;
        let mut grid: Vec<f32> = (0..40 * dim).map(|_| (rng.below(7) as f32) - 3.0).collect();
        grid.copy_within(0..10 * dim, 10 * dim);
        let mut points: Vec<f32> = Vec::new();
        for i in 0..60 {
            let (a, b) = (rng.below(40), rng.below(40));
            let (a, b) = (&grid[a * dim..(a + 1) * dim], &grid[b * dim..(b + 1) * dim]);
            points.extend(a.iter().zip(b).map(|(&x, &y)| if i % 3 == 0 { x } else { (x + y) / 2.0 }));
        }
        let mut rows = open(dim, StoragePrecision::F32);
        rows.append(&grid).expect("rows append");
        check(&format!("{} ties", describe(&context)), &*rows, &points, &|_| true);
        // The same rows with the nearest of several points removed: never picked.
        rows.tombstone(&[0, 5, 12, 33]);
        let live = |s: usize| ![0, 5, 12, 33].contains(&s);
        check(&format!("{} ties, removed rows", describe(&context)), &*rows, &points, &live);
        // Rows one ulp apart in one component, points near them.
        let dim = 24;
        let base = rng.normals(dim);
        let mut near: Vec<f32> = Vec::new();
        for r in 0..8 {
            let mut row = base.clone();
            row[r % dim] = f32::from_bits(row[r % dim].to_bits() + (r as u32 % 3));
            near.extend(row);
        }
        let points: Vec<f32> =
            (0..40).flat_map(|_| base.iter().map(|&x| x + 1e-6 * rng.normal()).collect::<Vec<_>>()).collect();
        let mut rows = open(dim, StoragePrecision::F32);
        rows.append(&near).expect("rows append");
        check(&format!("{} rows one ulp apart", describe(&context)), &*rows, &points, &|_| true);
        // Distances below f32's normal range: every f32 distance is zero or subnormal.
        for scale in [1e-22f32, 1e-30] {
            let tiny: Vec<f32> = rng.normals(50 * dim).iter().map(|&x| x * scale).collect();
            let points: Vec<f32> = rng.normals(30 * dim).iter().map(|&x| x * scale).collect();
            let mut rows = open(dim, StoragePrecision::F32);
            rows.append(&tiny).expect("rows append");
            check(&format!("{} scale {scale:e}", describe(&context)), &*rows, &points, &|_| true);
        }
        // A point of the wrong length is an error, as knn's.
        let rows = open(4, StoragePrecision::F32);
        assert!(rows.nearest_rows(&[1.0; 4]).is_err(), "{}: no rows", describe(&context));
        let mut rows = open(4, StoragePrecision::F32);
        rows.append(&[0.0; 8]).expect("rows append");
        assert!(rows.nearest_rows(&[1.0; 6]).is_err(), "{}: a partial point", describe(&context));
        assert!(rows.nearest_rows(&[f32::NAN, 0.0, 0.0, 0.0]).is_err(), "{}: NaN", describe(&context));
    }
}

#[test]
fn knn_restricted_to_a_slot_set_equals_a_brute_force_over_its_live_members() {
    for context in contexts_with_forced_paths() {
        for precision in StoragePrecision::ALL {
            let mut rng = Rng::new(31);
            let rows = store(&context, precision, &mut rng);
            let values = stored(&*rows);
            // Every third row, the removed ones and the twins of rows 0..10 among them.
            let allowed = SlotSet::from_slots(ROWS, (0..ROWS).filter(|s| s % 3 == 0 || REMOVED.contains(s)));
            let members: Vec<usize> = allowed.iter().filter(|&s| live(s)).collect();
            let nq = 9;
            let queries = rng.normals(nq * DIM);
            for metric in METRICS {
                for k in [1, 10, members.len()] {
                    let what = format!("{} {precision:?} {metric:?} k={k}", describe(&context));
                    let got = rows
                        .knn(&queries, k, metric, Some(&allowed))
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    for (q, found) in got.iter().enumerate() {
                        let query = &queries[q * DIM..(q + 1) * DIM];
                        let want = best(metric, &values, query, &members, k);
                        assert_same(&format!("{what} query {q}"), metric, &values, query, found, &want);
                    }
                }
            }
        }
    }
}

#[test]
fn knn_refuses_a_query_that_is_not_finite_on_every_path_and_answers_the_next_one() {
    // On CUDA a single query over a few thousand rows takes a pass of its own (the few-rows
    // pass), which once ranked NaN distances instead of refusing the query, as did the Vulkan
    // backend's single query over few rows; filters and batches take other paths. Every one of
    // them must refuse a NaN or infinite component by name and leave the store answering
    // exactly.
    let refused = |what: &str, outcome: hive_gpu::Result<Vec<Vec<Neighbor>>>, query: usize| match outcome {
        Err(e @ hive_gpu::HiveGpuError::InvalidArgument(_)) => {
            let message = e.to_string();
            assert!(message.contains(&format!("query {query} has a non-finite value")), "{what}: {message}");
        }
        Err(e) => panic!("{what}: refused as {e:?}, not as an invalid argument"),
        Ok(_) => panic!("{what}: answered"),
    };
    for context in contexts_with_forced_paths() {
        for precision in [StoragePrecision::F32, StoragePrecision::F16] {
            for n in [2, ROWS, 3000] {
                let mut rng = Rng::new(43);
                let values = common::storable(precision, &rng.normals(n * DIM));
                let mut rows = context
                    .backend()
                    .new_rows(DIM, precision, SearchPrecision::Exact, context.tuning())
                    .expect("a row store opens");
                rows.append(&values).expect("rows append");
                let every = SlotSet::from_slots(n, 0..n);
                let good = rng.normals(9 * DIM);
                for metric in METRICS {
                    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                        let what = format!("{} {precision:?} rows {n} {metric:?} {bad}", describe(&context));
                        let mut one = good[..DIM].to_vec();
                        one[DIM / 2] = bad;
                        let mut batch = good.clone();
                        batch[4 * DIM + 1] = bad;
                        refused(&format!("{what}: one query"), rows.knn(&one, 1, metric, None), 0);
                        refused(
                            &format!("{what}: filtered"),
                            rows.knn(&one, 2.min(n), metric, Some(&every)),
                            0,
                        );
                        refused(
                            &format!("{what}: a batch of 9"),
                            rows.knn(&batch, 2.min(n), metric, None),
                            4,
                        );
                    }
                    let what = format!("{} {precision:?} rows {n} {metric:?}", describe(&context));
                    let stored = stored(&*rows);
                    let all: Vec<usize> = (0..n).collect();
                    let found = rows.knn(&good, 1, metric, None).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(found.len(), 9, "{what}: the next batch is answered");
                    for (q, got) in found.iter().enumerate() {
                        let query = &good[q * DIM..(q + 1) * DIM];
                        let want = best(metric, &stored, query, &all, 1);
                        assert_same(&format!("{what} query {q}"), metric, &stored, query, got, &want);
                    }
                }
            }
        }
    }
}

#[test]
fn knn_whose_first_tile_holds_removed_nearest_rows_and_ties_at_the_kth_stays_exact() {
    // The GPU tile selection bounds each query's k-th best by the first tile itself (the k-th
    // smallest of its threads' least distances) before pushing any candidate. The trap: a
    // bound taken over removed rows, or over fewer than k distinct rows, would drop true
    // neighbours. Here every query's 6 nearest rows are removed, blocks of exact duplicates
    // tie at every rank, and every row fits one tile.
    const N: usize = 4096;
    for context in contexts_with_forced_paths() {
        for precision in StoragePrecision::ALL {
            let mut rng = Rng::new(47);
            let nq = 33;
            let queries = rng.normals(nq * DIM);
            let mut values = rng.normals(N * DIM);
            // Rows 2048..2560 repeat rows 0..512 and rows 3000..3064 repeat row 7 64 times.
            values.copy_within(0..512 * DIM, 2048 * DIM);
            for r in 3000..3064 {
                values.copy_within(7 * DIM..8 * DIM, r * DIM);
            }
            let values = common::storable(precision, &values);
            let mut rows = context
                .backend()
                .new_rows(DIM, precision, SearchPrecision::Exact, context.tuning())
                .expect("a row store opens");
            rows.append(&values).expect("rows append");
            let values = stored(&*rows);
            let all: Vec<usize> = (0..N).collect();
            for metric in METRICS {
                let mut removed: Vec<usize> = (0..nq)
                    .flat_map(|q| best(metric, &values, &queries[q * DIM..(q + 1) * DIM], &all, 6))
                    .map(|(s, _)| s)
                    .collect();
                removed.sort_unstable();
                removed.dedup();
                let mut rows = context
                    .backend()
                    .new_rows(DIM, precision, SearchPrecision::Exact, context.tuning())
                    .expect("a row store opens");
                rows.append(&values.concat()).expect("rows append");
                rows.tombstone(&removed);
                let live: Vec<usize> = (0..N).filter(|s| removed.binary_search(s).is_err()).collect();
                for k in [1, 4, 10, 100] {
                    let what = format!("{} {precision:?} {metric:?} k={k}", describe(&context));
                    let got = rows.knn(&queries, k, metric, None).unwrap_or_else(|e| panic!("{what}: {e}"));
                    for (q, found) in got.iter().enumerate() {
                        let query = &queries[q * DIM..(q + 1) * DIM];
                        let want = best(metric, &values, query, &live, k);
                        assert_same(&format!("{what} query {q}"), metric, &values, query, found, &want);
                    }
                }
            }
        }
    }
}

/// The scan distance `backend::codes` documents, in f64: Euclidean to the decoded vector, or its
/// negated inner product.
fn code_distance(
    metric: GpuDistanceMetric,
    query: &[f32],
    centroid: &[f32],
    base: &[f32],
    step: &[f32],
    codes: &[u8],
) -> f64 {
    let decoded = (0..query.len())
        .map(|d| f64::from(centroid[d]) + f64::from(base[d]) + f64::from(step[d]) * f64::from(codes[d]));
    match metric {
        GpuDistanceMetric::Euclidean => decoded.zip(query).map(|(x, &q)| (f64::from(q) - x).powi(2)).sum(),
        _ => -decoded.zip(query).map(|(x, &q)| f64::from(q) * x).sum::<f64>(),
    }
}

#[test]
fn scan_codes_ranks_by_the_documented_code_distance_skipping_removed_and_filtered_rows() {
    let (lists, nprobe, nq) = (6, 2, 9);
    let mut rng = Rng::new(91);
    // Slots dealt round the lists out of order; some lists empty of live rows.
    let mut slots: Vec<Vec<u32>> = vec![Vec::new(); lists];
    for s in 0..ROWS as u32 {
        slots[(s as usize * 7 + 3) % (lists - 1)].push(s);
    }
    let centroids = rng.normals(lists * DIM);
    let base: Vec<f32> = rng.normals(DIM).iter().map(|x| x - 1.0).collect();
    let step: Vec<f32> = (0..DIM).map(|d| if d == 5 { 0.0 } else { 0.01 + 0.001 * d as f32 }).collect();
    let codes: Vec<ListCodes> = slots
        .iter()
        .map(|list| {
            let mut out = ListCodes::default();
            for _ in list {
                let row: Vec<u8> = (0..DIM).map(|_| rng.below(256) as u8).collect();
                let norm: f64 = (0..DIM)
                    .map(|d| (f64::from(base[d]) + f64::from(step[d]) * f64::from(row[d])).powi(2))
                    .sum();
                out.codes.extend_from_slice(&row);
                out.norms.push(norm as f32);
            }
            out
        })
        .collect();
    let removed = SlotSet::from_slots(ROWS, REMOVED);
    let allowed = SlotSet::from_slots(ROWS, (0..ROWS).filter(|s| s % 3 != 0));
    let probes: Vec<u32> = (0..nq).flat_map(|q| [(q % lists) as u32, ((q + 2) % lists) as u32]).collect();
    for context in contexts_with_forced_paths() {
        let rows = context
            .backend()
            .new_rows(DIM, StoragePrecision::F32, SearchPrecision::Exact, context.tuning())
            .expect("a row store opens");
        let copied = ListProbes::next_generation();
        for metric in METRICS {
            for filter in [None, Some(&allowed)] {
                let mut queries = rng.normals(nq * DIM);
                if metric == GpuDistanceMetric::Cosine {
                    for q in queries.chunks_exact_mut(DIM) {
                        let n = q.iter().map(|x| x * x).sum::<f32>().sqrt();
                        q.iter_mut().for_each(|x| *x /= n);
                    }
                }
                // Without a generation the codes are read afresh; with one a backend may scan
                // its own copy of them (the CPU backend's packed codes, a GPU's device copy).
                for (k, generation) in [(1, 0), (7, 0), (400, 0), (1, copied), (7, copied), (400, copied)] {
                    let what = format!(
                        "{} {metric:?} filtered {} k {k} generation {generation}",
                        describe(&context),
                        filter.is_some()
                    );
                    let scan = CodeScan {
                        dim: DIM,
                        metric,
                        queries: &queries,
                        centroids: &centroids,
                        base: &base,
                        step: &step,
                        slots: &slots,
                        codes: &codes,
                        probes: &probes,
                        nprobe,
                        removed: &removed,
                        allowed: filter,
                        generation,
                        lineage: 0,
                    };
                    if metric.is_difference_norm() {
                        // No quantizer decomposes L1 or L-infinity: refused by name, never mis-scored.
                        let e = rows.scan_codes(&scan, k).expect_err("refused").to_string();
                        assert!(e.contains("no scalar-quantized distance"), "{what}: {e}");
                        continue;
                    }
                    let found = rows.scan_codes(&scan, k).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(found.len(), nq, "{what}");
                    for (q, got) in found.iter().enumerate() {
                        let query = &queries[q * DIM..(q + 1) * DIM];
                        let mut want: Vec<(usize, f64)> = Vec::new();
                        for &l in &probes[q * nprobe..(q + 1) * nprobe] {
                            let l = l as usize;
                            for (i, &slot) in slots[l].iter().enumerate() {
                                let s = slot as usize;
                                if removed.contains(s) || filter.is_some_and(|a| !a.contains(s)) {
                                    continue;
                                }
                                let c = &codes[l].codes[i * DIM..(i + 1) * DIM];
                                want.push((
                                    s,
                                    code_distance(
                                        metric,
                                        query,
                                        &centroids[l * DIM..(l + 1) * DIM],
                                        &base,
                                        &step,
                                        c,
                                    ),
                                ));
                            }
                        }
                        want.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                        want.truncate(k);
                        assert_eq!(got.len(), want.len(), "{what}: query {q}");
                        let scale = want.iter().map(|w| w.1.abs()).fold(1.0, f64::max);
                        let tolerance = 1e-5 * scale;
                        let kth = want.last().map_or(f64::INFINITY, |w| w.1);
                        for (n, w) in got.iter().zip(&want) {
                            assert!(
                                (n.distance - w.1).abs() <= tolerance,
                                "{what}: query {q}: {} vs {}",
                                n.distance,
                                w.1
                            );
                            assert!(
                                !removed.contains(n.slot) && filter.is_none_or(|a| a.contains(n.slot)),
                                "{what}: slot {}",
                                n.slot
                            );
                            let own = want.iter().find(|x| x.0 == n.slot).map_or(kth + 1.0, |x| x.1);
                            assert!(
                                own <= kth + tolerance,
                                "{what}: query {q}: slot {} is not among the best",
                                n.slot
                            );
                        }
                        assert!(
                            got.windows(2).all(|p| p[0].distance <= p[1].distance),
                            "{what}: out of order"
                        );
                    }
                }
            }
        }
        // Shapes that do not fit are refused by name.
        let bad_probe = [lists as u32; 2];
        let scan = CodeScan {
            dim: DIM,
            metric: GpuDistanceMetric::Euclidean,
            queries: &rng.normals(DIM),
            centroids: &centroids,
            base: &base,
            step: &step,
            slots: &slots,
            codes: &codes,
            probes: &bad_probe,
            nprobe,
            removed: &removed,
            allowed: None,
            generation: 0,
            lineage: 0,
        };
        let e = rows.scan_codes(&scan, 3).unwrap_err().to_string();
        assert!(e.contains("scan_codes") && e.contains("list 6"), "{e}");
    }
}

#[test]
fn scan_bits_ranks_by_hamming_distance_ties_by_slot_skipping_removed_and_filtered_rows() {
    let (lists, nprobe, nq) = (4, 2, 7);
    let mut rng = Rng::new(93);
    let mut slots: Vec<Vec<u32>> = vec![Vec::new(); lists];
    for s in (0..ROWS as u32).rev() {
        slots[(s as usize * 5 + 1) % (lists - 1)].push(s);
    }
    let centroids = rng.normals(lists * DIM);
    // Rows near a few patterns, so that Hamming distances tie often.
    let patterns: Vec<Vec<f32>> = (0..6).map(|_| rng.normals(DIM)).collect();
    let mut values: Vec<Vec<f32>> = vec![Vec::new(); ROWS];
    let codes: Vec<Vec<u64>> = slots
        .iter()
        .enumerate()
        .map(|(l, list)| {
            let mut out = Vec::new();
            for &s in list {
                let v: Vec<f32> =
                    patterns[s as usize % 6].iter().zip(rng.normals(DIM)).map(|(p, e)| p + 0.2 * e).collect();
                bits::pack(&v, &centroids[l * DIM..(l + 1) * DIM], &mut out);
                values[s as usize] = v;
            }
            out
        })
        .collect();
    let removed = SlotSet::from_slots(ROWS, REMOVED);
    let allowed = SlotSet::from_slots(ROWS, (0..ROWS).filter(|s| s % 4 != 1));
    let probes: Vec<u32> = (0..nq).flat_map(|q| [(q % lists) as u32, ((q + 1) % lists) as u32]).collect();
    let queries = rng.normals(nq * DIM);
    for context in contexts_with_forced_paths() {
        let rows = context
            .backend()
            .new_rows(DIM, StoragePrecision::F32, SearchPrecision::Exact, context.tuning())
            .expect("a row store opens");
        for filter in [None, Some(&allowed)] {
            for k in [1, 9, 500] {
                let what = format!("{} filtered {} k {k}", describe(&context), filter.is_some());
                let scan = BitScan {
                    dim: DIM,
                    queries: &queries,
                    centroids: &centroids,
                    slots: &slots,
                    codes: &codes,
                    probes: &probes,
                    nprobe,
                    removed: &removed,
                    allowed: filter,
                    generation: 0,
                };
                let found = rows.scan_bits(&scan, k).unwrap_or_else(|e| panic!("{what}: {e}"));
                for (q, got) in found.iter().enumerate() {
                    let query = &queries[q * DIM..(q + 1) * DIM];
                    let mut want: Vec<(f64, usize)> = Vec::new();
                    for &l in &probes[q * nprobe..(q + 1) * nprobe] {
                        let centroid = &centroids[l as usize * DIM..(l as usize + 1) * DIM];
                        for &s in &slots[l as usize] {
                            let s = s as usize;
                            if removed.contains(s) || filter.is_some_and(|a| !a.contains(s)) {
                                continue;
                            }
                            // Components on different sides of the centroid, counted one by one.
                            let differ = (0..DIM)
                                .filter(|&d| (values[s][d] > centroid[d]) != (query[d] > centroid[d]))
                                .count();
                            want.push((differ as f64, s));
                        }
                    }
                    want.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    want.truncate(k);
                    let got: Vec<(f64, usize)> = got.iter().map(|n| (n.distance, n.slot)).collect();
                    assert_eq!(got, want, "{what}: query {q}");
                }
            }
        }
        let short = [codes[0].clone(), Vec::new(), Vec::new(), Vec::new()];
        let scan = BitScan {
            dim: DIM,
            queries: &queries,
            centroids: &centroids,
            slots: &slots,
            codes: &short,
            probes: &probes,
            nprobe,
            removed: &removed,
            allowed: None,
            generation: 0,
        };
        let e = rows.scan_bits(&scan, 3).unwrap_err().to_string();
        assert!(e.contains("scan_bits") && e.contains("list 1"), "{e}");
    }
}

#[test]
fn scan_pq_ranks_by_the_documented_lookup_table_distance_for_4_and_8_bit_codes() {
    let (dim, lists, nprobe, nq) = (36, 5, 2, 8);
    let mut rng = Rng::new(95);
    let mut slots: Vec<Vec<u32>> = vec![Vec::new(); lists];
    for s in 0..ROWS as u32 {
        slots[(s as usize * 3 + 2) % (lists - 1)].push(s);
    }
    let centroids = rng.normals(lists * dim);
    let removed = SlotSet::from_slots(ROWS, REMOVED);
    let allowed = SlotSet::from_slots(ROWS, (0..ROWS).filter(|s| s % 5 != 2));
    let probes: Vec<u32> = (0..nq).flat_map(|q| [(q % lists) as u32, ((q + 3) % lists) as u32]).collect();
    for (m, bits) in [(9, 8), (12, 4), (9, 4), (36, 4), (1, 8)] {
        let (sub, ksub) = (dim / m, 1usize << bits);
        let codebooks = rng.normals(ksub * dim);
        // Each row's codes and its decoded residual (the codebook centroids its codes name).
        let mut decoded: Vec<Vec<f32>> = vec![Vec::new(); ROWS];
        let codes: Vec<ListCodes> = slots
            .iter()
            .enumerate()
            .map(|(l, list)| {
                let mut out = ListCodes::default();
                for &s in list {
                    let named: Vec<usize> = (0..m).map(|_| rng.below(ksub)).collect();
                    let mut row = vec![0u8; pq::code_bytes(m, bits)];
                    for (j, &c) in named.iter().enumerate() {
                        if bits == 4 {
                            row[j / 2] |= (c as u8) << (4 * (j % 2));
                        } else {
                            row[j] = c as u8;
                        }
                    }
                    let r: Vec<f32> = named
                        .iter()
                        .enumerate()
                        .flat_map(|(j, &c)| {
                            codebooks[(j * ksub + c) * sub..(j * ksub + c + 1) * sub].to_vec()
                        })
                        .collect();
                    let centroid = &centroids[l * dim..(l + 1) * dim];
                    let term: f64 = r
                        .iter()
                        .zip(centroid)
                        .map(|(&x, &c)| f64::from(x) * f64::from(x) + 2.0 * f64::from(c) * f64::from(x))
                        .sum();
                    out.codes.extend_from_slice(&row);
                    out.norms.push(term as f32);
                    decoded[s as usize] = r;
                }
                out
            })
            .collect();
        for context in contexts_with_forced_paths() {
            let rows = context
                .backend()
                .new_rows(dim, StoragePrecision::F32, SearchPrecision::Exact, context.tuning())
                .expect("a row store opens");
            for metric in METRICS {
                let mut queries = rng.normals(nq * dim);
                if metric == GpuDistanceMetric::Cosine {
                    for q in queries.chunks_exact_mut(dim) {
                        let n = q.iter().map(|x| x * x).sum::<f32>().sqrt();
                        q.iter_mut().for_each(|x| *x /= n);
                    }
                }
                for filter in [None, Some(&allowed)] {
                    for k in [1, 6, 400] {
                        let what = format!(
                            "{} m {m} bits {bits} {metric:?} filtered {} k {k}",
                            describe(&context),
                            filter.is_some()
                        );
                        let scan = PqScan {
                            dim,
                            metric,
                            queries: &queries,
                            centroids: &centroids,
                            m,
                            bits,
                            codebooks: &codebooks,
                            slots: &slots,
                            codes: &codes,
                            probes: &probes,
                            nprobe,
                            removed: &removed,
                            allowed: filter,
                            generation: 0,
                        };
                        if metric.is_difference_norm() {
                            // No quantizer decomposes L1 or L-infinity: refused by name, never mis-scored.
                            let e = rows.scan_pq(&scan, k).expect_err("refused").to_string();
                            assert!(e.contains("no product-quantized distance"), "{what}: {e}");
                            continue;
                        }
                        let found = rows.scan_pq(&scan, k).unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(found.len(), nq, "{what}");
                        for (q, got) in found.iter().enumerate() {
                            let query = &queries[q * dim..(q + 1) * dim];
                            let mut want: Vec<(usize, f64)> = Vec::new();
                            for &l in &probes[q * nprobe..(q + 1) * nprobe] {
                                let centroid = &centroids[l as usize * dim..(l as usize + 1) * dim];
                                for &slot in &slots[l as usize] {
                                    let s = slot as usize;
                                    if removed.contains(s) || filter.is_some_and(|a| !a.contains(s)) {
                                        continue;
                                    }
                                    // The row as the vector it stands for, scored in f64.
                                    let x = centroid
                                        .iter()
                                        .zip(&decoded[s])
                                        .map(|(&c, &r)| f64::from(c) + f64::from(r));
                                    let d = match metric {
                                        GpuDistanceMetric::Euclidean => {
                                            x.zip(query).map(|(x, &q)| (f64::from(q) - x).powi(2)).sum()
                                        }
                                        _ => -x.zip(query).map(|(x, &q)| f64::from(q) * x).sum::<f64>(),
                                    };
                                    want.push((s, d));
                                }
                            }
                            want.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                            want.truncate(k);
                            assert_eq!(got.len(), want.len(), "{what}: query {q}");
                            let scale = want.iter().map(|w| w.1.abs()).fold(1.0, f64::max);
                            let tolerance = 1e-5 * scale;
                            let kth = want.last().map_or(f64::INFINITY, |w| w.1);
                            for (n, w) in got.iter().zip(&want) {
                                assert!(
                                    (n.distance - w.1).abs() <= tolerance,
                                    "{what}: query {q}: {} vs {}",
                                    n.distance,
                                    w.1
                                );
                                let own = want.iter().find(|x| x.0 == n.slot).map_or(kth + 1.0, |x| x.1);
                                assert!(
                                    own <= kth + tolerance,
                                    "{what}: query {q}: slot {} is not among the best",
                                    n.slot
                                );
                            }
                            assert!(
                                got.windows(2).all(|p| p[0].distance <= p[1].distance),
                                "{what}: out of order"
                            );
                        }
                    }
                }
            }
            // Shapes that do not fit are refused by name: m not dividing the dimension, a short
            // list of codes.
            let queries = rng.normals(nq * dim);
            let mut scan = PqScan {
                dim,
                metric: GpuDistanceMetric::Euclidean,
                queries: &queries,
                centroids: &centroids,
                m: 7,
                bits,
                codebooks: &codebooks,
                slots: &slots,
                codes: &codes,
                probes: &probes,
                nprobe,
                removed: &removed,
                allowed: None,
                generation: 0,
            };
            let e = rows.scan_pq(&scan, 3).unwrap_err().to_string();
            assert!(e.contains("scan_pq") && e.contains("divide"), "{e}");
            scan.m = m;
            let mut short = codes.clone();
            short[2].codes.pop();
            scan.codes = &short;
            let e = rows.scan_pq(&scan, 3).unwrap_err().to_string();
            assert!(e.contains("scan_pq") && e.contains("list 2"), "{e}");
        }
    }
}

#[test]
fn a_row_store_of_an_integer_type_refuses_values_it_cannot_hold_and_stays_as_it_was() {
    for context in contexts_with_forced_paths() {
        for precision in [StoragePrecision::I8, StoragePrecision::U8] {
            let what = format!("{} {precision:?}", describe(&context));
            let mut rows = context
                .backend()
                .new_rows(3, precision, SearchPrecision::Exact, context.tuning())
                .expect("a row store opens");
            rows.append(&[1.0, 2.0, 3.0]).unwrap_or_else(|e| panic!("{what}: {e}"));
            for bad in [[1.0, 2.5, 3.0], [1.0, 2.0, 300.0], [f32::NAN, 0.0, 0.0], [-129.0, 0.0, 0.0]] {
                let e = rows.append(&bad).expect_err(&what).to_string();
                assert!(e.contains("is not an integer"), "{what}: {e}");
            }
            assert_eq!(rows.len(), 1, "{what}: a refused append added rows");
            assert_eq!(rows.read_row(0).unwrap(), vec![1.0, 2.0, 3.0], "{what}");
        }
    }
}

/// The list [`coded_lists`] files `slot` in.
fn home(slot: usize, lists: usize) -> usize {
    (slot * 7 + 2) % lists
}

/// Lists of slots and, per list, SQ8 codes, PQ codes (one sub-quantizer of 8 bits) and binary
/// codes of their rows.
struct CodedLists {
    slots: Vec<Vec<u32>>,
    sq8: Vec<ListCodes>,
    pq1: Vec<ListCodes>,
    bits: Vec<Vec<u64>>,
}

/// SQ8, PQ and binary codes over `lists` lists of the slots `0..ROWS`, each filed once, or,
/// with `repeat`, slot 42 filed in two lists: random codes (what the scan nominates is checked
/// against the documented distances above; here only what the refine makes of it).
fn coded_lists(rng: &mut Rng, lists: usize, repeat: bool) -> CodedLists {
    let mut slots: Vec<Vec<u32>> = vec![Vec::new(); lists];
    for s in 0..ROWS as u32 {
        slots[home(s as usize, lists)].push(s);
    }
    if repeat {
        slots[(home(42, lists) + 1) % lists].push(42);
    }
    let mut sq8 = Vec::new();
    let mut pq1 = Vec::new();
    let mut bits = Vec::new();
    let centroid = vec![0.0f32; DIM];
    for list in &slots {
        let (mut s, mut p, mut b) = (ListCodes::default(), ListCodes::default(), Vec::new());
        for _ in list {
            s.codes.extend((0..DIM).map(|_| rng.below(256) as u8));
            s.norms.push(rng.normals(1)[0].abs() * 10.0);
            p.codes.push(rng.below(256) as u8);
            p.norms.push(rng.normals(1)[0]);
            bits::pack(&rng.normals(DIM), &centroid, &mut b);
        }
        sq8.push(s);
        pq1.push(p);
        bits.push(b);
    }
    CodedLists { slots, sq8, pq1, bits }
}

#[test]
fn scan_and_refine_is_the_exact_best_of_the_scans_nominees_never_a_repeated_or_removed_row() {
    let (lists, nprobe, nq) = (5, 2, 11);
    let mut rng = Rng::new(97);
    let centroids = rng.normals(lists * DIM);
    let base: Vec<f32> = rng.normals(DIM).iter().map(|x| x - 1.0).collect();
    let step: Vec<f32> = (0..DIM).map(|d| 0.01 + 0.001 * d as f32).collect();
    let codebooks = rng.normals(256 * DIM);
    let removed = SlotSet::from_slots(ROWS, REMOVED);
    let allowed = SlotSet::from_slots(ROWS, (0..ROWS).filter(|s| s % 3 != 1));
    // Query q probes lists q and q + 1, except the last, which probes row 1's list twice: its
    // rows are nominated twice (the scans accept it).
    let twice = home(1, lists) as u32;
    let probes: Vec<u32> =
        (0..nq)
            .flat_map(|q| {
                if q == nq - 1 { [twice, twice] } else { [(q % lists) as u32, ((q + 1) % lists) as u32] }
            })
            .collect();
    for repeat in [false, true] {
        let CodedLists { slots, sq8, pq1, bits: bit_codes } = coded_lists(&mut rng, lists, repeat);
        for context in contexts_with_forced_paths() {
            for precision in StoragePrecision::ALL {
                let rows = store(&context, precision, &mut rng);
                let values = stored(&*rows);
                for metric in METRICS {
                    let mut exact = rng.normals(nq * DIM);
                    // The query probing both lists slot 42 is filed in (with `repeat`) is row
                    // 42 itself: a repeat of it would rank first twice. The last query is row
                    // 1, in the list it probes twice.
                    let q42 = home(42, lists);
                    exact[q42 * DIM..(q42 + 1) * DIM].copy_from_slice(&values[42]);
                    exact[(nq - 1) * DIM..nq * DIM].copy_from_slice(&values[1]);
                    // The scan gets unit queries under cosine (as IVF hands them), the refine
                    // the exact ones; under the other metrics both get the same slice.
                    let unit: Vec<f32> = exact
                        .chunks_exact(DIM)
                        .flat_map(|q| {
                            let n = q.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
                            q.iter().map(move |x| (f64::from(*x) / n) as f32)
                        })
                        .collect();
                    let scanned = if metric == GpuDistanceMetric::Cosine { &unit } else { &exact };
                    for filter in [None, Some(&allowed)] {
                        for (wanted, k) in [(1, 1), (8, 3), (40, 10), (ROWS, 10)] {
                            let sq8_scan = CodeScan {
                                dim: DIM,
                                metric,
                                queries: scanned,
                                centroids: &centroids,
                                base: &base,
                                step: &step,
                                slots: &slots,
                                codes: &sq8,
                                probes: &probes,
                                nprobe,
                                removed: &removed,
                                allowed: filter,
                                generation: 0,
                                lineage: 0,
                            };
                            let pq_scan = PqScan {
                                dim: DIM,
                                metric,
                                queries: scanned,
                                centroids: &centroids,
                                m: 1,
                                bits: 8,
                                codebooks: &codebooks,
                                slots: &slots,
                                codes: &pq1,
                                probes: &probes,
                                nprobe,
                                removed: &removed,
                                allowed: filter,
                                generation: 0,
                            };
                            let bit_scan = BitScan {
                                dim: DIM,
                                queries: scanned,
                                centroids: &centroids,
                                slots: &slots,
                                codes: &bit_codes,
                                probes: &probes,
                                nprobe,
                                removed: &removed,
                                allowed: filter,
                                generation: 0,
                            };
                            let mut scans = vec![("bits", QuantizedScan::Bits(bit_scan))];
                            // No quantizer decomposes L1 or L-infinity (their scans refuse them).
                            if !metric.is_difference_norm() {
                                scans.push(("sq8", QuantizedScan::Sq8(sq8_scan)));
                                scans.push(("pq", QuantizedScan::Pq(pq_scan)));
                            }
                            for (kind, scan) in scans {
                                let what = format!(
                                    "{} {precision:?} {metric:?} {kind} repeat {repeat} filtered {} wanted {wanted} k {k}",
                                    describe(&context),
                                    filter.is_some()
                                );
                                let nominated = match &scan {
                                    QuantizedScan::Sq8(s) => rows.scan_codes(s, wanted),
                                    QuantizedScan::Pq(s) => rows.scan_pq(s, wanted),
                                    QuantizedScan::Bits(s) => rows.scan_bits(s, wanted),
                                }
                                .unwrap_or_else(|e| panic!("{what}: scan: {e}"));
                                if wanted == ROWS {
                                    // What makes the trap: every row of the probed lists is
                                    // nominated, row 42 once per list holding it.
                                    let times = nominated[q42].iter().filter(|n| n.slot == 42).count();
                                    assert_eq!(times, 1 + usize::from(repeat), "{what}: row 42 nominated");
                                }
                                let got = rows
                                    .scan_and_refine(scan, wanted, &exact, k, metric)
                                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                                assert_eq!(got.len(), nq, "{what}");
                                for q in 0..nq {
                                    let query = &exact[q * DIM..(q + 1) * DIM];
                                    let alive: Vec<usize> =
                                        nominated[q].iter().map(|n| n.slot).filter(|&s| live(s)).collect();
                                    let want = best(metric, &values, query, &alive, k);
                                    assert_same(
                                        &format!("{what} query {q}"),
                                        metric,
                                        &values,
                                        query,
                                        &got[q],
                                        &want,
                                    );
                                    let mut seen: Vec<usize> = got[q].iter().map(|n| n.slot).collect();
                                    seen.sort_unstable();
                                    seen.dedup();
                                    assert_eq!(seen.len(), got[q].len(), "{what} query {q}: a row twice");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A backend may keep what it derived from a filter (the passing rows gathered, the skip words
/// on a device) for the next search of the same set, so the same `SlotSet`s are searched again
/// after each kind of change to the rows: a repeat (what was kept must still be right), rows
/// removed (the two nearest allowed rows of query 0), a truncation, an append that restores the
/// length with new contents (the removed set too is then as before: only a record of the change
/// can tell), and an append past the sets' slots (whose rows neither set allows). Two sets: most
/// rows (a masked scan), and 18 of 300 (a gather small enough to be kept, where the forced
/// gather path takes it). Every answer equals an f64 brute force over the live allowed rows as
/// they are then.
#[test]
fn knn_with_one_slot_set_after_each_change_of_the_rows_never_serves_what_an_earlier_search_kept() {
    for context in contexts_with_forced_paths() {
        for precision in [StoragePrecision::F32, StoragePrecision::F16, StoragePrecision::Bf16] {
            for metric in [GpuDistanceMetric::Euclidean, GpuDistanceMetric::Cosine] {
                let what = format!("{} {precision:?} {metric:?}", describe(&context));
                let mut rng = Rng::new(47);
                let mut rows = store(&context, precision, &mut rng);
                let wide = SlotSet::from_slots(ROWS, (0..ROWS).filter(|s| s % 4 != 1));
                let narrow = SlotSet::from_slots(ROWS, (0..ROWS).filter(|s| s % 17 == 0));
                assert_eq!(narrow.count(), 18);
                let nq = 70;
                let queries = rng.normals(nq * DIM);
                let mut removed = REMOVED.to_vec();
                // The answers of the whole batch under each set, wide first.
                let check = |rows: &dyn RowStore, removed: &[usize], step: &str| -> [Vec<Vec<Neighbor>>; 2] {
                    let values = stored(rows);
                    [&wide, &narrow].map(|allowed| {
                        let members: Vec<usize> =
                            allowed.iter().filter(|s| *s < rows.len() && !removed.contains(s)).collect();
                        let mut answers = Vec::new();
                        for batch in [1, nq] {
                            let got = rows
                                .knn(&queries[..batch * DIM], 5, metric, Some(allowed))
                                .unwrap_or_else(|e| panic!("{what} {step}: {e}"));
                            for (q, found) in got.iter().enumerate() {
                                let query = &queries[q * DIM..(q + 1) * DIM];
                                let want = best(metric, &values, query, &members, 5);
                                let case = format!(
                                    "{what} {step} set of {} batch {batch} query {q}",
                                    allowed.count()
                                );
                                assert_same(&case, metric, &values, query, found, &want);
                            }
                            answers = got;
                        }
                        answers
                    })
                };
                check(&*rows, &removed, "first search");
                let [again, _] = check(&*rows, &removed, "the same sets again");
                // The two nearest allowed rows of query 0 removed.
                let nearest: Vec<usize> = again[0].iter().take(2).map(|n| n.slot).collect();
                rows.tombstone(&nearest);
                removed.extend(&nearest);
                let [after, _] = check(&*rows, &removed, "after removing the nearest");
                assert!(
                    after[0].iter().all(|n| !nearest.contains(&n.slot)),
                    "{what}: a removed row came back"
                );
                // The last 30 rows replaced by copies of queries, twice: searched after the
                // truncation and after the append, the second time with no replaced slot removed
                // before or after.
                for (round, first_query) in [(1, 0), (2, 30)] {
                    rows.truncate(ROWS - 30);
                    removed.retain(|&s| s < ROWS - 30);
                    check(&*rows, &removed, &format!("after truncation {round}"));
                    let copies =
                        common::storable(precision, &queries[first_query * DIM..(first_query + 30) * DIM]);
                    rows.append(&copies).expect("rows append");
                    assert_eq!(rows.len(), ROWS);
                    let [replaced, _] = check(&*rows, &removed, &format!("after replacement {round}"));
                    let own = ROWS - 30 + 2;
                    assert!(
                        replaced[first_query + 2].iter().any(|n| n.slot == own),
                        "{what} round {round}: query {}'s own copy (slot {own}) is not among its nearest: {:?}",
                        first_query + 2,
                        replaced[first_query + 2]
                    );
                }
                // Rows past both sets' slots: copies of queries, which neither set may return.
                let copies = common::storable(precision, &queries[60 * DIM..70 * DIM]);
                rows.append(&copies).expect("rows append");
                for answers in check(&*rows, &removed, "after an append past the sets") {
                    assert!(
                        answers.iter().flatten().all(|n| n.slot < ROWS),
                        "{what}: a row outside the set came back"
                    );
                }
            }
        }
    }
}
