#!/usr/bin/env bash
# Call B2: FAISS part 2 staged; the build that checks the stored payload index inside the
# restore (73d1306): persistence suite on CUDA and Vulkan; opening 1M x 128 with four typed
# fields per vector as format 4 (index stored) and stripped to format 1 (index built), one
# build, alternating, three rounds, CUDA and CPU.
set -u
mkdir -p /tmp/faiss && cp .faiss/part.ab /tmp/faiss/
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/b && tar -C /tmp/hg -xJf .carry/bins2.tar.xz
. scripts/cuda-libs.sh
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; if [ -f $nv ]; then export VK_DRIVER_FILES=$nv; fi
( cd crates/hive-gpu && HIVE_GPU_REQUIRE=cuda,vulkan /tmp/hg/b/persistence --test-threads 4 > $OUT/b/test-persistence.log 2>&1; echo "test persistence rc=$? $(grep 'test result' $OUT/b/test-persistence.log)" > $OUT/b/summary.txt )
po=/tmp/hg/b/payload_open; f=/tmp/po4.hgc; g=/tmp/po1.hgc
rm -f $f $g
$po cpu 1000000 128 $f 0 > $OUT/b/open.txt 2>&1
python3 scripts/strip_payload_index.py $f $g >> $OUT/b/open.txt 2>&1
ls -la $f $g >> $OUT/b/open.txt
for r in 1 2 3; do
  for b in cuda cpu; do
    for v in 4 1; do
      HIVE_GPU_PROFILE=1 $po $b 1000000 128 /tmp/po$v.hgc 1 > /tmp/o.txt 2> /tmp/o.err
      echo "round $r $b format$v $(cat /tmp/o.txt) $(grep -E 'records parsed|values checked|ids mapped|payloads indexed|rows appended|restored at' /tmp/o.err | awk '{printf "%s=%s ", $(NF-3), $(NF-1)}')" >> $OUT/b/open.txt
    done
  done
  /usr/bin/time -f "round $r read %e s" cat $f > /dev/null 2>> $OUT/b/open.txt
done
cat $OUT/b/summary.txt $OUT/b/open.txt
