#!/usr/bin/env bash
# Call F (CLI of 54998fb): what bounds the tile path's selection and finalize in a 1,000-query
# piece over the 10,253 gathered rows of S = 0.01 (ncu sections of one launch each, and the
# durations of a piece's kernels under TF32 GEMMs).
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/f && xz -dc .carry/cliA.xz > /tmp/hg/hive-gpu && chmod +x /tmp/hg/hive-gpu
. scripts/cuda-libs.sh
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
H=/tmp/hg/hive-gpu
G="--backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs --columnar --reuse-results --json -k 10 --filter-selectivity 0.01 --nq 1000"
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis"
timeout 200 ncu $S --kernel-name hg_tile_topk --launch-skip 2000 --launch-count 1 $H bench $G > $OUT/f/ncu-topk.txt 2>&1
timeout 200 ncu $S --kernel-name regex:hg_finalize --launch-skip 2000 --launch-count 1 $H bench $G > $OUT/f/ncu-finalize.txt 2>&1
timeout 200 ncu --csv --metrics gpu__time_duration.sum --launch-skip 3000 --launch-count 60 $H bench $G --precision fast > $OUT/f/ncu-tf32.csv 2>&1
cd $OUT/f
python3 - > summary.txt <<'P'
import csv,collections
d=collections.defaultdict(list)
for r in csv.reader(open('ncu-tf32.csv')):
    if len(r)>10 and r[-3]=='gpu__time_duration.sum':
        d[r[4].split('(')[0][:60]].append(float(r[-1].replace(',','')))
for k,v in sorted(d.items(), key=lambda kv:-sum(kv[1])):
    v.sort(); print('tf32', k, len(v), 'median', v[len(v)//2])
P
for f in ncu-topk.txt ncu-finalize.txt; do echo "== $f"; grep -E "Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Shared Memory Config|Dynamic Shared|Block Limit|Memory Throughput|DRAM Throughput|L2 Hit|Compute \(SM\) Throughput|Warp Cycles Per Issued|Issued Warp|No Eligible|Grid Size|Waves Per SM|stall|Stall" $f | head -40; done >> summary.txt
cat summary.txt
tar -cJf logs.tar.xz ncu-*.txt ncu-tf32.csv && rm -f ncu-*.txt ncu-tf32.csv && ls
