#!/usr/bin/env bash
# Device: filtered 10k batches at S = 0.001 / 0.01 under piece and fused-filter knobs (issue 19).
cd "$(dirname "$0")/.."
xz -dc .carry/hive.xz > /tmp/hive && chmod +x /tmp/hive
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/gpu.txt
python3 scripts/make_gaussian_fvecs.py /tmp/base.fvecs --rows 1000000 --seed 7 > /dev/null
python3 scripts/make_gaussian_fvecs.py /tmp/q.fvecs --rows 10000 --seed 8 > /dev/null
A="bench --base /tmp/base.fvecs --query /tmp/q.fvecs --backend cuda -k 10 --json"
run() { # name, env..., then -- extra args
  local name=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 120 /tmp/hive $A "$@" > $OUT/$name.jsonl 2> $OUT/$name.err
  echo "$name rc=$? $(python3 -c "
import json,sys
for l in open('$OUT/$name.jsonl'):
    r=json.loads(l); print('S=%s %s qps=%d p50=%.3f recall=%s' % (r['selectivity'], r['results'], r['qps'], r['p50_ms'], r['recall']), end='; ')
")" | tee -a $OUT/summary.txt
}
S=--filter-selectivity=0.001,0.01
run default X=1 -- $S
run default-col X=1 -- $S --columnar
run nofilter X=1 --
run nofilter-col X=1 -- --columnar
run w8 HIVE_GPU_PIECE_WORKERS=8 -- $S --columnar
run q1024w8 HIVE_GPU_PIECE_QUERIES=1024 HIVE_GPU_PIECE_WORKERS=8 -- $S --columnar
run q1024w4 HIVE_GPU_PIECE_QUERIES=1024 HIVE_GPU_PIECE_WORKERS=4 -- $S --columnar
run q512w8 HIVE_GPU_PIECE_QUERIES=512 HIVE_GPU_PIECE_WORKERS=8 -- $S --columnar
run fused HIVE_GPU_FUSED_MIN_WORK=1 -- $S --columnar
run fused-q1024w8 HIVE_GPU_FUSED_MIN_WORK=1 HIVE_GPU_PIECE_QUERIES=1024 HIVE_GPU_PIECE_WORKERS=8 -- $S --columnar
run whole HIVE_GPU_PIECE_WORKERS=1 -- $S --columnar
run prof-w1 HIVE_GPU_PROFILE=1 HIVE_GPU_PIECE_WORKERS=1 -- --filter-selectivity=0.001 --columnar
run prof-fused-w1 HIVE_GPU_PROFILE=1 HIVE_GPU_FUSED_MIN_WORK=1 HIVE_GPU_PIECE_WORKERS=1 -- --filter-selectivity=0.001 --columnar
run default-col2 X=1 -- $S --columnar
run nofilter-col2 X=1 -- --columnar
cd $OUT && for f in *.err; do xz -9 $f; done
