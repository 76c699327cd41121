//! Collections with every kind of content (payloads of every type, ties, removed and replaced
//! vectors) and the check that two collections hold the same: what the persistence and
//! durability tests share.

use std::path::PathBuf;

use super::Rng;
use hive_gpu::{
    Filter, GpuContext, GpuDistanceMetric, GpuVector, GpuVectorStorage, Metadata, SearchOptions,
    StorageConfig, StoragePrecision,
};

/// A fresh directory under the system's temporary one.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hive-gpu-{name}-{}-{}",
        std::process::id(),
        Rng::new(0).next_u64()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// A collection with payloads of every type, exact duplicates (ties), removed and replaced
/// vectors, so that its slots are not simply its ids in order.
///
/// The kept format files (`tests/persistence.rs`, `KEPT`) hold collections it made: it must
/// keep making the same ones for the same arguments.
pub fn populated(
    context: &GpuContext,
    metric: GpuDistanceMetric,
    precision: StoragePrecision,
    seed: u64,
    count: usize,
) -> GpuVectorStorage {
    let dim = 19;
    let mut rng = Rng::new(seed);
    let storage = context
        .create_storage_with(StorageConfig::new(dim, metric).with_precision(precision))
        .expect("a collection");
    let vectors: Vec<GpuVector> = (0..count)
        .map(|i| {
            let mut data = rng.normals(dim);
            data[0] += 0.5;
            if i % 17 == 5 {
                data = vec![0.25; dim];
            }
            let mut meta = Metadata::new();
            if i % 3 == 0 {
                meta.insert("source".into(), format!("doc-{}", i % 11));
                meta.insert("ünïcode".into(), "✓".into());
            }
            let data = super::storable(precision, &data);
            let mut v = GpuVector::with_metadata(format!("id-{i}"), data, meta);
            if i % 4 != 0 {
                v = v
                    .with_field("bucket", (i % 6) as i64)
                    .with_field("score", i as f64 / 7.0)
                    .with_field("flag", i % 2 == 0)
                    .with_field("color", ["red", "green", "blue"][i % 3]);
            }
            v
        })
        .collect();
    storage.add_vectors(&vectors).expect("add");
    let removed: Vec<String> = (0..count).filter(|i| i % 9 == 2).map(|i| format!("id-{i}")).collect();
    storage.remove_vectors(&removed).expect("remove");
    // Replaced vectors move to new slots at the end.
    let replaced: Vec<GpuVector> = (0..count)
        .filter(|i| i % 13 == 1)
        .map(|i| GpuVector::new(format!("id-{i}"), super::storable(precision, &rng.normals(dim))))
        .collect();
    storage.add_vectors(&replaced).expect("upsert");
    storage
}

pub fn ids_of(storage: &GpuVectorStorage, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("id-{i}")).filter(|id| storage.contains(id)).collect()
}

/// `b` holds exactly what `a` holds, and searches (plain and filtered) agree to the bit.
pub fn assert_same_collection(
    what: &str,
    a: &GpuVectorStorage,
    b: &GpuVectorStorage,
    count: usize,
    seed: u64,
) {
    assert_eq!(a.config(), b.config(), "{what}: config");
    assert_eq!(a.vector_count(), b.vector_count(), "{what}: count");
    for id in ids_of(a, count + 10) {
        let (x, y) = (
            a.get_vector(&id).unwrap().unwrap(),
            b.get_vector(&id).unwrap().unwrap_or_else(|| panic!("{what}: {id} lost")),
        );
        assert!(
            x.data.iter().zip(&y.data).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{what}: values of {id}"
        );
        assert_eq!(x.metadata, y.metadata, "{what}: metadata of {id}");
        assert_eq!(x.payload, y.payload, "{what}: payload of {id}");
    }
    let dim = a.dimension();
    let mut rng = Rng::new(seed ^ 0xabc);
    let mut queries = rng.normals(5 * dim);
    queries[..dim].fill(0.25); // a query on the duplicates: ties
    let k = 12;
    let filter = Filter::eq("color", "red").or(Filter::range("bucket", 1.0..=2.0)).and(Filter::has("flag"));
    for options in
        [SearchOptions::default().with_metadata(true), SearchOptions::default().with_filter(filter)]
    {
        let (x, y) = (
            a.search_batch_with(&queries, k, &options).unwrap(),
            b.search_batch_with(&queries, k, &options).unwrap(),
        );
        for (q, (rx, ry)) in x.iter().zip(&y).enumerate() {
            let ix: Vec<(&str, u32)> = rx.iter().map(|r| (r.id.as_str(), r.score.to_bits())).collect();
            let iy: Vec<(&str, u32)> = ry.iter().map(|r| (r.id.as_str(), r.score.to_bits())).collect();
            assert_eq!(ix, iy, "{what}: query {q} ({options:?})");
        }
    }
}

/// Rewrites the header checksum of a file image after a deliberate change to the header.
pub fn reseal_header(image: &mut [u8]) {
    let crc = crc32c::crc32c(&image[..60]);
    image[60..64].copy_from_slice(&crc.to_le_bytes());
}

/// Rewrites the checksum of the section holding byte `at`, then the table's and the header's:
/// a file changed on purpose whose every checksum holds.
pub fn reseal_section_of(image: &mut [u8], at: usize) {
    let sections = u32::from_le_bytes(image[16..20].try_into().unwrap()) as usize;
    for entry in (64..64 + sections * 40).step_by(40) {
        let offset = u64::from_le_bytes(image[entry + 8..entry + 16].try_into().unwrap()) as usize;
        let length = u64::from_le_bytes(image[entry + 16..entry + 24].try_into().unwrap()) as usize;
        if (offset..offset + length).contains(&at) {
            let crc = crc32c::crc32c(&image[offset..offset + length]);
            image[entry + 32..entry + 36].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let table_crc = crc32c::crc32c(&image[64..64 + sections * 40]);
    image[56..60].copy_from_slice(&table_crc.to_le_bytes());
    reseal_header(image);
}
