//! `hive-gpu bench`: build time, QPS, per-call latency and recall on one data set.

use std::time::{Duration, Instant};

use hive_gpu::{Filter, GpuDistanceMetric, GpuVectorStorage, HiveGpuError, SearchOptions, SearchResults};
use indicatif::{ProgressBar, ProgressStyle};

use crate::BenchArgs;
use crate::dataset::{self, Dataset};
use crate::json::{self, Value};
use crate::reference;

/// Timed passes over the queries repeat until at least this much time has passed...
const MIN_TIMED: Duration = Duration::from_secs(1);
/// ...and at least this many passes ran.
const MIN_PASSES: usize = 3;
/// p99 is reported only over at least this many timed calls (fewer give no 99th percentile,
/// only the slowest call).
const MIN_CALLS_FOR_P99: usize = 100;

struct Timings {
    /// Wall time of each full pass over the queries.
    rounds: Vec<Duration>,
    /// Wall time of each search call.
    calls: Vec<Duration>,
    /// Neighbour ids of every query from the first timed round.
    ids: Vec<Vec<usize>>,
}

pub fn run(args: &BenchArgs) -> Result<(), HiveGpuError> {
    let settings = &args.settings;
    // A collection file brings its own metric and precision.
    let stored = args.data.collection.as_deref().map(hive_gpu::persist::inspect_file).transpose()?;
    let metric = stored.as_ref().map_or(settings.metric(), |info| info.config.metric);
    let ks = if args.ks.is_empty() { vec![settings.k] } else { args.ks.clone() };
    if ks.contains(&0) {
        return Err(HiveGpuError::InvalidArgument("-k must be at least 1".into()));
    }
    if args.batch.contains(&0) {
        return Err(HiveGpuError::InvalidArgument("--batch must be at least 1".into()));
    }
    if args.nq == Some(0) {
        return Err(HiveGpuError::InvalidArgument("--nq must be at least 1".into()));
    }
    if let Some(s) = args.filter_selectivity.iter().find(|s| !(**s > 0.0 && **s <= 1.0)) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "--filter-selectivity {s} is not a fraction of the rows in (0, 1]"
        )));
    }
    let mut data = {
        let spinner = if args.json { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
        spinner.set_message("loading vectors");
        spinner.enable_steady_tick(Duration::from_millis(120));
        let loaded = dataset::load(&args.data);
        spinner.finish_and_clear();
        loaded?
    };
    dataset::check_dimensions(&data.base, &data.base_source, &data.queries, &data.query_source)?;
    if let Some(limit) = args.nq {
        if limit > data.queries.rows {
            return Err(HiveGpuError::InvalidArgument(format!(
                "--nq {limit} asks for more queries than {} holds ({})",
                data.query_source, data.queries.rows
            )));
        }
        data.truncate_queries(limit);
    }
    let nq = data.queries.rows;
    let batches: Vec<usize> = if args.batch.is_empty() { vec![nq] } else { args.batch.clone() };
    if let Some(&batch) = batches.iter().find(|&&b| b > nq) {
        return Err(HiveGpuError::InvalidArgument(format!(
            "--batch {batch} is larger than the {nq} queries searched (use at most {nq}, or --nq)"
        )));
    }
    // The ground truth is used for l2 unless the user asked for computed recall: check it
    // against the largest k before anything is built.
    let use_groundtruth =
        data.groundtruth.is_some() && metric == GpuDistanceMetric::Euclidean && !args.exact_recall;
    if use_groundtruth {
        let largest = ks.iter().map(|&k| k.min(data.base.rows)).max().unwrap_or(1);
        data.check_groundtruth(largest)?;
    }
    let context = settings.context()?;
    let device = context.device_info();

    let (storage, build, loaded) = match &args.data.collection {
        Some(path) => {
            let began = Instant::now();
            let storage = crate::collection::open(&context, path, args.data.mapped, args.json)?;
            (storage, began.elapsed(), "open")
        }
        None => {
            let storage = context.create_storage_with(settings.storage_config(data.base.dim))?;
            let spent = build(&storage, &data, args.json)?;
            (storage, spent, "add")
        }
    };
    let config = storage.config();
    let index_build = build_index(&storage, args.index, args.json)?;
    let settings_list = search_settings(&storage, args)?;
    let mut reached: Vec<(String, f64, f64)> = Vec::new();
    // The unfiltered search first, then each filter: ratios come from one run.
    let selectivities: Vec<Option<f64>> =
        std::iter::once(None).chain(args.filter_selectivity.iter().map(|&s| Some(s))).collect();

    for &selectivity in &selectivities {
        let filter = selectivity
            .map(|s| FilterCase::new(&storage, data.base.rows, s, args.filter_per_search))
            .transpose()?;
        let filtered = match &filter {
            Some(case) => SearchOptions::default().with_filter(case.filter.clone()),
            None => SearchOptions::default(),
        };
        for (setting, params) in &settings_list {
            let options = filtered.clone().with_params(params)?;
            for &batch in &batches {
                for &requested_k in &ks {
                    // k beyond the collection returns every vector: reported as the effective k.
                    let k = requested_k.min(data.base.rows);
                    let timings =
                        time_search(&storage, &data, k, batch, &options, Form::of(args), args.json)?;
                    let (recall, recall_source) = match &filter {
                        Some(case) => filtered_recall(&data, &timings.ids, k, metric, &case.passing),
                        None => recall(&data, &timings.ids, k, metric, use_groundtruth),
                    };
                    let qps = nq as f64 / median(&timings.rounds).as_secs_f64();
                    // After the searches: what a backend keeps for them (the CPU's packed IVF
                    // lists, made at the first search) counts too.
                    let bytes_per_vector =
                        storage.memory_bytes() as f64 / storage.vector_count().max(1) as f64;
                    let p50 = percentile(&timings.calls, 0.50).as_secs_f64() * 1e3;
                    let p99 = p99_ms(&timings.calls);
                    let threads = rayon::current_num_threads();
                    reached.push((setting.clone(), recall, qps));
                    if args.json {
                        out!(
                            "{}",
                            json::object(&[
                                ("dataset", Value::Str(data.name.clone())),
                                ("backend", Value::Str(context.backend_type().name().into())),
                                ("device", Value::Str(device.name.clone())),
                                ("simd_or_cc", Value::Str(device.compute_capability.clone())),
                                ("threads", Value::Int(threads as u64)),
                                ("n", Value::Int(data.base.rows as u64)),
                                ("dim", Value::Int(data.base.dim as u64)),
                                ("nq", Value::Int(nq as u64)),
                                ("k", Value::Int(k as u64)),
                                ("k_requested", Value::Int(requested_k as u64)),
                                ("metric", Value::Str(metric.to_string())),
                                ("precision", Value::Str(config.precision.to_string())),
                                (
                                    "search_precision",
                                    Value::Str(format!("{:?}", config.search).to_lowercase())
                                ),
                                ("batch", Value::Int(batch as u64)),
                                ("results", Value::Str(Form::of(args).name().into())),
                                ("selectivity", selectivity.map_or(Value::Null, Value::Num)),
                                (
                                    "filter_prepared",
                                    match selectivity {
                                        Some(_) => Value::Bool(!args.filter_per_search),
                                        None => Value::Null,
                                    }
                                ),
                                (
                                    "passing",
                                    Value::Int(
                                        filter.as_ref().map_or(data.base.rows, |c| c.passing.len()) as u64
                                    ),
                                ),
                                ("recall", Value::Num(recall)),
                                ("recall_source", Value::Str(recall_source)),
                                ("qps", Value::Num(qps)),
                                ("p50_ms", Value::Num(p50)),
                                ("p99_ms", p99.map_or(Value::Null, Value::Num)),
                                ("build_s", Value::Num(build.as_secs_f64())),
                                ("build", Value::Str(loaded.into())),
                                ("index", Value::Str(args.index.to_string())),
                                ("index_build_s", Value::Num(index_build.as_secs_f64())),
                                ("search_params", Value::Str(setting.clone())),
                                ("bytes_per_vector", Value::Num(bytes_per_vector)),
                                ("rounds", Value::Int(timings.rounds.len() as u64)),
                                ("calls", Value::Int(timings.calls.len() as u64)),
                            ])
                        );
                        continue;
                    }
                    out!("hive-gpu bench");
                    out!(
                        "  data      {}: {} x {} base, {} queries",
                        data.name,
                        data.base.rows,
                        data.base.dim,
                        nq
                    );
                    out!(
                        "  backend   {} on {} ({}, {} threads), {} storage, {:?} search",
                        context.backend_type(),
                        device.name,
                        device.compute_capability,
                        threads,
                        config.precision,
                        config.search
                    );
                    let clamped = if k < requested_k {
                        format!(" (k = {requested_k} asked; the collection holds {k})")
                    } else {
                        String::new()
                    };
                    out!("  search    metric {metric}, k = {k}{clamped}, {batch} queries per call");
                    out!("  index     {} ({setting}), {bytes_per_vector:.1} bytes per vector", args.index);
                    if let (Some(s), Some(case)) = (selectivity, &filter) {
                        out!(
                            "  filter    an allow-list of {} ids (selectivity {s}), {}",
                            case.passing.len(),
                            FilterCase::how(args.filter_per_search)
                        );
                    }
                    out!();
                    out!(
                        "  {:<18} {:>14}",
                        format!("build ({loaded})"),
                        format!("{:.3} s", build.as_secs_f64())
                    );
                    if args.index != hive_gpu::IndexSpec::Flat {
                        out!(
                            "  {:<18} {:>14}",
                            "build (index)",
                            format!("{:.3} s", index_build.as_secs_f64())
                        );
                    }
                    out!("  {:<18} {:>14}", "throughput", format!("{qps:.0} QPS"));
                    out!("  {:<18} {:>14}", "latency p50", format!("{p50:.3} ms"));
                    match p99 {
                        Some(p99) => out!("  {:<18} {:>14}", "latency p99", format!("{p99:.3} ms")),
                        None => {
                            out!(
                                "  {:<18} {:>14}",
                                "latency p99",
                                format!("n/a ({} calls)", timings.calls.len())
                            )
                        }
                    }
                    out!("  {:<18} {:>14}", format!("recall@{k}"), format!("{recall:.4}"));
                    out!();
                    out!(
                        "  QPS is queries per second over a whole pass (median of {} passes, timed for at least\n  {} s and {MIN_PASSES} passes); latency is per call of {batch} queries ({} calls timed; p99\n  needs {MIN_CALLS_FOR_P99}); recall is measured against {recall_source}.",
                        timings.rounds.len(),
                        MIN_TIMED.as_secs(),
                        timings.calls.len()
                    );
                }
            }
        }
    }
    if let Some(target) = args.target_recall {
        report_target(target, &reached, args.json)?;
    }
    Ok(())
}

