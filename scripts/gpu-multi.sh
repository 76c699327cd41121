#!/usr/bin/env bash
# The multi-GPU run of issue 23, on a machine with several GPUs and no Rust toolchain:
#   here:   bash scripts/gpu-bundle -p hive-gpu-cli -p hive-gpu --test multi
#           tar -cf - .gpu | xz -T2 -6 > .carry/multi.tar.xz      (about 8 MB: one carry)
#   there:  tar -xJf .carry/multi.tar.xz && bash scripts/gpu-multi.sh
# Runs tests/multi.rs with CUDA and NVIDIA's Vulkan required and at least two devices of one
# backend (HIVE_GPU_REQUIRE_DEVICES=2: every sharded and replicated test also runs with one member
# per GPU), then `hive-gpu bench-multi` over every CUDA device: one GPU, replicated and sharded
# storages on the same synthetic data (ROWS, default 10M x 128; sharded over twice that), their
# batch QPS (median of REPEAT passes), single-query latency and exactness against one GPU.
# Logs go to $OUT (or /tmp/hive-gpu-multi). docs/PERFORMANCE.md has the last run's numbers.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -x .gpu/run-tests ] || { echo "no .gpu bundle: see the header" >&2; exit 2; }
. scripts/cuda-libs.sh
. .gpu/env
out=${OUT:-/tmp/hive-gpu-multi}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total,pci.bus_id --format=csv; hive-gpu info; } > "$out/gpus.txt" 2>&1
status=0
test_binary=$(ls .gpu/bin/multi-* | head -1)
(cd crates/hive-gpu && HIVE_GPU_REQUIRE=${HIVE_GPU_REQUIRE:-cuda,vulkan} HIVE_GPU_REQUIRE_DEVICES=2 \
    timeout "${TEST_TIMEOUT:-180}" "../../$test_binary") > "$out/multi-tests.log" 2>&1 || status=1
grep -E "test result|panicked" "$out/multi-tests.log"
timeout "${BENCH_TIMEOUT:-300}" hive-gpu bench-multi --devices "${DEVICES:-cuda:all}" --rows "${ROWS:-10000000}" \
    --singles "${SINGLES:-200}" --repeat "${REPEAT:-9}" --json > "$out/bench-multi.jsonl" 2> "$out/bench-multi.err" || status=1
cat "$out/bench-multi.jsonl"
exit $status
