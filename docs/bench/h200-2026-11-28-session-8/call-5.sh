#!/usr/bin/env bash
# Call 5: this session's CLI (`hive-gpu` on PATH) against b175189's (/tmp/old, call 3) and FAISS
# GPU 1.15.1 and PyTorch, in one run: the shape sweep's batch cells where the fused filter runs
# (uniform data, k = 10, d 64/128/384: d 25 and 768 never take it; 100k and 1M rows;
# 100/1,000/10,000 queries; l2 and cosine), each cell running the CLIs alternately
# (`--compare`: the old one, and the new one with the grid of the old, HIVE_GPU_FUSED_BLOCKS_PER_SM=0,
# so the thresholds' change and the grid's are seen apart), FAISS and PyTorch beside them.
# Round 1 (r1/) ran the first version (three gate bands over the sample's j-th distance) with
# `--compare "min_work_1e6=env HIVE_GPU_FUSED_MIN_WORK=1000000 hive-gpu"` instead of the grid
# variant; round 2 (r2/) the final code.
set -u
rm -rf .gpu && tar -xJf .carry/bundle.tar.xz
. scripts/cuda-libs.sh
. .gpu/env
. /tmp/faiss/env.sh
mkdir -p $OUT/s
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
start=$(date +%s)
timeout 420 python3 scripts/gpu-shape-sweep.py --metrics l2,cosine --dims 64,128,384 --rows 100000,1000000 \
  --nqs 100,1000,10000 --compare old=/tmp/old/hive-gpu \
  --compare "grid_off=env HIVE_GPU_FUSED_BLOCKS_PER_SM=0 hive-gpu" --out $OUT/s > $OUT/s/sweep.txt 2>&1
echo "sweep rc=$? $(( $(date +%s) - start ))s" >> $OUT/summary.txt
cat $OUT/summary.txt; grep -E "nq (1000|10000|100):" $OUT/s/sweep.txt | head -60
