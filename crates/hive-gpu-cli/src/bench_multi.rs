//! `hive-gpu bench-multi`: one device against a replicated and a sharded storage over several,
//! on the same synthetic data in one run. Batch QPS (median of repeated passes), single-query
//! latency (median and p99 of one-query calls), and whether every query's neighbours equal
//! those one device finds over the same rows (the exactness of the merge and the split).
//!
//! Stages, each printed as soon as it is measured (a report or one JSON object per line), and
//! each storage dropped before the next is built so that one device's memory holds one stage:
//! 1. one device (the list's first) over `rows` vectors;
//! 2. a replicated storage over every listed device, the same `rows` vectors;
//! 3. a sharded storage over every listed device, `sharded_rows` vectors (default twice `rows`:
//!    each of two devices then holds what the single device held);
//! 4. one device over the same `sharded_rows` vectors, for the sharded storage's same-data
//!    ratio and its exactness check (left out with `--skip-single-sharded`, or when it does not
//!    fit).
//!
//! Data: uniform [0, 1) components from a seeded SplitMix64 (what `torch.rand` gives the other
//! GPU benchmarks), queries drawn the same way.

use std::io::Write as _;
use std::time::{Duration, Instant};

use hive_gpu::{
    GpuContext, GpuVectorStorage, HiveGpuError, ReplicatedStorage, SearchOptions, SearchResults,
    ShardedStorage, StorageConfig,
};
use rayon::prelude::*;

use crate::BenchMultiArgs;
use crate::bench::{median, percentile};
use crate::json::{Value, object};

/// A storage under test, whichever layout.
enum Store {
    One(Box<GpuVectorStorage>),
    Replicated(ReplicatedStorage),
    Sharded(ShardedStorage),
}

impl Store {
    fn add(&self, ids: &[String], values: &[f32]) -> Result<(), HiveGpuError> {
        match self {
            Store::One(s) => s.add_vectors_flat(ids, values),
            Store::Replicated(s) => s.add_vectors_flat(ids, values),
            Store::Sharded(s) => s.add_vectors_flat(ids, values),
        }
    }

    fn batch(&self, queries: &[f32], k: usize) -> Result<SearchResults, HiveGpuError> {
        let options = SearchOptions::default();
        match self {
            Store::One(s) => s.search_batch_results(queries, k, &options),
            Store::Replicated(s) => s.search_batch_results(queries, k, &options),
            Store::Sharded(s) => s.search_batch_results(queries, k, &options),
        }
    }

    fn one(&self, query: &[f32], k: usize) -> Result<usize, HiveGpuError> {
        Ok(match self {
            Store::One(s) => s.search(query, k)?.len(),
            Store::Replicated(s) => s.search(query, k)?.len(),
            Store::Sharded(s) => s.search(query, k)?.len(),
        })
    }
}

/// Uniform [0, 1) values, row by row from a seeded SplitMix64 per row (reproducible, parallel).
fn uniform(rows: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut out = vec![0f32; rows * dim];
    out.par_chunks_mut(dim).enumerate().for_each(|(r, row)| {
        let mut state = seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for x in row {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            *x = (z >> 40) as f32 / (1u64 << 24) as f32;
        }
    });
    out
}

/// What one stage measured.
struct Measured {
    add: Duration,
    passes: Vec<Duration>,
    singles: Vec<Duration>,
    results: SearchResults,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn say(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "bench-multi: {text}");
}

/// Fills `store` with the first `rows` vectors, then times `repeat` passes of the whole batch
/// (after one warm-up) and `singles` one-query calls.
fn measure(
    store: &Store,
    ids: &[String],
    base: &[f32],
    queries: &[f32],
    args: &BenchMultiArgs,
) -> Result<Measured, HiveGpuError> {
    let began = Instant::now();
    store.add(ids, base)?;
    let add = began.elapsed();
    let results = store.batch(queries, args.k)?;
    let mut passes = Vec::new();
    for _ in 0..args.repeat.max(1) {
        let began = Instant::now();
        store.batch(queries, args.k)?;
        passes.push(began.elapsed());
    }
    let dim = args.dim;
    let nq = queries.len() / dim;
    let mut singles = Vec::new();
    for i in 0..args.singles.min(nq) {
        let began = Instant::now();
        store.one(&queries[i * dim..(i + 1) * dim], args.k)?;
        singles.push(began.elapsed());
    }
    Ok(Measured { add, passes, singles, results })
}

