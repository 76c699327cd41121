#!/usr/bin/env bash
# Call A (CLI of 54998fb): where a filtered 10k-query batch over few rows spends its time
# (HIVE_GPU_PROFILE, S = 0.001 and 0.01, k = 10), unprofiled QPS of the same, the results'
# share of a k = 100 batch over 1M with fresh against reused columnar arrays, and a single
# query's profile at S = 0.01. 1M x 128 Gaussian (seed 7), queries seed 8, L2.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/a && xz -dc .carry/cliA.xz > /tmp/hg/hive-gpu && chmod +x /tmp/hg/hive-gpu
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/a/gpu.txt
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
H=/tmp/hg/hive-gpu
G="--backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs --columnar --json"
# Warm the machine (first CUDA start compiles the kernels).
timeout 90 $H bench $G -k 10 --nq 1000 > /dev/null 2>&1
HIVE_GPU_PROFILE=1 timeout 90 $H bench $G -k 10 --filter-selectivity 0.001,0.01 > $OUT/a/prof-batch.json 2> $OUT/a/prof-batch.err
for r in 1 2; do
  timeout 90 $H bench $G -k 10 --filter-selectivity 0.001,0.01 > $OUT/a/batch-$r.json 2> $OUT/a/batch-$r.err
  timeout 90 $H bench $G -k 100 > $OUT/a/k100-fresh-$r.json 2> $OUT/a/k100-fresh-$r.err
  timeout 90 $H bench $G -k 100 --reuse-results > $OUT/a/k100-reuse-$r.json 2> $OUT/a/k100-reuse-$r.err
done
HIVE_GPU_PROFILE=1 timeout 90 $H bench $G -k 100 > /dev/null 2> $OUT/a/prof-k100-fresh.err
HIVE_GPU_PROFILE=1 timeout 90 $H bench $G -k 100 --reuse-results > /dev/null 2> $OUT/a/prof-k100-reuse.err
HIVE_GPU_PROFILE=1 timeout 90 $H bench $G -k 10 --batch 1 --nq 30 --filter-selectivity 0.01 > /dev/null 2> $OUT/a/prof-one.err
timeout 90 $H bench $G -k 10 --batch 1 --nq 100 --filter-selectivity 0.01 > $OUT/a/one.json 2> $OUT/a/one.err
cd $OUT/a && for f in batch-*.json k100-*.json one.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    r=lambda x: None if x is None else round(x,4)
    print('$f', m.get('k'), m.get('selectivity'), m.get('passing'), round(m.get('qps') or 0), r(m.get('p50_ms')), m.get('recall'))
" >> summary.txt; done
cat gpu.txt summary.txt
tar -cJf logs.tar.xz *.err *.json && rm -f *.err *.json && ls