/// Builds `spec`'s index over the stored vectors, timed (zero for `flat`).
fn build_index(
    storage: &GpuVectorStorage,
    spec: hive_gpu::IndexSpec,
    quiet: bool,
) -> Result<Duration, HiveGpuError> {
    if spec == hive_gpu::IndexSpec::Flat {
        return Ok(Duration::ZERO);
    }
    let spinner = if quiet { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    spinner.set_message(format!("building {spec}"));
    spinner.enable_steady_tick(Duration::from_millis(120));
    let began = Instant::now();
    let built = storage.build_index(spec);
    spinner.finish_and_clear();
    built.map(|()| began.elapsed())
}

/// The search settings to measure, each as its label and its parameter text: `--search` as
/// given; else, for `--target-recall` on an IVF index, nprobe 1, 2, 4, ... up to every list
/// (on IVF-PQ each with refine 2, 8 and 32; on the flat SQ8 index refine 1, 2, 4, ... 32, on
/// the flat PQ index 1, 2, 4, ... 128, on the binary index 1, 4, 16, ... 1,024); else the
/// defaults.
fn search_settings(
    storage: &GpuVectorStorage,
    args: &BenchArgs,
) -> Result<Vec<(String, String)>, HiveGpuError> {
    if !args.search_params.is_empty() {
        for params in &args.search_params {
            SearchOptions::default().with_params(params)?;
        }
        return Ok(args.search_params.iter().map(|p| (p.clone(), p.clone())).collect());
    }
    let setting = |p: String| (p.clone(), p);
    let probes = |nlist: usize| {
        let mut probes: Vec<usize> =
            std::iter::successors(Some(1usize), |&p| (p < nlist).then(|| (2 * p).min(nlist))).collect();
        probes.dedup();
        probes
    };
    match (storage.index_spec(), args.target_recall) {
        (hive_gpu::IndexSpec::IvfFlat { nlist } | hive_gpu::IndexSpec::IvfSq8 { nlist }, Some(_)) => {
            Ok(probes(nlist).into_iter().map(|p| setting(format!("nprobe={p}"))).collect())
        }
        (hive_gpu::IndexSpec::IvfPq { nlist, .. }, Some(_)) => Ok(probes(nlist)
            .into_iter()
            .flat_map(|p| [2, 8, 32].map(|r| setting(format!("nprobe={p},refine={r}"))))
            .collect()),
        (hive_gpu::IndexSpec::Pq { .. }, Some(_)) => {
            Ok([1, 2, 4, 8, 16, 32, 64, 128].into_iter().map(|r| setting(format!("refine={r}"))).collect())
        }
        (hive_gpu::IndexSpec::Sq8, Some(_)) => {
            Ok([1, 2, 4, 8, 16, 32].into_iter().map(|r| setting(format!("refine={r}"))).collect())
        }
        (hive_gpu::IndexSpec::Binary, Some(_)) => {
            Ok([1, 4, 16, 64, 256, 1024].into_iter().map(|r| setting(format!("refine={r}"))).collect())
        }
        (hive_gpu::IndexSpec::IvfFlat { .. } | hive_gpu::IndexSpec::IvfSq8 { .. }, None) => {
            Ok(vec![(format!("nprobe={} (default)", hive_gpu::DEFAULT_NPROBE), String::new())])
        }
        (spec @ hive_gpu::IndexSpec::IvfPq { .. }, None) => Ok(vec![(
            format!("nprobe={},refine={} (default)", hive_gpu::DEFAULT_NPROBE, spec.default_refine_factor()),
            String::new(),
        )]),
        (
            spec @ (hive_gpu::IndexSpec::Sq8 | hive_gpu::IndexSpec::Binary | hive_gpu::IndexSpec::Pq { .. }),
            None,
        ) => Ok(vec![(format!("refine={} (default)", spec.default_refine_factor()), String::new())]),
        _ => Ok(vec![("exact".into(), String::new())]),
    }
}

/// Prints the measured setting with the highest QPS whose recall reaches `target`, or says
/// none did.
fn report_target(target: f64, reached: &[(String, f64, f64)], json: bool) -> Result<(), HiveGpuError> {
    let best = reached.iter().filter(|(_, recall, _)| *recall >= target).max_by(|a, b| a.2.total_cmp(&b.2));
    if json {
        out!(
            "{}",
            json::object(&[
                ("target_recall", Value::Num(target)),
                ("search_params", best.map_or(Value::Null, |b| Value::Str(b.0.clone()))),
                ("recall", best.map_or(Value::Null, |b| Value::Num(b.1))),
                ("qps", best.map_or(Value::Null, |b| Value::Num(b.2))),
            ])
        );
        return Ok(());
    }
    match best {
        Some((setting, recall, qps)) => {
            out!(
                "target recall {target}: {setting} reaches {recall:.4} at {qps:.0} QPS (the fastest that does)"
            )
        }
        None => out!("target recall {target}: no measured setting reaches it"),
    }
    Ok(())
}

/// One `--filter-selectivity` setting: the passing rows and the filter searched with, prepared
/// from them once, or (`--filter-per-search`) the allow-list of ids itself, which every search
/// call resolves to slots and sends to the device again.
struct FilterCase {
    passing: Vec<usize>,
    filter: Filter,
}

impl FilterCase {
    fn new(
        storage: &GpuVectorStorage,
        rows: usize,
        selectivity: f64,
        per_search: bool,
    ) -> Result<Self, HiveGpuError> {
        let passing: Vec<usize> = (0..rows).filter(|&i| passes(i, selectivity)).collect();
        let ids: Vec<String> = passing.iter().map(|i| i.to_string()).collect();
        let filter = if per_search {
            Filter::ids(&ids)
        } else {
            Filter::Prepared(storage.prepare_filter(&Filter::ids(&ids))?)
        };
        Ok(Self { passing, filter })
    }

    /// How the filter reaches a search, in words.
    fn how(per_search: bool) -> &'static str {
        if per_search { "evaluated by every search call" } else { "prepared once" }
    }
}

