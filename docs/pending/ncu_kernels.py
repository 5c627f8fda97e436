"""Every kernel of an ncu --csv log (metrics gpu__time_duration.sum, smsp__inst_executed.sum,
dram__bytes_read.sum), one line each, longest first: launches, median duration, executed
warp instructions, DRAM bytes read (session 64's s64-diag-round.sh; its own file since
session 66). Usage: python3 ncu_kernels.py NCU.csv"""
import csv, sys, statistics as st

rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]
ki, mi, vi, ui = (h.index(x) for x in ('Kernel Name', 'Metric Name', 'Metric Value', 'Metric Unit'))
unit = {'ns': 1e-3, 'nsecond': 1e-3, 'us': 1, 'usecond': 1, 'ms': 1e3, 'msecond': 1e3}  # to us; counts: SI prefixes
si = {'K': 1e3, 'M': 1e6, 'G': 1e9}
t = {}
for r in rows[1:]:
    k = r[ki].replace('(anonymous namespace)::', '').replace('void ', '')
    k = k[:k.index('(')] if '(' in k else k  # the name and its template arguments
    k = k[k.rfind('::', 0, k.find('<') if '<' in k else len(k)) + 2:] if '::' in k else k
    u = r[ui]
    f = unit.get(u, si.get(u[:1], 1) if u[:1] in si and len(u) > 1 else 1)
    t.setdefault((k, r[mi]), []).append(float(r[vi].replace(',', '')) * f)
for k in sorted({k for k, _ in t}, key=lambda k: -st.median(t[(k, 'gpu__time_duration.sum')])):
    d = t[(k, 'gpu__time_duration.sum')]
    print('  %-44s n=%2d median %8.1f us  inst %7.2f M  dram read %7.1f MB' % (k, len(d), st.median(d),
          st.median(t.get((k, 'smsp__inst_executed.sum'), [0])) / 1e6,
          st.median(t.get((k, 'dram__bytes_read.sum'), [0])) / 1e6))
