//! `hive-gpu build` (vectors to a collection file) and `hive-gpu info --collection` (a
//! collection file's header and sections).

use std::path::Path;
use std::time::{Duration, Instant};

use hive_gpu::{HiveGpuError, io, persist};
use indicatif::{ProgressBar, ProgressStyle};

use crate::{BackendArg, BuildArgs, dataset};

pub fn build(args: &BuildArgs) -> Result<(), HiveGpuError> {
    let started = Instant::now();
    let spinner = ProgressBar::new_spinner();
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner.set_message(format!("reading {}", args.base.display()));
    let base = io::read_vectors(&args.base)?;
    spinner.finish_and_clear();
    let context = args.settings.context()?;
    let storage = context.create_storage_with(args.settings.storage_config(base.dim))?;
    let bar = ProgressBar::new(base.rows as u64).with_style(
        ProgressStyle::with_template("adding {bar:40} {pos}/{len} vectors ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    dataset::fill(&storage, &base, |added| bar.set_position(added as u64))?;
    bar.finish_and_clear();
    drop(base);
    if args.index != hive_gpu::IndexSpec::Flat {
        let spinner = ProgressBar::new_spinner();
        spinner.enable_steady_tick(Duration::from_millis(120));
        spinner.set_message(format!("building {}", args.index));
        storage.build_index(args.index)?;
        spinner.finish_and_clear();
    }
    let bar = vector_bar("saving", storage.slot_count() as u64);
    let saving = Instant::now();
    storage.save_with_progress(&args.out, &mut |done, _| bar.set_position(done))?;
    bar.finish_and_clear();
    let bytes = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
    out!(
        "wrote {} ({} vectors of {}, {:.1} MiB) in {:.2} s (save {:.2} s) on {}",
        args.out.display(),
        storage.vector_count(),
        storage.dimension(),
        bytes as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64(),
        saving.elapsed().as_secs_f64(),
        storage.backend_type().name()
    );
    Ok(())
}

pub fn info(path: &Path, open: bool, mapped: bool, backend: BackendArg) -> Result<(), HiveGpuError> {
    if is_manifest(path)? {
        return info_manifest(path, open, backend);
    }
    let info = persist::inspect_file(path)?;
    let c = &info.config;
    out!("file            {}", path.display());
    out!("format version  {}", info.format_version);
    out!("bytes           {}", info.file_bytes);
    out!("dimension       {}", c.dimension);
    out!("metric          {:?}", c.metric);
    out!("storage         {:?}", c.precision);
    out!("search          {:?}", c.search);
    out!("vectors         {} live of {} slots", info.live, info.slots);
    out!("index           {}", info.index.map_or("none (exact search)".to_string(), |i| i.to_string()));
    out!();
    out!(
        "{:<10} {:>7} {:>14} {:>14} {:>10} {:>10}",
        "section",
        "version",
        "offset",
        "bytes",
        "items",
        "crc32c"
    );
    for s in &info.sections {
        out!(
            "{:<10} {:>7} {:>14} {:>14} {:>10} {:>#10x}",
            s.name,
            s.version,
            s.offset,
            s.length,
            s.count,
            s.crc
        );
    }
    if open {
        let context = backend.context()?;
        let started = Instant::now();
        let bytes = std::fs::read(path).map_err(|source| HiveGpuError::Io { path: path.into(), source })?;
        let read = started.elapsed().as_secs_f64();
        drop(bytes);
        let started = Instant::now();
        let storage = self::open(&context, path, mapped, false)?;
        let opened = started.elapsed().as_secs_f64();
        out!();
        out!(
            "opened {} vectors on {} in {opened:.3} s; reading the file's bytes took {read:.3} s ({:.2}x)",
            storage.vector_count(),
            storage.backend_type().name(),
            opened / read.max(1e-9)
        );
    }
    Ok(())
}

/// A bar over `total` vectors, labelled `what` (hidden where stderr is no terminal).
fn vector_bar(what: &str, total: u64) -> ProgressBar {
    ProgressBar::new(total).with_style(
        ProgressStyle::with_template(&format!("{what} {{bar:40}} {{pos}}/{{len}} vectors ({{eta}} left)"))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// Opens the collection file at `path` on `context`, with a bar over its vectors unless
/// `quiet`; with `mapped`, its rows stay in the file (`GpuContext::open_storage_mapped`).
pub fn open(
    context: &hive_gpu::GpuContext,
    path: &Path,
    mapped: bool,
    quiet: bool,
) -> Result<hive_gpu::GpuVectorStorage, HiveGpuError> {
    let bar = if quiet { ProgressBar::hidden() } else { vector_bar("opening", 0) };
    let mut report = |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let storage = if mapped {
        // SAFETY: this command only reads the file, and `--mapped`'s help tells the user that
        // nothing may change the file while the command runs (the contract of the mapping).
        unsafe { context.open_storage_mapped_with_progress(path, &mut report) }
    } else {
        context.open_storage_with_progress(path, &mut report)
    };
    bar.finish_and_clear();
    storage
}

/// Whether the file at `path` starts like a sharded collection's manifest.
pub fn is_manifest(path: &Path) -> Result<bool, HiveGpuError> {
    use std::io::Read as _;
    let io = |source| HiveGpuError::Io { path: path.into(), source };
    let mut head = Vec::with_capacity(8);
    std::fs::File::open(path).map_err(io)?.take(8).read_to_end(&mut head).map_err(io)?;
    Ok(persist::is_manifest(&head))
}

/// `hive-gpu info --collection` of a sharded collection's manifest: its shards, and with `open`
/// the time to open them all on the backend's devices.
fn info_manifest(path: &Path, open: bool, backend: BackendArg) -> Result<(), HiveGpuError> {
    let io = |source| HiveGpuError::Io { path: path.into(), source };
    let longest = 64 + 32 * persist::MAX_SHARDS as u64 + 4;
    let bytes = std::fs::metadata(path).map_err(io)?.len();
    if bytes > longest {
        return Err(HiveGpuError::InvalidArgument(format!(
            "{} has {bytes} bytes: a manifest has at most {longest}",
            path.display()
        )));
    }
    let image = std::fs::read(path).map_err(io)?;
    let info = persist::inspect_manifest(&image).map_err(|e| HiveGpuError::InvalidFormat {
        path: path.into(),
        format: "hive-gpu sharded collection manifest",
        reason: e.to_string(),
    })?;
    out!("file            {} (a sharded collection's manifest)", path.display());
    out!("manifest        version {}, save generation {}", info.version, info.generation);
    out!("shards          {}", info.weights.len());
    out!("vectors         {}", info.vectors.iter().sum::<u64>());
    out!("next order key  {}", info.next_order);
    out!();
    out!("{:<6} {:>12} {:>14} {:>16}", "shard", "weight", "vectors", "file bytes");
    for (i, ((w, v), b)) in info.weights.iter().zip(&info.vectors).zip(&info.file_bytes).enumerate() {
        out!("{i:<6} {w:>12.4e} {v:>14} {b:>16}");
    }
    if open {
        let contexts = match backend {
            BackendArg::Auto => hive_gpu::GpuContext::all_devices()?,
            other => vec![other.context()?],
        };
        let started = Instant::now();
        let storage = hive_gpu::ShardedStorage::open(path, &contexts)?;
        out!();
        out!(
            "opened          {} vectors on {} context(s) in {:.3} s",
            storage.vector_count(),
            contexts.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
