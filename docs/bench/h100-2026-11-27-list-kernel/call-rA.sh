#!/usr/bin/env bash
# FAISS part 1; CUDA ivf suite of the new code; 1M and 10M data; old (327abeb) / new CLIs at 1M,
# results as lists and as columns.
set -u
mkdir -p /tmp/faiss /tmp/hg $OUT/a && cp .faiss/part.aa /tmp/faiss/
tar -C /tmp/hg -xJf .carry/bins.tar.xz
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpu.txt
w=/tmp/hive-ivf-bench; mkdir -p $w /tmp/w10
( python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/a/data.log 2>&1; python3 scripts/make_clustered_fvecs.py /tmp/w10/c --rows 10000000 --queries 10000 > $OUT/a/data10m.log 2>&1 ) &
( cd crates/hive-gpu && HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1 /tmp/hg/b/ivf --test-threads 4 > $OUT/a/test-ivf.log 2>&1; echo "test ivf rc=$? $(grep 'test result' $OUT/a/test-ivf.log)" >> $OUT/a/summary.txt )
wait
run() { n=$1; bin=$2; shift 2; env "$@" /tmp/hg/b/$bin bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --search nprobe=1 --search nprobe=4 --search nprobe=8 ${COL:-} --json > $OUT/a/$n.json 2> /dev/null; echo "$n ${COL:-lists} : $(python3 -c "
import json,sys
for l in open('$OUT/a/$n.json'):
  try: r=json.loads(l)
  except: continue
  print(r.get('search_params'), round(r.get('recall',0),4), int(r.get('qps',0)), end='; ')
")" >> $OUT/a/summary.txt; }
for r in 1 2; do run old-r$r hive-gpu-old; run new-r$r hive-gpu; COL=--columnar run oldc-r$r hive-gpu-old; COL=--columnar run newc-r$r hive-gpu; done
cat $OUT/a/summary.txt; ls -la /tmp/w10
cd $OUT && tar -cJf a.tar.xz a && rm -rf a/*.json a/test-*.log
