#!/usr/bin/env bash
# The final code (de297c4, kernel entry points without the macro): CUDA ivf and primitives;
# IVF-Flat on the clustered 1M set (nprobe 1-16, results as columns) for the record.
set -u
mkdir -p /tmp/hg $OUT/v && tar -C /tmp/hg -xJf .carry/bins.tar.xz
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/v/gpu.txt
w=/tmp/hive-ivf-bench; mkdir -p $w; python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/v/data.log 2>&1 &
( cd crates/hive-gpu && for t in ivf primitives; do HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1 /tmp/hg/b/$t --test-threads 4 > $OUT/v/test-$t.log 2>&1; echo "test $t rc=$? $(grep 'test result' $OUT/v/test-$t.log)" >> $OUT/v/summary.txt; done )
wait
/tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --search nprobe=1 --search nprobe=4 --search nprobe=8 --search nprobe=16 --columnar --json > $OUT/v/flat.json 2>/dev/null
echo "flat columns: $(python3 -c "
import json
for l in open('$OUT/v/flat.json'):
  r=json.loads(l); print(r['search_params'], round(r['recall'],4), int(r['qps']), end='; ')
")" >> $OUT/v/summary.txt
cat $OUT/v/summary.txt
cd $OUT && tar -cJf v.tar.xz v && rm -rf v/test-*.log
