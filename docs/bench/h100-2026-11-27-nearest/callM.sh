#!/usr/bin/env bash
# IVF-Flat searches at nprobe 1 and 2 with the probe through the nearest-row kernel and without
# (HIVE_GPU_NEAREST_KERNEL=0: the exact k-NN, as before), alternating; single queries; a profile.
set -u
mkdir -p $OUT/m
. scripts/cuda-libs.sh
w=/tmp/hive-ivf-bench
[ -f $w/c_groundtruth.ivecs ] || python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/m/data.log 2>&1
b() { timeout 120 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --json "$@"; }
for r in 1 2 3; do for nk in 1 0; do
  HIVE_GPU_NEAREST_KERNEL=$nk b --search nprobe=1 --search nprobe=2 > $OUT/m/batch-nk$nk-r$r.json 2>&1
  HIVE_GPU_NEAREST_KERNEL=$nk b --search nprobe=1 --nq 1000 --batch 1 > $OUT/m/single-nk$nk-r$r.json 2>&1
done; done
HIVE_GPU_PROFILE=1 b --search nprobe=1 --search nprobe=4 > $OUT/m/prof.json 2> $OUT/m/prof.err
python3 - $OUT/m <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*-nk*-r*.json"))):
    for line in open(f):
        try: r = json.loads(line)
        except ValueError: continue
        print(os.path.basename(f), r.get("search_params"), "recall %.4f" % r["recall"], "qps %.0f" % r["qps"], "p50 %.4f ms" % r["p50_ms"])
PY
cd $OUT && xz -T4 m/prof.err && tar -cf m.tar m
