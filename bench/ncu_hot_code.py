#!/usr/bin/env python3
"""Where a kernel's warps stall, and whether its hot code aliases in the instruction cache.

Input: the per-instruction export of an Nsight Compute report,
    ncu --section WarpStateStats --section SourceCounters -k regex:NAME \
        --launch-skip 2 --launch-count 1 -o REP  mxmoe bench --tokens M --iterations 1
    ncu --import REP.ncu-rep --page source --csv --print-source sass > REP.sass.csv

Prints the warp-stall samples by reason, then the hot code (128-byte lines whose
instructions ran at least --hot times) as address ranges, and for each period P how many
cache sets modulo P hold 1, 2, 3... hot lines. Session 20 (docs/PERFORMANCE.md) found a
GEMM1 kernel whose epilogue missed the instruction cache at every 256 bytes
(no_inst stalls) when cold code spread its hot code so that lines aliased modulo 64 KB.
With --top REASON it lists the instructions with the most samples of that reason
(e.g. stall_no_inst, stall_long_sb, or "Warp Stall Sampling (All Samples)"); with
--regions BYTES the samples per code region (session 67: which loop, and which part of
it, the warps wait in); with --listing LO HI every instruction in [LO, HI).
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
LINE = 128  # bytes per cache line of the analysis
PERIODS_KB = (16, 32, 64, 128)


def value(text):
    """A metric as a number ('-' and empty as 0), or the text where it is not one."""
    t = text.replace(",", "").strip()
    if t in ("", "-"):
        return 0.0
    try:
        return float(t)
    except ValueError:
        return text


def load(path):
    """(kernel name, rows): each row a dict with the instruction's offset in bytes
    from the kernel's first, its source text and its metrics as numbers."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    kernel = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    header = next((r for r in rows if "Address" in r and "Source" in r), None)
    if header is None:
        raise SystemExit(f"{path}: no 'Address' / 'Source' header: not an ncu --page source export")
    start = rows.index(header) + 1
    out = []
    base = None
    for r in rows[start:]:
        if len(r) != len(header):
            continue
        d = dict(zip(header, r))
        addr = int(d["Address"], 16)
        base = addr if base is None else base
        row = {"offset": addr - base, "source": d["Source"].strip()}
        for k, v in d.items():
            if k not in ("Address", "Source"):
                row[k] = value(v)
        out.append(row)
    return kernel, out


def reasons_of(row):
    """A row's stall samples by reason (issued and not issued), as stall_totals counts them."""
    return collections.Counter({k[len("stall_"):]: v for k, v in row.items()
                                if k.startswith("stall_") and "(Not Issued)" not in k and isinstance(v, float)})


def stall_totals(rows):
    reasons = collections.Counter()
    for r in rows:
        reasons.update(reasons_of(r))
    return reasons


def hot_lines(rows, min_executed):
    return sorted({r["offset"] // LINE for r in rows if r.get(EXECUTED, 0.0) >= min_executed})


def ranges(lines):
    """Contiguous runs of hot lines (gaps of up to 2 lines joined), as byte ranges."""
    out = []
    for line in lines:
        if out and line <= out[-1][1] + 2:
            out[-1][1] = line
        else:
            out.append([line, line])
    return [(a * LINE, (b + 1) * LINE) for a, b in out]


def alias_histogram(lines, period_bytes):
    """{k: number of sets modulo period_bytes that hold k hot lines}."""
    per_set = collections.Counter((line * LINE) % period_bytes // LINE for line in lines)
    return dict(sorted(collections.Counter(per_set.values()).items()))


def top_reasons(reasons, n):
    return " ".join(f"{k}:{v:.0f}" for k, v in reasons.most_common(n) if v)


def print_regions(rows, granule):
    """Samples, their share, executions, HGMMA executions and top reasons per code region
    of `granule` bytes (regions under 0.5% of the samples left out)."""
    total = sum(r.get(SAMPLES, 0.0) for r in rows)
    print(f"  total samples {total:.0f}")
    regions = collections.OrderedDict()
    for r in rows:
        g = regions.setdefault(r["offset"] // granule * granule,
                               {"samples": 0.0, "executed": 0.0, "hgmma": 0.0, "reasons": collections.Counter()})
        g["samples"] += r.get(SAMPLES, 0.0)
        g["executed"] += r.get(EXECUTED, 0.0)
        if "HGMMA" in r["source"]:
            g["hgmma"] += r.get(EXECUTED, 0.0)
        g["reasons"] += reasons_of(r)
    for start, g in regions.items():
        if total <= 0 or g["samples"] < 0.005 * total:
            continue
        print(f"  {start:#07x} {g['samples']:6.0f} {100 * g['samples'] / total:5.1f}% ex={g['executed']:9.0f} "
              f"hg={g['hgmma']:8.0f} {top_reasons(g['reasons'], 5)}")


def print_listing(rows, lo, hi):
    """Each instruction at offsets [lo, hi): samples, executions, source, top reasons."""
    for r in rows:
        if lo <= r["offset"] < hi:
            print(f"  {r['offset']:#07x} {r.get(SAMPLES, 0.0):5.0f} {r.get(EXECUTED, 0.0):9.0f} "
                  f"{r['source'][:60]:60s} {top_reasons(reasons_of(r), 3)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="ncu --page source --csv --print-source sass exports")
    ap.add_argument("--hot", type=float, default=2000, help="executions that make an instruction hot")
    ap.add_argument("--top", metavar="REASON", help="list the instructions with most samples of REASON")
    ap.add_argument("-n", type=int, default=20, help="how many instructions --top lists")
    ap.add_argument("--regions", type=lambda t: int(t, 0), metavar="BYTES",
                    help="also the samples per code region of BYTES (e.g. 0x200): where in the kernel the warps wait")
    ap.add_argument("--listing", nargs=2, type=lambda t: int(t, 0), metavar=("LO", "HI"),
                    help="also each instruction at offsets [LO, HI) with its samples and top stall reasons")
    a = ap.parse_args(argv)
    for path in a.csv:
        kernel, rows = load(path)
        samples = sum(r.get(SAMPLES, 0.0) for r in rows)
        executed = sum(r.get(EXECUTED, 0.0) for r in rows)
        print(f"== {path}: {kernel[:100]}")
        print(f"  static {len(rows)} instructions ({len(rows) * 16 // 1024} KB), "
              f"warp instructions executed {executed:.0f}, stall samples {samples:.0f}")
        reasons = stall_totals(rows)
        if samples > 0:
            print("  " + ", ".join(f"{k} {100 * v / samples:.1f}%" for k, v in reasons.most_common(10)))
        lines = hot_lines(rows, a.hot)
        print(f"  hot: {len(lines)} lines of {LINE} B ({len(lines) * LINE // 1024} KB) in "
              + " ".join(f"{x:#x}-{y:#x}" for x, y in ranges(lines)))
        for p in PERIODS_KB:
            print(f"  sets modulo {p} KB holding k hot lines, {{k: sets}}: {alias_histogram(lines, p * 1024)}")
        if a.regions:
            print_regions(rows, a.regions)
        if a.listing:
            print_listing(rows, *a.listing)
        if a.top:
            key = a.top if a.top in rows[0] else f"stall_{a.top}"
            if rows and key not in rows[0]:
                raise SystemExit(f"--top: no column {a.top!r}")
            for r in sorted(rows, key=lambda r: -r.get(key, 0.0))[: a.n]:
                print(f"  {r['offset']:#08x} {r.get(key, 0.0):6.0f} executed {r.get(EXECUTED, 0.0):9.0f}  {r['source'][:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
