#!/usr/bin/env bash
# The project's test command (README): formatting, lints with warnings as errors, and every
# test of the workspace (unit, conformance, bad input, model-based, concurrency, CLI, doc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked

# The same suites again with the lower CPU kernel levels forced, so the AVX2 and scalar
# kernels, and the f32 GEMM path that serves CPUs without AVX512-BF16, are proven too.
for level in avx2 scalar; do
    step "conformance with HIVE_GPU_CPU_SIMD=$level"
    HIVE_GPU_CPU_SIMD=$level cargo test --workspace --locked --test conformance --test model --test bad_input
done
