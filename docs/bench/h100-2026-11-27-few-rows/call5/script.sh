#!/usr/bin/env bash
# Device: batches over few rows, the finer-pieces rule on and off (issue 19; issue 22 small shapes).
cd "$(dirname "$0")/.."
xz -dc .carry/hive.xz > /tmp/hive && chmod +x /tmp/hive
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/gpu.txt
for n in 1000000 100000 50000 10000; do python3 scripts/make_gaussian_fvecs.py /tmp/base$n.fvecs --rows $n --seed 7 > /dev/null; done
python3 scripts/make_gaussian_fvecs.py /tmp/q.fvecs --rows 10000 --seed 8 > /dev/null
run() { # name, env..., then -- args
  local name=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 150 /tmp/hive bench --query /tmp/q.fvecs --backend cuda --json "$@" > $OUT/$name.jsonl 2> $OUT/$name.err
  echo "$name rc=$? $(python3 -c "
import json,sys
for l in open('$OUT/$name.jsonl'):
    r=json.loads(l); print('n=%d nq=%d k=%d S=%s %s qps=%d p50=%.3f recall=%s' % (r['n'], r['nq'], r['k'], r['selectivity'], r['results'], r['qps'], r['p50_ms'], r['recall']), end='; ')
")" | tee -a $OUT/summary.txt
}
B=--base=/tmp/base1000000.fvecs
S=--filter-selectivity=0.001,0.01
for round in 1 2; do
run on-col$round X=1 -- $B -k 10 $S --columnar
run inline-col$round HIVE_GPU_PREPARE_PARALLEL_QUERIES=1025 -- $B -k 10 $S --columnar
run off-col$round HIVE_GPU_SMALL_SEARCH_ROWS=0 -- $B -k 10 $S --columnar
done
run inline-lists HIVE_GPU_PREPARE_PARALLEL_QUERIES=1025 -- $B -k 10 $S
run on-lists X=1 -- $B -k 10 $S
run off-lists HIVE_GPU_SMALL_SEARCH_ROWS=0 -- $B -k 10 $S
run k100 X=1 -- $B -k 100 $S --columnar
for n in 10000 50000; do
  run n$n X=1 -- --base=/tmp/base$n.fvecs -k 10 --columnar
  run n$n-inline HIVE_GPU_PREPARE_PARALLEL_QUERIES=1025 -- --base=/tmp/base$n.fvecs -k 10 --columnar
  run n$n-off HIVE_GPU_SMALL_SEARCH_ROWS=0 -- --base=/tmp/base$n.fvecs -k 10 --columnar
done
run nq1000 X=1 -- $B -k 10 --nq 1000 --columnar
run nq1000-inline HIVE_GPU_PREPARE_PARALLEL_QUERIES=1025 -- $B -k 10 --nq 1000 --columnar
run prof-inline HIVE_GPU_PROFILE=1 HIVE_GPU_PREPARE_PARALLEL_QUERIES=1025 -- $B -k 10 --filter-selectivity=0.001 --columnar
cd $OUT && tar -cf all.tar *.jsonl *.err && xz -9 all.tar && rm -f *.jsonl *.err
