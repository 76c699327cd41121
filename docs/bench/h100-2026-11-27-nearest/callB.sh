#!/usr/bin/env bash
# FAISS part 2; IVF builds on CUDA with the kernel on and off (hive-gpu alone).
set -u
cp .faiss/part.ab /tmp/faiss/
mkdir -p $OUT/b
. scripts/cuda-libs.sh
w=/tmp/hive-ivf-bench; mkdir -p $w; [ -f $w/c_groundtruth.ivecs ] || python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/b/data.log 2>&1
for spec in "ivf-pq:nlist=1024,m=16,bits=8 nprobe=4,refine=8" "ivf-sq8:nlist=1024 nprobe=4,refine=2" "ivf-flat:nlist=1024 nprobe=4"; do
  set -- $spec
  for nk in 1 0; do
    n=$(echo $1 | cut -d: -f1)-nk$nk
    HIVE_GPU_NEAREST_KERNEL=$nk HIVE_GPU_PROFILE=1 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index $1 --search $2 --json > $OUT/b/$n.json 2> $OUT/b/$n.err
    echo "$n rc=$? $(head -c 700 $OUT/b/$n.json)" >> $OUT/b/summary.txt
  done
done
cd $OUT && tar -cJf b.tar.xz b && rm -rf b/*.err b/*.json; cat $OUT/b/summary.txt
