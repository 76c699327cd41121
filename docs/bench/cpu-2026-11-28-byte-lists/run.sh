#!/bin/bash
# CPU IVF benches: base (de0c34d) vs final (HEAD), faiss-cpu 1.15.1 in each run, 2 threads.
cd /work/main
OUT=docs/bench/cpu-2026-11-28-byte-lists
mkdir -p $OUT
PY=.venv-bench/bin/python
S=../shared/data/siftsmall; B=../shared/data/bigann10k; F=../shared/data/fmnistsmall; C=/tmp/synth10k
sift="--base $S/siftsmall_base.fvecs --query $S/siftsmall_query.fvecs --groundtruth $S/siftsmall_groundtruth.ivecs --nlist 100"
big="--base $B/bigann10k_base.fvecs --query $B/bigann10k_query.fvecs --groundtruth $B/bigann10k_groundtruth.ivecs --nlist 100"
clu="--base $C/clustered10k_base.fvecs --query $C/clustered10k_query.fvecs --groundtruth $C/clustered10k_groundtruth.ivecs --nlist 100"
fm="--base $F/fmnistsmall_base.fvecs --query $F/fmnistsmall_query.fvecs --groundtruth $F/fmnistsmall_groundtruth.ivecs --nlist 100"
for r in 1 2 3; do
 for v in base final; do
  $PY scripts/bench_ivf_peers.py $sift --nprobe 8,16 --hive-bin /tmp/bench/hive-$v > $OUT/sift-flat-batch-$v-r$r.txt 2>&1
  $PY scripts/bench_ivf_peers.py $sift --nprobe 8,16 --batch 1 --hive-bin /tmp/bench/hive-$v > $OUT/sift-flat-single-$v-r$r.txt 2>&1
  $PY scripts/bench_ivf_peers.py $sift --nprobe 8,16 --kind sq8 --faiss-refine 2 --hive-bin /tmp/bench/hive-$v > $OUT/sift-sq8-batch-$v-r$r.txt 2>&1
  $PY scripts/bench_ivf_peers.py $sift --nprobe 8,16 --kind sq8 --faiss-refine 2 --batch 1 --hive-bin /tmp/bench/hive-$v > $OUT/sift-sq8-single-$v-r$r.txt 2>&1
  $PY scripts/bench_ivf_peers.py $clu --nprobe 1,2,4,8 --hive-bin /tmp/bench/hive-$v > $OUT/clustered-flat-batch-$v-r$r.txt 2>&1
 done
done
for r in 1 2; do
 for v in base final; do
  $PY scripts/bench_ivf_peers.py $big --nprobe 16 --hive-bin /tmp/bench/hive-$v > $OUT/bigann-flat-batch-$v-r$r.txt 2>&1
  $PY scripts/bench_ivf_peers.py $big --nprobe 16 --batch 1 --hive-bin /tmp/bench/hive-$v > $OUT/bigann-flat-single-$v-r$r.txt 2>&1
  $PY scripts/bench_ivf_peers.py $big --nprobe 16 --kind sq8 --faiss-refine 2 --hive-bin /tmp/bench/hive-$v > $OUT/bigann-sq8-batch-$v-r$r.txt 2>&1
  $PY scripts/bench_ivf_peers.py $clu --nprobe 1,2,4,8 --batch 1 --hive-bin /tmp/bench/hive-$v > $OUT/clustered-flat-single-$v-r$r.txt 2>&1
  $PY scripts/bench_ivf_peers.py $fm --nprobe 8 --hive-bin /tmp/bench/hive-$v > $OUT/fmnistsmall-flat-batch-$v-r$r.txt 2>&1
 done
done
echo done > $OUT/.done
