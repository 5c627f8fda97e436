#!/usr/bin/env python3
"""Render `mxmoe validate --json` output as a Markdown table (for docs/VALIDATION.md).

  python3 scripts/validation_table.py validate_cuda.json [more.json ...]
"""
import json
import sys


def main():
    for path in sys.argv[1:]:
        d = json.load(open(path))
        print(f"`mxmoe validate --suite {d['suite']} --backend {d['backend']} --seed {d['seed']}`: "
              f"{d['passed']} passed, {d['failed']} failed\n")
        print("| case | status | max row rel L2 | min cosine | violations | 3 runs | graph | ideal rel L2 | ideal cosine |")
        print("|---|---|---:|---:|---:|---|---|---:|---:|")
        for c in d["cases"]:
            ideal = c.get("ideal", {})
            graph = c.get("graph_replays_identical")
            print(f"| {c['name']} | {c['status']} | {c['max_row_rel_l2']:.2e} | {c['min_cosine']:.7f} | "
                  f"{c['bound_violations']} | {'same' if c['deterministic_3_runs'] else 'DIFF'} | "
                  f"{'-' if graph is None else ('same' if graph else 'DIFF')} | "
                  + (f"{ideal['max_row_rel_l2']:.3f} | {ideal['min_cosine']:.4f} |" if ideal else "- | - |"))
        print()


if __name__ == "__main__":
    main()