/// Whether row `i` is in the allow-list of selectivity `s`: splitmix64(i + 0x5eed) / 2^64 < s
/// (the rule scripts/bench_filter_peers.py reproduces for faiss).
fn passes(i: usize, s: f64) -> bool {
    let mut z = (i as u64).wrapping_add(0x5eed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) < (s * (1u64 << 53) as f64) as u64
}

/// Recall@k of a filtered search against the f64 brute force over the passing rows, on a
/// sample of queries.
fn filtered_recall(
    data: &Dataset,
    ids: &[Vec<usize>],
    k: usize,
    metric: GpuDistanceMetric,
    passing: &[usize],
) -> (f64, String) {
    if passing.is_empty() {
        return (1.0, "nothing (no row passes: every result list is empty, as it must be)".into());
    }
    let sample = reference::sample(data.queries.rows, passing.len(), data.base.dim);
    let truth = reference::knn_among(&data.base, passing, &data.queries, &sample, k, metric);
    let ours: Vec<Vec<usize>> = sample.iter().map(|&i| ids[i].clone()).collect();
    (
        reference::recall(&ours, &truth, k),
        format!(
            "an exact f64 brute force over the {} passing rows on {} sampled queries",
            passing.len(),
            sample.len()
        ),
    )
}

fn progress(len: usize, what: &str, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} ({eta})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

