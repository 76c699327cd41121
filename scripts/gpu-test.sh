#!/usr/bin/env bash
# The whole GPU run, on a machine with an NVIDIA GPU and no Rust toolchain:
#   here:   bash scripts/gpu-bundle --workspace            (packs release + test binaries into .gpu/)
#   there:  bash scripts/gpu-test.sh [test filter...]     (from the repository root)
# Runs every test binary with HIVE_GPU_REQUIRE=cuda,vulkan (CUDA and NVIDIA's Vulkan driver; a
# missing backend fails, never skips) and
# HIVE_GPU_LARGE=1 (the ten-million-row case), after `hive-gpu info`. The conformance suite and
# the fuzzer run every forced engine path themselves (see the end). Logs go to $OUT when set.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .gpu/run-tests ] || { echo "no .gpu bundle: run bash scripts/gpu-bundle --workspace first" >&2; exit 2; }
. scripts/cuda-libs.sh
. .gpu/env
out=${OUT:-/tmp/hive-gpu-test}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
hive-gpu info | tee -a "$out/gpu.txt"
export HIVE_GPU_REQUIRE=${HIVE_GPU_REQUIRE:-cuda,vulkan} HIVE_GPU_LARGE=${HIVE_GPU_LARGE:-1}
set -o pipefail
.gpu/run-tests "$@" 2>&1 | tee "$out/tests.log"
# The conformance suite and the exactness fuzzer also ran every engine path a `Tuning` forces
# (own GEMM kernel, fused filters on every batch, the radix path's linear selection, wgpu's
# cooperative-matrix filter): `contexts_with_forced_paths` in crates/hive-gpu/tests/common.
