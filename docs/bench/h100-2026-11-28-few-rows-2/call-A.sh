#!/usr/bin/env bash
# Call A: the few-rows pass with its heads in one run, the query and removed bits loaded up front
# and the query widened once (kernels/few.cu), against the scan path (HIVE_GPU_FEW_VALUES=0),
# alternating, on CUDA: prepared filters at S = 0.001 and 0.01 over 1M x 128 Gaussian (seed 7;
# queries seed 8; k = 10), unfiltered 10,000 x 128, and unfiltered 2,700 x 768 (rows above 128
# components, the pass's first measurement there); ncu sections of the pass; a 10k-query
# columnar batch at k = 100 over 1M x 128 with HIVE_GPU_PROFILE (where its wall time goes);
# then the conformance, filters, ties and gpu suites with CUDA and Vulkan required.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/a && tar -C /tmp/hg -xJf .carry/binsA.tar.xz
for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpu.txt
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/s_base.fvecs --rows 10000 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/d_base.fvecs --rows 2700 --dim 768 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/d_query.fvecs --rows 200 --dim 768 --seed 8 > /dev/null 2>&1
b() { timeout 60 /tmp/hg/b/hive-gpu bench --backend cuda -k 10 --columnar --json --batch 1 --nq 100 "$@"; }
for round in 1 2; do
  for v in new old; do
    if [ $v = old ]; then export HIVE_GPU_FEW_VALUES=0; else unset HIVE_GPU_FEW_VALUES; fi
    b --base $w/g_base.fvecs --query $w/g_query.fvecs --filter-selectivity 0.001,0.01 > $OUT/a/one-$v-$round.json 2> $OUT/a/one-$v-$round.err
    b --base $w/s_base.fvecs --query $w/g_query.fvecs > $OUT/a/small-$v-$round.json 2> $OUT/a/small-$v-$round.err
    b --base $w/d_base.fvecs --query $w/d_query.fvecs > $OUT/a/d768-$v-$round.json 2> $OUT/a/d768-$v-$round.err
  done
done
unset HIVE_GPU_FEW_VALUES
HIVE_GPU_PROFILE=1 b --nq 20 --base $w/g_base.fvecs --query $w/g_query.fvecs --filter-selectivity 0.01 > /dev/null 2> $OUT/a/prof.err
# The pass's stalls (ncu sections; base clocks, caches flushed).
timeout 150 ncu --kernel-name regex:"hg_few_topk" --launch-skip 1000 --launch-count 3 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 10 --json --batch 1 --nq 20 --filter-selectivity 0.01 > $OUT/a/ncu.txt 2>&1
# Columnar results of a 10k batch at k = 100: QPS with and without columns, then the profile.
for round in 1 2; do
  timeout 90 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 100 --columnar --json > $OUT/a/col-$round.json 2> $OUT/a/col-$round.err
  timeout 90 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 100 --json > $OUT/a/lists-$round.json 2> $OUT/a/lists-$round.err
done
HIVE_GPU_PROFILE=1 timeout 90 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 100 --columnar --json > $OUT/a/col-prof.json 2> $OUT/a/col-prof.err
(cd $OUT/a && for f in one-*.json small-*.json d768-*.json col-*.json lists-*.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    print('$f', m.get('n'), m.get('dim'), m.get('nq'), m.get('selectivity'), m.get('passing'), round(m.get('qps',0)), round(m.get('p50_ms'),4), round(m.get('p99_ms'),4), m.get('recall'))
" >> summary.txt; done
grep "few rows\|Scan" prof.err | sort | uniq -c | sort -rn | head -5 >> summary.txt
grep "batch of" col-prof.err | tail -8 >> summary.txt
grep -E "Duration|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|Memory Throughput|DRAM Throughput|Block Limit" ncu.txt | head -40 >> summary.txt)
cat $OUT/a/gpu.txt $OUT/a/summary.txt
(cd crates/hive-gpu
for t in filters ties gpu conformance; do
  HIVE_GPU_REQUIRE=cuda,vulkan timeout 240 /tmp/hg/b/$t --test-threads 4 > $OUT/a/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/a/test-$t.log)" | tee -a $OUT/a/summary.txt
  grep -E "^test .*FAILED|panicked" $OUT/a/test-$t.log | head -5
done)
cd $OUT/a && tar -cJf logs.tar.xz *.err *.log ncu.txt && rm -f *.err *.log *.json && ls
