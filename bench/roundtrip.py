"""Side-by-side round-trip benchmark: every backend vs the GPU-to-GPU copy bound, one run.

    python bench/roundtrip.py [--tokens 1,8,...] [--hidden 7168 --topk 8 --experts 256]

Per token count (tokens per rank, uniform routing): the median dispatch+combine round trip of
each backend (device time from CUDA events, eager launches; host wall time beside it), the
ratio of each to the fastest, and the copy-speed bound: the bytes a rank must send to the
other ranks in dispatch plus combine, over the GPU0->GPU1 copy bandwidth measured in the
same run. On CPU (gloo) the bound column is left out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace

import torch

from a2a_tune.kernels import BackendEnv, MoEShape, get_backend, list_backends
from a2a_tune.tuner.launch import run_ranks
from a2a_tune.tuner.measure import Backends, Result, input_sets, measure, time_agreed, timing_mode
from a2a_tune.tuner.timing import summarize, time_round_trips


def copy_bandwidth_gbs(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """GPU0 -> GPU1 copy bandwidth (GB/s, 1e9), median of `reps` timed copies."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    times = []
    for i in range(reps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        if i >= 3:
            times.append(start.elapsed_time(end) / 1e3)
    return nbytes / sorted(times)[len(times) // 2] / 1e9


class NcclFloor:
    """Two bare all_to_all_single calls of T rows to every rank with fixed, equal splits: the
    NCCL cost an all2allv backend pays with no count exchange, routing or packing at all."""

    name = "nccl_a2a_floor"

    def __init__(self, group, shape: MoEShape, device, world: int):
        self.group, self.device, self.world = group, device, world

    def combine_buffer(self, dispatched):
        return None  # combine reads the expert output where it is, like most backends

    def dispatch(self, x, topk_ids, topk_weights):
        send = x.repeat(self.world, 1)  # [W*T, H]: T rows for every rank
        recv = torch.empty_like(send)
        torch.distributed.all_to_all_single(recv, send, group=self.group)
        return SimpleNamespace(x=recv)

    def combine(self, expert_out, dispatched):
        back = torch.empty_like(expert_out)
        torch.distributed.all_to_all_single(back, expert_out, group=self.group)
        return back


def remote_fraction(experts: int, topk: int, world: int) -> float:
    """P(a token has an expert on a given other rank) under uniform routing (hypergeometric)."""
    from math import comb

    per_rank = experts // world
    return 1 - comb(experts - per_rank, topk) / comb(experts, topk)


def _stats(result) -> dict[str, float]:
    stats = result.stats
    return {
        "median_us": stats.median_us,
        "p10_us": stats.p10_us,
        "p90_us": stats.p90_us,
        "host_us": summarize(result.host_us).median_us,
    }


def _bench_rank(ctx, backends, tokens_list, e, k, h, warmup, iters):
    """Every backend built, gated and timed as the sweep does it (tuner.measure), eager; the
    graph-capturable ones on CUDA also under graph replay; then the bare-NCCL floor."""
    shape = MoEShape(e, k, h, max(tokens_list), "bf16")
    rows = []
    floor = NcclFloor(ctx.group, shape, ctx.device, ctx.world_size)
    with Backends(ctx, shape) as built:  # fixed-capacity backends sized to the load: their best case
        for t in tokens_list:
            inputs = input_sets(ctx, shape, t, sets=3)
            row = {"tokens": t}
            for name in backends:
                backend = built.get(name, t)
                if isinstance(backend, Result):
                    if backend.kind != "infeasible":  # infeasible: absent from the row, not measured
                        row[name] = {"error": backend.reason}
                    continue
                eager = measure(ctx, backend, inputs, warmup=warmup, iters=iters, timing="eager")
                if not eager.ok:
                    row[name] = {"error": eager.reason}
                    continue
                row[name] = _stats(eager)
                if timing_mode(type(backend), ctx.device) == "graph":
                    graph = time_agreed(ctx, backend, inputs, warmup=warmup, iters=iters, timing="graph")
                    row[name + " [graph]"] = _stats(graph) if graph.ok else {"error": graph.reason}
            dev, host = time_round_trips(floor, inputs, warmup=warmup, iters=iters)
            row[floor.name] = {"median_us": summarize(dev).median_us, "host_us": summarize(host).median_us}
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,8,32,128,512,2048,8192,16384")
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--world", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.device_count() >= 2 else "cpu")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--backend", action="append", default=None)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    world = args.world or (torch.cuda.device_count() if args.device == "cuda" else 2)
    env = BackendEnv.local(world, args.device)
    backends = []
    for name in args.backend or list_backends():
        ok, reason = get_backend(name).availability(env)
        if ok:
            backends.append(name)
        else:
            print(f"{name}: not run here: {reason}")

    bw = copy_bandwidth_gbs() if args.device == "cuda" else None
    start = time.perf_counter()
    rows = run_ranks(
        _bench_rank, world, args.device, backends, tokens, args.experts, args.topk, args.hidden, args.warmup, args.iters
    )[0]
    wall = time.perf_counter() - start

    frac = remote_fraction(args.experts, args.topk, world)
    title = f"E={args.experts} k={args.topk} H={args.hidden} bf16 uniform, {world} {args.device} ranks"
    if bw:
        title += f", GPU0->GPU1 copy {bw:.0f} GB/s"
    print(title)
    cols = list(dict.fromkeys(c for row in rows for c in row if c != "tokens"))  # backends, [graph] timings, floor
    head = f"{'T':>6} | " + " | ".join(f"{n[:28]:>28}" for n in cols) + " | best      | best/others"
    if bw:
        head += " | copy bound | bound/best"
    print(head)
    print("-" * len(head))
    for row in rows:
        t = row["tokens"]
        cells = []
        for n in cols:
            r = row.get(n, {})
            if "median_us" in r:
                cells.append(f"{r['median_us']:>12.1f} (host {r['host_us']:>8.1f})")
            else:  # absent: infeasible here (e.g. beyond a fixed capacity), not measured
                cells.append(f"{'FAIL' if 'error' in r else 'n/a':>28}")
        ok = {n: row[n]["median_us"] for n in cols if n != NcclFloor.name and "median_us" in row.get(n, {})}
        best = min(ok, key=ok.get) if ok else None
        ratios = " ".join(f"{ok[best] / v:.2f}" for n, v in ok.items() if n != best) if best else "-"
        line = f"{t:>6} | " + " | ".join(cells) + f" | {best or '-':<9.9} | {ratios}"
        if bw and best:
            bound_us = 2 * t * frac * (world - 1) * args.hidden * 2 / (bw * 1e9) * 1e6
            line += f" | {bound_us:>10.1f} | {bound_us / ok[best]:>10.2f}"
        print(line)
    print(
        "(µs: median device time per dispatch+combine round trip, CUDA events; eager unless [graph] = replays of R captured "
        f"round trips; host = host wall time; best/others = best's time / each other's; floor = 2 bare NCCL "
        f"all_to_all_single, eager; {wall:.0f} s)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "copy_gbs": bw, "rows": rows, "argv": sys.argv[1:]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
