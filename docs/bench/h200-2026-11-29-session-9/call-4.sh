#!/usr/bin/env bash
# Call 4: the whole test suite of this session's code (every test binary of the workspace, built
# --release by scripts/gpu-bundle) with CUDA and NVIDIA's Vulkan driver required and the
# ten-million-row case on (HIVE_GPU_REQUIRE=cuda,vulkan HIVE_GPU_LARGE=1, as scripts/gpu-test.sh
# sets them). Binaries run three at a time (16 cores, one GPU), each under a 480 s limit.
# ONLY (an extended regex over the binaries' names, default all) picks some: round 1 ran
# ONLY='^(conformance|fuzz_exactness|filters|primitives)-'.
set -u
ONLY=${ONLY:-.}
rm -rf .gpu && tar -xJf .carry/bundle.tar.xz
. scripts/cuda-libs.sh
. .gpu/env
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/a/gpu.txt
hive-gpu info >> $OUT/a/gpu.txt 2>&1
export HIVE_GPU_REQUIRE=cuda,vulkan HIVE_GPU_LARGE=1
root=$(pwd)
run_one() {
  exe=$1; pkg=$2
  start=$(date +%s)
  (cd "$root/$pkg" && timeout 480 "$root/.gpu/bin/$exe" --test-threads 4 > "$OUT/a/$exe.log" 2>&1)
  rc=$?
  echo "$exe rc=$rc $(( $(date +%s) - start ))s $(grep 'test result' "$OUT/a/$exe.log" | tail -1)" >> "$OUT/a/summary.txt"
}
export -f run_one; export root OUT
# The longest first, so the three lanes end together.
grep -E "$ONLY" .gpu/tests.tsv | sort -t$'\t' -k1,1 | awk -F'\t' '{w=1; if ($1 ~ /^conformance/) w=0; if ($1 ~ /^primitives|^gpu-|^fuzz/) w=0.5; print w"\t"$0}' \
  | sort -n | cut -f2- | tr '\t' ' ' | xargs -P 3 -L 1 bash -c 'run_one "$0" "$1"'
sort "$OUT/a/summary.txt" -o "$OUT/a/summary.txt"; cat "$OUT/a/summary.txt"
grep -h -E "^test .*FAILED|panicked at" $OUT/a/*.log | head -20
cd $OUT/a && tar -cJf logs.tar.xz *.log && rm -f *.log && ls
