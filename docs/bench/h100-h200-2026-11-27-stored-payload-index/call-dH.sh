#!/usr/bin/env bash
# Call H: the final-read mends (shared host norm bound, payload index check on each_value):
# the library's unit tests, streaming, durable and conformance on CUDA.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/h && tar -C /tmp/hg -xJf .carry/bins5.tar.xz
. scripts/cuda-libs.sh
cd crates/hive-gpu
for t in hive_gpu streaming durable conformance; do
  HIVE_GPU_REQUIRE=cuda HIVE_GPU_LARGE=1 HIVE_GPU_TEST_BACKENDS=cpu,cuda /tmp/hg/b/$t --test-threads 4 > $OUT/h/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/h/test-$t.log)" >> $OUT/h/summary.txt
done
cat $OUT/h/summary.txt
