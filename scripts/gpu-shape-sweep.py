#!/usr/bin/env python3
"""Issue 22's shape sweep: exact k-NN of hive-gpu (CUDA backend, through `hive-gpu bench`) against
FAISS GPU (GpuIndexFlatL2; GpuIndexFlatIP over normalized vectors for cosine, over the raw ones
for dot) and PyTorch's obvious implementation (torch.mm tiles + torch.topk, TF32 off), on the same
data in the same run, for every dimension x rows x batch size x metric x k of the grid.

On the GPU machine, with FAISS GPU made importable (../shared/tools/faiss-gpu-prep.sh) and the
bundle of scripts/gpu-bundle unpacked:

    . scripts/cuda-libs.sh; . .gpu/env; . /tmp/faiss/env.sh
    python3 scripts/gpu-shape-sweep.py --metrics l2 --out $OUT/sweep

The issue's whole grid is far more than one device call (10 minutes): split it by --metrics, -k
and --dims, for example

    python3 scripts/gpu-shape-sweep.py --metrics dot -k 1,100 --dims 16,32,50,96,200 \
        --rows 1000,10000,100000,1000000 --nqs 1,10,100,1000,10000 --out $OUT/dot

and --rows 10000000 --max-bytes 6e9 for the ten-million-row cells (d <= 128).

Data: uniform [0, 1) components (torch.rand, seeded per shape, as the other GPU benchmarks),
10,000 queries drawn the same way. Each number is a median: hive-gpu's QPS as `hive-gpu bench`
reports it (end to end from the host: queries up, results down, as flat arrays of ids and scores
like FAISS's and PyTorch's, `--columnar`; `--lists` takes a list of result structures per query
instead; one process per dataset and batch group, so the collection is loaded once), FAISS timed end to end from host arrays (what a FAISS
user calls), PyTorch with CUDA events around a search whose data and queries already sit on the
device (its best case). Batches of one query are 200 calls of different queries. hive-gpu's
recall@k is measured against an f64 brute force (`--exact-recall`), so every cell is also an
exactness check. A dataset larger than --max-bytes is left out (it would not change the picture
and costs the run's time in file writes).

Output: sweep.json (every cell), a Markdown table on stdout, the fixed cost of one search call
(one query's latency, median, for each library at the smallest --rows: give a small one such as
1000 to read it), and heat maps of the ratio to FAISS per cell (sweep-<metric>-k<k>.png) when
matplotlib is importable (else plot sweep.json elsewhere with --plot-only).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu_peers import write_vecs  # noqa: E402  (the .fvecs writer every bench script shares)


def cuda_timed(torch, fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def wall_timed(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def torch_knn(torch, xb, extra, xq, k, inner, tile_bytes=2 << 30):
    """Exact k-NN the obvious way: distance tiles by torch.mm, torch.topk per tile, merged.
    L2 ranks by |b|^2 - 2 q.b (extra = the rows' squared norms); `inner` (cosine over unit rows
    and queries, or dot) by -q.b (extra unused)."""
    nq, n = xq.shape[0], xb.shape[0]
    tile = max(k, min(n, tile_bytes // max(1, nq * xb.element_size())))
    best_d = best_i = None
    for s in range(0, n, tile):
        e = min(n, s + tile)
        product = torch.mm(xq, xb[s:e].T)
        dist = -product if inner else extra[s:e].unsqueeze(0) - 2 * product
        dd, ii = torch.topk(dist, min(k, e - s), dim=1, largest=False)
        ii += s
        if best_d is None:
            best_d, best_i = dd, ii
        else:
            cd, ci = torch.cat([best_d, dd], 1), torch.cat([best_i, ii], 1)
            best_d, pos = torch.topk(cd, k, dim=1, largest=False)
            best_i = torch.gather(ci, 1, pos)
    return best_d, best_i


def hive(base, query, metric, batches, k, nq, columnar, program=("hive-gpu",)):
    cmd = [*program, "bench", "--base", base, "--query", query, "--backend", "cuda", "--metric", metric,
           "--batch", ",".join(map(str, batches)), "-k", str(k), "--nq", str(nq), "--exact-recall", "--json"]
    if columnar:
        cmd.append("--columnar")
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print("FAILED:", " ".join(cmd), run.stderr[-2000:], file=sys.stderr, flush=True)
        return []
    out = []
    for line in run.stdout.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return [r for r in out if "batch" in r and "qps" in r]


def plot(cells, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print("# no matplotlib here: plot sweep.json with --plot-only elsewhere", flush=True)
        return
    for metric, k in sorted({(c["metric"], c.get("k", 10)) for c in cells}):
        mine = [c for c in cells if c["metric"] == metric and c.get("k", 10) == k and c.get("faiss_qps")]
        rows = sorted({(c["n"], c["nq"]) for c in mine})
        dims = sorted({c["d"] for c in mine})
        grid = np.full((len(rows), len(dims)), np.nan)
        for c in mine:
            grid[rows.index((c["n"], c["nq"])), dims.index(c["d"])] = c["hive_qps"] / c["faiss_qps"]
        fig, ax = plt.subplots(figsize=(1.1 * len(dims) + 2, 0.45 * len(rows) + 1.5))
        image = ax.imshow(np.log2(grid), cmap="RdYlGn", vmin=-2, vmax=2, aspect="auto")
        ax.set_xticks(range(len(dims)), [str(d) for d in dims])
        ax.set_yticks(range(len(rows)), [f"n {n:,} nq {nq:,}" for n, nq in rows])
        ax.set_xlabel("dimension")
        for i in range(len(rows)):
            for j in range(len(dims)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_title(f"hive-gpu QPS / FAISS GPU QPS, exact {metric}, k {k}")
        fig.colorbar(image, ax=ax, label="log2 of the ratio")
        fig.tight_layout()
        name = f"{out}/sweep-{metric}.png" if k == 10 else f"{out}/sweep-{metric}-k{k}.png"
        fig.savefig(name, dpi=110)
        plt.close(fig)
        print(f"# heat map: {name}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", default="25,64,100,128,384,768,1536")
    parser.add_argument("--rows", default="100000,1000000")
    parser.add_argument("--nqs", default="1,100,1000,10000")
    parser.add_argument("--metrics", default="l2,cosine", help="any of l2, cosine, dot")
    parser.add_argument("-k", default="10", help="neighbours per query, a comma list (1,10,100)")
    parser.add_argument("--max-bytes", type=float, default=1.6e9, help="largest dataset (n x d x 4 bytes)")
    parser.add_argument("--singles", type=int, default=200, help="one-query calls timed per cell")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/hive-sweep"))
    parser.add_argument("--work", default="/tmp/hive-sweep-data")
    parser.add_argument("--plot-only", help="a sweep.json to draw the heat maps of")
    parser.add_argument("--compare", action="append", default=[], metavar="LABEL=COMMAND",
                        help="also run another hive-gpu (a command line, e.g. 'old=/tmp/old/hive-gpu' or "
                             "'knob=env HIVE_GPU_FUSED_MIN_WORK=1000000 hive-gpu') on every cell, alternating with "
                             "the one on PATH; its QPS goes to hive_LABEL_qps")
    parser.add_argument("--lists", action="store_true",
                        help="hive-gpu returns a list of result structures per query (ids as strings) instead of "
                             "flat arrays, the default and what FAISS and PyTorch return")
    args = parser.parse_args()
    compare = []
    for spec in args.compare:
        label, _, command = spec.partition("=")
        if not label.isidentifier() or not command:
            sys.exit(f"--compare {spec!r}: LABEL=COMMAND, LABEL a plain name")
        compare.append((label, tuple(shlex.split(command))))
    os.makedirs(args.out, exist_ok=True)
    if args.plot_only:
        with open(args.plot_only) as f:
            cells = json.load(f)["cells"]
        fixed_cost([c for c in cells if "faiss_ms" in c])
        plot(cells, args.out)
        return
    import faiss
    import numpy as np
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    os.makedirs(args.work, exist_ok=True)
    dims = [int(x) for x in args.dims.split(",")]
    sizes = [int(x) for x in args.rows.split(",")]
    nqs = [int(x) for x in args.nqs.split(",")]
    ks = [int(x) for x in args.k.split(",")]
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} (TF32 off) | faiss {faiss.__version__}",
          flush=True)
    res = faiss.StandardGpuResources()
    cells = []
    for metric, k in [(m, k) for m in args.metrics.split(",") for k in ks]:
        if metric not in ("l2", "cosine", "dot"):
            sys.exit(f"unknown metric {metric}: l2, cosine or dot")
        cosine = metric == "cosine"
        inner = metric != "l2"
        for n in sizes:
            for d in dims:
                if n * d * 4 > args.max_bytes:
                    continue
                gen = torch.Generator(device=dev).manual_seed(n * 7919 + d)
                xb = torch.rand(n, d, device=dev, generator=gen)
                xq = torch.rand(max(nqs), d, device=dev, generator=gen)
                base, query = f"{args.work}/base.fvecs", f"{args.work}/query.fvecs"
                write_vecs(base, xb.cpu().numpy())
                write_vecs(query, xq.cpu().numpy())
                if cosine:
                    xb = torch.nn.functional.normalize(xb, dim=1)
                    xq = torch.nn.functional.normalize(xq, dim=1)
                # hive-gpu: one process for the single queries, one for the batches.
                found = {}
                others = {label: {} for label, _ in compare}
                programs = [(None, ("hive-gpu",))] + compare
                # Alternate which program runs first from one dataset to the next.
                if len(cells) // max(1, len(nqs)) % 2:
                    programs.reverse()
                singles = [1] if 1 in nqs else []
                for batches, limit in ((singles, args.singles), ([b for b in nqs if b > 1], max(nqs))):
                    if batches:
                        for label, program in programs:
                            into = found if label is None else others[label]
                            for r in hive(base, query, metric, batches, k, limit, not args.lists, program):
                                into[r["batch"]] = r
                # FAISS GPU, from host arrays.
                hb, hq = xb.cpu().numpy(), xq.cpu().numpy()
                index = faiss.GpuIndexFlatIP(res, d) if inner else faiss.GpuIndexFlatL2(res, d)
                index.add(hb)
                faiss_s, torch_s = {}, {}
                for nq in nqs:
                    if nq == 1:
                        calls = iter(range(10**9))
                        faiss_s[nq] = wall_timed(lambda: index.search(hq[next(calls) % len(hq)][None, :], k),
                                                 args.singles)
                    else:
                        faiss_s[nq] = wall_timed(lambda: index.search(hq[:nq], k), 5 if nq >= 1000 else 20)
                del index
                # PyTorch, data on the device.
                extra = None if inner else (xb * xb).sum(1)
                for nq in nqs:
                    q = xq[:nq]
                    reps = 50 if nq == 1 else (20 if nq <= 1000 else 5)
                    torch_s[nq] = cuda_timed(torch, lambda: torch_knn(torch, xb, extra, q, k, inner), reps)
                del xb, xq, extra
                torch.cuda.empty_cache()
                for nq in nqs:
                    r = found.get(nq)
                    cell = {
                        "metric": metric, "n": n, "d": d, "nq": nq, "k": k,
                        "hive_qps": r["qps"] if r else None, "hive_p50_ms": r["p50_ms"] if r else None,
                        "hive_recall": r.get("recall") if r else None,
                        "faiss_qps": nq / faiss_s[nq], "torch_qps": nq / torch_s[nq],
                        "faiss_ms": faiss_s[nq] * 1e3, "torch_ms": torch_s[nq] * 1e3,
                    }
                    for label in others:
                        other = others[label].get(nq)
                        cell[f"hive_{label}_qps"] = other["qps"] if other else None
                        cell[f"hive_{label}_recall"] = other.get("recall") if other else None
                    cells.append(cell)
                    if r:
                        print(f"{metric} n {n} d {d} nq {nq}: hive {r['qps']:,.0f} QPS (recall {r.get('recall')}) | "
                              f"faiss {cell['faiss_qps']:,.0f} ({r['qps'] / cell['faiss_qps']:.2f}x) | "
                              f"torch {cell['torch_qps']:,.0f} ({r['qps'] / cell['torch_qps']:.2f}x)"
                              + "".join(f" | {label} {cell[f'hive_{label}_qps'] or 0:,.0f} "
                                        f"({(cell[f'hive_{label}_qps'] or 0) / cell['faiss_qps']:.2f}x, "
                                        f"recall {cell[f'hive_{label}_recall']})" for label in others),
                              flush=True)
                    else:
                        print(f"{metric} n {n} d {d} nq {nq}: hive FAILED", flush=True)
                with open(f"{args.out}/sweep.json", "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(), "cells": cells}, f, indent=1)
    print("\n| metric | k | n | d | nq | hive QPS | recall@k | FAISS GPU QPS | hive / FAISS | PyTorch QPS | hive / PyTorch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cells:
        if c["hive_qps"] is None:
            print(f"| {c['metric']} | {c['k']} | {c['n']:,} | {c['d']} | {c['nq']:,} | failed | | {c['faiss_qps']:,.0f} | | "
                  f"{c['torch_qps']:,.0f} | |")
            continue
        print(f"| {c['metric']} | {c['k']} | {c['n']:,} | {c['d']} | {c['nq']:,} | {c['hive_qps']:,.0f} | {c['hive_recall']} | "
              f"{c['faiss_qps']:,.0f} | {c['hive_qps'] / c['faiss_qps']:.2f} | {c['torch_qps']:,.0f} | "
              f"{c['hive_qps'] / c['torch_qps']:.2f} |")
    fixed_cost(cells)
    plot(cells, args.out)


def fixed_cost(cells):
    """One query's latency (median of the single calls) per library at the smallest n of the
    sweep: the fixed cost of a search call, once the rows take next to no time."""
    singles = [c for c in cells if c["nq"] == 1 and c.get("hive_p50_ms") is not None]
    if not singles:
        return
    n = min(c["n"] for c in singles)
    print(f"\nFixed cost of one search call: one query's latency over {n:,} rows, ms (median)\n")
    print("| metric | k | d | hive-gpu | FAISS GPU | PyTorch |")
    print("|---|---:|---:|---:|---:|---:|")
    for c in sorted((c for c in singles if c["n"] == n), key=lambda c: (c["metric"], c["k"], c["d"])):
        print(f"| {c['metric']} | {c['k']} | {c['d']} | {c['hive_p50_ms']:.3f} | {c['faiss_ms']:.3f} | "
              f"{c['torch_ms']:.3f} |")


if __name__ == "__main__":
    main()
