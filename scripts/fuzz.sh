#!/usr/bin/env bash
# Coverage-guided fuzzing of the file readers (crates/hive-gpu/src/io) with libFuzzer, on the
# STABLE toolchain. Usage:
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     # default: 20 s for each of every target
#
# How it works on stable: cargo-fuzz needs nightly only for -Zsanitizer=address; the coverage
# instrumentation libFuzzer feeds on is LLVM's SanitizerCoverage pass, which stable rustc runs
# when asked through the stable -C flags below (what cargo-fuzz itself passes). The targets
# (fuzz/fuzz_targets/*.rs) are ordinary binaries: libfuzzer-sys compiles libFuzzer's C++
# runtime with the system C++ compiler and links it in as `main`. `--cfg fuzzing` is what
# libfuzzer-sys and cargo-fuzz set; debug assertions and overflow checks make arithmetic bugs
# crash instead of wrapping. There is no AddressSanitizer (nightly only), which the readers do
# not need: the readers use no `unsafe`, so what fuzzing hunts here is panics, overflows, hangs
# and excessive allocation (-rss_limit_mb, -malloc_limit_mb).
# The flags are passed with --target so that they reach only the target's code, never build
# scripts or proc macros (which would fail to link without the libFuzzer runtime), and build
# into fuzz/target, so the main build's cache is not invalidated.
#
# Each target runs over a fresh COPY of its checked-in seed corpus (fuzz/corpus/<target>/), so
# runs never change the tree; what a run adds to the copy stays in fuzz/target/fuzz-run/ to
# look at. A crash, timeout, leak or out-of-memory is written to fuzz/artifacts/<target>/ and
# makes this script exit non-zero after all targets ran; reproduce one with
#   fuzz/target/x86_64-unknown-linux-gnu/release/<target> fuzz/artifacts/<target>/crash-...
#
# A longer campaign, e.g. one hour per target, keeping what it finds in a corpus of your own:
#   scripts/fuzz.sh 3600
#   FUZZ_JOBS=4 scripts/fuzz.sh 3600 npy        # 4 libFuzzer processes for one target
#   then merge what adds coverage into the seed corpus (counting edges only keeps it small;
#   keep fuzz/corpus near 200 KB):
#   fuzz/target/<host>/release/npy -merge=1 -use_counters=0 -max_len=2048 \
#       fuzz/corpus/npy fuzz/target/fuzz-run/npy/corpus
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"

seconds=${1:-20}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(fvecs ivecs bvecs npy idx idx_gz collection log manifest)
fi
jobs=${FUZZ_JOBS:-1}

host=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="$PWD/target"
# SanitizerCoverage as libFuzzer wants it: edge coverage (level 4) as 8-bit counters with a PC
# table, and the operands of comparisons (so magic numbers and lengths are solved, not guessed).
export RUSTFLAGS="-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
--cfg fuzzing -Cdebug-assertions -Coverflow-checks"

printf '==> building the fuzz targets (release, %s)\n' "$host"
build=(cargo build --release --locked --target "$host")
for target in "${targets[@]}"; do
    build+=(--bin "$target")
done
"${build[@]}"

run_dir="$PWD/target/fuzz-run"
failed=()
for target in "${targets[@]}"; do
    binary="target/$host/release/$target"
    corpus="$run_dir/$target/corpus"
    artifacts="$PWD/artifacts/$target"
    rm -rf "$run_dir/$target"
    mkdir -p "$corpus" "$artifacts"
    cp -R "corpus/$target/." "$corpus/"
    # Compressed input: 64 KiB can already inflate to 64 MiB, which is all the gzip paths need
    # and keeps each execution fast; the other formats are read as they are.
    max_len=$((1 << 20))
    [ "$target" = idx_gz ] && max_len=$((64 << 10))
    # A log is replayed into a collection and written back: 64 KiB holds hundreds of records.
    [ "$target" = log ] && max_len=$((64 << 10))
    parallel=()
    if [ "$jobs" -gt 1 ]; then
        # Each job logs to fuzz-<n>.log in the working directory.
        parallel=(-jobs="$jobs" -workers="$jobs")
    fi
    touch "$run_dir/$target/started"
    printf '\n==> fuzzing %s for %ss\n' "$target" "$seconds"
    status=0
    # -timeout: one input taking 10 s is a hang. -rss_limit_mb: a process growing past 2 GiB is
    # a failure (an allocation a hostile file decided). There is no leak check: that needs
    # LeakSanitizer, which stable cannot link in.
    "$binary" "$corpus" \
        -max_total_time="$seconds" \
        -rss_limit_mb=2048 \
        -max_len="$max_len" \
        -timeout=10 \
        "${parallel[@]}" \
        -print_final_stats=1 \
        -artifact_prefix="$artifacts/" \
        >"$run_dir/$target/log" 2>&1 || status=$?
    grep -E '^INFO: Loaded|^INFO: seed corpus|^#[0-9]+ +(INITED|DONE)|^stat::|^Done ' "$run_dir/$target/log" || true
    if [ "$status" -ne 0 ]; then
        failed+=("$target")
        tail -n 40 "$run_dir/$target/log"
        printf '!! %s failed (exit %s); log: %s\n' "$target" "$status" "$run_dir/$target/log"
        find "$artifacts" -type f -newer "$run_dir/$target/started" -printf '!! crash input: %p\n'
    fi
done

if [ ${#failed[@]} -ne 0 ]; then
    printf '\nfuzzing FAILED: %s\n' "${failed[*]}"
    exit 1
fi
printf '\nfuzzing passed: %s, %ss each\n' "${targets[*]}" "$seconds"
