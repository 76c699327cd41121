#!/usr/bin/env bash
# Call C: inside the few-rows pass. Build T is call A's code with clock64() marks printed once,
# at its end, by blocks 0 and 100 (threads 0 and 32, rows' threads of both summing warps):
# cycles from the block's start to its staged rows, to its summed distances and to its written
# list (a first try printed at each mark, and the prints swamped the marks). S = 0.01 over 1M x 128
# (161 blocks) and unfiltered 10,000 x 128 (157 blocks).
set -u
mkdir -p $OUT/c && xz -dc .carry/T.xz > /tmp/hive-gpu-T && chmod +x /tmp/hive-gpu-T
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/c/gpu.txt
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/s_base.fvecs --rows 10000 > /dev/null 2>&1
timeout 60 /tmp/hive-gpu-T bench --backend cuda --query $w/g_query.fvecs -k 10 --json --batch 1 --nq 5 --base $w/g_base.fvecs --filter-selectivity 0.01 > $OUT/c/t-filter.txt 2>&1
timeout 60 /tmp/hive-gpu-T bench --backend cuda --query $w/g_query.fvecs -k 10 --json --batch 1 --nq 5 --base $w/s_base.fvecs > $OUT/c/t-small.txt 2>&1
cd $OUT/c && for f in t-*.txt; do echo "== $f"; python3 -c "
import statistics, collections
d = collections.defaultdict(list)
for l in open('$f'):
    p = l.split()
    if p and p[0] == 'few': d[(p[1], p[2])].append((int(p[4]), int(p[6]), int(p[8])))
for key, v in sorted(d.items()):
    print(key, len(v), 'median staged/summed/ranked cycles', [statistics.median(x[i] for x in v) for i in range(3)])
"; done > summary.txt; cat gpu.txt summary.txt; xz t-*.txt; ls
