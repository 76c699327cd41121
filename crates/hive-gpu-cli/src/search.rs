//! `hive-gpu search`: exact k-NN of a query file against a base file.

use std::time::Duration;

use hive_gpu::io;
use hive_gpu::{GpuVector, HiveGpuError};
use indicatif::ProgressBar;

use crate::SearchArgs;
use crate::json::{self, Value};

pub fn run(args: &SearchArgs) -> Result<(), HiveGpuError> {
    let spinner = if args.json { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner.set_message("loading vectors");
    let base = io::read_vectors(&args.base)?;
    let queries = io::read_vectors(&args.query)?;
    if queries.dim != base.dim {
        return Err(HiveGpuError::DimensionMismatch { expected: base.dim, actual: queries.dim, id: None });
    }
    let settings = &args.settings;
    let context = settings.context()?;
    let config = settings.storage_config(base.dim);
    let storage = context.create_storage_with(config)?;
    let vectors: Vec<GpuVector> =
        (0..base.rows).map(|i| GpuVector::new(i.to_string(), base.row(i).to_vec())).collect();
    spinner.set_message(format!("adding {} vectors", vectors.len()));
    storage.reserve(vectors.len())?;
    storage.add_vectors(&vectors)?;
    drop(vectors);
    spinner.set_message(format!("searching {} queries", queries.rows));
    let results = storage.search_batch(&queries.data, settings.k)?;
    spinner.finish_and_clear();
    for (qi, list) in results.iter().enumerate() {
        if args.json {
            let ids = list.iter().map(|r| r.id.as_str()).collect::<Vec<_>>().join(",");
            let scores = list.iter().map(|r| r.score.to_string()).collect::<Vec<_>>().join(",");
            out!(
                "{}",
                json::object(&[
                    ("query", Value::Int(qi as u64)),
                    ("ids", Value::Str(ids)),
                    ("scores", Value::Str(scores)),
                ])
            );
        } else {
            let hits: Vec<String> = list.iter().map(|r| format!("{}:{:.6}", r.id, r.score)).collect();
            out!("query {qi}: {}", hits.join(" "));
        }
    }
    Ok(())
}
