#!/usr/bin/env bash
# Call A: filters evaluated by every search call (`--filter-per-search`) against prepared ones,
# CUDA, 1M x 128 Gaussian (seed 7), 10,000 queries (seed 8), k = 10, columnar results; single
# queries too. Then the library's unit tests, filters, conformance and ivf on CUDA and Vulkan.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/a && tar -C /tmp/hg -xJf .carry/binsA.tar.xz
for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpu.txt
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
S=0.001,0.01,0.1,0.5,0.9
b() { /tmp/hg/b/hive-gpu bench --base $w/g_base.fvecs --query $w/g_query.fvecs -k 10 --columnar --json --filter-selectivity $S "$@"; }
for r in 1 2; do
  b --backend cuda > $OUT/a/batch-prepared-$r.json 2> $OUT/a/batch-prepared-$r.err
  b --backend cuda --filter-per-search > $OUT/a/batch-per-search-$r.json 2> $OUT/a/batch-per-search-$r.err
done
b --backend cuda --batch 1 --nq 300 > $OUT/a/one-prepared.json 2> $OUT/a/one-prepared.err
b --backend cuda --batch 1 --nq 300 --filter-per-search > $OUT/a/one-per-search.json 2> $OUT/a/one-per-search.err
cd crates/hive-gpu
for t in hive_gpu filters conformance ivf; do
  HIVE_GPU_REQUIRE=cuda,vulkan HIVE_GPU_LARGE=1 /tmp/hg/b/$t --test-threads 4 > $OUT/a/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/a/test-$t.log)" >> $OUT/a/summary.txt
done
cd $OUT/a && for f in *.json; do echo "== $f"; python3 -c "
import json,sys
for l in open('$f'):
    try: m=json.loads(l)
    except: continue
    print(m.get('selectivity'), m.get('filter_prepared'), m.get('passing'), round(m.get('qps',0)), m.get('p50_ms'), m.get('recall'))
"; done; cat summary.txt
