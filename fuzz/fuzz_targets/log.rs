//! Fuzzes the write-ahead log's replay (`docs/FORMAT.md`, "The write-ahead log") end to end:
//! the input, after a valid header, is a durable collection's log file, opened over an empty
//! snapshot with `GpuContext::open_durable`. Any input is refused with an error or replayed;
//! a replayed log is cut to its whole records, and the collection it gives is usable.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use hive_gpu::{DurableOptions, GpuBackendType, GpuContext, GpuDistanceMetric, StorageConfig};
use libfuzzer_sys::fuzz_target;

const DIM: usize = 3;

struct Setup {
    context: GpuContext,
    snapshot: PathBuf,
    wal: PathBuf,
    header: Vec<u8>,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hive-gpu-fuzz-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let context = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
        let snapshot = dir.join("c.hgc");
        let wal = dir.join("c.hgc.wal");
        drop(context.open_durable(&snapshot, config(), DurableOptions::default()).expect("a durable collection"));
        let header = std::fs::read(&wal).expect("the fresh log");
        assert_eq!(header.len(), 64);
        Setup { context, snapshot, wal, header }
    })
}

fn config() -> StorageConfig {
    StorageConfig::new(DIM, GpuDistanceMetric::Euclidean)
}

fuzz_target!(|records: &[u8]| {
    let setup = setup();
    let mut image = setup.header.clone();
    image.extend_from_slice(records);
    std::fs::write(&setup.wal, &image).expect("the log written");
    if let Ok(storage) = setup.context.open_durable(&setup.snapshot, config(), DurableOptions::default()) {
        let stats = storage.log_stats().expect("a durable collection");
        assert!(stats.log_bytes >= 64 && stats.log_bytes <= image.len() as u64);
        assert_eq!(stats.log_bytes + stats.torn_bytes, image.len() as u64);
        assert_eq!(std::fs::metadata(&setup.wal).expect("the log").len(), stats.log_bytes);
        if storage.vector_count() > 0 {
            storage.search(&[0.0; DIM], 3).expect("a search of the replayed collection");
        }
    }
});
