#!/usr/bin/env bash
# Call A: FAISS part 1 staged; the suites that save and open collections, on CUDA (and Vulkan
# where the loader carried along comes up), on the stored-payload-index build.
set -u
mkdir -p /tmp/faiss && cp .faiss/part.aa /tmp/faiss/
mkdir -p /tmp/hg $OUT/a && tar -C /tmp/hg -xJf .carry/bins.tar.xz
. scripts/cuda-libs.sh
if ! ldconfig -p | grep -q 'libvulkan\.so\.1'; then for f in /tmp/hg/b/debs/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; if [ -f $nv ]; then export VK_DRIVER_FILES=$nv; fi
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpu.txt
cd crates/hive-gpu
req=cuda,vulkan
HIVE_GPU_REQUIRE=$req /tmp/hg/b/filters --test-threads 4 > $OUT/a/test-filters.log 2>&1 || req=cuda
echo "require $req" >> $OUT/a/summary.txt
for t in filters persistence durable bad_input multi model; do
  HIVE_GPU_REQUIRE=$req /tmp/hg/b/$t --test-threads 4 > $OUT/a/test-$t.log 2>&1
  echo "test $t rc=$? $(grep 'test result' $OUT/a/test-$t.log)" >> $OUT/a/summary.txt
done
cat $OUT/a/summary.txt
