"""Block-FP8 quantization on one GPU: the Triton kernel vs the torch path vs the HBM bound.

Both timed as an engine runs decode: N calls captured in one CUDA graph, replayed, device time
by CUDA events / N. Prints one line per token count; --json writes the rows.
    python bench/quant.py [--hidden 7168] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from a2a_tune.kernels.quant import quantize_fp8_blocks, quantize_fp8_blocks_torch

HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e, nominal


def graph_us(fn, x, calls: int = 20, replays: int = 20) -> float:
    fn(x)  # compile / warm outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn(x)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tokens", default="1,128,2048,8192,16384")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    print(f"block-FP8 quantize, H={a.hidden} bf16, graph replay, µs per call (median of 20 replays x 20 calls)")
    print(f"{'T':>6} {'triton':>8} {'torch':>8} {'torch/triton':>12} {'HBM bound':>9} {'triton/bound':>12}")
    for t in map(int, a.tokens.split(",")):
        x = torch.randn(t, a.hidden, device="cuda").to(torch.bfloat16)
        tri, ref = graph_us(quantize_fp8_blocks, x), graph_us(quantize_fp8_blocks_torch, x)
        bound = (t * a.hidden * 3 + t * (a.hidden // 128) * 4) / HBM_BYTES_PER_S * 1e6
        rows.append({"tokens": t, "hidden": a.hidden, "triton_us": tri, "torch_us": ref, "hbm_bound_us": bound})
        print(f"{t:>6} {tri:>8.2f} {ref:>8.2f} {ref / tri:>12.2f} {bound:>9.2f} {bound / tri:>12.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
