"""Writes a clustered synthetic set as .fvecs: N base and Q query vectors drawn around C random
centers (a Gaussian mixture, the shape IVF indexes are built for), and the exact (f64) top-100
L2 neighbours of every query as .ivecs ground truth.

    python3 scripts/make_clustered_fvecs.py OUT_PREFIX [--rows 1000000] [--queries 10000]
        [--dim 128] [--centers 4096] [--spread 0.5] [--seed 11] [--groundtruth-k 100]

Centers are standard normal; a vector is its center plus Gaussian noise of standard deviation
`spread` per component whose scale decays along the dimensions (sd_j = spread * (j + 1)^-0.5 *
sqrt(dim / sum_j 1/(j+1))): most of the variance in a few directions, as in real embeddings.
Writes OUT_PREFIX_base.fvecs, OUT_PREFIX_query.fvecs and OUT_PREFIX_groundtruth.ivecs (computed in
f64: with PyTorch on a CUDA device where there is one, else numpy).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cpu_peers as peers  # noqa: E402


def exact_top(xb, xq, k):
    """The exact top-k L2 neighbour ids of every query, computed in f64."""
    try:
        import torch

        if torch.cuda.is_available():
            q = torch.from_numpy(xq).cuda().double()
            best_d = torch.full((len(q), 0), float("inf"), device="cuda", dtype=torch.float64)
            best_i = torch.zeros((len(q), 0), device="cuda", dtype=torch.int64)
            for s in range(0, len(xb), 100_000):
                b = torch.from_numpy(xb[s:s + 100_000]).cuda().double()
                d = (q * q).sum(1)[:, None] - 2.0 * (q @ b.T) + (b * b).sum(1)[None, :]
                dk, ik = torch.topk(d, min(k, d.shape[1]), dim=1, largest=False)
                best_d = torch.cat([best_d, dk], 1)
                best_i = torch.cat([best_i, ik + s], 1)
                best_d, order = torch.sort(best_d, dim=1, stable=True)
                best_i = torch.gather(best_i, 1, order)
                best_d, best_i = best_d[:, :k], best_i[:, :k]
            return best_i.cpu().numpy()
    except ImportError:
        pass
    # numpy, in chunks of the base that keep the queries x chunk f64 matrix near 1.6 GB.
    return peers.exact_knn(xb, xq, k, chunk=max(1000, 200_000_000 // max(1, len(xq))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--centers", type=int, default=4096)
    p.add_argument("--spread", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--groundtruth-k", type=int, default=100, help="0 writes no ground truth")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    d = args.dim
    centers = rng.standard_normal((args.centers, d), dtype=np.float32)
    decay = 1.0 / np.sqrt(np.arange(1, d + 1, dtype=np.float64))
    sd = (args.spread * decay * np.sqrt(d / (decay ** 2).sum())).astype(np.float32)

    def draw(n):
        out = np.empty((n, d), dtype=np.float32)
        for s in range(0, n, 200_000):
            m = min(200_000, n - s)
            which = rng.integers(0, args.centers, m)
            out[s:s + m] = centers[which] + rng.standard_normal((m, d), dtype=np.float32) * sd
        return out

    xb = draw(args.rows)
    xq = draw(args.queries)
    peers.write_vecs(f"{args.out}_base.fvecs", xb)
    peers.write_vecs(f"{args.out}_query.fvecs", xq)
    if args.groundtruth_k > 0:
        gt = exact_top(xb, xq, min(args.groundtruth_k, args.rows))
        peers.write_vecs(f"{args.out}_groundtruth.ivecs", gt.astype(np.int32))


if __name__ == "__main__":
    main()
