#!/usr/bin/env bash
# On the GPU machine, with the bundle unpacked (.gpu/, scripts/gpu-bundle) and /tmp/faiss/env.sh in
# place (../shared/tools/faiss-gpu-prep.sh): the quantized IVF indexes on CUDA against FAISS GPU on
# the clustered 1M x 128 set with 10,000 queries in one batch (scripts/make_clustered_fvecs.py),
# the same nlist and nprobe settings, one run each (scripts/bench_ivf_peers.py):
#   - IVF-PQ (16 sub-quantizers of 8 bits) at refine 8 against GpuIndexIVFPQ in IndexRefineFlat
#     with k_factor 8 (scripts/gpu-pq-bench.sh, SKIP_PLAIN unless set to empty);
#   - IVF-SQ8 at refine 2 against GpuIndexIVFScalarQuantizer (QT_8bit) in IndexRefineFlat with
#     k_factor 2.
# Logs, JSON rows and PNGs under $OUT/pq and $OUT/sq8.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
SKIP_PLAIN=${SKIP_PLAIN-1} bash scripts/gpu-pq-bench.sh
out="${OUT:-/tmp/out}/sq8"
work=/tmp/hive-ivf-bench
mkdir -p "$out"
. scripts/cuda-libs.sh
. .gpu/env
if [ -f /tmp/faiss/env.sh ]; then . /tmp/faiss/env.sh; fi
nlist=${NLIST:-1024}
name="clustered1m-nlist$nlist-sq8-refine2"
python3 scripts/bench_ivf_peers.py --hive-bin "$(command -v hive-gpu)" --backend cuda --faiss-gpu \
  --threads 16 --base "$work/c_base.fvecs" --query "$work/c_query.fvecs" \
  --groundtruth "$work/c_groundtruth.ivecs" --nlist "$nlist" --nprobe "${NPROBE:-1,2,4,8,16,32}" \
  --kind sq8 --refine 2 --faiss-refine 2 \
  --png "$out/$name-cuda.png" --json "$out/$name-cuda.jsonl" 2>&1 | tee "$out/$name-cuda.out"
