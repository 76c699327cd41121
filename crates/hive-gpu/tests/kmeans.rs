//! k-means (`GpuContext::kmeans`, issue 21 item 1) on every backend: it finds well-separated
//! clusters, the inertia it reports is the f64 brute force's over its own centroids, the same
//! seed gives the same centroids on every backend, empty clusters are repaired, and bad input
//! is refused.

mod common;

use common::{Rng, contexts, describe};
use hive_gpu::{GpuBackendType, GpuContext, HiveGpuError, KMeans, KMeansParams};

/// `per` noisy points (sd 0.1) around each of `centers` far-apart centers in `dim` dimensions,
/// interleaved; and the centers.
fn blobs(centers: usize, per: usize, dim: usize, seed: u64) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut rng = Rng::new(seed);
    let truth: Vec<Vec<f32>> = (0..centers)
        .map(|c| {
            (0..dim)
                .map(|j| if j == c % dim { 10.0 * (c / dim + 1) as f32 } else { -3.0 * (c % 2) as f32 })
                .collect()
        })
        .collect();
    let mut data = Vec::with_capacity(centers * per * dim);
    for _ in 0..per {
        for center in &truth {
            let noise = rng.normals(dim);
            data.extend(center.iter().zip(noise).map(|(&x, e)| x + 0.1 * e));
        }
    }
    (data, truth)
}

fn squared(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum()
}

/// The f64 brute force's inertia of `points` over `model`'s centroids.
fn brute_inertia(points: &[f32], model: &KMeans) -> f64 {
    points
        .chunks_exact(model.dim)
        .map(|p| (0..model.clusters()).map(|c| squared(p, model.centroid(c))).fold(f64::INFINITY, f64::min))
        .sum()
}

#[test]
fn kmeans_finds_well_separated_clusters_and_reports_the_brute_force_inertia_on_every_backend() {
    let (dim, centers, per) = (16, 12, 150);
    let (data, truth) = blobs(centers, per, dim, 5);
    for context in contexts() {
        let what = describe(&context);
        let model =
            context.kmeans(&data, dim, &KMeansParams::new(centers)).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            (model.clusters(), model.dim, model.training_vectors),
            (centers, dim, centers * per),
            "{what}"
        );
        // Every true center has a centroid within a few standard errors of it (the mean of 150
        // points of sd 0.1 per component: about 0.008 per component).
        for (c, center) in truth.iter().enumerate() {
            let nearest =
                (0..centers).map(|i| squared(center, model.centroid(i))).fold(f64::INFINITY, f64::min);
            assert!(
                nearest.sqrt() < 0.1,
                "{what}: center {c} is {} from the nearest centroid",
                nearest.sqrt()
            );
        }
        let brute = brute_inertia(&data, &model);
        assert!(
            (model.inertia - brute).abs() <= 1e-6 * brute.max(1.0),
            "{what}: inertia {} against the brute force's {brute}",
            model.inertia
        );
        // Noise only: about sd^2 x dim per point.
        let expected = 0.01 * dim as f64 * (centers * per) as f64;
        assert!(
            model.inertia < 1.5 * expected && model.inertia > 0.5 * expected,
            "{what}: {}",
            model.inertia
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_centroids_bit_for_bit_on_every_backend() {
    let dim = 24;
    let mut rng = Rng::new(77);
    let data = rng.normals(6000 * dim);
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    // Both initialisations: k-means++ (small) and sampled seeds (more work than k-means++ takes).
    for params in [
        KMeansParams { iterations: 8, ..KMeansParams::new(20) },
        // 2,000 x 6,000 x 24 multiply-adds: past what k-means++ may cost.
        KMeansParams { iterations: 3, ..KMeansParams::new(2000) },
    ] {
        let reference = cpu.kmeans(&data, dim, &params).expect("k-means on the CPU");
        assert_eq!(reference, cpu.kmeans(&data, dim, &params).unwrap(), "a second run differs");
        for context in contexts() {
            let model = context.kmeans(&data, dim, &params).unwrap();
            assert!(
                model.centroids.iter().zip(&reference.centroids).all(|(a, b)| a.to_bits() == b.to_bits())
                    && model.iterations == reference.iterations,
                "{} differs from the CPU ({:?})",
                describe(&context),
                params
            );
        }
        let other = cpu.kmeans(&data, dim, &KMeansParams { seed: params.seed + 1, ..params }).unwrap();
        assert_ne!(other.centroids, reference.centroids, "the seed changes nothing");
    }
}

#[test]
fn empty_clusters_are_split_from_the_largest_when_the_data_has_fewer_distinct_points() {
    // 3 distinct points, 5 clusters: two clusters start on duplicates and go empty.
    let dim = 4;
    let distinct = [[1.0f32, 0.0, 0.0, 2.0], [0.0, 5.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]];
    let data: Vec<f32> = (0..300).flat_map(|i| distinct[i % 3]).collect();
    for context in contexts() {
        let what = describe(&context);
        let model =
            context.kmeans(&data, dim, &KMeansParams::new(5)).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(model.clusters(), 5, "{what}");
        assert!(model.centroids.iter().all(|x| x.is_finite()), "{what}: {:?}", model.centroids);
        // Every distinct point keeps a centroid next to it (a split moves by 1/1024 at most).
        for p in &distinct {
            let nearest = (0..5).map(|c| squared(p, model.centroid(c))).fold(f64::INFINITY, f64::min);
            assert!(nearest < 1e-3, "{what}: {p:?} lost its centroid ({nearest})");
        }
        // No two centroids coincide: the empty ones were split off, not left as copies.
        for a in 0..5 {
            for b in a + 1..5 {
                assert!(model.centroid(a) != model.centroid(b), "{what}: centroids {a} and {b} coincide");
            }
        }
    }
}

#[test]
fn a_large_input_trains_on_a_sample_of_the_size_asked() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let (data, _) = blobs(4, 1000, 8, 9);
    let params = KMeansParams { max_training_vectors: 500, ..KMeansParams::new(4) };
    let model = cpu.kmeans(&data, 8, &params).unwrap();
    assert_eq!(model.training_vectors, 500);
    assert_eq!(model.clusters(), 4);
}

#[test]
fn bad_kmeans_input_is_refused_by_name() {
    let cpu = GpuContext::with_backend(GpuBackendType::Cpu, 0).expect("the CPU backend");
    let data = vec![1.0f32; 40];
    let refused = |values: &[f32], dim: usize, params: KMeansParams| -> String {
        match cpu.kmeans(values, dim, &params) {
            Err(e @ (HiveGpuError::InvalidArgument(_) | HiveGpuError::InvalidVector { .. })) => e.to_string(),
            other => panic!("accepted or wrong error: {other:?}"),
        }
    };
    assert!(refused(&data, 4, KMeansParams::new(0)).contains("clusters"));
    assert!(refused(&data, 4, KMeansParams::new(11)).contains("10"));
    assert!(refused(&data, 3, KMeansParams::new(2)).contains("dimension"));
    assert!(refused(&data, 0, KMeansParams::new(2)).contains("dimension"));
    assert!(refused(&data, 4, KMeansParams { iterations: 0, ..KMeansParams::new(2) }).contains("iteration"));
    let mut nan = data.clone();
    nan[13] = f32::NAN;
    assert!(refused(&nan, 4, KMeansParams::new(2)).contains("NaN"));
}
