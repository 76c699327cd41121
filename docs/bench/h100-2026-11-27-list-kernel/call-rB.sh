#!/usr/bin/env bash
# FAISS part 2; old / new CLIs at 10M (nlist 4,096), lists and columns.
set -u
mkdir -p /tmp/faiss $OUT/b && cp .faiss/part.ab /tmp/faiss/
. scripts/cuda-libs.sh
w=/tmp/w10
run() { n=$1; bin=$2; shift 2; env "$@" /tmp/hg/b/$bin bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=4096 --search nprobe=1 --search nprobe=2 --search nprobe=4 ${COL:-} --json > $OUT/b/$n.json 2> /dev/null; echo "$n ${COL:-lists} : $(python3 -c "
import json,sys
for l in open('$OUT/b/$n.json'):
  try: r=json.loads(l)
  except: continue
  print(r.get('search_params'), round(r.get('recall',0),4), int(r.get('qps',0)), end='; ')
")" >> $OUT/b/summary.txt; }
run old hive-gpu-old; run new hive-gpu; COL=--columnar run oldc hive-gpu-old; COL=--columnar run newc hive-gpu
cat $OUT/b/summary.txt
