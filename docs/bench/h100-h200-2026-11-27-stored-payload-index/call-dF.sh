#!/usr/bin/env bash
# Call F: one IVF-Flat query at recall >= 0.95 over the clustered 1M x 128 (issue 21's 0.1 ms),
# on the code after the list kernel change; the columnar results' share of a 10k-query batch at
# k = 100 over 1M x 128 Gaussian on CUDA (issue 19), with and without HIVE_GPU_PROFILE.
set -u
mkdir -p /tmp/hg $OUT/f && tar -C /tmp/hg -xJf .carry/bins3.tar.xz
. scripts/cuda-libs.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/f/gpu.txt
w=/tmp/w; mkdir -p $w
python3 scripts/make_clustered_fvecs.py $w/c --rows 1000000 --queries 10000 > $OUT/f/data.log 2>&1 &
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
for r in 1 2; do
  /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 100 --columnar --json > $OUT/f/columnar-$r.json 2> $OUT/f/columnar-$r.err
  /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 100 --json > $OUT/f/lists-$r.json 2> $OUT/f/lists-$r.err
done
HIVE_GPU_PROFILE=1 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 100 --columnar --json > $OUT/f/columnar-profile.json 2> $OUT/f/columnar-profile.err
wait
for r in 1 2; do
  /tmp/hg/b/hive-gpu bench --backend cuda --base $w/c_base.fvecs --query $w/c_query.fvecs --groundtruth $w/c_groundtruth.ivecs -k 10 --index ivf-flat:nlist=1024 --search nprobe=4 --search nprobe=8 --batch 1 --nq 2000 --json > $OUT/f/ivf-one-$r.json 2> $OUT/f/ivf-one-$r.err
done
cd $OUT/f && for f in *.json; do echo "== $f"; cat $f; done; grep -c "columnar results" columnar-profile.err; grep "columnar results" columnar-profile.err | awk '{s+=$NF} END {print "columnar results ms total", s}'
