#!/usr/bin/env bash
# Call B (CLI of 54998fb): which knobs move a 10k-query batch at S = 0.01 (10,253 gathered rows
# of 1M x 128, k = 10, reused columnar arrays): the fused tensor-core filter on the gathered rows
# (HIVE_GPU_FUSED_MIN_WORK=1), TF32 GEMMs (--precision fast), piece sizes and workers.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/b && xz -dc .carry/cliA.xz > /tmp/hg/hive-gpu && chmod +x /tmp/hg/hive-gpu
. scripts/cuda-libs.sh
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
H=/tmp/hg/hive-gpu
G="--backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs --columnar --reuse-results --json -k 10 --filter-selectivity 0.001,0.01"
timeout 90 $H bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 10 --nq 1000 > /dev/null 2>&1
run() { name=$1; shift; env "$@" timeout 90 $H bench $G $PREC > $OUT/b/$name.json 2> $OUT/b/$name.err; }
for r in 1 2; do
  PREC=""
  run def-$r X=1
  run fused-$r HIVE_GPU_FUSED_MIN_WORK=1
  run p2000w4-$r HIVE_GPU_SMALL_PIECE_QUERIES=2000 HIVE_GPU_SMALL_PIECE_WORKERS=4
  run p512w8-$r HIVE_GPU_SMALL_PIECE_QUERIES=512
  run w12-$r HIVE_GPU_SMALL_PIECE_WORKERS=12
  PREC="--precision fast"
  run tf32-$r X=1
  run tf32fused-$r HIVE_GPU_FUSED_MIN_WORK=1
done
HIVE_GPU_PROFILE=1 HIVE_GPU_FUSED_MIN_WORK=1 timeout 90 $H bench $G > /dev/null 2> $OUT/b/prof-fused.err
cd $OUT/b && for f in *.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    r=lambda x: None if x is None else round(x,4)
    print('$f', m.get('selectivity'), m.get('passing'), round(m.get('qps') or 0), r(m.get('p50_ms')), m.get('recall'))
" >> summary.txt; done
cat summary.txt
tar -cJf logs.tar.xz *.err *.json && rm -f *.err *.json && ls
