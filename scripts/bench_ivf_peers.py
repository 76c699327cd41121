#!/usr/bin/env python3
"""IVF recall/QPS curves: hive-gpu (`bench --index ivf-flat:nlist=N --search nprobe=P ...`)
against FAISS's IndexIVFFlat (faiss-cpu, or GpuIndexIVFFlat with --faiss-gpu) on the same data,
the same nlist and nprobe settings, the same queries and threads, in one run. With --kind sq8:
hive-gpu's ivf-sq8 (at its default refine, or --refine R) against FAISS's
IndexIVFScalarQuantizer / GpuIndexIVFScalarQuantizer with QT_8bit codes of the residuals. With
--kind pq --m M --bits B: hive-gpu's ivf-pq against FAISS's IndexIVFPQ / GpuIndexIVFPQ with the
same sub-quantizers and bits (the same code size). Recall@k for both
is against the same ground truth (the .ivecs given, else an exact f64 brute force here).
hive-gpu returns each batch's results as flat arrays of ids and scores (`bench --columnar`), as
FAISS returns its arrays of labels and distances; --lists takes a list of result structures per
query instead (ids as strings: what `search_batch` builds).

Run through scripts/bench-ivf-peers (it sets up .venv-bench with faiss-cpu, numpy, matplotlib).

    scripts/bench-ivf-peers --base B --query Q [--groundtruth G] --nlist 1024
        [--nprobe 1,2,4,8,16,32,64] [--kind flat|sq8|pq] [--m M] [--bits 8|4]
        [--refine R] [--faiss-refine R]
        [--backend cpu] [--threads 2] [--lists]
        [--png out.png] [--json out]

Prints one row per nprobe and, per target recall (0.9, 0.95, 0.99), the fastest setting of each
tool that reaches it and the QPS ratio. Build = train + add for FAISS; the add plus
`build_index` for hive-gpu (both reported).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cpu_peers as peers  # noqa: E402


def faiss_curve(args, xb, xq, gt, k):
    import faiss

    d = xb.shape[1]
    began = time.perf_counter()
    if args.faiss_gpu:
        res = faiss.StandardGpuResources()
        if args.kind == "sq8":
            index = faiss.GpuIndexIVFScalarQuantizer(res, d, args.nlist, faiss.ScalarQuantizer.QT_8bit,
                                                     faiss.METRIC_L2, True)
        elif args.kind == "pq":
            index = faiss.GpuIndexIVFPQ(res, d, args.nlist, args.m, args.bits, faiss.METRIC_L2)
        else:
            index = faiss.GpuIndexIVFFlat(res, d, args.nlist, faiss.METRIC_L2)
    elif args.kind == "pq":
        index = faiss.IndexIVFPQ(faiss.IndexFlatL2(d), d, args.nlist, args.m, args.bits)
    elif args.kind == "sq8":
        quantizer = faiss.IndexFlatL2(d)
        index = faiss.IndexIVFScalarQuantizer(quantizer, d, args.nlist, faiss.ScalarQuantizer.QT_8bit,
                                              faiss.METRIC_L2, True)
    else:
        index = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, args.nlist)
    ivf = index
    if args.faiss_refine:
        # The like-for-like peer of hive-gpu's exact re-rank: FAISS's IndexRefineFlat keeps the
        # full vectors and re-ranks the best k_factor * k of the codes exactly.
        coarse = index
        index = faiss.IndexRefineFlat(coarse)
        index.k_factor = float(args.faiss_refine)
    index.train(xb)
    trained = time.perf_counter() - began
    index.add(xb)
    build = time.perf_counter() - began
    rows = []
    batch = args.batch or len(xq)
    for p in args.nprobes:
        if args.faiss_gpu:
            faiss.GpuParameterSpace().set_index_parameter(ivf, "nprobe", p)
        else:
            faiss.extract_index_ivf(ivf).nprobe = p
        _, ids = index.search(xq, k)
        times = []
        calls = []
        spent = 0.0
        while len(times) < 3 or spent < args.min_time:
            t = time.perf_counter()
            for first in range(0, len(xq), batch):
                c = time.perf_counter()
                index.search(xq[first:first + batch], k)
                calls.append(time.perf_counter() - c)
            times.append(time.perf_counter() - t)
            spent += times[-1]
        rows.append({
            "tool": ("faiss-gpu" if args.faiss_gpu else "faiss-cpu")
            + (f" refine {args.faiss_refine}" if args.faiss_refine else ""),
            "nprobe": p,
            "recall": peers.recall_at_k(ids, gt, k),
            "qps": len(xq) / float(np.median(times)),
            "p50_ms": float(np.median(calls)) * 1e3,
            "build_s": build,
            "train_s": trained,
        })
    return rows


def hive_spec(args):
    if args.kind == "pq":
        return f"ivf-pq:nlist={args.nlist},m={args.m},bits={args.bits}"
    return f"ivf-{args.kind}:nlist={args.nlist}"


def hive_curve(args, k, gt_path):
    cmd = [args.hive_bin, "bench", "--backend", args.backend, "--base", args.base, "--query", args.query,
           "--groundtruth", str(gt_path), "-k", str(k), "--index", hive_spec(args), "--json"]
    if args.nq:
        cmd += ["--nq", str(args.nq)]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    if not args.lists:
        cmd.append("--columnar")
    refine = f",refine={args.refine}" if args.refine else ""
    for p in args.nprobes:
        cmd += ["--search", f"nprobe={p}{refine}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        r = json.loads(line)
        rows.append({
            "tool": f"hive-gpu {args.backend}",
            "nprobe": int(r["search_params"].split(",")[0].split("=")[1]),
            "recall": r["recall"],
            "qps": r["qps"],
            "p50_ms": r["p50_ms"],
            "build_s": r["build_s"] + r["index_build_s"],
            "train_s": r["index_build_s"],
            "bytes_per_vector": r["bytes_per_vector"],
        })
    return rows


def fastest(rows, target):
    ok = [r for r in rows if r["recall"] >= target]
    return max(ok, key=lambda r: r["qps"]) if ok else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base")
    p.add_argument("--query")
    p.add_argument("--groundtruth")
    p.add_argument("--nlist", type=int, default=1024)
    p.add_argument("--nprobe", default="1,2,4,8,16,32,64")
    p.add_argument("--kind", choices=["flat", "sq8", "pq"], default="flat",
                   help="IVF-Flat, IVF-SQ8 or IVF-PQ on both sides")
    p.add_argument("--m", type=int, default=16, help="IVF-PQ's sub-quantizers (--kind pq)")
    p.add_argument("--bits", type=int, default=8, help="IVF-PQ's bits per code (--kind pq)")
    p.add_argument("--refine", type=int, default=None,
                   help="hive-gpu's refine factor (ivf-sq8, ivf-pq; default its own)")
    p.add_argument("--faiss-refine", type=int, default=None,
                   help="wrap FAISS's index in IndexRefineFlat with this k_factor (the like-for-like re-rank)")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--nq", type=int, default=None, help="use the first N queries")
    p.add_argument("--batch", type=int, default=None,
                   help="queries per search call on both sides (default: all at once; 1: one by one)")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--faiss-gpu", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--hive-bin", default=str(peers.ROOT / "target/release/hive-gpu"))
    p.add_argument("--lists", action="store_true",
                   help="hive-gpu returns a list of result structures per query (ids as strings) instead of flat "
                        "arrays, the default and what FAISS returns")
    p.add_argument("--png", help="write the recall/QPS plot here")
    p.add_argument("--json", help="write every row here")
    p.add_argument("--replot", help="only draw --png from the rows of an earlier --json (title: --title)")
    p.add_argument("--title", default=None)
    args = p.parse_args()
    if args.replot:
        rows = [json.loads(line) for line in Path(args.replot).read_text().splitlines() if line.strip()]
        plot([r for r in rows if r["tool"].startswith("hive")], [r for r in rows if r["tool"].startswith("faiss")],
             args.k, args.title or "IVF", args.png)
        return
    args.nprobes = [int(x) for x in args.nprobe.split(",")]
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    xb = peers.read_fvecs(args.base)
    xq = peers.read_fvecs(args.query)
    if args.nq:
        xq = xq[:args.nq]
    k = args.k
    if args.groundtruth:
        gt = peers.read_ivecs(args.groundtruth)[:len(xq), :k]
        gt_path = Path(args.groundtruth)
    else:
        gt = peers.exact_knn(xb, xq, k)
        gt_path = Path(f"/tmp/bench-ivf-gt-{os.getpid()}.ivecs")
        peers.write_vecs(gt_path, gt.astype(np.int32))
    hive = hive_curve(args, k, gt_path)
    faiss_rows = faiss_curve(args, xb, xq, gt, k)
    print(f"{hive_spec(args)}: {len(xb)} x {xb.shape[1]} base, {len(xq)} queries, k={k}, nlist={args.nlist}, "
          f"{args.threads} threads, hive-gpu --backend {args.backend}")
    print(f"queries per call: {args.batch or len(xq)}; hive-gpu results as "
          f"{'lists of structures' if args.lists else 'flat arrays (--columnar)'}")
    print(f"{'nprobe':>6} {'hive recall':>11} {'hive QPS':>10} {'hive p50 ms':>11} {'faiss recall':>12} "
          f"{'faiss QPS':>10} {'faiss p50 ms':>12} {'ratio':>6}")
    for h, f in zip(hive, faiss_rows):
        print(f"{h['nprobe']:>6} {h['recall']:>11.4f} {h['qps']:>10.0f} {h['p50_ms']:>11.3f} {f['recall']:>12.4f} "
              f"{f['qps']:>10.0f} {f['p50_ms']:>12.3f} {h['qps'] / f['qps']:>6.2f}")
    print(f"build (train + add): hive-gpu {hive[0]['build_s']:.2f} s, {faiss_rows[0]['tool']} "
          f"{faiss_rows[0]['build_s']:.2f} s")
    for target in (0.9, 0.95, 0.99):
        h, f = fastest(hive, target), fastest(faiss_rows, target)
        if h and f:
            print(f"recall >= {target}: hive-gpu nprobe={h['nprobe']} {h['qps']:.0f} QPS (recall {h['recall']:.4f}), "
                  f"{f['tool']} nprobe={f['nprobe']} {f['qps']:.0f} QPS (recall {f['recall']:.4f}): "
                  f"{h['qps'] / f['qps']:.2f}x")
        else:
            missing = [name for name, best in (("hive-gpu", h), ("faiss", f)) if not best]
            print(f"recall >= {target}: not reached by {' and '.join(missing)}")
    if args.json:
        Path(args.json).write_text("\n".join(json.dumps(r) for r in hive + faiss_rows) + "\n")
    if args.png:
        title = (f"{hive_spec(args)}: {Path(args.base).name}, {len(xq)} queries, "
                 f"{args.threads} threads")
        plot(hive, faiss_rows, k, title, args.png)


def plot(hive, faiss_rows, k, title, png):
    """The recall/QPS curves of both tools on one set of axes, as a PNG (skipped, saying so,
    where matplotlib is missing: `--replot JSONL --png OUT` draws it later from the rows)."""
    try:
        import matplotlib
    except ImportError:
        print(f"no matplotlib here: {png} not drawn (draw it with --replot from the --json rows)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for rows, style in ((hive, "o-"), (faiss_rows, "s--")):
        ax.plot([r["recall"] for r in rows], [r["qps"] for r in rows], style, label=rows[0]["tool"])
        for r in rows:
            ax.annotate(str(r["nprobe"]), (r["recall"], r["qps"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel(f"recall@{k}")
    ax.set_ylabel("queries per second")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main()
