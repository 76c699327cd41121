#!/usr/bin/env python3
"""CPU peer benchmark for byte storage: hive-gpu `bench --backend cpu --precision u8|i8` against
faiss-cpu's byte index, IndexScalarQuantizer with QT_8bit_direct (u8) or QT_8bit_direct_signed
(i8) (one byte per component, searched exactly over the stored bytes: the faiss index for the
same data at the same memory), and against IndexFlatL2 (f32, four times the memory), on the same
files, queries, k and threads, batch and one by one, alternating the tools `--rounds` times.

    .venv-bench/bin/python scripts/bench_storage_cpu_peers.py [--datasets sift,fmnist,int8]
        [--threads 2] [--rounds 2]

Needs a release build of the CLI (`cargo build --release -p hive-gpu-cli`) and .venv-bench/
(scripts/bench-cpu-peers sets it up). SIFT10K and Fashion-MNIST are bytes (u8); `int8` is
100k x 128 signed bytes (seed 42, rounded normals x 40). Recall: hive-gpu's is its CLI's (an
f64 brute force on a query sample); faiss's is checked here against an f64 brute force on the
first `--check` queries.
"""
import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cpu_peers as cpu  # noqa: E402
from bench_metrics_cpu_peers import exact_ids  # noqa: E402

import faiss  # noqa: E402


def load_int8():
    n, nq, dim = 100_000, 1000, 128
    name = "int8_100k"
    base, query = cpu.BENCH_DATA / f"{name}_base.fvecs", cpu.BENCH_DATA / f"{name}_query.fvecs"
    if cpu.fvecs_ok(base, n, dim) and cpu.fvecs_ok(query, nq, dim):
        xb, xq = cpu.read_fvecs(base), cpu.read_fvecs(query)
    else:
        rng = np.random.default_rng(42)
        xb = np.clip(np.round(rng.standard_normal((n, dim)) * 40), -128, 127).astype(np.float32)
        xq = np.clip(np.round(rng.standard_normal((nq, dim)) * 40), -128, 127).astype(np.float32)
        cpu.write_vecs(base, xb)
        cpu.write_vecs(query, xq)
    return dict(name=name, base=base, query=query, gt=None, xb=xb, xq=xq, gt_ids=None, one_by_one=200)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--datasets", default="sift,fmnist,int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--check", type=int, default=20)
    parser.add_argument("--min-time", type=float, default=2.0)
    parser.add_argument("--max-queries", type=int, default=1000)
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    hive_bin = cpu.ROOT / "target" / "release" / "hive-gpu"
    cpu.BENCH_DATA.mkdir(exist_ok=True)
    loaders = {"sift": cpu.load_sift, "fmnist": lambda: cpu.load_fmnist(True), "int8": load_int8}
    k = args.k
    print(f"# {cpu.cpu_model()} | {args.threads} threads | faiss {faiss.__version__} | k {k}", flush=True)
    rows = []
    for name in args.datasets.split(","):
        ds = loaders[name]()
        xb, xq = ds["xb"], ds["xq"][:args.max_queries]
        signed = xb.min() < 0
        precision = "i8" if signed else "u8"
        ds["query"] = cpu.subset_file(ds["name"], xq, len(xq))
        few = cpu.subset_file(ds["name"], xq, ds["one_by_one"])
        d = xb.shape[1]
        qtype = faiss.ScalarQuantizer.QT_8bit_direct_signed if signed else faiss.ScalarQuantizer.QT_8bit_direct
        sq = faiss.IndexScalarQuantizer(d, qtype, faiss.METRIC_L2)
        sq.train(xb)
        sq.add(xb)
        flat = faiss.IndexFlatL2(d)
        flat.add(xb)
        peers = {f"faiss SQ {precision} direct": sq, "faiss IndexFlatL2 (f32)": flat}
        want = [exact_ids(xb, xq[i], k, "l2") for i in range(args.check)]
        for mode in ("batch", "one-by-one"):
            qps = {name: [] for name in peers}
            qps["hive"] = []
            recall = {}
            for _ in range(args.rounds):
                for peer, index in peers.items():
                    if mode == "batch":
                        timing, ids = cpu.faiss_batch(index, xq, k, args.min_time)
                        recall[peer] = cpu.recall_at_k(ids[:args.check], want, k)
                    else:
                        timing, _ = cpu.faiss_one_by_one(index, xq[:ds["one_by_one"]], k, args.min_time)
                    qps[peer].append(timing["qps"])
                query = ds["query"] if mode == "batch" else few
                out = cpu.run_hive(hive_bin, ds, query, mode, k, env, precision=precision)["result"]
                if out is None:
                    sys.exit(f"hive-gpu failed on {name} {mode}")
                qps["hive"].append(out["qps"])
                recall["hive"] = out["recall"]
            h = statistics.median(qps["hive"])
            for peer in peers:
                f = statistics.median(qps[peer])
                rows.append((ds["name"], xb.shape, precision, mode, peer, h, f, h / f, recall["hive"],
                             recall.get(peer, float("nan"))))
                print(f"{ds['name']} {precision} {mode}: hive {h:,.0f} QPS, {peer} {f:,.0f} QPS, {h / f:.2f}x "
                      f"(runs hive {[round(x) for x in qps['hive']]}, peer {[round(x) for x in qps[peer]]})",
                      flush=True)
    print(f"\n| data | n x d | hive storage | mode | peer | hive QPS | peer QPS | ratio | hive recall@{k} | peer recall@{k} |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|")
    for name, shape, precision, mode, peer, h, f, ratio, hr, fr in rows:
        print(f"| {name} | {shape[0]:,} x {shape[1]} | {precision} | {mode} | {peer} | {h:,.0f} | {f:,.0f} | "
              f"{ratio:.2f}x | {hr:.4f} | {fr:.4f} |")


if __name__ == "__main__":
    main()
