#!/usr/bin/env python3
"""hive-gpu's exact L1 and L-infinity search (CUDA backend, through the `hive-gpu bench` CLI)
against PyTorch's obvious implementation (torch.cdist with p=1 or p=inf in column tiles, then
torch.topk, merged), on the same random data, on the GPU machine.

    . .gpu/env && python3 scripts/bench-metrics-peers.py [--rows 1000000] [--dim 128] [--out DIR]

PyTorch is timed with CUDA events around the search (data and queries already on the device:
its best case); hive-gpu end to end from the host (queries up, results down). Each number is a
median. hive-gpu's recall is its CLI's, against an f64 brute force of the same metric on a
sample of the queries. The helpers (CUDA-event timer, tiled top-k, .fvecs writer, the CLI run)
are `bench-gpu-peers.py`'s.
"""
import argparse
import importlib.util
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("gpu_peers", os.path.join(HERE, "bench-gpu-peers.py"))
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)

DEV = peers.DEV
NORMS = {"l1": 1.0, "linf": float("inf")}


def torch_knn(xb, xq, k, p, tile_bytes=2 << 30):
    """Exact L1 / L-infinity k-NN, the obvious way: torch.cdist tiles, torch.topk per tile."""
    nq, n = xq.shape[0], xb.shape[0]
    tile = max(k, min(n, tile_bytes // (nq * xb.element_size())))
    return peers.tiled_topk(lambda s, e: torch.cdist(xq, xb[s:e], p=p), n, tile, k)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/hive-bench"))
    parser.add_argument("--work", default="/tmp/hive-bench-data")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    n, d = args.rows, args.dim
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | {n} x {d} f32", flush=True)
    gen = torch.Generator(device=DEV).manual_seed(n + d)
    xb = torch.rand(n, d, device=DEV, generator=gen)
    xq = torch.rand(args.queries, d, device=DEV, generator=gen)
    base, query = f"{args.work}/m{n}x{d}.base.fvecs", f"{args.work}/m{n}x{d}.query.fvecs"
    peers.write_vecs(base, xb.cpu().numpy())
    peers.write_vecs(query, xq.cpu().numpy())
    sizes, ks = (1, 100, args.queries), (10, 100)
    times = {}
    for metric, p in NORMS.items():
        for nq in sizes:
            q = xq[:nq]
            for k in ks:
                reps, warmup = {1: (30, 3), 100: (5, 1)}.get(nq, (2, 0))
                times[(metric, nq, k)] = peers.timed(lambda: torch_knn(xb, q, k, p), reps, warmup)
                print(f"torch {metric} nq {nq} k {k}: {times[(metric, nq, k)]:.3f} ms", flush=True)
    del xb, xq
    torch.cuda.empty_cache()
    rows = []
    for metric in NORMS:
        # One process per query-set size: the data is loaded and added once for each.
        for batches, limit in (([1], 300), ([100, args.queries], None)):
            for r in peers.hive(base, query, None, "f32", batches, ks, nq=limit, metric=metric):
                k, nq = r["k"], r["batch"]
                torch_qps = nq / (times[(metric, nq, k)] * 1e-3)
                row = {"metric": metric, "nq": nq, "k": k, "hive_qps": r["qps"], "hive_p50_ms": r["p50_ms"],
                       "recall": r["recall"], "torch_ms": times[(metric, nq, k)], "torch_qps": torch_qps,
                       "speedup": r["qps"] / torch_qps}
                rows.append(row)
                print(f"hive {metric} nq {nq} k {k}: {r['qps']:.0f} QPS, p50 {r['p50_ms']:.3f} ms, recall "
                      f"{r['recall']:.4f} | torch {torch_qps:.0f} QPS | {row['speedup']:.2f}x", flush=True)
    with open(f"{args.out}/bench-metrics.json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": n, "dim": d, "results": rows}, f, indent=1)
    print("\n| metric | nq | k | hive QPS | hive p50 ms | recall@k | PyTorch QPS | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['metric']} | {r['nq']} | {r['k']} | {r['hive_qps']:,.0f} | {r['hive_p50_ms']:.3f} | "
              f"{r['recall']:.4f} | {r['torch_qps']:,.0f} | {r['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
