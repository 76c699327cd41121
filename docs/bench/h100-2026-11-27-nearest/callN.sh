#!/usr/bin/env bash
# Where the nearest-row probe starts to pay: IVF-Flat nprobe 1 at batches of 16 to 2,000 queries,
# the kernel on and off, alternating.
set -u
mkdir -p $OUT/n
. scripts/cuda-libs.sh
w=/tmp/hive-ivf-bench
b() { timeout 100 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --json --search nprobe=1 "$@"; }
for r in 1 2; do for bs in 16 64 256 1000 2000; do for nk in 1 0; do
  HIVE_GPU_NEAREST_KERNEL=$nk b --nq 4000 --batch $bs > $OUT/n/b$bs-nk$nk-r$r.json 2>&1
done; done; done
python3 - $OUT/n <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    for line in open(f):
        try: r = json.loads(line)
        except ValueError: continue
        print(os.path.basename(f), "batch", r.get("batch"), "qps %.0f" % r["qps"], "p50 %.4f ms" % r["p50_ms"])
PY
cd $OUT && tar -cf n.tar n
