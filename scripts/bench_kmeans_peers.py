"""k-means training: hive-gpu (`hive-gpu kmeans`, assignments on --backend) against faiss.Kmeans
on the same vectors, clusters, iterations (20), seed and training-set cap (256 per cluster), in
the same run; medians of --repeat. With --faiss-gpu, FAISS trains on the GPU (faiss.Kmeans
gpu=True). Inertia is each one's own report for its final centroids over its training vectors.

    python3 scripts/bench_kmeans_peers.py --base FILE --clusters 1024 [--backend cpu] [--repeat 3]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def read_fvecs(path):
    raw = np.fromfile(path, dtype=np.int32)
    dim = raw[0]
    return raw.reshape(-1, dim + 1)[:, 1:].copy().view(np.float32)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True)
    p.add_argument("--clusters", type=int, required=True)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--binary", default=str(ROOT / "target/release/hive-gpu"))
    p.add_argument("--faiss-gpu", action="store_true")
    args = p.parse_args()
    import faiss

    base = read_fvecs(args.base)
    n, dim = base.shape

    def ours():
        out = subprocess.run(
            [args.binary, "kmeans", "--base", args.base, "--clusters", str(args.clusters),
             "--iterations", str(args.iterations), "--backend", args.backend, "--json"],
            capture_output=True, text=True, check=True,
        ).stdout
        return json.loads(out)

    def theirs():
        km = faiss.Kmeans(int(dim), args.clusters, niter=args.iterations, seed=1234,
                          max_points_per_centroid=256, gpu=args.faiss_gpu, verbose=False)
        start = time.perf_counter()
        km.train(base)
        return time.perf_counter() - start, float(km.obj[-1])

    runs = [ours() for _ in range(args.repeat)]
    peer = [theirs() for _ in range(args.repeat)]
    ours_s = statistics.median(r["seconds"] for r in runs)
    theirs_s = statistics.median(t for t, _ in peer)
    result = {
        "vectors": n, "dim": int(dim), "clusters": args.clusters, "backend": args.backend,
        "hive_seconds": ours_s, "hive_inertia": runs[0]["inertia"], "hive_iterations": runs[0]["iterations"],
        "faiss": "gpu" if args.faiss_gpu else "cpu", "faiss_seconds": theirs_s, "faiss_inertia": peer[0][1],
        "speedup": theirs_s / ours_s,
    }
    print(json.dumps(result))
    print(f"| {n} x {dim}, {args.clusters} clusters | hive-gpu ({args.backend}) {ours_s:.3f} s, inertia {runs[0]['inertia']:.5e} "
          f"({runs[0]['iterations']} iterations) | faiss.Kmeans ({result['faiss']}) {theirs_s:.3f} s, inertia {peer[0][1]:.5e} "
          f"| {theirs_s / ours_s:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
