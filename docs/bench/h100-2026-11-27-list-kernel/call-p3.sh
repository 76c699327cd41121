#!/usr/bin/env bash
# ncu source-level (SASS) counters of the new list kernel.
set -u
mkdir -p /tmp/hg && [ -x /tmp/hg/b/hive-gpu ] || tar -C /tmp/hg -xJf .carry/bins.tar.xz
mkdir -p $OUT/p
. scripts/cuda-libs.sh
w=/tmp/hive-ivf-bench; mkdir -p $w; [ -f $w/c_groundtruth.ivecs ] || python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/p/data.log 2>&1
HIVE_GPU_PIECE_QUERIES=10000 timeout 240 ncu -o /tmp/rep --force-overwrite --kernel-name regex:hg_list_topk --launch-count 1 --section SourceCounters --section WarpStateStats /tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs -k 10 --index ivf-flat:nlist=1024 --search nprobe=4 > $OUT/p/ncu-run.txt 2>&1
ncu -i /tmp/rep.ncu-rep --print-details all > $OUT/p/details.txt 2>&1
ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass > $OUT/p/sass.csv 2>&1
ls -la $OUT/p; head -c 3000 $OUT/p/sass.csv
cd $OUT && xz -T4 p/sass.csv
