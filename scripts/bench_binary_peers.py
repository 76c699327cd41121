#!/usr/bin/env python3
"""Binary quantization with an exact re-rank: hive-gpu (`bench --index binary --search refine=R`)
against FAISS's IndexBinaryFlat over the same kind of codes (one bit per component, set where the
vector exceeds the base's mean) followed by the same exact re-rank of the best R * k in numpy,
on the same data, queries and threads, in one run. Recall@k of both against the same ground truth.

Run with the .venv-bench of scripts/bench-ivf-peers (faiss-cpu, numpy):

    .venv-bench/bin/python scripts/bench_binary_peers.py --base B --query Q --groundtruth G
        [--refine 4,16,64,256] [--threads 2] [--backend cpu] [--json out]

hive-gpu's mean comes from a sample of 65,536 vectors, FAISS's side from the whole base (at least
as good a center). The peer's re-rank is part of its timed search.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cpu_peers as peers  # noqa: E402


def faiss_rows(args, xb, xq, gt, k):
    import faiss

    began = time.perf_counter()
    center = xb.mean(axis=0)
    codes = np.packbits(xb > center, axis=1)
    index = faiss.IndexBinaryFlat(codes.shape[1] * 8)
    index.add(codes)
    build = time.perf_counter() - began
    norms = (xb.astype(np.float64) ** 2).sum(axis=1)
    rows = []
    for refine in args.refines:
        def search():
            _, cand = index.search(np.packbits(xq > center, axis=1), refine * k)
            out = np.empty((len(xq), k), dtype=np.int64)
            for i, c in enumerate(cand):
                c = c[c >= 0]
                rows_c = xb[c].astype(np.float64)
                d = norms[c] - 2.0 * rows_c @ xq[i].astype(np.float64)
                order = np.lexsort((c, d))[:k]
                out[i, :len(order)] = c[order]
            return out
        ids = search()
        times = []
        while len(times) < 3 or sum(times) < args.min_time:
            t = time.perf_counter()
            search()
            times.append(time.perf_counter() - t)
        rows.append({"tool": "faiss-cpu IndexBinaryFlat + numpy re-rank", "refine": refine,
                     "recall": peers.recall_at_k(ids, gt, k), "qps": len(xq) / float(np.median(times)),
                     "build_s": build})
    return rows


def hive_rows(args, k, gt_path):
    cmd = [args.hive_bin, "bench", "--backend", args.backend, "--base", args.base, "--query", args.query,
           "--groundtruth", str(gt_path), "-k", str(k), "--index", "binary", "--json"]
    for r in args.refines:
        cmd += ["--search", f"refine={r}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        r = json.loads(line)
        rows.append({"tool": f"hive-gpu {args.backend}", "refine": int(r["search_params"].split("=")[1]),
                     "recall": r["recall"], "qps": r["qps"], "build_s": r["build_s"] + r["index_build_s"],
                     "bytes_per_vector": r["bytes_per_vector"]})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True)
    p.add_argument("--query", required=True)
    p.add_argument("--groundtruth", required=True)
    p.add_argument("--refine", default="4,16,64,256")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--hive-bin", default=str(peers.ROOT / "target/release/hive-gpu"))
    p.add_argument("--json")
    args = p.parse_args()
    args.refines = [int(x) for x in args.refine.split(",")]
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    xb, xq = peers.read_fvecs(args.base), peers.read_fvecs(args.query)
    k = args.k
    gt = peers.read_ivecs(args.groundtruth)[:len(xq), :k]
    hive = hive_rows(args, k, Path(args.groundtruth))
    peer = faiss_rows(args, xb, xq, gt, k)
    print(f"binary + exact re-rank: {len(xb)} x {xb.shape[1]} base, {len(xq)} queries, k={k}, "
          f"{args.threads} threads, hive-gpu --backend {args.backend}")
    print(f"{'refine':>6} {'hive recall':>11} {'hive QPS':>10} {'faiss recall':>12} {'faiss QPS':>10} {'ratio':>6}")
    for h, f in zip(hive, peer):
        print(f"{h['refine']:>6} {h['recall']:>11.4f} {h['qps']:>10.0f} {f['recall']:>12.4f} {f['qps']:>10.0f} "
              f"{h['qps'] / f['qps']:>6.2f}")
    if args.json:
        Path(args.json).write_text("\n".join(json.dumps(r) for r in hive + peer) + "\n")


if __name__ == "__main__":
    main()
