#!/usr/bin/env bash
# FAISS part 1; the clustered 1M and 10M sets.
set -u
mkdir -p /tmp/faiss /tmp/hg $OUT/a && cp .faiss/part.aa /tmp/faiss/
tar -C /tmp/hg -xJf .carry/cli.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpu.txt
mkdir -p /tmp/hive-ivf-bench /tmp/w10
python3 scripts/make_clustered_fvecs.py /tmp/hive-ivf-bench/c --rows 1000000 --queries 10000 > $OUT/a/data.log 2>&1 &
python3 scripts/make_clustered_fvecs.py /tmp/w10/c --rows 10000000 --queries 10000 > $OUT/a/data10m.log 2>&1
wait; ls -la /tmp/hive-ivf-bench /tmp/w10
