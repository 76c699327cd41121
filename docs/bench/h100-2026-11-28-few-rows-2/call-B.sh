#!/usr/bin/env bash
# Call B: where a single query over few rows spends its time. Three CLI builds alternate in one
# lease: P (commit 5bb2408, last session's pass), A (call A's code: the heads in one run, the
# query and removed bits loaded up front), B (A with the query written beside the lists in
# mapped host memory, no upload); `old` is B with HIVE_GPU_FEW_VALUES=0 (the scan path).
# Prepared filters at S = 0.001 and 0.01 over 1M x 128 Gaussian (seed 7; queries seed 8;
# k = 10) and unfiltered 10,000 x 128; B's profile; an nsys trace of B and P (API calls, copies
# and kernels); ncu stall reasons of the pass; a 10k-query batch at k = 100 as lists and as
# columns.
set -u
mkdir -p $OUT/b && tar -C /tmp -xJf .carry/varB.tar.xz && cp /tmp/var/hive-gpu-* /tmp/
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/b/gpu.txt
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/s_base.fvecs --rows 10000 > /dev/null 2>&1
b() { v=$1; shift; timeout 60 /tmp/hive-gpu-$v bench --backend cuda --query $w/g_query.fvecs -k 10 --columnar --json --batch 1 "$@"; }
for round in 1 2 3; do
  for v in P A B old; do
    bin=$v; if [ $v = old ]; then bin=B; export HIVE_GPU_FEW_VALUES=0; else unset HIVE_GPU_FEW_VALUES; fi
    b $bin --nq 100 --base $w/g_base.fvecs --filter-selectivity 0.001,0.01 > $OUT/b/one-$v-$round.json 2> $OUT/b/one-$v-$round.err
    b $bin --nq 100 --base $w/s_base.fvecs > $OUT/b/small-$v-$round.json 2> $OUT/b/small-$v-$round.err
  done
done
unset HIVE_GPU_FEW_VALUES
HIVE_GPU_PROFILE=1 b B --nq 20 --base $w/g_base.fvecs --filter-selectivity 0.01 > /dev/null 2> $OUT/b/prof.err
if command -v nsys > /dev/null; then
  for v in B P; do
    timeout 120 nsys profile --trace=cuda --sample=none --cpuctxsw=none -o /tmp/r$v /tmp/hive-gpu-$v bench --backend cuda --query $w/g_query.fvecs -k 10 --json --batch 1 --nq 20 --base $w/s_base.fvecs > $OUT/b/nsys-$v.log 2>&1
    nsys stats --report cuda_api_trace --report cuda_gpu_trace --format csv --output /tmp/s$v /tmp/r$v.nsys-rep >> $OUT/b/nsys-$v.log 2>&1
    for f in /tmp/s${v}_cuda_api_trace.csv /tmp/s${v}_cuda_gpu_trace.csv; do [ -f $f ] && tail -400 $f > $OUT/b/$(basename $f); done
  done
else echo "no nsys" > $OUT/b/nsys.log; fi
m=smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_wait_per_warp_active.pct,smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct,smsp__warp_issue_stalled_membar_per_warp_active.pct,smsp__warp_issue_stalled_drain_per_warp_active.pct,smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct,smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,smsp__warp_issue_stalled_no_instruction_per_warp_active.pct,smsp__warp_issue_stalled_not_selected_per_warp_active.pct,smsp__warp_issue_stalled_selected_per_warp_active.pct,smsp__warp_issue_stalled_branch_resolving_per_warp_active.pct,smsp__warp_issue_stalled_dispatch_stall_per_warp_active.pct,smsp__cycles_active.avg,sm__cycles_elapsed.max,gpu__time_duration.sum,smsp__inst_executed.sum
timeout 120 ncu --kernel-name regex:"hg_few_topk" --launch-skip 500 --launch-count 2 --metrics $m /tmp/hive-gpu-B bench --backend cuda --base $w/s_base.fvecs --query $w/g_query.fvecs -k 10 --json --batch 1 --nq 20 > $OUT/b/ncu.txt 2>&1
for round in 1 2; do
  timeout 90 /tmp/hive-gpu-B bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 100 --columnar --json > $OUT/b/col-$round.json 2> $OUT/b/col-$round.err
  timeout 90 /tmp/hive-gpu-B bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 100 --json > $OUT/b/lists-$round.json 2> $OUT/b/lists-$round.err
done
HIVE_GPU_PROFILE=1 timeout 90 /tmp/hive-gpu-B bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 100 --columnar --json > $OUT/b/col-prof.json 2> $OUT/b/col-prof.err
cd $OUT/b && for f in one-*.json small-*.json col-*.json lists-*.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    r=lambda x: None if x is None else round(x,4)
    print('$f', m.get('n'), m.get('nq'), m.get('batch'), m.get('results'), m.get('selectivity'), m.get('passing'), round(m.get('qps') or 0), r(m.get('p50_ms')), r(m.get('p99_ms')), m.get('recall'))
" >> summary.txt; done
grep "few rows" prof.err | sort | uniq -c | sort -rn | head -5 >> summary.txt
grep "batch of" col-prof.err | tail -8 >> summary.txt
grep -E "stalled|cycles|duration|inst_executed" ncu.txt | tail -36 >> summary.txt
cat gpu.txt summary.txt; tar -cJf logs.tar.xz *.err *.log *.json ncu.txt *.csv 2>/dev/null; rm -f *.err *.log *.json ncu.txt *.csv; ls