/// Queries whose neighbours (ids, in order) differ between `got` and `want`, and the largest
/// score difference among the rest.
fn differences(got: &SearchResults, want: &SearchResults) -> (usize, f64) {
    let mut differing = 0;
    let mut worst = 0f64;
    for (g, w) in got.rows().zip(want.rows()) {
        if g.ids != w.ids {
            differing += 1;
            continue;
        }
        for (a, b) in g.scores.iter().zip(w.scores) {
            worst = worst.max(f64::from((a - b).abs()));
        }
    }
    differing += got.len().abs_diff(want.len());
    (differing, worst)
}

pub fn run(args: &BenchMultiArgs) -> Result<(), HiveGpuError> {
    let devices = GpuContext::on_devices(&args.devices)?;
    let config = StorageConfig::new(args.dim, args.settings_metric())
        .with_precision(args.precision.storage())
        .with_search_precision(args.precision.search());
    let sharded_rows = args.sharded_rows.unwrap_or(args.rows * 2);
    let most = args.rows.max(sharded_rows);
    say(&format!(
        "{} devices ({}), {} rows (sharded: {sharded_rows}) x {}, {} queries, k {}",
        devices.len(),
        devices.iter().map(|d| d.device_info().name).collect::<Vec<_>>().join(", "),
        args.rows,
        args.dim,
        args.queries,
        args.k
    ));
    let began = Instant::now();
    let base = uniform(most, args.dim, args.seed);
    let queries = uniform(args.queries, args.dim, args.seed ^ 0x5eed);
    let ids: Vec<String> = (0..most).into_par_iter().map(|i| i.to_string()).collect();
    say(&format!("data made in {:.1} s", began.elapsed().as_secs_f64()));

    let report = |layout: &str, used: usize, rows: usize, m: &Measured, against: Option<&SearchResults>| {
        let qps = args.queries as f64 / median(&m.passes).as_secs_f64();
        let (differing, worst) = against.map_or((0, 0.0), |want| differences(&m.results, want));
        let line = object(&[
            ("layout", Value::Str(layout.into())),
            ("devices", Value::Int(used as u64)),
            ("rows", Value::Int(rows as u64)),
            ("dim", Value::Int(args.dim as u64)),
            ("queries", Value::Int(args.queries as u64)),
            ("k", Value::Int(args.k as u64)),
            ("add_s", Value::Num(m.add.as_secs_f64())),
            ("batch_qps", Value::Num(qps)),
            ("batch_ms", Value::List(m.passes.iter().map(|d| Value::Num(ms(*d))).collect())),
            ("single_p50_ms", Value::Num(ms(median(&m.singles)))),
            ("single_p99_ms", Value::Num(ms(percentile(&m.singles, 0.99)))),
            ("compared_with_one_device", Value::Str(if against.is_some() { "yes" } else { "no" }.into())),
            ("queries_differing", Value::Int(differing as u64)),
            ("max_score_difference", Value::Num(worst)),
        ]);
        if args.json {
            println!("{line}");
        } else {
            println!(
                "{layout:>10} on {used} device(s), {rows} rows: add {:.1} s, {qps:.0} QPS (median of {} passes), one query p50 {:.3} ms p99 {:.3} ms{}",
                m.add.as_secs_f64(),
                m.passes.len(),
                ms(median(&m.singles)),
                ms(percentile(&m.singles, 0.99)),
                against.map_or(String::new(), |_| format!(
                    ", {differing} queries differ from one device's (largest score difference {worst:e})"
                ))
            );
        }
        let _ = std::io::stdout().flush();
        qps
    };

    let dim = args.dim;
    let first = &devices[0];
    say("stage 1: one device");
    let one = Store::One(Box::new(first.create_storage_with(config)?));
    let single = measure(&one, &ids[..args.rows], &base[..args.rows * dim], &queries, args)?;
    drop(one);
    let single_qps = report("one", 1, args.rows, &single, None);

    say("stage 2: replicated");
    let replicated = Store::Replicated(ReplicatedStorage::create(&devices, config)?);
    let measured = measure(&replicated, &ids[..args.rows], &base[..args.rows * dim], &queries, args)?;
    drop(replicated);
    let replicated_qps = report("replicated", devices.len(), args.rows, &measured, Some(&single.results));

    let mut sharded_stage = None;
    let mut single_sharded_qps = None;
    if !args.skip_sharded {
        say("stage 3: sharded");
        let sharded = Store::Sharded(ShardedStorage::create(&devices, config)?);
        let measured_sharded =
            measure(&sharded, &ids[..sharded_rows], &base[..sharded_rows * dim], &queries, args)?;
        let sizes = match &sharded {
            Store::Sharded(s) => s.shard_sizes(),
            _ => Vec::new(),
        };
        let on_device = match &sharded {
            Store::Sharded(s) => s.merges_on_device(),
            _ => false,
        };
        drop(sharded);
        say(&format!("shard sizes {sizes:?}, merged on {}", if on_device { "a device" } else { "the host" }));
        let sharded_qps = report("sharded", devices.len(), sharded_rows, &measured_sharded, None);

        if args.host_merge_too {
            say("stage 3b: sharded, merged on the host");
            let host_devices: Vec<GpuContext> = devices
                .iter()
                .map(|d| {
                    let mut tuning = d.tuning().clone();
                    tuning.device_merge = false;
                    d.clone().with_tuning(tuning)
                })
                .collect();
            let host = Store::Sharded(ShardedStorage::create(&host_devices, config)?);
            let m = measure(&host, &ids[..sharded_rows], &base[..sharded_rows * dim], &queries, args)?;
            drop(host);
            report("sharded-host-merge", devices.len(), sharded_rows, &m, Some(&measured_sharded.results));
        }

        if !args.skip_single_sharded {
            say("stage 4: one device over the sharded rows");
            let one = Store::One(Box::new(first.create_storage_with(config)?));
            match measure(&one, &ids[..sharded_rows], &base[..sharded_rows * dim], &queries, args) {
                Ok(m) => {
                    single_sharded_qps = Some(report("one", 1, sharded_rows, &m, None));
                    let (differing, worst) = differences(&measured_sharded.results, &m.results);
                    let line = object(&[
                        ("layout", Value::Str("sharded-against-one".into())),
                        ("rows", Value::Int(sharded_rows as u64)),
                        ("queries_differing", Value::Int(differing as u64)),
                        ("max_score_difference", Value::Num(worst)),
                    ]);
                    if args.json {
                        println!("{line}");
                    } else {
                        println!(
                            "   sharded against one device on {sharded_rows} rows: {differing} queries differ (largest score difference {worst:e})"
                        );
                    }
                }
                Err(e @ (HiveGpuError::VramLimitExceeded { .. } | HiveGpuError::OutOfMemory { .. })) => {
                    say(&format!("one device cannot hold {sharded_rows} rows: {e}"));
                }
                Err(e) => return Err(e),
            }
        }
        sharded_stage = Some((sharded_qps, median(&measured_sharded.singles), sizes));
    }
    let ratio = |a: f64, b: Option<f64>| b.map_or(Value::Null, |b| Value::Num(a / b));
    // Without the sharded stage its ratios are null.
    let of_sharded = |value: &dyn Fn(f64, Duration) -> (f64, Option<f64>)| {
        sharded_stage.as_ref().map_or(Value::Null, |(qps, single_p50, _)| {
            let (a, b) = value(*qps, *single_p50);
            ratio(a, b)
        })
    };
    let sizes = sharded_stage.as_ref().map_or(&[][..], |(_, _, sizes)| &sizes[..]);
    let single_p50 = median(&single.singles).as_secs_f64();
    let summary = object(&[
        ("summary", Value::Str("bench-multi".into())),
        ("devices", Value::Int(devices.len() as u64)),
        ("replicated_qps_over_one", Value::Num(replicated_qps / single_qps)),
        ("sharded_qps_over_one_same_rows", of_sharded(&|qps, _| (qps, single_sharded_qps))),
        ("sharded_qps_over_one_on_rows_per_device", of_sharded(&|qps, _| (qps, Some(single_qps)))),
        (
            "sharded_rows_x_qps_over_one",
            of_sharded(&|qps, _| (qps * sharded_rows as f64, Some(single_qps * args.rows as f64))),
        ),
        (
            "sharded_single_p50_over_one_on_rows_per_device",
            of_sharded(&|_, p50| (p50.as_secs_f64(), Some(single_p50))),
        ),
        ("shard_sizes", Value::List(sizes.iter().map(|&s| Value::Int(s as u64)).collect())),
    ]);
    println!("{summary}");
    Ok(())
}
