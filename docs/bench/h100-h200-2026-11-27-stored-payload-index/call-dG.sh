#!/usr/bin/env bash
# Call G: the final code (7a02d3e): the library's unit tests and the suites that save, open,
# append and replay, on CUDA and Vulkan.
set -u
if ! ldconfig -p | grep -q 'libvulkan\.so\.1'; then for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; if [ -f $nv ]; then export VK_DRIVER_FILES=$nv; fi
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/g && tar -C /tmp/hg -xJf .carry/bins4.tar.xz
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/g/gpu.txt
cd crates/hive-gpu
for t in hive_gpu persistence durable filters bad_input model multi conformance; do
  HIVE_GPU_REQUIRE=cuda,vulkan HIVE_GPU_LARGE=1 /tmp/hg/b/$t --test-threads 4 > $OUT/g/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/g/test-$t.log)" >> $OUT/g/summary.txt
done
cat $OUT/g/summary.txt
cd $OUT/g && xz -9 test-*.log
