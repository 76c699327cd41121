//! Durable collections: every acknowledged write is replayed from the log on open, on every
//! backend; a torn last record is dropped (cut at every byte) and never misread; a log a
//! checkpoint already folded in is never replayed twice; hostile records are errors naming
//! their offset; and a process SIGKILLed while eight threads write (and checkpoint) loses no
//! acknowledged write.

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::stored::{assert_same_collection, scratch_dir};
use common::{Rng, contexts, describe};
use hive_gpu::{
    Durability, DurableOptions, GpuBackendType, GpuContext, GpuDistanceMetric, GpuVector, GpuVectorStorage,
    HiveGpuError, Metadata, StorageConfig, StoragePrecision,
};

const DIM: usize = 19;

fn wal(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap().to_os_string();
    name.push(".wal");
    path.with_file_name(name)
}

fn config() -> StorageConfig {
    StorageConfig::new(DIM, GpuDistanceMetric::Euclidean).with_precision(StoragePrecision::F16)
}

/// One write of the scripted workload.
enum Write {
    Upsert(Vec<GpuVector>),
    Remove(Vec<String>),
    Clear,
}

/// A workload with payloads, ties, replaced and removed ids, one clear and flat adds.
fn script(seed: u64, count: usize) -> Vec<Write> {
    let mut rng = Rng::new(seed);
    let mut writes = Vec::new();
    let vector = |rng: &mut Rng, i: usize| {
        let mut data = rng.normals(DIM);
        if i % 17 == 5 {
            data = vec![0.25; DIM];
        }
        let mut meta = Metadata::new();
        if i.is_multiple_of(3) {
            meta.insert("source".into(), format!("doc-{}", i % 11));
        }
        let mut v = GpuVector::with_metadata(format!("id-{i}"), data, meta);
        if !i.is_multiple_of(4) {
            v = v.with_field("bucket", (i % 6) as i64).with_field("color", ["red", "green", "blue"][i % 3]);
        }
        if i.is_multiple_of(5) {
            v = v.with_field("flag", i.is_multiple_of(2)).with_field("score", i as f64 / 7.0);
        }
        v
    };
    for round in 0..3 {
        if round == 1 {
            writes.push(Write::Clear);
        }
        for i in 0..count {
            // Single-vector writes, as a service's clients make them, and small batches.
            if i % 7 == 0 {
                writes.push(Write::Upsert((i..i + 3).map(|j| vector(&mut rng, j + count * round)).collect()));
            } else {
                writes.push(Write::Upsert(vec![vector(&mut rng, i % (count / 2) + count * round)]));
            }
            if i % 11 == 3 {
                writes.push(Write::Remove(vec![format!("id-{}", i % (count / 2) + count * round)]));
            }
        }
    }
    writes
}

fn apply(storage: &GpuVectorStorage, write: &Write) -> hive_gpu::Result<()> {
    match write {
        Write::Upsert(vectors) if vectors.len() == 3 && vectors.iter().all(|v| v.payload.is_empty()) => {
            let ids: Vec<&str> = vectors.iter().map(|v| v.id.as_str()).collect();
            let values: Vec<f32> = vectors.iter().flat_map(|v| v.data.clone()).collect();
            storage.add_vectors_flat(&ids, &values)
        }
        Write::Upsert(vectors) => storage.add_vectors(vectors),
        Write::Remove(ids) => storage.remove_vectors(ids),
        Write::Clear => storage.clear(),
    }
}

/// Applies `writes` to `storage` and to an in-memory reference on `context`, skipping those
/// that fail (a removal of an id no longer there) on both.
fn run(context: &GpuContext, storage: &GpuVectorStorage, writes: &[Write]) -> GpuVectorStorage {
    let reference = context.create_storage_with(config()).unwrap();
    for write in writes {
        let expected = apply(&reference, write).is_ok();
        assert_eq!(
            apply(storage, write).is_ok(),
            expected,
            "the durable collection and the reference differ"
        );
    }
    reference
}

