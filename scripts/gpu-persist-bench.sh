#!/usr/bin/env bash
# On the GPU machine, with the bundle unpacked (.gpu/, scripts/gpu-bundle) and, for the FAISS GPU
# peer, /tmp/faiss/env.sh in place (../shared/tools/faiss-gpu-prep.sh): saving and opening a
# 1M x 128 f32 collection (synthetic Gaussian, seed 7) on CUDA against faiss write_index /
# read_index + index_cpu_to_gpu, then on the CPU backend, medians of 5
# (scripts/bench_persist_peers.py). Writes its logs under $OUT/persist.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/out}/persist"
work=/tmp/hive-persist-bench
mkdir -p "$out" "$work"
. scripts/cuda-libs.sh
. .gpu/env
if [ -f /tmp/faiss/env.sh ]; then . /tmp/faiss/env.sh; fi
python3 scripts/make_gaussian_fvecs.py "$work/base.fvecs"
bench() { python3 scripts/bench_persist_peers.py --binary "$(command -v hive-gpu)" --base "$work/base.fvecs" --work "$work" --repeat 5 "$@"; }
faiss_gpu=()
if python3 -c 'import faiss; assert faiss.get_num_gpus() > 0' 2>/dev/null; then faiss_gpu=(--faiss-gpu); fi
bench --backend cuda "${faiss_gpu[@]}" 2>&1 | tee "$out/cuda.out"
bench --backend cpu 2>&1 | tee "$out/cpu.out"
for backend in cuda cpu; do
  HIVE_GPU_PROFILE=1 hive-gpu info --collection "$work/c.hgc" --open --backend "$backend" > "$out/profile-$backend.out" 2>&1 || true
done
