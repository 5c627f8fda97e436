# round_lib.sh — helpers of the device round scripts (sourced; session 56 on). The round
# script sets B (the unpacked binaries) and sources this beside itself:
#   . "$(dirname "$0")/round_lib.sh"
# S: the summary ($OUT/00summary.txt, sorts first); L: the logs; t0: the round's start.
S=$OUT/00summary.txt; L=$OUT/l; mkdir -p $L; t0=$(date +%s)
RL_DIR=$(dirname "${BASH_SOURCE[0]}")  # where this file (and ncu_table.py) lie
note() { echo "$*" | tee -a $S; }                       # to the summary and stdout
left() { [ $(( $(date +%s) - t0 )) -lt $1 ] || { note "skipped past $1 s: $2"; return 1; }; }
passed() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }  # a gtest log's verdict
el() { echo "($(( $(date +%s) - t0 )) s)"; }            # seconds since the start
# summ BENCH.json: each graph case as tokens:us/x floor/x torch/% of the MMA peak
summ() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))['cases']
print(' '.join('%d:%.1fus/%.2fxfloor/%.2fxtorch/%.1f%%' % (c['tokens'],c['median_us'],c['median_us']/max(c['hbm_floor_us'],c['mma_floor_us']),(c.get('torch_us') or 0)/c['median_us'],100*c['tflops']/c['mma_tflops_ceiling']) for c in d if c['mode']=='graph'))" $1 2>&1 | tail -1; }
# torch_prefill: the PyTorch BF16 baseline at the prefill sizes into $L/T.json (f8 reads it)
torch_prefill() { timeout 80 python3 bench/torch_baseline.py --tokens 128,512,1024,4096 --iterations 10 --json $L/T.json > $L/T.log 2>&1
  note "torch prefill rc=$? $(el)"; }
# prefill_bench PRECISION TAG NAME BIN ROUND: BIN's layer in PRECISION at the prefill sizes
# beside $L/T.json, as $L/NAME_TAG_ROUND.json; f8 and exact_bench are its two forms
prefill_bench() { timeout 45 $4/mxmoe bench --tokens 128,512,1024,4096 --iterations 10 --precision $1 --baseline $L/T.json \
    --json $L/${3}_$2_$5.json > $L/${3}_$2_$5.log 2>&1; note "$1 $3 r$5 rc=$? $(summ $L/${3}_$2_$5.json) $(el)"; }
# f8 NAME BIN ROUND: the FP8 layer, as $L/NAME_f8_ROUND.json
f8() { prefill_bench fp8 f8 "$@"; }
# exact_bench NAME BIN ROUND: the exact layer, as $L/NAME_exact_ROUND.json (session 69)
exact_bench() { prefill_bench exact exact "$@"; }
# unpack PACK TMP NAME: PACK/bins.tar.xz into TMP once (TMP/NAME/mxmoe there: done), and
# echoes TMP/NAME, the binaries' folder (session 67)
unpack() { mkdir -p $2 && { [ -x $2/$3/mxmoe ] || tar xJf $1/bins.tar.xz -C $2; }; echo $2/$3; }
# gpu_name: the first GPU's name, as nvidia-smi gives it
gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader | head -1; }
# suite_cuda NAME BIN: BIN's test_suite_cuda (160 s), its verdict and first failures
suite_cuda() { timeout 160 $2/test_suite_cuda --gtest_brief=1 > $L/${1}_suite.log 2>&1
  note "$1 test_suite_cuda rc=$? $(passed $L/${1}_suite.log) $(el)"
  grep -E "FAILED|Failure" $L/${1}_suite.log | head -3 | tee -a $S; }
