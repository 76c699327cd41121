#!/usr/bin/env bash
# FAISS part 3 and setup; the builds and searches against FAISS GPU in the same run.
set -u
cp .faiss/part.ac .faiss/*.whl /tmp/faiss/ && bash .faiss/device-setup.sh > $OUT/faiss-setup.log 2>&1
mkdir -p .gpu $OUT/c && echo 'export PATH=/tmp/hg/b:$PATH' > .gpu/env
. scripts/cuda-libs.sh; . .gpu/env; . /tmp/faiss/env.sh
w=/tmp/hive-ivf-bench
p() { python3 scripts/bench_ivf_peers.py --hive-bin /tmp/hg/b/hive-gpu --backend cuda --faiss-gpu --threads 16 \
  --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs --nlist 1024 "$@"; }
for r in 1 2; do
  p --nprobe 4,8 --kind pq --m 16 --bits 8 --refine 8 --faiss-refine 8 --json $OUT/c/pq-r$r.jsonl > $OUT/c/pq-r$r.out 2>&1
  p --nprobe 4,8 --kind sq8 --refine 2 --faiss-refine 2 --json $OUT/c/sq8-r$r.jsonl > $OUT/c/sq8-r$r.out 2>&1
  p --nprobe 4,8,16 --json $OUT/c/flat-r$r.jsonl > $OUT/c/flat-r$r.out 2>&1
done
python3 scripts/bench_kmeans_peers.py --binary /tmp/hg/b/hive-gpu --base /tmp/hive-kmeans-bench/base.fvecs --repeat 3 --backend cuda --faiss-gpu --clusters 1024 > $OUT/c/kmeans-1024.out 2>&1
grep -h "build\|ratio\|^|" $OUT/c/*.out | head -80
cd $OUT && tar -cJf c.tar.xz c faiss-setup.log
