#!/usr/bin/env bash
# IVF-Flat list kernel: metric as a template argument + one sorting network per group's merges.
# CUDA tests (ivf, primitives), then old/new CLI alternating, then ncu of the new kernel.
set -u
mkdir -p /tmp/hg && tar -C /tmp/hg -xJf .carry/bins.tar.xz
mkdir -p $OUT/p
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/p/gpu.txt
w=/tmp/hive-ivf-bench; mkdir -p $w; [ -f $w/c_groundtruth.ivecs ] || python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/p/data.log 2>&1 &
( cd crates/hive-gpu && for t in ivf primitives; do HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1 /tmp/hg/b/$t --test-threads 4 > $OUT/p/test-$t.log 2>&1; echo "test $t rc=$? $(grep 'test result' $OUT/p/test-$t.log)" >> $OUT/p/summary.txt; done )
wait
run() { n=$1; bin=$2; shift 2; env "$@" /tmp/hg/b/$bin bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --search nprobe=1 --search nprobe=4 --search nprobe=8 --search nprobe=16 --json > $OUT/p/$n.json 2> $OUT/p/$n.err; echo "$n $* : $(python3 -c "
import json,sys
for l in open('$OUT/p/$n.json'):
  try: r=json.loads(l)
  except: continue
  print(r.get('search_params'), round(r.get('recall',0),4), int(r.get('qps',0)), end='; ')
")" >> $OUT/p/summary.txt; }
for r in 1 2; do run old-r$r hive-gpu-old HIVE_GPU_X=1; run new-r$r hive-gpu HIVE_GPU_PROFILE=1; done
HIVE_GPU_PIECE_QUERIES=10000 timeout 150 ncu --kernel-name regex:hg_list_topk --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats /tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs -k 10 --index ivf-flat:nlist=1024 --search nprobe=4 > $OUT/p/ncu.txt 2>&1
cat $OUT/p/summary.txt; grep -E "Duration|Registers|Executed Ipc A|Achieved Occ|highest" $OUT/p/ncu.txt
cd $OUT && tar -cJf p.tar.xz p && rm -rf p/*.err p/*.json p/test-*.log