# ab_rounds UNTIL TOKENS ITER ROUNDS NAME BIN [NAME BIN ...]: ROUNDS rounds of each BIN's
# exact layer at TOKENS, ITER iterations a call, while the round is under UNTIL s, as
# $L/ex/NAME_f8_r.json (`L=$L/ex f8_table NAME...` reads them; session 67). Round r starts
# r - 1 places further along the list, so two binaries alternate (A B, B A, A B, ...) and
# more rotate (session 69).
ab_rounds() { local until=$1 tokens=$2 iter=$3 rounds=$4 r i k n x; shift 4; mkdir -p $L/ex
  local names=() bins=(); while [ $# -ge 2 ]; do names+=("$1"); bins+=("$2"); shift 2; done
  n=${#names[@]}
  for r in $(seq 1 $rounds); do
    for k in $(seq 0 $(( n - 1 ))); do
      i=$(( (r - 1 + k) % n )); x=${names[$i]}
      left $until "exact $x r$r" || return 0
      timeout 60 ${bins[$i]}/mxmoe bench --tokens $tokens --iterations $iter --json $L/ex/${x}_f8_$r.json \
        > $L/ex/${x}_$r.log 2>&1
      note "exact $x r$r rc=$? $(summ $L/ex/${x}_f8_$r.json) $(el)"
    done
  done; }
# decode_rounds NAME BIN ROUNDS: the PyTorch BF16 baseline at M=1..32 into $L/Td.json, then
# ROUNDS rounds of BIN's layer at those sizes beside it, as $L/NAME_dec_<round>.json (session 68)
decode_rounds() { local r
  timeout 50 python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32 --iterations 10 --json $L/Td.json > $L/Td.log 2>&1
  note "torch decode rc=$? $(el)"
  for r in $(seq 1 $3); do
    timeout 40 $2/mxmoe bench --tokens 1,2,4,8,16,32 --iterations 20 --baseline $L/Td.json --json $L/${1}_dec_$r.json > $L/${1}_dec_$r.log 2>&1
    note "decode r$r rc=$? $(summ $L/${1}_dec_$r.json) $(el)"
  done; }
# m16k NAME BIN ROUNDS: the PyTorch BF16 baseline at M=16384 into $L/T16.json, then ROUNDS
# rounds of BIN's exact and FP8 layers there beside it (alternating which goes first), as
# $L/NAME_<precision>_16k_<round>.json (session 68)
m16k() { local r x order
  timeout 150 python3 bench/torch_baseline.py --tokens 16384 --iterations 5 --json $L/T16.json > $L/T16.log 2>&1
  note "torch 16384 rc=$? $(el)"
  for r in $(seq 1 $3); do
    order="exact fp8"; [ $(( r % 2 )) = 0 ] && order="fp8 exact"
    for x in $order; do
      timeout 120 $2/mxmoe bench --tokens 16384 --iterations 5 --precision $x --baseline $L/T16.json \
        --json $L/${1}_${x}_16k_$r.json > $L/${1}_${x}_16k_$r.log 2>&1
      note "$x 16384 r$r rc=$? $(summ $L/${1}_${x}_16k_$r.json) $(el)"
    done
  done; }
# kernels_at NAME BIN M: every kernel of one exact bench call of BIN at M under ncu, as the
# median us per kernel name into the summary (a probe's check that no generic fallback
# did the work: gemm1_act_kernel / gemm2_kernel leave at once, ~3 us; session 69)
kernels_at() { timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --csv $2/mxmoe bench --tokens $3 \
    --iterations 1 > $L/${1}_all_kernels_$3.csv 2>&1
  note "$1's kernels at M=$3 rc=$? (median us per kernel) $(el):"
  python3 - $L/${1}_all_kernels_$3.csv <<'PY' | tee -a $S
import csv, collections, statistics, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0] if rows else []
if 'Kernel Name' not in h: print('  (no ncu rows)'); sys.exit()
iK, iN, iU, iV = (h.index(x) for x in ('Kernel Name', 'Metric Name', 'Metric Unit', 'Metric Value'))
us = {'nsecond': 1e-3, 'ns': 1e-3, 'usecond': 1.0, 'us': 1.0, 'msecond': 1e3, 'ms': 1e3}; t = collections.defaultdict(list)
for r in rows[1:]:
    if r[iN] == 'gpu__time_duration.sum': t[r[iK].split('(')[0].split('<')[0]].append(float(r[iV].replace(',', '')) * us[r[iU]])
for k, v in sorted(t.items(), key=lambda kv: -statistics.median(kv[1])): print('  %-28s %8.1f us (%d)' % (k, statistics.median(v), len(v)))
PY
}
# m16k_on_h200 NAME BIN: m16k NAME BIN 2 where the GPU is an H200 (issue 5's figures are
# the H200's), else a note that it was skipped (session 69)
m16k_on_h200() { case "$(gpu_name)" in *H200*) m16k $1 $2 2 ;; *) note "not an H200: M=16384 skipped" ;; esac; }
# gemm1_ncu_mq TAG NCU_ARGS...: ncu (NCU_ARGS, CSV) of gemm1_prefill, one launch past the
# first two, for the round's $m and $q at M=128 and 32, as $L/TAG_<m|q>_<M>.csv (session 69)
gemm1_ncu_mq() { local tag=$1 b bin M; shift
  for b in m q; do
    bin=$m; [ $b = q ] && bin=$q
    for M in 128 32; do
      timeout 90 ncu --clock-control none --kernel-name regex:gemm1_prefill --launch-skip 2 --launch-count 1 "$@" \
        --csv $bin/mxmoe bench --tokens $M --iterations 1 > $L/${tag}_${b}_$M.csv 2>&1
      note "$tag $b $M rc=$? $(el)"
    done
  done; }
