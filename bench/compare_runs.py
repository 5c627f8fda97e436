#!/usr/bin/env python3
"""A device round's benches as one markdown table: every variant's time per token count
(the mean of its rounds' medians, each round shown), the last variant's change against the
first, and the last variant against its floors and the PyTorch baseline of the same run.

Input: `mxmoe bench --json` files named by a pattern with {v} (the variant's name) and
{r} (the round), as the device rounds of sessions 40-45 wrote them, e.g.

    python3 bench/compare_runs.py OUT/l --variants a,b,c,d,e,f --rounds 1,2 --pattern '{v}_f8_{r}.json'
    python3 bench/compare_runs.py OUT/l --variants a,f --pattern '{v}_dec.json'

Columns for the last variant: `x floor` is its time over the larger of the HBM floor and
the MMA floor (the bench's own, for the precision it ran), `% peak` the MMA floor over its
time (the fraction of the measured tensor-core peak its routed FLOPs reach), `x torch`
the baseline's time over its time (`torch_us` of the run, when the bench was given one).
"""
import argparse
import json
import os
import statistics
import sys


def load(path, mode):
    """token count -> that mode's case of one bench file."""
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    return {c["tokens"]: c for c in cases if c["mode"] == mode}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="folder of the bench JSON files")
    ap.add_argument("--variants", required=True, help="comma-separated names, the baseline first")
    ap.add_argument("--rounds", default="1", help="comma-separated round names (default 1)")
    ap.add_argument("--pattern", required=True, help="file name with {v} and, for several rounds, {r}")
    ap.add_argument("--mode", default="graph", choices=("graph", "eager"))
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    rounds = a.rounds.split(",")
    if len(rounds) > 1 and "{r}" not in a.pattern:
        ap.error("several rounds need {r} in --pattern")

    runs = {}  # variant -> [round -> {tokens: case}]
    for v in variants:
        runs[v] = []
        for r in rounds:
            path = os.path.join(a.dir, a.pattern.format(v=v, r=r))
            if not os.path.exists(path):
                print(f"compare_runs: {path} is missing", file=sys.stderr)
                return 1
            runs[v].append(load(path, a.mode))
    tokens = sorted(set.intersection(*(set(rr) for v in variants for rr in runs[v])))
    if not tokens:
        print("compare_runs: no token count common to every file", file=sys.stderr)
        return 1

    first, last = variants[0], variants[-1]
    head = ["M"] + variants + [f"{last} vs {first}", "x floor", "% peak", "TFLOP/s", "x torch"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for m in tokens:
        mean = {v: statistics.mean(rr[m]["median_us"] for rr in runs[v]) for v in variants}
        cells = [str(m)]
        for v in variants:
            each = " / ".join(f"{rr[m]['median_us']:.1f}" for rr in runs[v])
            cells.append(each if len(rounds) > 1 else f"{mean[v]:.1f}")
        cells.append(f"{100.0 * (mean[last] / mean[first] - 1.0):+.1f}%")
        c = runs[last][-1][m]
        floor = max(c["hbm_floor_us"], c.get("mma_floor_us", 0.0))
        cells.append(f"{mean[last] / floor:.2f}x")
        mma = c.get("mma_floor_us", 0.0)
        cells.append(f"{100.0 * mma / mean[last]:.1f}%" if mma > 0 else "-")
        cells.append(f"{c['tflops'] * c['median_us'] / mean[last]:.0f}")
        torch = statistics.mean(rr[m].get("torch_us", 0.0) for rr in runs[last])
        cells.append(f"{torch / mean[last]:.2f}x" if torch > 0 else "-")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
