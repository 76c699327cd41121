//! `hive-gpu`: backend information, benchmarks and exact searches from the command line.

/// `println!` that returns an error instead of panicking when stdout is closed (`| head`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
            .map_err(|source| hive_gpu::HiveGpuError::Io { path: "<stdout>".into(), source })?
    }};
}

/// A search returns one `Vec` per query, built on worker threads and freed by the caller. With
/// glibc's allocator each batch faulted fresh pages in (a perf profile): mimalloc made 10,000-query
/// batches a few percent faster on the GPU machine (`docs/PERFORMANCE.md`), and building a
/// million results twice as fast on two cores. The library leaves the allocator to the
/// application; this binary picks mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod bench_multi;
mod bench_writes;
mod collection;
mod dataset;
mod info;
mod json;
mod kmeans;
mod reference;
mod search;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use hive_gpu::{
    GpuBackendType, GpuContext, GpuDistanceMetric, HiveGpuError, SearchPrecision, StorageConfig,
    StoragePrecision,
};

#[derive(Parser)]
#[command(name = "hive-gpu", version, about = "Exact vector similarity search on CUDA, ROCm, Vulkan and CPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every backend, whether it is available and why, and each device's details; with
    /// --collection, a collection file's header and sections instead.
    Info(InfoArgs),
    /// Measure build time, QPS, latency and recall (default: the embedded SIFT10K set).
    Bench(BenchArgs),
    /// Exact k-NN of query vectors against base vectors or a collection file; prints ids and
    /// scores.
    Search(SearchArgs),
    /// Write a collection file from a vector file (ids are the row numbers).
    Build(BuildArgs),
    /// Measure acknowledged single-vector upserts per second from many writer threads on a
    /// durable collection (write-ahead log with group commit), beside the disk's flush rate.
    BenchWrites(BenchWritesArgs),
    /// Train k-means on a vector file (assignments on --backend) and report time and inertia.
    Kmeans(KMeansArgs),
    /// One device against a replicated and a sharded storage over several (--devices), on
    /// synthetic uniform data: batch QPS, single-query latency, and whether every query's
    /// neighbours equal one device's.
    BenchMulti(BenchMultiArgs),
}

#[derive(Args)]
struct BenchMultiArgs {
    /// The devices, as HIVE_GPU_DEVICES writes them: `cuda:0,cuda:1`, `cuda:all`, `cpu:0,cpu:0`
    /// (two logical shards on one device). The first is the single device compared against.
    #[arg(long, default_value = "all")]
    devices: String,
    /// Vectors on the single device and the replicated storage.
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
    /// Vectors in the sharded storage (default: twice --rows).
    #[arg(long)]
    sharded_rows: Option<usize>,
    /// Components per vector.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Queries per batch.
    #[arg(long, default_value_t = 10_000)]
    queries: usize,
    /// Neighbours per query.
    #[arg(short = 'k', default_value_t = 10)]
    k: usize,
    /// Timed passes of the whole batch per stage (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// One-query calls timed per stage.
    #[arg(long, default_value_t = 100)]
    singles: usize,
    /// Skip the single device over the sharded rows (the sharded storage's same-data ratio and
    /// exactness check).
    #[arg(long)]
    skip_single_sharded: bool,
    /// Skip the sharded storage (and the single device over its rows): one device against the
    /// replicated storage only.
    #[arg(long)]
    skip_sharded: bool,
    /// Also measure the sharded storage with its shards' lists merged on the host
    /// (`Tuning::device_merge` off), against the device merge the sharded stage takes where
    /// the shards' devices copy into one another.
    #[arg(long)]
    host_merge_too: bool,
    /// Distance metric.
    #[arg(long, value_enum, default_value_t = MetricArg::L2)]
    metric: MetricArg,
    /// Storage precision of the vectors.
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    precision: PrecisionArg,
    /// Seed of the data.
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// One JSON object per stage, then a summary object.
    #[arg(long)]
    json: bool,
}

impl BenchMultiArgs {
    fn settings_metric(&self) -> GpuDistanceMetric {
        self.metric.metric()
    }
}

