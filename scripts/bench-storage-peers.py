#!/usr/bin/env python3
"""hive-gpu's exact L2 search over bf16, i8 and u8 storage (CUDA backend, through the
`hive-gpu bench` CLI) against PyTorch's obvious implementations on the same data, on the GPU
machine.

    . .gpu/env && python3 scripts/bench-storage-peers.py [--rows 1000000] [--dim 128] [--out DIR]

PyTorch keeps the rows in the stored type on the device (the memory the type saves) and, per
column tile, either widens them to f32 and multiplies in f32 (exact in f32, as hive-gpu's
candidate pass is) or, for bf16, multiplies bf16 by bf16 on the tensor cores (faster and not
exact: the queries are rounded to bf16 too). Both are timed; the faster one is the peer. Then
torch.topk per tile, merged. PyTorch is timed with CUDA events around the search (data and
queries already on the device: its best case); hive-gpu end to end from the host (queries
up, results down). Each number is a median; hive-gpu's recall is its CLI's, against an f64
brute force over the stored values on a sample of the queries. The helpers are
`bench-gpu-peers.py`'s.

Data: u8 rows are uniform integers in 0..=255 (SIFT-like), i8 rows in -128..=127, bf16 rows
uniform in [0, 1) rounded to bf16; queries are drawn the same way (as f32).
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
TYPES = {"bf16": torch.bfloat16, "i8": torch.int8, "u8": torch.uint8}


def draw(precision, count, d, gen):
    """`count` rows of `precision`'s data (f32 values every type stores exactly)."""
    if precision == "bf16":
        return torch.rand(count, d, device=DEV, generator=gen).bfloat16().float()
    low, high = (-128, 128) if precision == "i8" else (0, 256)
    return torch.randint(low, high, (count, d), device=DEV, generator=gen).float()


def torch_widened(xb, norms, xq, k, tile_bytes=2 << 30):
    """Stored rows widened to f32 per tile, f32 products: exact in f32."""
    nq, n = xq.shape[0], xb.shape[0]
    tile = max(k, min(n, tile_bytes // (nq * 4)))
    return peers.tiled_topk(lambda s, e: norms[s:e].unsqueeze(0) - 2 * torch.mm(xq, xb[s:e].float().T), n, tile, k)


def torch_bf16(xb, norms, xq, k, tile_bytes=2 << 30):
    """bf16 rows times bf16 queries on the tensor cores (f32 accumulation): not exact."""
    nq, n = xq.shape[0], xb.shape[0]
    tile = max(k, min(n, tile_bytes // (nq * 4)))
    q = xq.bfloat16()
    return peers.tiled_topk(lambda s, e: norms[s:e].unsqueeze(0) - 2 * torch.mm(q, xb[s:e].T).float(), n, tile, k)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--types", default="bf16,i8,u8")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/hive-bench"))
    parser.add_argument("--work", default="/tmp/hive-bench-data")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    n, d = args.rows, args.dim
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | {n} x {d} | TF32 off", flush=True)
    sizes, ks = (1, 100, args.queries), (10, 100)
    rows = []
    for precision in args.types.split(","):
        gen = torch.Generator(device=DEV).manual_seed(n + d + len(precision))
        xb_f = draw(precision, n, d, gen)
        xq = draw(precision, args.queries, d, gen)
        base, query = (f"{args.work}/s{precision}{n}x{d}.{e}" for e in ("base.fvecs", "query.fvecs"))
        peers.write_vecs(base, xb_f.cpu().numpy())
        peers.write_vecs(query, xq.cpu().numpy())
        xb = xb_f.to(TYPES[precision])
        norms = (xb_f.double() ** 2).sum(1).float()
        del xb_f
        torch.cuda.empty_cache()
        peers_of = {"widened f32": torch_widened}
        if precision == "bf16":
            peers_of["bf16 tensor cores"] = torch_bf16
        times = {}
        for nq in sizes:
            q = xq[:nq]
            for k in ks:
                reps, warmup = {1: (30, 3), 100: (5, 1)}.get(nq, (3, 1))
                for name, fn in peers_of.items():
                    t = peers.timed(lambda: fn(xb, norms, q, k), reps, warmup)
                    times[(name, nq, k)] = t
                    print(f"torch {precision} {name} nq {nq} k {k}: {t:.3f} ms", flush=True)
        del xb, xq, norms
        torch.cuda.empty_cache()
        for batches, limit in (([1], 300), ([100, args.queries], None)):
            for r in peers.hive(base, query, None, precision, batches, ks, nq=limit, metric="l2"):
                k, nq = r["k"], r["batch"]
                best = min(peers_of, key=lambda name: times[(name, nq, k)])
                torch_qps = nq / (times[(best, nq, k)] * 1e-3)
                row = {"type": precision, "nq": nq, "k": k, "hive_qps": r["qps"], "hive_p50_ms": r["p50_ms"],
                       "recall": r["recall"], "torch_peer": best, "torch_ms": times[(best, nq, k)],
                       "torch_qps": torch_qps, "speedup": r["qps"] / torch_qps,
                       "torch_all_ms": {name: times[(name, nq, k)] for name in peers_of}}
                rows.append(row)
                print(f"hive {precision} nq {nq} k {k}: {r['qps']:.0f} QPS, p50 {r['p50_ms']:.3f} ms, recall "
                      f"{r['recall']:.4f} | torch ({best}) {torch_qps:.0f} QPS | {row['speedup']:.2f}x", flush=True)
    with open(f"{args.out}/bench-storage.json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": n, "dim": d, "results": rows}, f, indent=1)
    print("\n| type | nq | k | hive QPS | hive p50 ms | recall@k | PyTorch (peer) QPS | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['type']} | {r['nq']} | {r['k']} | {r['hive_qps']:,.0f} | {r['hive_p50_ms']:.3f} | "
              f"{r['recall']:.4f} | {r['torch_qps']:,.0f} ({r['torch_peer']}) | {r['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
