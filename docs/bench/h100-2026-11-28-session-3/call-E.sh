#!/usr/bin/env bash
# Call E (CLI of 54998fb): the fused tensor-core filter over the 10,253 gathered rows of S = 0.01
# with a grid that fills the device (HIVE_GPU_FUSED_TILES=1 or 4 row tiles per block instead of
# 32: 24 blocks at 32), against the default tile path; 10k queries, k = 10, reused arrays.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/e && xz -dc .carry/cliA.xz > /tmp/hg/hive-gpu && chmod +x /tmp/hg/hive-gpu
. scripts/cuda-libs.sh
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
H=/tmp/hg/hive-gpu
G="--backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs --columnar --reuse-results --json -k 10 --filter-selectivity 0.01"
timeout 90 $H bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 10 --nq 1000 > /dev/null 2>&1
run() { name=$1; shift; env "$@" timeout 90 $H bench $G > $OUT/e/$name.json 2> $OUT/e/$name.err; }
for r in 1 2; do
  run def-$r X=1
  run fused1-$r HIVE_GPU_FUSED_MIN_WORK=1 HIVE_GPU_FUSED_TILES=1
  run fused4-$r HIVE_GPU_FUSED_MIN_WORK=1 HIVE_GPU_FUSED_TILES=4
  run fused1p2k-$r HIVE_GPU_FUSED_MIN_WORK=1 HIVE_GPU_FUSED_TILES=1 HIVE_GPU_SMALL_PIECE_QUERIES=2000 HIVE_GPU_SMALL_PIECE_WORKERS=5
done
HIVE_GPU_PROFILE=1 HIVE_GPU_FUSED_MIN_WORK=1 HIVE_GPU_FUSED_TILES=1 timeout 90 $H bench $G > /dev/null 2> $OUT/e/prof-fused1.err
cd $OUT/e && for f in *.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    r=lambda x: None if x is None else round(x,4)
    print('$f', m.get('selectivity'), m.get('passing'), round(m.get('qps') or 0), r(m.get('p50_ms')), m.get('recall'))
" >> summary.txt; done
grep "nq 1000 k 10" prof-fused1.err | tail -4 >> summary.txt
cat summary.txt
tar -cJf logs.tar.xz *.err *.json && rm -f *.err *.json && ls
