#!/usr/bin/env bash
# How the replicated storage's batches are cut (issue 23), on a machine with several GPUs and no
# Rust toolchain, after the bundle of scripts/gpu-multi.sh's header:
#   there:  bash scripts/gpu-replicated-sweep.sh
# For each piece setting (HIVE_GPU_PIECE_QUERIES and HIVE_GPU_PIECE_WORKERS, both read by every
# collection of the process, the single device's included), `hive-gpu bench-multi --skip-sharded`
# over every CUDA device: one GPU and the replicated storage on the same ROWS x 128 (default 10M),
# QUERIES queries per batch (default 10,000), median of REPEAT passes. Then one GPU and the
# replicated storage at half the batch (the single device's fixed cost per batch, which a split
# batch pays once per replica). Logs go to $OUT (or /tmp/hive-gpu-sweep).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -x .gpu/run-tests ] || { echo "no .gpu bundle: see scripts/gpu-multi.sh" >&2; exit 2; }
. scripts/cuda-libs.sh
. .gpu/env
out=${OUT:-/tmp/hive-gpu-sweep}
mkdir -p "$out"
rows=${ROWS:-10000000}
queries=${QUERIES:-10000}
status=0
for setting in ${SETTINGS:-2048/4 1000/4 1250/2 834/4 1667/2}; do
  size=${setting%/*}
  workers=${setting#*/}
  echo "== pieces of $size queries, $workers workers"
  HIVE_GPU_PIECE_QUERIES=$size HIVE_GPU_PIECE_WORKERS=$workers timeout "${BENCH_TIMEOUT:-150}" \
    hive-gpu bench-multi --devices "${DEVICES:-cuda:all}" --rows "$rows" --queries "$queries" \
    --singles 20 --repeat "${REPEAT:-7}" --skip-sharded --json \
    > "$out/sweep-$size-$workers.jsonl" 2> "$out/sweep-$size-$workers.err" || status=1
  grep -h summary "$out/sweep-$size-$workers.jsonl" || tail -3 "$out/sweep-$size-$workers.err"
done
half=$((queries / 2))
echo "== default pieces, $half queries"
timeout "${BENCH_TIMEOUT:-150}" hive-gpu bench-multi --devices "${DEVICES:-cuda:all}" --rows "$rows" \
  --queries "$half" --singles 20 --repeat "${REPEAT:-7}" --skip-sharded --json \
  > "$out/half-batch.jsonl" 2> "$out/half-batch.err" || status=1
cat "$out/half-batch.jsonl"
exit $status
