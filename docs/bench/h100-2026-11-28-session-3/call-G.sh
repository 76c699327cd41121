#!/usr/bin/env bash
# Call G (CLI of 54998fb; call F with the launch skip corrected and without its TF32 run): what bounds the tile path's selection and finalize in a 1,000-query
# piece over the 10,253 gathered rows of S = 0.01 (ncu sections of one launch each).
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/g && xz -dc .carry/cliA.xz > /tmp/hg/hive-gpu && chmod +x /tmp/hg/hive-gpu
. scripts/cuda-libs.sh
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
H=/tmp/hg/hive-gpu
G="--backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs --columnar --reuse-results --json -k 10 --filter-selectivity 0.01 --nq 1000"
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis"
timeout 200 ncu $S --kernel-name hg_tile_topk --launch-skip 50 --launch-count 1 $H bench $G > $OUT/g/ncu-topk.txt 2>&1
timeout 200 ncu $S --kernel-name regex:hg_finalize --launch-skip 50 --launch-count 1 $H bench $G > $OUT/g/ncu-finalize.txt 2>&1
cd $OUT/g
: > summary.txt
for f in ncu-topk.txt ncu-finalize.txt; do echo "== $f"; grep -E "Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Shared Memory Config|Dynamic Shared|Block Limit|Memory Throughput|DRAM Throughput|L2 Hit|Compute \(SM\) Throughput|Warp Cycles Per Issued|Issued Warp|No Eligible|Grid Size|Waves Per SM|stall|Stall" $f | head -40; done >> summary.txt
cat summary.txt
tar -cJf logs.tar.xz ncu-*.txt && rm -f ncu-*.txt; ls
