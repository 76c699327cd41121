#!/usr/bin/env bash
# The final code: CUDA tests of the nearest-row paths, then IVF-Flat at nprobe 1, single queries
# and 10k batches, the kernel on (default threshold) and off, alternating.
set -u
mkdir -p /tmp/hg $OUT/v && tar -C /tmp/hg -xJf .carry/bins.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/v/gpu.txt 2>&1
. scripts/cuda-libs.sh
w=/tmp/hive-ivf-bench; mkdir -p $w
python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/v/data.log 2>&1 &
( cd crates/hive-gpu
  for t in primitives kmeans ivf; do
    s=$(date +%s); HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1 timeout 200 /tmp/hg/b/$t > $OUT/v/$t.log 2>&1; rc=$?
    echo "$t rc=$rc $(( $(date +%s) - s ))s $(grep 'test result' $OUT/v/$t.log | tail -1)" | tee -a $OUT/v/summary.txt
  done )
wait
b() { timeout 100 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --json --search nprobe=1 "$@"; }
for r in 1 2; do for nk in 1 0; do
  HIVE_GPU_NEAREST_KERNEL=$nk b > $OUT/v/batch-nk$nk-r$r.json 2>&1
  HIVE_GPU_NEAREST_KERNEL=$nk b --nq 1000 --batch 1 > $OUT/v/single-nk$nk-r$r.json 2>&1
done; done
python3 - $OUT/v <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*-nk*.json"))):
    for line in open(f):
        try: r = json.loads(line)
        except ValueError: continue
        print(os.path.basename(f), "batch", r.get("batch"), "recall %.4f" % r["recall"], "qps %.0f" % r["qps"], "p50 %.4f ms" % r["p50_ms"], "build %.2f s" % r["index_build_s"])
PY
cd $OUT && xz -T4 v/*.log && tar -cf v.tar v
