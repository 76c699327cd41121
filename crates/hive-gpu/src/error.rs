//! The one error type of the crate: a variant per failure a caller can act on.

use std::path::PathBuf;

use crate::types::GpuBackendType;

/// Every failure hive-gpu reports. Each variant carries what a caller needs to act on it
/// (the expected and actual dimension, the bytes asked for and free, the backend and the
/// driver's own message). An operation that fails leaves the collection as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HiveGpuError {
    /// A vector or query does not have the collection's dimension.
    #[error("dimension mismatch{}: expected {expected}, got {actual}", id_suffix(.id))]
    DimensionMismatch {
        /// The collection's dimension.
        expected: usize,
        /// The length that was passed.
        actual: usize,
        /// The id of the offending vector, when it has one.
        id: Option<String>,
    },
    /// A vector or query holds NaN or infinity, or is unusable for the metric
    /// (a zero vector under cosine similarity).
    #[error("invalid vector{}: {reason}", id_suffix(.id))]
    InvalidVector {
        /// The id of the offending vector (None for a query).
        id: Option<String>,
        /// What is wrong with it, e.g. "NaN at component 3".
        reason: String,
    },
    /// The same id appears twice in one batch.
    #[error("duplicate id {id:?} in one batch (positions {first} and {second})")]
    DuplicateId {
        /// The repeated id.
        id: String,
        /// Position of its first occurrence in the batch.
        first: usize,
        /// Position of its second occurrence in the batch.
        second: usize,
    },
    /// An id that is not in the collection.
    #[error("vector {id:?} not found")]
    VectorNotFound {
        /// The unknown id.
        id: String,
    },
    /// A search on a collection that holds no vectors.
    #[error("the collection is empty: add vectors before searching")]
    EmptyCollection,
    /// k, a batch shape or another argument is outside what the call accepts.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device does not have the memory an operation needs.
    #[error("not enough memory on {backend}: {requested} bytes requested, {available} bytes available")]
    VramLimitExceeded {
        /// The backend whose memory ran out.
        backend: GpuBackendType,
        /// Bytes the operation asked for.
        requested: u64,
        /// Bytes that were free.
        available: u64,
    },
    /// Host memory is short for what was asked: decoding a file, storing vectors on the CPU.
    /// Checked against the process's real budget (cgroup limits and `setrlimit` included)
    /// before anything is allocated, so the process is not killed half way.
    #[error(
        "not enough memory for {what}: {requested} bytes needed, {available} bytes available (limited by the {limited_by})"
    )]
    OutOfMemory {
        /// What needed the memory ("decoding base.fvecs", ...).
        what: String,
        /// Bytes needed.
        requested: u64,
        /// Bytes this process may still allocate.
        available: u64,
        /// The limit that decided `available`.
        limited_by: String,
    },
    /// The requested backend cannot be used on this machine.
    #[error("{backend} backend unavailable: {reason}")]
    BackendUnavailable {
        /// The backend that was asked for.
        backend: GpuBackendType,
        /// Why it cannot be used ("libcuda.so not found", ...).
        reason: String,
    },
    /// A device ordinal beyond the devices a backend found.
    #[error("{backend} has no device {ordinal} ({count} found)")]
    DeviceNotFound {
        /// The backend that was asked for.
        backend: GpuBackendType,
        /// The ordinal that was asked for.
        ordinal: usize,
        /// How many devices the backend found.
        count: usize,
    },
    /// A CUDA driver or NVRTC call failed.
    #[error("CUDA error in {call}: {message}")]
    CudaError {
        /// The API call that failed.
        call: String,
        /// The driver's message.
        message: String,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS error in {call}: {message}")]
    CublasError {
        /// The API call that failed.
        call: String,
        /// The library's message.
        message: String,
    },
    /// A HIP runtime or hiprtc call failed.
    #[error("HIP error in {call}: {message}")]
    HipError {
        /// The API call that failed.
        call: String,
        /// HIP's message.
        message: String,
    },
    /// The ROCm installation is unusable (missing libraries, unsupported version).
    #[error("ROCm error: {0}")]
    RocmError(String),
    /// A rocBLAS call failed.
    #[error("rocBLAS error in {call}: {message}")]
    RocblasError {
        /// The API call that failed.
        call: String,
        /// The library's message.
        message: String,
    },
    /// A Vulkan / wgpu operation failed.
    #[error("Vulkan error: {0}")]
    VulkanError(String),
    /// A broken internal invariant: a bug in hive-gpu, please report it.
    #[error("internal error (a bug in hive-gpu): {0}")]
    Internal(String),
    /// Reading or writing a file failed at the operating-system level.
    #[error("I/O error on {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file is truncated or not in the format its reader expects.
    #[error("malformed {format} file {}: {reason}", .path.display())]
    InvalidFormat {
        /// The file.
        path: PathBuf,
        /// The format that was expected ("fvecs", "npy", ...).
        format: &'static str,
        /// What is wrong, with the byte offset or record where it was found.
        reason: String,
    },
}

fn id_suffix(id: &Option<String>) -> String {
    match id {
        Some(id) => format!(" for id {id:?}"),
        None => String::new(),
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, HiveGpuError>;
