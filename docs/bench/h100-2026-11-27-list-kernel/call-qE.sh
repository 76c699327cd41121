#!/usr/bin/env bash
# Where the time goes at nprobe 1 over the clustered 10M set (nlist 4,096): profiles and ncu.
set -u
mkdir -p /tmp/hg $OUT/e && tar -C /tmp/hg -xJf .carry/cli.tar.xz
. scripts/cuda-libs.sh
w=/tmp/w10; mkdir -p $w; s=$(date +%s)
python3 scripts/make_clustered_fvecs.py $w/c --rows 10000000 --queries 10000 > $OUT/e/data.log 2>&1; echo "data $(( $(date +%s) - s ))s"
# Build once, save, then open the collection for each run (no retraining).
B="/tmp/hg/c/hive-gpu bench --backend cuda --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10"
/tmp/hg/c/hive-gpu build --help > $OUT/e/build-help.txt 2>&1
run() { n=$1; shift; env "$@" $B --base $w/c_base.fvecs --index ivf-flat:nlist=4096 --search nprobe=1 --search nprobe=2 --json > $OUT/e/$n.json 2> $OUT/e/$n.err; echo "$n $* : $(python3 -c "
import json,sys
for l in open('$OUT/e/$n.json'):
  try: r=json.loads(l)
  except: continue
  print(r.get('search_params'), round(r.get('recall',0),4), int(r.get('qps',0)), round(r.get('index_build_s',0),2), end='; ')
")" >> $OUT/e/summary.txt; }
run base HIVE_GPU_X=1
run prof HIVE_GPU_PROFILE=1
run whole HIVE_GPU_PROFILE=1 HIVE_GPU_PIECE_QUERIES=10000
run nmin1000 HIVE_GPU_NEAREST_MIN_POINTS=1000
HIVE_GPU_PIECE_QUERIES=10000 timeout 200 ncu --kernel-name regex:hg_list_topk --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats $B --base $w/c_base.fvecs --index ivf-flat:nlist=4096 --search nprobe=1 > $OUT/e/ncu.txt 2>&1
cat $OUT/e/summary.txt; grep -E "Duration|Grid Size|Registers|Executed Instructions  " $OUT/e/ncu.txt
for f in prof whole; do grep -v "nearest\|k-means\|nq 262144\|nq 1[0-9][0-9] \|nq [0-9][0-9] \|nq [0-9] " $OUT/e/$f.err > $OUT/e/$f.trim; done; rm -f $OUT/e/*.err
tail -8 $OUT/e/whole.trim
cd $OUT && tar -cJf e.tar.xz e && rm -rf e/*.json e/*.trim
