#!/usr/bin/env bash
# Call D: the device's own timeline of a prepared filtered single query on CUDA (1M x 128
# Gaussian, seed 7; S = 0.001 and 0.01, k = 10): each kernel's duration by name and grid, from
# nsys where the machine has it, else ncu.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/d && tar -C /tmp/hg -xJf .carry/binsC.tar.xz
. scripts/cuda-libs.sh
(which nsys ncu; nsys --version; ncu --version) > $OUT/d/tools.txt 2>&1
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
for S in 0.001 0.01; do
  if command -v nsys > /dev/null; then
    timeout 200 nsys profile -o /tmp/r$S --force-overwrite true --trace cuda /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 10 --json --batch 1 --nq 20 --filter-selectivity $S > $OUT/d/nsys-$S.log 2>&1
    nsys stats --report cuda_gpu_trace --format csv /tmp/r$S.nsys-rep > /tmp/trace-$S.csv 2>/dev/null
    nsys stats --report cuda_api_sum --format csv /tmp/r$S.nsys-rep > $OUT/d/api-$S.csv 2>/dev/null
    python3 - /tmp/trace-$S.csv > $OUT/d/kernels-$S.txt <<'PY'
import csv, sys, statistics, collections
rows = list(csv.reader(open(sys.argv[1])))
head = None
for i, r in enumerate(rows):
    if r and r[0].startswith('Start'):
        head = r; rows = rows[i+1:]; break
if head is None:
    print('no trace'); sys.exit()
col = {n: j for j, n in enumerate(head)}
groups = collections.defaultdict(list)
for r in rows:
    if len(r) < len(head): continue
    name = r[col['Name']]
    grid = (r[col.get('GrdX', 0)], r[col.get('GrdY', 0)]) if 'GrdX' in col else ''
    try: groups[(name[:60], grid)].append(float(r[col['Duration (ns)']]))
    except (KeyError, ValueError): pass
for (name, grid), v in sorted(groups.items(), key=lambda x: -len(x[1])):
    print(f'{name:60s} grid {grid} n={len(v):7d} median_us={statistics.median(v)/1e3:.2f} min_us={min(v)/1e3:.2f}')
PY
  else
    timeout 250 ncu --kernel-name regex:"hg_(scan_topk|finalize)" --launch-skip 6000 --launch-count 40 --metrics gpu__time_duration.sum --csv /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 10 --json --batch 1 --nq 20 --filter-selectivity $S > $OUT/d/ncu-$S.csv 2>&1
  fi
done
cat $OUT/d/tools.txt $OUT/d/kernels-*.txt 2>/dev/null | head -60; tail -5 $OUT/d/ncu-*.csv 2>/dev/null
