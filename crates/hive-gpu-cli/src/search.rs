//! `hive-gpu search`: k-NN of a query file against a base file or a collection file (exact, or
//! through the collection's index with `--search nprobe=N`).

use std::time::Duration;

use hive_gpu::HiveGpuError;
use hive_gpu::io;
use indicatif::ProgressBar;

use crate::SearchArgs;
use crate::dataset;
use crate::json::{self, Value};

pub fn run(args: &SearchArgs) -> Result<(), HiveGpuError> {
    if args.settings.k == 0 {
        return Err(HiveGpuError::InvalidArgument("-k must be at least 1".into()));
    }
    let options = hive_gpu::SearchOptions::default().with_params(&args.search_params)?;
    let spinner = if args.json { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner.set_message("loading vectors");
    let queries = io::read_vectors(&args.query)?;
    let settings = &args.settings;
    let dimension_mismatch = |path: &std::path::Path, dim: usize| {
        HiveGpuError::InvalidArgument(format!(
            "dimension mismatch: query file {} has {} components per vector, collection {} has {dim}",
            args.query.display(),
            queries.dim,
            path.display(),
        ))
    };
    // A sharded collection's manifest opens on every device of the backend asked for (all of
    // HIVE_GPU_DEVICES, or of the best backend, under --backend auto).
    if let Some(path) = &args.collection
        && crate::collection::is_manifest(path)?
    {
        let contexts = match settings.backend {
            crate::BackendArg::Auto => hive_gpu::GpuContext::all_devices()?,
            other => vec![other.context()?],
        };
        spinner.set_message(format!("opening {} on {} device(s)", path.display(), contexts.len()));
        let storage = hive_gpu::ShardedStorage::open(path, &contexts)?;
        if storage.dimension() != queries.dim {
            return Err(dimension_mismatch(path, storage.dimension()));
        }
        spinner.set_message(format!("searching {} queries", queries.rows));
        let results = storage.search_batch_with(&queries.data, settings.k, &options)?;
        spinner.finish_and_clear();
        return print(args, &results);
    }
    let context = settings.context()?;
    let storage = match (&args.base, &args.collection) {
        (_, Some(path)) => {
            // The spinner steps aside while the bar over the file's vectors runs.
            let storage =
                spinner.suspend(|| crate::collection::open(&context, path, args.mapped, args.json))?;
            if storage.dimension() != queries.dim {
                return Err(dimension_mismatch(path, storage.dimension()));
            }
            storage
        }
        (Some(path), None) => {
            let base = io::read_vectors(path)?;
            dataset::check_dimensions(
                &base,
                &path.display().to_string(),
                &queries,
                &args.query.display().to_string(),
            )?;
            let storage = context.create_storage_with(settings.storage_config(base.dim))?;
            spinner.set_message(format!("adding {} vectors", base.rows));
            dataset::fill(&storage, &base, |_| ())?;
            storage
        }
        (None, None) => return Err(HiveGpuError::InvalidArgument("give --base or --collection".into())),
    };
    spinner.set_message(format!("searching {} queries", queries.rows));
    let results = storage.search_batch_with(&queries.data, settings.k, &options)?;
    spinner.finish_and_clear();
    print(args, &results)
}

/// Prints each query's neighbours, as text or JSON lines.
fn print(args: &SearchArgs, results: &[Vec<hive_gpu::GpuSearchResult>]) -> Result<(), HiveGpuError> {
    for (qi, list) in results.iter().enumerate() {
        if args.json {
            let ids = list.iter().map(|r| Value::Str(r.id.to_string())).collect();
            let scores = list.iter().map(|r| Value::Num(f64::from(r.score))).collect();
            out!(
                "{}",
                json::object(&[
                    ("query", Value::Int(qi as u64)),
                    ("ids", Value::List(ids)),
                    ("scores", Value::List(scores)),
                ])
            );
        } else {
            let hits: Vec<String> = list.iter().map(|r| format!("{}:{:.6}", r.id, r.score)).collect();
            out!("query {qi}: {}", hits.join(" "));
        }
    }
    Ok(())
}
