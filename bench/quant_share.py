"""The quantize's share of an NVFP4 or MXFP8 dispatch, on one GPU (virtual ranks).

W virtual ranks of `nvlink_one_sided` (DeepSeek-V3's shape: E 256, top-k 8, H 7168) on one GPU:
N round trips captured in one CUDA graph with an event between the halves, replayed; dispatch
= the mean interval from a round trip's start to its cut (every rank's quantize, send and
receive), beside the W ranks' quantize alone (`quant.quantize_rows`, graph-replayed the same
way). Share = quantize / dispatch. Virtual ranks move the bytes through one device's memory,
never a link: the share of a real dispatch is smaller where the link is slower than HBM.

    python bench/quant_share.py [--world 2] [--tokens 1,128,2048] [--payload nvfp4 --payload mxfp8]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from a2a_tune.kernels import MoEShape, get_backend, quant
from a2a_tune.kernels.virtual import VirtualWorld

CALLS, REPLAYS = 8, 15


def _replayed_us(capture, spans: int = 1) -> list[float]:
    """Capture `capture(events)` once (it records `2 * CALLS + 1` external events when spans
    is 2, else none), replay it REPLAYS times: per replay the mean µs of each span per call."""
    events = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(2 * CALLS + 1)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        capture(events)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out: list[list[float]] = [[] for _ in range(spans)]
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if spans == 1:
            out[0].append(start.elapsed_time(end) * 1e3 / CALLS)
        else:
            for k in range(spans):
                out[k].append(
                    sum(events[2 * i + k].elapsed_time(events[2 * i + k + 1]) for i in range(CALLS)) * 1e3 / CALLS
                )
    return [statistics.median(s) for s in out]


def measure(payload: str, world: int, tokens: int) -> dict:
    shape = MoEShape(256, 8, 7168, tokens, payload)
    with VirtualWorld(world, "cuda").build(get_backend("nvlink_one_sided"), shape, step=tokens) as ranks:
        inputs = ranks.inputs([tokens] * world)
        dispatched = ranks.dispatch(inputs)  # checked once, compiles the kernels
        outs = [d.x.new_zeros(d.x.shape[0], shape.hidden, dtype=torch.bfloat16) for d in dispatched]
        ranks.combine(outs, dispatched)
        torch.cuda.synchronize()

        def quantize(_events):
            for _ in range(CALLS):
                for i in inputs:
                    quant.quantize_rows(payload, i.x)

        def round_trips(events):
            for i in range(CALLS):
                events[2 * i].record()
                d = ranks.dispatch(inputs, check_signals=False)
                events[2 * i + 1].record()
                ranks.combine(outs, d, check_signals=False)
            events[2 * CALLS].record()

        quantize(None)  # compiled outside the capture
        torch.cuda.synchronize()
        (quant_us,) = _replayed_us(quantize)
        dispatch_us, combine_us = _replayed_us(round_trips, spans=2)
        torch.cuda.synchronize()
        if gave := ranks.gave_up():
            raise RuntimeError(f"rank {gave[0]}: a flag wait timed out")
    return {"payload": payload, "world": world, "tokens": tokens, "quantize_us": quant_us} | {
        "dispatch_us": dispatch_us,
        "combine_us": combine_us,
        "share": quant_us / dispatch_us,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload", action="append", help="nvfp4, mxfp8 [default: both]")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tokens", default="1,128,2048")
    a = ap.parse_args()
    print(f"nvlink_one_sided, {a.world} virtual ranks, H 7168, graph replay, µs per round trip of all ranks")
    print(f"{'payload':>8} {'T':>6} {'quantize':>9} {'dispatch':>9} {'combine':>8} {'share':>6}")
    for payload in a.payload or ["nvfp4", "mxfp8"]:
        for t in map(int, a.tokens.split(",")):
            r = measure(payload, a.world, t)
            print(
                f"{payload:>8} {t:>6} {r['quantize_us']:>9.2f} {r['dispatch_us']:>9.2f} {r['combine_us']:>8.2f} "
                f"{r['share']:>6.0%}"
            )


if __name__ == "__main__":
    main()
