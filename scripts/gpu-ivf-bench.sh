#!/usr/bin/env bash
# On the GPU machine, with the bundle unpacked (.gpu/, scripts/gpu-bundle) and /tmp/faiss/env.sh in
# place (../shared/tools/faiss-gpu-prep.sh): IVF-Flat recall/QPS curves of hive-gpu on CUDA
# against FAISS GPU's GpuIndexIVFFlat on a clustered 1M x 128 set with 10,000 queries searched
# in one batch (scripts/make_clustered_fvecs.py, ground truth in f64 on the GPU), the same nlist
# and nprobe settings, one run (scripts/bench_ivf_peers.py). Writes its logs and the PNG under
# $OUT/ivf. Then the same one query per call (latency).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/out}/ivf"
work=/tmp/hive-ivf-bench
mkdir -p "$out" "$work"
. scripts/cuda-libs.sh
. .gpu/env
if [ -f /tmp/faiss/env.sh ]; then . /tmp/faiss/env.sh; fi
if [ ! -f "$work/c_groundtruth.ivecs" ]; then
  python3 scripts/make_clustered_fvecs.py "$work/c" --rows 1000000 --queries 10000
fi
nlist=${NLIST:-1024}
python3 scripts/bench_ivf_peers.py --hive-bin "$(command -v hive-gpu)" --backend cuda --faiss-gpu \
  --threads 16 --base "$work/c_base.fvecs" --query "$work/c_query.fvecs" \
  --groundtruth "$work/c_groundtruth.ivecs" --nlist "$nlist" --nprobe "${NPROBE:-1,2,4,8,16,32,64}" \
  --png "$out/clustered1m-nlist$nlist-cuda.png" --json "$out/clustered1m-nlist$nlist-cuda.jsonl" 2>&1 | tee "$out/clustered1m-nlist$nlist-cuda.out"
# One query per call over the first 1,000 queries: the latency target (0.1 ms at recall 0.95).
python3 scripts/bench_ivf_peers.py --hive-bin "$(command -v hive-gpu)" --backend cuda --faiss-gpu \
  --threads 16 --base "$work/c_base.fvecs" --query "$work/c_query.fvecs" --nq 1000 --batch 1 \
  --groundtruth "$work/c_groundtruth.ivecs" --nlist "$nlist" --nprobe "${SINGLE_NPROBE:-4,8,16}" \
  --json "$out/clustered1m-nlist$nlist-cuda-single.jsonl" 2>&1 | tee "$out/clustered1m-nlist$nlist-cuda-single.out"
