#!/usr/bin/env python3
"""The duplicates benchmark against a peer in the same run: hive-gpu's `ties` example (one query
and batches of 16 over 100k, 200k and 400k rows that all tie, and the same over distinct random
rows, k in {1, 10, 100}) beside faiss-cpu's IndexFlatL2 (`--peer faiss`, CPU) or PyTorch's
cdist + topk on the GPU (`--peer torch`), on data of the same shapes and kinds.

    python3 scripts/bench_ties_peers.py --ours target/release/examples/ties --backend cpu --peer faiss
    python3 scripts/bench_ties_peers.py --ours .gpu/bin/ties --backend cuda --peer torch   (GPU machine)

Each cell is a median of 5 calls after a warm-up, in milliseconds per call; `peer/ours` above 1
means hive-gpu is faster. The point of the benchmark is the 400k/100k column: linear work gives
about 4 on duplicates as on random rows (a quadratic collector gave 16, and 300x random data).
"""
import argparse
import statistics
import subprocess
import time

import numpy as np

SIZES = [100_000, 200_000, 400_000]


def data(n, dim, duplicates, rng):
    if duplicates:
        return np.repeat(rng.uniform(-1, 1, (1, dim)).astype(np.float32), n, axis=0)
    return rng.uniform(-1, 1, (n, dim)).astype(np.float32)


def queries(nq, dim):
    i = np.arange(nq * dim)
    return (((i * 7919) % 101) / 50.0 - 1.0).astype(np.float32).reshape(nq, dim)


def median_ms(fn):
    fn()
    times = []
    for _ in range(5):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def peer_faiss(dim, threads):
    import faiss

    faiss.omp_set_num_threads(threads)
    rng = np.random.default_rng(7)
    out = {}
    for dup in (True, False):
        indexes = []
        for n in SIZES:
            index = faiss.IndexFlatL2(dim)
            index.add(data(n, dim, dup, rng))
            indexes.append(index)
        for k in (1, 10, 100):
            for nq in (1, 16):
                q = queries(nq, dim)
                out[(dup, k, nq)] = [median_ms(lambda ix=ix: ix.search(q, k)) for ix in indexes]
    return out


def peer_torch(dim):
    import torch

    dev = torch.device("cuda")
    rng = np.random.default_rng(7)
    out = {}
    for dup in (True, False):
        bases = [torch.from_numpy(data(n, dim, dup, rng)).to(dev) for n in SIZES]
        for k in (1, 10, 100):
            for nq in (1, 16):
                q = torch.from_numpy(queries(nq, dim)).to(dev)

                def run(base):
                    d = torch.cdist(q, base)
                    torch.topk(d, k, largest=False).indices.cpu()

                out[(dup, k, nq)] = [median_ms(lambda b=b: run(b)) for b in bases]
    return out


def ours(path, backend, dim):
    text = subprocess.run([path, backend, str(dim)], check=True, capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 7 and fields[0] in ("duplicates", "random"):
            out[(fields[0] == "duplicates", int(fields[1]), int(fields[2]))] = [float(x) for x in fields[3:6]]
    return text.splitlines()[0], out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True, help="the built ties example")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--peer", choices=["faiss", "torch"], default="faiss")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="faiss threads (match RAYON_NUM_THREADS)")
    args = ap.parse_args()
    header, mine = ours(args.ours, args.backend, args.dim)
    peer = peer_faiss(args.dim, args.threads) if args.peer == "faiss" else peer_torch(args.dim)
    print(header)
    print(f"# peer: {args.peer}; ms per call (median of 5); ratio = peer / ours at 400k")
    print("| data | k | queries | ours 100k | ours 400k | ours 400/100 | peer 100k | peer 400k | peer 400/100 | peer/ours at 400k |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(mine, key=lambda t: (not t[0], t[1], t[2])):
        m, p = mine[key], peer[key]
        print(
            f"| {'duplicates' if key[0] else 'random'} | {key[1]} | {key[2]} | {m[0]:.3f} | {m[2]:.3f} | {m[2] / m[0]:.2f} "
            f"| {p[0]:.3f} | {p[2]:.3f} | {p[2] / p[0]:.2f} | {p[2] / m[2]:.2f} |"
        )


if __name__ == "__main__":
    main()
