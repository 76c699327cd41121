#!/usr/bin/env bash
# Call B: the library's unit tests, filters, conformance and ivf on CUDA and Vulkan (this
# session's code: AVX2 exact lanes, byte test, allow-lists looked up on every core); then
# filters evaluated by every search call against prepared ones on CUDA (1M x 128 Gaussian,
# seed 7; 10,000 queries, seed 8; k = 10; columnar), batches and single queries.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/b && tar -C /tmp/hg -xJf .carry/binsB.tar.xz
for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/b/gpu.txt
w=/tmp/w; mkdir -p $w
(python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
 python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1) &
(cd crates/hive-gpu
for t in hive_gpu filters conformance ivf; do
  HIVE_GPU_REQUIRE=cuda,vulkan HIVE_GPU_LARGE=1 timeout 200 /tmp/hg/b/$t --test-threads 4 > $OUT/b/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/b/test-$t.log)" >> $OUT/b/summary.txt
done)
wait
S=0.001,0.01,0.1,0.5,0.9
b() { timeout 100 /tmp/hg/b/hive-gpu bench --base $w/g_base.fvecs --query $w/g_query.fvecs -k 10 --columnar --json --filter-selectivity $S "$@"; }
b --backend cuda > $OUT/b/batch-prepared.json 2> $OUT/b/batch-prepared.err
b --backend cuda --filter-per-search > $OUT/b/batch-per-search.json 2> $OUT/b/batch-per-search.err
b --backend cuda --batch 1 --nq 100 > $OUT/b/one-prepared.json 2> $OUT/b/one-prepared.err
b --backend cuda --batch 1 --nq 100 --filter-per-search > $OUT/b/one-per-search.json 2> $OUT/b/one-per-search.err
cd $OUT/b && for f in *.json; do python3 -c "
import json,sys
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    print('$f', m.get('selectivity'), m.get('filter_prepared'), m.get('passing'), round(m.get('qps',0)), round(m.get('p50_ms'),3), m.get('recall'))
" >> summary.txt; done; cat gpu.txt summary.txt
