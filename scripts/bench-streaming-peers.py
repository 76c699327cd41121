#!/usr/bin/env python3
"""A collection larger than the device's room for it, searched by streaming its rows from host
memory (issue 22, item 5): hive-gpu (CUDA backend, `hive-gpu bench` CLI) against the
host-to-device bandwidth measured in the same run and against PyTorch's obvious streaming
search over the same page-locked rows, on the GPU machine.

    . .gpu/env && python3 scripts/bench-streaming-peers.py [--rows 16000000] [--dim 128]
        [--cap-gib 4] [--out DIR]

The device's room for rows is lowered to --cap-gib with HIVE_GPU_DEVICE_ROWS_BYTES (the same
path a collection larger than the whole GPU takes; this machine's host memory cannot hold twice
an 80 GB GPU's), so --rows x --dim f32 rows (8 GiB by default) are twice the room. The same
collection is also searched with no cap (all rows on the device) for comparison.

- Bandwidth: torch copies of a 1 GiB page-locked tensor to the device, median of 10, timed
  with CUDA events. hive-gpu's streaming rate is the collection's bytes per search call over
  the call's time (end to end from the host: queries up, rows streamed, results down).
- PyTorch peer: the rows in one page-locked host tensor; per 1 GiB chunk, a copy to one of two
  device buffers on a copy stream (overlapped with the other buffer's search), norms, torch.mm
  against the queries (TF32 off), torch.topk, merged (`bench-gpu-peers.py`'s tiled top-k).
  Timed with CUDA events around the whole search, queries already on the device.
- Recall: the CLI's f64 brute force over a sample of the queries.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("gpu_peers", os.path.join(HERE, "bench-gpu-peers.py"))
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)
DEV = peers.DEV


def h2d_bandwidth(bytes_=1 << 30, reps=10):
    """Bytes per second of a page-locked host tensor copied to the device (median)."""
    host = torch.empty(bytes_ // 4, dtype=torch.float32).pin_memory()
    dev = torch.empty(bytes_ // 4, dtype=torch.float32, device=DEV)
    ms = peers.timed(lambda: dev.copy_(host, non_blocking=True), reps)
    del host, dev
    torch.cuda.empty_cache()
    return bytes_ / (ms * 1e-3)


def torch_streamed(xb_pinned, xq, k, chunk_rows):
    """Exact L2 top-k over page-locked host rows, streamed in chunks through two device buffers:
    chunk c + 1 copies on its own stream while chunk c is searched."""
    n, d = xb_pinned.shape
    copy = torch.cuda.Stream()
    compute = torch.cuda.current_stream()
    buffers = [torch.empty(chunk_rows, d, device=DEV) for _ in range(2)]
    copied = [torch.cuda.Event() for _ in range(2)]
    searched = [torch.cuda.Event() for _ in range(2)]
    starts = list(range(0, n, chunk_rows))

    def upload(i):
        s = starts[i]
        e = min(n, s + chunk_rows)
        b = i % 2
        with torch.cuda.stream(copy):
            copy.wait_event(searched[b])
            buffers[b][: e - s].copy_(xb_pinned[s:e], non_blocking=True)
            copied[b].record(copy)

    best_d = best_i = None
    upload(0)
    for i, s in enumerate(starts):
        e = min(n, s + chunk_rows)
        b = i % 2
        if i + 1 < len(starts):
            upload(i + 1)
        compute.wait_event(copied[b])
        x = buffers[b][: e - s]
        norms = (x * x).sum(1)
        dd, ii = peers.tiled_topk(lambda a, z: norms[a:z].unsqueeze(0) - 2 * torch.mm(xq, x[a:z].T),
                                  e - s, max(k, min(e - s, (2 << 30) // (xq.shape[0] * 4))), k)
        searched[b].record(compute)
        ii += s
        if best_d is None:
            best_d, best_i = dd, ii
        else:
            cd, ci = torch.cat([best_d, dd], 1), torch.cat([best_i, ii], 1)
            best_d, pos = torch.topk(cd, k, dim=1, largest=False)
            best_i = torch.gather(ci, 1, pos)
    return best_d, best_i


def hive(base, query, batches, k, nq, cap):
    env = dict(os.environ)
    if cap:
        env["HIVE_GPU_DEVICE_ROWS_BYTES"] = str(cap)
    cmd = ["hive-gpu", "bench", "--base", base, "--query", query, "--backend", "cuda", "--batch",
           ",".join(map(str, batches)), "-k", str(k), "--nq", str(nq), "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        print("FAILED:", " ".join(cmd), run.stderr, file=sys.stderr)
        return []
    return [json.loads(line) for line in run.stdout.splitlines() if line.strip().startswith("{")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--cap-gib", type=float, default=4.0)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/hive-bench"))
    parser.add_argument("--work", default="/tmp/hive-bench-data")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    n, d, k = args.rows, args.dim, args.k
    cap = int(args.cap_gib * (1 << 30))
    collection_bytes = n * d * 4
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | {n} x {d} f32 = "
          f"{collection_bytes / 2**30:.2f} GiB | device room for rows {args.cap_gib} GiB | TF32 off", flush=True)

    gen = torch.Generator(device=DEV).manual_seed(n + d)
    base, query = (f"{args.work}/stream{n}x{d}.{e}" for e in ("base.fvecs", "query.fvecs"))
    xb = torch.empty(n, d, dtype=torch.float32).pin_memory()
    step = 1 << 20
    for s in range(0, n, step):
        chunk = torch.rand(min(step, n - s), d, device=DEV, generator=gen)
        xb[s:s + chunk.shape[0]].copy_(chunk)
    # fvecs: each row prefixed by its dimension, written in pieces from the host copy.
    with open(base, "wb") as f:
        for s in range(0, n, step):
            part = xb[s:s + step].numpy()
            rows = np.empty((part.shape[0], d + 1), dtype=np.int32)
            rows[:, 0] = d
            rows[:, 1:] = part.view(np.int32)
            rows.tofile(f)
    xq = torch.rand(args.queries, d, device=DEV, generator=gen)
    peers.write_vecs(query, xq.cpu().numpy())

    bandwidth = h2d_bandwidth()
    print(f"host-to-device (1 GiB page-locked, median of 10): {bandwidth / 1e9:.2f} GB/s", flush=True)

    chunk_rows = (1 << 30) // (d * 4)
    sizes = (1, 100, 1000, args.queries)
    torch_ms = {}
    for nq in sizes:
        reps, warmup = (5, 1) if nq <= 1000 else (3, 1)
        torch_ms[nq] = peers.timed(lambda: torch_streamed(xb, xq[:nq], k, chunk_rows), reps, warmup)
        print(f"torch streamed nq {nq}: {torch_ms[nq]:.1f} ms", flush=True)
    del xb, xq
    torch.cuda.empty_cache()

    rows = []
    for label, limit in (("streamed", cap), ("on the device", None)):
        # Each call reads every row, so a pass of many small calls is long: few queries per size.
        runs = (hive(base, query, [1], k, 5, limit) + hive(base, query, [100, 1000], k, 2000, limit)
                + hive(base, query, [args.queries], k, args.queries, limit))
        for r in runs:
            nq = r["batch"]
            call_s = nq / r["qps"]
            rate = collection_bytes / call_s
            row = {"where": label, "nq": nq, "k": k, "hive_qps": r["qps"], "hive_p50_ms": r["p50_ms"],
                   "recall": r["recall"], "hive_rate_gbs": rate / 1e9, "of_h2d": rate / bandwidth,
                   "torch_ms": torch_ms.get(nq), "speedup": (torch_ms[nq] * 1e-3) / call_s if nq in torch_ms else None}
            rows.append(row)
            print(f"hive {label} nq {nq}: {r['qps']:.1f} QPS, {call_s * 1e3:.1f} ms per call, "
                  f"{rate / 1e9:.2f} GB/s = {rate / bandwidth:.2f} of host-to-device, recall {r['recall']:.4f}", flush=True)
    with open(f"{args.out}/bench-streaming.json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": n, "dim": d, "cap_bytes": cap,
                   "h2d_bytes_per_s": bandwidth, "results": rows}, f, indent=1)
    print("\n| rows live | nq | k | hive ms per call | rows streamed GB/s | of host-to-device | recall@k | "
          "PyTorch streamed ms | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        torch_cell = f"{r['torch_ms']:.1f}" if r["torch_ms"] else "-"
        ratio = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        print(f"| {r['where']} | {r['nq']} | {r['k']} | {r['nq'] / r['hive_qps'] * 1e3:.1f} | {r['hive_rate_gbs']:.2f} | "
              f"{r['of_h2d']:.2f} | {r['recall']:.4f} | {torch_cell} | {ratio} |")


if __name__ == "__main__":
    main()
