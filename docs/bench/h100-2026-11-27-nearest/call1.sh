#!/usr/bin/env bash
# Device call 1: FAISS part 1, the CUDA tests of the nearest-row kernel, the data of call 3.
set -u
mkdir -p /tmp/faiss && cp .faiss/part.aa /tmp/faiss/
mkdir -p /tmp/hg && tar -C /tmp/hg -xJf .carry/bins.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
. scripts/cuda-libs.sh
export HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1
( python3 scripts/make_clustered_fvecs.py /tmp/hive-ivf-bench/c --rows 1000000 --queries 10000 > $OUT/data-clustered.log 2>&1
  mkdir -p /tmp/hive-kmeans-bench && python3 scripts/make_gaussian_fvecs.py /tmp/hive-kmeans-bench/base.fvecs > $OUT/data-gauss.log 2>&1 ) &
cd crates/hive-gpu
for t in primitives kmeans ivf; do
  s=$(date +%s); timeout 300 /tmp/hg/b/$t > $OUT/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s ))s" >> $OUT/summary.txt
done
s=$(date +%s); timeout 200 /tmp/hg/b/hive_gpu nearest kmeans pq ivf > $OUT/lib.log 2>&1; echo "lib(nearest kmeans pq ivf) rc=$? $(( $(date +%s) - s ))s" >> $OUT/summary.txt
cd ../..
wait
# k-means on CUDA, the kernel against the exact k-NN for every point, alternating.
for r in 1 2; do for nk in 1 0; do
  HIVE_GPU_NEAREST_KERNEL=$nk HIVE_GPU_PROFILE=1 /tmp/hg/b/hive-gpu kmeans --backend cuda --base /tmp/hive-kmeans-bench/base.fvecs --clusters 1024 > $OUT/kmeans-nk$nk-r$r.out 2> $OUT/kmeans-nk$nk-r$r.err
  echo "kmeans nk=$nk r=$r: $(tail -1 $OUT/kmeans-nk$nk-r$r.out)" >> $OUT/summary.txt
done; done
cd $OUT && for f in *.err *.log; do xz -T4 $f; done; tar -cf all.tar *.xz && rm -f *.xz
cat $OUT/summary.txt
