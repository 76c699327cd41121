#!/usr/bin/env bash
# FAISS part 1; the CLI; the data; k-means on CUDA profiled and the kernel on/off alternating.
set -u
mkdir -p /tmp/faiss /tmp/hg/b $OUT/a && cp .faiss/part.aa /tmp/faiss/
xz -dc .carry/hive.xz > /tmp/hg/b/hive-gpu && chmod +x /tmp/hg/b/hive-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpu.txt 2>&1
. scripts/cuda-libs.sh
python3 scripts/make_clustered_fvecs.py /tmp/hive-ivf-bench/c --rows 1000000 --queries 10000 > $OUT/a/data-clustered.log 2>&1 &
mkdir -p /tmp/hive-kmeans-bench && python3 scripts/make_gaussian_fvecs.py /tmp/hive-kmeans-bench/base.fvecs > $OUT/a/data-gauss.log 2>&1
k() { /tmp/hg/b/hive-gpu kmeans --backend cuda --base /tmp/hive-kmeans-bench/base.fvecs --clusters 1024 "$@"; }
HIVE_GPU_PROFILE=1 k > $OUT/a/kmeans-prof.out 2> $OUT/a/kmeans-prof.err
echo "kmeans profiled: $(tail -1 $OUT/a/kmeans-prof.out)" >> $OUT/a/summary.txt
for r in 1 2; do for nk in 1 0; do
  HIVE_GPU_NEAREST_KERNEL=$nk k > $OUT/a/km-nk$nk-r$r.out 2>&1
  echo "kmeans nk=$nk r=$r: $(tail -1 $OUT/a/km-nk$nk-r$r.out)" >> $OUT/a/summary.txt
done; done
wait
cd $OUT && tar -cJf a.tar.xz a && rm -rf a/*.err a/*.log a/km-*; cat $OUT/a/summary.txt
