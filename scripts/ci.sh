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
