#!/usr/bin/env bash
# Call C: FAISS set up; save and open 1M x 128 against faiss write_index / read_index
# (+ index_cpu_to_gpu) in the same run (scripts/gpu-persist-bench.sh); durable writes, 8 threads.
set -u
mkdir -p /tmp/faiss && cp .faiss/part.ac .faiss/*.whl /tmp/faiss/ && bash .faiss/device-setup.sh > $OUT/faiss-setup.txt 2>&1
mkdir -p /tmp/hg && true
mkdir -p .gpu && echo 'export PATH=/tmp/hg/b:$PATH' > .gpu/env
bash scripts/gpu-persist-bench.sh > $OUT/persist.txt 2>&1
. scripts/cuda-libs.sh
for d in process disk; do for b in cuda cpu; do
  rm -rf /tmp/bw; /tmp/hg/b/hive-gpu bench-writes --dir /tmp/bw --threads 8 --seconds 3 --durability $d --backend $b >> $OUT/writes.txt 2>&1
done; done
tail -20 $OUT/persist.txt; cat $OUT/writes.txt | tail -40
