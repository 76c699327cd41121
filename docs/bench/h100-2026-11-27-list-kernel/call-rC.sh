#!/usr/bin/env bash
# FAISS part 3 and setup; IVF-Flat against FAISS GPU in the same run with the new CLI (results as
# columns, the script's default; one round as lists): 1M two rounds, 10M.
set -u
mkdir -p $OUT/c
cp .faiss/part.ac .faiss/*.whl /tmp/faiss/ && bash .faiss/device-setup.sh > $OUT/c/faiss-setup.log 2>&1
mkdir -p .gpu && echo 'export PATH=/tmp/hg/b:$PATH' > .gpu/env
. scripts/cuda-libs.sh; . .gpu/env; . /tmp/faiss/env.sh
w=/tmp/hive-ivf-bench
p() { timeout 150 python3 scripts/bench_ivf_peers.py --hive-bin /tmp/hg/b/hive-gpu --backend cuda --faiss-gpu --threads 16 \
  --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs --nlist 1024 "$@"; }
for r in 1 2; do p --nprobe 1,2,4,8,16 --json $OUT/c/flat-r$r.jsonl --png $OUT/c/flat-r$r.png > $OUT/c/flat-r$r.out 2>&1; echo "flat r$r rc=$?"; done
p --nprobe 4,8 --lists --json $OUT/c/flat-lists.jsonl > $OUT/c/flat-lists.out 2>&1; echo "flat lists rc=$?"
w=/tmp/w10
p() { timeout 240 python3 scripts/bench_ivf_peers.py --hive-bin /tmp/hg/b/hive-gpu --backend cuda --faiss-gpu --threads 16 \
  --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs --nlist 4096 "$@"; }
p --nprobe 1,2,4,8,16 --json $OUT/c/flat10m.jsonl --png $OUT/c/flat10m.png > $OUT/c/flat10m.out 2>&1; echo "flat10m rc=$?"
grep -h "ratio\|^ *[0-9]\|build\|per call" $OUT/c/*.out | head -60
cd $OUT && tar -cJf c.tar.xz c