#[derive(Args)]
struct KMeansArgs {
    /// Vectors to cluster (.fvecs, .bvecs, .npy, IDX).
    #[arg(long)]
    base: PathBuf,
    /// Clusters to find.
    #[arg(long)]
    clusters: usize,
    /// Lloyd iterations at most.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// Training vectors used at most (sampled); default 256 per cluster.
    #[arg(long)]
    max_training_vectors: Option<usize>,
    /// Seed of the sampling and the initial centroids.
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// Backend doing the assignments.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// One JSON object instead of a sentence.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchWritesArgs {
    /// Folder for the collection and its log (on the disk to measure).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Writer threads, each upserting one vector at a time and waiting for its acknowledgement.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Seconds to write for.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Components per vector.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// When a write is acknowledged: on the disk, in the OS's cache, or not logged at all.
    #[arg(long, value_enum, default_value_t = DurabilityArg::Disk)]
    durability: DurabilityArg,
    /// Backend to run on.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    backend: BackendArg,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum DurabilityArg {
    /// fdatasync before acknowledging (survives power loss).
    Disk,
    /// write() before acknowledging (survives the process being killed).
    Process,
    /// No log (an in-memory collection): the upper bound.
    None,
}

#[derive(Args)]
struct InfoArgs {
    /// A collection file (written by `hive-gpu build` or `GpuVectorStorage::save`).
    #[arg(long)]
    collection: Option<PathBuf>,
    /// Also open the collection on --backend and report how long that took, beside the time
    /// to read the file's bytes.
    #[arg(long, requires = "collection")]
    open: bool,
    /// Keep the collection's rows in the file, memory-mapped: the CPU backend searches them
    /// there without loading them (a collection larger than memory opens); GPU backends load
    /// them as usual. The file must not be changed by anyone while this command runs.
    #[arg(long, requires = "collection")]
    mapped: bool,
    /// Backend to open the collection on.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
}

#[derive(Args)]
struct BuildArgs {
    /// Base vectors (.fvecs, .bvecs, .npy, IDX).
    #[arg(long)]
    base: PathBuf,
    /// The collection file to write.
    #[arg(long)]
    out: PathBuf,
    /// Build this index over the vectors and save it with them (`ivf-flat:nlist=N`,
    /// `ivf-sq8:nlist=N`, `sq8`, `ivf-pq:nlist=N,m=M,bits=8|4`, `pq:m=M,bits=8|4`, `binary`).
    #[arg(long, default_value = "flat")]
    index: hive_gpu::IndexSpec,
    #[command(flatten)]
    settings: SearchSettings,
}

