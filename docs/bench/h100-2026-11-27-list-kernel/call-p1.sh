#!/usr/bin/env bash
# Profile of IVF-Flat nprobe 4 on the clustered 1M set: phases, knobs, nsys/ncu if present.
set -u
mkdir -p /tmp/hg && tar -C /tmp/hg -xJf .carry/bins.tar.xz
mkdir -p $OUT/p
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/p/gpu.txt
which nsys ncu > $OUT/p/tools.txt 2>&1; ls /usr/local/cuda*/bin 2>/dev/null | grep -i "nsys\|ncu" >> $OUT/p/tools.txt
w=/tmp/hive-ivf-bench; mkdir -p $w; [ -f $w/c_groundtruth.ivecs ] || python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/p/data.log 2>&1
B="/tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024"
run() { n=$1; shift; env "$@" $B --search nprobe=4 --search nprobe=8 --json > $OUT/p/$n.json 2> $OUT/p/$n.err; echo "$n $* : $(python3 -c "
import json,sys
for l in open('$OUT/p/$n.json'):
  try: r=json.loads(l)
  except: continue
  print(r.get('search_params'), round(r.get('recall',0),4), int(r.get('qps',0)), end='; ')
")" >> $OUT/p/summary.txt; }
run base HIVE_GPU_PROFILE=1
run pq10k HIVE_GPU_PIECE_QUERIES=10000
run pq5k HIVE_GPU_PIECE_QUERIES=5000
run pq1k HIVE_GPU_PIECE_QUERIES=1000 HIVE_GPU_PIECE_WORKERS=8
run pw2 HIVE_GPU_PIECE_WORKERS=2
run pw8 HIVE_GPU_PIECE_WORKERS=8
run sub1 HIVE_GPU_SCAN_SUBROUNDS=1
run sub4 HIVE_GPU_SCAN_SUBROUNDS=4
run base2 HIVE_GPU_A=1
if which nsys > /dev/null 2>&1; then
  timeout 120 nsys profile -o $OUT/p/nsys --force-overwrite true --stats=false $B --search nprobe=4 > $OUT/p/nsys.log 2>&1
  timeout 60 nsys stats --report cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum $OUT/p/nsys.nsys-rep > $OUT/p/nsys-stats.txt 2>&1
  rm -f $OUT/p/nsys.sqlite
fi
if which ncu > /dev/null 2>&1; then
  HIVE_GPU_PIECE_QUERIES=10000 timeout 150 ncu --kernel-name regex:hg_list_topk --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats $B --search nprobe=4 > $OUT/p/ncu.txt 2>&1
fi
cat $OUT/p/summary.txt $OUT/p/tools.txt
cd $OUT && tar -cJf p.tar.xz p && rm -rf p/*.err p/*.json
