#!/usr/bin/env bash
# Call E: same machine, the CLI before (73d1306) and after the durable-log and small-append
# changes, alternating: durable writes, 8 threads, process and none, CUDA and CPU.
set -u
mkdir -p /tmp/old && tar -C /tmp/old -xJf .carry/bins2.tar.xz
. scripts/cuda-libs.sh
for r in 1 2; do for d in process none; do for b in cuda cpu; do for v in old new; do
  bin=/tmp/hg/b/hive-gpu; [ $v = old ] && bin=/tmp/old/b/hive-gpu
  rm -rf /tmp/bw; echo "round $r $d $b $v $($bin bench-writes --dir /tmp/bw --threads 8 --seconds 2 --durability $d --backend $b 2>&1 | grep acknowledged)" >> $OUT/writes-ab.txt
done; done; done; done
cat $OUT/writes-ab.txt
