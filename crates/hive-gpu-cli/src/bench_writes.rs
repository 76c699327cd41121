//! `hive-gpu bench-writes`: acknowledged single-vector upserts per second from many writer
//! threads on a durable collection (group commit), beside the disk's own flush rate measured
//! in the same run, which bounds what any write-ahead log can acknowledge.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hive_gpu::{Durability, DurableOptions, GpuVector, HiveGpuError, StorageConfig};

use crate::{BenchWritesArgs, DurabilityArg};

pub fn run(args: &BenchWritesArgs) -> Result<(), HiveGpuError> {
    let io = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| HiveGpuError::Io { path: path.clone(), source }
    };
    std::fs::create_dir_all(&args.dir).map_err(io(&args.dir))?;
    let context = args.backend.context()?;
    let config = StorageConfig::new(args.dim, hive_gpu::GpuDistanceMetric::Euclidean);
    let path = args.dir.join("bench-writes.hgc");
    let wal = args.dir.join("bench-writes.hgc.wal");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&wal);
    let storage = match args.durability {
        DurabilityArg::None => context.create_storage_with(config)?,
        DurabilityArg::Disk | DurabilityArg::Process => {
            let durability = if matches!(args.durability, DurabilityArg::Disk) {
                Durability::Disk
            } else {
                Durability::Process
            };
            let options =
                DurableOptions::default().with_durability(durability).with_checkpoint_log_bytes(u64::MAX);
            context.open_durable(&path, config, options)?
        }
    };
    let storage = Arc::new(storage);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let mut latencies = Vec::new();
    let started = Instant::now();
    std::thread::scope(|s| -> Result<(), HiveGpuError> {
        let workers: Vec<_> = (0..args.threads)
            .map(|t| {
                let (storage, stop, acked) = (storage.clone(), stop.clone(), acked.clone());
                let dim = args.dim;
                s.spawn(move || -> Result<Vec<f64>, HiveGpuError> {
                    let mut mine = Vec::new();
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let data: Vec<f32> =
                            (0..dim).map(|d| ((i as usize * 31 + d * 7 + t) % 97) as f32).collect();
                        let one = Instant::now();
                        storage.add_vectors(&[GpuVector::new(format!("t{t}-{i}"), data)])?;
                        mine.push(one.elapsed().as_secs_f64());
                        acked.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                    Ok(mine)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(args.seconds));
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            latencies.extend(w.join().map_err(|_| HiveGpuError::Internal("a writer panicked".into()))??);
        }
        Ok(())
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let acked = acked.load(Ordering::Relaxed);
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
            * 1e3
    };
    let stats = storage.log_stats().unwrap_or_default();
    drop(storage);
    let floor = flush_floor(&args.dir, 12 + 8 + 16 + 4 * args.dim, 1.0).map_err(io(&args.dir))?;
    let rate = acked as f64 / elapsed;
    let mode = match args.durability {
        DurabilityArg::None => "none",
        DurabilityArg::Disk => "disk",
        DurabilityArg::Process => "process",
    };
    if args.json {
        out!(
            "{{\"durability\":\"{mode}\",\"threads\":{},\"dim\":{},\"seconds\":{elapsed:.3},\"acked\":{acked},\"acked_per_s\":{rate:.0},\"p50_ms\":{:.4},\"p99_ms\":{:.4},\"flushes\":{},\"records_per_flush\":{:.2},\"disk_flushes_per_s\":{floor:.0},\"bound_per_s\":{:.0}}}",
            args.threads,
            args.dim,
            pct(0.5),
            pct(0.99),
            stats.flushes,
            stats.records as f64 / stats.flushes.max(1) as f64,
            floor * args.threads as f64
        );
    } else {
        out!(
            "durability        {mode} ({} writer threads, dim {}, {:.1} s)",
            args.threads,
            args.dim,
            elapsed
        );
        out!("acknowledged      {acked} upserts, {rate:.0} per second");
        out!("latency           p50 {:.3} ms, p99 {:.3} ms", pct(0.5), pct(0.99));
        if stats.flushes > 0 {
            out!(
                "log               {} flushes, {:.2} records per flush, {:.1} MiB",
                stats.flushes,
                stats.records as f64 / stats.flushes as f64,
                stats.log_bytes as f64 / (1 << 20) as f64
            );
        }
        out!(
            "disk              {floor:.0} append+fdatasync per second from one thread: {} threads that each wait for their own flush can be acknowledged at most {:.0} times per second",
            args.threads,
            floor * args.threads as f64
        );
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&wal);
    Ok(())
}

/// Appends of `record_bytes` followed by `fdatasync`, per second, for `seconds`: the disk's
/// flush rate, what a log under `Durability::Disk` waits for.
fn flush_floor(dir: &std::path::Path, record_bytes: usize, seconds: f64) -> std::io::Result<f64> {
    let path = dir.join("bench-writes.floor");
    let mut file = std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(&path)?;
    let record = vec![7u8; record_bytes];
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        file.write_all(&record)?;
        file.sync_data()?;
        n += 1;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(rate)
}
