"""ncu_table.py DIR BASE OTHER: the medians of the GEMMs' duration and
executed instructions per variant and M, from DIR's ncu_<variant>_<M>_<n>.csv
(round_lib.sh ncu_fp8 / ncu_times: s62-ncu.sh, s62-e-round.sh, s63-ex-round.sh,
s67-fence-round.sh), OTHER against BASE; a kernel named gemm1... is GEMM1, any other GEMM2."""
import collections, csv, glob, os, statistics, sys

d, base, other = sys.argv[1], sys.argv[2], sys.argv[3]
out = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(d + '/ncu_*.csv')):
    _, v, m, _ = os.path.basename(f)[:-4].split('_')
    rows = [r for r in csv.reader(l for l in open(f) if l.startswith('"'))]
    if not rows:
        continue
    h = rows[0]
    iK, iM, iV = h.index('Kernel Name'), h.index('Metric Name'), h.index('Metric Value')
    for r in rows[1:]:
        k = 'gemm1' if 'gemm1' in r[iK] else 'gemm2'
        out[(m, k, r[iM].split('__')[1])][v].append(float(r[iV].replace(',', '')))
print('| M | kernel | metric | %s (median, n) | %s (median, n) | %s vs %s |' % (base, other, other, base))
for key in sorted(out, key=lambda t: (int(t[0]), t[1], t[2])):
    a, b = out[key][base], out[key][other]
    ma = statistics.median(a) if a else float('nan')
    mb = statistics.median(b) if b else float('nan')
    print('| %s | %s | %s | %.4g (%d) | %.4g (%d) | %+.2f%% |' % (*key, ma, len(a), mb, len(b), 100 * (mb / ma - 1)))
