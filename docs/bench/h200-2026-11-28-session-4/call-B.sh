#!/usr/bin/env bash
# Call B: issue 19's numbers on an H200 (the earlier ones are an H100's), with the CLI of
# 3c07445 from call A's bundle (the GPU code of this session's end; its changes are the CPU
# backend's). 1M x 128 Gaussian (seed 7), 10,000 queries (seed 8), L2, prepared filters:
#   - 10,000-query batches, k = 10, reused arrays, S = 0.001 and 0.01, two rounds;
#   - single queries (--batch 1 --nq 200), reused arrays, S = 0.001 and 0.01, three rounds;
#   - the results' share of a 10,000-query batch at k = 100 with reused arrays, under
#     HIVE_GPU_PROFILE=1 (one run; the batch lines' "results after them" over the wall).
set -u
rm -rf .gpu && tar -xJf .carry/bundle.tar.xz
. scripts/cuda-libs.sh
. .gpu/env
mkdir -p $OUT/b; w=/tmp/w; mkdir -p $w
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/b/gpu.txt
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
b() { timeout 120 hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs --columnar --reuse-results --json "$@"; }
b -k 10 --batch 1 --nq 20 > /dev/null 2>&1
for round in 1 2 3; do
  [ $round = 3 ] || b -k 10 --filter-selectivity 0.001,0.01 > $OUT/b/batch-$round.json 2> $OUT/b/batch-$round.err
  b -k 10 --batch 1 --nq 200 --filter-selectivity 0.001,0.01 > $OUT/b/one-$round.json 2> $OUT/b/one-$round.err
done
HIVE_GPU_PROFILE=1 b -k 100 > $OUT/b/share.json 2> $OUT/b/share.err
cd $OUT/b && for f in batch-*.json one-*.json share.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    r=lambda x: None if x is None else round(x,4)
    print('$f', m.get('k'), m.get('batch'), m.get('selectivity'), m.get('passing'), round(m.get('qps') or 0), r(m.get('p50_ms')), m.get('recall'))
" >> summary.txt; done
python3 - >> summary.txt <<'PY'
import re, statistics
shares = []
for line in open('share.err'):
    m = re.search(r'wall ([0-9.]+), .*results after them ([0-9.]+)', line)
    if m and 'batch of 10000' in line:
        shares.append(100 * float(m.group(2)) / float(m.group(1)))
if shares:
    s = shares[1:] or shares
    print('share of the wall, k=100 reused arrays: median %.2f%%, min %.2f, max %.2f, batches %d' % (statistics.median(s), min(s), max(s), len(s)))
PY
cat gpu.txt summary.txt; tar -cJf logs.tar.xz *.err *.json && rm -f *.err *.json; cd - > /dev/null
