#!/usr/bin/env python3
"""CPU peer benchmark: hive-gpu `bench --backend cpu` vs faiss-cpu IndexFlatL2.

Run through scripts/bench-cpu-peers, which prepares the venv and data sets.
Both tools search the same files with the same queries, k and thread count, in
two modes: `batch` (all queries in one call) and `one-by-one` (one query per
call, on a query subset written as its own .fvecs file). faiss is timed here
with time.perf_counter; hive-gpu reports its own numbers with --json.

Outputs a markdown table on stdout and in bench-data/cpu-peers-<date>.md, plus
every raw measurement in bench-data/cpu-peers-<date>.json.
"""

import argparse
import datetime
import gzip
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BENCH_DATA = ROOT / "bench-data"
FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
SIFT_DIR = ROOT / "data" / "siftsmall"

EXACT_SAMPLE = 100        # queries used for exact recall when there is no ground truth
CLI_TIMEOUT_S = 3600


# ---------------------------------------------------------------- file formats

def read_fvecs(path):
    raw = np.fromfile(path, dtype=np.int32)
    dim = int(raw[0])
    return raw.reshape(-1, dim + 1)[:, 1:].view(np.float32).copy()


def read_ivecs(path):
    raw = np.fromfile(path, dtype=np.int32)
    dim = int(raw[0])
    return raw.reshape(-1, dim + 1)[:, 1:].copy()


def write_vecs(path, x, chunk=100_000):
    """Write float32 rows as .fvecs or int32 rows as .ivecs (TEXMEX layout)."""
    dtype = np.int32 if x.dtype.kind in "iu" else np.float32
    n, dim = x.shape
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        for s in range(0, n, chunk):
            block = np.ascontiguousarray(x[s:s + chunk], dtype=dtype)
            rec = np.empty((block.shape[0], dim + 1), dtype=np.int32)
            rec[:, 0] = dim
            rec[:, 1:] = block.view(np.int32)
            rec.tofile(f)
    tmp.replace(path)


def fvecs_ok(path, n, dim):
    return path.is_file() and path.stat().st_size == n * (dim + 1) * 4


