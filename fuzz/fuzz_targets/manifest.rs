//! Fuzzes the sharded collection's manifest reader (`docs/FORMAT.md`, "Sharded collections") end
//! to end: any input is refused with an error or parsed into a description that fits the input;
//! one that parses is then opened as a sharded collection over the shard files of a real save
//! (two shards, generation 1): the open refuses it with an error or gives a collection whose
//! shards hold every vector of those files, each once. (Fuzz builds accept any checksum, so the
//! fuzzer reaches the weights, counts and generations behind them.)
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use hive_gpu::{GpuBackendType, GpuContext, GpuDistanceMetric, ShardedStorage, StorageConfig};
use libfuzzer_sys::fuzz_target;

struct Setup {
    context: GpuContext,
    manifest: PathBuf,
    vectors: usize,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hive-gpu-fuzz-manifest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let context = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
        let config = StorageConfig::new(4, GpuDistanceMetric::Euclidean);
        let sharded =
            ShardedStorage::create_weighted(&[context.clone(), context.clone()], config, &[1.0, 1.0]).expect("sharded");
        let ids: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
        let values: Vec<f32> = (0..40 * 4).map(|i| (i % 13) as f32).collect();
        sharded.add_vectors_flat(&ids, &values).expect("adds");
        let manifest = dir.join("m.hgs");
        sharded.save(&manifest).expect("the shard files of generation 1");
        Setup { context, manifest, vectors: 40 }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(info) = hive_gpu::persist::inspect_manifest(data) else { return };
    assert!(hive_gpu::persist::is_manifest(data));
    let shards = info.weights.len();
    assert!(shards >= 1 && shards <= hive_gpu::persist::MAX_SHARDS);
    assert_eq!(data.len(), 64 + 32 * shards + 4);
    assert!(info.weights.iter().all(|w| w.is_finite() && *w > 0.0));
    let setup = setup();
    let path = setup.manifest.with_file_name("fuzzed.hgs");
    std::fs::write(&path, data).expect("write the input");
    // Shard files are looked up by the fuzzed manifest's name and generation: link the real
    // ones under it, so the fuzzer reaches the checks of each file against the manifest.
    let linked: Vec<PathBuf> = (0..shards.min(2))
        .map(|shard| {
            let real = setup.manifest.with_file_name(format!("m.hgs.shard-{:016x}-{shard}", 1u64));
            let named = path.with_file_name(format!("fuzzed.hgs.shard-{:016x}-{shard}", info.generation));
            let _ = std::fs::remove_file(&named);
            let _ = std::fs::hard_link(&real, &named);
            named
        })
        .collect();
    if let Ok(opened) = ShardedStorage::open(&path, &[setup.context.clone()]) {
        assert_eq!(opened.shard_count(), shards);
        assert_eq!(opened.vector_count(), setup.vectors);
        let found = opened.search(&[1.0, 2.0, 3.0, 4.0], 3).expect("a search of an opened collection");
        assert_eq!(found.len(), 3);
    }
    for named in linked {
        let _ = std::fs::remove_file(named);
    }
});
