#!/usr/bin/env bash
# The project's test command (README): formatting, lints with warnings as errors, and every
# test of the workspace (unit, conformance, bad input, model-based, concurrency, CLI, doc).
#
# Besides a Rust toolchain (1.89+) and a C compiler, it needs the following, checks for each
# first, and installs what is missing (installing needs root and network: Debian's archive and
# PyPI). Set HIVE_GPU_NO_INSTALL=1 to have it stop and name what is missing instead.
#   apt  mesa-vulkan-drivers libvulkan1       Mesa's software Vulkan (lavapipe): the wgpu backend
#                                             runs the whole suite for real, without a GPU
#   apt  libamdhip64-5 libhiprtc-builtins5    HIP 5.2 runtime with hiprtc: every HIP kernel is
#                                             compiled for AMD targets, without an AMD GPU
#   apt  python3-venv                         only where `python3 -m venv` does not work
#   pip  nvidia-cuda-nvrtc-cu12==12.9.86      NVRTC alone (no CUDA toolkit), into .venv-nvrtc/:
#                                             every CUDA kernel is compiled for sm_70/80/90
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

# Installs the Debian packages named, unless every one is installed already.
need_apt() {
    local missing=()
    for package in "$@"; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && { echo "present: $*"; return 0; }
    if [ "${HIVE_GPU_NO_INSTALL:-}" = 1 ] || [ "$(id -u)" != 0 ]; then
        echo "scripts/ci.sh needs the Debian packages: ${missing[*]}" >&2
        echo "install them as root (apt-get install ${missing[*]}) and run it again" >&2
        exit 1
    fi
    echo "installing (apt): ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# NVRTC without a GPU: every CUDA kernel is compiled for sm_70/80/90 by the kernel test, so a
# kernel that does not compile cannot land. The wheel holds only libnvrtc (no toolkit).
step "NVRTC (pip: nvidia-cuda-nvrtc-cu12 into .venv-nvrtc/) for the kernel compile check"
nvrtc_lib=$(ls -d "$PWD"/.venv-nvrtc/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib 2>/dev/null || true)
if [ -z "$nvrtc_lib" ]; then
    if [ "${HIVE_GPU_NO_INSTALL:-}" = 1 ]; then
        echo "scripts/ci.sh needs .venv-nvrtc/ with nvidia-cuda-nvrtc-cu12==12.9.86 (pip, from PyPI)" >&2
        exit 1
    fi
    python3 -m venv .venv-nvrtc 2>/dev/null || { need_apt python3-venv && python3 -m venv .venv-nvrtc; }
    echo "installing (pip): nvidia-cuda-nvrtc-cu12==12.9.86"
    .venv-nvrtc/bin/pip install -q "nvidia-cuda-nvrtc-cu12==12.9.86"
    nvrtc_lib=$(ls -d "$PWD"/.venv-nvrtc/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib)
else
    echo "present: $nvrtc_lib"
fi
export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HIVE_GPU_REQUIRE_NVRTC=1

# Mesa's software Vulkan (lavapipe): the wgpu backend runs the whole suite for real.
step "Vulkan: mesa-vulkan-drivers (lavapipe) and libvulkan1"
need_apt mesa-vulkan-drivers libvulkan1
export HIVE_GPU_REQUIRE=vulkan
# Mesa's device-select layer asks a Wayland compositor for the default GPU and libwayland prints
# "XDG_RUNTIME_DIR is invalid" where there is none; the tests pick their adapters themselves.
# (The CLI turns the layer off on its own outside a desktop session; its test checks that.)
export NODEVICE_SELECT=1

# Debian's HIP 5.2 runtime with its hiprtc, and no AMD GPU: every kernel is compiled for wave64
# (gfx906/908/90a) and wave32 (gfx1030) targets, the FFI tables are checked against the library,
# and "runtime found, no device" is checked end to end (docs/ROCM.md).
step "ROCm: libamdhip64-5 and libhiprtc-builtins5 (HIP runtime + hiprtc) for the kernel compile check"
need_apt libamdhip64-5 libhiprtc-builtins5
export HIVE_GPU_REQUIRE_HIPRTC=1 HIVE_GPU_EXPECT_ROCM=no-device

# The memory-limit test makes a 512 MiB memory cgroup (root and a writable cgroup file system,
# v1 or v2) and fills a collection inside it. Where this script can make one, the test must run
# (HIVE_GPU_REQUIRE_CGROUP=1: a cgroup it cannot make is a failure); where it cannot, it says so
# here and the test reports itself as not run.
step "memory cgroup for the memory-limit test"
cgroup_parent=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print "/sys/fs/cgroup/memory" $3; exit}
                         $1 == "0" && $2 == "" {print "/sys/fs/cgroup" $3}' /proc/self/cgroup | head -1)
probe="$cgroup_parent/hive-gpu-ci-probe-$$"
if [ -n "$cgroup_parent" ] && mkdir "$probe" 2>/dev/null &&
    { [ -e "$probe/memory.limit_in_bytes" ] || [ -e "$probe/memory.max" ]; }; then
    rmdir "$probe"
    export HIVE_GPU_REQUIRE_CGROUP=1
    echo "cgroups can be made under $cgroup_parent: the memory-limit test is required"
else
    rmdir "$probe" 2>/dev/null || true
    echo "NOTE: no memory cgroup can be made here (${cgroup_parent:-none found}): the memory-limit test will not run"
fi

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
