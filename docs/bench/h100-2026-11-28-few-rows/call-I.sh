#!/usr/bin/env bash
# Call I (after call H: the host reads each block's list only up to the k-th least head): one exact pass for a single query over few rows (kernels/few.cu) against the scan
# path (HIVE_GPU_FEW_VALUES=0), alternating, on CUDA: prepared filters at S = 0.001 and 0.01
# over 1M x 128 Gaussian (seed 7; queries seed 8; k = 10), and unfiltered 10,000 x 128;
# then the conformance, filters, ties and gpu suites with CUDA and Vulkan required.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/i && tar -C /tmp/hg -xJf .carry/binsI.tar.xz
for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/i/gpu.txt
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/s_base.fvecs --rows 10000 > /dev/null 2>&1
b() { timeout 60 /tmp/hg/b/hive-gpu bench --backend cuda --query $w/g_query.fvecs -k 10 --columnar --json --batch 1 --nq 100 "$@"; }
for round in 1 2; do
  for v in new old; do
    if [ $v = old ]; then export HIVE_GPU_FEW_VALUES=0; else unset HIVE_GPU_FEW_VALUES; fi
    b --base $w/g_base.fvecs --filter-selectivity 0.001,0.01 > $OUT/i/one-$v-$round.json 2> $OUT/i/one-$v-$round.err
    b --base $w/s_base.fvecs > $OUT/i/small-$v-$round.json 2> $OUT/i/small-$v-$round.err
  done
done
unset HIVE_GPU_FEW_VALUES
HIVE_GPU_PROFILE=1 timeout 60 /tmp/hg/b/hive-gpu bench --backend cuda --query $w/g_query.fvecs -k 10 --columnar --json --batch 1 --nq 20 --base $w/g_base.fvecs --filter-selectivity 0.01 > /dev/null 2> $OUT/i/prof.err
(cd $OUT/i && for f in one-*.json small-*.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    print('$f', m.get('n'), m.get('selectivity'), m.get('passing'), round(m.get('qps',0)), round(m.get('p50_ms'),4), round(m.get('p99_ms'),4), m.get('recall'))
" >> summary.txt; done; grep "few rows\|Scan" prof.err | sort | uniq -c | sort -rn | head -5 >> summary.txt)
cat $OUT/i/gpu.txt $OUT/i/summary.txt
(cd crates/hive-gpu
for t in filters ties gpu conformance; do
  HIVE_GPU_REQUIRE=cuda,vulkan timeout 240 /tmp/hg/b/$t --test-threads 4 > $OUT/i/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/i/test-$t.log)" | tee -a $OUT/i/summary.txt
  grep -E "^test .*FAILED|panicked" $OUT/i/test-$t.log | head -5
done)
cd $OUT/i && tar -cJf logs.tar.xz *.err *.log && rm -f *.err *.log one-*.json small-*.json && ls
