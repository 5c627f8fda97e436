#!/usr/bin/env python3
"""The PyTorch BF16 baseline a user would write without mxmoe (H200.md).

Kimi-K3 routed experts on one EP32 rank (28 local experts, K 3584, N 3072, top-16, every
token's 16 experts local, as in `mxmoe bench`): weights dequantized to BF16 once, rows
sorted by expert, torch._grouped_mm for both GEMMs, SiTU in PyTorch, weighted
scatter-sum. Timed with CUDA events, median of many, L2 flushed before each run.

  python3 bench/torch_baseline.py --tokens 1,2,4,8,16,32,128 --json out.json
writes {"<M>": median_us, ..., "_meta": {...}} for `mxmoe bench --baseline out.json`.
"""
import argparse
import json
import statistics

import torch


def situ(g, u, alpha=4.0, beta=25.0):
    return alpha * torch.tanh(g / alpha) * torch.sigmoid(g) * beta * torch.tanh(u / beta)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,2,4,8,16,32,128")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    dev = torch.device("cuda")
    E, K, N, TOPK = 28, 3584, 3072, 16
    g = torch.Generator(device=dev).manual_seed(0)
    # Dequantized weights: values do not change the time; BF16 [E, 2N, K] and [E, K, N].
    w13 = (torch.randn(E, 2 * N, K, device=dev, generator=g) / K**0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, K, N, device=dev, generator=g) / N**0.5).to(torch.bfloat16)
    w13_t = w13.transpose(1, 2)  # [E, K, 2N] view, column-major as grouped_mm prefers
    w2_t = w2.transpose(1, 2)    # [E, N, K]
    flush = torch.empty(4 * 60 * 2**20, dtype=torch.uint8, device=dev)
    use_grouped = hasattr(torch, "_grouped_mm")
    results = {}
    for M in [int(t) for t in a.tokens.split(",")]:
        x = torch.randn(M, K, device=dev, generator=g).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, device=dev, generator=g)[:TOPK] for _ in range(M)]).to(torch.int32)
        wts = torch.full((M, TOPK), 1.0 / TOPK, device=dev)

        def moe():
            flat = ids.flatten()
            order = torch.argsort(flat, stable=True)
            rows = x[order // TOPK]
            counts = torch.bincount(flat, minlength=E)
            offs = torch.cumsum(counts, 0).to(torch.int32)
            if use_grouped:
                h = torch._grouped_mm(rows, w13_t, offs=offs)
            else:
                h = torch.cat([rows[s:e] @ w13_t[i] for i, (s, e) in enumerate(zip([0] + offs[:-1].tolist(), offs.tolist()))])
            gate, up = h[:, :N], h[:, N:]
            act = situ(gate.float(), up.float()).to(torch.bfloat16)
            if use_grouped:
                y = torch._grouped_mm(act, w2_t, offs=offs)
            else:
                y = torch.cat([act[s:e] @ w2_t[i] for i, (s, e) in enumerate(zip([0] + offs[:-1].tolist(), offs.tolist()))])
            out = torch.zeros(M, K, device=dev, dtype=torch.float32)
            out.index_add_(0, order // TOPK, y.float() * wts.flatten()[order, None])
            return out.to(torch.bfloat16)

        for _ in range(3):
            moe()
        times = []
        for _ in range(a.iterations):
            flush.fill_(1)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            moe()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) * 1000.0)
        results[str(M)] = statistics.median(times)
        print(f"torch baseline M={M}: {results[str(M)]:.1f} us")
    results["_meta"] = {"torch": torch.__version__, "grouped_mm": use_grouped, "gpu": torch.cuda.get_device_name()}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
