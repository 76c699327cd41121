//! Fuzzes the collection file reader (`docs/FORMAT.md`) end to end: any input is refused with
//! an error or parsed into a description whose every part lies inside the input; one that
//! parses is then opened as a collection on the CPU backend, copied (`open_storage`) and mapped
//! (`open_storage_mapped`): each refuses it with an error or gives a usable collection holding
//! exactly the file's live vectors, and the file's index (if any) filing each of them once.
//! (Fuzz builds accept any checksum, so the fuzzer reaches the
//! values, ids and payloads behind them: NaNs, repeated ids, norms out of range.)
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use hive_gpu::{GpuBackendType, GpuContext};
use libfuzzer_sys::fuzz_target;

struct Setup {
    context: GpuContext,
    file: PathBuf,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hive-gpu-fuzz-collection-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let context = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
        Setup { context, file: dir.join("c.hgc") }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(info) = hive_gpu::persist::inspect(data) else { return };
    assert!(data.starts_with(b"HIVEGPUC"));
    assert_eq!(info.file_bytes, data.len() as u64);
    assert!(info.live <= info.slots);
    let element = info.config.precision.element_bytes() as u64;
    assert!((info.slots as u64) * (info.config.dimension as u64) * element <= data.len() as u64);
    for section in &info.sections {
        assert!(section.offset % 64 == 0 && section.offset + section.length <= data.len() as u64);
    }
    let setup = setup();
    std::fs::write(&setup.file, data).expect("write the input");
    let copied = setup.context.open_storage(&setup.file);
    // SAFETY: this process alone writes the file, and not before `mapped` is dropped.
    let mapped = unsafe { setup.context.open_storage_mapped(&setup.file) };
    for storage in [copied, mapped].into_iter().flatten() {
        assert_eq!(storage.vector_count(), info.live);
        assert_eq!(storage.dimension(), info.config.dimension);
        // A saved index opens with the collection and files every live vector once.
        assert_eq!(storage.index_spec(), info.index.unwrap_or_default());
        if let Some(stats) = storage.index_stats() {
            assert_eq!(stats.list_lengths.iter().sum::<usize>(), info.live);
        }
        if info.live > 0 {
            let query = vec![0.5; info.config.dimension];
            let found = storage.search(&query, 1).expect("a search of an opened collection");
            assert!(found.len() <= 1);
            let options = hive_gpu::SearchOptions::default().with_exact(true);
            let exact = storage.search_with(&query, 1, &options).expect("an exact search");
            assert_eq!(exact.len(), 1);
        }
    }
});
