//! Saved collections: `open(save(x))` equals `x` on every backend (ids, values bit for bit,
//! f16, metadata, typed payloads and the filters over them, tie order), the files released
//! builds wrote (every format version, storage type, metric and index type, and a write-ahead
//! log) still open to what they held, hostile files get errors naming where they went wrong
//! (never a panic), and a save killed at any moment leaves the old file or the new one.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::stored::{assert_same_collection, populated, reseal_header, reseal_section_of, scratch_dir};
use common::{Rng, contexts, describe};
use hive_gpu::{
    GpuBackendType, GpuContext, GpuDistanceMetric, GpuVector, GpuVectorStorage, HiveGpuError, IndexSpec,
    StoragePrecision,
};

/// `image` with its config section's u32 `word` (0 the metric, 1 the storage precision)
/// replaced by `code` and every checksum made right again (the config is the first section of
/// the table; its u32 words follow two u64).
fn with_config_word(image: &[u8], word: usize, code: u32) -> Vec<u8> {
    let mut out = image.to_vec();
    let at = u64::from_le_bytes(out[64 + 8..64 + 16].try_into().unwrap()) as usize + 16 + 4 * word;
    out[at..at + 4].copy_from_slice(&code.to_le_bytes());
    reseal_section_of(&mut out, at);
    out
}

fn with_metric_code(image: &[u8], code: u32) -> Vec<u8> {
    with_config_word(image, 0, code)
}

