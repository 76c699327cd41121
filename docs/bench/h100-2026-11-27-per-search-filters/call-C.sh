#!/usr/bin/env bash
# Call C: where a filtered single query's time goes on CUDA, prepared against evaluated by
# every call (`HIVE_GPU_PROFILE=1`: the filter's evaluation, the mask, the gather, the search's
# phases, each after a synchronize), 1M x 128 Gaussian (seed 7), queries seed 8, k = 10.
set -u
rm -rf /tmp/hg && mkdir -p /tmp/hg $OUT/c && tar -C /tmp/hg -xJf .carry/binsC.tar.xz
. scripts/cuda-libs.sh
w=/tmp/w; mkdir -p $w
python3 scripts/make_gaussian_fvecs.py $w/g_base.fvecs > /dev/null 2>&1
python3 scripts/make_gaussian_fvecs.py $w/g_query.fvecs --rows 10000 --seed 8 > /dev/null 2>&1
b() { timeout 120 /tmp/hg/b/hive-gpu bench --backend cuda --base $w/g_base.fvecs --query $w/g_query.fvecs -k 10 --json --batch 1 --nq 50 "$@"; }
for S in 0.001 0.01; do
  HIVE_GPU_PROFILE=1 b --filter-selectivity $S > $OUT/c/prof-prepared-$S.json 2> $OUT/c/prof-prepared-$S.err
  HIVE_GPU_PROFILE=1 b --filter-selectivity $S --filter-per-search > $OUT/c/prof-per-search-$S.json 2> $OUT/c/prof-per-search-$S.err
done
b --filter-selectivity 0.001,0.01 > $OUT/c/one-prepared.json 2>/dev/null
b --filter-selectivity 0.001,0.01 --filter-per-search > $OUT/c/one-per-search.json 2>/dev/null
cd $OUT/c
python3 - <<'PY' > summary.txt
import glob, re, statistics, json
for f in sorted(glob.glob('prof-*.err')):
    phases = {}
    for line in open(f):
        m = re.match(r'hive-gpu profile \((.*?), ms\): (.*)', line.strip())
        if not m: continue
        label = re.sub(r'\d+', 'N', m.group(1))
        for part in m.group(2).split(', '):
            bits = part.rsplit(' ', 1)
            if len(bits) == 2:
                try: phases.setdefault((label, bits[0]), []).append(float(bits[1]))
                except ValueError: pass
    print('==', f)
    for (label, phase), v in sorted(phases.items()):
        print(f'  {label:50s} {phase:22s} n={len(v):6d} median={statistics.median(v):.4f}')
for f in sorted(glob.glob('*.json')):
    for l in open(f):
        try: m = json.loads(l)
        except ValueError: continue
        print(f, m.get('selectivity'), m.get('filter_prepared'), m.get('passing'), round(m.get('p50_ms'), 4))
PY
for f in prof-*.err; do xz -9 $f; done
cat summary.txt
