#!/usr/bin/env bash
set -u
mkdir -p $OUT/d
. scripts/cuda-libs.sh; . /tmp/faiss/env.sh
w=/tmp/w10
p() { timeout 250 python3 scripts/bench_ivf_peers.py --hive-bin /tmp/hg/b/hive-gpu --backend cuda --faiss-gpu --threads 16 \
  --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs --nlist 4096 "$@"; }
p --nprobe 1,2,4 --json $OUT/d/flat10m-low.jsonl > $OUT/d/flat10m-low.out 2>&1; echo "flat rc=$?"
p --nprobe 2,4,8 --kind pq --m 16 --bits 8 --refine 32 --faiss-refine 32 --json $OUT/d/pq10m-r32.jsonl > $OUT/d/pq10m-r32.out 2>&1; echo "pq rc=$?"
grep -h -v "^$" $OUT/d/*.out | tail -24
