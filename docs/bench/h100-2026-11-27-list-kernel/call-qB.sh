#!/usr/bin/env bash
# FAISS part 2; the clustered 10M x 128 set; a profile of one 10k batch (whole) at nprobe 4.
set -u
mkdir -p /tmp/faiss $OUT/b && cp .faiss/part.ab /tmp/faiss/
. scripts/cuda-libs.sh
w=/tmp/hive-ivf-bench
HIVE_GPU_PROFILE=1 HIVE_GPU_PIECE_QUERIES=10000 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --search nprobe=4 --json > $OUT/b/whole.json 2> $OUT/b/whole.err
grep -v "nearest\|k-means\|nq 262144\|nq 16[0-9] " $OUT/b/whole.err | tail -12
mkdir -p /tmp/w10 && s=$(date +%s)
timeout 300 python3 scripts/make_clustered_fvecs.py /tmp/w10/c --rows 10000000 --queries 10000 > $OUT/b/data10m.log 2>&1
echo "data rc=$? $(( $(date +%s) - s ))s"; ls -la /tmp/w10
cd $OUT && xz b/whole.err