fn build(storage: &GpuVectorStorage, data: &Dataset, quiet: bool) -> Result<Duration, HiveGpuError> {
    let bar = progress(data.base.rows, "adding", quiet);
    let began = Instant::now();
    dataset::fill(storage, &data.base, |added| bar.set_position(added as u64))?;
    let spent = began.elapsed();
    bar.finish_and_clear();
    Ok(spent)
}

/// The shape a search call's results take (`--columnar`, `--reuse-results`).
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// A list of structures per query (`search_batch_with`).
    Lists,
    /// Flat arrays, fresh for each call (`search_batch_results`).
    Columns,
    /// Flat arrays reused from call to call (`search_batch_results_into`).
    ReusedColumns,
}

impl Form {
    fn of(args: &crate::BenchArgs) -> Self {
        match (args.columnar, args.reuse_results) {
            (false, _) => Self::Lists,
            (true, false) => Self::Columns,
            (true, true) => Self::ReusedColumns,
        }
    }

    /// As the JSON's `results` field names it.
    fn name(self) -> &'static str {
        match self {
            Self::Lists => "lists",
            Self::Columns => "columns",
            Self::ReusedColumns => "reused columns",
        }
    }
}

fn time_search(
    storage: &GpuVectorStorage,
    data: &Dataset,
    k: usize,
    batch: usize,
    options: &SearchOptions,
    form: Form,
    quiet: bool,
) -> Result<Timings, HiveGpuError> {
    let dim = data.queries.dim;
    let nq = data.queries.rows;
    let queries = &data.queries.data;
    // Warm-up: first touches of memory and thread-pool start-up stay out of the numbers.
    storage.search_batch_with(&queries[..batch * dim], k, options)?;

    let mut timings = Timings { rounds: Vec::new(), calls: Vec::new(), ids: Vec::new() };
    let mut reused = SearchResults::default();
    let started = Instant::now();
    let bar = progress(nq, "searching", quiet || nq / batch < 50);
    while timings.rounds.len() < MIN_PASSES || started.elapsed() < MIN_TIMED {
        let first = timings.rounds.is_empty();
        let round_start = Instant::now();
        for start in (0..nq).step_by(batch) {
            let end = (start + batch).min(nq);
            let call_start = Instant::now();
            let batch_queries = &queries[start * dim..end * dim];
            if form != Form::Lists {
                let fresh;
                let results = if form == Form::ReusedColumns {
                    storage.search_batch_results_into(batch_queries, k, options, &mut reused)?;
                    &reused
                } else {
                    fresh = storage.search_batch_results(batch_queries, k, options)?;
                    &fresh
                };
                timings.calls.push(call_start.elapsed());
                if first {
                    bar.set_position(end as u64);
                    for row in results.rows() {
                        timings.ids.push(row.ids.iter().filter_map(|id| id.parse().ok()).collect());
                    }
                }
            } else {
                let results = storage.search_batch_with(batch_queries, k, options)?;
                timings.calls.push(call_start.elapsed());
                if first {
                    bar.set_position(end as u64);
                    for list in results {
                        timings.ids.push(list.iter().filter_map(|r| r.id.parse().ok()).collect());
                    }
                }
            }
        }
        timings.rounds.push(round_start.elapsed());
        bar.finish_and_clear();
    }
    Ok(timings)
}

