#!/usr/bin/env bash
# The project's test command (README): formatting, lints with warnings as errors, and every
# test of the workspace (unit, conformance, bad input, model-based, concurrency, CLI, doc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

# NVRTC without a GPU: every CUDA kernel is compiled for sm_70/80/90 by the kernel test, so a
# kernel that does not compile cannot land. The wheel holds only libnvrtc (no toolkit).
step "NVRTC (pip: nvidia-cuda-nvrtc-cu12) for the kernel compile check"
if [ ! -x .venv-nvrtc/bin/pip ]; then
    python3 -m venv .venv-nvrtc 2>/dev/null || {
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && python3 -m venv .venv-nvrtc
    }
    .venv-nvrtc/bin/pip install -q "nvidia-cuda-nvrtc-cu12==12.9.86"
fi
nvrtc_lib=$(ls -d "$PWD"/.venv-nvrtc/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib)
export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HIVE_GPU_REQUIRE_NVRTC=1

# Mesa's software Vulkan (lavapipe): the wgpu backend runs the whole suite for real.
step "Vulkan: mesa-vulkan-drivers (lavapipe) and libvulkan1"
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
fi
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
export HIVE_GPU_REQUIRE=vulkan

# Debian's HIP 5.2 runtime with its hiprtc, and no AMD GPU: every kernel is compiled for wave64
# (gfx906/908/90a) and wave32 (gfx1030) targets, the FFI tables are checked against the library,
# and "runtime found, no device" is checked end to end (docs/ROCM.md).
step "ROCm: libamdhip64-5 and libhiprtc-builtins5 (HIP runtime + hiprtc) for the kernel compile check"
if ! dpkg -s libamdhip64-5 libhiprtc-builtins5 >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libamdhip64-5 libhiprtc-builtins5 >/dev/null
fi
export HIVE_GPU_REQUIRE_HIPRTC=1 HIVE_GPU_EXPECT_ROCM=no-device

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked

# Coverage-guided fuzzing of the file readers on stable (docs/FUZZING.md): 20 s per target over
# a copy of the checked-in seed corpus; any crash, hang or runaway allocation fails CI.
step "fuzz the file readers (scripts/fuzz.sh 20)"
bash scripts/fuzz.sh 20

# The same suites again with the lower CPU kernel levels forced, so the AVX2 and scalar
# kernels, and the f32 GEMM path that serves CPUs without AVX512-BF16, are proven too.
for level in avx2 scalar; do
    step "conformance with HIVE_GPU_CPU_SIMD=$level"
    HIVE_GPU_CPU_SIMD=$level HIVE_GPU_REQUIRE= HIVE_GPU_TEST_BACKENDS=cpu \
        cargo test --workspace --locked --test conformance --test model --test bad_input
done
