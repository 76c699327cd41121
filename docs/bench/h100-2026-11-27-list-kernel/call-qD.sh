#!/usr/bin/env bash
# Piece knobs with the new list kernel, IVF-Flat nprobe 4 and 8 on the clustered 1M set.
set -u
mkdir -p $OUT/d
. scripts/cuda-libs.sh
w=/tmp/hive-ivf-bench
run() { n=$1; shift; env "$@" /tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --search nprobe=4 --search nprobe=8 --json > $OUT/d/$n.json 2> /dev/null; echo "$n $* : $(python3 -c "
import json,sys
for l in open('$OUT/d/$n.json'):
  try: r=json.loads(l)
  except: continue
  print(r.get('search_params'), round(r.get('recall',0),4), int(r.get('qps',0)), end='; ')
")" >> $OUT/d/summary.txt; }
for r in 1 2; do
run base-r$r HIVE_GPU_X=1
run q2500-r$r HIVE_GPU_PIECE_QUERIES=2500
run q1250-r$r HIVE_GPU_PIECE_QUERIES=1250
run w5-r$r HIVE_GPU_PIECE_WORKERS=5
run q1250w8-r$r HIVE_GPU_PIECE_QUERIES=1250 HIVE_GPU_PIECE_WORKERS=8
done
cat $OUT/d/summary.txt