#[test]
fn acknowledged_writes_come_back_from_the_log_on_every_backend() {
    for context in contexts() {
        let what = describe(&context);
        let dir = scratch_dir("durable-replay");
        let path = dir.join("c.hgc");
        let writes = script(3, 300);
        let reference = {
            let storage = context.open_durable(&path, config(), DurableOptions::default()).unwrap();
            let reference = run(&context, &storage, &writes);
            let stats = storage.log_stats().unwrap();
            assert_eq!(stats.records as usize, writes.len() - failed(&writes), "{what}: records");
            assert_eq!(stats.checkpoints, 0, "{what}");
            reference
        };
        // Only the empty snapshot of the creation is there: everything comes from the log.
        assert_eq!(hive_gpu::persist::inspect_file(&path).unwrap().live, 0);
        let opened = context.open_durable(&path, config(), DurableOptions::default()).unwrap();
        assert_eq!(opened.log_stats().unwrap().replayed as usize, writes.len() - failed(&writes));
        assert_same_collection(&format!("{what}: replayed"), &reference, &opened, 1000, 7);
        // Writes after a replay append to the same log; a checkpoint folds it in.
        let more = script(4, 60);
        for write in &more {
            let (a, b) = (apply(&reference, write).is_ok(), apply(&opened, write).is_ok());
            assert_eq!(a, b, "{what}");
        }
        opened.checkpoint().unwrap();
        assert_eq!(opened.log_stats().unwrap().log_bytes, 64, "{what}: the log is empty after a checkpoint");
        opened.add_vectors(&[GpuVector::new("after", vec![0.5; DIM])]).unwrap();
        reference.add_vectors(&[GpuVector::new("after", vec![0.5; DIM])]).unwrap();
        drop(opened);
        let opened = context.open_durable(&path, config(), DurableOptions::default()).unwrap();
        assert_eq!(opened.log_stats().unwrap().replayed, 1, "{what}: only the write after the checkpoint");
        assert_same_collection(&format!("{what}: after a checkpoint"), &reference, &opened, 1000, 8);
        assert!(opened.contains("after"));
        drop(opened);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Writes of the script that fail on any collection (removals of ids already gone).
fn failed(writes: &[Write]) -> usize {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).unwrap();
    let storage = cpu.create_storage_with(config()).unwrap();
    writes.iter().filter(|w| apply(&storage, w).is_err()).count()
}

#[test]
fn a_torn_last_record_is_dropped_at_every_cut_and_the_log_goes_on_after_it() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).unwrap();
    let dir = scratch_dir("durable-torn");
    let path = dir.join("c.hgc");
    let writes = script(5, 40);
    let (before_last, whole) = {
        let storage = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
        run(&cpu, &storage, &writes[..writes.len() - 1]);
        let before_last = std::fs::read(wal(&path)).unwrap();
        apply(&storage, writes.last().unwrap()).unwrap();
        (before_last, std::fs::read(wal(&path)).unwrap())
    };
    let reference = cpu.create_storage_with(config()).unwrap();
    for write in &writes[..writes.len() - 1] {
        let _ = apply(&reference, write);
    }
    let mut rng = Rng::new(9);
    let cuts: Vec<usize> = (before_last.len()..whole.len()).collect();
    for (n, &cut) in cuts.iter().enumerate() {
        // Every cut of the last record, and the same cuts with garbage where the rest was.
        let mut torn = whole[..cut].to_vec();
        if n % 2 == 1 {
            torn.extend((cut..whole.len()).map(|_| rng.below(256) as u8));
        }
        std::fs::write(wal(&path), &torn).unwrap();
        let opened = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
        let stats = opened.log_stats().unwrap();
        assert_eq!(stats.log_bytes, before_last.len() as u64, "cut at {cut}: the torn tail is cut off");
        assert_eq!(stats.torn_bytes, (torn.len() - before_last.len()) as u64);
        assert_eq!(opened.vector_count(), reference.vector_count(), "cut at {cut}");
        if n % 7 == 0 {
            assert_same_collection(&format!("cut at {cut}"), &reference, &opened, 200, cut as u64);
        }
        drop(opened);
        assert_eq!(std::fs::read(wal(&path)).unwrap(), before_last, "cut at {cut}: the file is truncated");
    }
    // Appends after a dropped tail are read back.
    let opened = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
    opened.add_vectors(&[GpuVector::new("next", vec![1.0; DIM])]).unwrap();
    drop(opened);
    let opened = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
    assert!(opened.contains("next"));
    assert_eq!(opened.vector_count(), reference.vector_count() + 1);
    drop(opened);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_log_that_a_checkpoint_already_folded_in_is_never_replayed_twice() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).unwrap();
    let dir = scratch_dir("durable-stale");
    let path = dir.join("c.hgc");
    let storage = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
    storage.add_vectors(&[GpuVector::new("a", vec![1.0; DIM]), GpuVector::new("b", vec![2.0; DIM])]).unwrap();
    storage.remove_vectors(&["a"]).unwrap();
    let old_log = std::fs::read(wal(&path)).unwrap();
    storage.checkpoint().unwrap();
    drop(storage);
    // A crash between the snapshot's rename and the log's leaves the new snapshot with the
    // old log: replaying it would add "a" back and fail on its removal.
    std::fs::write(wal(&path), &old_log).unwrap();
    let opened = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
    assert_eq!(opened.log_stats().unwrap().replayed, 0);
    assert_eq!((opened.contains("a"), opened.contains("b"), opened.vector_count()), (false, true, 1));
    drop(opened);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hostile_logs_are_errors_naming_the_record_never_a_panic() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).unwrap();
    let dir = scratch_dir("durable-hostile");
    let path = dir.join("c.hgc");
    let storage = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
    storage.add_vectors(&[GpuVector::new("a", vec![1.0; DIM])]).unwrap();
    drop(storage);
    let good = std::fs::read(wal(&path)).unwrap();
    // Records are checksummed from the checksum of their log's header (docs/FORMAT.md).
    let salt = crc32c::crc32c(&good[60..64]);
    let record = |body: &[u8], sequence: u64| {
        let mut body = body.to_vec();
        body.extend_from_slice(&sequence.to_le_bytes());
        let mut out = (body.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&crc32c::crc32c_append(salt, &body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    };
    let with = |extra: Vec<u8>| {
        let mut image = good.clone();
        image.extend_from_slice(&extra);
        image
    };
    let mut absurd_count = vec![1u8];
    absurd_count.extend_from_slice(&u32::MAX.to_le_bytes());
    let mut bad_id = vec![2u8, 1, 0, 0, 0, 2, 0, 0, 0];
    bad_id.extend_from_slice(&[0xff, 0xfe]);
    let mut absent = vec![2u8, 1, 0, 0, 0, 1, 0, 0, 0];
    absent.push(b'z');
    let mut header = good.clone();
    header[20] ^= 1;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("unknown operation", with(record(&[9], 2)), "unknown operation 9"),
        ("absurd vector count", with(record(&absurd_count, 2)), "cannot fit"),
        ("an id that is not UTF-8", with(record(&bad_id, 2)), "not UTF-8"),
        ("a removal of an absent id", with(record(&absent, 2)), "does not apply"),
        ("a sequence number out of order", with(record(&[3], 5)), "sequence number 5"),
        ("trailing bytes in a record", with(record(&[3, 0], 2)), "past the section's last record"),
        ("a damaged header", header, "checksum"),
        (
            "a foreign file",
            b"not a log at all, but long enough to hold a header of sixty-four bytes".to_vec(),
            "magic",
        ),
    ];
    for (what, image, expected) in cases {
        std::fs::write(wal(&path), &image).unwrap();
        match cpu.open_durable(&path, config(), DurableOptions::default()) {
            Err(e @ HiveGpuError::InvalidFormat { .. }) => {
                let text = e.to_string();
                assert!(text.contains(expected) && text.contains(".wal"), "{what}: {text}");
            }
            other => panic!("{what}: {other:?}"),
        }
        // The files are left as they were: fixing the log lets the collection open.
        assert_eq!(std::fs::read(wal(&path)).unwrap(), image, "{what}");
    }
    std::fs::write(wal(&path), &good).unwrap();
    assert!(cpu.open_durable(&path, config(), DurableOptions::default()).unwrap().contains("a"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_durable_collection_is_held_by_one_storage_and_keeps_its_shape() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).unwrap();
    let dir = scratch_dir("durable-held");
    let path = dir.join("c.hgc");
    let storage = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
    let second = cpu.open_durable(&path, config(), DurableOptions::default());
    assert!(
        matches!(&second, Err(HiveGpuError::InvalidArgument(m)) if m.contains("held by another")),
        "{second:?}"
    );
    // A save to its own path is a checkpoint, which keeps the log valid.
    storage.add_vectors(&[GpuVector::new("a", vec![1.0; DIM])]).unwrap();
    storage.save(&path).unwrap();
    assert_eq!(storage.log_stats().unwrap().checkpoints, 1);
    drop(storage);
    let other = StorageConfig::new(DIM + 1, GpuDistanceMetric::Euclidean);
    let refused = cpu.open_durable(&path, other, DurableOptions::default());
    assert!(
        matches!(&refused, Err(HiveGpuError::InvalidArgument(m)) if m.contains("dimension 19")),
        "{refused:?}"
    );
    let plain = cpu.create_storage(DIM, GpuDistanceMetric::Euclidean).unwrap();
    assert!(matches!(plain.checkpoint(), Err(HiveGpuError::InvalidArgument(_))));
    assert!(plain.log_stats().is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_checkpoint_refuses_writes_until_one_succeeds_and_loses_nothing() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).unwrap();
    let dir = scratch_dir("durable-failed-checkpoint");
    let path = dir.join("c.hgc");
    let storage = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
    storage.add_vectors(&[GpuVector::new("a", vec![1.0; DIM])]).unwrap();
    // A directory where the new log must go: the snapshot is replaced, the log cannot be.
    std::fs::remove_file(wal(&path)).unwrap();
    std::fs::create_dir(wal(&path)).unwrap();
    std::fs::write(wal(&path).join("blocker"), b"x").unwrap();
    assert!(storage.checkpoint().is_err());
    // The old log no longer continues the snapshot on disk: a write appended to it would be
    // dropped at the next open, so writes are refused, changing nothing.
    let refused = storage.add_vectors(&[GpuVector::new("b", vec![2.0; DIM])]);
    assert!(matches!(&refused, Err(e) if e.to_string().contains("checkpoint")), "{refused:?}");
    assert!(!storage.contains("b"));
    std::fs::remove_dir_all(wal(&path)).unwrap();
    storage.checkpoint().unwrap();
    storage.add_vectors(&[GpuVector::new("b", vec![2.0; DIM])]).unwrap();
    drop(storage);
    let opened = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
    assert!(opened.contains("a") && opened.contains("b") && opened.vector_count() == 2);
    drop(opened);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_log_checkpoints_itself_past_its_length_limit() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).unwrap();
    let dir = scratch_dir("durable-auto");
    let path = dir.join("c.hgc");
    let options = DurableOptions::default().with_checkpoint_log_bytes(4096);
    let writes = script(6, 200);
    let reference = {
        let storage = cpu.open_durable(&path, config(), options).unwrap();
        let reference = run(&cpu, &storage, &writes);
        let stats = storage.log_stats().unwrap();
        assert!(stats.checkpoints > 5 && stats.log_bytes <= 4096 + 1024, "{stats:?}");
        reference
    };
    let opened = cpu.open_durable(&path, config(), options).unwrap();
    assert_same_collection("auto-checkpointed", &reference, &opened, 1000, 11);
    drop(opened);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_writers_are_each_acknowledged_and_all_replayed() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).unwrap();
    let dir = scratch_dir("durable-threads");
    let path = dir.join("c.hgc");
    for durability in [Durability::Disk, Durability::Process] {
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(wal(&path));
        let storage = Arc::new(
            cpu.open_durable(&path, config(), DurableOptions::default().with_durability(durability)).unwrap(),
        );
        std::thread::scope(|s| {
            for t in 0..8 {
                let storage = storage.clone();
                s.spawn(move || {
                    for i in 0..100 {
                        storage.add_vectors(&[GpuVector::new(format!("t{t}-{i}"), value(t, i))]).unwrap();
                    }
                });
            }
        });
        assert_eq!(storage.log_stats().unwrap().records, 800);
        drop(storage);
        let opened = cpu.open_durable(&path, config(), DurableOptions::default()).unwrap();
        for t in 0..8 {
            for i in 0..100 {
                let got = opened.get_vector(&format!("t{t}-{i}")).unwrap().expect("an acknowledged write");
                assert_eq!(got.data, rounded(value(t, i)), "{durability:?} t{t}-{i}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The vector writer `t` writes as its `i`-th.
fn value(t: usize, i: usize) -> Vec<f32> {
    (0..DIM).map(|d| (t * 1000 + i) as f32 / 64.0 + d as f32).collect()
}

/// `values` as the f16 collection stores them.
fn rounded(values: Vec<f32>) -> Vec<f32> {
    values.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect()
}

const KILL_ENV: &str = "HIVE_GPU_DURABLE_LOOP";

/// The child of the kill test: eight threads upsert (and remove every fifth of their own
/// upserts again) until killed, printing each write once it is acknowledged; the log
/// checkpoints itself every few hundred kilobytes, so kills also land inside checkpoints.
/// Returns at once in a normal test run.
#[test]
fn durable_writer_child() {
    let Ok(spec) = std::env::var(KILL_ENV) else { return };
    let mut parts = spec.splitn(3, ':');
    let (mode, round, path) =
        (parts.next().unwrap(), parts.next().unwrap(), parts.next().expect("mode:round:path"));
    let durability = if mode == "disk" { Durability::Disk } else { Durability::Process };
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let options = DurableOptions::default().with_durability(durability).with_checkpoint_log_bytes(256 << 10);
    let storage = Arc::new(cpu.open_durable(path, config(), options).expect("open"));
    std::thread::scope(|s| {
        for t in 0..8 {
            let storage = storage.clone();
            s.spawn(move || {
                use std::io::Write;
                for i in 0.. {
                    let id = format!("r{round}t{t}-{i}");
                    storage.add_vectors(&[GpuVector::new(id.clone(), value(t, i))]).expect("upsert");
                    writeln!(std::io::stdout().lock(), "ack upsert {id}").unwrap();
                    if i % 5 == 4 {
                        storage.remove_vectors(&[&id]).expect("remove");
                        writeln!(std::io::stdout().lock(), "ack remove {id}").unwrap();
                    }
                }
            });
        }
    });
}

#[test]
fn a_writer_killed_at_any_moment_loses_no_acknowledged_write() {
    let dir = scratch_dir("durable-kill");
    let path = dir.join("c.hgc");
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let exe = std::env::current_exe().expect("the test binary");
    let mut rng = Rng::new(78);
    // Every acknowledged write so far, by id: whether it must be there (None: either, an
    // acknowledged upsert whose removal was in flight).
    let mut expected = std::collections::HashMap::<String, Option<bool>>::new();
    let mut total_acks = 0;
    let writer_of = |id: &str| -> (usize, usize) {
        let (t, i) = id.split_once('t').unwrap().1.split_once('-').unwrap();
        (t.parse().unwrap(), i.parse().unwrap())
    };
    for round in 0..16 {
        let mode = if round % 2 == 0 { "disk" } else { "process" };
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "durable_writer_child", "--nocapture", "--test-threads", "1"])
            .env(KILL_ENV, format!("{mode}:{round}:{}", path.display()))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the child");
        let stdout = child.stdout.take().unwrap();
        let acks = Arc::new(Mutex::new(Vec::<String>::new()));
        let reader = {
            let acks = acks.clone();
            std::thread::spawn(move || {
                let mut lines = std::io::BufReader::new(stdout);
                let mut line = String::new();
                // A line cut by the kill has no newline: not an acknowledgement.
                while lines.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                    if line.ends_with('\n') && line.starts_with("ack ") {
                        acks.lock().unwrap().push(line.trim_end().to_string());
                    }
                    line.clear();
                }
            })
        };
        std::thread::sleep(Duration::from_millis(150 + rng.below(500) as u64));
        child.kill().expect("SIGKILL");
        child.wait().expect("the child ends");
        reader.join().unwrap();
        let acks = std::mem::take(&mut *acks.lock().unwrap());
        total_acks += acks.len();
        for ack in &acks {
            let mut words = ack.split(' ').skip(1);
            let (op, id) = (words.next().unwrap(), words.next().unwrap());
            let removal_follows = writer_of(id).1 % 5 == 4;
            expected.insert(
                id.to_string(),
                if op == "upsert" { (!removal_follows).then_some(true) } else { Some(false) },
            );
        }
        for entry in std::fs::read_dir(&dir).expect("the directory").flatten() {
            if entry.file_name().to_string_lossy().contains(".tmp-") {
                std::fs::remove_file(entry.path()).expect("a leftover removed");
            }
        }
        let opened = cpu
            .open_durable(&path, config(), DurableOptions::default())
            .unwrap_or_else(|e| panic!("round {round} ({mode}): {e}"));
        for (id, present) in &expected {
            match opened.get_vector(id).unwrap() {
                Some(v) if *present != Some(false) => {
                    let (t, i) = writer_of(id);
                    let want = rounded(value(t, i));
                    assert_eq!(v.data, want, "round {round} ({mode}): {id}'s values");
                }
                None if *present != Some(true) => {}
                got => panic!("round {round} ({mode}): acknowledged {id} present={present:?}, found {got:?}"),
            }
        }
        // An unacknowledged write may or may not be there, but each writer waits for every
        // acknowledgement: nothing beyond the one write it had in flight.
        let mut last = [None::<usize>; 8];
        for ack in &acks {
            let (t, i) = writer_of(ack.rsplit(' ').next().unwrap());
            last[t] = last[t].max(Some(i));
        }
        for (t, last) in last.iter().enumerate() {
            let next = last.map_or(0, |i| i + 1);
            for i in next + 1..next + 40 {
                let id = format!("r{round}t{t}-{i}");
                assert!(!opened.contains(&id), "round {round} ({mode}): {id} was never written");
            }
        }
        drop(opened);
    }
    assert!(total_acks > 1000, "the children acknowledged only {total_acks} writes");
    let _ = std::fs::remove_dir_all(&dir);
}
