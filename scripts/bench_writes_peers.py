"""Acknowledged single-vector upserts per second from N writer threads, hive-gpu against SQLite.

hive-gpu: `hive-gpu bench-writes` (a durable collection; each thread upserts one vector and waits
for its acknowledgement). SQLite: one connection per thread, WAL journal, one INSERT OR REPLACE
of (id, vector blob) per transaction, the same dimension; synchronous=FULL fsyncs the WAL at every
commit (the analogue of Durability::Disk), synchronous=NORMAL does not (a commit survives the
process being killed but not a power cut: Durability::Process). The disk's own flush rate is
measured by hive-gpu in the same run. Medians of --repeat runs; see docs/PERFORMANCE.md.
"""

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import threading
import time


def sqlite_rate(path, threads, seconds, dim, synchronous):
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    setup = sqlite3.connect(path)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE v (id TEXT PRIMARY KEY, vec BLOB)")
    setup.commit()
    setup.close()
    stop = threading.Event()
    counts = [0] * threads
    blob = bytes(4 * dim)

    def writer(t):
        db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA synchronous={synchronous}")
        i = 0
        while not stop.is_set():
            db.execute("INSERT OR REPLACE INTO v VALUES (?, ?)", (f"t{t}-{i}", blob))
            i += 1
        counts[t] = i
        db.close()

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - started)


def hive_rate(binary, directory, threads, seconds, dim, durability):
    out = subprocess.run(
        [binary, "bench-writes", "--dir", directory, "--threads", str(threads), "--seconds", str(seconds),
         "--dim", str(dim), "--durability", durability, "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default="target/bench-writes")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    binary = os.path.join(os.path.dirname(__file__), "..", "target", "release", "hive-gpu")
    rows = {}
    for _ in range(a.repeat):
        for mode, sync in (("disk", "FULL"), ("process", "NORMAL")):
            h = hive_rate(binary, a.dir, a.threads, a.seconds, a.dim, mode)
            s = sqlite_rate(os.path.join(a.dir, "peer.sqlite"), a.threads, a.seconds, a.dim, sync)
            r = rows.setdefault(mode, {"hive": [], "sqlite": [], "records_per_flush": [], "p50": [], "p99": [],
                                       "disk_flushes": []})
            r["hive"].append(h["acked_per_s"])
            r["sqlite"].append(s)
            r["records_per_flush"].append(h["records_per_flush"])
            r["p50"].append(h["p50_ms"])
            r["p99"].append(h["p99_ms"])
            r["disk_flushes"].append(h["disk_flushes_per_s"])
    print(f"{a.threads} writer threads, dim {a.dim}, {a.seconds} s per run, median of {a.repeat}")
    print(f"{'durability':<10} {'hive-gpu/s':>11} {'sqlite/s':>10} {'ratio':>6} {'rec/flush':>9} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'disk flush/s':>12} {'bound/s':>8}")
    for mode, r in rows.items():
        hive, lite = statistics.median(r["hive"]), statistics.median(r["sqlite"])
        flushes = statistics.median(r["disk_flushes"])
        print(f"{mode:<10} {hive:>11.0f} {lite:>10.0f} {hive / lite:>6.2f} "
              f"{statistics.median(r['records_per_flush']):>9.2f} {statistics.median(r['p50']):>7.3f} "
              f"{statistics.median(r['p99']):>7.3f} {flushes:>12.0f} {flushes * a.threads:>8.0f}")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
