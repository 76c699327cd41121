#!/usr/bin/env bash
# Call H: the tile selection's first bound from each warp's k-th smallest (hg_block_kth_bound)
# instead of ranking every thread's minimum against the whole block's. `new` this code, `old`
# the CLI of 54998fb, alternating: 10k-query batches over the gathered rows of S = 0.001 and
# 0.01 of 1M x 128 (k = 10 and 100, reused arrays) and over a 10,000-row collection; then the
# conformance, filters and primitives suites with CUDA and Vulkan required.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/h && tar -C /tmp/hg -xJf .carry/binsH.tar.xz && xz -dc .carry/cliA.xz > /tmp/hg/b/hive-gpu-old && chmod +x /tmp/hg/b/hive-gpu-old
for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
. scripts/cuda-libs.sh
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/s_base.fvecs --rows 10000 > /dev/null 2>&1
b() { bin=$1; shift; timeout 90 /tmp/hg/b/$bin bench --backend cuda --columnar --reuse-results --json --query $w/g_query.fvecs "$@"; }
b hive-gpu --base $w/s_base.fvecs --nq 1000 > /dev/null 2>&1
for round in 1 2; do
  for v in new old; do
    bin=hive-gpu; [ $v = old ] && bin=hive-gpu-old
    b $bin --base $w/g_base.fvecs --ks 10,100 --filter-selectivity 0.001,0.01 > $OUT/h/batch-$v-$round.json 2> $OUT/h/batch-$v-$round.err
    b $bin --base $w/s_base.fvecs -k 10 > $OUT/h/small-$v-$round.json 2> $OUT/h/small-$v-$round.err
  done
done
cd $OUT/h && for f in batch-*.json small-*.json; do python3 -c "
import json
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    r=lambda x: None if x is None else round(x,4)
    print('$f', m.get('n'), m.get('k'), m.get('selectivity'), m.get('passing'), round(m.get('qps') or 0), r(m.get('p50_ms')), m.get('recall'))
" >> summary.txt; done
cat summary.txt; cd - > /dev/null
(cd crates/hive-gpu
for t in primitives filters conformance; do
  HIVE_GPU_REQUIRE=cuda,vulkan timeout 230 /tmp/hg/b/$t --test-threads 4 > $OUT/h/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/h/test-$t.log)" | tee -a $OUT/h/summary.txt
  grep -E "^test .*FAILED|panicked" $OUT/h/test-$t.log | head -5
done)
cd $OUT/h && tar -cJf logs.tar.xz *.err *.log *.json && rm -f *.err *.log *.json && ls
