#!/usr/bin/env bash
# The final code (68f4162): CUDA ivf and primitives suites; the 10M set: IVF-Flat nprobe 1-2
# (whole), IVF-PQ refine 32 nprobe 2-4 with fcc4886 (whole at nprobe 2) and the final CLI (pieces).
set -u
mkdir -p /tmp/hg $OUT/v && tar -C /tmp/hg -xJf .carry/bins.tar.xz
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/v/gpu.txt
mkdir -p /tmp/w10; python3 scripts/make_clustered_fvecs.py /tmp/w10/c --rows 10000000 --queries 10000 > $OUT/v/data10m.log 2>&1 &
( cd crates/hive-gpu && for t in ivf primitives; do HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1 /tmp/hg/b/$t --test-threads 4 > $OUT/v/test-$t.log 2>&1; echo "test $t rc=$? $(grep 'test result' $OUT/v/test-$t.log)" >> $OUT/v/summary.txt; done )
wait
w=/tmp/w10
run() { n=$1; bin=$2; idx=$3; shift 3; /tmp/hg/b/$bin bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index $idx "$@" --columnar --json > $OUT/v/$n.json 2> /dev/null; echo "$n $idx : $(python3 -c "
import json,sys
for l in open('$OUT/v/$n.json'):
  try: r=json.loads(l)
  except: continue
  print(r.get('search_params'), round(r.get('recall',0),4), int(r.get('qps',0)), end='; ')
")" >> $OUT/v/summary.txt; }
run flat-new hive-gpu ivf-flat:nlist=4096 --search nprobe=1 --search nprobe=2
run pq-old hive-gpu-old ivf-pq:nlist=4096,m=16,bits=8 --search nprobe=2,refine=32 --search nprobe=4,refine=32
run pq-new hive-gpu ivf-pq:nlist=4096,m=16,bits=8 --search nprobe=2,refine=32 --search nprobe=4,refine=32
cat $OUT/v/summary.txt
cd $OUT && tar -cJf v.tar.xz v && rm -rf v/*.json v/test-*.log
