"""ncu_regions.py SASS_CSV [GRANULE]: an ncu source export (`ncu --import R --page source
--csv --print-source sass`, with the WarpStateStats and SourceCounters sections) summed by
code region of GRANULE bytes (default 0x400): warp-state samples, their share, executed
warp instructions, executed HGMMA, the top five stall reasons. Regions under 0.5% of the
samples are left out. Session 67 (PERFORMANCE.md, run 0).
"""
import csv,sys,collections
f=sys.argv[1]; gran=int(sys.argv[2],0) if len(sys.argv)>2 else 0x400
rows=list(csv.reader(open(f)))
hdr=rows[1]; data=rows[2:]
ia=hdr.index("Address"); isrc=hdr.index("Source"); ins=hdr.index("Warp Stall Sampling (All Samples)"); iex=hdr.index("Instructions Executed")
reasons=[h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
ir={r:hdr.index(r) for r in reasons}
base=int(data[0][ia],16)
agg=collections.OrderedDict()
tot=0
for r in data:
    a=int(r[ia],16)-base; s=int(r[ins] or 0); tot+=s
    k=a//gran*gran
    d=agg.setdefault(k,collections.Counter())
    d['_s']+=s; d['_ex']+=int(r[iex] or 0)
    for x in reasons: d[x]+=int(r[ir[x]] or 0)
    if 'HGMMA' in r[isrc]: d['_hgmma']+=int(r[iex] or 0)
print("total samples",tot)
for k,d in agg.items():
    if d['_s']<tot*0.005: continue
    top=sorted(((d[x],x[6:]) for x in reasons),reverse=True)[:5]
    print(f"{k:#07x} {d['_s']:6d} {100*d['_s']/tot:5.1f}% ex={d['_ex']:9d} hg={d['_hgmma']:8d} "+" ".join(f"{n}:{v}" for v,n in top if v))