def read_idx_images(path):
    """IDX3 (gzip): 16-byte big-endian header (magic, count, rows, cols), then u8 pixels."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, count, rows, cols = np.frombuffer(data[:16], dtype=">i4")
    if magic != 0x803:
        raise ValueError(f"{path}: not an IDX3 u8 file (magic {magic:#x})")
    pixels = np.frombuffer(data[16:], dtype=np.uint8, count=count * rows * cols)
    return pixels.reshape(count, rows * cols).astype(np.float32)


# ---------------------------------------------------------------- data sets

def subset_file(name, xq, m):
    """First m queries of a data set, as their own .fvecs (shared by both tools)."""
    path = BENCH_DATA / f"{name}_query_first{m}.fvecs"
    if not fvecs_ok(path, m, xq.shape[1]):
        write_vecs(path, xq[:m])
    return path


def load_sift():
    gt_path = SIFT_DIR / "siftsmall_groundtruth.ivecs"
    return dict(name="sift", base=SIFT_DIR / "siftsmall_base.fvecs",
                query=SIFT_DIR / "siftsmall_query.fvecs", gt=gt_path,
                xb=read_fvecs(SIFT_DIR / "siftsmall_base.fvecs"),
                xq=read_fvecs(SIFT_DIR / "siftsmall_query.fvecs"),
                gt_ids=read_ivecs(gt_path), one_by_one=100)


def load_fmnist(quick):
    base = FMNIST_DIR / "train-images-idx3-ubyte.gz"
    query = FMNIST_DIR / "t10k-images-idx3-ubyte.gz"
    if not base.is_file() or not query.is_file():
        raise FileNotFoundError(f"{FMNIST_DIR} missing (apt-get install dataset-fashion-mnist)")
    xb, xq = read_idx_images(base), read_idx_images(query)
    name = "fmnist"
    if quick:
        xq = xq[:1000]
        name = "fmnist_q1000"
        query = subset_file("fmnist", xq, 1000)
    return dict(name=name, base=base, query=query, gt=None, xb=xb, xq=xq,
                gt_ids=None, one_by_one=500)


def load_synth(quick, dim=128, nq=1000):
    n = 100_000 if quick else 1_000_000
    name = f"synth{n // 1000}k"
    base = BENCH_DATA / f"{name}_base.fvecs"
    query = BENCH_DATA / f"{name}_query.fvecs"
    if fvecs_ok(base, n, dim) and fvecs_ok(query, nq, dim):
        xb, xq = read_fvecs(base), read_fvecs(query)
    else:
        print(f"== generating {name}: {n} x {dim} + {nq} queries (seed 42)", file=sys.stderr)
        rng = np.random.default_rng(42)
        xb = rng.standard_normal((n, dim), dtype=np.float32)
        xq = rng.standard_normal((nq, dim), dtype=np.float32)
        write_vecs(base, xb)
        write_vecs(query, xq)
    return dict(name=name, base=base, query=query, gt=None, xb=xb, xq=xq,
                gt_ids=None, one_by_one=200)


def exact_knn(xb, xq, k, chunk=100_000):
    """Exact float64 brute-force L2 k-NN ids, base processed in chunks."""
    q = xq.astype(np.float64)
    qn = (q * q).sum(1)[:, None]
    best_d = np.full((len(q), 0), np.inf)
    best_i = np.zeros((len(q), 0), dtype=np.int64)
    for s in range(0, len(xb), chunk):
        b = xb[s:s + chunk].astype(np.float64)
        d = qn - 2.0 * (q @ b.T) + (b * b).sum(1)[None, :]
        kk = min(k, d.shape[1])
        part = np.argpartition(d, kk - 1, axis=1)[:, :kk]
        best_d = np.hstack([best_d, np.take_along_axis(d, part, 1)])
        best_i = np.hstack([best_i, part + s])
        keep = np.argsort(best_d, axis=1, kind="stable")[:, :k]
        best_d = np.take_along_axis(best_d, keep, 1)
        best_i = np.take_along_axis(best_i, keep, 1)
    return best_i


def recall_at_k(ids, truth, k):
    hits = sum(len(set(a[:k].tolist()) & set(b[:k].tolist())) for a, b in zip(ids, truth))
    return hits / (len(truth) * k)


# ---------------------------------------------------------------- faiss side

def run_rounds(fn, min_time, min_rounds):
    """Warm up once, then repeat until >= min_time s have passed and either
    min_rounds rounds ran or a single round already took >= min_time."""
    fn()
    times, results = [], []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        results.append(fn())
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start >= min_time and (
                len(times) >= min_rounds or times[-1] >= min_time):
            return times, results


def faiss_batch(index, xq, k, min_time):
    ids = {}

    def once():
        _, ids["I"] = index.search(xq, k)

    times, _ = run_rounds(once, min_time, min_rounds=3)
    return dict(qps=float(np.median([len(xq) / t for t in times])), rounds=len(times),
                round_s=times), ids["I"]


def faiss_one_by_one(index, xq, k, min_time):
    ids = np.zeros((len(xq), k), dtype=np.int64)

    def once():
        lat = []
        for i in range(len(xq)):
            t0 = time.perf_counter()
            _, I = index.search(xq[i:i + 1], k)
            lat.append(time.perf_counter() - t0)
            ids[i] = I[0]
        return lat

    times, lats = run_rounds(once, min_time, min_rounds=1)
    lat_ms = np.concatenate(lats) * 1e3
    return dict(qps=float(np.median([len(xq) / t for t in times])), rounds=len(times),
                round_s=times, p50_ms=float(np.percentile(lat_ms, 50)),
                p99_ms=float(np.percentile(lat_ms, 99))), ids


# ---------------------------------------------------------------- hive side

def cargo_build(args, cargo_jobs):
    cmd = ["cargo", "build", "--release"] + (["-j", str(cargo_jobs)] if cargo_jobs else []) + args
    print("== " + shlex.join(cmd), file=sys.stderr)
    res = subprocess.run(cmd, cwd=ROOT)
    return res.returncode == 0


def run_hive(hive_bin, ds, query, mode, k, env, groundtruth=None, metric="l2", precision=None):
    cmd = [str(hive_bin), "bench", "--base", str(ds["base"]), "--query", str(query),
           "--metric", metric, "-k", str(k), "--backend", "cpu", "--json"]
    if precision:
        cmd += ["--precision", precision]
    if mode == "one-by-one":
        cmd += ["--batch", "1"]
    if groundtruth:
        cmd += ["--groundtruth", str(groundtruth)]
    out = dict(cmd=shlex.join(cmd), result=None, error=None)
    if not Path(hive_bin).is_file():
        out["error"] = f"no hive-gpu binary at {hive_bin}"
        print(f"== hive {mode}: FAILED: {out['error']}", file=sys.stderr)
        return out
    print("== " + out["cmd"], file=sys.stderr)
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        out["error"] = f"timed out after {CLI_TIMEOUT_S} s"
        print("   FAILED: " + out["error"], file=sys.stderr)
        return out
    lines = [l for l in res.stdout.splitlines() if l.strip().startswith("{")]
    if res.returncode == 0 and lines:
        try:
            out["result"] = json.loads(lines[-1])
            return out
        except json.JSONDecodeError as e:
            out["error"] = f"bad JSON on stdout: {e}"
    else:
        out["error"] = f"exit status {res.returncode}"
    out["stderr"] = res.stderr
    out["stdout"] = res.stdout
    print(f"   FAILED ({out['error']}); stderr:\n{res.stderr}", file=sys.stderr)
    return out


PAIRS = 3
PAIR_QUERIES = 50


def paired_bandwidth(hive_bin, membw_bin, ds, xq, n, dim, k, env):
    """The machine's bandwidth drifts by tens of percent within minutes, so compare like with
    like: alternate a membw reading and a short one-by-one scan PAIRS times and return the
    medians of both (GB/s)."""
    query = subset_file(ds["name"], xq, PAIR_QUERIES)
    mem, scan = [], []
    for _ in range(PAIRS):
        m, _ = run_membw(membw_bin, env)
        h = run_hive(hive_bin, ds, query, "one-by-one", k, env, None)["result"]
        if not m or not h:
            return None
        mem.append(m["read_gbps"])
        scan.append(h["qps"] * n * dim * 4 / 1e9)
    return dict(membw_gbps=float(np.median(mem)), scan_gbps=float(np.median(scan)),
                membw_all=mem, scan_all=scan)


def run_membw(membw_bin, env):
    if not Path(membw_bin).is_file():
        return None, f"no membw binary at {membw_bin}"
    res = subprocess.run([str(membw_bin)], env=env, capture_output=True, text=True)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1]), None
    except (IndexError, json.JSONDecodeError):
        return None, f"membw failed (exit {res.returncode}): {res.stderr}"


# ---------------------------------------------------------------- report

def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def table(rows, k):
    head = ["dataset", "n x dim", "nq", "mode", "faiss QPS", "hive QPS", "ratio (hive/faiss)",
            "faiss recall", "hive recall", "hive p50 ms", "hive p99 ms", "bandwidth %",
            f"agreement with faiss@{k}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        f, h = r.get("faiss") or {}, (r.get("hive") or {}).get("result") or {}
        hq = "FAILED" if r.get("failed") else fmt(h.get("qps"), ",.1f")
        ratio = h["qps"] / f["qps"] if h.get("qps") and f.get("qps") else None
        bw = ""
        if r.get("bandwidth_gbps") is not None:
            p = r.get("paired") or {}
            bw = (f"row {r['bandwidth_gbps']:.1f} GB/s; paired {fmt(p.get('scan_gbps'), '.1f')} of "
                  f"{fmt(p.get('membw_gbps'), '.1f')} GB/s ({fmt(r.get('bandwidth_pct'), '.0f')}%)")
        agree = (r.get("agreement") or {}).get("result") or {}
        cells = [r["dataset"], f"{r['n']} x {r['dim']}", str(r["nq"]), r["mode"],
                 fmt(f.get("qps"), ",.1f"), hq, fmt(ratio, ".2f"),
                 fmt(f.get("recall"), ".4f"), fmt(h.get("recall"), ".4f"),
                 fmt(h.get("p50_ms"), ".3f"), fmt(h.get("p99_ms"), ".3f"), bw,
                 fmt(agree.get("recall"), ".4f") if r.get("agreement") else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="threads for both tools (default 2)")
    p.add_argument("--datasets", default="sift,fmnist,synth", help="comma list of sift,fmnist,synth")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: synth 100k base, fmnist 1000 queries")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--modes", default="batch,one-by-one", help="comma list of batch,one-by-one")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of timed faiss rounds")
    p.add_argument("--no-build", action="store_true", help="skip cargo build")
    p.add_argument("--cargo-jobs", type=int, default=0, help="cargo build -j (default: cargo's)")
    p.add_argument("--hive-bin", help="hive-gpu binary (default target/release/hive-gpu)")
    p.add_argument("--membw-bin", help="membw binary (default target/release/examples/membw)")
    args = p.parse_args()
    load_start = os.getloadavg()[0]

    # Thread count: must be in the environment before faiss (OpenMP) is loaded.
    n_threads = str(args.threads)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[var] = n_threads
    import faiss
    faiss.omp_set_num_threads(args.threads)
    env = dict(os.environ)

    BENCH_DATA.mkdir(exist_ok=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    hive_bin = Path(args.hive_bin) if args.hive_bin else target / "release" / "hive-gpu"
    membw_bin = Path(args.membw_bin) if args.membw_bin else target / "release" / "examples" / "membw"
    failures = []
    if not args.no_build:
        if not args.hive_bin and not cargo_build(["-p", "hive-gpu-cli"], args.cargo_jobs):
            failures.append("cargo build -p hive-gpu-cli failed")
            hive_bin = Path("/nonexistent/hive-gpu (cargo build failed)")
        if not args.membw_bin and not cargo_build(["-p", "hive-gpu", "--example", "membw"],
                                                  args.cargo_jobs):
            failures.append("cargo build --example membw failed")
            membw_bin = Path("/nonexistent/membw (cargo build failed)")

    print(f"== membw ({args.threads} threads)", file=sys.stderr)
    membw, err = run_membw(membw_bin, env)
    if err:
        failures.append(err)
        print("   FAILED: " + err, file=sys.stderr)
    else:
        print(f"   {membw}", file=sys.stderr)

    k = args.k
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    rows = []
    for which in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        try:
            if which == "sift":
                ds = load_sift()
            elif which == "fmnist":
                ds = load_fmnist(args.quick)
            elif which == "synth":
                ds = load_synth(args.quick)
            else:
                raise ValueError(f"unknown dataset {which!r} (sift, fmnist, synth)")
        except Exception as e:  # keep going with the other data sets
            failures.append(f"{which}: {e}")
            print(f"== {which}: FAILED to load: {e}", file=sys.stderr)
            continue
        xb, xq = ds["xb"], ds["xq"]
        n, dim = xb.shape
        print(f"== {ds['name']}: base {n} x {dim}, {len(xq)} queries", file=sys.stderr)

        index = faiss.IndexFlatL2(dim)
        index.add(xb)

        # Reference ids for faiss recall: official ground truth, else exact f64 on a sample.
        if ds["gt_ids"] is not None:
            truth, sample = ds["gt_ids"], len(ds["gt_ids"])
        else:
            sample = min(EXACT_SAMPLE, len(xq))
            truth = exact_knn(xb, xq[:sample], k)

        for mode in modes:
            if mode == "batch":
                q_path, xq_m = ds["query"], xq
                faiss_res, ids = faiss_batch(index, xq_m, k, args.min_time)
                # faiss's own results, as ground truth for agreement reporting.
                faiss_gt = BENCH_DATA / f"{ds['name']}_faiss_gt.ivecs"
                write_vecs(faiss_gt, ids.astype(np.int32))
            elif mode == "one-by-one":
                m = min(ds["one_by_one"], len(xq))
                xq_m = xq[:m]
                q_path = ds["query"] if m == len(xq) else subset_file(ds["name"], xq, m)
                faiss_res, ids = faiss_one_by_one(index, xq_m, k, args.min_time)
            else:
                raise SystemExit(f"unknown mode {mode!r} (batch, one-by-one)")
            s = min(sample, len(xq_m))
            faiss_res["recall"] = recall_at_k(ids[:s], truth[:s], k)
            faiss_res["recall_queries"] = s
            print(f"   faiss {mode}: {faiss_res['qps']:,.1f} QPS, recall {faiss_res['recall']:.4f}",
                  file=sys.stderr)

            gt_for_hive = ds["gt"] if ds["gt"] is not None and len(xq_m) == len(xq) else None
            scan_row = mode == "one-by-one" and which == "synth"
            row = dict(dataset=ds["name"], n=n, dim=dim, nq=len(xq_m), mode=mode,
                       base=str(ds["base"]), query=str(q_path), faiss=faiss_res,
                       hive=run_hive(hive_bin, ds, q_path, mode, k, env, gt_for_hive))
            hive = row["hive"]["result"]
            if hive is None:
                row["failed"] = True
                failures.append(f"{ds['name']} {mode}: {row['hive']['error']}")
            else:
                print(f"   hive  {mode}: {hive.get('qps', 0):,.1f} QPS, recall {hive.get('recall')}",
                      file=sys.stderr)
            if hive and scan_row and hive.get("qps"):
                row["bandwidth_gbps"] = hive["qps"] * n * dim * 4 / 1e9
                row["paired"] = paired_bandwidth(hive_bin, membw_bin, ds, xq, n, dim, k, env)
                p = row["paired"]
                if p:
                    row["bandwidth_pct"] = 100 * p["scan_gbps"] / p["membw_gbps"]
            if mode == "batch" and ds["gt"] is None and hive is not None:
                # Separate invocation, so the timing run above stays without --groundtruth.
                row["agreement"] = run_hive(hive_bin, ds, q_path, mode, k, env, faiss_gt)
                if row["agreement"]["result"] is None:
                    failures.append(f"{ds['name']} agreement run: {row['agreement']['error']}")
            rows.append(row)
        del index

    now = datetime.datetime.now()
    cmdline = shlex.join([os.environ.get("BENCH_CPU_PEERS_ENTRY", sys.argv[0])] + sys.argv[1:])
    header = "\n".join([
        f"# hive-gpu vs faiss-cpu (IndexFlatL2, exact, metric l2, k={k})",
        "",
        f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs)",
        f"- threads: {args.threads} (OMP_NUM_THREADS / faiss.omp_set_num_threads, RAYON_NUM_THREADS)",
        f"- faiss-cpu {faiss.__version__}, numpy {np.__version__}, Python {platform.python_version()}",
        f"- memory read bandwidth (membw example): "
        + (f"{membw['read_gbps']:.1f} GB/s" if membw else "n/a"),
        f"- load average at start / end: {load_start:.2f} / {os.getloadavg()[0]:.2f}"
        + (" (other work was running: numbers may be noisy)" if load_start > 0.5 else ""),
        f"- date: {now.isoformat(timespec='seconds')}",
        f"- command: `{cmdline}`",
        "",
        "QPS = median over timed rounds (faiss: time.perf_counter here; hive: its --json). "
        "Recall@k vs official ground truth (sift), else vs exact float64 brute force on the "
        f"first {EXACT_SAMPLE} queries (faiss) / hive's own exact reference. "
        "Bandwidth (synth one-by-one only) = hive QPS x n x dim x 4 B: for the row itself, and "
        f"paired: median of {PAIRS} alternating (membw, {PAIR_QUERIES}-query scan) runs, the % is "
        "paired scan / paired membw. "
        "Agreement = hive recall vs faiss's batch results (data sets without official ground truth).",
    ])
    report = header + "\n\n" + table(rows, k) + "\n"
    if failures:
        report += "\nFailures:\n" + "".join(f"- {f}\n" for f in failures)
    print(report)

    stamp = now.strftime("%Y-%m-%d-%H%M%S")
    md_path = BENCH_DATA / f"cpu-peers-{stamp}.md"
    json_path = BENCH_DATA / f"cpu-peers-{stamp}.json"
    md_path.write_text(report)
    meta = dict(date=now.isoformat(timespec="seconds"), command=cmdline, cpu=cpu_model(),
                threads=args.threads, k=k, faiss_version=faiss.__version__,
                numpy_version=np.__version__, quick=args.quick, load_start=load_start,
                load_end=os.getloadavg()[0])
    json_path.write_text(json.dumps(dict(meta=meta, membw=membw, rows=rows, failures=failures),
                                    indent=2, default=str) + "\n")
    print(f"wrote {md_path.relative_to(ROOT)} and {json_path.relative_to(ROOT)}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
