#!/usr/bin/env bash
# FAISS part 1; the CLI; the clustered 10M x 128 set (10,000 queries, f64 ground truth on the GPU).
set -u
mkdir -p /tmp/faiss /tmp/hg/b $OUT/d && cp .faiss/part.aa /tmp/faiss/
xz -dc .carry/hive.xz > /tmp/hg/b/hive-gpu && chmod +x /tmp/hg/b/hive-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/d/gpu.txt 2>&1
mkdir -p /tmp/w10 && s=$(date +%s)
timeout 500 python3 scripts/make_clustered_fvecs.py /tmp/w10/c --rows 10000000 --queries 10000 > $OUT/d/data.log 2>&1
echo "data rc=$? $(( $(date +%s) - s ))s" | tee -a $OUT/d/summary.txt; ls -la /tmp/w10 | tee -a $OUT/d/summary.txt
