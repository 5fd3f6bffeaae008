"""Payload quantization on one GPU: the Triton kernels against the torch reference and against
the device's own copy bandwidth, measured in the same run.

Each kernel timed as an engine runs decode: N calls captured in one CUDA graph, replayed, device
time by CUDA events / N. GB/s counts the bytes the kernel must move: x read once (bf16), the
packed values and scales written once; the copy baseline is a device-to-device copy of x
(bytes read + written), timed the same way. Each row first checks the kernel's bytes against
the torch path (mismatching bytes: 0 expected). Prints one line per payload and token count;
--json writes the rows.
    python bench/quant.py [--payload fp8_e4m3 --payload mxfp8 --payload nvfp4] [--hidden 4096,7168] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from a2a_tune.kernels.base import PAYLOADS
from a2a_tune.kernels.quant import QUANTIZE_TORCH, quantize, quantize_fp8_blocks_torch

HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e, nominal


def graph_us(fn, xs: list, calls: int = 20, replays: int = 20) -> float:
    """Median µs per call of `fn(x)`, x taken from `xs` in turn (one x: replayed warm in L2;
    several: bench/quant_tiles.py's cold inputs), `calls` calls captured in one CUDA graph."""
    fn(xs[0])  # compile / warm outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(xs[i % len(xs)])
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


def mismatched_bytes(payload: str, x: torch.Tensor) -> int:
    """Bytes of (q, scales) where the kernel and the torch reference differ."""
    reference = quantize_fp8_blocks_torch if payload == "fp8_e4m3" else QUANTIZE_TORCH[payload]
    got, want = quantize(payload, x), reference(x)
    return sum(int((g.view(torch.uint8) != w.view(torch.uint8)).sum()) for g, w in zip(got, want))


def measure(payload: str, hidden: int, t: int) -> dict:
    """One row: the kernel's bytes against the torch path, its time, the torch path's, the copy's."""
    reference = quantize_fp8_blocks_torch if payload == "fp8_e4m3" else QUANTIZE_TORCH[payload]
    g = torch.Generator(device="cuda").manual_seed(t)
    x = (torch.randn(t, hidden, device="cuda", generator=g) * 3).to(torch.bfloat16)
    bad = mismatched_bytes(payload, x)
    tri = graph_us(lambda v: quantize(payload, v), [x])
    ref = graph_us(reference, [x])
    copy_us = graph_us(lambda v: torch.empty_like(v).copy_(v), [x])
    moved = t * hidden * 2 + t * PAYLOADS[payload].row_bytes(hidden)
    gbps, copy_gbps = moved / tri / 1e3, 2 * t * hidden * 2 / copy_us / 1e3
    return {"payload": payload, "tokens": t, "hidden": hidden, "mismatched_bytes": bad, "triton_us": tri} | {
        "torch_us": ref,
        "bytes": moved,
        "gbps": gbps,
        "copy_us": copy_us,
        "copy_gbps": copy_gbps,
        "share_of_copy": gbps / copy_gbps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload", action="append", help="fp8_e4m3, mxfp8, nvfp4 [default: all three]")
    ap.add_argument("--hidden", default="7168", help="hidden sizes, comma-separated")
    ap.add_argument("--tokens", default="1,128,2048,8192,16384")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    print("quantize, bf16 in, graph replay, µs per call (median of 20 replays x 20 calls)")
    print(
        f"{'payload':>8} {'H':>5} {'T':>6} {'bad B':>5} {'triton':>8} {'torch':>8} {'GB/s':>7} {'copy GB/s':>9} "
        f"{'of copy':>7}"
    )
    for payload in a.payload or ["fp8_e4m3", "mxfp8", "nvfp4"]:
        for hidden in map(int, a.hidden.split(",")):
            for t in map(int, a.tokens.split(",")):
                rows.append(row := measure(payload, hidden, t))
                print(
                    f"{payload:>8} {hidden:>5} {t:>6} {row['mismatched_bytes']:>5} {row['triton_us']:>8.2f} "
                    f"{row['torch_us']:>8.2f} {row['gbps']:>7.0f} {row['copy_gbps']:>9.0f} {row['share_of_copy']:>7.0%}"
                )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
