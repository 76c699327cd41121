#!/usr/bin/env bash
# The review mends on CUDA: the nearest-row tests, k-means with the kernel on and off.
set -u
mkdir -p /tmp/hg $OUT/w && tar -C /tmp/hg -xJf .carry/bins.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/w/gpu.txt 2>&1
. scripts/cuda-libs.sh
mkdir -p /tmp/km && python3 scripts/make_gaussian_fvecs.py /tmp/km/base.fvecs > $OUT/w/data.log 2>&1 &
( cd crates/hive-gpu
  for t in primitives kmeans ivf; do
    s=$(date +%s); HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1 timeout 200 /tmp/hg/b/$t > $OUT/w/$t.log 2>&1; rc=$?
    echo "$t rc=$rc $(( $(date +%s) - s ))s $(grep 'test result' $OUT/w/$t.log | tail -1)" | tee -a $OUT/w/summary.txt
  done
  HIVE_GPU_REQUIRE=cuda timeout 100 /tmp/hg/b/hive_gpu nearest kmeans pq > $OUT/w/lib.log 2>&1; echo "lib rc=$? $(grep 'test result' $OUT/w/lib.log)" | tee -a $OUT/w/summary.txt )
wait
for nk in 1 0 1; do
  HIVE_GPU_NEAREST_KERNEL=$nk HIVE_GPU_PROFILE=1 /tmp/hg/b/hive-gpu kmeans --backend cuda --base /tmp/km/base.fvecs --clusters 1024 > $OUT/w/km-nk$nk.out 2>> $OUT/w/km-nk$nk.err
  echo "kmeans nk=$nk: $(tail -1 $OUT/w/km-nk$nk.out)" | tee -a $OUT/w/summary.txt
done
grep -h "nearest rows" $OUT/w/km-nk1.err | tail -3
cd $OUT && xz -T4 w/*.log w/*.err && tar -cf w.tar w
