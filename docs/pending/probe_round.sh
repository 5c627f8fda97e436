#!/bin/bash
# Session 46 timing probe (one call): m = main, b = s46-drain, c = b without the slow word
# path, d = c without the drain's fences (c and d give wrong codes: timing only).
R=$PWD; cd "$(dirname "$0")"; tar xf probe.tar.xz; S=$OUT/summary.txt; T0=$SECONDS
summ() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))['cases']
print(' '.join('%d:%.1f' % (c['tokens'],c['median_us']) for c in d if c['mode']=='graph'))" $1 2>&1 | tail -1; }
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
for v in m b c d m b c d; do [ $((SECONDS - T0)) -lt 85 ] || break
  timeout 20 p/$v/mxmoe bench --tokens 128,1024,4096 --iterations 5 --precision fp8 --json $OUT/$v.json > /dev/null 2>&1; echo "$v rc=$? $(summ $OUT/$v.json)" >> $S
done
cat $S
