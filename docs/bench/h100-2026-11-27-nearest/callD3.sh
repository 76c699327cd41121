#!/usr/bin/env bash
# FAISS part 3 and setup; IVF-Flat and IVF-PQ over clustered 10M x 128 against FAISS GPU, same run.
set -u
mkdir -p $OUT/d
cp .faiss/part.ac .faiss/*.whl /tmp/faiss/ && bash .faiss/device-setup.sh > $OUT/d/faiss-setup.log 2>&1
. scripts/cuda-libs.sh; . /tmp/faiss/env.sh
w=/tmp/w10
p() { timeout 270 python3 scripts/bench_ivf_peers.py --hive-bin /tmp/hg/b/hive-gpu --backend cuda --faiss-gpu --threads 16 \
  --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs --nlist 4096 "$@"; }
p --nprobe 8,16,32,64 --json $OUT/d/flat10m.jsonl --png $OUT/d/flat10m.png > $OUT/d/flat10m.out 2>&1; echo "flat rc=$?"
p --nprobe 8,16,32 --kind pq --m 16 --bits 8 --refine 8 --faiss-refine 8 --json $OUT/d/pq10m.jsonl --png $OUT/d/pq10m.png > $OUT/d/pq10m.out 2>&1; echo "pq rc=$?"
grep -h -v "^$" $OUT/d/*10m.out | tail -30
