#!/usr/bin/env bash
# Call D: a single query's few-rows pass with the query in the launch's parameters
# (`hg_query_values`, no upload before the kernel) against the CLI of 54998fb (`old`, the
# query uploaded), alternating: prepared filters at S = 0.001 and 0.01 over 1M x 128 Gaussian
# (seed 7; queries seed 8; k = 10), unfiltered 10,000 x 128, and 2,700 x 768 (above the 256
# components a launch carries: still uploaded); ncu durations; then the filters, ties, gpu and
# conformance suites with CUDA and Vulkan required.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/d && tar -C /tmp/hg -xJf .carry/binsE.tar.xz && xz -dc .carry/cliA.xz > /tmp/hg/b/hive-gpu-old && chmod +x /tmp/hg/b/hive-gpu-old
for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/d/gpu.txt
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/s_base.fvecs --rows 10000 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/d_base.fvecs --rows 2700 --dim 768 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/d_query.fvecs --rows 200 --dim 768 --seed 8 > /dev/null 2>&1
b() { bin=$1; shift; timeout 90 /tmp/hg/b/$bin bench --backend cuda -k 10 --columnar --reuse-results --json --batch 1 --nq 200 "$@"; }
b hive-gpu --base $w/s_base.fvecs --query $w/g_query.fvecs --nq 20 > /dev/null 2>&1
for round in 1 2 3; do
  for v in new old; do
    bin=hive-gpu; [ $v = old ] && bin=hive-gpu-old
    b $bin --base $w/g_base.fvecs --query $w/g_query.fvecs --filter-selectivity 0.001,0.01 > $OUT/d/one-$v-$round.json 2> $OUT/d/one-$v-$round.err
    b $bin --base $w/s_base.fvecs --query $w/g_query.fvecs > $OUT/d/small-$v-$round.json 2> $OUT/d/small-$v-$round.err
    [ $round = 3 ] || b $bin --base $w/d_base.fvecs --query $w/d_query.fvecs > $OUT/d/d768-$v-$round.json 2> $OUT/d/d768-$v-$round.err
  done
done
timeout 100 ncu --kernel-name regex:"hg_few_topk" --launch-skip 500 --launch-count 10 --metrics gpu__time_duration.sum,launch__registers_per_thread --csv /tmp/hg/b/hive-gpu bench --backend cuda --base $w/s_base.fvecs --query $w/g_query.fvecs -k 10 --json --batch 1 --nq 20 > $OUT/d/ncu.csv 2>&1
cd $OUT/d && for f in one-*.json small-*.json d768-*.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    r=lambda x: None if x is None else round(x,4)
    print('$f', m.get('n'), m.get('dim'), m.get('selectivity'), m.get('passing'), round(m.get('qps') or 0), r(m.get('p50_ms')), r(m.get('p99_ms')), m.get('recall'))
" >> summary.txt; done
grep -E '"hg_few' ncu.csv | awk -F'","' '{print $5, $(NF-2), $NF}' | tail -6 >> summary.txt
cat gpu.txt summary.txt; cd - > /dev/null
(cd crates/hive-gpu
for t in filters ties gpu conformance; do
  HIVE_GPU_REQUIRE=cuda,vulkan timeout 260 /tmp/hg/b/$t --test-threads 4 > $OUT/d/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/d/test-$t.log)" | tee -a $OUT/d/summary.txt
  grep -E "^test .*FAILED|panicked" $OUT/d/test-$t.log | head -5
done)
cd $OUT/d && tar -cJf logs.tar.xz *.err *.log *.json ncu.csv && rm -f *.err *.log *.json ncu.csv && ls
