#!/usr/bin/env bash
# Call 5: this session's CLI (`hive-gpu` on PATH) against 0845a1c's (/tmp/old, call 3), FAISS GPU
# 1.15.1 and PyTorch, in one run: the shape sweep's batch cells where the fused filter runs or
# could (uniform data, k = 10, d 64/128/384, 100k and 1M rows, 100/1,000/10,000 queries, l2 and
# cosine). Per cell the CLIs alternate (`--compare`): the old one, and the new one with the fused
# filter from 1e7 rows x queries (HIVE_GPU_FUSED_MIN_WORK, default 1e8), to retune that knob. The
# l2 cells take no changed path by default: their old/new ratio is this run's noise floor.
set -u
rm -rf .gpu && tar -xJf .carry/bundle.tar.xz
. scripts/cuda-libs.sh
. .gpu/env
. /tmp/faiss/env.sh
mkdir -p $OUT/s
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
start=$(date +%s)
timeout 540 python3 scripts/gpu-shape-sweep.py --metrics cosine,l2 --dims 64,128,384 --rows 100000,1000000 \
  --nqs 100,1000,10000 --compare old=/tmp/old/hive-gpu \
  --compare "min_work_1e7=env HIVE_GPU_FUSED_MIN_WORK=10000000 hive-gpu" --out $OUT/s > $OUT/s/sweep.txt 2>&1
echo "sweep rc=$? $(( $(date +%s) - start ))s" >> $OUT/summary.txt
cat $OUT/summary.txt; grep -E "nq (1000|10000|100):" $OUT/s/sweep.txt | head -80
