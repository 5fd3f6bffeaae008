"""Side-by-side round-trip benchmark: every backend, its halves and its bandwidth, one run.

    python bench/roundtrip.py [--tokens 1,8,...] [--hidden 7168 --topk 8 --experts 256]

Per token count (tokens per rank, uniform routing) and backend, measured as the sweep measures
(tuner.measure): the median dispatch+combine round trip (device time from CUDA events, eager
launches; [graph] = under CUDA-graph replay; host wall time beside it), dispatch and combine
timed apart (tuner.timing.time_halves) and their sum over the round trip, the logical GB/s of
each half and the share of the link it uses (tuner.figures: DeepEP's byte convention, the
link bandwidth from the probe), and the device memory the backend holds. Then the copy-speed
bound: the bytes a rank must send to the other ranks in dispatch plus combine, over the
GPU0->GPU1 copy bandwidth measured in the same run. On CPU (gloo): no link, no memory, no bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace

import torch

from a2a_tune.kernels import BackendEnv, MoEShape, availability_of, get_backend, list_backends
from a2a_tune.tuner.figures import gbps, link_bandwidth, link_pct, link_text, mib
from a2a_tune.tuner.launch import run_ranks
from a2a_tune.tuner.measure import Backends, Result, input_sets, measure, time_agreed, timing_mode
from a2a_tune.tuner.runtime.point import shape_label
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


def _stats(result, workspace_bytes=None) -> dict[str, float | None]:
    stats = result.stats
    t = result.traffic
    return {
        "median_us": stats.median_us,
        "p10_us": stats.p10_us,
        "p90_us": stats.p90_us,
        "host_us": summarize(result.host_us).median_us,
        "dispatch_us": result.dispatch_median_us,
        "combine_us": result.combine_median_us,
        "dispatch_logical_bytes": t and t.dispatch_logical,
        "dispatch_link_bytes": t and t.dispatch_link,
        "combine_logical_bytes": t and t.combine_logical,
        "combine_link_bytes": t and t.combine_link,
        "workspace_mib": mib(workspace_bytes),
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
                held = built.workspace_bytes(name, t)
                eager = measure(ctx, backend, inputs, warmup=warmup, iters=iters, timing="eager")
                if not eager.ok:
                    row[name] = {"error": eager.reason}
                    continue
                row[name] = _stats(eager, held)
                if timing_mode(type(backend), ctx.device) == "graph":
                    graph = time_agreed(ctx, backend, inputs, warmup=warmup, iters=iters, timing="graph")
                    row[name + " [graph]"] = _stats(graph, held) if graph.ok else {"error": graph.reason}
            dev, host = time_round_trips(floor, inputs, warmup=warmup, iters=iters)
            row[floor.name] = {"median_us": summarize(dev).median_us, "host_us": summarize(host).median_us}
            rows.append(row)
    return rows


def _probe_facts(device: str) -> dict:
    """The probe facts of the machine the ranks run on (CPU ranks: the CPU's, no link)."""
    from a2a_tune.tuner.probe import cpu_topology, probe

    return (probe() if device == "cuda" else cpu_topology()).to_dict()


def _num(v, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}{fmt}}"


def _figure_cells(r: dict, link) -> str:
    d, c, rt = r.get("dispatch_us"), r.get("combine_us"), r["median_us"]
    ratio = (d + c) / rt if d is not None and c is not None and rt else None
    pct = [link_pct(r.get(f"{half}_link_bytes"), r.get(f"{half}_us"), link) for half in ("dispatch", "combine")]
    return " ".join(
        [
            _num(rt, ".1f", 10),
            _num(d, ".1f", 9),
            _num(c, ".1f", 9),
            _num(ratio, ".2f", 6),
            _num(gbps(r.get("dispatch_logical_bytes"), d), ".3g", 7),
            _num(gbps(r.get("combine_logical_bytes"), c), ".3g", 7),
            _num(pct[0], ".1f", 5) + ("%" if pct[0] is not None else " "),
            _num(pct[1], ".1f", 5) + ("%" if pct[1] is not None else " "),
            _num(r.get("workspace_mib"), ".0f", 7),
            _num(r.get("host_us"), ".1f", 9),
        ]
    )


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
        ok, reason = availability_of(get_backend(name), env)
        if ok:
            backends.append(name)
        else:
            print(f"{name}: not run here: {reason}")

    bw = copy_bandwidth_gbs() if args.device == "cuda" and torch.cuda.device_count() >= 2 else None  # GPU0->GPU1
    facts = _probe_facts(args.device)
    start = time.perf_counter()
    rows = run_ranks(
        _bench_rank, world, args.device, backends, tokens, args.experts, args.topk, args.hidden, args.warmup, args.iters
    )[0]
    wall = time.perf_counter() - start

    frac = remote_fraction(args.experts, args.topk, world)
    link = link_bandwidth(facts, world)
    title = f"{shape_label(args.experts, args.topk, args.hidden, 'bf16', 'uniform')}, {world} {args.device} ranks"
    title += f"; link: {link_text(facts, world) if args.device == 'cuda' else 'no link (CPU ranks over gloo)'}"
    if bw:
        title += f"; GPU0->GPU1 copy {bw:.0f} GB/s"
    print(title)
    head = (
        f"{'T':>6}  {'backend':<36} {'round trip':>10} {'dispatch':>9} {'combine':>9} {'d+c/rt':>6} "
        f"{'GB/s d':>7} {'GB/s c':>7} {'link d':>6} {'link c':>6} {'MiB':>7} {'host':>9}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        t = row["tokens"]
        ok = {n: r["median_us"] for n, r in row.items() if n not in ("tokens", NcclFloor.name) and "median_us" in r}
        best = min(ok, key=ok.get) if ok else None
        for name, r in row.items():
            if name == "tokens":
                continue
            label = ("* " if name == best else "  ") + name
            if "median_us" not in r:
                print(f"{t:>6}  {label:<36} {'FAIL: ' + r.get('error', '')[:80]}")
                continue
            print(f"{t:>6}  {label:<36} " + _figure_cells(r, link))
        if bw and best:
            bound_us = 2 * t * frac * (world - 1) * args.hidden * 2 / (bw * 1e9) * 1e6
            print(f"{t:>6}  {'copy bound':<36} {bound_us:>10.1f}  ({bound_us / ok[best]:.2f} of the best)")
    print(
        "(µs: medians per dispatch+combine round trip and per half, device time from CUDA events (host wall time on "
        "CPU ranks); eager unless [graph] = replays of R captured round trips; * = fastest; d+c/rt = (dispatch + "
        "combine) / round trip; GB/s = logical bytes (every token-rank pair, own rank included) / time, 1e9; link = "
        "link bytes (other ranks only) / time / the link's bandwidth per direction; MiB = device memory held per rank; "
        f"floor = 2 bare NCCL all_to_all_single, eager; {wall:.0f} s)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"title": title, "copy_gbs": bw, "link_gbps": link and link.gbps, "rows": rows, "argv": sys.argv[1:]},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
