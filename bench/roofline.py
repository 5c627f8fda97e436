#!/usr/bin/env python3
"""Roofline plot of `mxmoe bench --json` results against the H200's measured ceilings.

    python3 bench/roofline.py bench.json [more.json ...] docs/roofline.png [--hbm-tbps 4.25]

Each JSON file is one series (e.g. the all-local decode cases and `--ep-ranks 32`).
x: arithmetic intensity of a case (routed-row FLOPs / bytes of the experts touched);
y: achieved TFLOP/s (graph replay). The roofs are the measured HBM copy bandwidth and
the dense BF16 and FP8 tensor-core peaks (../shared/H200.md). Needs matplotlib.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", help="bench JSON files, then the PNG to write")
    ap.add_argument("--labels", default="", help="comma-separated series labels")
    ap.add_argument("--hbm-tbps", type=float, default=4.25)
    ap.add_argument("--bf16-tflops", type=float, default=792.0)
    ap.add_argument("--fp8-tflops", type=float, default=1448.0)
    ap.add_argument("--title", default="mxmoe on H200, Kimi-K3 expert layer (E_local 28, top-16)")
    a = ap.parse_args()
    *jsons, png = a.files
    labels = a.labels.split(",") if a.labels else jsons
    series = []
    for path, label in zip(jsons, labels):
        data = json.load(open(path))
        cases = data["cases"] if isinstance(data, dict) else data
        rows = [r for r in cases if r.get("mode") == "graph"]
        if not rows:
            raise SystemExit(f"{path}: no graph-mode rows")
        series.append((label, rows))
    fig, ax = plt.subplots(figsize=(8, 6))
    xs = [0.5 * 1.05 ** i for i in range(200)]  # dense, so the roof's kink is drawn
    for peak, name, style in ((a.bf16_tflops, "BF16 tensor cores", "-"), (a.fp8_tflops, "FP8 tensor cores", ":")):
        ax.plot(xs, [min(peak, a.hbm_tbps * x) for x in xs], style, color="gray", lw=1.2,
                label=f"{name} {peak:.0f} TFLOP/s, HBM {a.hbm_tbps} TB/s")
    lines = []
    for (label, rows), color, marker in zip(series, ("tab:blue", "tab:orange", "tab:green"), "osD"):
        lines.append(label)
        for i, r in enumerate(rows):
            ai = r["tflops"] / r["tbps"]  # FLOP per byte: both are per second
            # The roof of the case's own tensor cores: the FP8 mode's against the FP8 peak.
            peak = a.fp8_tflops if r.get("precision") == "fp8" else a.bf16_tflops
            roof = min(peak, a.hbm_tbps * ai)
            ax.scatter([ai], [r["tflops"]], color=color, marker=marker, zorder=3,
                       label=label if i == 0 else None)
            ax.annotate(str(r["tokens"]), (ai, r["tflops"]), textcoords="offset points",
                        xytext=(-6, 7 if i % 2 else -13), fontsize=7, color=color)
            lines.append(f"  M={r['tokens']:<5} {r['median_us']:8.1f} us  {100 * r['tflops'] / roof:3.0f}% of roof")
    ax.text(0.02, 0.98, "\n".join(lines), transform=ax.transAxes, va="top", ha="left",
            fontsize=7, family="monospace", bbox=dict(facecolor="white", alpha=0.85, lw=0.5))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of experts touched)")
    ax.set_ylabel("achieved TFLOP/s (CUDA graph replay)")
    ax.set_ylim(1, 3000)
    ax.set_title(a.title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png} ({sum(len(r) for _, r in series)} cases)")


if __name__ == "__main__":
    main()
