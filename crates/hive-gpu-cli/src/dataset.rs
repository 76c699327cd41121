//! Finding and loading benchmark data: files, a folder, or the embedded SIFT10K.

use std::path::{Path, PathBuf};

use hive_gpu::HiveGpuError;
use hive_gpu::io::{self, IdMatrix, Matrix};

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
    pub queries: Matrix,
    pub groundtruth: Option<IdMatrix>,
    pub groundtruth_source: Option<String>,
}

pub fn load(args: &DataArgs) -> Result<Dataset, HiveGpuError> {
    if let Some(dir) = &args.data {
        return load_folder(dir);
    }
    match (&args.base, &args.query) {
        (Some(base), Some(query)) => {
            let groundtruth = args.groundtruth.as_deref().map(io::read_ivecs).transpose()?;
            Ok(Dataset {
                name: file_name(base),
                base: io::read_vectors(base)?,
                queries: io::read_vectors(query)?,
                groundtruth,
                groundtruth_source: args.groundtruth.as_deref().map(file_name),
            })
        }
        _ => embedded(),
    }
}

fn embedded() -> Result<Dataset, HiveGpuError> {
    Ok(Dataset {
        name: "siftsmall (embedded SIFT10K)".into(),
        base: io::parse_fvecs(Path::new("siftsmall_base.fvecs"), SIFT_BASE)?,
        queries: io::parse_fvecs(Path::new("siftsmall_query.fvecs"), SIFT_QUERY)?,
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
        queries: io::read_fvecs(&query)?,
        groundtruth: groundtruth_path.as_deref().map(io::read_ivecs).transpose()?,
        groundtruth_source: groundtruth_path.as_deref().map(file_name),
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
    /// Keeps only the first `limit` queries (and their ground-truth rows).
    pub fn truncate_queries(&mut self, limit: usize) {
        let rows = self.queries.rows.min(limit);
        self.queries.data.truncate(rows * self.queries.dim);
        self.queries.rows = rows;
        if let Some(truth) = &mut self.groundtruth {
            let kept = truth.rows.min(rows);
            truth.data.truncate(kept * truth.dim);
            truth.rows = kept;
        }
    }
}
