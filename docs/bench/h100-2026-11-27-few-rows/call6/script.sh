#!/usr/bin/env bash
# Device: the changed code's CUDA tests (named binaries), then optionally the few-rows benchmark.
cd "$(dirname "$0")/.."
mkdir -p /tmp/tb && xz -dc .carry/tb.tar.xz | tar -xf - -C /tmp/tb
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/gpu.txt
export HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1
started=$(date +%s); budget=${BUDGET:-500}
for name in $TESTS; do
  exe=$(ls /tmp/tb/$name-* | head -1)
  left=$(( budget - ($(date +%s) - started) ))
  if [ $left -lt 20 ]; then echo "$name NOT RUN (time)" | tee -a $OUT/summary.txt; continue; fi
  t0=$(date +%s)
  (cd crates/hive-gpu && timeout $left $exe > $OUT/$name.log 2>&1); rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s $(grep -E "^test result" $OUT/$name.log | tail -1)" | tee -a $OUT/summary.txt
done
if [ -n "$BENCH" ]; then
  for n in 1000000 10000; do python3 scripts/make_gaussian_fvecs.py /tmp/base$n.fvecs --rows $n --seed 7 > /dev/null; done
  python3 scripts/make_gaussian_fvecs.py /tmp/q.fvecs --rows 10000 --seed 8 > /dev/null
  run() { local name=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    env "${envs[@]}" timeout 150 /tmp/tb/hive-gpu bench --query /tmp/q.fvecs --backend cuda --json "$@" > $OUT/$name.jsonl 2> $OUT/$name.err
    echo "$name rc=$? $(python3 -c "
import json
for l in open('$OUT/$name.jsonl'):
    r=json.loads(l); print('n=%d nq=%d k=%d S=%s %s qps=%d p50=%.3f recall=%s' % (r['n'], r['nq'], r['k'], r['selectivity'], r['results'], r['qps'], r['p50_ms'], r['recall']), end='; ')
")" | tee -a $OUT/summary.txt; }
  B=--base=/tmp/base1000000.fvecs; S=--filter-selectivity=0.001,0.01,0.1
  for round in 1 2; do
    run new-col$round X=1 -- $B -k 10 $S --columnar
    run off-col$round HIVE_GPU_SMALL_SEARCH_ROWS=0 -- $B -k 10 $S --columnar
    run new-lists$round X=1 -- $B -k 10 $S
    run off-lists$round HIVE_GPU_SMALL_SEARCH_ROWS=0 -- $B -k 10 $S
  done
  run new-k100 X=1 -- $B -k 100 --filter-selectivity=0.001,0.01 --columnar
  run n10000 X=1 -- --base=/tmp/base10000.fvecs -k 10 --columnar
  run n10000-off HIVE_GPU_SMALL_SEARCH_ROWS=0 -- --base=/tmp/base10000.fvecs -k 10 --columnar
  run one X=1 -- $B -k 10 --batch 1 --nq 300 --filter-selectivity=0.001,0.01
fi
cd $OUT && tar -cf all.tar $(ls *.log *.jsonl *.err 2>/dev/null) && xz -9 all.tar && rm -f *.log *.jsonl *.err
