#!/usr/bin/env bash
# On the GPU machine, with the bundle unpacked (.gpu/, scripts/gpu-bundle) and /tmp/faiss/env.sh in
# place (../shared/tools/faiss-gpu-prep.sh): IVF-PQ recall/QPS curves of hive-gpu on CUDA against
# FAISS GPU's GpuIndexIVFPQ with the same sub-quantizers and bits (the same code size), wrapped in
# IndexRefineFlat with the same re-rank factor, on the clustered 1M x 128 set with 10,000
# queries in one batch (scripts/make_clustered_fvecs.py), the same nlist and nprobe settings,
# one run (scripts/bench_ivf_peers.py --kind pq). Then the same without FAISS's re-rank (its
# plain PQ distances) against hive-gpu at refine 1. Logs and PNGs under $OUT/pq.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/out}/pq"
work=/tmp/hive-ivf-bench
mkdir -p "$out" "$work"
. scripts/cuda-libs.sh
. .gpu/env
if [ -f /tmp/faiss/env.sh ]; then . /tmp/faiss/env.sh; fi
if [ ! -f "$work/c_groundtruth.ivecs" ]; then
  python3 scripts/make_clustered_fvecs.py "$work/c" --rows 1000000 --queries 10000
fi
nlist=${NLIST:-1024}
m=${PQ_M:-16}
bits=${PQ_BITS:-8}
refine=${REFINE:-8}
common=(--hive-bin "$(command -v hive-gpu)" --backend cuda --faiss-gpu --threads 16
  --base "$work/c_base.fvecs" --query "$work/c_query.fvecs" --groundtruth "$work/c_groundtruth.ivecs"
  --nlist "$nlist" --nprobe "${NPROBE:-1,2,4,8,16,32}" --kind pq --m "$m" --bits "$bits")
name="clustered1m-nlist$nlist-m$m-bits$bits"
python3 scripts/bench_ivf_peers.py "${common[@]}" --refine "$refine" --faiss-refine "$refine" \
  --png "$out/$name-refine$refine-cuda.png" --json "$out/$name-refine$refine-cuda.jsonl" 2>&1 \
  | tee "$out/$name-refine$refine-cuda.out"
if [ -z "${SKIP_PLAIN:-}" ]; then
  python3 scripts/bench_ivf_peers.py "${common[@]}" --refine 1 \
    --json "$out/$name-plain-cuda.jsonl" 2>&1 | tee "$out/$name-plain-cuda.out"
fi