/// Where the vectors come from and how they are searched.
#[derive(Args, Clone)]
struct DataArgs {
    /// Folder holding `*_base.fvecs`, `*_query.fvecs` and optionally `*_groundtruth.ivecs`.
    #[arg(long, conflicts_with_all = ["base", "query", "collection"])]
    data: Option<PathBuf>,
    /// Base vectors (.fvecs, .bvecs, .npy, or IDX such as train-images-idx3-ubyte.gz).
    #[arg(long, requires = "query", conflicts_with = "collection")]
    base: Option<PathBuf>,
    /// A collection file (as `hive-gpu build` writes it, ids the row numbers) to open and
    /// search instead of building one from --base; its metric and precision apply, and the
    /// time reported is the open's.
    #[arg(long, requires = "query")]
    collection: Option<PathBuf>,
    /// Keep the collection's rows in the file, memory-mapped: the CPU backend searches them
    /// there without loading them (a collection larger than memory opens); GPU backends load
    /// them as usual. The file must not be changed by anyone while this command runs.
    #[arg(long, requires = "collection")]
    mapped: bool,
    /// Query vectors (same formats as --base).
    #[arg(long)]
    query: Option<PathBuf>,
    /// Ground-truth neighbour ids (.ivecs, one row per query, nearest first; L2 only).
    #[arg(long)]
    groundtruth: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct SearchSettings {
    /// Distance metric.
    #[arg(long, value_enum, default_value_t = MetricArg::L2)]
    metric: MetricArg,
    /// Neighbours per query.
    #[arg(short = 'k', default_value_t = 10)]
    k: usize,
    /// Backend to run on.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Storage precision of the vectors.
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    precision: PrecisionArg,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    settings: SearchSettings,
    /// Queries per search call (default: all at once; 1 = one by one). A comma list runs
    /// each size in turn on the same collection.
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// Several k values (comma list) measured in turn on the same collection; overrides -k.
    #[arg(long = "ks", value_delimiter = ',')]
    ks: Vec<usize>,
    /// Use only the first N queries.
    #[arg(long)]
    nq: Option<usize>,
    /// Measure recall against an f64 brute force on a sample of queries, even where a
    /// ground-truth file is given or found.
    #[arg(long)]
    exact_recall: bool,
    /// Also search with a filter: an allow-list of the fraction S of the rows (row i passes
    /// when splitmix64(i + 0x5eed) / 2^64 < S; scripts/bench_filter_peers.py uses the same
    /// rule), prepared once; recall is against an f64 brute force over the passing rows. A
    /// comma list measures each S in turn after the unfiltered search, on the same collection.
    #[arg(long, value_delimiter = ',')]
    filter_selectivity: Vec<f64>,
    /// With --filter-selectivity: pass the allow-list of ids itself to every search call
    /// instead of a filter prepared once, so that each call resolves the ids to slots and sends
    /// its set to the device (what a request that brings its own filter costs).
    #[arg(long, requires = "filter_selectivity")]
    filter_per_search: bool,
    /// Take each batch's results as flat arrays (`search_batch_results`) instead of a list of
    /// structures per query (`search_batch`), to measure what building them costs.
    #[arg(long)]
    columnar: bool,
    /// With `--columnar`: search every batch into the same arrays
    /// (`search_batch_results_into`), as a server answering batch after batch would, instead
    /// of fresh ones per call.
    #[arg(long, requires = "columnar")]
    reuse_results: bool,
    /// Build this index over the vectors before searching: `flat` (exact search, the
    /// default), `ivf-flat:nlist=N`, `ivf-sq8:nlist=N`, `sq8`, `ivf-pq:nlist=N,m=M,bits=8|4`,
    /// `pq:m=M,bits=8|4` or `binary`. Its build time is reported beside the adds'.
    #[arg(long, default_value = "flat")]
    index: hive_gpu::IndexSpec,
    /// Search parameters measured in turn on the one built index, e.g. `--search nprobe=8
    /// --search nprobe=32,refine=4` (also `exact`); each setting gets its own report or JSON
    /// object.
    #[arg(long = "search")]
    search_params: Vec<String>,
    /// Report the cheapest measured setting (highest QPS) whose recall reaches R. Without
    /// --search, an IVF index is measured at nprobe 1, 2, 4, ... up to its number of lists
    /// (IVF-PQ each at refine 2, 8 and 32; the flat SQ8 index at refine 1, 2, 4, ... 32, the
    /// flat PQ index at 1, 2, 4, ... 128, the binary index at 1, 4, 16, ... 1,024).
    #[arg(long)]
    target_recall: Option<f64>,
    /// Print one JSON object per batch size and k instead of the report.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SearchArgs {
    /// Base vectors (.fvecs, .bvecs, .npy, IDX).
    #[arg(long, required_unless_present = "collection", conflicts_with = "collection")]
    base: Option<PathBuf>,
    /// A collection file to search instead of --base (its metric and precision apply), or a
    /// sharded collection's manifest (`ShardedStorage::save`), opened on every device of
    /// --backend (under auto: those of HIVE_GPU_DEVICES, else every device of the best backend).
    #[arg(long)]
    collection: Option<PathBuf>,
    /// Keep the collection's rows in the file, memory-mapped: the CPU backend searches them
    /// there without loading them (a collection larger than memory opens); GPU backends load
    /// them as usual. The file must not be changed by anyone while this command runs.
    #[arg(long, requires = "collection")]
    mapped: bool,
    /// Query vectors (same formats as --base).
    #[arg(long)]
    query: PathBuf,
    #[command(flatten)]
    settings: SearchSettings,
    /// Search parameters for a collection with an index: `nprobe=N` (lists scanned per query;
    /// default 20), `refine=N` (a quantized index re-ranks the best N * k exactly; default 2
    /// for SQ8, 8 for PQ, 16 for binary) or `exact` (every vector, bypassing the index).
    #[arg(long = "search", default_value = "")]
    search_params: String,
    /// Print JSON lines (one object per query, ids and scores as arrays) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum MetricArg {
    L2,
    Cosine,
    Dot,
    /// Manhattan distance (exact search only).
    L1,
    /// Chebyshev (L-infinity) distance (exact search only).
    Linf,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    Auto,
    Cpu,
    Cuda,
    Rocm,
    Vulkan,
}

#[derive(Clone, Copy, ValueEnum)]
enum PrecisionArg {
    /// f32 storage, f32 candidate pass.
    F32,
    /// f16 storage (half the memory; f16 tensor cores on GPUs).
    F16,
    /// bfloat16 storage (half the memory, f32's range).
    Bf16,
    /// Signed-byte storage (a quarter of the memory): integer data in -128..=127 only.
    I8,
    /// Unsigned-byte storage (a quarter of the memory): integer data in 0..=255 only (SIFT's
    /// bvecs, pixels).
    U8,
    /// f32 storage, TF32 tensor-core candidate pass on GPUs (results stay exact).
    Fast,
}

impl MetricArg {
    fn metric(self) -> GpuDistanceMetric {
        match self {
            MetricArg::L2 => GpuDistanceMetric::Euclidean,
            MetricArg::Cosine => GpuDistanceMetric::Cosine,
            MetricArg::Dot => GpuDistanceMetric::DotProduct,
            MetricArg::L1 => GpuDistanceMetric::Manhattan,
            MetricArg::Linf => GpuDistanceMetric::Chebyshev,
        }
    }
}

impl PrecisionArg {
    fn storage(self) -> StoragePrecision {
        match self {
            PrecisionArg::F32 | PrecisionArg::Fast => StoragePrecision::F32,
            PrecisionArg::F16 => StoragePrecision::F16,
            PrecisionArg::Bf16 => StoragePrecision::Bf16,
            PrecisionArg::I8 => StoragePrecision::I8,
            PrecisionArg::U8 => StoragePrecision::U8,
        }
    }

