#!/usr/bin/env bash
# Call E: the final code (63b5746): the library's unit tests, filters, conformance and ivf on
# CUDA and Vulkan.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/e && tar -C /tmp/hg -xJf .carry/binsE.tar.xz
for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/e/summary.txt
cd crates/hive-gpu
for t in hive_gpu filters conformance ivf; do
  HIVE_GPU_REQUIRE=cuda,vulkan HIVE_GPU_LARGE=1 timeout 230 /tmp/hg/b/$t --test-threads 4 > $OUT/e/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/e/test-$t.log)" >> $OUT/e/summary.txt
done
for t in hive_gpu filters conformance ivf; do xz -9 $OUT/e/test-$t.log; done
cat $OUT/e/summary.txt
