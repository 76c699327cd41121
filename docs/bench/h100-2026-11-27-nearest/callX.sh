#!/usr/bin/env bash
# Nearest rows in pieces of a few dozen points on CUDA (the forced path), and k-means's tests.
set -u
mkdir -p /tmp/hg $OUT/x && tar -C /tmp/hg -xJf .carry/bins.tar.xz
. scripts/cuda-libs.sh
cd crates/hive-gpu
for t in primitives kmeans; do
  s=$(date +%s); HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1 timeout 200 /tmp/hg/b/$t > $OUT/x/$t.log 2>&1; rc=$?
  echo "$t rc=$rc $(( $(date +%s) - s ))s $(grep 'test result' $OUT/x/$t.log | tail -1)" | tee -a $OUT/x/summary.txt
done
HIVE_GPU_REQUIRE=cuda timeout 100 /tmp/hg/b/hive_gpu nearest tuning > $OUT/x/lib.log 2>&1; echo "lib rc=$? $(grep 'test result' $OUT/x/lib.log)" | tee -a $OUT/x/summary.txt
cd $OUT && xz -T4 x/*.log && tar -cf x.tar x
