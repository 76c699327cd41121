#!/usr/bin/env bash
# The shape sweep (issue 22, item 1) on an NVIDIA H200 with the GPU code of this session: the CLI
# of the bundle made at 3c07445 (the GPU paths have not changed since; later commits change the
# CPU backend, and the GPU stores take the new `nearest_sets` by its default, `knn`). Run as the
# fourth call, carrying .carry/bundle.tar.xz, after three that carried the FAISS parts of
# ../shared/tools/faiss-gpu-prep.sh to /tmp/faiss (the third also ran .faiss/device-setup.sh);
# the tree, the bundle and the FAISS parts exceed one call's 64 MiB.
set -u
rm -rf .gpu && tar -xJf .carry/bundle.tar.xz
. scripts/cuda-libs.sh
. .gpu/env
. /tmp/faiss/env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
start=$(date +%s)
timeout 280 python3 scripts/gpu-shape-sweep.py --metrics l2 --out $OUT/l2 > $OUT/l2.txt 2>&1
echo "l2 rc=$? $(( $(date +%s) - start ))s" >> $OUT/summary.txt
start=$(date +%s)
timeout 260 python3 scripts/gpu-shape-sweep.py --metrics cosine --out $OUT/cosine > $OUT/cosine.txt 2>&1
echo "cosine rc=$? $(( $(date +%s) - start ))s" >> $OUT/summary.txt
cat $OUT/summary.txt; tail -5 $OUT/l2.txt
