#!/usr/bin/env bash
# Call C1: FAISS part 1 staged; the Vulkan loader unpacked; persistence on CUDA and Vulkan (73d1306).
set -u
mkdir -p /tmp/faiss && cp .faiss/part.aa /tmp/faiss/
if ! ldconfig -p | grep -q 'libvulkan\.so\.1'; then for f in .carry/debs/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; if [ -f $nv ]; then export VK_DRIVER_FILES=$nv; fi
. scripts/cuda-libs.sh
mkdir -p $OUT/c
( cd crates/hive-gpu && HIVE_GPU_REQUIRE=cuda,vulkan /tmp/hg/b/persistence --test-threads 4 > $OUT/c/test-persistence.log 2>&1; echo "test persistence rc=$? $(grep 'test result' $OUT/c/test-persistence.log)" )
ls /tmp/faiss
