#!/usr/bin/env bash
# On the GPU machine, with the bundle unpacked (.gpu/, scripts/gpu-bundle) and /tmp/faiss/env.sh in
# place (../shared/tools/faiss-gpu-prep.sh): k-means of 1M x 128 f32 (synthetic Gaussian, seed 7)
# into 1,024 and 4,096 clusters, hive-gpu on CUDA against faiss.Kmeans on the GPU, and 1,024
# clusters on the CPU backend against faiss.Kmeans on the CPU (scripts/bench_kmeans_peers.py,
# medians of 3). Writes its logs under $OUT/kmeans.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/out}/kmeans"
work=/tmp/hive-kmeans-bench
mkdir -p "$out" "$work"
. scripts/cuda-libs.sh
. .gpu/env
if [ -f /tmp/faiss/env.sh ]; then . /tmp/faiss/env.sh; fi
python3 scripts/make_gaussian_fvecs.py "$work/base.fvecs"
bench() { python3 scripts/bench_kmeans_peers.py --binary "$(command -v hive-gpu)" --base "$work/base.fvecs" --repeat 3 "$@"; }
for clusters in 1024 4096; do
  bench --backend cuda --faiss-gpu --clusters "$clusters" 2>&1 | tee "$out/cuda-$clusters.out"
done
bench --backend cpu --clusters 1024 2>&1 | tee "$out/cpu-1024.out"
