"""ncu_listing.py SASS_CSV LO HI: the same export per instruction, for kernel offsets
[LO, HI): offset, samples, executions, the instruction, its top three stall reasons.
Session 67 (PERFORMANCE.md, run 0).
"""
import csv,sys
f=sys.argv[1]; lo=int(sys.argv[2],0); hi=int(sys.argv[3],0)
rows=list(csv.reader(open(f))); hdr=rows[1]; data=rows[2:]
ia=hdr.index("Address"); isrc=hdr.index("Source"); ins=hdr.index("Warp Stall Sampling (All Samples)"); iex=hdr.index("Instructions Executed")
reasons=[h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
ir={r:hdr.index(r) for r in reasons}
base=int(data[0][ia],16)
for r in data:
    a=int(r[ia],16)-base
    if a<lo or a>=hi: continue
    top=sorted(((int(r[ir[x]] or 0),x[6:]) for x in reasons),reverse=True)[:3]
    print(f"{a:#07x} {int(r[ins] or 0):5d} {int(r[iex] or 0):9d} {r[isrc].strip()[:60]:60s} "+" ".join(f"{n}:{v}" for v,n in top if v))
