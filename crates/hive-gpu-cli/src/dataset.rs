//! Finding and loading benchmark data: files, a folder, or the embedded SIFT10K.

use std::path::{Path, PathBuf};

use hive_gpu::io::{self, IdMatrix, Matrix};
use hive_gpu::{GpuVectorStorage, HiveGpuError};

use crate::DataArgs;

/// The real SIFT10K (siftsmall) set, compiled into the binary so `hive-gpu bench` runs from
/// any directory.
const SIFT_BASE: &[u8] = include_bytes!("../../../data/siftsmall/siftsmall_base.fvecs");
const SIFT_QUERY: &[u8] = include_bytes!("../../../data/siftsmall/siftsmall_query.fvecs");
const SIFT_GROUNDTRUTH: &[u8] = include_bytes!("../../../data/siftsmall/siftsmall_groundtruth.ivecs");

/// Base vectors, queries and optional ground truth, with a name for reports.
pub struct Dataset {
    pub name: String,
    pub base: Matrix,
    /// Where the base vectors came from, for messages.
    pub base_source: String,
    pub queries: Matrix,
    pub query_source: String,
    pub groundtruth: Option<IdMatrix>,
    pub groundtruth_source: Option<String>,
}

/// Vectors per call while a collection is filled: bounds the ids built at once.
const ADD_CHUNK: usize = 65_536;

/// Adds the rows of `base` to `storage` with their row numbers as ids, straight from the
/// matrix (no per-vector copy), reporting progress to `progress(rows added)`.
pub fn fill(
    storage: &GpuVectorStorage,
    base: &Matrix,
    mut progress: impl FnMut(usize),
) -> Result<(), HiveGpuError> {
    storage.reserve(base.rows)?;
    let dim = base.dim;
    for start in (0..base.rows).step_by(ADD_CHUNK) {
        let end = (start + ADD_CHUNK).min(base.rows);
        let ids: Vec<String> = (start..end).map(|i| i.to_string()).collect();
        storage.add_vectors_flat(&ids, &base.data[start * dim..end * dim])?;
        progress(end);
    }
    Ok(())
}

/// Refuses queries whose dimension differs from the base's, naming both files.
pub fn check_dimensions(
    base: &Matrix,
    base_source: &str,
    queries: &Matrix,
    query_source: &str,
) -> Result<(), HiveGpuError> {
    if queries.dim == base.dim {
        return Ok(());
    }
    Err(HiveGpuError::InvalidArgument(format!(
        "dimension mismatch: query file {query_source} has {} components per vector, base file {base_source} has {}",
        queries.dim, base.dim
    )))
}

pub fn load(args: &DataArgs) -> Result<Dataset, HiveGpuError> {
    if let Some(dir) = &args.data {
        return load_folder(dir);
    }
    if let (Some(collection), Some(query)) = (&args.collection, &args.query) {
        let stored = hive_gpu::persist::read_vectors(collection)?;
        // Recall compares result ids with row numbers: the ids must be them.
        if let Some((row, id)) = stored.ids.iter().enumerate().find(|(row, id)| **id != row.to_string()) {
            return Err(HiveGpuError::InvalidArgument(format!(
                "{}: row {row} has id {id:?}; bench needs the row-number ids `hive-gpu build` writes",
                collection.display()
            )));
        }
        let groundtruth = args.groundtruth.as_deref().map(io::read_ivecs).transpose()?;
        return Ok(Dataset {
            name: file_name(collection),
            base: stored.vectors,
            base_source: collection.display().to_string(),
            queries: io::read_vectors(query)?,
            query_source: query.display().to_string(),
            groundtruth,
            groundtruth_source: args.groundtruth.as_deref().map(|p| p.display().to_string()),
        });
    }
    if args.query.is_some() && args.base.is_none() {
        return Err(HiveGpuError::InvalidArgument("--query needs --base or --collection".into()));
    }
    if args.groundtruth.is_some() && args.base.is_none() {
        return Err(HiveGpuError::InvalidArgument("--groundtruth needs --base or --collection".into()));
    }
    match (&args.base, &args.query) {
        (Some(base), Some(query)) => {
            let groundtruth = args.groundtruth.as_deref().map(io::read_ivecs).transpose()?;
            Ok(Dataset {
                name: file_name(base),
                base: io::read_vectors(base)?,
                base_source: base.display().to_string(),
                queries: io::read_vectors(query)?,
                query_source: query.display().to_string(),
                groundtruth,
                groundtruth_source: args.groundtruth.as_deref().map(|p| p.display().to_string()),
            })
        }
        _ => embedded(),
    }
}

