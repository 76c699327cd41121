#!/usr/bin/env bash
# FAISS part 3 and setup; IVF-PQ and IVF-SQ8 against FAISS GPU in the same run, the CLI of
# fcc4886 (results as columns, bench_ivf_peers' default): 1M (PQ two rounds, SQ8), 10M PQ.
set -u
mkdir -p $OUT/c
cp .faiss/part.ac .faiss/*.whl /tmp/faiss/ && bash .faiss/device-setup.sh > $OUT/c/faiss-setup.log 2>&1
mkdir -p .gpu && echo 'export PATH=/tmp/hg/c:$PATH' > .gpu/env
. scripts/cuda-libs.sh; . .gpu/env; . /tmp/faiss/env.sh
w=/tmp/hive-ivf-bench
p() { timeout 120 python3 scripts/bench_ivf_peers.py --hive-bin /tmp/hg/c/hive-gpu --backend cuda --faiss-gpu --threads 16 \
  --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs --nlist 1024 "$@"; }
for r in 1 2; do p --nprobe 2,4,8,16,32 --kind pq --m 16 --bits 8 --refine 8 --faiss-refine 8 --json $OUT/c/pq-r$r.jsonl --png $OUT/c/pq-r$r.png > $OUT/c/pq-r$r.out 2>&1; echo "pq r$r rc=$?"; done
p --nprobe 2,4,8,16 --kind sq8 --refine 2 --faiss-refine 2 --json $OUT/c/sq8.jsonl --png $OUT/c/sq8.png > $OUT/c/sq8.out 2>&1; echo "sq8 rc=$?"
w=/tmp/w10
p() { timeout 200 python3 scripts/bench_ivf_peers.py --hive-bin /tmp/hg/c/hive-gpu --backend cuda --faiss-gpu --threads 16 \
  --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs --nlist 4096 "$@"; }
p --nprobe 2,4,8,16 --kind pq --m 16 --bits 8 --refine 32 --faiss-refine 32 --json $OUT/c/pq10m-r32.jsonl --png $OUT/c/pq10m-r32.png > $OUT/c/pq10m-r32.out 2>&1; echo "pq10m rc=$?"
grep -h "ratio\|^ *[0-9]\|build\|per call\|^ivf" $OUT/c/*.out | head -60
cd $OUT && tar -cJf c.tar.xz c