# pack_logs: the logs as one archive under $OUT (fewer files to bring back)
pack_logs() { tar czf /tmp/all.tgz -C $OUT l 2>/dev/null; rm -rf $L; mv /tmp/all.tgz $OUT/; }
# gtests NAME BIN FILTER SECONDS: BIN's test_engine on FILTER, its verdict and first failures
gtests() { timeout $4 $2/test_engine --gtest_brief=1 --gtest_filter="$3" > $L/${1}_tests.log 2>&1
  note "$1 test_engine $3 rc=$? $(passed $L/${1}_tests.log) $(el)"; grep -E "FAILED|Failure" $L/${1}_tests.log | head -5 | tee -a $S; }
# sancheck NAME BIN TOOL FILTER: compute-sanitizer TOOL (memcheck, racecheck, synccheck) of
# BIN's test_engine on FILTER, its summary line and verdict; SAN_S seconds (default 60)
sancheck() { timeout ${SAN_S:-60} compute-sanitizer --tool $3 --error-exitcode 9 $2/test_engine --gtest_brief=1 \
    --gtest_filter="$4" > $L/${1}_$3.log 2>&1
  note "$1 $3 rc=$? $(grep -E 'SUMMARY' $L/${1}_$3.log | tr '\n' ' ') $(passed $L/${1}_$3.log) $(el)"; }
# memcheck NAME BIN FILTER: sancheck's memcheck
memcheck() { sancheck "$1" "$2" memcheck "$3"; }
# ncu_fp8 NAME BIN M [SECONDS]: ncu of BIN's gemm1_fp8 / gemm2_fp8 over one bench call at M
# (duration and executed instructions, unmodified clocks) as $L/ncu_NAME_M_<n>.csv, for
# ncu_table.py (session 62)
ncu_fp8() { ncu_times "$1" "$2" "$3" 'gemm[12]_fp8' fp8 "${4:-40}"; }
# ncu_times NAME BIN M KERNELS PRECISION [SECONDS]: the same for the kernels matching the
# regex KERNELS over one bench call of PRECISION (exact, fp8) at M, as
# $L/ncu_NAME_M_<n>.csv (session 67: gemm2_prefill)
ncu_times() { local n; n=$(ls $L/ncu_${1}_${3}_*.csv 2>/dev/null | wc -l)
  timeout ${6:-40} ncu --clock-control none --kernel-name regex:"$4" \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv \
    $2/mxmoe bench --tokens $3 --iterations 1 --precision $5 > $L/ncu_${1}_${3}_$n.csv 2>&1
  note "ncu $1 $3 rc=$? $(el)"; }