fn embedded() -> Result<Dataset, HiveGpuError> {
    Ok(Dataset {
        name: "siftsmall (embedded SIFT10K)".into(),
        base: io::parse_fvecs(Path::new("siftsmall_base.fvecs"), SIFT_BASE)?,
        base_source: "siftsmall_base.fvecs (embedded)".into(),
        queries: io::parse_fvecs(Path::new("siftsmall_query.fvecs"), SIFT_QUERY)?,
        query_source: "siftsmall_query.fvecs (embedded)".into(),
        groundtruth: Some(io::parse_ivecs(Path::new("siftsmall_groundtruth.ivecs"), SIFT_GROUNDTRUTH)?),
        groundtruth_source: Some("siftsmall_groundtruth.ivecs".into()),
    })
}

fn load_folder(dir: &Path) -> Result<Dataset, HiveGpuError> {
    let base = find_one(dir, "_base.fvecs")?.ok_or_else(|| missing(dir, "_base.fvecs"))?;
    let query = find_one(dir, "_query.fvecs")?.ok_or_else(|| missing(dir, "_query.fvecs"))?;
    let groundtruth_path = find_one(dir, "_groundtruth.ivecs")?;
    Ok(Dataset {
        name: file_name(dir),
        base: io::read_fvecs(&base)?,
        base_source: base.display().to_string(),
        queries: io::read_fvecs(&query)?,
        query_source: query.display().to_string(),
        groundtruth: groundtruth_path.as_deref().map(io::read_ivecs).transpose()?,
        groundtruth_source: groundtruth_path.as_deref().map(|p| p.display().to_string()),
    })
}

fn find_one(dir: &Path, suffix: &str) -> Result<Option<PathBuf>, HiveGpuError> {
    let entries =
        std::fs::read_dir(dir).map_err(|source| HiveGpuError::Io { path: dir.to_path_buf(), source })?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(suffix)))
        .collect();
    found.sort();
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(HiveGpuError::InvalidArgument(format!(
            "{} holds several *{suffix} files ({}); use --base/--query instead",
            dir.display(),
            found.iter().map(|p| file_name(p)).collect::<Vec<_>>().join(", ")
        ))),
    }
}

fn missing(dir: &Path, suffix: &str) -> HiveGpuError {
    HiveGpuError::InvalidArgument(format!("no *{suffix} file in {}", dir.display()))
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

impl Dataset {
    /// Keeps only the first `limit` queries; the ground truth keeps its rows (it is checked
    /// against the queries used).
    pub fn truncate_queries(&mut self, limit: usize) {
        let rows = self.queries.rows.min(limit);
        self.queries.data.truncate(rows * self.queries.dim);
        self.queries.rows = rows;
    }

    /// Checks the ground truth against what it must answer: a row per query, at least `k` ids a
    /// row, every id a row of the base (an id out of range once counted silently as a miss).
    pub fn check_groundtruth(&self, k: usize) -> Result<(), HiveGpuError> {
        let Some(truth) = &self.groundtruth else { return Ok(()) };
        let source = self.groundtruth_source.as_deref().unwrap_or("the ground truth");
        let hint = "(or pass --exact-recall to measure recall against an f64 brute force instead)";
        if truth.rows < self.queries.rows {
            return Err(HiveGpuError::InvalidArgument(format!(
                "ground-truth file {source} has {} rows, but {} queries are searched {hint}",
                truth.rows, self.queries.rows
            )));
        }
        if truth.dim < k {
            return Err(HiveGpuError::InvalidArgument(format!(
                "ground-truth file {source} has {} ids per query, fewer than k = {k} {hint}",
                truth.dim
            )));
        }
        for row in 0..self.queries.rows {
            if let Some((column, &id)) = truth
                .row(row)
                .iter()
                .enumerate()
                .find(|(_, id)| usize::try_from(**id).map_or(true, |id| id >= self.base.rows))
            {
                return Err(HiveGpuError::InvalidArgument(format!(
                    "ground-truth file {source}: row {row}, column {column} holds id {id}, which is not a row of \
                     the {} base vectors (0..{})",
                    self.base.rows, self.base.rows
                )));
            }
        }
        Ok(())
    }
}
