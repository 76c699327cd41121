#!/usr/bin/env bash
# Call C (CLI of 54998fb): the phases of one 1,000-query piece over the 10,253 rows of S = 0.01
# with nothing beside it on the device (one piece worker, HIVE_GPU_PROFILE), f32 and TF32.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/c && xz -dc .carry/cliA.xz > /tmp/hg/hive-gpu && chmod +x /tmp/hg/hive-gpu
. scripts/cuda-libs.sh
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
H=/tmp/hg/hive-gpu
G="--backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs --columnar --reuse-results --json -k 10 --filter-selectivity 0.01"
HIVE_GPU_PROFILE=1 HIVE_GPU_SMALL_PIECE_WORKERS=1 timeout 120 $H bench $G > $OUT/c/w1.json 2> $OUT/c/w1.err
HIVE_GPU_PROFILE=1 HIVE_GPU_SMALL_PIECE_WORKERS=1 timeout 120 $H bench $G --precision fast > $OUT/c/w1-tf32.json 2> $OUT/c/w1-tf32.err
timeout 200 ncu --csv --metrics gpu__time_duration.sum --launch-skip 3000 --launch-count 400 $H bench $G --nq 1000 > $OUT/c/ncu.csv 2>&1
cd $OUT/c
for f in w1.err w1-tf32.err; do echo "== $f"; grep "GemmF\|GemmT" $f | tail -40 | python3 -c "
import sys,re,statistics as st
rows=[dict((k,float(v)) for k,v in re.findall(r'(\w[\w+]*) ([0-9.]+)', l.split('ms):')[1])) for l in sys.stdin]
for k in rows[0]: print(k, round(st.median(r[k] for r in rows),3))
"; done > summary.txt
python3 - >> summary.txt <<'P'
import csv,collections
d=collections.defaultdict(list)
for r in csv.reader(open('ncu.csv')):
    if len(r)>10 and r[-3]=='gpu__time_duration.sum':
        d[r[4].split('(')[0]].append(float(r[-1]))
for k,v in sorted(d.items(), key=lambda kv:-sum(kv[1])):
    v.sort(); print('ncu', k, len(v), 'median', v[len(v)//2], 'sum', round(sum(v)))
P
cat summary.txt
tar -cJf logs.tar.xz *.err *.json ncu.csv && rm -f *.err *.json ncu.csv; ls
