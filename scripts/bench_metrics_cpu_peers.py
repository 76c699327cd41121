#!/usr/bin/env python3
"""CPU peer benchmark for the L1 and L-infinity metrics: hive-gpu `bench --backend cpu
--metric l1|linf` against faiss-cpu's IndexFlat(d, METRIC_L1 | METRIC_Linf) on the same files,
queries, k and threads, batch and one by one, alternating the two tools `--rounds` times.

    .venv-bench/bin/python scripts/bench_metrics_cpu_peers.py [--datasets sift,fmnist,synth]
        [--threads 2] [--rounds 2] [--quick]

Needs a release build of the CLI (`cargo build --release -p hive-gpu-cli`) and .venv-bench/
(scripts/bench-cpu-peers sets it up). The data sets and helpers are bench_cpu_peers.py's.
hive-gpu's recall is its CLI's (an f64 brute force of the same metric on a query sample);
faiss's is checked here against an f64 brute force on the first `--check` queries.
"""
import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cpu_peers as cpu  # noqa: E402

import faiss  # noqa: E402

METRICS = {"l1": faiss.METRIC_L1, "linf": faiss.METRIC_Linf}


def exact_ids(xb, q, k, metric):
    """The exact k nearest rows of `q` in f64 under l1, linf or l2, ties by row."""
    d = np.abs(xb.astype(np.float64) - q.astype(np.float64))
    dist = {"l1": lambda: d.sum(1), "linf": lambda: d.max(1), "l2": lambda: (d * d).sum(1)}[metric]()
    return np.lexsort((np.arange(len(dist)), dist))[:k]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--datasets", default="sift,fmnist,synth")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--check", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="1,000 fmnist queries, 100k synthetic rows")
    parser.add_argument("--min-time", type=float, default=2.0)
    parser.add_argument("--max-queries", type=int, default=200,
                        help="queries per batch (and half as many one by one): faiss's L-infinity "
                             "has no SIMD and takes minutes per round on Fashion-MNIST otherwise")
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    hive_bin = cpu.ROOT / "target" / "release" / "hive-gpu"
    cpu.BENCH_DATA.mkdir(exist_ok=True)
    loaders = {"sift": cpu.load_sift, "fmnist": lambda: cpu.load_fmnist(args.quick),
               "synth": lambda: cpu.load_synth(args.quick)}
    k = args.k
    print(f"# {cpu.cpu_model()} | {args.threads} threads | faiss {faiss.__version__} | k {k}", flush=True)
    rows = []
    for name in args.datasets.split(","):
        ds = loaders[name]()
        xb, xq = ds["xb"], ds["xq"][:args.max_queries]
        ds["one_by_one"] = min(ds["one_by_one"], max(1, args.max_queries // 2))
        ds["query"] = cpu.subset_file(ds["name"], xq, len(xq))
        few = cpu.subset_file(ds["name"], xq, ds["one_by_one"])
        for metric, code in METRICS.items():
            index = faiss.IndexFlat(xb.shape[1], code)
            index.add(xb)
            runs = {"batch": ([], []), "one-by-one": ([], [])}
            recall = {}
            for _ in range(args.rounds):
                timing, ids = cpu.faiss_batch(index, xq, k, args.min_time)
                runs["batch"][0].append(timing["qps"])
                want = [exact_ids(xb, xq[i], k, metric) for i in range(args.check)]
                recall["faiss"] = cpu.recall_at_k(ids[:args.check], want, k)
                timing, _ = cpu.faiss_one_by_one(index, xq[:ds["one_by_one"]], k, args.min_time)
                runs["one-by-one"][0].append(timing["qps"])
                for mode, query in (("batch", ds["query"]), ("one-by-one", few)):
                    out = cpu.run_hive(hive_bin, ds, query, mode, k, env, metric=metric)["result"]
                    if out is None:
                        sys.exit(f"hive-gpu failed on {name} {metric} {mode}")
                    runs[mode][1].append(out["qps"])
                    recall[f"hive {mode}"] = out["recall"]
            for mode, (faiss_qps, hive_qps) in runs.items():
                f, h = statistics.median(faiss_qps), statistics.median(hive_qps)
                row = (ds["name"], xb.shape, metric, mode, h, f, h / f, recall[f"hive {mode}"], recall["faiss"])
                rows.append(row)
                print(f"{ds['name']} {metric} {mode}: hive {h:,.0f} QPS, faiss {f:,.0f} QPS, {h / f:.2f}x "
                      f"(runs hive {[round(x) for x in hive_qps]}, faiss {[round(x) for x in faiss_qps]})",
                      flush=True)
    print(f"\n| data | n x d | metric | mode | hive QPS | faiss-cpu QPS | ratio | hive recall@{k} | faiss recall@{k} |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for name, shape, metric, mode, h, f, ratio, hr, fr in rows:
        print(f"| {name} | {shape[0]:,} x {shape[1]} | {metric} | {mode} | {h:,.0f} | {f:,.0f} | {ratio:.2f}x "
              f"| {hr:.4f} | {fr:.4f} |")


if __name__ == "__main__":
    main()