    fn search(self) -> SearchPrecision {
        match self {
            PrecisionArg::Fast => SearchPrecision::Fast,
            _ => SearchPrecision::Exact,
        }
    }
}

impl SearchSettings {
    fn metric(&self) -> GpuDistanceMetric {
        self.metric.metric()
    }

    fn precision(&self) -> StoragePrecision {
        self.precision.storage()
    }

    fn search_precision(&self) -> SearchPrecision {
        self.precision.search()
    }

    fn storage_config(&self, dim: usize) -> StorageConfig {
        StorageConfig::new(dim, self.metric())
            .with_precision(self.precision())
            .with_search_precision(self.search_precision())
    }

    fn context(&self) -> Result<GpuContext, HiveGpuError> {
        self.backend.context()
    }
}

impl BackendArg {
    fn context(self) -> Result<GpuContext, HiveGpuError> {
        let backend = match self {
            BackendArg::Auto => return GpuContext::new(),
            BackendArg::Cpu => GpuBackendType::Cpu,
            BackendArg::Cuda => GpuBackendType::Cuda,
            BackendArg::Rocm => GpuBackendType::Rocm,
            BackendArg::Vulkan => GpuBackendType::Vulkan,
        };
        GpuContext::with_backend(backend, 0)
    }
}

/// Mesa's Vulkan device-select layer (an implicit layer every Mesa install enables) asks a
/// Wayland compositor for the default GPU when it enumerates devices, and libwayland prints
/// "error: XDG_RUNTIME_DIR is invalid or not set in the environment." to stderr once per
/// enumeration when there is no desktop session (servers, containers, CI). The binary picks its
/// adapter itself (discrete > integrated > virtual > software), so outside a session it turns
/// that layer off, through the switch its manifest names.
fn quiet_vulkan_layers() {
    let session =
        std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|dir| dir.to_string_lossy().starts_with('/'));
    if !session && std::env::var_os("NODEVICE_SELECT").is_none() {
        // SAFETY: called first thing in `main`, before this process starts any thread, so no
        // other thread can read the environment while it changes.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
}

fn main() -> ExitCode {
    quiet_vulkan_layers();
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Info(InfoArgs { collection: Some(path), open, mapped, backend }) => {
            collection::info(&path, open, mapped, backend)
        }
        Command::Info(InfoArgs { collection: None, .. }) => info::run(),
        Command::Build(args) => collection::build(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Search(args) => search::run(&args),
        Command::BenchWrites(args) => bench_writes::run(&args),
        Command::Kmeans(args) => kmeans::run(&args),
        Command::BenchMulti(args) => bench_multi::run(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`hive-gpu info | head`): nothing left to say.
        Err(HiveGpuError::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("hive-gpu: error: {err}");
            ExitCode::FAILURE
        }
    }
}
