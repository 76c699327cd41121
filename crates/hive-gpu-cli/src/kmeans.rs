//! `hive-gpu kmeans`: trains k-means on a vector file on one backend and reports the time, the
//! iterations and the inertia (what an IVF index's build spends most of its time on).

use std::time::Instant;

use hive_gpu::{HiveGpuError, KMeansParams, io};

use crate::KMeansArgs;

pub fn run(args: &KMeansArgs) -> Result<(), HiveGpuError> {
    let base = io::read_vectors(&args.base)?;
    let context = args.backend.context()?;
    let mut params = KMeansParams::new(args.clusters);
    params.iterations = args.iterations;
    params.seed = args.seed;
    if let Some(max) = args.max_training_vectors {
        params.max_training_vectors = max;
    }
    let started = Instant::now();
    let model = context.kmeans(&base.data, base.dim, &params)?;
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        out!(
            "{{\"backend\": \"{}\", \"vectors\": {}, \"dim\": {}, \"clusters\": {}, \"training_vectors\": {}, \"iterations\": {}, \"seconds\": {seconds:.4}, \"inertia\": {:.6e}}}",
            context.backend_type().name(),
            base.rows,
            base.dim,
            model.clusters(),
            model.training_vectors,
            model.iterations,
            model.inertia
        );
    } else {
        out!(
            "k-means of {} vectors of {} into {} clusters on {}: {} training vectors, {} iterations in {seconds:.3} s, inertia {:.6e}",
            base.rows,
            base.dim,
            model.clusters(),
            context.backend_type().name(),
            model.training_vectors,
            model.iterations,
            model.inertia
        );
    }
    Ok(())
}
