#!/usr/bin/env bash
# Call D: the build with the durable-log and small-append changes: CUDA and Vulkan suites that
# append and replay (durable, model, conformance, persistence, multi); durable writes, 8 threads,
# every durability on CUDA and the CPU backend, twice.
set -u
if ! ldconfig -p | grep -q 'libvulkan\.so\.1'; then for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; if [ -f $nv ]; then export VK_DRIVER_FILES=$nv; fi
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/d && tar -C /tmp/hg -xJf .carry/bins3.tar.xz
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/d/gpu.txt
for r in 1 2; do for d in none process disk; do for b in cuda cpu; do
  rm -rf /tmp/bw; echo "== round $r $d $b" >> $OUT/d/writes.txt
  /tmp/hg/b/hive-gpu bench-writes --dir /tmp/bw --threads 8 --seconds 3 --durability $d --backend $b >> $OUT/d/writes.txt 2>&1
done; done; done
( cd crates/hive-gpu && for t in durable model persistence conformance multi; do
  HIVE_GPU_REQUIRE=cuda,vulkan /tmp/hg/b/$t --test-threads 4 > $OUT/d/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/d/test-$t.log)" >> $OUT/d/summary.txt
done )
grep -E "^==|acknowledged|records per flush" $OUT/d/writes.txt
cat $OUT/d/summary.txt
