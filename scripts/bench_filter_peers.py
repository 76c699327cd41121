#!/usr/bin/env python3
"""Filtered exact search on the CPU: hive-gpu (--backend cpu --filter-selectivity S) against
faiss-cpu's IndexFlatL2 searched with an IDSelectorBatch of the same ids, same data, same
queries, same thread count, in one run.

Run through scripts/bench-filter-peers (it sets up .venv-bench with faiss-cpu and numpy).

The allow-list of selectivity S is the rows i with splitmix64(i + 0x5eed) / 2^64 < S, the rule
`hive-gpu bench --filter-selectivity` uses (crates/hive-gpu-cli/src/bench.rs), so both tools
search exactly the same rows. Recall is against an f64 brute force over the passing rows.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cpu_peers as peers  # noqa: E402

SEED = 0x5EED


def splitmix64(x):
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def passing_rows(n, s):
    """The rows of selectivity s: splitmix64(i + SEED) >> 11 < s * 2^53."""
    i = np.arange(n, dtype=np.uint64) + np.uint64(SEED)
    h = splitmix64(i) >> np.uint64(11)
    return np.nonzero(h < np.uint64(int(s * (1 << 53))))[0].astype(np.int64)


def exact_filtered(xb, xq, rows, k):
    ids = peers.exact_knn(xb[rows], xq, k)
    return rows[ids]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="100k base instead of 1M")
    p.add_argument("--selectivity", default="0.001,0.01,0.1,0.5,0.9")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--nq", type=int, default=1000, help="queries of the batch mode")
    p.add_argument("--one-by-one", type=int, default=200, help="queries of the one-by-one mode")
    p.add_argument("--hive-bin", default=str(peers.ROOT / "target/release/hive-gpu"))
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--out", default=None, help="write the JSON rows here")
    args = p.parse_args()

    import faiss
    faiss.omp_set_num_threads(args.threads)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    peers.BENCH_DATA.mkdir(exist_ok=True)
    ds = peers.load_synth(args.quick, nq=args.nq)
    xb, xq = ds["xb"], ds["xq"]
    n, dim, k = len(xb), xb.shape[1], args.k
    index = faiss.IndexFlatL2(dim)
    index.add(xb)
    one_query = peers.subset_file(ds["name"], xq[: args.one_by_one], args.one_by_one)
    rows = []
    for s in [None] + [float(x) for x in args.selectivity.split(",")]:
        allowed = np.arange(n, dtype=np.int64) if s is None else passing_rows(n, s)
        params = None if s is None else faiss.SearchParameters(sel=faiss.IDSelectorBatch(allowed))
        truth = exact_filtered(xb, xq, allowed, k)
        for mode, queries, query_file in [("batch", xq, ds["query"]), ("one-by-one", xq[: args.one_by_one], one_query)]:
            if mode == "batch":
                def once():
                    return index.search(queries, k, params=params)[1]
            else:
                def once():
                    return np.vstack([index.search(queries[i:i + 1], k, params=params)[1] for i in range(len(queries))])
            times, results = peers.run_rounds(once, args.min_time, 3 if mode == "batch" else 1)
            faiss_qps = float(np.median([len(queries) / t for t in times]))
            faiss_recall = peers.recall_at_k(results[0], truth[: len(queries)], k)
            cmd = [args.hive_bin, "bench", "--base", str(ds["base"]), "--query", str(query_file),
                   "--backend", "cpu", "-k", str(k), "--json"]
            if s is not None:
                cmd += ["--filter-selectivity", str(s)]
            if mode == "one-by-one":
                cmd += ["--batch", "1"]
            import subprocess
            res = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
            hive = json.loads(lines[-1]) if res.returncode == 0 and lines else None
            row = dict(selectivity=s, passing=int(len(allowed)), mode=mode, nq=len(queries),
                       faiss_qps=faiss_qps, faiss_recall=faiss_recall,
                       hive_qps=hive and hive["qps"], hive_recall=hive and hive["recall"],
                       hive_cmd=" ".join(cmd), error=None if hive else res.stderr[-2000:])
            row["ratio"] = row["hive_qps"] / faiss_qps if hive else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(f"| S | passing | mode | hive-gpu QPS | recall | faiss-cpu QPS (IDSelectorBatch) | recall | hive / faiss |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        hq = f"{r['hive_qps']:.0f}" if r["hive_qps"] else "FAILED"
        hr = f"{r['hive_recall']:.4f}" if r["hive_recall"] is not None else "-"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        s = "none" if r["selectivity"] is None else r["selectivity"]
        print(f"| {s} | {r['passing']} | {r['mode']} | {hq} | {hr} | {r['faiss_qps']:.0f} | {r['faiss_recall']:.4f} | {ratio} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["hive_qps"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
