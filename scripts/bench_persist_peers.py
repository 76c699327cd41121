#!/usr/bin/env python3
"""Saving and opening a collection: hive-gpu (`build`, `info --open`) against faiss
write_index / read_index of an IndexFlatL2 of the same vectors, and `dd` sequential write speed,
in one run on this machine. Run through scripts/bench-persist-peers (it sets up .venv-bench).

Each measurement is repeated `--repeat` times and the median reported. Both writers end with the
file on disk: hive-gpu's save fsyncs the file and its directory; faiss does not, so its
write_index is timed with an fsync added (and without, for reference).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def read_fvecs(path):
    raw = np.fromfile(path, dtype=np.int32)
    dim = raw[0]
    return raw.reshape(-1, dim + 1)[:, 1:].view(np.float32).copy()


def median(f, repeat):
    return statistics.median(f() for _ in range(repeat))


def timed(f):
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", default=str(ROOT / "bench-data/synth1000k_base.fvecs"))
    p.add_argument("--work", default="/tmp/hive-persist-bench")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--binary", default=str(ROOT / "target/release/hive-gpu"),
                   help="the hive-gpu binary (a GPU bundle's on the GPU machine)")
    p.add_argument("--faiss-gpu", action="store_true",
                   help="also time faiss read_index + index_cpu_to_gpu (FAISS GPU, on the GPU machine)")
    args = p.parse_args()
    import faiss

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    binary = args.binary
    base = read_fvecs(args.base)
    n, dim = base.shape
    rows = []

    def dd():
        out = subprocess.run(
            ["dd", "if=/dev/zero", f"of={work}/dd.bin", "bs=8M", f"count={max(1, base.nbytes >> 23)}", "conv=fsync"],
            capture_output=True, text=True, check=True,
        ).stderr
        os.remove(work / "dd.bin")
        return float(re.search(r"copied, ([0-9.]+) s", out).group(1))

    dd_s = median(dd, args.repeat)
    dd_gbs = base.nbytes / dd_s / 1e9

    coll = work / "c.hgc"

    def hive_save():
        out = subprocess.run(
            [binary, "build", "--base", args.base, "--out", coll, "--backend", args.backend],
            capture_output=True, text=True, check=True,
        ).stdout
        return float(re.search(r"save ([0-9.]+) s", out).group(1))

    save_s = median(hive_save, args.repeat)
    file_bytes = coll.stat().st_size

    def hive_open(mapped=False):
        out = subprocess.run(
            [binary, "info", "--collection", coll, "--open", "--backend", args.backend]
            + (["--mapped"] if mapped else []),
            capture_output=True, text=True, check=True,
        ).stdout
        m = re.search(r"in ([0-9.]+) s; reading the file's bytes took ([0-9.]+) s", out)
        return float(m.group(1)), float(m.group(2))

    opens = [hive_open() for _ in range(args.repeat)]
    open_s = statistics.median(o[0] for o in opens)
    read_s = statistics.median(o[1] for o in opens)
    mapped_s = statistics.median(hive_open(True)[0] for _ in range(args.repeat)) if args.backend == "cpu" else None

    index = faiss.IndexFlatL2(int(dim))
    index.add(base)
    path = str(work / "f.faiss")

    def faiss_write(sync):
        def run():
            faiss.write_index(index, path)
            if sync:
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
        return timed(run)

    fw_sync = median(lambda: faiss_write(True), args.repeat)
    fw = median(lambda: faiss_write(False), args.repeat)
    fr = median(lambda: timed(lambda: faiss.read_index(path)), args.repeat)
    fgpu = None
    if args.faiss_gpu:
        resources = faiss.StandardGpuResources()
        faiss.index_cpu_to_gpu(resources, 0, faiss.read_index(path))  # warm: CUDA context, pools

        def to_gpu():
            gpu_index = faiss.index_cpu_to_gpu(resources, 0, faiss.read_index(path))
            gpu_index.search(base[:1], 1)  # the copy is done once a search returns
            return gpu_index

        fgpu = median(lambda: timed(to_gpu), args.repeat)

    result = {
        "vectors": n, "dim": int(dim), "backend": args.backend, "file_bytes": file_bytes,
        "dd_s": dd_s, "dd_gb_s": dd_gbs,
        "hive_save_s": save_s, "hive_save_gb_s": file_bytes / save_s / 1e9,
        "hive_save_vs_dd": (file_bytes / save_s / 1e9) / dd_gbs,
        "hive_open_s": open_s, "hive_read_file_s": read_s, "hive_open_vs_read": open_s / read_s,
        "faiss_write_fsync_s": fw_sync, "faiss_write_s": fw, "faiss_read_s": fr,
        "save_vs_faiss_write_fsync": fw_sync / save_s, "open_vs_faiss_read": fr / open_s,
        "hive_open_mapped_s": mapped_s,
        "faiss_read_to_gpu_s": fgpu, "open_vs_faiss_read_to_gpu": fgpu / open_s if fgpu else None,
    }
    print(json.dumps(result))
    print(f"| {n} x {dim} | dd {dd_gbs:.2f} GB/s | hive save {save_s:.2f} s ({result['hive_save_vs_dd']:.0%} of dd) "
          f"| faiss write_index+fsync {fw_sync:.2f} s (without fsync {fw:.2f} s) | hive open ({args.backend}) {open_s:.2f} s "
          f"({open_s / read_s:.1f}x reading the file, {read_s:.3f} s) | faiss read_index {fr:.2f} s |"
          + (f" hive open --mapped {mapped_s:.3f} s |" if mapped_s is not None else "")
          + (f" faiss read_index + index_cpu_to_gpu {fgpu:.3f} s ({fgpu / open_s:.2f}x ours) |" if fgpu else ""))


if __name__ == "__main__":
    sys.exit(main())
