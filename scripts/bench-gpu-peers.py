#!/usr/bin/env python3
"""hive-gpu (CUDA backend, through the `hive-gpu bench` CLI) against PyTorch's obvious exact k-NN
(torch.mm in tiles + torch.topk, TF32 off) on the same random data, on the GPU machine.

    . .gpu/env && python3 scripts/bench-gpu-peers.py [--quick | --large] [--out DIR]

PyTorch is timed with CUDA events around the search (data and queries already on the device:
its best case); hive-gpu end to end from the host (queries up, results down). Each number is a
median. The single-query floor is the bytes one scan must read over the device's read bandwidth,
measured here by timing torch.sum over a 4 GiB tensor. Ground truth comes from an f64 brute force
on the GPU, so recall is checked for every run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
DEV = torch.device("cuda")


def write_vecs(path, x):
    """fvecs (float32) or ivecs (int32): each row prefixed by its dimension."""
    n, d = x.shape
    rows = np.empty((n, d + 1), dtype=np.int32)
    rows[:, 0] = d
    rows[:, 1:] = x.view(np.int32)
    rows.tofile(path)


def timed(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def read_bandwidth():
    x = torch.rand(1 << 30, device=DEV)  # 4 GiB
    ms = timed(lambda: x.sum(), 20)
    del x
    torch.cuda.empty_cache()
    return (1 << 32) / (ms * 1e-3)


def tiled_topk(distances, n, tile, k):
    """The k smallest of each row of a distance matrix produced tile by tile:
    `distances(s, e)` gives columns [s, e); torch.topk per tile, merged."""
    best_d = best_i = None
    for s in range(0, n, tile):
        e = min(n, s + tile)
        dd, ii = torch.topk(distances(s, e), min(k, e - s), dim=1, largest=False)
        ii += s
        if best_d is None:
            best_d, best_i = dd, ii
        else:
            cd, ci = torch.cat([best_d, dd], 1), torch.cat([best_i, ii], 1)
            best_d, pos = torch.topk(cd, k, dim=1, largest=False)
            best_i = torch.gather(ci, 1, pos)
    return best_d, best_i


def torch_knn(xb, norms, xq, k, tile_bytes=2 << 30):
    """Exact L2 k-NN, the obvious way: distance tiles by torch.mm, torch.topk per tile."""
    nq, n = xq.shape[0], xb.shape[0]
    tile = max(k, min(n, tile_bytes // (nq * xb.element_size())))
    return tiled_topk(lambda s, e: norms[s:e].unsqueeze(0) - 2 * torch.mm(xq, xb[s:e].T), n, tile, k)


def ground_truth(xb, xq, k):
    """f64 exact L2 neighbours of every query (nearest first)."""
    out = []
    for q0 in range(0, xq.shape[0], 1024):
        q = xq[q0:q0 + 1024].double()
        qq = (q * q).sum(1, keepdim=True)

        def distances(s, e):
            b = xb[s:e].double()
            return qq + (b * b).sum(1).unsqueeze(0) - 2 * q @ b.T

        _, best_i = tiled_topk(distances, xb.shape[0], 1 << 20, k)
        out.append(best_i.int().cpu())
    return torch.cat(out).numpy()


def hive(base, query, gt, precision, batches, ks, nq=None, backend="cuda", metric="l2"):
    """`hive-gpu bench --json`'s rows; without `gt`, recall is the CLI's f64 brute force."""
    cmd = ["hive-gpu", "bench", "--base", base, "--query", query, "--backend", backend, "--metric", metric,
           "--precision", precision, "--batch", ",".join(map(str, batches)), "--ks", ",".join(map(str, ks)), "--json"]
    if gt:
        cmd += ["--groundtruth", gt]
    if nq:
        cmd += ["--nq", str(nq)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print("FAILED:", " ".join(cmd), run.stderr, file=sys.stderr)
        return []
    return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="1M x 128 only")
    parser.add_argument("--large", action="store_true", help="10M x 128 and 1M x 768 only")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/hive-bench"))
    parser.add_argument("--work", default="/tmp/hive-bench-data")
    parser.add_argument("--no-peers", action="store_true", help="write the data, skip all timing")
    parser.add_argument("--backends", default="cuda", help="comma list of hive-gpu backends (cuda,vulkan)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | TF32 off", flush=True)
    bw = read_bandwidth()
    print(f"# read bandwidth (torch.sum over 4 GiB, median of 20): {bw / 1e9:.0f} GB/s", flush=True)
    datasets = [] if args.large else [("1M x 128", 1_000_000, 128, ["f32", "fast", "f16"])]
    if not args.quick:
        datasets += [("10M x 128", 10_000_000, 128, ["f32", "f16"]), ("1M x 768", 1_000_000, 768, ["f32", "fast"])]
    ks = [10, 100]
    rows = []
    for name, n, d, precisions in datasets:
        gen = torch.Generator(device=DEV).manual_seed(n + d)
        xb = torch.rand(n, d, device=DEV, generator=gen)
        xq = torch.rand(10_000, d, device=DEV, generator=gen)
        tag = f"{n}x{d}"
        base, query, gt = (f"{args.work}/{tag}.{e}" for e in ("base.fvecs", "query.fvecs", "gt.ivecs"))
        write_vecs(base, xb.cpu().numpy())
        write_vecs(query, xq.cpu().numpy())
        write_vecs(gt, ground_truth(xb, xq, 100))
        print(f"## {name}: data and f64 ground truth written", flush=True)
        if args.no_peers:
            del xb, xq
            torch.cuda.empty_cache()
            continue
        peers = {}
        for dtype_name, dtype in (("f32", torch.float32), ("f16", torch.float16)):
            if dtype_name == "f16" and "f16" not in precisions:
                continue
            b = xb.to(dtype)
            norms = (b.float() ** 2).sum(1).to(dtype)
            for nq in (1, 100, 10_000):
                q = xq[:nq].to(dtype)
                for k in ks:
                    reps = 50 if nq == 1 else (20 if nq == 100 else 5)
                    ms = timed(lambda: torch_knn(b, norms, q, k), reps)
                    peers[(dtype_name, nq, k)] = ms
                    print(f"torch {dtype_name} nq {nq} k {k}: {ms:.3f} ms", flush=True)
            del b, norms
            torch.cuda.empty_cache()
        del xb, xq
        torch.cuda.empty_cache()
        for backend, precision in [(b, p) for b in args.backends.split(",") for p in precisions]:
            if backend != "cuda" and precision == "fast":
                continue  # fast (TF32) exists on CUDA only
            if backend != "cuda" and name != "1M x 128":
                continue  # the other backends' targets are on 1M x 128; the rest would not fit the run
            peer_dtype = "f16" if precision == "f16" else "f32"
            element = 2 if precision == "f16" else 4
            floor_ms = n * d * element / bw * 1e3
            # One process per query-set size: the data is loaded and added once for each.
            for batches, limit in (([1], 300), ([100, 10_000], None)):
                results = hive(base, query, gt, precision, batches, ks, nq=limit, backend=backend)
                for r in results:
                    k, nq = r["k"], r["batch"]
                    torch_ms = peers[(peer_dtype, nq, k)]
                    torch_qps = nq / (torch_ms * 1e-3)
                    hive_ms = r["p50_ms"]
                    row = {
                        "data": name, "backend": backend, "precision": precision, "nq": nq, "k": k,
                        "hive_qps": r["qps"], "hive_p50_ms": hive_ms, "recall": r["recall"],
                        "torch": peer_dtype, "torch_ms": torch_ms, "torch_qps": torch_qps,
                        "speedup": r["qps"] / torch_qps, "build_s": r["build_s"],
                        "floor_ms": floor_ms if nq == 1 else None,
                    }
                    rows.append(row)
                    extra = f" | {hive_ms / floor_ms:.2f}x floor ({floor_ms:.3f} ms)" if nq == 1 else ""
                    print(f"hive {backend} {precision} nq {nq} k {k}: {r['qps']:.0f} QPS, p50 {hive_ms:.3f} ms, "
                          f"recall {r['recall']:.4f}, build {r['build_s']:.2f} s | torch {peer_dtype} "
                          f"{torch_qps:.0f} QPS | {row['speedup']:.2f}x{extra}", flush=True)
    with open(f"{args.out}/bench-gpu.json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "read_bw": bw, "rows": rows}, f, indent=1)
    print("\n| data | backend | hive precision | nq | k | hive QPS | hive p50 ms | recall@k | PyTorch | PyTorch QPS | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['speedup']:.2f}x"
        if r["nq"] == 1:
            ratio += f" ({r['hive_p50_ms'] / r['floor_ms']:.2f}x floor)"
        print(f"| {r['data']} | {r['backend']} | {r['precision']} | {r['nq']} | {r['k']} | {r['hive_qps']:,.0f} | "
              f"{r['hive_p50_ms']:.3f} | {r['recall']:.4f} | {r['torch']} | {r['torch_qps']:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
