#!/usr/bin/env bash
# Call 7 (round 2): the final code's defaults (7a7f2ee: one query tile rounds rows inside the
# filter; the fused filter from 1e7 rows x queries) against 0845a1c's CLI (/tmp/old, call 3)
# on the cells they move, 10k rows included (a 1,000-query batch over 10k rows now takes the
# fused filter); and the results built on the pool from 2,048 entries instead of 16,384
# (HIVE_GPU_PARALLEL_RESULTS). FAISS GPU and PyTorch beside them; uniform data, k = 10.
set -u
[ -f /tmp/faiss/env.sh ] || { echo "no FAISS on this machine (a fresh lease): calls 1-3 first"; exit 3; }
rm -rf .gpu && tar -xJf .carry/bundle.tar.xz
. scripts/cuda-libs.sh
. .gpu/env
. /tmp/faiss/env.sh
mkdir -p $OUT/s
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
start=$(date +%s)
timeout 540 python3 scripts/gpu-shape-sweep.py --metrics cosine,l2 --dims 64,128 --rows 10000,100000,1000000 \
  --nqs 100,1000 --compare old=/tmp/old/hive-gpu \
  --compare "results_2k=env HIVE_GPU_PARALLEL_RESULTS=2048 hive-gpu" --out $OUT/s > $OUT/s/sweep.txt 2>&1
echo "sweep rc=$? $(( $(date +%s) - start ))s" >> $OUT/summary.txt
cat $OUT/summary.txt; grep -E "nq (1000|100):" $OUT/s/sweep.txt | head -40