/// Recall@k against the ground truth when it is used (l2, not `--exact-recall`; checked by
/// `Dataset::check_groundtruth`), else against the f64 reference on a sample of queries.
fn recall(
    data: &Dataset,
    ids: &[Vec<usize>],
    k: usize,
    metric: GpuDistanceMetric,
    use_groundtruth: bool,
) -> (f64, String) {
    if let Some(truth) = data.groundtruth.as_ref().filter(|_| use_groundtruth) {
        let truth: Vec<Vec<usize>> =
            (0..ids.len()).map(|i| truth.row(i).iter().map(|&x| x.max(0) as usize).collect()).collect();
        let source = data.groundtruth_source.clone().unwrap_or_else(|| "ground truth".into());
        return (reference::recall(ids, &truth, k), format!("{source} (all {} queries)", ids.len()));
    }
    let sample = reference::sample(data.queries.rows, data.base.rows, data.base.dim);
    let truth = reference::knn(&data.base, &data.queries, &sample, k, metric);
    let ours: Vec<Vec<usize>> = sample.iter().map(|&i| ids[i].clone()).collect();
    (
        reference::recall(&ours, &truth, k),
        format!("an exact f64 brute force on {} sampled queries", sample.len()),
    )
}

/// The 99th percentile of the call times in milliseconds, where enough calls were timed for
/// one to exist.
fn p99_ms(calls: &[Duration]) -> Option<f64> {
    (calls.len() >= MIN_CALLS_FOR_P99).then(|| percentile(calls, 0.99).as_secs_f64() * 1e3)
}

pub(crate) fn median(values: &[Duration]) -> Duration {
    percentile(values, 0.5)
}

pub(crate) fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    match sorted.len() {
        0 => Duration::ZERO,
        n => sorted[((n - 1) as f64 * p).round() as usize],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_rule_keeps_about_the_fraction_asked() {
        for s in [0.001, 0.01, 0.5, 0.9] {
            let kept = (0..200_000).filter(|&i| passes(i, s)).count() as f64 / 200_000.0;
            assert!((kept - s).abs() < 0.05 * s + 0.0005, "{s}: {kept}");
        }
        assert!((0..1000).all(|i| passes(i, 1.0)));
    }

    #[test]
    fn p99_needs_a_hundred_calls() {
        let calls: Vec<Duration> = (1..=99).map(Duration::from_millis).collect();
        assert_eq!(p99_ms(&calls), None, "99 calls have no 99th percentile, only a slowest call");
        let calls: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(p99_ms(&calls), Some(99.0));
    }
}
