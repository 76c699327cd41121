#!/usr/bin/env bash
# The whole GPU run, on a machine with an NVIDIA GPU and no Rust toolchain:
#   here:   bash scripts/gpu-bundle --workspace            (packs release + test binaries into .gpu/)
#   there:  bash scripts/gpu-test.sh [test filter...]     (from the repository root)
# Runs every test binary with HIVE_GPU_REQUIRE=cuda,vulkan (CUDA and NVIDIA's Vulkan driver; a
# missing backend fails, never skips) and
# HIVE_GPU_LARGE=1 (the ten-million-row case), after `hive-gpu info`; then the conformance suite
# and the fuzzer again on the own GEMM kernel, with the fused filter on every batch, and with the
# radix path's linear selection on every list. Logs go to $OUT when set.
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
[ $# -eq 0 ] || exit 0
# The engine's own GEMM kernel (what ROCm runs without rocBLAS) through the CUDA engine: the
# conformance suite and the exactness fuzzer again, with every batch GEMM on it.
HIVE_GPU_OWN_GEMM=1 hive-gpu info | grep -E '^ +driver' | tee -a "$out/own-gemm.log"
for suite in conformance fuzz_exactness; do
    exe=$(awk -F'\t' -v s="$suite" 'index($1, s "-") == 1 {print $1; exit}' .gpu/tests.tsv)
    echo "== own GEMM: $suite ($exe)"
    (cd crates/hive-gpu && HIVE_GPU_OWN_GEMM=1 HIVE_GPU_TEST_BACKENDS=cuda HIVE_GPU_REQUIRE=cuda "../../.gpu/bin/$exe") 2>&1 |
        tee -a "$out/own-gemm.log"
done
# The fused tensor-core filters on every batch, not only on collections of 131,072 rows and
# more: CUDA's (compute capability 8.0+, with 3 row tiles per block so that small collections
# cross tiles and blocks too) and wgpu's cooperative-matrix filter on NVIDIA's Vulkan driver.
# The conformance suite and the fuzzer again.
for suite in conformance fuzz_exactness; do
    exe=$(awk -F'\t' -v s="$suite" 'index($1, s "-") == 1 {print $1; exit}' .gpu/tests.tsv)
    echo "== fused filter on every batch: $suite ($exe)"
    (cd crates/hive-gpu && HIVE_GPU_FUSED_MIN_ROWS=1 HIVE_GPU_FUSED_TILES=3 HIVE_GPU_TEST_BACKENDS=cuda,vulkan HIVE_GPU_REQUIRE=cuda,vulkan "../../.gpu/bin/$exe") 2>&1 |
        tee -a "$out/fused.log"
done
# The other filters of f32 rows: on TF32 (HIVE_GPU_F16_FILTER=0; cosine and dimensions not a
# multiple of 8 take it), and rounded to f16 inside the filter where no f16 copy of the rows is
# made (HIVE_GPU_ROUNDED_COPY_BYTES=0; collections beyond the copy's budget take it).
for setting in HIVE_GPU_F16_FILTER=0 HIVE_GPU_ROUNDED_COPY_BYTES=0; do
    for suite in conformance fuzz_exactness; do
        exe=$(awk -F'\t' -v s="$suite" 'index($1, s "-") == 1 {print $1; exit}' .gpu/tests.tsv)
        echo "== fused filter with $setting: $suite ($exe)"
        (cd crates/hive-gpu && env "$setting" HIVE_GPU_FUSED_MIN_ROWS=1 HIVE_GPU_FUSED_TILES=3 HIVE_GPU_TEST_BACKENDS=cuda HIVE_GPU_REQUIRE=cuda "../../.gpu/bin/$exe") 2>&1 |
            tee -a "$out/fused-f32.log"
    done
done
# The linear selection of long re-ranked lists (duplicates) wherever the radix path runs, not
# only past 8,192 candidates: the conformance suite and the fuzzer again.
for suite in conformance fuzz_exactness; do
    exe=$(awk -F'\t' -v s="$suite" 'index($1, s "-") == 1 {print $1; exit}' .gpu/tests.tsv)
    echo "== selection on every radix-path list: $suite ($exe)"
    (cd crates/hive-gpu && HIVE_GPU_SELECT_MIN=1 HIVE_GPU_TEST_BACKENDS=cuda HIVE_GPU_REQUIRE=cuda "../../.gpu/bin/$exe") 2>&1 |
        tee -a "$out/select.log"
done
