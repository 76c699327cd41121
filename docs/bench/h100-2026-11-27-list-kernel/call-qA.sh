#!/usr/bin/env bash
# FAISS part 1; CUDA tests of the list kernel (fold + fresh merge); old / fold / new CLIs alternating.
set -u
mkdir -p /tmp/faiss /tmp/hg $OUT/a && cp .faiss/part.aa /tmp/faiss/
tar -C /tmp/hg -xJf .carry/bins.tar.xz
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpu.txt
w=/tmp/hive-ivf-bench; mkdir -p $w; [ -f $w/c_groundtruth.ivecs ] || python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/a/data.log 2>&1 &
( cd crates/hive-gpu && for t in ivf primitives; do HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1 /tmp/hg/b/$t --test-threads 4 > $OUT/a/test-$t.log 2>&1; echo "test $t rc=$? $(grep 'test result' $OUT/a/test-$t.log)" >> $OUT/a/summary.txt; done )
wait
run() { n=$1; bin=$2; shift 2; env "$@" /tmp/hg/b/$bin bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --search nprobe=1 --search nprobe=2 --search nprobe=4 --search nprobe=8 --search nprobe=16 --json > $OUT/a/$n.json 2> $OUT/a/$n.err; echo "$n $* : $(python3 -c "
import json,sys
for l in open('$OUT/a/$n.json'):
  try: r=json.loads(l)
  except: continue
  print(r.get('search_params'), round(r.get('recall',0),4), int(r.get('qps',0)), end='; ')
")" >> $OUT/a/summary.txt; }
for r in 1 2; do run old-r$r hive-gpu-old HIVE_GPU_X=1; run fold-r$r hive-gpu-fold HIVE_GPU_X=1; run new-r$r hive-gpu HIVE_GPU_X=1; done
cat $OUT/a/summary.txt
cd $OUT && tar -cJf a.tar.xz a && rm -rf a/*.err a/*.json a/test-*.log