# f8_table BASE V...: the f8 rounds' graph times per M (MODE=eager: the eager ones), each
# variant against BASE (medians)
f8_table() { python3 - $L "${MODE:-graph}" "$@" <<'PY' | tee -a $S
import json, sys, glob, statistics as st
L, mode, vs = sys.argv[1], sys.argv[2], sys.argv[3:]; t = {}
for f in sorted(glob.glob(L + '/*_f8_*.json')):
    v = f.split('/')[-1].split('_')[0]
    for c in json.load(open(f))['cases']:
        if c['mode'] == mode: t.setdefault((c['tokens'], v), []).append(c['median_us'])
print('| M | ' + ' | '.join(vs) + ' | ' + ' | '.join('%s vs %s' % (v, vs[0]) for v in vs[1:]) + ' |')
for M in sorted({k[0] for k in t}):
    g = {v: t.get((M, v), [float('nan')]) for v in vs}
    print('| %d | %s | %s |' % (M, ' | '.join(' / '.join('%.1f' % x for x in g[v]) for v in vs),
          ' | '.join('%+.1f%%' % (100 * (st.median(g[v]) / st.median(g[vs[0]]) - 1)) for v in vs[1:])))
PY
}
# ncu_alt BASE OTHER M: ncu_fp8 of BASE, OTHER, OTHER, BASE at M (each while the round is
# under 100 s), then ncu_table.py's comparison (session 63)
ncu_alt() { local v; for v in $1 $2 $2 $1; do left 100 "ncu $v $3" && ncu_fp8 $v $B/$v $3; done
  python3 "$RL_DIR/ncu_table.py" $L $1 $2 | tee -a $S; }
# layer_rounds UNTIL V...: for each V in order (while the round is under UNTIL s), the FP8
# layer (f8) and the exact one at M=128 / 1024 / 4096 (as $L/ex/V_f8_n.json, so that
# f8_table reads them), both beside $L/T.json (session 63)
layer_rounds() { local until=$1 v n; shift; mkdir -p $L/ex
  for v in "$@"; do
    left $until "layer rounds $v" || break
    n=$(( $(ls $L/${v}_f8_*.json 2>/dev/null | wc -l) + 1 )); f8 $v $B/$v $n
    timeout 60 $B/$v/mxmoe bench --tokens 128,1024,4096 --iterations 10 --baseline $L/T.json \
      --json $L/ex/${v}_f8_$n.json > $L/ex/${v}_ex_$n.log 2>&1
    note "exact $v r$n rc=$? $(summ $L/ex/${v}_f8_$n.json) $(el)"
  done; }
# ex_table BASE OTHER: f8_table of the FP8 rounds, then of the exact ones
ex_table() { f8_table "$@"; note "exact path (files named _f8_ for f8_table):"; L=$L/ex f8_table "$@"; L=${L%/ex}; }
# clock_probe NAME BIN M [ITER] [PRECISION]: the SM clock and board power (nvidia-smi every
# 50 ms, instantaneous power) while BIN's layer at M (PRECISION fp8, the default, or exact)
# runs ITER (default 600) iterations
# eager and then graph, ~3 s each at M=4096: the median clock and power of the samples
# drawing over 300 W, beside the bench's times. Session 63's first form (40 iterations,
# averaged power) caught 4-6 busy samples of ~360: the timed loops were under a second
# of a call mostly spent setting up.
clock_probe() { local smi q=power.draw.instant f=$L/clk_${1}_${5:-fp8}_$3_$(date +%s%N)
  nvidia-smi --query-gpu=$q --format=csv,noheader > /dev/null 2>&1 || q=power.draw  # older drivers
  nvidia-smi --query-gpu=clocks.sm,$q --format=csv,noheader,nounits -lms 50 > $f.csv 2>&1 &
  smi=$!; sleep 0.3
  timeout 90 $2/mxmoe bench --tokens $3 --iterations ${4:-600} --precision ${5:-fp8} > $f.log 2>&1
  kill $smi; wait $smi 2>/dev/null
  note "clock $1 ${5:-fp8} M=$3 $(python3 -c "
import sys, statistics as st
r = []
for l in open(sys.argv[1]):
    try: r.append(tuple(float(x) for x in l.split(',')))
    except ValueError: pass
b = [(c, p) for c, p in r if p > 300]
print('%d of %d samples over 300 W: SM clock median %.0f MHz, power median %.0f W' % (len(b), len(r),
      st.median(c for c, _ in b) if b else 0, st.median(p for _, p in b) if b else 0))" $f.csv) $(awk -v m=$3 '$2!="mode"&&$1==m{printf "%s %s us ", $2, $4}' $f.log)"; }
