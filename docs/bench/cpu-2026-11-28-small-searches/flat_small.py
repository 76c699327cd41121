"""Small exact flat searches, hive-gpu's CLI against faiss-cpu's IndexFlatL2 in the same run.

Usage (from the repository root): .venv-bench/bin/python docs/bench/cpu-2026-11-28-small-searches/flat_small.py BIN...
Bases: every 100th and every 10th SIFT10K base vector (100 and 1,000 rows) and all 10,000;
queries: SIFT10K's 100, in one call; 2 threads on each side. Prints QPS per tool and the ratio.
"""
import json, subprocess, sys, tempfile, time
from pathlib import Path

import faiss
import numpy as np

ROOT = Path(__file__).resolve().parents[3]


def read_fvecs(path):
    a = np.fromfile(path, dtype=np.int32)
    return a.reshape(-1, a[0] + 1)[:, 1:].view(np.float32)


def write_fvecs(path, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    np.hstack([np.full((len(x), 1), x.shape[1], np.int32).view(np.float32), x]).tofile(path)


def faiss_qps(base, query, k):
    index = faiss.IndexFlatL2(base.shape[1])
    index.add(base)
    times = []
    began = time.perf_counter()
    while time.perf_counter() - began < 1.0 or len(times) < 3:
        t = time.perf_counter()
        index.search(query, k)
        times.append(time.perf_counter() - t)
    return len(query) / float(np.median(times))


def hive_qps(binary, base_path, query_path, k):
    out = subprocess.run([binary, "bench", "--backend", "cpu", "--base", base_path, "--query", query_path,
                          "-k", str(k), "--columnar", "--json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["qps"]


def main():
    faiss.omp_set_num_threads(2)
    base = read_fvecs(ROOT / "data/siftsmall/siftsmall_base.fvecs")
    query = read_fvecs(ROOT / "data/siftsmall/siftsmall_query.fvecs")
    with tempfile.TemporaryDirectory() as tmp:
        query_path = str(Path(tmp) / "q.fvecs")
        write_fvecs(query_path, query)
        for name, rows, k in [("100 rows", base[::100][:100], 8), ("1,000 rows", base[::10][:1000], 10),
                              ("10,000 rows", base, 10)]:
            base_path = str(Path(tmp) / "b.fvecs")
            write_fvecs(base_path, rows)
            peer = faiss_qps(rows, query, k)
            for binary in sys.argv[1:]:
                ours = hive_qps(binary, base_path, query_path, k)
                print(f"{name:>11} k={k:<3} {Path(binary).name:>14}: {ours:>10.0f} QPS, faiss-cpu {peer:>10.0f}, "
                      f"ratio {ours / peer:.2f}", flush=True)


if __name__ == "__main__":
    main()
