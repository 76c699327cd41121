#!/usr/bin/env bash
# Call 6: this session's CLI against b175189's (/tmp/old, call 3):
#   f) issue 19's filtered batches over 1M x 128 Gaussian (S = 0.001 and 0.01, 10,000 queries,
#      k = 10, reused arrays): old, new, and new with the fused filter from 1e7 rows x queries
#      (HIVE_GPU_FUSED_MIN_WORK, so S = 0.01's pieces of 1,000 x 10,253 take it), two rounds;
#   p) where a 1,000-query batch over 100k x 128 goes, old and new (HIVE_GPU_PROFILE=1).
set -u
rm -rf .gpu && tar -xJf .carry/bundle.tar.xz
. scripts/cuda-libs.sh
. .gpu/env
mkdir -p $OUT/f $OUT/p; w=/tmp/w; mkdir -p $w
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
start=$(date +%s)
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
fb() { timeout 90 "$@" bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs --columnar --reuse-results --json -k 10 --filter-selectivity 0.001,0.01; }
for round in 1 2; do
  fb /tmp/old/hive-gpu > $OUT/f/old-$round.json 2>/dev/null
  fb hive-gpu > $OUT/f/new-$round.json 2>/dev/null
  HIVE_GPU_FUSED_MIN_WORK=10000000 fb hive-gpu > $OUT/f/new-fused-$round.json 2>/dev/null
done
echo "filters $(( $(date +%s) - start ))s" >> $OUT/summary.txt
python3 -c "
import numpy as np, sys
sys.path.insert(0, 'scripts')
from bench_cpu_peers import write_vecs
g = np.random.default_rng(5)
write_vecs('$w/u_base.fvecs', g.random((100000, 128), dtype=np.float32))
write_vecs('$w/u_query.fvecs', g.random((1000, 128), dtype=np.float32))
"
for who in old:/tmp/old/hive-gpu new:hive-gpu; do
  HIVE_GPU_PROFILE=1 timeout 60 ${who#*:} bench --backend cuda --base $w/u_base.fvecs --query $w/u_query.fvecs --columnar --json -k 10 --batch 1000 --nq 1000 > $OUT/p/${who%%:*}.json 2> $OUT/p/${who%%:*}.err
done
echo "profiles $(( $(date +%s) - start ))s" >> $OUT/summary.txt
cd $OUT/f && for f in *.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    print('$f', m.get('batch'), m.get('selectivity'), m.get('passing'), round(m.get('qps') or 0), m.get('recall'))
" >> ../summary.txt; done; cd - > /dev/null
cat $OUT/summary.txt; tail -n 25 $OUT/p/new.err