#[test]
fn saved_collections_open_equal_on_every_backend() {
    let dir = scratch_dir("roundtrip");
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    for context in contexts() {
        for (m, metric) in common::METRICS.into_iter().enumerate() {
            for precision in StoragePrecision::ALL {
                let what = format!("{} {metric:?} {precision:?}", describe(&context));
                let seed = 100 + m as u64;
                let count = 700;
                let original = populated(&context, metric, precision, seed, count);
                let path = dir.join(format!("{}-{m}-{precision:?}.hgc", context.backend_type()));
                original.save(&path).unwrap_or_else(|e| panic!("{what}: save: {e}"));
                let reopened = context.open_storage(&path).unwrap_or_else(|e| panic!("{what}: open: {e}"));
                assert_same_collection(&what, &original, &reopened, count, seed);
                // Any backend opens any backend's file.
                let on_cpu =
                    cpu.open_storage(&path).unwrap_or_else(|e| panic!("{what}: open on the CPU: {e}"));
                assert_same_collection(&format!("{what} on the CPU"), &original, &on_cpu, count, seed);
                // Saving what was opened gives the same bytes: a file is a function of its
                // collection (after the compaction an open implies).
                let again = dir.join("again.hgc");
                reopened.save(&again).expect("save again");
                let twice = dir.join("twice.hgc");
                context.open_storage(&again).expect("open again").save(&twice).expect("save twice");
                assert_eq!(
                    std::fs::read(&again).unwrap(),
                    std::fs::read(&twice).unwrap(),
                    "{what}: files differ"
                );
            }
        }
    }
    let empty = cpu.create_storage(3, GpuDistanceMetric::Cosine).unwrap();
    let path = dir.join("empty.hgc");
    empty.save(&path).expect("an empty collection saves");
    let opened = cpu.open_storage(&path).expect("and opens");
    assert_eq!(
        (opened.vector_count(), opened.dimension(), opened.metric()),
        (0, 3, GpuDistanceMetric::Cosine)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file written by a released build, kept in `tests/data/formats/` exactly as written.
struct Kept {
    /// Its name in `tests/data/formats/`.
    name: &'static str,
    /// The format version its header gives.
    format: u32,
    /// Its CRC-32C. A kept file is never rewritten: a writer that changes adds a file (of a new
    /// format version, type or index), it does not replace one, or the test would no longer
    /// say that what the old build wrote still opens.
    crc: u32,
    /// The collection it holds, without its index, made again by this build.
    make: fn(&GpuContext) -> GpuVectorStorage,
    /// The index it holds.
    index: IndexSpec,
}

/// Every kept file: each format version, storage type, metric and index type a release has
/// written. The collections come from `common::stored::populated`, which must therefore keep
/// making the same ones.
const KEPT: &[Kept] = &[
    Kept {
        name: "collection-v1.hgc",
        format: 1,
        crc: 0xf22fab01,
        make: |c| populated(c, GpuDistanceMetric::Cosine, StoragePrecision::F16, 7, 60),
        index: IndexSpec::Flat,
    },
    Kept {
        name: "collection-v2.hgc",
        format: 2,
        crc: 0x26b3789f,
        make: |c| populated(c, GpuDistanceMetric::Cosine, StoragePrecision::F16, 7, 60),
        index: IndexSpec::IvfFlat { nlist: 4 },
    },
    Kept {
        name: "collection-v1-bf16-l1.hgc",
        format: 1,
        crc: 0x60d16582,
        make: |c| populated(c, GpuDistanceMetric::Manhattan, StoragePrecision::Bf16, 11, 50),
        index: IndexSpec::Flat,
    },
    Kept {
        name: "collection-v1-i8-linf.hgc",
        format: 1,
        crc: 0xc47442c6,
        make: |c| populated(c, GpuDistanceMetric::Chebyshev, StoragePrecision::I8, 12, 50),
        index: IndexSpec::Flat,
    },
    Kept {
        name: "collection-v1-u8-dot.hgc",
        format: 1,
        crc: 0x98cf290d,
        make: |c| populated(c, GpuDistanceMetric::DotProduct, StoragePrecision::U8, 13, 50),
        index: IndexSpec::Flat,
    },
    Kept {
        name: "collection-v2-ivf-sq8.hgc",
        format: 2,
        crc: 0xc9f1f79e,
        make: |c| populated(c, GpuDistanceMetric::Euclidean, StoragePrecision::F32, 14, 80),
        index: IndexSpec::IvfSq8 { nlist: 4 },
    },
    Kept {
        name: "collection-v2-sq8.hgc",
        format: 2,
        crc: 0x1e1f8c9f,
        make: |c| populated(c, GpuDistanceMetric::DotProduct, StoragePrecision::F32, 15, 80),
        index: IndexSpec::Sq8,
    },
    Kept {
        name: "collection-v2-binary.hgc",
        format: 2,
        crc: 0xd981e3eb,
        make: |c| populated(c, GpuDistanceMetric::Cosine, StoragePrecision::F32, 16, 80),
        index: IndexSpec::Binary,
    },
    Kept {
        name: "collection-v2-ivf-pq.hgc",
        format: 2,
        crc: 0x85f5e8e8,
        make: |c| populated(c, GpuDistanceMetric::Euclidean, StoragePrecision::F16, 17, 300),
        index: IndexSpec::IvfPq { nlist: 2, m: 19, bits: 8 },
    },
    Kept {
        name: "collection-v4.hgc",
        format: 4,
        crc: 0xf8327dc3,
        make: |c| populated(c, GpuDistanceMetric::Cosine, StoragePrecision::F16, 7, 60),
        index: IndexSpec::IvfFlat { nlist: 4 },
    },
    Kept {
        name: "collection-v2-pq.hgc",
        format: 2,
        crc: 0x9ff42d66,
        make: |c| populated(c, GpuDistanceMetric::Euclidean, StoragePrecision::F32, 18, 120),
        index: IndexSpec::Pq { m: 19, bits: 4 },
    },
];

/// The path of a kept file (relative to the package folder, the working directory of `cargo
/// test` and of the GPU bundle's runner).
fn kept_path(name: &str) -> PathBuf {
    Path::new("tests/data/formats").join(name)
}

/// Writes the kept files that are missing (`HIVE_GPU_WRITE_FORMAT_FILES=1`, when a release adds
/// a format version, type or index), never over one that exists, and prints the CRC-32C of
/// each for [`KEPT`].
fn write_missing_kept_files(cpu: &GpuContext) {
    if std::env::var("HIVE_GPU_WRITE_FORMAT_FILES").as_deref() != Ok("1") {
        return;
    }
    std::fs::create_dir_all("tests/data/formats").unwrap();
    for kept in KEPT {
        let path = kept_path(kept.name);
        if !path.exists() {
            let storage = (kept.make)(cpu);
            if kept.index != IndexSpec::Flat {
                storage.build_index(kept.index).expect("the kept file's index");
            }
            storage.save(&path).expect("write a kept file");
        }
        eprintln!("{}: crc 0x{:08x}", kept.name, crc32c::crc32c(&std::fs::read(&path).unwrap()));
    }
}

#[test]
fn every_kept_file_of_a_released_format_opens_to_the_collection_that_wrote_it() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    write_missing_kept_files(&cpu);
    let dir = scratch_dir("kept");
    for kept in KEPT {
        let path = kept_path(kept.name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", kept.name));
        assert_eq!(
            crc32c::crc32c(&bytes),
            kept.crc,
            "{} changed: kept files are never rewritten (add a new one instead)",
            kept.name
        );
        let info = hive_gpu::persist::inspect_file(&path).expect("a kept file's header");
        assert_eq!(info.format_version, kept.format, "{}", kept.name);
        let expected = (kept.make)(&cpu);
        let count = expected.slot_count() + 10;
        // This build still writes this version for this content: one that writes a newer one
        // must add its kept files.
        let now = dir.join("now.hgc");
        if kept.index != IndexSpec::Flat {
            let indexed = (kept.make)(&cpu);
            indexed.build_index(kept.index).expect("an index");
            indexed.save(&now).expect("save");
        } else {
            expected.save(&now).expect("save");
        }
        // This build writes a version some kept file holds: one that writes a newer one must
        // add its kept files (older versions stay kept, and stay opened below).
        let written = hive_gpu::persist::inspect_file(&now).expect("header").format_version;
        assert!(
            KEPT.iter().any(|k| k.format == written),
            "{}: this build writes version {written}, which no kept file holds",
            kept.name
        );
        assert!(written >= kept.format, "{}: this build writes an older version, {written}", kept.name);
        for context in contexts() {
            let what = format!("{} on {}", kept.name, describe(&context));
            let opened = context.open_storage(&path).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(opened.index_spec(), kept.index, "{what}");
            if kept.index != IndexSpec::Flat {
                // The trained centroids and quantizer are the file's own (a fresh training may
                // differ): with every list probed and every scanned row re-ranked, the index
                // must answer exactly, whatever it learned.
                let stats = opened.index_stats().expect("the index");
                assert_eq!(stats.list_lengths.iter().sum::<usize>(), opened.vector_count(), "{what}");
                let dim = opened.dimension();
                let queries = Rng::new(3).normals(4 * dim);
                let k = 7;
                let all = hive_gpu::SearchOptions::default()
                    .with_nprobe(stats.list_lengths.len())
                    .with_refine_factor(opened.vector_count().div_ceil(k));
                let exact = hive_gpu::SearchOptions::default().with_exact(true);
                let (a, b) = (
                    opened.search_batch_with(&queries, k, &all).unwrap(),
                    opened.search_batch_with(&queries, k, &exact).unwrap(),
                );
                for (q, (x, y)) in a.iter().zip(&b).enumerate() {
                    let ids =
                        |r: &[hive_gpu::GpuSearchResult]| r.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
                    assert_eq!(ids(x), ids(y), "{what}: query {q} through the index and exactly");
                }
            }
            // Saved again by this build and opened: the same collection and index.
            let again = dir.join("again.hgc");
            opened.save(&again).unwrap_or_else(|e| panic!("{what}: save: {e}"));
            let reopened = context.open_storage(&again).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            assert_eq!(reopened.index_spec(), kept.index, "{what}: saved again");
            // The contents, the exact answers and the filters over the payloads, without the index.
            opened.build_index(IndexSpec::Flat).expect("drop the index");
            assert_same_collection(&what, &expected, &opened, count, 7);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The durable collection kept in `tests/data/formats/durable-v1/` (log format version 1): an
/// empty snapshot and a write-ahead log of the four writes below, never checkpointed, with the
/// CRC-32C of each file (never rewritten, as [`KEPT`]).
const KEPT_LOG: (&str, u32, u32) = ("durable-v1", 0x21df8805, 0xd93f2ffd);

/// The writes the kept log holds, applied to `storage`: the vectors of a populated collection
/// in two batches, a removal of every fifth, and an upsert of every seventh with another's
/// values and payload.
fn kept_log_writes(storage: &GpuVectorStorage) {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let source = populated(&cpu, GpuDistanceMetric::Euclidean, StoragePrecision::F32, 21, 40);
    let vectors: Vec<hive_gpu::GpuVector> = common::stored::ids_of(&source, 40)
        .iter()
        .map(|id| source.get_vector(id).unwrap().expect("a stored vector"))
        .collect();
    let (first, second) = vectors.split_at(vectors.len() / 2);
    storage.add_vectors(first).expect("add");
    storage.add_vectors(second).expect("add");
    let removed: Vec<String> = vectors.iter().step_by(5).map(|v| v.id.clone()).collect();
    storage.remove_vectors(&removed).expect("remove");
    let upserted: Vec<hive_gpu::GpuVector> = vectors
        .iter()
        .skip(3)
        .step_by(7)
        .zip(vectors.iter().rev())
        .map(|(v, other)| hive_gpu::GpuVector { id: v.id.clone(), ..other.clone() })
        .collect();
    storage.add_vectors(&upserted).expect("upsert");
}

fn kept_log_config() -> hive_gpu::StorageConfig {
    hive_gpu::StorageConfig::new(19, GpuDistanceMetric::Euclidean)
}

#[test]
fn the_kept_write_ahead_log_replays_to_the_writes_it_acknowledged() {
    let (name, snapshot_crc, log_crc) = KEPT_LOG;
    let kept = kept_path(name);
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    if std::env::var("HIVE_GPU_WRITE_FORMAT_FILES").as_deref() == Ok("1") && !kept.exists() {
        std::fs::create_dir_all(&kept).unwrap();
        let durable = cpu
            .open_durable(kept.join("collection.hgc"), kept_log_config(), hive_gpu::DurableOptions::default())
            .expect("a durable collection");
        kept_log_writes(&durable);
        assert_eq!(durable.log_stats().expect("a log").checkpoints, 0, "the writes stay in the log");
        drop(durable);
        let _ = std::fs::remove_file(kept.join("collection.hgc.lock"));
        for file in ["collection.hgc", "collection.hgc.wal"] {
            let crc = crc32c::crc32c(&std::fs::read(kept.join(file)).unwrap());
            eprintln!("{name}/{file}: crc 0x{crc:08x}");
        }
    }
    let expected = cpu.create_storage_with(kept_log_config()).expect("a collection");
    kept_log_writes(&expected);
    let dir = scratch_dir("kept-log");
    for (file, crc) in [("collection.hgc", snapshot_crc), ("collection.hgc.wal", log_crc)] {
        let bytes = std::fs::read(kept.join(file)).unwrap_or_else(|e| panic!("{name}/{file}: {e}"));
        assert_eq!(crc32c::crc32c(&bytes), crc, "{name}/{file} changed: kept files are never rewritten");
        std::fs::write(dir.join(file), bytes).unwrap();
    }
    for context in contexts() {
        // Opened from a copy each time: an open replays the log and may checkpoint it.
        let copy = dir.join(format!("{}", context.backend_type()));
        std::fs::create_dir_all(&copy).unwrap();
        for file in ["collection.hgc", "collection.hgc.wal"] {
            std::fs::copy(dir.join(file), copy.join(file)).unwrap();
        }
        let what = format!("the kept log on {}", describe(&context));
        let opened = context
            .open_durable(copy.join("collection.hgc"), kept_log_config(), hive_gpu::DurableOptions::default())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let stats = opened.log_stats().expect("a log");
        assert_eq!((stats.replayed, stats.torn_bytes), (4, 0), "{what}: every logged write replayed");
        assert_same_collection(&what, &expected, &opened, 50, 21);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn open_error(context: &GpuContext, path: &Path, image: &[u8]) -> String {
    std::fs::write(path, image).unwrap();
    match context.open_storage(path) {
        Ok(_) => panic!("a damaged file opened"),
        Err(e @ HiveGpuError::InvalidFormat { .. }) => e.to_string(),
        Err(e) => panic!("a damaged file gave {e:?}, not InvalidFormat"),
    }
}

#[test]
fn damaged_files_are_refused_by_name_and_offset_never_with_a_panic() {
    let dir = scratch_dir("hostile");
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let good = dir.join("good.hgc");
    populated(&cpu, GpuDistanceMetric::Euclidean, StoragePrecision::F32, 3, 120).save(&good).unwrap();
    let image = std::fs::read(&good).unwrap();
    let bad = dir.join("bad.hgc");

    // Every truncation.
    for len in (0..image.len()).step_by(13).chain([image.len() - 1]) {
        let e = open_error(&cpu, &bad, &image[..len]);
        assert!(e.contains("header") || e.contains("truncated"), "truncated to {len}: {e}");
    }
    // A flipped byte anywhere: some checksum or check names the part.
    let mut rng = Rng::new(9);
    for _ in 0..300 {
        let at = rng.below(image.len());
        let mut damaged = image.clone();
        damaged[at] ^= 1 << rng.below(8);
        let e = open_error(&cpu, &bad, &damaged);
        assert!(e.contains("at byte"), "flip at {at}: {e}");
    }
    let mut wrong = image.clone();
    wrong[0] = b'X';
    assert!(open_error(&cpu, &bad, &wrong).contains("magic"));
    let mut future = image.clone();
    // The version after the newest this build reads (4: the payload index section).
    future[8..12].copy_from_slice(&5u32.to_le_bytes());
    reseal_header(&mut future);
    assert!(open_error(&cpu, &bad, &future).contains("format version 5"));
    // A payload index section in a file that says it is of an older version (a reader of
    // that version would not know the section).
    let mut older = image.clone();
    older[8..12].copy_from_slice(&3u32.to_le_bytes());
    reseal_header(&mut older);
    let e = open_error(&cpu, &bad, &older);
    assert!(e.contains("a payload index section in a format version 3 file"), "{e}");

    // A payload record changed, every checksum resealed: the stored payload index no longer
    // agrees with it, and the file is refused naming the index and the field (a filter would
    // otherwise answer from a value no record holds).
    let mut changed = image.clone();
    let field = b"bucket\x01";
    let at = changed.windows(field.len()).position(|w| w == field).expect("a bucket field") + field.len();
    changed[at] = changed[at].wrapping_add(100);
    reseal_section_of(&mut changed, at);
    let e = open_error(&cpu, &bad, &changed);
    assert!(e.contains("payload index") && e.contains("bucket"), "{e}");

    // An absurd slot count in a config whose checksums are all correct: refused by the vector
    // section's length, before anything is allocated for the slots.
    let config_at = u64::from_le_bytes(image[64 + 8..64 + 16].try_into().unwrap()) as usize;
    let mut absurd = image.clone();
    absurd[config_at + 8..config_at + 16].copy_from_slice(&(u64::MAX / 3).to_le_bytes());
    let body_crc = crc32c::crc32c(&absurd[config_at..config_at + 32]);
    absurd[64 + 32..64 + 36].copy_from_slice(&body_crc.to_le_bytes());
    let sections = u32::from_le_bytes(image[16..20].try_into().unwrap()) as usize;
    let table_end = 64 + sections * 40;
    let table_crc = crc32c::crc32c(&absurd[64..table_end]);
    absurd[56..60].copy_from_slice(&table_crc.to_le_bytes());
    reseal_header(&mut absurd);
    let e = open_error(&cpu, &bad, &absurd);
    assert!(e.contains("vectors") && e.contains("rows"), "{e}");

    // Metric codes with every checksum correct: one no release knows, and L-infinity (4) in a
    // file that carries an index section, which no index over that metric can have written.
    let e = open_error(&cpu, &bad, &with_metric_code(&image, 5));
    assert!(e.contains("unknown metric code 5"), "{e}");
    let indexed = populated(&cpu, GpuDistanceMetric::Euclidean, StoragePrecision::F32, 3, 120);
    indexed.build_index("ivf-flat:nlist=4".parse().unwrap()).expect("build");
    let indexed_path = dir.join("indexed.hgc");
    indexed.save(&indexed_path).expect("save");
    let indexed_image = std::fs::read(&indexed_path).unwrap();
    let e = open_error(&cpu, &bad, &with_metric_code(&indexed_image, 4));
    assert!(e.contains("index") && e.contains("linf metric, which no index supports"), "{e}");
    assert_eq!(cpu.open_storage(&indexed_path).unwrap().index_spec().to_string(), "ivf-flat:nlist=4");

    // Storage precision codes with every checksum correct: one no release knows, and an f32
    // file relabelled u8 (4), whose vector section then holds four times the rows its slots
    // can have: refused by the section's length, nothing read as bytes.
    let e = open_error(&cpu, &bad, &with_config_word(&image, 1, 5));
    assert!(e.contains("unknown storage precision code 5"), "{e}");
    let e = open_error(&cpu, &bad, &with_config_word(&image, 1, 4));
    assert!(e.contains("vectors") && e.contains("1-byte"), "{e}");

    // The good file still opens, and a missing one is an I/O error naming it.
    assert_eq!(
        cpu.open_storage(&good).unwrap().vector_count(),
        populated(&cpu, GpuDistanceMetric::Euclidean, StoragePrecision::F32, 3, 120).vector_count()
    );
    let missing = cpu.open_storage(dir.join("missing.hgc")).unwrap_err();
    assert!(
        matches!(missing, HiveGpuError::Io { .. }) && missing.to_string().contains("missing.hgc"),
        "{missing}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn save_and_open_report_their_progress_to_the_last_vector() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let dir = scratch_dir("progress");
    let path = dir.join("c.hgc");
    // More vectors than one step of either (65,536), removed slots included.
    let storage = populated(&cpu, GpuDistanceMetric::Euclidean, StoragePrecision::F16, 4, 150_000);
    let mut seen = Vec::new();
    storage.save_with_progress(&path, &mut |done, total| seen.push((done, total))).unwrap();
    let slots = storage.slot_count() as u64;
    assert!(seen.len() >= 3 && seen.windows(2).all(|w| w[0].0 < w[1].0), "{seen:?}");
    assert_eq!(seen.last(), Some(&(slots, slots)));
    seen.clear();
    let opened = cpu.open_storage_with_progress(&path, &mut |done, total| seen.push((done, total))).unwrap();
    let live = storage.vector_count() as u64;
    // An open reports in steps of 128 MiB of rows: this file's few megabytes are one step.
    assert!(!seen.is_empty() && seen.windows(2).all(|w| w[0].0 < w[1].0), "{seen:?}");
    assert_eq!(seen.last(), Some(&(live, live)));
    assert_same_collection("opened in steps", &storage, &opened, 150_000, 3);
    // A mapped open reports too: on the CPU the rows stay in the file, in one report.
    seen.clear();
    // SAFETY: nothing writes the file while `mapped` lives (this test alone uses it).
    let mapped =
        unsafe { cpu.open_storage_mapped_with_progress(&path, &mut |done, total| seen.push((done, total))) }
            .unwrap();
    assert_eq!(seen.last(), Some(&(live, live)), "mapped: {seen:?}");
    drop(mapped);
    // So does a durable open of the snapshot, before the log replays.
    seen.clear();
    let durable = cpu
        .open_durable_with_progress(
            &path,
            storage.config(),
            hive_gpu::DurableOptions::default(),
            &mut |done, total| seen.push((done, total)),
        )
        .unwrap();
    assert_eq!(seen.last(), Some(&(live, live)), "durable: {seen:?}");
    drop(durable);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_whose_ids_repeat_far_apart_is_refused_naming_the_id_and_both_slots() {
    let dir = scratch_dir("repeated-ids");
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    // More vectors than any step of an open, so that the two copies land in different steps.
    let count = 300_000;
    let ids: Vec<String> = (0..count).map(|i| format!("id-{i:06}")).collect();
    let values: Vec<f32> = (0..count * 2).map(|i| (i % 1009) as f32).collect();
    let storage = cpu.create_storage(2, GpuDistanceMetric::Euclidean).unwrap();
    storage.add_vectors_flat(&ids, &values).unwrap();
    let good = dir.join("good.hgc");
    storage.save(&good).unwrap();
    let mut image = std::fs::read(&good).unwrap();
    // The last id becomes a copy of an early one, every checksum resealed.
    let last = format!("id-{:06}", count - 1);
    let at = image.windows(last.len()).rposition(|w| w == last.as_bytes()).expect("the last id");
    image[at..at + last.len()].copy_from_slice(b"id-000003");
    reseal_section_of(&mut image, at);
    let bad = dir.join("bad.hgc");
    // A description refuses it too (`hive-gpu info`).
    let described = hive_gpu::persist::inspect(&image).expect_err("inspect accepted a repeated id");
    assert!(
        described.to_string().contains("id-000003") && described.to_string().contains("twice"),
        "{described}"
    );
    for context in contexts() {
        let e = open_error(&context, &bad, &image);
        assert!(
            e.contains("id-000003")
                && e.contains("twice")
                && e.contains('3')
                && e.contains(&(count - 1).to_string()),
            "{}: {e}",
            describe(&context)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_mapped_collection_searches_in_place_and_copies_its_rows_only_when_vectors_are_added() {
    let dir = scratch_dir("mapped");
    for context in contexts() {
        for precision in StoragePrecision::ALL {
            let what = format!("{} {precision:?}", describe(&context));
            let (seed, count) = (21, 900);
            // Removed and replaced slots: a mapped open keeps them as removed slots.
            let original = populated(&context, GpuDistanceMetric::Cosine, precision, seed, count);
            let path = dir.join(format!("{}-{precision:?}.hgc", context.backend_type()));
            original.save(&path).unwrap();
            // SAFETY: nothing writes or truncates the file while `mapped` lives (saves below go
            // to another path or replace this one by rename).
            let mapped =
                unsafe { context.open_storage_mapped(&path) }.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_same_collection(&format!("{what}: mapped"), &original, &mapped, count, seed);
            let row_bytes = original.dimension() * precision.element_bytes();
            let rows_in_memory = |s: &GpuVectorStorage| s.memory_bytes() >= s.slot_count() * row_bytes;
            if context.backend_type() == GpuBackendType::Cpu {
                assert_eq!(mapped.slot_count(), original.slot_count(), "{what}: the file's slots are kept");
                assert!(!rows_in_memory(&mapped), "{what}: {} bytes in memory", mapped.memory_bytes());
            }
            // A removal stays a tombstone over the mapping.
            let gone = ["id-10", "id-12", "id-400"];
            original.remove_vectors(&gone).unwrap();
            mapped.remove_vectors(&gone).unwrap();
            assert_same_collection(&format!("{what}: after removals"), &original, &mapped, count, seed);
            if context.backend_type() == GpuBackendType::Cpu {
                assert!(!rows_in_memory(&mapped), "{what}: a removal copied the rows");
            }
            // Saving over the mapped file itself replaces it by rename: the mapping keeps the old
            // data, the new file holds the removals.
            mapped.save(&path).unwrap();
            assert_same_collection(&format!("{what}: saved over itself"), &original, &mapped, count, seed);
            let reopened = context.open_storage(&path).unwrap();
            assert_same_collection(&format!("{what}: reopened"), &original, &reopened, count, seed);
            // An add copies the rows into memory first, then appends.
            let mut rng = Rng::new(seed + 1);
            let added: Vec<hive_gpu::GpuVector> = (0..40)
                .map(|i| {
                    hive_gpu::GpuVector::new(
                        format!("id-{}", [i, count + i][i % 2]),
                        common::storable(precision, &rng.normals(original.dimension())),
                    )
                })
                .collect();
            original.add_vectors(&added).unwrap();
            mapped.add_vectors(&added).unwrap();
            assert_same_collection(&format!("{what}: after adds"), &original, &mapped, count + 40, seed);
            assert!(rows_in_memory(&mapped), "{what}: the rows were not copied on an add");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const KILL_ENV: &str = "HIVE_GPU_SAVE_LOOP";

/// The two collections the killed child saves in turn.
fn kill_pair(cpu: &GpuContext) -> [GpuVectorStorage; 2] {
    [
        populated(cpu, GpuDistanceMetric::Euclidean, StoragePrecision::F32, 1, 400),
        populated(cpu, GpuDistanceMetric::DotProduct, StoragePrecision::F16, 2, 6000),
    ]
}

/// The child of the kill test: saves the two collections in turn until killed. Returns at
/// once in a normal test run.
#[test]
fn save_loop_child() {
    let Ok(path) = std::env::var(KILL_ENV) else { return };
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let pair = kill_pair(&cpu);
    for i in 0.. {
        pair[i % 2].save(&path).expect("save");
    }
}

#[test]
fn a_save_killed_at_any_moment_leaves_the_old_or_the_new_file() {
    let dir = scratch_dir("kill");
    let path = dir.join("collection.hgc");
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let pair = kill_pair(&cpu);
    pair[0].save(&path).expect("the first save");
    let exe = std::env::current_exe().expect("the test binary");
    let mut rng = Rng::new(77);
    let mut seen = [0usize; 2];
    let mut inside_a_save = 0;
    for round in 0..30 {
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "save_loop_child", "--nocapture", "--test-threads", "1"])
            .env(KILL_ENV, &path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the child");
        std::thread::sleep(Duration::from_millis(30 + rng.below(400) as u64));
        child.kill().expect("SIGKILL");
        child.wait().expect("the child ends");
        // A temporary file left behind is a kill that landed inside a save.
        for entry in std::fs::read_dir(&dir).expect("the directory").flatten() {
            if entry.file_name().to_string_lossy().contains(".tmp-") {
                inside_a_save += 1;
                std::fs::remove_file(entry.path()).expect("a leftover removed");
            }
        }
        let opened = cpu.open_storage(&path).unwrap_or_else(|e| panic!("round {round}: a torn file: {e}"));
        let which = if opened.vector_count() == pair[0].vector_count() { 0 } else { 1 };
        assert_same_collection(&format!("round {round}"), &pair[which], &opened, [400, 6000][which], 5);
        seen[which] += 1;
    }
    // The kills landed both between saves of each collection and (most likely) inside them.
    assert!(seen[1] > 0, "the child never completed a save of the second collection: {seen:?}");
    assert!(inside_a_save >= 10, "only {inside_a_save} of 30 kills landed inside a save");
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(target_os = "linux")]
const FULL_DISK_ENV: &str = "HIVE_GPU_SAVE_PAST_LIMIT";

/// Rows of the collection that the full-disk child fails to save: 140,000 x 128 f32 (72 MB),
/// three of a GPU engine's 32 MiB download chunks, so that a failed write leaves chunks still
/// to come (the case where the downloading thread of a CUDA/ROCm save once waited for ever).
#[cfg(target_os = "linux")]
const PAST_LIMIT_ROWS: usize = 140_000;

/// The child of the full-disk test: on every backend, saves a small collection, then sets its
/// own file-size limit (RLIMIT_FSIZE, 1 MiB, with SIGXFSZ ignored: every write past the limit
/// fails as on a full disk) and saves a large one over it. Each such save must fail with an
/// error while the old file stays whole and the collection searchable. Returns at once in a
/// normal test run. (Linux: `libc` is a Linux dependency of the crate.)
#[cfg(target_os = "linux")]
#[test]
fn save_past_a_file_size_limit_child() {
    let Ok(dir) = std::env::var(FULL_DISK_ENV) else { return };
    let dir = PathBuf::from(dir);
    let contexts = contexts();
    let dim = 128;
    let mut rng = Rng::new(91);
    let values = rng.normals(PAST_LIMIT_ROWS * dim);
    let ids: Vec<String> = (0..PAST_LIMIT_ROWS).map(|i| format!("v{i}")).collect();
    let mut saved = Vec::new();
    for (c, context) in contexts.iter().enumerate() {
        let small = populated(context, GpuDistanceMetric::Euclidean, StoragePrecision::F32, 3, 300);
        let path = dir.join(format!("collection-{c}.hgc"));
        small.save(&path).expect("the small save, before the limit");
        let large = context
            .create_storage_with(hive_gpu::StorageConfig::new(dim, GpuDistanceMetric::Euclidean))
            .expect("a collection");
        large.add_vectors_flat(&ids, &values).expect("the large collection");
        saved.push((c, describe(context), small, large, path));
    }
    // SAFETY: plain FFI calls with valid arguments (a signal number and SIG_IGN; pointers to
    // an rlimit this frame owns); no other thread of this child is inside a file write meanwhile.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit), 0, "getrlimit");
        // The soft limit only: a hard limit stays as the container set it.
        limit.rlim_cur = limit.rlim_max.min(1 << 20);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0, "setrlimit");
    }
    for (c, what, small, large, path) in &saved {
        let error = large.save(path).expect_err(&format!("{what}: a 72 MB save past a 1 MiB file limit"));
        assert!(
            matches!(&error, HiveGpuError::Io { source, .. } if source.kind() == std::io::ErrorKind::FileTooLarge),
            "{what}: the save failed otherwise than by the file-size limit: {error}"
        );
        let opened = contexts[*c].open_storage(path).expect("the old file opens");
        assert_same_collection(&format!("{what}: the file a failed save left"), small, &opened, 300, 3);
        let hit = large.search(&values[5 * dim..6 * dim], 1).expect("the collection still searches");
        assert_eq!(hit[0].id, "v5", "{what}");
        println!("{what}: the save failed with: {error}");
    }
    println!("SAVES FAILED CLEANLY: {}", saved.len());
}

#[cfg(target_os = "linux")]
#[test]
fn a_save_that_fails_part_way_returns_its_error_and_leaves_the_old_file_on_every_backend() {
    let dir = scratch_dir("full-disk");
    let exe = std::env::current_exe().expect("the test binary");
    // The child's output goes to files (written before its limit is set, appended after): a
    // pipe nobody reads while waiting could fill and stall it.
    let (out_path, err_path) = (dir.join("child.out"), dir.join("child.err"));
    let mut child = std::process::Command::new(&exe)
        .args(["--exact", "save_past_a_file_size_limit_child", "--nocapture", "--test-threads", "1"])
        .env(FULL_DISK_ENV, &dir)
        .stdout(std::fs::File::create(&out_path).expect("the child's stdout"))
        .stderr(std::fs::File::create(&err_path).expect("the child's stderr"))
        .spawn()
        .expect("the child");
    // A save that waits for ever (a downloader left behind) must fail the test, not hang it.
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while child.try_wait().expect("the child's status").is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().expect("SIGKILL");
            panic!("a save past the file-size limit did not return within 600 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = child.wait().expect("the child's status");
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    assert!(
        status.success() && stdout.contains("SAVES FAILED CLEANLY"),
        "the child failed: {status}\n{stdout}\n{}",
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mapped open keeps removed rows where the file has them and never checks their values
/// (they are never searched), so a removed row may hold values whose distance overflows: its
/// kernel value is `inf`, and with a removed row's scale and offset (`0` and `+inf`) its
/// distance is NaN. Such a row must not count among a block's k best when a fresh collector
/// is bounded by them (`Collector::limit_to`): the k-th live neighbour would be lost.
#[test]
fn a_removed_row_with_overflowing_values_in_a_mapped_file_never_costs_a_live_neighbour() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let dir = scratch_dir("overflowing-tombstone");
    let dim = 8;
    let storage = cpu.create_storage(dim, GpuDistanceMetric::Euclidean).unwrap();
    let mut vectors = vec![GpuVector::new("dead", vec![0.5; dim])];
    for i in 1..=40 {
        let mut v = vec![0.0; dim];
        v[0] = i as f32;
        vectors.push(GpuVector::new(format!("v{i}"), v));
    }
    storage.add_vectors(&vectors).unwrap();
    storage.remove_vectors(&["dead"]).unwrap();
    let path = dir.join("c.hgc");
    storage.save(&path).unwrap();
    // Slot 0's row, in the vector section (kind 3), becomes 3e38 in every component.
    let mut image = std::fs::read(&path).unwrap();
    let sections = u32::from_le_bytes(image[16..20].try_into().unwrap()) as usize;
    let vectors_at = (64..64 + sections * 40)
        .step_by(40)
        .find(|&entry| u32::from_le_bytes(image[entry..entry + 4].try_into().unwrap()) == 3)
        .map(|entry| u64::from_le_bytes(image[entry + 8..entry + 16].try_into().unwrap()) as usize)
        .expect("a vector section");
    for d in 0..dim {
        image[vectors_at + 4 * d..vectors_at + 4 * d + 4].copy_from_slice(&3e38f32.to_le_bytes());
    }
    reseal_section_of(&mut image, vectors_at);
    std::fs::write(&path, &image).unwrap();
    // SAFETY: nothing writes or truncates the file while `mapped` lives.
    let mapped = unsafe { cpu.open_storage_mapped(&path) }.expect("the patched file opens");
    assert_eq!(mapped.slot_count(), 41, "the removed slot is kept over the mapping");
    for k in [2, 5, 10] {
        let found = mapped.search(&vec![0.0; dim], k).unwrap();
        let ids: Vec<&str> = found.iter().map(|r| r.id.as_str()).collect();
        let want: Vec<String> = (1..=k).map(|i| format!("v{i}")).collect();
        assert_eq!(ids, want, "k = {k}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
