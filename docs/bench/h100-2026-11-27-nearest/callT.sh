#!/usr/bin/env bash
# The CUDA tests of the final code (CPU and CUDA; HIVE_GPU_REQUIRE=cuda), then the data of call M.
set -u
mkdir -p /tmp/hg $OUT/t && tar -C /tmp/hg -xJf .carry/bins.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/t/gpu.txt 2>&1
. scripts/cuda-libs.sh
export HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1
w=/tmp/hive-ivf-bench; mkdir -p $w
python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/t/data.log 2>&1 &
cd crates/hive-gpu
for t in primitives kmeans ivf persistence streaming multi hive_gpu; do
  s=$(date +%s); timeout 200 /tmp/hg/b/$t > $OUT/t/$t.log 2>&1; rc=$?
  echo "$t rc=$rc $(( $(date +%s) - s ))s $(grep 'test result' $OUT/t/$t.log | tail -1)" | tee -a $OUT/t/summary.txt
done
wait
cd $OUT && xz -T4 t/*.log && tar -cf t.tar t && rm -f t/*.xz
