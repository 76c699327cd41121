#!/usr/bin/env bash
# Call 6 (round 1, after call 5): where the rounded filter's f16 copy of the rows pays. Cosine
# batches of 100 queries over 1M rows ran 12-16% slower on the rounded filter (call 5) than on
# TF32: one query tile reads the rows once, so a copy (read 4 bytes, write 2, read 2) moves
# twice what converting each staged step in the filter does. Per cell the CLI alternates with
# itself without the copy (HIVE_GPU_ROUNDED_COPY_BYTES=0), with the fused filter from 1e7 rows x
# queries (HIVE_GPU_FUSED_MIN_WORK), and both; FAISS GPU and PyTorch beside them.
set -u
[ -f /tmp/faiss/env.sh ] || { echo "no FAISS on this machine (a fresh lease): calls 1-3 first"; exit 3; }
[ -x .gpu/bin/hive-gpu ] || { rm -rf .gpu && tar -xJf .carry/bundle.tar.xz; }
. scripts/cuda-libs.sh
. .gpu/env
. /tmp/faiss/env.sh
mkdir -p $OUT/c
start=$(date +%s)
timeout 540 python3 scripts/gpu-shape-sweep.py --metrics cosine,l2 --dims 64,128,384 --rows 100000,1000000 \
  --nqs 100,1000 --compare "copy_off=env HIVE_GPU_ROUNDED_COPY_BYTES=0 hive-gpu" \
  --compare "min_work_1e7=env HIVE_GPU_FUSED_MIN_WORK=10000000 hive-gpu" \
  --compare "both=env HIVE_GPU_FUSED_MIN_WORK=10000000 HIVE_GPU_ROUNDED_COPY_BYTES=0 hive-gpu" \
  --out $OUT/c > $OUT/c/sweep.txt 2>&1
echo "sweep rc=$? $(( $(date +%s) - start ))s" >> $OUT/summary.txt
cat $OUT/summary.txt; grep -E "nq (1000|100):" $OUT/c/sweep.txt | head -40
